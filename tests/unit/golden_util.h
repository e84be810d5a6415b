/* Shared by the golden tests: reading a golden JSON file, loading its model from
 * the `lumen pull` store (or skipping when it is absent), and comparing a logit row
 * against a reference stored as log-sum-exp + top-k. */
#ifndef LM_TEST_GOLDEN_UTIL_H
#define LM_TEST_GOLDEN_UTIL_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

static cJSON *golden_read(const char *path) {
    char *buf = test_read_text(path);
    if (!buf) return NULL;
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    return root;
}

static int32_t *golden_ids(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(*n > 0 ? *n : 1));
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble;
    return ids;
}

static double logsumexp(const float *x, int64_t n) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (int64_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

static int64_t argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* KL(reference || ours) over the reference's top-k tokens plus one bin for the rest:
 * a lower bound of the full KL (grouping bins never increases KL), tight when the
 * top-k hold nearly all the mass. `ref_lse` is the reference's log-sum-exp and `top`
 * its [[id, logit], ...] at one position. */
static double golden_kl(double ref_lse, const cJSON *top, const float *logits, int64_t n_vocab) {
    double our_lse = logsumexp(logits, n_vocab);
    double kl = 0.0, p_in = 0.0, q_in = 0.0;
    const cJSON *pair;
    cJSON_ArrayForEach(pair, top) {
        int64_t id = (int64_t)cJSON_GetArrayItem(pair, 0)->valuedouble;
        double lp = cJSON_GetArrayItem(pair, 1)->valuedouble - ref_lse;
        double lq = (double)logits[id] - our_lse;
        double p = exp(lp);
        kl += p * (lp - lq);
        p_in += p;
        q_in += exp(lq);
    }
    double p_tail = 1.0 - p_in, q_tail = 1.0 - q_in;
    if (p_tail > 1e-12 && q_tail > 1e-12) kl += p_tail * log(p_tail / q_tail);
    return kl;
}

static int64_t golden_top1(const cJSON *top) {
    return (int64_t)cJSON_GetArrayItem(cJSON_GetArrayItem(top, 0), 0)->valuedouble;
}

#endif
