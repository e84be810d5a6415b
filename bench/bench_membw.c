/* Read bandwidth of this machine: T threads each summing its share of a buffer much
 * larger than the caches, median of several passes, two ways: a plain loop of 64-bit
 * loads, and 256-bit loads with software prefetch 2 KiB ahead (what a kernel that
 * streams its weights can reach: on the 2-core VM one thread reads ~12 GB/s that way
 * against ~8.5 GB/s with the plain loop). Prints GB/s (1e9 bytes/s) of the faster way
 * (both with --json: read_gb_per_s, plain_gb_per_s, prefetch_gb_per_s). The
 * bandwidth-limit figures of docs/BENCHMARKS.md divide by read_gb_per_s. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct part {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} part;

static void *sum_part(void *arg) {
    part *pt = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= pt->n; i += 4) s0 += pt->p[i], s1 += pt->p[i + 1], s2 += pt->p[i + 2], s3 += pt->p[i + 3];
    pt->sum = s0 + s1 + s2 + s3;
    return NULL;
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static void *sum_part_prefetch(void *arg) {
    part *pt = arg;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= pt->n; i += 16) { /* 128 bytes: two cache lines */
        _mm_prefetch((const char *)(pt->p + i) + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)(pt->p + i) + 2048 + 64, _MM_HINT_T0);
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(pt->p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(pt->p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(pt->p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(pt->p + i + 12)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < pt->n; i++) s += pt->p[i];
    pt->sum = s;
    return NULL;
}
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    bool json = argc > 2 && strcmp(argv[2], "--json") == 0;
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "usage: bench_membw [THREADS] [--json]\n");
        return 2;
    }
    size_t bytes = (size_t)1 << 30, n = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(bytes);
    if (!buf) return 1;
    for (size_t i = 0; i < n; i++) buf[i] = i;
    enum { PASSES = 7 };
    void *(*ways[2])(void *) = {sum_part, sum_part};
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) ways[1] = sum_part_prefetch;
#endif
    double med[2];
    uint64_t check = 0;
    for (int way = 0; way < 2; way++) {
        double rates[PASSES];
        for (int r = 0; r < PASSES; r++) {
            pthread_t tid[256];
            part parts[256];
            double t0 = now_s();
            for (int t = 0; t < threads; t++) {
                parts[t] = (part){buf + n / threads * t, n / threads, 0};
                pthread_create(&tid[t], NULL, ways[way], &parts[t]);
            }
            for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL), check += parts[t].sum;
            rates[r] = (double)bytes / (now_s() - t0) / 1e9;
        }
        qsort(rates, PASSES, sizeof rates[0], cmp);
        med[way] = rates[PASSES / 2];
    }
    double best = med[0] > med[1] ? med[0] : med[1];
    if (json)
        printf("{\"threads\": %d, \"read_gb_per_s\": %.2f, \"plain_gb_per_s\": %.2f, \"prefetch_gb_per_s\": %.2f}\n",
               threads, best, med[0], med[1]);
    else
        printf("read bandwidth, %d thread(s): %.2f GB/s (plain loop %.2f, vector loads + prefetch %.2f; medians of %d "
               "passes over 1 GiB)\n",
               threads, best, med[0], med[1], PASSES);
    free(buf);
    return check == 1 ? 3 : 0; /* keeps the sums alive */
}
