/* test_bench_settle.c - rw-bench's rule for when the copy rate has settled (tools/bench/settle.h)
 * on scripted series of (time, rate): a rate that stays low for a while after a free and then
 * rises, a flat one, noise within the tolerance, a slow climb, and one that never settles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "settle.h"

/* Feeds rate(t) every dt seconds until the rule says settled; returns the time it did. */
static double run(rwb_settle *s, double dt, double (*rate)(double)) {
    rwb_settle_init(s);
    for (int i = 0; i < 100000; i++) {
        const double t = i * dt;
        if (rwb_settle_add(s, t, rate(t))) return t;
    }
    fail_msg("never settled");
    return -1;
}

/* low for less than a window (the rule's premise: the clearing after a free is shorter) */
#define STEP_AT (0.6 * RWB_SETTLE_WINDOW_S)
static double step(double t) { return t < STEP_AT ? 3810.0 : 4210.0; }
static double flat(double t) { return 4200.0 + 0.0 * t; }
static double noisy(double t) { return 4200.0 * (1.0 + 0.004 * ((int)(t * 1000) % 3 - 1)); }
static double climb(double t) { return 3800.0 + 400.0 * (t < 1.0 ? t : 1.0); }
static double rising(double t) { return 1000.0 * (1.0 + t); }

static void test_low_then_high(void **st) {
    (void)st;
    rwb_settle s;
    const double t = run(&s, 0.002, step);
    /* not before the rise plus a window, and the best is the settled rate */
    assert_true(t >= STEP_AT + RWB_SETTLE_WINDOW_S - 1e-9);
    assert_true(t < STEP_AT + RWB_SETTLE_WINDOW_S + 0.01);
    assert_true(s.best == 4210.0);
    assert_true(s.waited == t);
}

static void test_flat(void **st) {
    (void)st;
    rwb_settle s;
    const double t = run(&s, 0.002, flat);
    assert_true(t >= RWB_SETTLE_WINDOW_S - 1e-9 && t < RWB_SETTLE_WINDOW_S + 0.01);
    assert_true(s.best == 4200.0);
}

static void test_noise_within_tolerance(void **st) {
    (void)st;
    rwb_settle s;
    const double t = run(&s, 0.001, noisy);
    assert_true(t < RWB_SETTLE_WINDOW_S + 0.01);
    assert_true(s.best >= 4200.0 && s.best <= 4200.0 * 1.005);
}

static void test_slow_climb(void **st) {
    (void)st;
    rwb_settle s;
    const double t = run(&s, 0.002, climb);
    /* the climb keeps beating the best by more than the tolerance until it levels at t = 1 */
    assert_true(t >= 1.0 && t < 1.0 + RWB_SETTLE_WINDOW_S + 0.01);
    assert_true(s.best > 4199.0 && s.best <= 4200.0);
}

static void test_limit(void **st) {
    (void)st;
    rwb_settle s;
    const double t = run(&s, 0.001, rising);
    assert_true(t >= RWB_SETTLE_LIMIT_S - 1e-9 && t < RWB_SETTLE_LIMIT_S + 0.002);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_low_then_high), cmocka_unit_test(test_flat),
        cmocka_unit_test(test_noise_within_tolerance), cmocka_unit_test(test_slow_climb),
        cmocka_unit_test(test_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
