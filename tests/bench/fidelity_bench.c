/*
 * fidelity_bench.c — how far tokentap's quantiles are from exact, per
 * distribution the benchmarks use (tests/unit/fidelity.h) and quantile
 * (p50 p90 p95 p99 p99.9), for:
 *   - /stats: hist_quantile on tokentap's histogram;
 *   - the native-histogram export (prom_native_buckets, what the protobuf
 *     /metrics carries) read by Prometheus's histogram_quantile, with the
 *     linear interpolation of Prometheus 2.x and the exponential one of 3.x;
 *   - a fleet: three instances' native histograms added bucket by bucket
 *     (what sum() over instances does), against the exact quantile of all
 *     their samples.
 * Each cell is the error of largest magnitude over 3 seeds and 3 sizes (1k,
 * 10k, 200k samples; fleets of 10k + 5k + 2k), in per cent. The last line
 * gives the worst of all; the exit status is 1 when it is over 1 %.
 * Prints a markdown table (docs/fleet.md). Not a test: run it by hand;
 * test_fidelity pins the same bound on fixed seeds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fidelity.h"
#include "hist.h"
#include "prom_proto.h"

#define NSEEDS 3
#define MAXN 200000
#define LO_INDEX (-20 * 128 + 1) /* PROM_NATIVE_SPAN's first index (schema 7) */

static const size_t sizes[] = { 1000, 10000, 200000 };
static const size_t fleet_sizes[] = { 10000, 5000, 2000 };

enum col { C_STATS, C_LIN, C_EXP, C_FLEET_LIN, C_FLEET_EXP, C__COUNT };
static const char *const col_name[C__COUNT] = { "/stats", "native, 2.x linear", "native, 3.x exponential",
						"fleet of 3, linear", "fleet of 3, exponential" };

static double worst[FID__COUNT][FID_NQ][C__COUNT];
static uint64_t natives[PROM_NATIVE_SPAN], fleet[PROM_NATIVE_SPAN];

static void keep(double *w, double e)
{
	if (fabs(e) > fabs(*w))
		*w = e;
}

/* Adds h's native buckets into acc (indexed from LO_INDEX); returns the zero
 * bucket's count. */
static uint64_t add_native(const struct hist *h, uint64_t *acc)
{
	int first;
	size_t n;
	uint64_t zero;
	prom_native_buckets(h, &first, &n, natives, &zero);
	for (size_t k = 0; k < n; k++)
		acc[first + (int)k - LO_INDEX] += natives[k];
	return zero;
}

static void one(enum fid_dist d, uint64_t seed, uint64_t *v, struct hist *h, uint64_t *acc)
{
	bool is_time = d != FID_TOKENS;

	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t n = sizes[si];
		testrand_state = seed * 0x9e3779b97f4a7c15ull + si + 1;
		hist_init(h);
		for (size_t i = 0; i < n; i++)
			hist_record(h, v[i] = fid_draw(d));
		qsort(v, n, sizeof(*v), fid_by_value);
		memset(acc, 0, PROM_NATIVE_SPAN * sizeof(*acc));
		uint64_t zero = add_native(h, acc);
		for (size_t k = 0; k < FID_NQ; k++) {
			double q = fid_quantiles[k], exact = (double)fid_exact(v, n, q);
			keep(&worst[d][k][C_STATS], fid_err((double)hist_quantile(h, q), exact));
			if (!is_time)
				continue;
			for (int e = 0; e < 2; e++) {
				double est = fid_native_quantile(q, 7, zero, LO_INDEX, acc, PROM_NATIVE_SPAN, n, e);
				keep(&worst[d][k][e ? C_EXP : C_LIN], fid_err(est * 1e6, exact));
			}
		}
	}
	if (!is_time)
		return;
	/* a fleet: three instances, their native buckets added */
	size_t total = 0;
	uint64_t zero = 0;
	memset(fleet, 0, sizeof(fleet));
	for (size_t i = 0; i < 3; i++) {
		testrand_state = seed * 0x9e3779b97f4a7c15ull + 100 + i;
		hist_init(h);
		for (size_t j = 0; j < fleet_sizes[i]; j++)
			hist_record(h, v[total + j] = fid_draw(d));
		total += fleet_sizes[i];
		zero += add_native(h, fleet);
	}
	qsort(v, total, sizeof(*v), fid_by_value);
	for (size_t k = 0; k < FID_NQ; k++) {
		double q = fid_quantiles[k], exact = (double)fid_exact(v, total, q);
		for (int e = 0; e < 2; e++) {
			double est = fid_native_quantile(q, 7, zero, LO_INDEX, fleet, PROM_NATIVE_SPAN, total, e);
			keep(&worst[d][k][e ? C_FLEET_EXP : C_FLEET_LIN], fid_err(est * 1e6, exact));
		}
	}
}

int main(void)
{
	uint64_t *v = malloc(MAXN * sizeof(*v)), *acc = malloc(PROM_NATIVE_SPAN * sizeof(*acc));
	struct hist *h = malloc(sizeof(*h));
	double all = 0;

	if (!v || !acc || !h)
		return 2;
	for (int d = 0; d < FID__COUNT; d++)
		for (uint64_t s = 1; s <= NSEEDS; s++)
			one((enum fid_dist)d, s, v, h, acc);

	printf("## quantile error against exact, worst over %d seeds x {1k, 10k, 200k} samples (per cent)\n\n", NSEEDS);
	printf("struct hist: %zu bytes, %u buckets\n\n", sizeof(struct hist), (unsigned)HIST_BUCKETS);
	printf("| distribution | q |");
	for (int c = 0; c < C__COUNT; c++)
		printf(" %s |", col_name[c]);
	printf("\n|---|---|---|---|---|---|---|\n");
	for (int d = 0; d < FID__COUNT; d++)
		for (size_t k = 0; k < FID_NQ; k++) {
			printf("| %s | %g |", fid_dist_name[d], fid_quantiles[k]);
			for (int c = 0; c < C__COUNT; c++) {
				if (d == FID_TOKENS && c != C_STATS) {
					printf(" (not exported) |");
					continue;
				}
				double e = worst[d][k][c];
				printf(fabs(e) > 1.0 ? " **%+.2f** |" : " %+.2f |", e);
				all = fmax(all, fabs(e));
			}
			printf("\n");
		}
	printf("\nworst of all: %.2f %%\n", all);
	free(v);
	free(acc);
	free(h);
	return all > 1.0;
}
