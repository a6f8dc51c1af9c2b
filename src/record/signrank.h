/*
 * signrank.h — the statistics of paired differences: the Wilcoxon
 * signed-rank test, the Hodges-Lehmann shift with its confidence interval,
 * and a sequential sign test that may be looked at after every pair.
 *
 * No I/O, no state shared between calls: the paired comparison of mirrored
 * traffic (paired.c, /compare) and tokentap-bench --replay --compare both
 * call these functions, so the proxy and the offline tool report the same
 * numbers for the same differences. Definitions and error rates:
 * docs/metrics.md "Paired comparison".
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Up to this many non-zero differences the signed-rank p-value is exact
 * (the permutation distribution of the mid-ranks, ties included); above it,
 * the normal approximation with the tie correction. */
#define SIGNRANK_EXACT_MAX 50

struct signrank {
	size_t n;	 /* differences given */
	size_t nonzero;	 /* of them not zero: the test's sample (zeros are dropped) */
	double w_plus;	 /* sum of the mid-ranks of |d| over the positive d */
	double z;	 /* normal approximation (tie-corrected); 0 when exact */
	double p;	 /* two-sided p-value; 1 when nonzero is 0 */
	bool exact;	 /* p from the exact distribution */
	double median;	 /* median difference (all n, zeros included) */
	double hl;	 /* Hodges-Lehmann: median of the Walsh averages (d_i + d_j) / 2, i <= j */
	double hl_lo;	 /* the confidence interval of the shift from the signed-rank test */
	double hl_hi;	 /* inverted (NaN when n is too small for the level) */
	double ci_level; /* the interval's coverage: the level asked, or above it when exact */
};

/* The test on `n` differences `d` (copied, not changed) at two-sided
 * `confidence` (e.g. 0.99) for the interval. -1 when memory runs out (out
 * zeroed, p 1), else 0. */
int signrank_test(const double *d, size_t n, double confidence, struct signrank *out);

/* The median of v[0..n) (copied, not changed); NaN when n is 0 or memory
 * runs out. */
double signrank_median(const double *v, size_t n);

/* The exact null distribution's lower tail: P(W <= w) for the sum W of a
 * random subset of the integer `weights` (each in or out with probability
 * 1/2), n <= SIGNRANK_EXACT_MAX, weights summing to at most n * (n + 1). */
double signrank_cdf(const unsigned *weights, size_t n, unsigned w);

/*
 * The sequential rule: a sign test whose evidence is a mixture likelihood
 * ratio (a Beta(1,1) mixture over P(B > A) against 1/2), a nonnegative
 * martingale under "A and B exchangeable", so by Ville's inequality the
 * chance it ever reaches 1/alpha — at any pair, however often it is looked
 * at — is at most alpha. A pair within `band` of each other (relative to
 * the larger) or within `floor` (absolute) is a tie and not counted, so
 * that differences smaller than anyone would act on (a shadow read at a
 * lower priority than its primary, a fraction of a millisecond later) are
 * never called. Once called, the verdict and the pair count it was
 * called at stay.
 */
struct seqsign {
	uint64_t pairs;	    /* fed, ties included */
	uint64_t b_greater; /* b beyond the band above a */
	uint64_t a_greater; /* a beyond the band above b */
	int verdict;	    /* 0 undecided, +1 b greater, -1 a greater */
	uint64_t since;	    /* pairs fed when the verdict came */
};

#define SEQSIGN_BAND 0.01

/* One pair (a, b), both >= 0: a tie when |b - a| <= max(band * max(a, b),
 * floor). */
void seqsign_add(struct seqsign *s, double a, double b, double band, double floor, double alpha);

/* The natural log of the evidence (the mixture likelihood ratio) so far. */
double seqsign_log_evidence(const struct seqsign *s);
