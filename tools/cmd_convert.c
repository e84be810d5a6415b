/* lumen convert IN.gguf OUT.gguf --dtype f32|f16: rewrite a GGUF with unquantized
 * weights (exact dequantization), e.g. for reference comparisons. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "formats/gguf_convert.h"
#include "formats/model_store.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen convert MODEL OUT.gguf [options]\n"
            "  MODEL          a .gguf file or a name from `lumen pull`\n"
            "  --dtype TYPE   f32 or f16: the type of the converted weights (default: f32)\n");
}

static bool progress(int64_t done, int64_t total, void *user) {
    (void)user;
    if (!isatty(2)) return true;
    int width = 40, fill = (int)(width * done / (total ? total : 1));
    fprintf(stderr, "\r[%.*s%*s] %lld/%lld tensors", fill, "========================================", width - fill,
            "", (long long)done, (long long)total);
    if (done == total) fputc('\n', stderr);
    return true;
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    lm_dtype type = LM_DTYPE_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *t = argv[++i];
            if (!strcmp(t, "f32"))
                type = LM_DTYPE_F32;
            else if (!strcmp(t, "f16"))
                type = LM_DTYPE_F16;
            else {
                fprintf(stderr, "lumen convert: --dtype must be f32 or f16, not %s\n", t);
                return 2;
            }
        } else if (argv[i][0] != '-' && !in)
            in = argv[i];
        else if (argv[i][0] != '-' && !out)
            out = argv[i];
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!in || !out) {
        usage(stderr);
        return 2;
    }
    char path[4096];
    if (lm_model_store_resolve(in, path, sizeof path) || lm_gguf_convert_file(path, out, type, progress, NULL)) {
        fprintf(stderr, "lumen convert: %s\n", lm_last_error());
        return 1;
    }
    return 0;
}
