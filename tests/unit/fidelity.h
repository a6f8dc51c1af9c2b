/*
 * fidelity.h — the distributions the benchmarks use, and Prometheus's
 * histogram_quantile on native buckets, for tests/bench/fidelity_bench.c
 * and native_bench.c (docs/fleet.md has the figures).
 *
 * Samples are integer µs (or counts), drawn with testrand.h so that a seed
 * gives the same numbers everywhere. The exact quantile q of n samples is the
 * sample of rank ceil(q n), the one hist_quantile() aims at; Prometheus ranks
 * at q n, the same rank for every (q, n) used here (q n is an integer).
 *
 * Prometheus's estimate (docs/querying/functions.md, histogram_quantile): it
 * finds the native bucket (lo, hi] where the cumulative count reaches q n and
 * interpolates inside it by the fraction f of that bucket's count below the
 * rank: linearly, lo + (hi - lo) f, up to 2.55 (native histograms came in
 * 2.40), and exponentially, lo (hi / lo)^f, from 3.0 (PR #14677). Both are
 * below; an answer within the bucket of the exact sample is within one
 * bucket's width of it either way.
 */
#pragma once

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "testrand.h"

enum fid_dist {
	FID_LOGNORMAL,	 /* TTFT-like: median 300 ms, sigma 0.5 */
	FID_BIMODAL,	 /* warm/cold: 90 % ~150 ms, 10 % ~4 s */
	FID_CAPPED,	 /* a cliff: median 1 s, sigma 0.8, cut at a 3 s deadline (point mass) */
	FID_UNIFORM,	 /* uniform 1.0-2.5 s: a hard maximum */
	FID_GRID_1MS,	 /* whole ms, median 50 ms */
	FID_GRID_10MS,	 /* multiples of 10 ms, median 300 ms */
	FID_SPIKES,	 /* whole ms 50-60 +- 20 µs */
	FID_EXPONENTIAL, /* ITL-like: 5 ms + exponential of mean 15 ms */
	FID_TOKENS,	 /* a count: output tokens, log-normal median 200 */
	FID__COUNT
};

static const char *const fid_dist_name[FID__COUNT] = {
	"log-normal TTFT, median 300 ms, sigma 0.5",
	"bimodal: 90 % ~150 ms warm, 10 % ~4 s cold",
	"cliff: log-normal median 1 s cut at 3 s",
	"uniform 1.0-2.5 s",
	"whole ms, log-normal median 50 ms",
	"10 ms grid, log-normal median 300 ms",
	"spikes: whole ms 50-60 +- 20 us",
	"exponential ITL: 5 ms + mean 15 ms",
	"token counts, median 200",
};

static inline uint64_t fid_draw(enum fid_dist d)
{
	switch (d) {
	case FID_LOGNORMAL: return (uint64_t)llround(lognormal(300000, 0.5));
	case FID_BIMODAL:
		return uniform() < 0.9 ? (uint64_t)llround(lognormal(150000, 0.3))
				       : (uint64_t)llround(lognormal(4000000, 0.3));
	case FID_CAPPED: {
		double v = lognormal(1000000, 0.8);
		return v > 3000000 ? 3000000 : (uint64_t)llround(v);
	}
	case FID_UNIFORM: return 1000000 + (uint64_t)(uniform() * 1500000);
	case FID_GRID_1MS: return 1000 * (uint64_t)llround(lognormal(50, 0.3));
	case FID_GRID_10MS: return 10000 * (uint64_t)llround(lognormal(30, 0.4));
	case FID_SPIKES: return 50000 + 1000 * (uint64_t)(uniform() * 11) + (uint64_t)(uniform() * 40) - 20;
	case FID_EXPONENTIAL: return 5000 + (uint64_t)llround(-15000 * log(uniform()));
	default: {
		uint64_t v = (uint64_t)llround(lognormal(200, 0.7));
		return v ? v : 1;
	}
	}
}

static const double fid_quantiles[] = { 0.5, 0.9, 0.95, 0.99, 0.999 };
#define FID_NQ (sizeof(fid_quantiles) / sizeof(fid_quantiles[0]))

static int fid_by_value(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The sample of rank ceil(q n) of sorted v[0..n). */
static inline uint64_t fid_exact(const uint64_t *sorted, size_t n, double q)
{
	size_t rank = (size_t)ceil(q * (double)n);
	return sorted[(rank < 1 ? 1 : rank) - 1];
}

/* histogram_quantile on native buckets of schema `schema`: counts[k] is the
 * count of bucket index first + k, bucket i being (2^((i-1)/2^schema),
 * 2^(i/2^schema)]; `zero` the zero bucket's count (its values read as 0);
 * total the histogram's count. `exponential`: Prometheus 3.x's
 * interpolation, else 2.x's linear one. In the unit of the buckets. */
static inline double fid_native_quantile(double q, int schema, uint64_t zero, int first, const uint64_t *counts,
					 size_t n, uint64_t total, bool exponential)
{
	double rank = q * (double)total, cum = (double)zero, per = (double)(1 << schema);
	if (cum >= rank)
		return 0;
	for (size_t k = 0; k < n; k++) {
		if (!counts[k])
			continue;
		if (cum + (double)counts[k] >= rank) {
			double lo = exp2((first + (int)k - 1) / per), hi = exp2((first + (int)k) / per);
			double f = (rank - cum) / (double)counts[k];
			return exponential ? exp2(log2(lo) + (log2(hi) - log2(lo)) * f) : lo + (hi - lo) * f;
		}
		cum += (double)counts[k];
	}
	return exp2((first + (int)n - 1) / per);
}

/* Relative error of an estimate against the exact value, in per cent. */
static inline double fid_err(double estimate, double exact)
{
	return (estimate / exact - 1.0) * 100.0;
}
