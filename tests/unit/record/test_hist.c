/*
 * test_hist.c — bucket geometry, quantile accuracy against exact order
 * statistics, exact merge, the storage encoding under truncation and
 * garbage, and emptying a histogram in place.
 *
 * Samples come from a fixed-seed PRNG written here (no libc rand(), whose
 * sequence differs between platforms), so every run checks the same values.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hist.h"

#define N_SAMPLES 200000
/* One hour in µs: the longest latency tokentap should ever see. */
#define HOUR_US 3600000000ull

/* --- samples ------------------------------------------------------------ */

/* A 64-bit mixing generator: add a Weyl constant, then scramble. */
struct rng {
	uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so log() and division by it are safe. */
static double rng_unit(struct rng *r)
{
	return ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(struct rng *r)
{
	double u = rng_unit(r), v = rng_unit(r);
	return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static uint64_t clamp_us(double x)
{
	if (x < 0.0)
		return 0;
	if (x > (double)HOUR_US)
		return HOUR_US;
	return (uint64_t)x;
}

enum dist { D_UNIFORM, D_LOGNORMAL, D_BIMODAL, D_PARETO, D__COUNT };
static const char *const dist_names[] = { "uniform", "lognormal", "bimodal", "pareto" };

static uint64_t draw(struct rng *r, enum dist d)
{
	switch (d) {
	case D_UNIFORM: /* 1 µs .. 10 s */ return 1 + rng_next(r) % 10000000;
	case D_LOGNORMAL: /* TTFT-like: median 180 ms, long right tail */
		return clamp_us(180000.0 * exp(0.6 * rng_normal(r)));
	case D_BIMODAL: /* cache hits at ~2 ms, misses at ~900 ms */
		if (rng_next(r) % 100 < 70)
			return clamp_us(2000.0 * exp(0.3 * rng_normal(r)));
		return clamp_us(900000.0 * exp(0.4 * rng_normal(r)));
	case D_PARETO: /* heavy tail: xm = 500 µs, alpha = 1.1 */ return clamp_us(500.0 / pow(rng_unit(r), 1.0 / 1.1));
	default: return 0;
	}
}

static void fill(uint64_t *v, size_t n, enum dist d, uint64_t seed)
{
	struct rng r = { seed };
	for (size_t i = 0; i < n; i++)
		v[i] = draw(&r, d);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

/* The exact order statistic hist_quantile() approximates: rank ceil(q*n),
 * computed by the same expression, in sorted[]. */
static uint64_t exact_quantile(const uint64_t *sorted, size_t n, double q)
{
	if (q <= 0.0)
		return sorted[0];
	double r = ceil(q * (double)n);
	size_t rank = r >= (double)n ? n : (size_t)r;
	if (rank < 1)
		rank = 1;
	return sorted[rank - 1];
}

static struct hist *hist_new(void)
{
	struct hist *h = malloc(sizeof(*h));
	assert_non_null(h);
	hist_init(h);
	return h;
}

/* The invariants hist.h promises (hist_consistent, which test_consistent
 * checks in turn). */
static void check_invariants(const struct hist *h)
{
	assert_true(hist_consistent(h));
}

/* hist_consistent itself: it accepts what the functions make and refuses
 * each broken invariant. */
static void test_consistent(void **state)
{
	(void)state;
	struct hist *h = hist_new(), *bad = hist_new();
	assert_true(hist_consistent(h));
	memset(bad, 0, sizeof(*bad)); /* empty, but min 0 */
	assert_false(hist_consistent(bad));

	hist_record(h, 5);
	hist_record(h, 2000);
	hist_record(h, 90000);
	assert_true(hist_consistent(h));

	*bad = *h;
	bad->count++; /* more than the buckets hold */
	assert_false(hist_consistent(bad));
	*bad = *h;
	bad->min = 6; /* not in the first non-empty bucket */
	assert_false(hist_consistent(bad));
	*bad = *h;
	bad->max = 3000; /* not in the last */
	assert_false(hist_consistent(bad));
	*bad = *h;
	bad->min = 90001; /* above max */
	bad->max = 90000;
	assert_false(hist_consistent(bad));
	free(h);
	free(bad);
}

/* --- geometry ----------------------------------------------------------- */

static void test_geometry(void **state)
{
	(void)state;
	assert_int_equal(HIST_BUCKETS, 1112);
	assert_int_equal(hist_bucket_low(0), 0);
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		uint64_t lo = hist_bucket_low(i), hi = hist_bucket_high(i);
		assert_true(lo <= hi);
		assert_int_equal(hist_index(lo), i);
		assert_int_equal(hist_index(hi), i);
		if (i + 1 < HIST_BUCKETS)
			assert_int_equal(hist_bucket_low(i + 1), hi + 1);
		if (i < 128)
			assert_int_equal(lo, i); /* exact: one value each */
		else if (i < HIST_LIN_BUCKETS)
			assert_true((hi - lo + 1) * 64 <= lo); /* width <= low/64 */
		else if (i + 1 < HIST_BUCKETS)
			/* the ratio 2^(1/36), plus 1/4096 of the octave of table
			 * rounding, plus one value where the octave has fewer
			 * than 4096 */
			assert_true((double)(hi + 1 - lo) <=
				    (double)lo * (exp2(1.0 / HIST_SUB) - 1.0) + (double)lo / 4096 + 1.0);
	}
	assert_int_equal(hist_bucket_low(HIST_LIN_BUCKETS), HIST_GEO_FIRST);
	/* each power of two starts a bucket: the octaves line up */
	for (unsigned m = HIST_GEO_OCTAVE; m < 32; m++)
		assert_int_equal(hist_bucket_low(HIST_LIN_BUCKETS + (m - HIST_GEO_OCTAVE) * HIST_SUB),
				 (uint64_t)1 << m);
	assert_true(hist_bucket_low(HIST_BUCKETS - 1) > HIST_LIMIT / 2);
	assert_int_equal(hist_bucket_high(HIST_BUCKETS - 1), UINT64_MAX);
	assert_int_equal(hist_index(HIST_LIMIT - 1), HIST_BUCKETS - 1);
	assert_int_equal(hist_index(HIST_LIMIT), HIST_BUCKETS - 1);
	assert_int_equal(hist_index(UINT64_MAX), HIST_BUCKETS - 1);

	/* Every value up to 2^20, then random ones: in its bucket's range,
	 * and the midpoint within 1 % of it. */
	struct rng r = { 7 };
	for (uint64_t k = 0; k < (1u << 20) + 1000000; k++) {
		uint64_t v = k < (1u << 20) ? k : rng_next(&r) >> (rng_next(&r) % 64);
		unsigned i = hist_index(v);
		assert_true(i < HIST_BUCKETS);
		assert_true(hist_bucket_low(i) <= v && v <= hist_bucket_high(i));
		if (v < HIST_LIMIT) {
			/* The last bucket's midpoint is taken over the values
			 * below HIST_LIMIT, as hist_quantile() does. */
			uint64_t lo = hist_bucket_low(i);
			uint64_t hi = i == HIST_BUCKETS - 1 ? HIST_LIMIT - 1 : hist_bucket_high(i);
			uint64_t mid = lo + (hi - lo) / 2;
			uint64_t d = mid > v ? mid - v : v - mid;
			assert_true(d * 100 <= v);
		}
	}
}

static void test_small_exact(void **state)
{
	(void)state;
	struct hist *h = hist_new();
	for (uint64_t v = 0; v < 128; v++)
		hist_record_n(h, v, v + 1); /* value v, v+1 times */
	check_invariants(h);
	for (unsigned i = 0; i < 128; i++)
		assert_int_equal(h->buckets[i], i + 1);
	/* Every quantile of values < 128 is exact. */
	uint64_t n = h->count, cum = 0;
	for (uint64_t v = 0; v < 128; v++) {
		cum += v + 1;
		/* q a half rank below cum, so that rounding in q*count cannot
		 * push the rank to cum + 1. */
		assert_int_equal(hist_quantile(h, ((double)cum - 0.5) / (double)n), v);
		assert_true(hist_count_le(h, v) == (double)cum);
	}
	free(h);
}

static void test_quantile_edges(void **state)
{
	(void)state;
	struct hist *h = hist_new();
	assert_true(hist_empty(h));
	assert_int_equal(hist_quantile(h, 0.5), 0);
	assert_int_equal(hist_quantile(h, 1.0), 0);
	assert_true(hist_mean(h) == 0.0);
	assert_true(hist_count_le(h, 1000) == 0.0);
	check_invariants(h);

	hist_record_n(h, 5, 0); /* no-op, min/max untouched */
	assert_true(hist_empty(h));
	check_invariants(h);

	hist_record(h, 123456789);
	assert_false(hist_empty(h));
	/* One sample: every quantile is that sample, thanks to the clamp. */
	assert_int_equal(hist_quantile(h, 0.0), 123456789);
	assert_int_equal(hist_quantile(h, 0.5), 123456789);
	assert_int_equal(hist_quantile(h, 1.0), 123456789);

	hist_record(h, 1000);
	hist_record(h, (uint64_t)1 << 40); /* past the covered range */
	hist_record(h, UINT64_MAX);
	check_invariants(h);
	assert_int_equal(hist_quantile(h, 0.0), 1000);
	assert_int_equal(hist_quantile(h, -3.0), 1000);
	assert_int_equal(hist_quantile(h, NAN), 1000);
	assert_int_equal(hist_quantile(h, 1.0), UINT64_MAX);
	assert_int_equal(hist_quantile(h, 7.0), UINT64_MAX);
	/* Rank 3 of 4 lands in the last bucket: clamped into [min, max],
	 * and min here is far below, so it is the bucket's nominal midpoint. */
	uint64_t q = hist_quantile(h, 0.75);
	assert_true(q >= hist_bucket_low(HIST_BUCKETS - 1) && q < HIST_LIMIT);
	/* count, sum (mod 2^64), min, max stay exact. */
	assert_int_equal(h->count, 4);
	assert_int_equal(h->sum, (uint64_t)123456789 + 1000 + ((uint64_t)1 << 40) + UINT64_MAX);
	assert_int_equal(h->min, 1000);
	assert_int_equal(h->max, UINT64_MAX);
	free(h);
}

/* --- accuracy ----------------------------------------------------------- */

static void check_dist(enum dist d, uint64_t seed)
{
	uint64_t *v = malloc(N_SAMPLES * sizeof(*v));
	assert_non_null(v);
	fill(v, N_SAMPLES, d, seed);

	struct hist *h = hist_new();
	uint64_t sum = 0;
	for (size_t i = 0; i < N_SAMPLES; i++) {
		hist_record(h, v[i]);
		sum += v[i];
	}
	check_invariants(h);
	qsort(v, N_SAMPLES, sizeof(*v), cmp_u64);

	assert_int_equal(h->count, N_SAMPLES);
	assert_int_equal(h->sum, sum);
	assert_int_equal(h->min, v[0]);
	assert_int_equal(h->max, v[N_SAMPLES - 1]);
	assert_true(hist_mean(h) == (double)sum / (double)N_SAMPLES);
	assert_int_equal(hist_quantile(h, 0.0), v[0]);
	assert_int_equal(hist_quantile(h, 1.0), v[N_SAMPLES - 1]);

	/* The reported percentiles, then a sweep of other quantiles. */
	static const double qs[] = { 0.5, 0.9, 0.95, 0.99, 0.999 };
	double worst = 0.0;
	for (int k = 0; k < 5 + 2000; k++) {
		double q = k < 5 ? qs[k] : (double)(k - 5 + 1) / 2001.0;
		uint64_t want = exact_quantile(v, N_SAMPLES, q);
		uint64_t got = hist_quantile(h, q);
		double err = want ? fabs((double)got - (double)want) / (double)want : (double)got;
		if (err > worst)
			worst = err;
		if (k < 5)
			printf("  %-9s p%-5g exact %10llu  hist %10llu  err %.4f %%\n", dist_names[d], q * 100,
			       (unsigned long long)want, (unsigned long long)got, err * 100);
		if (err > 0.01)
			fail_msg("%s q=%g: exact %llu, hist %llu (%.3f %%)", dist_names[d], q, (unsigned long long)want,
				 (unsigned long long)got, err * 100);
	}
	printf("  %-9s worst relative error over 2005 quantiles: %.4f %%\n", dist_names[d], worst * 100);
	/* The geometry promises 0.99 % (test_geometry checks it value by value). */
	assert_true(worst <= 0.0099);
	free(h);
	free(v);
}

static void test_quantiles_uniform(void **state)
{
	(void)state;
	check_dist(D_UNIFORM, 1);
}

static void test_quantiles_lognormal(void **state)
{
	(void)state;
	check_dist(D_LOGNORMAL, 2);
}

static void test_quantiles_bimodal(void **state)
{
	(void)state;
	check_dist(D_BIMODAL, 3);
}

static void test_quantiles_pareto(void **state)
{
	(void)state;
	check_dist(D_PARETO, 4);
}

/* --- merge -------------------------------------------------------------- */

static void test_merge_union(void **state)
{
	(void)state;
	struct hist *a = hist_new(), *b = hist_new(), *all = hist_new(), *e = hist_new();
	struct rng r = { 11 };
	for (int i = 0; i < 50000; i++) {
		uint64_t x = draw(&r, D_LOGNORMAL), y = draw(&r, D_PARETO);
		hist_record(a, x);
		hist_record(b, y);
		hist_record(all, x);
		hist_record(all, y);
	}
	hist_record(b, UINT64_MAX);
	hist_record(all, UINT64_MAX);

	struct hist *m = hist_new();
	hist_merge(m, a); /* into empty: a copy */
	assert_memory_equal(m, a, sizeof(*a));
	hist_merge(m, b);
	check_invariants(m);
	assert_memory_equal(m, all, sizeof(*all)); /* bucket for bucket, and count/sum/min/max */

	hist_merge(m, e); /* empty changes nothing, min stays */
	assert_memory_equal(m, all, sizeof(*all));

	/* record_n(v, n) is n record(v). */
	struct hist *p = hist_new(), *q = hist_new();
	for (int i = 0; i < 1000; i++)
		hist_record(p, 777777);
	hist_record_n(q, 777777, 1000);
	assert_memory_equal(p, q, sizeof(*p));

	/* Self-merge doubles. */
	hist_merge(q, q);
	assert_int_equal(q->count, 2000);
	assert_int_equal(q->buckets[hist_index(777777)], 2000);
	check_invariants(q);

	free(a);
	free(b);
	free(all);
	free(e);
	free(m);
	free(p);
	free(q);
}

/* --- count_le ----------------------------------------------------------- */

static void test_count_le(void **state)
{
	(void)state;
	uint64_t *v = malloc(N_SAMPLES * sizeof(*v));
	assert_non_null(v);
	fill(v, N_SAMPLES, D_BIMODAL, 21);
	struct hist *h = hist_new();
	for (size_t i = 0; i < N_SAMPLES; i++)
		hist_record(h, v[i]);
	qsort(v, N_SAMPLES, sizeof(*v), cmp_u64);

	/* At every bucket's high the answer is exact: the number of samples
	 * <= that bound, counted from the sorted samples. */
	size_t j = 0;
	double prev = 0.0;
	for (unsigned i = 0; i + 1 < HIST_BUCKETS; i++) {
		uint64_t bound = hist_bucket_high(i);
		while (j < N_SAMPLES && v[j] <= bound)
			j++;
		double got = hist_count_le(h, bound);
		if (got != (double)j)
			fail_msg("bucket %u high %llu: %f, want %zu", i, (unsigned long long)bound, got, j);
		/* Inside the next bucket: between the neighbouring boundaries,
		 * never decreasing. */
		uint64_t mid = hist_bucket_low(i + 1) + (hist_bucket_high(i + 1) - hist_bucket_low(i + 1)) / 2;
		double in = hist_count_le(h, mid);
		assert_true(in >= got && in >= prev);
		prev = in;
	}
	assert_true(hist_count_le(h, v[0] - 1) == 0.0);
	assert_true(hist_count_le(h, v[N_SAMPLES - 1]) == (double)N_SAMPLES);
	assert_true(hist_count_le(h, UINT64_MAX) == (double)N_SAMPLES);
	free(h);
	free(v);
}

/* --- encoding ----------------------------------------------------------- */

static struct hist *typical(uint64_t seed, int n)
{
	struct hist *h = hist_new();
	struct rng r = { seed };
	for (int i = 0; i < n; i++)
		hist_record(h, draw(&r, D_LOGNORMAL));
	return h;
}

/* Encodes h, decodes into an empty histogram, checks equality; returns the
 * encoded size. */
static size_t round_trip(const struct hist *h)
{
	size_t cap = hist_encoded_max(h);
	uint8_t *buf = malloc(cap + 16);
	assert_non_null(buf);
	memset(buf, 0xa5, cap + 16);
	size_t n = hist_encode(h, buf, cap);
	assert_true(n > 0 && n <= cap);
	for (size_t i = cap; i < cap + 16; i++)
		assert_int_equal(buf[i], 0xa5);

	struct hist *d = hist_new();
	size_t used = 0;
	assert_int_equal(hist_decode_merge(d, buf, n, &used), 0);
	assert_int_equal(used, n);
	assert_memory_equal(d, h, sizeof(*h));

	/* Too small a buffer: 0, and nothing written past cap. */
	for (size_t c = 0; c < n; c++) {
		memset(buf, 0xa5, cap + 16);
		assert_int_equal(hist_encode(h, buf, c), 0);
		for (size_t i = c; i < cap + 16; i++)
			assert_int_equal(buf[i], 0xa5);
	}
	free(d);
	free(buf);
	return n;
}

static void test_round_trip(void **state)
{
	(void)state;
	struct hist *h = hist_new();
	assert_int_equal(round_trip(h), 1 + 1 + 10 + 1 + 1); /* empty */

	hist_record(h, 0);
	round_trip(h);
	hist_record(h, HIST_LIMIT - 1);
	hist_record(h, UINT64_MAX); /* 10-byte varints, last bucket */
	round_trip(h);
	free(h);

	for (enum dist d = 0; d < D__COUNT; d++) {
		struct hist *g = hist_new();
		struct rng r = { 100 + d };
		for (int i = 0; i < 100000; i++)
			hist_record(g, draw(&r, d));
		round_trip(g);
		free(g);
	}

	/* Slices concatenated: decode one after the other with `used`,
	 * merging into one — the same as hist_merge of the slices. */
	struct hist *s1 = typical(31, 1000), *s2 = hist_new(), *s3 = typical(32, 5000);
	uint8_t buf[3 * 32768];
	size_t len = 0;
	len += hist_encode(s1, buf + len, sizeof(buf) - len);
	len += hist_encode(s2, buf + len, sizeof(buf) - len);
	len += hist_encode(s3, buf + len, sizeof(buf) - len);
	struct hist *want = hist_new(), *got = typical(33, 10);
	hist_merge(want, got);
	hist_merge(want, s1);
	hist_merge(want, s2);
	hist_merge(want, s3);
	size_t pos = 0;
	for (int k = 0; k < 3; k++) {
		size_t used;
		assert_int_equal(hist_decode_merge(got, buf + pos, len - pos, &used), 0);
		pos += used;
	}
	assert_int_equal(pos, len);
	assert_memory_equal(got, want, sizeof(*want));
	free(s1);
	free(s2);
	free(s3);
	free(want);
	free(got);
}

static void test_encoded_size(void **state)
{
	(void)state;
	struct hist *h = typical(41, 100000);
	uint8_t buf[32768];
	size_t n = hist_encode(h, buf, sizeof(buf));
	unsigned nnz = 0;
	for (unsigned i = 0; i < HIST_BUCKETS; i++)
		nnz += h->buckets[i] != 0;
	printf("  100k log-normal samples: %u non-empty buckets, %zu bytes encoded (dense: %zu)\n", nnz, n, sizeof(*h));
	assert_true(n > 0 && n < 1200);
	assert_true(hist_encoded_max(h) >= n);

	/* Inter-token latency is narrower (median 25 ms, sigma 0.3): about half
	 * the buckets. */
	struct hist *itl = hist_new();
	struct rng r = { 43 };
	for (int i = 0; i < 100000; i++)
		hist_record(itl, clamp_us(25000.0 * exp(0.3 * rng_normal(&r))));
	n = hist_encode(itl, buf, sizeof(buf));
	printf("  100k ITL-like samples: %zu bytes encoded\n", n);
	assert_true(n > 0 && n < 600);
	free(itl);

	/* A one-minute slice of a quiet route: a few hundred requests. */
	struct hist *s = typical(42, 300);
	n = hist_encode(s, buf, sizeof(buf));
	printf("  300 log-normal samples: %zu bytes encoded\n", n);
	assert_true(n > 0 && n < 600);
	free(h);
	free(s);
}

/* Decodes `in` into a copy of base; checks it either fails leaving the copy
 * identical, or succeeds within len with the invariants intact. */
static int decode_checked(const struct hist *base, struct hist *scratch, const uint8_t *in, size_t len)
{
	memcpy(scratch, base, sizeof(*scratch));
	size_t used = 12345;
	int rc = hist_decode_merge(scratch, in, len, &used);
	if (rc != 0) {
		assert_int_equal(rc, -1);
		assert_int_equal(used, 12345);
		assert_memory_equal(scratch, base, sizeof(*base));
	} else {
		assert_true(used >= 5 && used <= len);
		check_invariants(scratch);
	}
	return rc;
}

static void test_decode_truncated(void **state)
{
	(void)state;
	struct hist *h = typical(51, 20000), *base = typical(52, 100), *scratch = hist_new();
	hist_record(h, UINT64_MAX);
	uint8_t buf[32768];
	size_t n = hist_encode(h, buf, sizeof(buf));
	assert_true(n > 0);
	/* Every proper prefix is rejected; copy it into an exact-size block
	 * so that ASan catches a read past len. */
	for (size_t len = 0; len < n; len++) {
		uint8_t *p = malloc(len ? len : 1);
		assert_non_null(p);
		memcpy(p, buf, len);
		assert_int_equal(decode_checked(base, scratch, p, len), -1);
		free(p);
	}
	assert_int_equal(decode_checked(base, scratch, buf, n), 0);
	free(h);
	free(base);
	free(scratch);
}

/* Appends a varint, for hand-built inputs. */
static size_t put(uint8_t *b, size_t pos, uint64_t v)
{
	do {
		b[pos++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
		v >>= 7;
	} while (v);
	return pos;
}

static size_t build(uint8_t *b, uint64_t count, uint64_t sum, uint64_t min, uint64_t max, uint64_t nnz,
		    const uint64_t *pairs, int npairs)
{
	size_t p = 0;
	p = put(b, p, count);
	p = put(b, p, sum);
	p = put(b, p, min);
	p = put(b, p, max);
	p = put(b, p, nnz << 1); /* sparse shape */
	for (int i = 0; i < 2 * npairs; i++)
		p = put(b, p, pairs[i]);
	return p;
}

static void test_decode_malformed(void **state)
{
	(void)state;
	struct hist *base = typical(61, 100), *scratch = hist_new();
	uint8_t b[256];
	size_t n;

	/* A valid one to start from: 3 samples, values 5, 5 and 200. */
	uint64_t ok[] = { 5, 2, hist_index(200) - 5, 1 };
	n = build(b, 3, 210, 5, 200, 2, ok, 2);
	assert_int_equal(decode_checked(base, scratch, b, n), 0);

	struct {
		const char *why;
		uint64_t count, sum, min, max, nnz;
		uint64_t pairs[6];
		int npairs;
	} bad[] = {
		{ "counts do not add up", 4, 210, 5, 200, 2, { 5, 2, hist_index(200) - 5, 1 }, 2 },
		{ "zero bucket count", 3, 210, 5, 200, 3, { 5, 2, 1, 0, hist_index(200) - 6, 1 }, 3 },
		{ "repeated index", 3, 210, 5, 5, 2, { 5, 2, 0, 1 }, 2 },
		{ "index past the end", 3, 210, 5, 200, 2, { 5, 2, HIST_BUCKETS, 1 }, 2 },
		{ "first index past the end", 1, 0, 5, 5, 1, { HIST_BUCKETS, 1 }, 1 },
		{ "huge delta that would wrap", 3, 210, 5, 200, 2, { 5, 2, UINT64_MAX - 3, 1 }, 2 },
		{ "min not in first bucket", 3, 210, 6, 200, 2, { 5, 2, hist_index(200) - 5, 1 }, 2 },
		{ "max not in last bucket", 3, 210, 5, 300, 2, { 5, 2, hist_index(200) - 5, 1 }, 2 },
		{ "min > max", 1, 0, 9, 5, 1, { 5, 1 }, 1 },
		{ "more buckets than samples", 1, 5, 5, 200, 2, { 5, 1, hist_index(200) - 5, 1 }, 2 },
		{ "more buckets than exist", 5000, 0, 0, 0, HIST_BUCKETS + 1, { 0 }, 0 },
		{ "no buckets but samples", 3, 0, 0, 0, 0, { 0 }, 0 },
		{ "bucket count overflow", 3, 0, 5, 200, 2, { 5, UINT64_MAX, hist_index(200) - 5, 4 }, 2 },
		{ "empty with buckets", 0, 0, UINT64_MAX, 0, 1, { 5, 1 }, 1 },
		{ "empty with a sum", 0, 1, UINT64_MAX, 0, 0, { 0 }, 0 },
		{ "empty with a min", 0, 0, 3, 0, 0, { 0 }, 0 },
		{ "fewer pairs than announced", 3, 210, 5, 200, 3, { 5, 2, hist_index(200) - 5, 1 }, 2 },
	};
	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		n = build(b, bad[k].count, bad[k].sum, bad[k].min, bad[k].max, bad[k].nnz, bad[k].pairs, bad[k].npairs);
		if (decode_checked(base, scratch, b, n) != -1)
			fail_msg("accepted: %s", bad[k].why);
	}

	/* Varints: 11 bytes, and a 10th byte with more than one bit. */
	memset(b, 0xff, 10);
	b[10] = 0x00;
	assert_int_equal(decode_checked(base, scratch, b, 11), -1);
	memset(b, 0xff, 9);
	b[9] = 0x02;
	assert_int_equal(decode_checked(base, scratch, b, 10), -1);
	/* A 10-byte varint with the top bit alone is UINT64_MAX: fine. */
	n = 0;
	b[n++] = 1; /* count */
	b[n++] = 0; /* sum */
	memset(b + n, 0xff, 9);
	n += 9;
	b[n++] = 0x01; /* min = UINT64_MAX */
	memset(b + n, 0xff, 9);
	n += 9;
	b[n++] = 0x01;	       /* max = UINT64_MAX */
	n = put(b, n, 1 << 1); /* one bucket, sparse */
	n = put(b, n, HIST_BUCKETS - 1);
	n = put(b, n, 1);
	assert_int_equal(decode_checked(base, scratch, b, n), 0);

	free(base);
	free(scratch);
}

static void test_decode_garbage(void **state)
{
	(void)state;
	struct hist *base = typical(71, 1000), *scratch = hist_new(), *h = typical(72, 5000);
	struct rng r = { 73 };
	uint8_t good[32768], buf[32768];
	size_t n = hist_encode(h, good, sizeof(good));
	int accepted = 0;

	/* Random bytes, mostly small so that the header parses sometimes. */
	for (int it = 0; it < 200000; it++) {
		size_t len = rng_next(&r) % 48;
		for (size_t i = 0; i < len; i++) {
			uint64_t x = rng_next(&r);
			buf[i] = (uint8_t)(x % 4 == 0 ? x >> 8 : (x >> 8) % 4);
		}
		accepted += decode_checked(base, scratch, buf, len) == 0;
	}
	/* A valid encoding with a few bytes changed, or cut short. */
	for (int it = 0; it < 20000; it++) {
		memcpy(buf, good, n);
		int flips = 1 + (int)(rng_next(&r) % 3);
		for (int f = 0; f < flips; f++)
			buf[rng_next(&r) % n] ^= (uint8_t)(1 + rng_next(&r) % 255);
		size_t len = rng_next(&r) % 4 ? n : rng_next(&r) % (n + 1);
		accepted += decode_checked(base, scratch, buf, len) == 0;
	}
	printf("  garbage/mutated inputs accepted as valid: %d of 220000\n", accepted);
	free(base);
	free(scratch);
	free(h);
}

/* Hand-built dense shapes: the encoder's other form, and its failure modes. */
static void test_decode_dense(void **state)
{
	(void)state;
	struct hist *base = typical(71, 100), *scratch = hist_new();
	struct hist *h = hist_new();
	uint8_t b[64], enc[32768];
	size_t n;

	/* a smooth, contiguous histogram is encoded dense and round-trips */
	for (uint64_t v = 1000; v < 3000; v++)
		hist_record_n(h, v, 50 + (v % 7));
	n = hist_encode(h, enc, sizeof(enc));
	assert_true(n > 0);
	assert_int_equal(enc[0] != 0, 1);
	struct hist *back = hist_new();
	size_t used = 0;
	assert_int_equal(hist_decode_merge(back, enc, n, &used), 0);
	assert_int_equal(used, n);
	assert_memory_equal(back, h, sizeof(*h));

	/* values 5 (x2), 6 (x1): dense from index 5, span 2, counts 2 then 1 */
	size_t p = 0;
	p = put(b, p, 3);
	p = put(b, p, 16);
	p = put(b, p, 5);
	p = put(b, p, 6);
	p = put(b, p, (2 << 1) | 1);
	p = put(b, p, 5);
	size_t head = p;
	p = put(b, p, 4); /* +2 */
	p = put(b, p, 1); /* -1 */
	assert_int_equal(decode_checked(base, scratch, b, p), 0);

	/* a difference that goes below zero */
	p = head;
	p = put(b, p, 4);
	p = put(b, p, 5); /* -3 */
	assert_int_equal(decode_checked(base, scratch, b, p), -1);
	/* a zero count at the end of the range (non-canonical) */
	p = head;
	p = put(b, p, 6); /* +3 */
	p = put(b, p, 5); /* -3 -> 0 */
	assert_int_equal(decode_checked(base, scratch, b, p), -1);
	/* a range running past the last bucket */
	p = 0;
	p = put(b, p, 3);
	p = put(b, p, 16);
	p = put(b, p, 5);
	p = put(b, p, 6);
	p = put(b, p, ((uint64_t)HIST_BUCKETS << 1) | 1);
	p = put(b, p, 5);
	assert_int_equal(decode_checked(base, scratch, b, p), -1);
	free(h);
	free(back);
	free(base);
	free(scratch);
}

/* hist_clear leaves what hist_init does, byte for byte, whatever the
 * samples were: it writes only min's to max's buckets. */
static void test_clear(void **state)
{
	(void)state;
	struct hist *want = hist_new(), *h = hist_new();
	hist_clear(h);
	assert_memory_equal(h, want, sizeof(*h));
	static const uint64_t edges[] = { 0, 127, 128, 1023, 1024, HIST_LIMIT - 1, UINT64_MAX };
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
		hist_record(h, edges[i]);
		hist_clear(h);
		assert_memory_equal(h, want, sizeof(*h));
		hist_record(h, edges[i]);
		hist_record(h, edges[sizeof(edges) / sizeof(edges[0]) - 1 - i]);
		hist_clear(h);
		assert_memory_equal(h, want, sizeof(*h));
	}
	for (enum dist d = 0; d < D__COUNT; d++) {
		struct rng r = { 200 + d };
		for (int i = 0; i < 10000; i++)
			hist_record(h, draw(&r, d));
		hist_clear(h);
		assert_memory_equal(h, want, sizeof(*h));
	}
	free(h);
	free(want);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_consistent),
		cmocka_unit_test(test_geometry),
		cmocka_unit_test(test_small_exact),
		cmocka_unit_test(test_quantile_edges),
		cmocka_unit_test(test_quantiles_uniform),
		cmocka_unit_test(test_quantiles_lognormal),
		cmocka_unit_test(test_quantiles_bimodal),
		cmocka_unit_test(test_quantiles_pareto),
		cmocka_unit_test(test_merge_union),
		cmocka_unit_test(test_count_le),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_encoded_size),
		cmocka_unit_test(test_decode_truncated),
		cmocka_unit_test(test_decode_malformed),
		cmocka_unit_test(test_decode_dense),
		cmocka_unit_test(test_decode_garbage),
		cmocka_unit_test(test_clear),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
