/*
 * test_router.c — building a generation of routes and upstreams (router_new),
 * in particular what a reload keeps: an upstream whose name and url stay
 * is the same object with the new settings, and a generation that cannot
 * be built changes none of the running one's upstreams.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <event2/event.h>

#include "config.h"
#include "router.h"
#include "upstream.h"
#include "wide_route.h"

/* A configuration of the given upstreams and one route to the first. The
 * strings are literals: config_free() frees only what config_own() took. */
static void make_config(struct config *c, const struct upstream_conf *ups, unsigned n)
{
	struct upstream_conf *u = config_own(c, calloc(n, sizeof(*u)));
	struct route_conf *r = config_own(c, calloc(1, sizeof(*r)));
	struct route_target *t = config_own(c, calloc(1, sizeof(*t)));

	assert_non_null(u);
	assert_non_null(r);
	assert_non_null(t);
	memcpy(u, ups, n * sizeof(*u));
	t->upstream = ups[0].name;
	t->weight = 1;
	r->name = "main";
	r->path_prefix = "/";
	r->targets = t;
	r->ntargets = 1;
	c->upstreams = u;
	c->nupstreams = n;
	c->routes = r;
	c->nroutes = 1;
}

static struct router *build(struct event_base *base, const struct upstream_conf *ups, unsigned n,
			    const struct router *prev, char *err, size_t errlen)
{
	struct config c;
	struct router *rt;

	config_defaults(&c);
	make_config(&c, ups, n);
	rt = router_new(base, &c, prev, prev ? prev->generation + 1 : 1, err, errlen);
	config_free(&c); /* emptied when the router took it */
	return rt;
}

static struct upstream_conf plain(const char *gpu, uint64_t connect_ms)
{
	struct upstream_conf u = { 0 };

	u.name = "a";
	u.url = "http://127.0.0.1:9";
	u.connect_timeout_ms = connect_ms;
	u.labels[0] = (struct label){ "gpu", gpu };
	u.nlabels = 1;
	return u;
}

/* A reload that keeps "a" gives it the new settings, on the same object. */
static void test_kept_upstream_takes_new_settings(void **state)
{
	struct event_base *base = event_base_new();
	struct upstream_conf one = plain("h100", 1000), two = plain("b200", 5000);
	char err[512] = "";
	(void)state;

	struct router *rt1 = build(base, &one, 1, NULL, err, sizeof(err));
	assert_non_null(rt1);
	struct router *rt2 = build(base, &two, 1, rt1, err, sizeof(err));
	assert_non_null(rt2);
	assert_ptr_equal(rt2->ups[0], rt1->ups[0]);
	assert_int_equal(rt2->ups[0]->connect_timeout_ms, 5000);
	assert_string_equal(rt2->ups[0]->conf.labels[0].value, "b200");
	router_unref(rt2);
	router_unref(rt1);
	event_base_free(base);
}

/* A generation that fails at an upstream after "a" (here: a CA file that
 * cannot be read, as when it vanishes between the check and the load) is
 * refused whole: "a" keeps the running generation's settings. */
static void test_failed_generation_changes_no_kept_upstream(void **state)
{
	struct event_base *base = event_base_new();
	struct upstream_conf one = plain("h100", 1000);
	struct upstream_conf two[2] = { plain("b200", 5000) };
	char err[512] = "";
	(void)state;

	two[1].name = "b";
	two[1].url = "https://127.0.0.1:9";
	two[1].tls_verify = true;
	two[1].tls_ca_file = "/nonexistent/tokentap-test-ca.pem";

	struct router *rt1 = build(base, &one, 1, NULL, err, sizeof(err));
	assert_non_null(rt1);
	assert_null(build(base, two, 2, rt1, err, sizeof(err)));
	assert_non_null(strstr(err, "upstream b"));
	assert_int_equal(rt1->ups[0]->connect_timeout_ms, 1000);
	assert_string_equal(rt1->ups[0]->conf.labels[0].value, "h100");
	assert_int_equal(rt1->ups[0]->refs, 1); /* no reference left behind */
	router_unref(rt1);
	event_base_free(base);
}

/* A generation of `n` upstreams u0.. (ejection after 5 failures, 1 s
 * backoff) and one route over all of them under `balance`. */
#define WIDE ROUTE_TARGETS_MAX
static char wide_names[WIDE][12]; /* "u" and any unsigned */
static struct router *build_wide(struct event_base *base, unsigned n, enum balance_policy balance)
{
	static const char *names[WIDE];
	char err[512] = "";

	for (unsigned i = 0; i < n; i++) {
		snprintf(wide_names[i], sizeof(wide_names[i]), "u%u", i);
		names[i] = wide_names[i];
	}
	struct router *rt = wide_router(base, n, balance, names, err, sizeof(err));
	assert_non_null(rt);
	return rt;
}

/* Runs `check` once per balance policy, each time on the one route of a
 * fresh generation of `n` upstreams (build_wide), released after. */
static void each_policy(unsigned n, void (*check)(struct route *r, enum balance_policy pol))
{
	struct event_base *base = event_base_new();

	for (int pol = BALANCE_WEIGHTED; pol <= BALANCE_PREFIX; pol++) {
		struct router *rt = build_wide(base, n, (enum balance_policy)pol);
		check(&rt->routes[0], (enum balance_policy)pol);
		router_unref(rt);
	}
	event_base_free(base);
}

/* Ejection leaves an upstream out of every policy's choice; a route whose
 * every upstream is ejected routes as if none were; the backoff's end gives
 * exactly one probe. */
static void pick_ejection(struct route *r, enum balance_policy pol)
{
	struct pick_req q = { 0 };
	struct pick_out o;

	struct upstream *u0 = r->targets[0].up;
	uint64_t now = wide_mono_ns();
	for (int i = 0; i < 5; i++)
		upstream_outlier_note(u0, false, now);
	for (int i = 0; i < 200; i++) {
		q.has_prefix = pol == BALANCE_PREFIX;
		q.prefix_key = (uint64_t)i * 0x9e3779b97f4a7c15ull;
		assert_ptr_not_equal(route_pick(r, &q, 0, &o), u0);
	}
	/* every other one tried: the ejected one rather than none */
	assert_ptr_equal(route_pick(r, &q, 0xeu, &o), u0);
	/* its backoff over (a failure stamped two seconds ago): one probe */
	upstream_outlier_note(u0, true, now);
	for (int i = 0; i < 5; i++)
		upstream_outlier_note(u0, false, now - 2000000000ull);
	assert_ptr_equal(route_pick(r, &q, 0, &o), u0);
	assert_int_equal(o.reason, PICK_PROBE);
	assert_true(o.probe);
	for (int i = 0; i < 50; i++)
		assert_ptr_not_equal(route_pick(r, &q, 0, &o), u0); /* its probe runs */
	upstream_outlier_note(u0, true, wide_mono_ns());
	upstream_probe_done(u0);
	bool back = false;
	for (int i = 0; i < 50 && !back; i++) {
		q.prefix_key = (uint64_t)i * 0x2545f4914f6cdd1dull;
		back = route_pick(r, &q, 0, &o) == u0;
	}
	assert_true(back);
}

static void test_pick_ejection(void **state)
{
	(void)state;
	each_policy(4, pick_ejection);
}

/* Failover over a route as wide as allowed: with every target but one
 * marked tried, that one is picked, wherever it sits among the 64 (the
 * marks are 64 bits), by every policy; with all marked, none. */
static void pick_skips_tried_at_every_index(struct route *r, enum balance_policy pol)
{
	struct pick_out o;
	struct pick_req q = { .has_prefix = pol == BALANCE_PREFIX, .prefix_key = 42, .tokens = 100 };
	assert_int_equal(r->ntargets, 64);
	for (unsigned i = 0; i < WIDE; i++) {
		uint64_t tried = ~(uint64_t)0 & ~(1ull << i);
		assert_ptr_equal(route_pick(r, &q, tried, &o), r->targets[i].up);
		assert_int_equal(o.index, i);
	}
	assert_null(route_pick(r, &q, ~(uint64_t)0, &o));
}

static void test_pick_skips_tried_at_every_index(void **state)
{
	(void)state;
	each_policy(WIDE, pick_skips_tried_at_every_index);
}

/* latency with a prompt chain: what each upstream was sent is what it is
 * expected to hold (upstream_held_*), the one that got it last is compared,
 * and it is chosen on otherwise equal upstreams, counted as holding the
 * run it was sent. */
static void test_pick_latency_held(void **state)
{
	struct event_base *base = event_base_new();
	struct router *rt = build_wide(base, 8, BALANCE_LATENCY);
	struct route *r = &rt->routes[0];
	uint64_t chain[40], other[40];
	struct pick_out o;
	unsigned blocks = 9;
	(void)state;

	for (unsigned k = 0; k < 40; k++) {
		chain[k] = 0x51afd7ed558ccdffull * (k + 3) ^ 0x1234;
		other[k] = 0x2545f4914f6cdd1dull * (k + 7);
	}
	assert_int_equal(upstream_held_owner(chain, 40, &blocks), 0);
	assert_int_equal(blocks, 0);
	upstream_held_note(r->targets[5].up, chain, 24);
	assert_int_equal(upstream_held_blocks(r->targets[5].up, chain, 40), 24);
	assert_int_equal(upstream_held_blocks(r->targets[5].up, chain, 10), 10);
	assert_int_equal(upstream_held_blocks(r->targets[4].up, chain, 40), 0);
	assert_int_equal(upstream_held_blocks(r->targets[5].up, other, 40), 0);
	assert_int_equal(upstream_held_owner(chain, 40, &blocks), upstream_held_id(r->targets[5].up));
	assert_int_equal(blocks, 24);
	assert_int_not_equal(upstream_held_id(r->targets[5].up), upstream_held_id(r->targets[4].up));
	/* every upstream measured alike (no probes): the holder, whatever the draw */
	for (unsigned i = 0; i < 8; i++)
		for (int k = 0; k < 8; k++)
			upstream_ttft_note(r->targets[i].up, 100 + 100 * k, 100, -1, 10 + 0.05 * (100 + 100 * k),
					   wide_mono_ns());
	struct pick_req q = { .chain = chain, .nchain = 40, .tokens = 640 };
	for (int n = 0; n < 50; n++) {
		assert_ptr_equal(route_pick(r, &q, 0, &o), r->targets[5].up);
		assert_int_equal(o.reason, PICK_LATENCY);
		assert_int_equal(o.held_blocks, 24);
	}
	/* a prompt no upstream was sent: none counted as holding it */
	q.chain = other;
	assert_non_null(route_pick(r, &q, 0, &o));
	assert_int_equal(o.held_blocks, 0);
	/* the holder ruled out (tried): another, holding nothing */
	q.chain = chain;
	assert_ptr_not_equal(route_pick(r, &q, 1ull << 5, &o), r->targets[5].up);
	assert_int_equal(o.held_blocks, 0);
	router_unref(rt);
	event_base_free(base);
}

/* route_pick over ROUTE_TARGETS_MAX upstreams, all measured (no probes):
 * every pick is one of the route's targets, and the policies that spread
 * load by design (weighted's rotation, least_request's random pairs,
 * prefix's hash of distinct keys) reach every one of the 64. What a pick
 * costs is tests/bench/route_pick_bench's to say, not a timed test's. */
static void pick_wide(struct route *r, enum balance_policy pol)
{
	enum { PICKS = 20000 };
	struct pick_out o;
	struct pick_req q = { .has_prefix = pol == BALANCE_PREFIX, .tokens = 100 };
	uint64_t reached = 0;
	for (unsigned i = 0; i < WIDE; i++)
		for (int k = 0; k < 5; k++)
			upstream_ttft_note(r->targets[i].up, 100 + 50 * k, 100, -1, 20 + i + k, wide_mono_ns());
	for (int n = 0; n < PICKS; n++) {
		q.prefix_key = (uint64_t)n * 0x9e3779b97f4a7c15ull;
		struct upstream *up = route_pick(r, &q, 0, &o);
		unsigned i = 0;
		while (i < WIDE && r->targets[i].up != up)
			i++;
		assert_true(i < WIDE);
		reached |= 1ull << i;
	}
	if (pol != BALANCE_LATENCY) /* latency prefers the measured fastest */
		assert_true(reached == UINT64_MAX);
}

static void test_pick_wide(void **state)
{
	(void)state;
	each_policy(WIDE, pick_wide);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kept_upstream_takes_new_settings),
		cmocka_unit_test(test_failed_generation_changes_no_kept_upstream),
		cmocka_unit_test(test_pick_ejection),
		cmocka_unit_test(test_pick_skips_tried_at_every_index),
		cmocka_unit_test(test_pick_latency_held),
		cmocka_unit_test(test_pick_wide),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
