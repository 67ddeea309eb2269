/* order.h - the ascending qsort order of doubles, for the medians and percentiles of repeated
 * timings in every benchmark of rw-bench (one comparator instead of a copy per file). */
#ifndef RW_BENCH_ORDER_H
#define RW_BENCH_ORDER_H

static inline int rwb_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
