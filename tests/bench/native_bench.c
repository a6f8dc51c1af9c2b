/*
 * native_bench.c — the figures behind prom_proto.c's choice of native
 * buckets, and what the protobuf exposition costs (docs/fleet.md).
 *
 * 1. Quantile error against the exact quantile (the sample of rank
 *    ceil(q n)) of 200k integer-µs samples of a few distributions, for:
 *      - tokentap's own hist_quantile (the bucket's midpoint);
 *      - "converted": tokentap's histogram turned into schema-7 native
 *        buckets (prom_native_buckets), then Prometheus's native
 *        histogram_quantile (linear inside the native bucket);
 *      - "parallel": an exact schema-7 histogram recorded beside it, with
 *        the same histogram_quantile.
 * 2. Recording cost: hist_record and a parallel schema-7 record (index plus
 *    increment) per sample, and the memory of each per histogram.
 * 3. Exposition cost: prom_render (text) and prom_render_proto on a store
 *    result of 1, 10 and 100 series (upstream x model) whose every time
 *    histogram holds 20k log-normal samples: time per render and bytes.
 * Prints tables. Not a test: run it by hand.
 */
#include <event2/buffer.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fidelity.h"
#include "hist.h"
#include "prom.h"
#include "prom_proto.h"
#include "slice.h"
#include "store.h"

#define N 200000
#define LO_INDEX (-20 * 128 + 1)

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Its own splitmix64 source, not testrand.h's xorshift (which comes with
 * fidelity.h): the same draws as when docs/fleet.md's figures were taken. */
static uint64_t rng_state = 16;

static double sm_uniform(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
	return sqrt(-2 * log(sm_uniform())) * cos(2 * M_PI * sm_uniform());
}

enum dist { LOGNORMAL, UNIFORM, BIMODAL, TRAPEZOID, SPIKES, DIST__COUNT };
static const char *const dist_name[] = {
	"log-normal, median 300 ms, sigma 0.5", "uniform 1.0-2.5 s",
	"bimodal: 70 % ~80 ms, 30 % ~900 ms",	"trapezoid ITL 20-60 ms",
	"spikes: whole ms 50-60, +-20 us",
};

static uint64_t draw(enum dist d)
{
	switch (d) {
	case LOGNORMAL: return (uint64_t)llround(300000 * exp(0.5 * gauss()));
	case UNIFORM: return 1000000 + (uint64_t)(sm_uniform() * 1500000);
	case BIMODAL:
		return sm_uniform() < 0.7 ? (uint64_t)llround(80000 + 10000 * fabs(gauss()))
					  : (uint64_t)llround(900000 + 100000 * fabs(gauss()));
	case TRAPEZOID: return 20000 + (uint64_t)(sm_uniform() * 30000) + (uint64_t)(sm_uniform() * 10000);
	default: return 50000 + 1000 * (uint64_t)(sm_uniform() * 11) + (uint64_t)(sm_uniform() * 40) - 20;
	}
}

static uint64_t conv[PROM_NATIVE_SPAN], par[PROM_NATIVE_SPAN];

static void errors(void)
{
	static const double qs[] = { 0.5, 0.9, 0.99, 0.999 };
	uint64_t *v = malloc(N * sizeof(*v));
	struct hist *h = malloc(sizeof(*h));

	printf("## quantile error against the exact sample quantile, %d samples\n\n", N);
	printf("| distribution | q | exact | tokentap | converted (native) | parallel schema 7 "
	       "|\n|---|---|---|---|---|---|\n");
	for (int d = 0; d < DIST__COUNT; d++) {
		hist_init(h);
		memset(par, 0, sizeof(par));
		for (size_t i = 0; i < N; i++) {
			v[i] = draw((enum dist)d);
			hist_record(h, v[i]);
			par[prom_native_index((double)v[i] / 1e6) - LO_INDEX]++;
		}
		qsort(v, N, sizeof(*v), fid_by_value);
		int first;
		size_t n;
		uint64_t zero;
		prom_native_buckets(h, &first, &n, conv, &zero);
		for (size_t k = 0; k < sizeof(qs) / sizeof(qs[0]); k++) {
			double q = qs[k];
			size_t rank = (size_t)ceil(q * N);
			double exact = (double)v[rank - 1] / 1e6;
			double own = (double)hist_quantile(h, q) / 1e6;
			double c = fid_native_quantile(q, 7, zero, first, conv, n, h->count, false);
			double p = fid_native_quantile(q, 7, 0, LO_INDEX, par, PROM_NATIVE_SPAN, N, false);
			printf("| %s | %g | %.4f s | %+.2f %% | %+.2f %% | %+.2f %% |\n", dist_name[d], q, exact,
			       (own / exact - 1) * 100, (c / exact - 1) * 100, (p / exact - 1) * 100);
		}
	}
	free(v);
	free(h);
}

static void record_cost(void)
{
	enum { M = 10000000 };
	uint64_t *v = malloc(M * sizeof(*v)), sink = 0;
	struct hist *h = malloc(sizeof(*h));

	for (size_t i = 0; i < M; i++)
		v[i] = draw(LOGNORMAL);
	hist_init(h);
	double t0 = now_ns();
	for (size_t i = 0; i < M; i++)
		hist_record(h, v[i]);
	double t1 = now_ns();
	memset(par, 0, sizeof(par));
	for (size_t i = 0; i < M; i++)
		par[prom_native_index((double)v[i] / 1e6) - LO_INDEX]++;
	double t2 = now_ns();
	for (size_t i = 0; i < PROM_NATIVE_SPAN; i++)
		sink += par[i];
	printf("\n## recording, %d log-normal samples\n\n", M);
	printf("| histogram | ns per record | bytes per histogram |\n|---|---|---|\n");
	printf("| tokentap (hist_record) | %.1f | %zu |\n", (t1 - t0) / M, sizeof(struct hist));
	printf("| parallel schema 7, dense (index by frexp + search) | %.1f | %zu |\n", (t2 - t1) / M,
	       (size_t)PROM_NATIVE_SPAN * sizeof(uint64_t));
	if (sink != M)
		printf("(parallel histogram lost samples)\n");
	free(v);
	free(h);
}

static void add_series(struct store_result *r, const char *up, const char *model)
{
	struct store_series *s;
	size_t lr = strlen("default"), lu = strlen(up), lm = strlen(model);

	r->series = realloc(r->series, (r->n + 1) * sizeof(*r->series));
	s = &r->series[r->n++];
	memset(s, 0, sizeof(*s));
	memcpy(s->key, "default", lr + 1);
	memcpy(s->key + lr + 1, up, lu + 1);
	memcpy(s->key + lr + lu + 2, model, lm + 1);
	s->key[lr + lu + lm + 3] = '0';
	s->keylen = lr + lu + lm + 4;
	for (unsigned m = 0; m < HM__COUNT; m++) {
		if (hist_metric_unit((enum hist_metric)m) != UNIT_US)
			continue;
		struct hist *h = slice_hist(&s->slice, m);
		for (int i = 0; i < 20000; i++)
			hist_record(h, draw(LOGNORMAL) / (m == HM_ITL ? 10 : 1));
	}
	s->slice.counters[CT_REQUESTS] = 20000;
	s->slice.counters[CT_STATUS_2XX] = 20000;
}

static void exposition_cost(void)
{
	static const size_t sizes[] = { 1, 10, 100 };

	printf("\n## exposition of /metrics, every time histogram holding 20k samples\n\n");
	printf("| series (upstream x model) | text: ms | text: bytes | protobuf: ms | protobuf: bytes |\n"
	       "|---|---|---|---|---|\n");
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		struct store_result r;
		char up[32], model[32];
		memset(&r, 0, sizeof(r));
		for (size_t i = 0; i < sizes[si]; i++) {
			snprintf(up, sizeof(up), "upstream-%zu", i % 10);
			snprintf(model, sizeof(model), "model-%zu", i / 10);
			add_series(&r, up, model);
		}
		double best_t = 1e18, best_p = 1e18;
		size_t bytes_t = 0, bytes_p = 0;
		for (int rep = 0; rep < 5; rep++) {
			struct evbuffer *b = evbuffer_new();
			double t0 = now_ns();
			if (prom_render(b, &r) != 0)
				abort();
			double t1 = now_ns();
			bytes_t = evbuffer_get_length(b);
			evbuffer_free(b);
			b = evbuffer_new();
			double t2 = now_ns();
			if (prom_render_proto(b, &r, NULL, 0) != 0)
				abort();
			double t3 = now_ns();
			bytes_p = evbuffer_get_length(b);
			evbuffer_free(b);
			best_t = fmin(best_t, t1 - t0);
			best_p = fmin(best_p, t3 - t2);
		}
		printf("| %zu | %.2f | %zu | %.2f | %zu |\n", sizes[si], best_t / 1e6, bytes_t, best_p / 1e6, bytes_p);
		store_result_free(&r);
	}
}

int main(void)
{
	errors();
	record_cost();
	exposition_cost();
	return 0;
}
