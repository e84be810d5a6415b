/* Expected-linear-time selection over float arrays (3-way quickselect, median-of-3
 * pivots), used by the sampler to find top-k and top-p thresholds without sorting
 * the vocabulary. Both functions reorder a[] and handle equal values as one group. */
#ifndef LM_SAMPLING_SELECT_H
#define LM_SAMPLING_SELECT_H

#include <stddef.h>

/* The k-th largest value of a[0..n) (1 <= k <= n): the v with
 * #{a > v} < k <= #{a >= v}. */
float lm_select_kth_largest(float *a, size_t n, size_t k);

/* For positive weights a[0..n) (n >= 1) and 0 < p <= 1: the smallest weight v such
 * that the tokens kept by "mass strictly above me < p * total" are exactly
 * {a >= v}. The largest weight is always kept. */
float lm_select_mass_threshold(float *a, size_t n, double p);

#endif
