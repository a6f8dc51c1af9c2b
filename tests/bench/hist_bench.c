/*
 * hist_bench.c — what a histogram costs on the hot path and at query time.
 *
 * Times, each over pre-generated inputs so that the PRNG is not measured:
 *   - hist_record() over 10M log-normal latencies (median ~180 ms, as TTFT)
 *     and over 10M values uniform in 1 µs .. 10 s (more cache misses);
 *   - hist_quantile() (p99), hist_encode() and hist_decode_merge() on a
 *     typical histogram of 100k log-normal latencies;
 *   - hist_merge() of two such histograms;
 *   - what a request costs its series: one ITL gap recorded
 *     (slice_record_itl: the ITL histogram and its load-curve bucket), and
 *     a finished request recorded (slice_record_request: counters and about
 *     a dozen histograms), into a slice whose histograms already exist.
 * Prints ns/op. Not a test: run it by hand.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hist.h"
#include "slice.h"
#include "timeline.h"

#define N_RECORD 10000000
#define N_TYPICAL 100000

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s)
{
	return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static uint64_t lognormal_us(uint64_t *s)
{
	double n = sqrt(-2.0 * log(rng_unit(s))) * cos(2.0 * M_PI * rng_unit(s));
	return (uint64_t)(180000.0 * exp(0.6 * n));
}

/* Keeps the compiler from dropping work whose result is otherwise unused. */
static volatile uint64_t sink;

static double bench_record(const uint64_t *v, size_t n)
{
	struct hist *h = malloc(sizeof(*h));
	hist_init(h);
	double t0 = now_ns();
	for (size_t i = 0; i < n; i++)
		hist_record(h, v[i]);
	double t1 = now_ns();
	sink = h->count + h->sum + h->buckets[hist_index(v[0])];
	free(h);
	return (t1 - t0) / (double)n;
}

/* slice_record_itl and slice_record_request per call, over varied values
 * and in-flight counts; *itl_ns gets the former. */
static double bench_request(uint64_t *seed, double *itl_ns)
{
	static const struct slo slo = { 2000000, 100000, 0 };
	enum { REPS = 1000000, VALS = 1024 };
	uint64_t vals[VALS];
	struct slice sl;
	struct req_record r;
	uint64_t t, gap;

	for (int i = 0; i < VALS; i++)
		vals[i] = lognormal_us(seed);
	memset(&sl, 0, sizeof(sl));
	memset(&r, 0, sizeof(r));
	r.usage.input_tokens = 800;
	r.usage.output_tokens = 256;
	r.status = 200;
	r.at[TL_ARRIVE] = 1000000;
	r.at[TL_REQ_HEADERS] = r.at[TL_DISPATCH] = r.at[TL_UP_CONNECTED] = r.at[TL_ARRIVE] + 20000;
	r.at[TL_REQ_SENT] = r.at[TL_DISPATCH] + 30000;
	r.at[TL_RESP_HEADERS] = r.at[TL_REQ_SENT] + 300000;
	t = r.at[TL_ARRIVE] + 180000000;
	for (int i = 0; i < 256; i++, t += 22000000)
		record_token_event(&r, TOKEN_ANSWER, t, &gap);
	r.at[TL_RESP_END] = r.at[TL_CLIENT_DONE] = t;
	for (int i = 0; i < VALS; i++) { /* allocate every histogram first */
		slice_record_itl(&sl, vals[i] * 100, 1u + (unsigned)(i & 31));
		slice_record_request(&sl, &r, 1u + (unsigned)(i & 31), &slo);
	}

	double t0 = now_ns();
	for (int i = 0; i < REPS; i++)
		slice_record_itl(&sl, vals[i & (VALS - 1)] * 100, 1u + (unsigned)(i & 31));
	*itl_ns = (now_ns() - t0) / REPS;

	uint64_t first = r.at[TL_FIRST_TOKEN];
	t0 = now_ns();
	for (int i = 0; i < REPS; i++) {
		r.at[TL_FIRST_TOKEN] = first - vals[i & (VALS - 1)] % 100000 * 1000;
		slice_record_request(&sl, &r, 1u + (unsigned)(i & 31), &slo);
	}
	double t_req = (now_ns() - t0) / REPS;
	sink += sl.counters[CT_REQUESTS];
	slice_release(&sl);
	return t_req;
}

int main(void)
{
	uint64_t seed = 1;
	uint64_t *v = malloc(N_RECORD * sizeof(*v));
	if (!v)
		return 1;

	for (size_t i = 0; i < N_RECORD; i++)
		v[i] = lognormal_us(&seed);
	bench_record(v, N_RECORD); /* warm up: page in the array */
	printf("hist_record (log-normal, 10M):   %6.2f ns/op\n", bench_record(v, N_RECORD));
	for (size_t i = 0; i < N_RECORD; i++)
		v[i] = 1 + rng_next(&seed) % 10000000;
	printf("hist_record (uniform, 10M):      %6.2f ns/op\n", bench_record(v, N_RECORD));
	free(v);

	struct hist *h = malloc(sizeof(*h)), *d = malloc(sizeof(*d)), *h2 = malloc(sizeof(*h2));
	hist_init(h);
	hist_init(h2);
	for (int i = 0; i < N_TYPICAL; i++) {
		hist_record(h, lognormal_us(&seed));
		hist_record(h2, lognormal_us(&seed));
	}
	unsigned nnz = 0;
	for (unsigned i = 0; i < HIST_BUCKETS; i++)
		nnz += h->buckets[i] != 0;

	int reps = 100000;
	double t0 = now_ns();
	for (int i = 0; i < reps; i++) {
		/* Vary q a little so the call is not hoisted out of the loop. */
		sink += hist_quantile(h, 0.99 - (double)(i & 7) * 1e-6);
	}
	double t_q = (now_ns() - t0) / reps;

	uint8_t buf[32768];
	size_t len = 0;
	t0 = now_ns();
	for (int i = 0; i < reps; i++)
		len = hist_encode(h, buf, sizeof(buf));
	double t_enc = (now_ns() - t0) / reps;
	sink += len;

	hist_init(d);
	t0 = now_ns();
	for (int i = 0; i < reps; i++) {
		size_t used;
		if (hist_decode_merge(d, buf, len, &used) != 0)
			return 1;
		sink += used;
	}
	double t_dec = (now_ns() - t0) / reps;
	sink += d->count;

	t0 = now_ns();
	for (int i = 0; i < reps; i++)
		hist_merge(d, (i & 1) ? h : h2);
	double t_merge = (now_ns() - t0) / reps;
	sink += d->count;

	printf("typical histogram: %d log-normal samples, %u non-empty buckets, %zu bytes encoded\n", N_TYPICAL, nnz,
	       len);
	printf("hist_quantile (p99):             %8.1f ns/op\n", t_q);
	printf("hist_encode:                     %8.1f ns/op\n", t_enc);
	printf("hist_decode_merge:               %8.1f ns/op\n", t_dec);
	printf("hist_merge:                      %8.1f ns/op\n", t_merge);
	double t_itl, t_req = bench_request(&seed, &t_itl);
	printf("slice_record_itl (one gap):      %8.1f ns/op\n", t_itl);
	printf("slice_record_request:            %8.1f ns/op\n", t_req);
	free(h);
	free(h2);
	free(d);
	return 0;
}
