/* lumen fuse BASE ADAPTER --namespace NS: merge a LoRA adapter into a base model and
 * store the result in the Hugging Face cache, keyed by the adapter's digest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters/fuse.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen fuse BASE ADAPTER --namespace NS [options]\n"
            "  BASE             a .gguf file, a Hugging Face folder, a name from `lumen pull`, or a\n"
            "                   repo id in the Hugging Face cache ($HF_HOME/hub)\n"
            "  ADAPTER          a compressed adapter (lumen adapter encode) or an adapter folder\n"
            "  --namespace NS   the fused repo is NS-DIGEST (required)\n"
            "  --digest HEX     fail unless the adapter has this digest (default: no check)\n"
            "  --dtype T        f32, f16 or bf16 (default: the base's float dtype; bf16 for a\n"
            "                   quantized GGUF base)\n"
            "  --quiet          no progress bar (default: a bar on stderr when it is a terminal)\n"
            "Prints the fused folder's path; its repo id is NS-DIGEST.\n");
}

static bool progress(void *user, uint64_t done, uint64_t total) {
    (void)user;
    int width = 40, filled = total ? (int)((double)done / (double)total * width) : width;
    fprintf(stderr, "\rfusing [");
    for (int i = 0; i < width; i++) fputc(i < filled ? '#' : '.', stderr);
    fprintf(stderr, "] %5.1f%%  %.0f / %.0f MB", total ? 100.0 * (double)done / (double)total : 100.0,
            (double)done / 1e6, (double)total / 1e6);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
    return true;
}

int cmd_fuse(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0;
    bool quiet = false;
    lm_fuse_params p = lm_fuse_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--namespace") == 0 && i + 1 < argc) p.namespace_name = argv[++i];
        else if (strcmp(a, "--digest") == 0 && i + 1 < argc) p.expected_digest = argv[++i];
        else if (strcmp(a, "--quiet") == 0) quiet = true;
        else if (strcmp(a, "--dtype") == 0 && i + 1 < argc) {
            const char *t = argv[++i];
            if (strcmp(t, "f32") == 0) p.out_dtype = LM_DTYPE_F32;
            else if (strcmp(t, "f16") == 0) p.out_dtype = LM_DTYPE_F16;
            else if (strcmp(t, "bf16") == 0) p.out_dtype = LM_DTYPE_BF16;
            else {
                fprintf(stderr, "lumen fuse: --dtype must be f32, f16 or bf16\n");
                return 2;
            }
        } else if (a[0] == '-' || n_pos == 2) {
            fprintf(stderr, "lumen fuse: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else pos[n_pos++] = a;
    }
    if (n_pos != 2 || !p.namespace_name) {
        usage(stderr);
        return 2;
    }
    if (!quiet && isatty(2)) p.progress = progress;
    lm_fuse_result r;
    if (lm_adapter_fuse(pos[0], pos[1], &p, &r)) {
        fprintf(stderr, "lumen fuse: %s\n", lm_last_error());
        return 1;
    }
    if (r.cached) fprintf(stderr, "cached: %s (repo id %s)\n", r.path, r.repo_id);
    else fprintf(stderr, "fused %lld weights; repo id %s\n", (long long)r.weights_adapted, r.repo_id);
    printf("%s\n", r.path);
    return 0;
}
