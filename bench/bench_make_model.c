/* bench_make_model: writes a Qwen2.5-Coder-1.5B-shaped model with random weights, so
 * the GPU benchmarks need no download:
 *   - a GGUF file with a Q4_K_M-like mix: Q4_K matrices, Q6_K for the (tied)
 *     embeddings and for attn_v / ffn_down in 14 of the 28 layers (the first 3, the
 *     last 4 and every third between), F32 norms and biases;
 *   - a Hugging Face folder (config.json for Qwen2ForCausalLM + model.safetensors in
 *     bf16) holding the GGUF's quantized values decoded, which Lumen and Hugging Face
 *     transformers both load.
 * The shapes are those of Qwen2.5-1.5B: 28 layers, d 1536, 12 query / 2 KV heads of
 * 128, FFN 8960, vocabulary 151936, q/k/v biases, RoPE theta 1e6, tied embeddings.
 * Weights come from tests/unit/tiny_model.h (fixed seed, uniform, scaled by 1/row
 * length, so activations stay O(1) through every layer), made row by row on all cores
 * (a seed per row) straight into their GGUF and bf16 forms.
 *
 *   bench_make_model --gguf /tmp/q.gguf --hf /tmp/q-bf16 [--threads N] [--layers N]
 *                    [--embd N --ff N --vocab N --heads N --kv-heads N --head-dim N]
 *                    [--type q4_k_m|<any GGUF type>]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tests/unit/tiny_model.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the layers that get Q6_K for attn_v and ffn_down: the first eighth, the last
 * eighth, and every third layer between */
static bool more_bits(int layer, int n_layer) {
    int lo = n_layer / 8, hi = n_layer - n_layer / 8 - (n_layer % 8 ? 1 : 0);
    if (n_layer < 8) return layer == 0 || layer == n_layer - 1;
    return layer < lo || layer >= hi || (layer - lo) % 3 == 2;
}

static lm_dtype q4_k_m_mix(const tiny_spec *s, const char *name, int layer) {
    if (strcmp(name, "token_embd.weight") == 0 || strcmp(name, "output.weight") == 0) return LM_DTYPE_Q6_K;
    if ((strstr(name, "attn_v.weight") || strstr(name, "ffn_down.weight")) && more_bits(layer, s->n_layer))
        return LM_DTYPE_Q6_K;
    return LM_DTYPE_Q4_K;
}

/* every row made in parallel: work items are (tensor, block of rows); each makes its
 * rows' random values, the GGUF quantization and, when asked, the bf16 rows */
enum { ROWS_PER_ITEM = 64 };
typedef struct work {
    tiny_model *m;
    void **hf;           /* [n] bf16 buffers, or NULL                 */
    int64_t *first_item; /* [n + 1]: item index where tensor i starts */
    atomic_long next;
} work;

static void *worker(void *arg) {
    work *w = arg;
    int64_t total = w->first_item[w->m->n], max_ne0 = 0;
    for (int i = 0; i < w->m->n; i++)
        if (w->m->t[i].ne0 > max_ne0) max_ne0 = w->m->t[i].ne0;
    float *row = malloc(sizeof(float) * 2 * (size_t)max_ne0);
    for (int i = 0; row;) {
        int64_t it = atomic_fetch_add(&w->next, 1);
        if (it >= total) break;
        while (w->first_item[i + 1] <= it) i++; /* items are taken in increasing order */
        const tiny_tensor *t = &w->m->t[i];
        int64_t r0 = (it - w->first_item[i]) * ROWS_PER_ITEM, r1 = r0 + ROWS_PER_ITEM;
        if (r1 > t->ne1) r1 = t->ne1;
        tiny_make_rows(w->m, i, r0, r1, LM_DTYPE_BF16, w->hf ? w->hf[i] : NULL, row);
    }
    free(row);
    return NULL;
}

static int make_all(tiny_model *m, void **hf, int n_threads) {
    work w = {m, hf, calloc((size_t)m->n + 1, sizeof(int64_t)), 0};
    if (!w.first_item) return 1;
    for (int i = 0; i < m->n; i++) {
        tiny_tensor *t = &m->t[i];
        t->q = malloc(tiny_quant_bytes(m, t));
        if (hf) hf[i] = malloc(2 * (size_t)(t->ne0 * t->ne1));
        if (!t->q || (hf && !hf[i])) {
            free(w.first_item);
            return 1;
        }
        w.first_item[i + 1] = w.first_item[i] + (t->ne1 + ROWS_PER_ITEM - 1) / ROWS_PER_ITEM;
    }
    pthread_t th[256];
    int n = n_threads < 1 ? 1 : n_threads > 256 ? 256 : n_threads, started = 0;
    for (int k = 1; k < n; k++)
        if (pthread_create(&th[started], NULL, worker, &w) == 0) started++;
    worker(&w);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    free(w.first_item);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_make_model [--gguf PATH] [--hf DIR] [options]\n"
            "  --gguf PATH       write the GGUF file (Q4_K_M-like mix unless --type)\n"
            "  --hf DIR          write a Hugging Face folder (config.json + bf16 model.safetensors)\n"
            "  --type T          q4_k_m (default) or one GGUF type for every matrix (q8_0, f16, ...)\n"
            "  --threads N       quantization threads (default: all cores)\n"
            "  --seed N          weight seed (default: 1234)\n"
            "  shape (default Qwen2.5-1.5B): --layers 28 --embd 1536 --ff 8960 --vocab 151936\n"
            "                                --heads 12 --kv-heads 2 --head-dim 128\n");
}

int main(int argc, char **argv) {
    tiny_spec s = tiny_default(LM_ARCH_QWEN2);
    s.n_vocab = 151936, s.n_embd = 1536, s.n_layer = 28, s.n_head = 12, s.n_head_kv = 2, s.head_dim = 128;
    s.n_ff = 8960, s.tied = true, s.n_ctx_train = 32768, s.rope_theta = 1e6f;
    s.matrix_type = LM_DTYPE_Q4_K, s.type_of = q4_k_m_mix;
    const char *gguf = NULL, *hf = NULL;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        long n = strtol(v, NULL, 10);
        if (!strcmp(a, "--gguf"))
            gguf = v;
        else if (!strcmp(a, "--hf"))
            hf = v;
        else if (!strcmp(a, "--type")) {
            if (strcmp(v, "q4_k_m") == 0 || strcmp(v, "Q4_K_M") == 0)
                s.type_of = q4_k_m_mix;
            else if (lm_dtype_from_name(v, &s.matrix_type))
                s.type_of = NULL;
            else {
                fprintf(stderr, "bench_make_model: unknown type %s\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--threads"))
            threads = n;
        else if (!strcmp(a, "--seed"))
            s.seed = (uint64_t)n;
        else if (!strcmp(a, "--layers"))
            s.n_layer = (int)n;
        else if (!strcmp(a, "--embd"))
            s.n_embd = (int)n;
        else if (!strcmp(a, "--ff"))
            s.n_ff = (int)n;
        else if (!strcmp(a, "--vocab"))
            s.n_vocab = (int)n;
        else if (!strcmp(a, "--heads"))
            s.n_head = (int)n;
        else if (!strcmp(a, "--kv-heads"))
            s.n_head_kv = (int)n;
        else if (!strcmp(a, "--head-dim"))
            s.head_dim = (int)n;
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!gguf && !hf) {
        usage(stderr);
        return 2;
    }
    if (s.n_layer < 1 || s.n_layer > 42 || s.n_embd < 1 || s.n_ff < 1 || s.n_vocab < 2 || s.n_head < 1 ||
        s.n_head_kv < 1 || s.n_head % s.n_head_kv || s.head_dim < 2 || s.head_dim % 2) {
        fprintf(stderr, "bench_make_model: bad shape (layers 1..42, heads a multiple of kv-heads, even head-dim)\n");
        return 2;
    }
    double t0 = now_s();
    s.lazy = true;
    tiny_model *m = calloc(1, sizeof *m);
    void **hfbuf = m ? calloc(sizeof m->t / sizeof m->t[0], sizeof(void *)) : NULL;
    if (!m || !hfbuf) return 1;
    tiny_build(m, s);
    int64_t params = 0;
    for (int i = 0; i < m->n; i++) {
        params += m->t[i].ne0 * m->t[i].ne1;
        if (tiny_tensor_type(m, &m->t[i]) != LM_DTYPE_F32 && m->t[i].ne0 % 256 && s.type_of) {
            fprintf(stderr, "bench_make_model: %s has rows of %lld, not a multiple of 256 (K-quants)\n",
                    m->t[i].gguf_name, (long long)m->t[i].ne0);
            return 2;
        }
    }
    if (make_all(m, hf ? hfbuf : NULL, (int)threads)) {
        fprintf(stderr, "bench_make_model: out of memory\n");
        return 1;
    }
    double t2 = now_s();
    size_t qbytes = 0;
    for (int i = 0; i < m->n; i++) qbytes += tiny_quant_bytes(m, &m->t[i]);
    printf("model: qwen2 %d layers, d %d, heads %d/%d x %d, ffn %d, vocab %d, tied: %.3f B parameters\n", s.n_layer,
           s.n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.n_vocab, (double)params * 1e-9);
    printf("random weights, quantized (%s, %.1f MB)%s on %ld threads in %.1f s\n",
           s.type_of ? "Q4_K_M-like mix" : lm_dtype_name(s.matrix_type), (double)qbytes * 1e-6,
           hf ? " and bf16" : "", threads, t2 - t0);
    fflush(stdout);
    int rc = 0;
    if (gguf) {
        lm_status st = tiny_write_gguf(m, gguf, NULL);
        double t3 = now_s();
        if (st) {
            fprintf(stderr, "bench_make_model: writing %s failed (%s)\n", gguf, lm_status_str(st));
            rc = 1;
        } else
            printf("wrote %s in %.1f s\n", gguf, t3 - t2);
        t2 = t3;
    }
    if (hf) {
        lm_status st = tiny_write_hf_ex(m, hf, LM_DTYPE_BF16, hfbuf);
        if (st) {
            fprintf(stderr, "bench_make_model: writing %s failed (%s)\n", hf, lm_status_str(st));
            rc = 1;
        } else
            printf("wrote %s (bf16, %.1f MB) in %.1f s\n", hf, (double)params * 2e-6, now_s() - t2);
    }
    for (int i = 0; i < m->n; i++) free(hfbuf[i]);
    free(hfbuf);
    tiny_free(m);
    free(m);
    return rc;
}
