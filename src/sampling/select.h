/* Selection over float arrays in expected linear time, used by the sampler to find
 * top-k and top-p thresholds without sorting the vocabulary. Equal values always
 * form one group (kept or dropped together). */
#ifndef LM_SAMPLING_SELECT_H
#define LM_SAMPLING_SELECT_H

#include <stddef.h>

/* The k-th largest finite value of src[0..n) (-inf entries are ignored; 1 <= k <=
 * the number of finite entries): the v with #{src > v} < k <= #{src >= v}. scratch
 * holds n floats. A k-heap in one pass for small k, otherwise a 3-way quickselect on
 * a copy. */
float lm_select_kth_largest(const float *src, size_t n, size_t k, float *scratch);

/* For positive weights a[0..n) (n >= 1) and need > 0: the smallest weight v such
 * that {a >= v} are exactly the entries whose "mass strictly above" (the sum of the
 * larger entries) is < need. The largest entry is always kept. Reorders a[].
 * The caller may leave out entries it knows are dropped (all smaller than every
 * entry given); `need` is then still p times the mass of everything. */
float lm_select_mass_threshold(float *a, size_t n, double need);

#endif
