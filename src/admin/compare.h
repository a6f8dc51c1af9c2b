/*
 * compare.h — upstreams of one route side by side (GET /compare), and the
 * statistics that say whether a difference is outside the noise.
 *
 * The test is a two-sided Mann-Whitney U (rank-sum) test computed from the
 * histograms themselves: every bucket is a group of ties, so it needs no raw
 * samples and merges with the rest of the state. A difference is called
 * significant when the test rejects "same distribution" at the 99 % level
 * and the medians differ by more than the histograms' resolution. Whether the
 * upstreams saw comparable traffic is judged the same way on their prompt
 * lengths and on the concurrency their requests met, with the two-sample
 * Kolmogorov-Smirnov distance. Error rates and goodput ratios are compared
 * with a two-proportion z-test at the same level. Definitions:
 * docs/admin-api.md.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "hist.h"
#include "store.h"

#define COMPARE_CONFIDENCE 0.99

struct rank_test {
	uint64_t na, nb;
	double u;	       /* Mann-Whitney U of a against b */
	double z;	       /* normal approximation, tie-corrected */
	double p;	       /* two-sided p-value; 1 when either side is empty */
	double prob_a_greater; /* P(a > b) + P(a = b)/2: 0.5 means no shift */
};

void rank_test_hist(const struct hist *a, const struct hist *b, struct rank_test *out);

/* Largest gap between the two empirical distribution functions, over the
 * shared bucket bounds (0 when either is empty). */
double ks_distance(const struct hist *a, const struct hist *b);

/* The two-sample KS distance above which the distributions differ at the
 * given confidence (asymptotic critical value). */
double ks_critical(uint64_t na, uint64_t nb, double confidence);

/* Two-proportion z-test: x of n against y of m, pooled. p is two-sided; 1
 * (z 0) when either n or m is 0 or the pooled proportion is 0 or 1. */
struct prop_test {
	double diff; /* x/n - y/m */
	double z, p;
};
void prop_test(uint64_t x, uint64_t n, uint64_t y, uint64_t m, struct prop_test *out);

struct json_t;
/* The /compare answer for `route` over the query result `r`. `labels` maps
 * upstream names to label objects (may be NULL); `assign` is how the route
 * assigns its requests ({"balance", "targets", "mirror"}; NULL: a route
 * the configuration does not have); `since_sec` as for /stats.
 * cold_mode: 0 include, 1 exclude, 2 only. Malloc'd JSON, or NULL when out
 * of memory. */
char *compare_render(const struct store_result *r, const char *route, enum store_window window, int cold_mode,
		     uint64_t since_sec, struct json_t *labels, struct json_t *assign);
