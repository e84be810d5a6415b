/* Read bandwidth of this machine: T threads each summing its share of a buffer much
 * larger than the caches, median of several passes. Prints GB/s (1e9 bytes/s); with
 * --json one object. The bandwidth-limit figures of docs/BENCHMARKS.md divide by it. */
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
    double rates[PASSES];
    uint64_t check = 0;
    for (int r = 0; r < PASSES; r++) {
        pthread_t tid[256];
        part parts[256];
        double t0 = now_s();
        for (int t = 0; t < threads; t++) {
            parts[t] = (part){buf + n / threads * t, n / threads, 0};
            pthread_create(&tid[t], NULL, sum_part, &parts[t]);
        }
        for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL), check += parts[t].sum;
        rates[r] = (double)bytes / (now_s() - t0) / 1e9;
    }
    qsort(rates, PASSES, sizeof rates[0], cmp);
    if (json)
        printf("{\"threads\": %d, \"read_gb_per_s\": %.2f}\n", threads, rates[PASSES / 2]);
    else
        printf("read bandwidth, %d thread(s): %.2f GB/s (median of %d passes over 1 GiB)\n", threads,
               rates[PASSES / 2], PASSES);
    free(buf);
    return check == 1 ? 3 : 0; /* keeps the sums alive */
}
