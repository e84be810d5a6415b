/* lumen_logits MODEL IDS_FILE OUT_FILE: last-token logits of prompts, for the Python
 * checks against other implementations (tests/e2e/test_convert_hf.py).
 *   MODEL     a GGUF file or a Hugging Face folder (anything lm_model_internal_load takes)
 *   IDS_FILE  one prompt per line: token ids separated by spaces
 *   OUT_FILE  written: for each prompt, n_vocab little-endian float32 logits
 * Prints {"n_vocab": V, "prompts": N} on stdout. Each prompt runs alone from position 0
 * with an F32 KV cache, on the CPU backend with two threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/model.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: lumen_logits MODEL IDS_FILE OUT_FILE\n");
        return 2;
    }
    lm_backend *be = NULL;
    lm_model_internal *m = NULL;
    if (lm_backend_cpu_create(2, &be) || lm_model_internal_load(argv[1], be, &m)) {
        fprintf(stderr, "lumen_logits: %s\n", lm_last_error());
        return 1;
    }
    FILE *in = fopen(argv[2], "r"), *out = fopen(argv[3], "wb");
    if (!in || !out) {
        fprintf(stderr, "lumen_logits: cannot open %s or %s\n", argv[2], argv[3]);
        return 1;
    }
    int64_t V = m->hp.n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    static char line[1 << 20];
    static int32_t ids[1 << 16], pos[1 << 16], seq[1 << 16];
    int n_prompts = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, in)) {
        int n = 0;
        for (char *p = strtok(line, " \t\r\n"); p && n < (int)(sizeof ids / sizeof ids[0]); p = strtok(NULL, " \t\r\n"))
            ids[n] = (int32_t)strtol(p, NULL, 10), pos[n] = n, seq[n] = 0, n++;
        if (n == 0) continue;
        lm_kv_cache *kv = NULL;
        lm_batch b = {n, ids, pos, seq, NULL};
        if (lm_kv_cache_for_model(m, n + 16, 1, LM_DTYPE_F32, &kv) || lm_forward(m, kv, &b, logits)) {
            fprintf(stderr, "lumen_logits: prompt %d: %s\n", n_prompts, lm_last_error());
            rc = 1;
        } else if (fwrite(logits, sizeof(float), (size_t)V, out) != (size_t)V) {
            fprintf(stderr, "lumen_logits: cannot write %s\n", argv[3]);
            rc = 1;
        }
        lm_kv_cache_free(kv);
        n_prompts++;
    }
    fclose(in);
    if (fclose(out) != 0) rc = 1;
    if (rc == 0) printf("{\"n_vocab\": %lld, \"prompts\": %d}\n", (long long)V, n_prompts);
    free(logits);
    lm_model_internal_free(m);
    lm_backend_free(be);
    return rc;
}
