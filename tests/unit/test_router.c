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
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>

#include "config.h"
#include "router.h"
#include "upstream.h"

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kept_upstream_takes_new_settings),
		cmocka_unit_test(test_failed_generation_changes_no_kept_upstream),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
