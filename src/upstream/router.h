/*
 * router.h — one configuration generation: its upstreams and routes, and
 * the choice of route and upstream for each request.
 *
 * A router is built from a loaded config (which it then owns) and is
 * reference-counted: each request holds the generation it started with, so
 * a reload (SIGHUP) swaps in a new router for new requests while streams
 * already running finish on the old one, which is freed when its last
 * request ends. Stats are keyed by names, not by these objects, so series
 * carry on across reloads.
 *
 * Choosing an upstream within a route, in order: the override header (when
 * configured) pins a named upstream of the route (any upstream with
 * override_any_upstream; exchange.c checks); a sticky key (a header or a top-level
 * JSON field of the body) picks by weighted rendezvous hashing, so the same
 * key keeps landing on the same upstream and a weight change moves as few
 * keys as possible; otherwise smooth weighted round robin, which keeps a
 * 90/10 split at 90/10 within every window of a few dozen requests.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "balance.h"
#include "config.h"

struct event_base;
struct upstream;
struct ssl_ctx_st;

struct pick_counts;

struct route_target_state {
	struct upstream *up;
	unsigned weight;
	int64_t current;	    /* smooth weighted round robin */
	struct pick_counts *counts; /* decisions for it by reason (route_pick_counts); NULL: not counted */
	uint64_t name_hash;	    /* bal_name_hash of the upstream's name (prefix) */
};

struct route {
	const struct route_conf *conf;
	const char *name;
	struct route_target_state targets[ROUTE_TARGETS_MAX];
	unsigned ntargets;
	struct upstream *mirror; /* shadow upstream, NULL: none */
	unsigned mirror_acc;	 /* exact percentages: every request adds percent */
};

/* Whether this request of the route is also mirrored (deterministic: over
 * any 100 consecutive requests, exactly `percent` are). */
bool route_mirror_pick(struct route *r);

struct router {
	unsigned refs;
	struct config cfg; /* this generation's settings, owned */
	struct upstream **ups;
	unsigned nups;
	struct route *routes;
	unsigned nroutes;
	bool needs_body; /* some route matches on the model or sticks on a JSON field */
	/* each listener's certificate, by listener index; NULL: plain TCP */
	struct ssl_ctx_st *tls_listen[LISTENERS_MAX];
	unsigned nlisteners;
	uint64_t generation;
};

/* Builds a router from `cfg`, taking it over (cfg is zeroed on success).
 * Upstreams of `prev` (may be NULL) that keep their name and url are kept,
 * with their running count, queue and pool, so a reload never lets more
 * requests reach a server than its max_concurrency. NULL with `err` when
 * an upstream cannot be set up. */
struct router *router_new(struct event_base *base, struct config *cfg, const struct router *prev, uint64_t generation,
			  char *err, size_t errlen);
void router_ref(struct router *rt);
/* Frees the router with its last reference. NULL ok. */
void router_unref(struct router *rt);

/* The first route matching the request, or NULL. `host` may include a
 * port; `model` may be NULL when not (yet) known. */
struct route *router_match(const struct router *rt, const char *method, const char *path, size_t plen, const char *host,
			   size_t hlen, const char *model);

/* What the choice knows of the request. */
struct pick_req {
	const char *key; /* the sticky value, NULL: none */
	size_t klen;
	bool has_prefix;     /* prefix_key holds the chain hash of its leading blocks */
	uint64_t prefix_key; /* (workload.h's chain with no salt: the same in every process) */
	unsigned prefix_blocks;
	const uint64_t *chain; /* latency: the chain hashes of its whole prompt blocks (request.c), NULL: none */
	unsigned nchain;
	double tokens; /* its prompt tokens, estimated */
	bool failover; /* a pick again after the last choice refused */
	bool deadline; /* and the reason was the route's ttft_deadline, not a refusal */
};

/* How the choice was made. */
struct pick_out {
	unsigned index; /* the target index */
	enum pick_reason reason;
	double pred_ms;	      /* latency: the prediction; NaN otherwise */
	unsigned held_blocks; /* latency: the leading blocks the chosen one is expected to hold */
	bool probe;	      /* the request is the upstream's probe (upstream_probe_done at its end) */
};

/* An upstream of the route for a request, or NULL when every target is in
 * `tried` (bit i = target i) or has weight 0. An ejected upstream is left
 * out unless every other one is too; a sticky key picks by rendezvous
 * among the rest; an upstream whose ejection backoff is over gets one
 * probe; then the route's balance policy (docs/routing.md). */
struct upstream *route_pick(struct route *r, const struct pick_req *q, uint64_t tried, struct pick_out *out);

/* Counts a choice of target `index` made for `why` (route_pick counts its
 * own; this is for the override header's). */
void route_note_pick(struct route *r, unsigned index, enum pick_reason why);

/* The decisions of every (route, upstream) pair since the process started,
 * kept by names across reloads and shared by the workers (atomics): a
 * malloc'd copy, for /metrics. 0, or -1 when out of memory. */
struct route_pick_count {
	char *route, *upstream; /* malloc'd */
	uint64_t n[PICK__COUNT];
};
int route_pick_counts(struct route_pick_count **out, size_t *n) __attribute__((warn_unused_result));
void route_pick_counts_free(struct route_pick_count *c, size_t n);

/* The target index of `up` in the route, or -1. */
int route_target_index(const struct route *r, const struct upstream *up);

struct upstream *router_upstream(const struct router *rt, const char *name, size_t len);
struct route *router_route(const struct router *rt, const char *name);

/* Runtime weight change (admin API), lasting until the next reload. 0, or
 * -1 when the route does not send to `upstream`. The caller makes sure the
 * weights do not all end at 0. */
int route_set_weight(struct route *r, const char *upstream, unsigned weight);
