/* lumen adapter encode|decode|digest|dtype: the compressed LoRA adapter codec. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "adapters/codec.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen adapter COMMAND ...\n"
            "  encode IN OUT.lmz            compress IN: an adapter folder (adapters.safetensors or\n"
            "                               adapter_model.safetensors + adapter_config.json, which\n"
            "                               travels inside) or a bare .safetensors file\n"
            "  decode IN.lmz OUT [options]  restore the original .safetensors file, byte for byte\n"
            "      --config PATH            also write the adapter_config.json it carries (default: not)\n"
            "      --digest HEX             fail unless the file has this digest (default: no check)\n"
            "  digest IN.lmz                print the digest (first 16 hex digits of SHA-256 of the file)\n"
            "  dtype IN.lmz                 print the tensors' shared dtype (reads the header only)\n"
            "zstd level %d, byte-shuffled per tensor.\n",
            LM_ADAPTER_ZSTD_LEVEL);
}

static int fail(const char *what) {
    fprintf(stderr, "lumen adapter %s: %s\n", what, lm_last_error());
    return 1;
}

int cmd_adapter(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "encode") == 0 && argc == 4) {
        if (lm_adapter_encode(argv[2], argv[3])) return fail(cmd);
        struct stat a, b;
        char digest[LM_ADAPTER_DIGEST_LEN + 1];
        if (lm_adapter_digest(argv[3], digest)) return fail(cmd);
        if (stat(argv[3], &b) == 0) {
            char src[4200];
            snprintf(src, sizeof src, "%s", argv[2]);
            struct stat d;
            if (stat(argv[2], &d) == 0 && S_ISDIR(d.st_mode)) {
                snprintf(src, sizeof src, "%s/adapters.safetensors", argv[2]);
                if (stat(src, &a) != 0) snprintf(src, sizeof src, "%s/adapter_model.safetensors", argv[2]);
            }
            if (stat(src, &a) == 0 && b.st_size > 0)
                fprintf(stderr, "%s: %lld -> %lld bytes (ratio %.2f)\n", argv[3], (long long)a.st_size,
                        (long long)b.st_size, (double)a.st_size / (double)b.st_size);
        }
        printf("%s\n", digest);
        return 0;
    }
    if (strcmp(cmd, "decode") == 0 && argc >= 4) {
        const char *config = NULL, *digest = NULL;
        for (int i = 4; i < argc; i++) {
            if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) config = argv[++i];
            else if (strcmp(argv[i], "--digest") == 0 && i + 1 < argc) digest = argv[++i];
            else {
                fprintf(stderr, "lumen adapter decode: unknown option '%s'\n", argv[i]);
                usage(stderr);
                return 2;
            }
        }
        if (lm_adapter_decode(argv[2], argv[3], config, digest)) return fail(cmd);
        return 0;
    }
    if (strcmp(cmd, "digest") == 0 && argc == 3) {
        char digest[LM_ADAPTER_DIGEST_LEN + 1];
        if (lm_adapter_digest(argv[2], digest)) return fail(cmd);
        printf("%s\n", digest);
        return 0;
    }
    if (strcmp(cmd, "dtype") == 0 && argc == 3) {
        lm_dtype dt;
        if (lm_adapter_dtype(argv[2], &dt)) return fail(cmd);
        printf("%s\n", lm_dtype_name(dt));
        return 0;
    }
    usage(stderr);
    return 2;
}
