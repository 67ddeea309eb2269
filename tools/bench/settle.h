/* settle.h - when the device's copy rate has settled, before a ceiling is measured.
 *
 * Memory freed shortly before (a model released, a previous entry's buffers, the previous
 * process's) is cleared by the driver in the background, and a device-to-device copy timed
 * meanwhile runs slower: on an H200 the 2 GiB copy of the ceilings read 3.81 TB/s right after
 * 61 GiB were freed, where it reads 4.2 beside them or alone (tools/gpu/hbm_probe.py,
 * docs/BENCHMARKS.md, twenty-fourth session). A memory floor computed from such a copy is about
 * a tenth too low, and every ratio against it too high. So the copy measurements first time
 * rounds of the same copy until its rate has stopped rising:
 *
 *   rwb_settle s; rwb_settle_init(&s);
 *   while (!rwb_settle_add(&s, rw_now(), one_round_rate())) ;
 *
 * rwb_settle_add is true once RWB_SETTLE_WINDOW_S seconds of rounds have passed with none beating
 * the rate of the last rise by more than RWB_SETTLE_TOL, or RWB_SETTLE_LIMIT_S after the first
 * round. s.best is then the highest rate seen and s.waited the seconds taken.
 *
 * The rate does not climb while the clearing runs; it stays low, then jumps (after 61 GiB were
 * freed: 3.74 TB/s for 0.2 s, then 4.19), so the window must outlast the longest clearing: with
 * a window of 0.25 s the forward entry's copy still read 3.77-3.78 TB/s in two of six runs,
 * after the previous entry had freed its model and KV cache. At about 0.3 TB/s of clearing, all
 * of an H200's 139 GiB would take about 0.5 s; the window is twice that. */
#ifndef RW_TOOLS_BENCH_SETTLE_H
#define RW_TOOLS_BENCH_SETTLE_H

#include <stdbool.h>

#define RWB_SETTLE_TOL 0.005
#define RWB_SETTLE_WINDOW_S 1.0
#define RWB_SETTLE_LIMIT_S 5.0

typedef struct rwb_settle {
    double t0;      /* time of the first round */
    double best;    /* highest rate so far */
    double ref;     /* the rate of the last rise (a slow climb rises in steps of the tolerance) */
    double rise_at; /* its time */
    double waited;  /* seconds from the first round to the last */
    int rounds;
} rwb_settle;

static inline void rwb_settle_init(rwb_settle *s) {
    s->t0 = s->best = s->ref = s->rise_at = s->waited = 0.0;
    s->rounds = 0;
}

static inline bool rwb_settle_add(rwb_settle *s, double t, double rate) {
    if (s->rounds++ == 0) {
        s->t0 = s->rise_at = t;
        s->best = s->ref = rate;
        return false;
    }
    if (rate > s->ref * (1.0 + RWB_SETTLE_TOL)) {
        s->ref = rate;
        s->rise_at = t;
    }
    if (rate > s->best) s->best = rate;
    s->waited = t - s->t0;
    return t - s->rise_at >= RWB_SETTLE_WINDOW_S || s->waited >= RWB_SETTLE_LIMIT_S;
}

#endif
