#include "sampling/select.h"

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

float lm_select_kth_largest(float *a, size_t n, size_t k) {
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

float lm_select_mass_threshold(float *a, size_t n, double p) {
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += a[i];
    const double need = p * total;
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
