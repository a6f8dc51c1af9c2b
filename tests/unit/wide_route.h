/*
 * wide_route.h — a router of one generation built in memory for the tests
 * and the pick benchmark: `n` upstreams named names[0..n) (each at
 * http://127.0.0.1:9, never dialled, with the defaults: ejection after 5
 * failures, 1 s backoff) and one route, "wide", over all of them at weight
 * 1 under `balance`. The names must outlive the router. NULL with `err`
 * said when the router cannot be made; out of memory aborts.
 */
#ifndef TOKENTAP_TESTS_WIDE_ROUTE_H
#define TOKENTAP_TESTS_WIDE_ROUTE_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "config.h"
#include "router.h"

static inline struct router *wide_router(struct event_base *base, unsigned n, enum balance_policy balance,
					 const char *const *names, char *err, size_t errlen)
{
	struct config c;
	struct upstream_conf *u;
	struct route_conf *r;
	struct route_target *t;

	config_defaults(&c);
	u = config_own(&c, calloc(n, sizeof(*u)));
	r = config_own(&c, calloc(1, sizeof(*r)));
	t = config_own(&c, calloc(n, sizeof(*t)));
	if (!u || !r || !t)
		abort();
	for (unsigned i = 0; i < n; i++) {
		config_upstream_defaults(&u[i]);
		u[i].name = names[i];
		u[i].url = "http://127.0.0.1:9";
		t[i] = (struct route_target){ names[i], 1, 1 };
	}
	config_route_defaults(r);
	r->name = "wide";
	r->targets = t;
	r->ntargets = n;
	r->balance = balance;
	c.upstreams = u;
	c.nupstreams = n;
	c.routes = r;
	c.nroutes = 1;
	struct router *rt = router_new(base, &c, NULL, 1, err, errlen);
	config_free(&c);
	return rt;
}

/* CLOCK_MONOTONIC in nanoseconds, as the upstreams' notes take it */
static inline uint64_t wide_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
