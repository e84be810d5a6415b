#include "sampling/select.h"

#include <math.h>

static float median3(float x, float y, float z) {
    if (x < y) {
        if (y < z) return y;
        return x < z ? z : x;
    }
    if (x < z) return x;
    return y < z ? z : y;
}

/* Reorders a[lo, hi) into [> pv | == pv | < pv]; returns the group sizes. */
static void partition3(float *a, size_t lo, size_t hi, float pv, size_t *n_gt, size_t *n_eq) {
    size_t lt = lo, i = lo, gt = hi;
    while (i < gt) {
        float x = a[i];
        if (x > pv) {
            a[i++] = a[lt];
            a[lt++] = x;
        } else if (x < pv) {
            a[i] = a[--gt];
            a[gt] = x;
        } else {
            i++;
        }
    }
    *n_gt = lt - lo;
    *n_eq = gt - lt;
}

/* Min-heap of floats: h[0] is the smallest. */
static void heap_sift_down(float *h, size_t n, size_t i) {
    float x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (!(h[c] < x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static float quickselect_kth(float *a, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    for (;;) {
        float pv = median3(a[lo], a[lo + (hi - lo) / 2], a[hi - 1]);
        size_t ng, ne;
        partition3(a, lo, hi, pv, &ng, &ne);
        if (k <= ng) {
            hi = lo + ng;
        } else if (k <= ng + ne) {
            return pv;
        } else {
            k -= ng + ne;
            lo += ng + ne;
        }
    }
}

float lm_select_kth_largest(const float *src, size_t n, size_t k, float *scratch) {
    if (k <= 1024 || k * 8 < n) {
        /* the k largest seen so far; most values fail the one comparison with h[0] */
        size_t h = 0, i = 0;
        for (; i < n && h < k; i++) {
            if (!(src[i] > -INFINITY)) continue;
            size_t j = h++;
            float x = src[i];
            while (j > 0 && x < scratch[(j - 1) / 2]) {
                scratch[j] = scratch[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            scratch[j] = x;
        }
        for (; i < n; i++) {
            if (src[i] > scratch[0]) {
                scratch[0] = src[i];
                heap_sift_down(scratch, h, 0);
            }
        }
        return scratch[0];
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (src[i] > -INFINITY) scratch[m++] = src[i];
    return quickselect_kth(scratch, m, k);
}

float lm_select_mass_threshold(float *a, size_t n, double need) {
    double above = 0.0; /* mass of the values known to be kept, all above [lo, hi) */
    float thr = a[0];
    for (size_t i = 1; i < n; i++)
        if (a[i] > thr) thr = a[i]; /* the largest is always kept */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        float pv = median3(a[lo], a[lo + (hi - lo) / 2], a[hi - 1]);
        size_t ng, ne;
        partition3(a, lo, hi, pv, &ng, &ne);
        double mass_gt = 0.0;
        for (size_t i = lo; i < lo + ng; i++) mass_gt += a[i];
        if (above + mass_gt < need) {
            /* the pivot's group has less than p of the mass above it: kept, with all
             * of the greater group; continue among the smaller values */
            above += mass_gt + (double)pv * (double)ne;
            if (pv < thr) thr = pv;
            lo += ng + ne;
        } else {
            hi = lo + ng; /* the pivot's group and everything below are dropped */
        }
    }
    return thr;
}
