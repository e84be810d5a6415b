/* lumen convert MODEL OUT_DIR: a GGUF as a Hugging Face folder (config.json,
 * generation_config.json, tokenizer.json, tokenizer_config.json, bf16 safetensors)
 * that transformers and Lumen load; or MODEL OUT.gguf: a GGUF rewritten with
 * unquantized (f32/f16) weights, for reference comparisons. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "export/hf_export.h"
#include "formats/gguf_convert.h"
#include "formats/model_store.h"
#include "tensor/dtype.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lumen convert MODEL OUT_DIR [options]   a Hugging Face model folder\n"
            "       lumen convert MODEL OUT.gguf [options]  a GGUF with unquantized weights\n"
            "  MODEL             a .gguf file or a name from `lumen pull`\n"
            "  OUT_DIR           written: config.json, generation_config.json, tokenizer.json,\n"
            "                    tokenizer_config.json (with the chat template) and model.safetensors\n"
            "                    (model-0000i-of-0000n.safetensors + model.safetensors.index.json above\n"
            "                    --shard-size); loads with transformers' AutoModelForCausalLM /\n"
            "                    AutoTokenizer and with Lumen. Written into a temporary folder beside\n"
            "                    it, then renamed into place.\n"
            "  OUT.gguf          (a path ending in .gguf) the GGUF with exactly dequantized weights\n"
            "  --dtype TYPE      folder: bf16, f16 or f32 (default: bf16); .gguf: f32 or f16 (default: f32)\n"
            "  --force           replace an existing non-empty OUT_DIR (default: refuse)\n"
            "  --shard-size N    largest safetensors file, bytes with an optional K/M/G suffix\n"
            "                    (binary units; default: 4G)\n"
            "  --json            print a JSON summary on stdout when done (default: off)\n"
            "  --no-progress     no progress bar (default: a bar on stderr when it is a terminal)\n");
}

typedef struct bar {
    bool on;
    time_t last;
} bar;

static void draw(int64_t done, int64_t total, const char *unit, double scale) {
    int width = 40, fill = (int)(width * (double)done / (double)(total ? total : 1));
    fprintf(stderr, "\r[%.*s%*s] %.0f/%.0f %s", fill, "========================================", width - fill, "",
            (double)done / scale, (double)total / scale, unit);
    if (done == total) fputc('\n', stderr);
}

static bool gguf_progress(int64_t done, int64_t total, void *user) {
    if (((bar *)user)->on) draw(done, total, "tensors", 1.0);
    return true;
}

static bool hf_progress(void *user, uint64_t done, uint64_t total) {
    bar *b = user;
    if (!b->on) return true;
    time_t now = time(NULL);
    if (done == total || now != b->last) {
        b->last = now;
        draw((int64_t)done, (int64_t)total, "MiB", 1024.0 * 1024.0);
    }
    return true;
}

static bool parse_size(const char *s, uint64_t *out) {
    char *end;
    double v = strtod(s, &end);
    uint64_t mult = 1;
    if (*end == 'k' || *end == 'K') mult = (uint64_t)1 << 10, end++;
    else if (*end == 'm' || *end == 'M') mult = (uint64_t)1 << 20, end++;
    else if (*end == 'g' || *end == 'G') mult = (uint64_t)1 << 30, end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (end == s || *end || !(v >= 1) || v * (double)mult > 1e18) return false;
    *out = (uint64_t)(v * (double)mult);
    return true;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* s as a JSON string (paths: escape quotes, backslashes and control bytes). */
static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *dtype = NULL;
    bool json = false, force = false, no_progress = false;
    uint64_t shard = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            dtype = argv[++i];
        } else if (!strcmp(a, "--shard-size") && i + 1 < argc) {
            if (!parse_size(argv[++i], &shard)) {
                fprintf(stderr, "lumen convert: --shard-size must be a size like 4G or 500M, not %s\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--force")) {
            force = true;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--no-progress")) {
            no_progress = true;
        } else if (a[0] != '-' && !in) {
            in = a;
        } else if (a[0] != '-' && !out) {
            out = a;
        } else {
            fprintf(stderr, "lumen convert: unexpected argument %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!in || !out) {
        usage(stderr);
        return 2;
    }
    bool to_gguf = ends_with(out, ".gguf");
    lm_dtype type = to_gguf ? LM_DTYPE_F32 : LM_DTYPE_BF16;
    if (dtype) {
        if (!strcmp(dtype, "f32")) type = LM_DTYPE_F32;
        else if (!strcmp(dtype, "f16")) type = LM_DTYPE_F16;
        else if (!strcmp(dtype, "bf16") && !to_gguf) type = LM_DTYPE_BF16;
        else {
            fprintf(stderr, "lumen convert: --dtype must be %s, not %s\n", to_gguf ? "f32 or f16" : "bf16, f16 or f32",
                    dtype);
            return 2;
        }
    }
    char path[4096];
    if (lm_model_store_resolve(in, path, sizeof path)) {
        fprintf(stderr, "lumen convert: %s\n", lm_last_error());
        return 1;
    }
    bar b = {.on = !no_progress && isatty(2)};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (to_gguf) {
        if (lm_gguf_convert_file(path, out, type, gguf_progress, &b)) {
            fprintf(stderr, "lumen convert: %s\n", lm_last_error());
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (json) {
            printf("{\"input\": ");
            json_str(path);
            printf(", \"output\": ");
            json_str(out);
            printf(", \"format\": \"gguf\", \"dtype\": \"%s\", \"seconds\": %.3f}\n", lm_dtype_name(type),
                   (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        }
        return 0;
    }
    lm_hf_export_params p = lm_hf_export_default_params();
    p.out_dtype = (int)type;
    p.shard_bytes = shard;
    p.force = force;
    p.progress = hf_progress;
    p.progress_user = &b;
    lm_hf_export_result r;
    if (lm_hf_export(path, out, &p, &r)) {
        if (b.on) fputc('\n', stderr);
        fprintf(stderr, "lumen convert: %s\n", lm_last_error());
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (!r.has_tokenizer)
        fprintf(stderr, "lumen convert: warning: %s has no tokenizer; the folder has no tokenizer files\n", path);
    if (json) {
        printf("{\"input\": ");
        json_str(path);
        printf(", \"output\": ");
        json_str(out);
        printf(", \"format\": \"hf\", \"architecture\": \"%s\", \"gguf_architecture\": ", r.architecture);
        json_str(r.gguf_arch);
        printf(", \"dtype\": \"%s\", \"tensors\": %lld, \"shards\": %d, \"weight_bytes\": %llu, "
               "\"tied_embeddings\": %s, \"tokenizer\": %s, \"vocab\": %lld, \"added_tokens\": %lld, "
               "\"merges\": %lld, \"chat_template\": %s, \"seconds\": %.3f}\n",
               type == LM_DTYPE_F32 ? "float32" : type == LM_DTYPE_F16 ? "float16" : "bfloat16",
               (long long)r.n_tensors, r.n_shards, (unsigned long long)r.weight_bytes,
               r.tied_embeddings ? "true" : "false", r.has_tokenizer ? "true" : "false", (long long)r.n_vocab,
               (long long)r.n_added_tokens, (long long)r.n_merges, r.has_chat_template ? "true" : "false", secs);
    } else {
        fprintf(stderr, "lumen convert: wrote %s (%s, %lld tensors in %d file%s, %.1f MiB) in %.1f s\n", out,
                r.architecture, (long long)r.n_tensors, r.n_shards, r.n_shards == 1 ? "" : "s",
                (double)r.weight_bytes / (1024.0 * 1024.0), secs);
    }
    return 0;
}
