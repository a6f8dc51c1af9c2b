/*
 * route_pick_bench.c — what one choice of upstream costs: route_pick over a
 * route of 64 upstreams (ROUTE_TARGETS_MAX), every policy, each upstream
 * measured (no probes), the latency choice with a prompt of 64 blocks half
 * of which one upstream holds. Prints p50, p99 and p99.9 per policy, the
 * best of the rounds by p99 (a loaded machine's scheduler lands in single
 * picks; the best round shows the code's cost). The bound: 2 µs at
 * p99 (docs/routing.md, "What a choice costs").
 *
 *   build/tests/bench/route_pick_bench [PICKS [ROUNDS]]     (default 20000 5)
 *   valgrind --tool=callgrind build/tests/bench/route_pick_bench 2000 1
 *
 * It uses only router.h and upstream.h, so that it also builds against an
 * older tree (without upstream_held_note the latency choice is measured
 * without a prompt chain).
 */
#include <event2/event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "router.h"
#include "upstream.h"
#include "wide_route.h"

#define WIDE 64
#define CHAIN 64

static char names[WIDE][32];

static struct router *build_wide(struct event_base *base, enum balance_policy balance)
{
	static const char *ptrs[WIDE];
	char err[512] = "";

	for (unsigned i = 0; i < WIDE; i++) {
		snprintf(names[i], sizeof(names[i]), "gpu-node-%02u", i);
		ptrs[i] = names[i];
	}
	struct router *rt = wide_router(base, WIDE, balance, ptrs, err, sizeof(err));
	if (!rt) {
		fprintf(stderr, "router_new: %s\n", err);
		exit(1);
	}
	return rt;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const char *const pol_names[] = { "weighted", "least_request", "latency", "prefix" };
	unsigned picks = argc > 1 ? (unsigned)atoi(argv[1]) : 20000, rounds = argc > 2 ? (unsigned)atoi(argv[2]) : 5;
	struct event_base *base = event_base_new();
	uint64_t *t = calloc(picks ? picks : 1, sizeof(*t));
	uint64_t chain[CHAIN];
	struct pick_out o;
	unsigned sink = 0;

	if (!base || !t || !picks || !rounds)
		return 1;
	for (unsigned k = 0; k < CHAIN; k++)
		chain[k] = 0x9e3779b97f4a7c15ull * (k + 1) ^ 0x5bd1e995u;
	for (int pol = BALANCE_WEIGHTED; pol <= BALANCE_PREFIX; pol++) {
		struct router *rt = build_wide(base, (enum balance_policy)pol);
		struct route *r = &rt->routes[0];
		struct pick_req q = { .has_prefix = pol == BALANCE_PREFIX, .tokens = 1024 };
		uint64_t b50 = 0, b99 = UINT64_MAX, b999 = 0;
		for (unsigned i = 0; i < WIDE; i++) /* measured: no probes */
			for (int k = 0; k < 5; k++)
				upstream_ttft_note(r->targets[i].up, 100 + 50 * k, 100, -1, 20 + i + k, wide_mono_ns());
#ifdef UP_HELD_SLOTS
		if (pol == BALANCE_LATENCY) { /* a prompt of 64 blocks, the first 32 held by one upstream */
			upstream_held_note(r->targets[7].up, chain, CHAIN / 2);
			q.chain = chain;
			q.nchain = CHAIN;
		}
#endif
		for (unsigned round = 0; round < rounds; round++) {
			for (unsigned n = 0; n < picks; n++) {
				q.prefix_key = (uint64_t)n * 0x9e3779b97f4a7c15ull;
				uint64_t a = wide_mono_ns();
				struct upstream *up = route_pick(r, &q, 0, &o);
				t[n] = wide_mono_ns() - a;
				sink += up != NULL;
			}
			qsort(t, picks, sizeof(t[0]), cmp_u64);
			if (t[(size_t)picks * 99 / 100] < b99) {
				b50 = t[picks / 2];
				b99 = t[(size_t)picks * 99 / 100];
				b999 = t[(size_t)picks * 999 / 1000];
			}
		}
		printf("route_pick, %d upstreams, %-13s p50 %.3f us, p99 %.3f us, p99.9 %.3f us\n", WIDE,
		       pol_names[pol], b50 / 1e3, b99 / 1e3, b999 / 1e3);
		router_unref(rt);
	}
	event_base_free(base);
	free(t);
	return sink == (unsigned)(4 * picks * rounds) ? 0 : 1;
}
