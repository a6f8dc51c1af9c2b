/*
 * test_signrank.c — the paired statistics: the signed-rank test and the
 * Hodges-Lehmann interval against values counted by hand (and by brute
 * force over every sign assignment) and the published critical values; the
 * sequential sign test's boundary, its false-positive rate over thousands of
 * simulated sequences of identical upstreams, and its power on a 10 % shift.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "signrank.h"
#include "testrand.h"

/* cmocka's float comparison is in single precision: this one is not */
#define assert_near(a, b, eps) near_at((a), (b), (eps), __FILE__, __LINE__)
static void near_at(double a, double b, double eps, const char *file, int line)
{
	if (!(fabs(a - b) <= eps)) {
		print_error("%.17g is not %.17g (within %g)\n", a, b, eps);
		_fail(file, line);
	}
}

/* The null distribution of W for n = 10, ranks 1..10: the tables' two-sided
 * 5 % critical value is 8 (P(W <= 8) = 25/1024, P(W <= 9) = 33/1024 over
 * 0.025), the 1 % one 3 (5/1024: {}, {1}, {2}, {3}, {1,2}). */
static void test_exact_table(void **state)
{
	unsigned w[10];
	(void)state;
	for (unsigned i = 0; i < 10; i++)
		w[i] = i + 1;
	assert_near(signrank_cdf(w, 10, 3), 5.0 / 1024, 1e-12);
	assert_near(signrank_cdf(w, 10, 8), 25.0 / 1024, 1e-12);
	assert_near(signrank_cdf(w, 10, 9), 33.0 / 1024, 1e-12);
	assert_near(signrank_cdf(w, 10, 55), 1, 1e-12);
	assert_near(signrank_cdf(w, 10, 27), 0.5, 1e-12); /* symmetric about 27.5 */
}

/* n = 10, no ties: |d| ranks the two negatives 1 (0.5) and 2 (1.0), so
 * W+ = 3 + ... + 10 = 52, W- = 3 and p = 2 * 5/1024. The Walsh averages'
 * median is 3.0; at 95 % C = 8: the 9th and the 47th of the 55, 1.0 and
 * 5.0 (brute force), coverage 1 - 50/1024. */
static void test_hand_no_ties(void **state)
{
	const double d[] = { 1.5, -0.5, 2.0, 3.0, 4.0, -1.0, 5.0, 6.0, 2.5, 7.0 };
	struct signrank s;
	(void)state;
	assert_int_equal(signrank_test(d, 10, 0.95, &s), 0);
	assert_int_equal(s.nonzero, 10);
	assert_true(s.exact);
	assert_near(s.w_plus, 52, 1e-12);
	assert_near(s.p, 10.0 / 1024, 1e-12);
	assert_near(s.median, 2.75, 1e-12);
	assert_near(s.hl, 3.0, 1e-12);
	assert_near(s.hl_lo, 1.0, 1e-12);
	assert_near(s.hl_hi, 5.0, 1e-12);
	assert_near(s.ci_level, 1 - 50.0 / 1024, 1e-12);
}

/* Zeros dropped, ties at mid-ranks: |d| = 1 1 2 2 3 3 3 4 ranks 1.5 1.5
 * 3.5 3.5 6 6 6 8; W+ = 1.5 + 7 + 12 + 8 = 28.5. Exact over the doubled
 * ranks {3,3,7,7,12,12,12,16}: 22 of the 256 subsets sum to 15 (= 2 * 7.5)
 * or less, p = 44/256. */
static void test_hand_ties_and_zero(void **state)
{
	const double d[] = { 1, -1, 2, 2, 0, 3, -3, 3, 4 };
	struct signrank s;
	(void)state;
	assert_int_equal(signrank_test(d, 9, 0.95, &s), 0);
	assert_int_equal(s.n, 9);
	assert_int_equal(s.nonzero, 8);
	assert_true(s.exact);
	assert_near(s.w_plus, 28.5, 1e-12);
	assert_near(s.p, 44.0 / 256, 1e-12);
	assert_near(s.median, 2, 1e-12);
}

/* Past the exact bound: d = i - 20, i = 1..60; 59 non-zero, |1|..|19| twice
 * (19 pairs of ties: sum t^3 - t = 114). W+ = 1399.5, var = 59*60*119/24 -
 * 114/48, z = 3.8837, p = 1.0288e-4 (worked in Python from the formulas).
 * HL 10.5; at 95 % C = floor(915 - 1.96 * 134.00) = 648: 5.5 and 15.5. */
static void test_normal_approximation(void **state)
{
	double d[60];
	struct signrank s;
	(void)state;
	for (int i = 1; i <= 60; i++)
		d[i - 1] = i - 20;
	assert_int_equal(signrank_test(d, 60, 0.95, &s), 0);
	assert_false(s.exact);
	assert_int_equal(s.nonzero, 59);
	assert_near(s.w_plus, 1399.5, 1e-9);
	assert_near(s.z, 3.8836963963, 1e-8);
	assert_near(s.p, 1.0288035826e-4, 1e-12);
	assert_near(s.hl, 10.5, 1e-12);
	assert_near(s.hl_lo, 5.5, 1e-12);
	assert_near(s.hl_hi, 15.5, 1e-12);
}

static void test_degenerate(void **state)
{
	const double zeros[] = { 0, 0, 0 }, two[] = { 1, 2 };
	struct signrank s;
	(void)state;
	assert_int_equal(signrank_test(NULL, 0, 0.99, &s), 0);
	assert_true(s.p == 1 && s.n == 0 && isnan(s.hl));
	assert_int_equal(signrank_test(zeros, 3, 0.99, &s), 0);
	assert_true(s.p == 1 && s.nonzero == 0 && s.hl == 0);
	/* two pairs cannot reach 99 %: no interval, p 0.5 at best */
	assert_int_equal(signrank_test(two, 2, 0.99, &s), 0);
	assert_true(isnan(s.hl_lo) && isnan(s.hl_hi));
	assert_near(s.p, 0.5, 1e-12);
}

/* The fixed-n test is calibrated: over 2000 samples of 40 null differences
 * (symmetric, with a shared heavy-tailed request effect cancelled by the
 * pairing) it rejects at 5 % about 5 % of the time, and the 95 % interval
 * covers the true shift 0 about 95 % of the time. */
static void test_fixed_n_calibrated(void **state)
{
	int reject = 0, cover = 0, runs = 2000;
	(void)state;
	for (int r = 0; r < runs; r++) {
		double d[40];
		for (int i = 0; i < 40; i++) {
			double base = 50 * exp(normal()); /* the request's own cost: cancels */
			d[i] = (base + 3 * normal()) - (base + 3 * normal());
		}
		struct signrank s;
		assert_int_equal(signrank_test(d, 40, 0.95, &s), 0);
		reject += s.p < 0.05;
		cover += s.hl_lo <= 0 && 0 <= s.hl_hi;
	}
	assert_in_range(reject, 60, 140);	       /* 5 % of 2000 = 100, +-4 sd */
	assert_in_range(cover, runs - 140, runs - 60); /* about 95 % */
}

/* All b above a by 10 %: the evidence after m pairs is 2^m / (m + 1),
 * which first reaches 1/0.01 = 100 at m = 11 (2048/12 = 170.7; 1024/11 =
 * 93.1). A pair within the band is a tie and moves nothing. */
static void test_seq_boundary(void **state)
{
	struct seqsign s = { 0 };
	(void)state;
	seqsign_add(&s, 100, 100.5, SEQSIGN_BAND, 0, 0.01); /* 0.5 % apart: a tie */
	seqsign_add(&s, 10, 10.4, SEQSIGN_BAND, 0.5, 0.01); /* 4 % apart, but within the 0.5 floor */
	assert_int_equal(s.b_greater + s.a_greater, 0);
	for (int i = 1; i <= 10; i++) {
		seqsign_add(&s, 100, 110, SEQSIGN_BAND, 0, 0.01);
		assert_int_equal(s.verdict, 0);
	}
	assert_near(seqsign_log_evidence(&s), log(1024.0 / 11), 1e-9);
	seqsign_add(&s, 100, 110, SEQSIGN_BAND, 0, 0.01);
	assert_int_equal(s.verdict, 1);
	assert_int_equal(s.since, 13); /* the ties count as pairs seen */
	/* the verdict stays */
	for (int i = 0; i < 50; i++)
		seqsign_add(&s, 110, 100, SEQSIGN_BAND, 0, 0.01);
	assert_int_equal(s.verdict, 1);
	assert_int_equal(s.since, 13);
}

/* One sequence of identical upstreams: a request effect both share
 * (log-normal, as prompt lengths make ttft), each side's own noise
 * (log-normal, 10 %), and now and then a stall on one side only. */
static int null_sequence(int pairs, double alpha)
{
	struct seqsign s = { 0 };
	for (int i = 0; i < pairs; i++) {
		double base = 40 * exp(0.8 * normal());
		double a = base * exp(0.1 * normal()), b = base * exp(0.1 * normal());
		if (uniform() < 0.02)
			a += 200;
		if (uniform() < 0.02)
			b += 200;
		seqsign_add(&s, a, b, SEQSIGN_BAND, 0, alpha);
	}
	return s.verdict;
}

/* The rule looked at after every pair, 3000 sequences of 400 pairs each:
 * the share of sequences ever called is at most alpha, at two levels. */
static void test_seq_false_positive_rate(void **state)
{
	const double alphas[] = { 0.05, 0.01 };
	(void)state;
	for (size_t k = 0; k < 2; k++) {
		int called = 0, runs = 3000;
		for (int r = 0; r < runs; r++)
			called += null_sequence(400, alphas[k]) != 0;
		print_message("alpha %.2f: %d of %d null sequences called (%.4f)\n", alphas[k], called, runs,
			      (double)called / runs);
		assert_true(called <= alphas[k] * runs);
	}
}

/* B 10 % slower on every request, under the same noise: called "b
 * greater" every time, and within 60 pairs in most runs. */
static void test_seq_power(void **state)
{
	int called = 0, quick = 0, runs = 500;
	(void)state;
	for (int r = 0; r < runs; r++) {
		struct seqsign s = { 0 };
		for (int i = 0; i < 400 && !s.verdict; i++) {
			double base = 40 * exp(0.8 * normal());
			seqsign_add(&s, base * exp(0.05 * normal()), 1.1 * base * exp(0.05 * normal()), SEQSIGN_BAND, 0,
				    0.01);
		}
		assert_true(s.verdict >= 0);
		called += s.verdict == 1;
		quick += s.verdict == 1 && s.since <= 60;
	}
	assert_int_equal(called, runs);
	assert_true(quick >= runs * 9 / 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exact_table),	   cmocka_unit_test(test_hand_no_ties),
		cmocka_unit_test(test_hand_ties_and_zero), cmocka_unit_test(test_normal_approximation),
		cmocka_unit_test(test_degenerate),	   cmocka_unit_test(test_fixed_n_calibrated),
		cmocka_unit_test(test_seq_boundary),	   cmocka_unit_test(test_seq_false_positive_rate),
		cmocka_unit_test(test_seq_power),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
