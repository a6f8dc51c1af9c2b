/*
 * test_compare.c — the rank test and KS distance on histograms, against
 * values worked out by hand and against sampled distributions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"

static struct hist *hnew(void)
{
	struct hist *h = malloc(sizeof(*h));
	assert_non_null(h);
	hist_init(h);
	return h;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static double lognormal(double median, double sigma)
{
	double z = sqrt(-2.0 * log(uniform())) * cos(2.0 * M_PI * uniform());
	return median * exp(sigma * z);
}

static void test_hand_worked(void **state)
{
	struct hist *a = hnew(), *b = hnew();
	struct rank_test rt;

	/* a = {1, 2}, b = {3, 4}: every a below every b, U = 0 */
	hist_record(a, 1);
	hist_record(a, 2);
	hist_record(b, 3);
	hist_record(b, 4);
	rank_test_hist(a, b, &rt);
	assert_true(rt.u == 0);
	assert_true(rt.prob_a_greater == 0);
	assert_true(rt.z < 0);
	/* n = 4, no ties: var = 2*2/12 * 5 = 5/3; z = (0 - 2)/sqrt(5/3) */
	assert_true(fabs(rt.z - (-2 / sqrt(5.0 / 3))) < 1e-12);
	assert_true(fabs(ks_distance(a, b) - 1.0) < 1e-12);
	/* the other way round */
	rank_test_hist(b, a, &rt);
	assert_true(rt.u == 4 && rt.z > 0);
	/* ties count half: a = b = {5} */
	hist_init(a);
	hist_init(b);
	hist_record(a, 5);
	hist_record(b, 5);
	rank_test_hist(a, b, &rt);
	assert_true(rt.prob_a_greater == 0.5);
	assert_true(rt.p == 1);
	assert_true(ks_distance(a, b) == 0);
	/* empty sides say nothing */
	hist_init(b);
	rank_test_hist(a, b, &rt);
	assert_true(rt.p == 1 && rt.na == 0);
	free(a);
	free(b);
}

static void test_same_distribution_not_rejected(void **state)
{
	unsigned rejected = 0;

	/* 100 trials of two samples from one distribution: at the 1 % level
	 * about one rejection is expected, and far fewer than 10 */
	for (int trial = 0; trial < 100; trial++) {
		struct hist *a = hnew(), *b = hnew();
		struct rank_test rt;
		for (int i = 0; i < 2000; i++) {
			hist_record(a, (uint64_t)lognormal(50000, 0.4));
			hist_record(b, (uint64_t)lognormal(50000, 0.4));
		}
		rank_test_hist(a, b, &rt);
		rejected += rt.p < 0.01;
		assert_true(ks_distance(a, b) < ks_critical(a->count, b->count, 0.999));
		free(a);
		free(b);
	}
	assert_true(rejected < 10);
}

static void test_shift_detected(void **state)
{
	struct hist *a = hnew(), *b = hnew();
	struct rank_test rt;

	/* a 5 % slower median, 3000 samples each */
	for (int i = 0; i < 3000; i++) {
		hist_record(a, (uint64_t)lognormal(52500, 0.3));
		hist_record(b, (uint64_t)lognormal(50000, 0.3));
	}
	rank_test_hist(a, b, &rt);
	assert_true(rt.z > 3);
	assert_true(rt.p < 1e-3);
	assert_true(rt.prob_a_greater > 0.5);
	free(a);
	free(b);
}

static void test_ks_critical(void **state)
{
	/* the textbook coefficient 1.628 at 99 % for equal sizes */
	double d = ks_critical(1000, 1000, 0.99);
	assert_true(fabs(d - 1.6276 * sqrt(2000.0 / 1e6)) < 1e-3);
	assert_true(ks_critical(0, 10, 0.99) == 1);
}

/* Worked by hand: 10/100 against 20/100 pools to 0.15, se = sqrt(0.15 *
 * 0.85 * 0.02) = 0.0504975, z = -1.98030, p = 0.047670. */
static void test_prop_test(void **state)
{
	struct prop_test pt;

	(void)state;
	prop_test(10, 100, 20, 100, &pt);
	assert_true(fabs(pt.diff + 0.1) < 1e-12);
	assert_true(fabs(pt.z + 1.98030) < 1e-4);
	assert_true(fabs(pt.p - 0.047670) < 1e-5);
	prop_test(50, 1000, 100, 1000, &pt); /* 5 % against 10 %: clear at 99 % */
	assert_true(pt.p < 0.01 && pt.z < 0);
	prop_test(0, 500, 0, 700, &pt); /* no errors either side */
	assert_true(pt.p == 1 && pt.z == 0 && pt.diff == 0);
	prop_test(500, 500, 700, 700, &pt); /* all met the SLO both sides */
	assert_true(pt.p == 1 && pt.z == 0);
	prop_test(3, 0, 1, 10, &pt); /* no sample on one side */
	assert_true(pt.p == 1 && pt.z == 0);
	prop_test(50, 1000, 52, 1000, &pt); /* 5.0 % against 5.2 %: noise */
	assert_true(pt.p > 0.5);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hand_worked),    cmocka_unit_test(test_same_distribution_not_rejected),
		cmocka_unit_test(test_shift_detected), cmocka_unit_test(test_ks_critical),
		cmocka_unit_test(test_prop_test),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
