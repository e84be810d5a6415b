/* Tokenizer speed: encodes a 1 MiB mixed text (English prose, code, digits, whitespace
 * runs, CJK, Cyrillic, Arabic, emoji) with a model's tokenizer and reports the median
 * time of N runs, MB/s and tokens/s. The text is generated here, deterministically, and
 * can be written out (--dump) so that bench/compare_tokenizer.py feeds llama.cpp the same
 * bytes.
 *
 * usage: bench_tokenizer [options] MODEL
 *   MODEL            a .gguf file, or a Hugging Face folder with tokenizer.json
 *   --runs N         timed runs (default 5)
 *   --size BYTES     text size (default 1048576)
 *   --text FILE      encode FILE instead of the generated text
 *   --dump FILE      write the generated text to FILE and exit
 *   --special        parse special tokens in the text (default: off)
 * Output: one line per run "run i: S s", then "median_s=... mb_per_s=... tokens=...". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((rng_state >> 33) % n);
}

static const char *const k_words[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "model", "token", "engine",
    "inference", "memory", "language", "quantization", "throughput", "latency", "tokenizer",
    "Hello", "World", "Python", "Linux", "December", "government", "understanding", "however",
    "therefore", "information", "development", "international", "approximately", "don't",
    "it's", "we'll", "they're", "I've", "university", "performance", "implementation"};
static const char *const k_code[] = {
    "    for (int i = 0; i < n; i++) {\n        sum += a[i] * b[i];\n    }\n",
    "def forward(self, x):\n    h = self.norm(x)\n    return x + self.attn(h)\n",
    "if (status != LM_OK) return lm_error(status, \"failed: %s\", name);\n",
    "const result = await fetch(`/api/v1/items?id=${id}`);\n",
    "\tmemcpy(dst + off, src, len); /* copy */\n",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;\n",
    "{\"id\": 12345, \"name\": \"lumen\", \"tags\": [\"fast\", \"local\"], \"ok\": true}\n",
    "#include <stdio.h>\n#include <stdlib.h>\n\n",
    "        self.weight = nn.Parameter(torch.ones(dim))\n"};
static const char *const k_other[] = {
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81\xe8\xbf\x99\xe6\x98\xaf\xe4\xb8\x80\xe4\xb8\xaa\xe6\xb5\x8b\xe8\xaf\x95\xe3\x80\x82",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0\xe3\x81\xa7\xe3\x81\x99\xe3\x80\x82",
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8",
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, \xd0\xbc\xd0\xb8\xd1\x80! \xd0\x9a\xd0\xb0\xd0\xba \xd0\xb4\xd0\xb5\xd0\xbb\xd0\xb0?",
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85",
    "\xf0\x9f\x99\x82 \xf0\x9f\x9a\x80\xf0\x9f\x94\xa5 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
    "caf\xc3\xa9 na\xc3\xafve \xc3\xa9l\xc3\xa8ve",
    "\xce\x93\xce\xb5\xce\xb9\xce\xac \xcf\x83\xce\xbf\xcf\x85"};

static char *make_text(size_t size) {
    char *t = malloc(size + 256);
    if (!t) return NULL;
    size_t n = 0;
    while (n < size) {
        uint32_t kind = rnd(100);
        char piece[256];
        int k = 0;
        if (kind < 55) { /* a sentence */
            int words = 4 + (int)rnd(14);
            for (int w = 0; w < words && k < 200; w++)
                k += snprintf(piece + k, sizeof piece - (size_t)k, "%s%s", w ? " " : "",
                              k_words[rnd(sizeof k_words / sizeof k_words[0])]);
            k += snprintf(piece + k, sizeof piece - (size_t)k, "%s", rnd(4) ? ". " : ".\n\n");
        } else if (kind < 75) {
            k = snprintf(piece, sizeof piece, "%s", k_code[rnd(sizeof k_code / sizeof k_code[0])]);
        } else if (kind < 87) {
            k = snprintf(piece, sizeof piece, "%s ", k_other[rnd(sizeof k_other / sizeof k_other[0])]);
        } else if (kind < 95) {
            k = snprintf(piece, sizeof piece, "%u.%02u %u-%u-%u ", rnd(100000), rnd(100), 1990 + rnd(40),
                         1 + rnd(12), 1 + rnd(28));
        } else {
            static const char *const ws[] = {"\n", "\n\n", "   ", "\t\t", "        ", " \n  \n"};
            k = snprintf(piece, sizeof piece, "%s", ws[rnd(6)]);
        }
        if (k > 0) {
            size_t m = (size_t)k;
            if (n + m > size) m = size - n;
            /* never cut a UTF-8 sequence */
            while (m > 0 && m < (size_t)k && ((unsigned char)piece[m] & 0xC0) == 0x80) m--;
            memcpy(t + n, piece, m);
            n += m;
            if (m < (size_t)k) break;
        }
    }
    t[n] = '\0';
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *model = NULL, *text_file = NULL, *dump = NULL;
    int runs = 5;
    size_t size = 1u << 20;
    bool special = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) size = (size_t)atol(argv[++i]);
        else if (strcmp(argv[i], "--text") == 0 && i + 1 < argc) text_file = argv[++i];
        else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc) dump = argv[++i];
        else if (strcmp(argv[i], "--special") == 0) special = true;
        else if (argv[i][0] != '-' && !model) model = argv[i];
        else {
            fprintf(stderr, "usage: %s [--runs N] [--size BYTES] [--text FILE] [--dump FILE] [--special] MODEL\n", argv[0]);
            return 2;
        }
    }
    if (runs < 1) runs = 1;
    char *text = NULL;
    size_t len = 0;
    if (text_file) {
        FILE *f = fopen(text_file, "rb");
        if (!f) {
            perror(text_file);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        len = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        text = malloc(len + 1);
        if (!text || fread(text, 1, len, f) != len) return 1;
        fclose(f);
    } else {
        text = make_text(size);
        if (!text) return 1;
        len = strlen(text);
    }
    if (dump) {
        FILE *f = fopen(dump, "wb");
        if (!f || fwrite(text, 1, len, f) != len) return 1;
        fclose(f);
        free(text);
        return 0;
    }
    if (!model) {
        fprintf(stderr, "no MODEL given\n");
        return 2;
    }
    lm_tokenizer *tok = NULL;
    lm_gguf *g = NULL;
    struct stat st;
    double t0 = now();
    lm_status s;
    if (stat(model, &st) == 0 && S_ISDIR(st.st_mode)) {
        s = lm_tokenizer_from_hf_folder(model, &tok);
    } else {
        s = lm_gguf_open(model, &g);
        if (!s) s = lm_tokenizer_from_gguf(g, &tok);
    }
    if (s) {
        fprintf(stderr, "%s: %s\n", model, lm_last_error());
        return 1;
    }
    double load_s = now() - t0;
    double *times = malloc((size_t)runs * sizeof *times);
    size_t n_tokens = 0;
    for (int r = 0; r < runs; r++) {
        int32_t *ids = NULL;
        t0 = now();
        s = lm_tokenizer_encode_alloc(tok, text, len, false, special, &ids, &n_tokens);
        times[r] = now() - t0;
        free(ids);
        if (s) {
            fprintf(stderr, "encode: %s\n", lm_last_error());
            return 1;
        }
        printf("run %d: %.4f s\n", r, times[r]);
    }
    qsort(times, (size_t)runs, sizeof *times, cmp_double);
    double med = times[runs / 2];
    printf("load_s=%.3f bytes=%zu tokens=%zu median_s=%.4f mb_per_s=%.2f tokens_per_s=%.0f\n", load_s, len,
           n_tokens, med, (double)len / med / 1e6, (double)n_tokens / med);
    free(times);
    free(text);
    lm_tokenizer_free(tok);
    lm_gguf_close(g);
    return 0;
}
