/*
 * router.c — route matching and upstream selection for one generation.
 */
#include "router.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "timeline.h"
#include "tls.h"
#include "upstream.h"

/* Decisions by (route, upstream) name, for the process's life: one entry
 * per pair some generation named, never freed (a handful per config). */
struct pick_counts {
	char *route, *upstream;
	_Atomic uint64_t n[PICK__COUNT];
	struct pick_counts *next;
};
static pthread_mutex_t counts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pick_counts *counts_head;

static struct pick_counts *pick_counts_of(const char *route, const char *upstream)
{
	struct pick_counts *c;

	pthread_mutex_lock(&counts_lock);
	for (c = counts_head; c; c = c->next)
		if (strcmp(c->route, route) == 0 && strcmp(c->upstream, upstream) == 0)
			break;
	if (!c && (c = calloc(1, sizeof(*c)))) {
		c->route = strdup(route);
		c->upstream = strdup(upstream);
		if (!c->route || !c->upstream) {
			free(c->route);
			free(c->upstream);
			free(c);
			c = NULL;
		} else {
			c->next = counts_head;
			counts_head = c;
		}
	}
	pthread_mutex_unlock(&counts_lock);
	return c;
}

void route_note_pick(struct route *r, unsigned index, enum pick_reason why)
{
	if (index < r->ntargets && r->targets[index].counts && (unsigned)why < PICK__COUNT)
		atomic_fetch_add_explicit(&r->targets[index].counts->n[why], 1, memory_order_relaxed);
}

int route_pick_counts(struct route_pick_count **out, size_t *n)
{
	struct route_pick_count *a = NULL;
	size_t count = 0, i = 0;
	struct pick_counts *c;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&counts_lock);
	for (c = counts_head; c; c = c->next)
		count++;
	if (count && !(a = calloc(count, sizeof(*a))))
		goto fail;
	for (c = counts_head; c; c = c->next, i++) {
		if (!(a[i].route = strdup(c->route)) || !(a[i].upstream = strdup(c->upstream))) {
			i++;
			goto fail;
		}
		for (unsigned k = 0; k < PICK__COUNT; k++)
			a[i].n[k] = atomic_load_explicit(&c->n[k], memory_order_relaxed);
	}
	pthread_mutex_unlock(&counts_lock);
	*out = a;
	*n = count;
	return 0;
fail:
	pthread_mutex_unlock(&counts_lock);
	route_pick_counts_free(a, i);
	return -1;
}

void route_pick_counts_free(struct route_pick_count *c, size_t n)
{
	for (size_t i = 0; c && i < n; i++) {
		free(c[i].route);
		free(c[i].upstream);
	}
	free(c);
}

/* The generation's upstreams: those of `prev` that keep their name and url
 * are kept, the others made. Everything that can fail is done first — new
 * upstreams made, the kept ones' new settings prepared — and only then do
 * the kept ones take their settings, so a generation that cannot be built
 * leaves the running one exactly as it was. */
static int router_upstreams(struct router *rt, struct event_base *base, const struct router *prev, char *err,
			    size_t errlen)
{
	unsigned n = rt->cfg.nupstreams;
	struct upstream **kept = calloc(n ? n : 1, sizeof(*kept));
	struct upstream_prep *prep = calloc(n ? n : 1, sizeof(*prep));
	unsigned i;
	int rc = -1;

	if (!kept || !prep) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (i = 0; i < n; i++) {
		const struct upstream_conf *uc = &rt->cfg.upstreams[i];
		for (unsigned k = 0; prev && k < prev->nups && !kept[i]; k++)
			if (upstream_same(prev->ups[k], uc))
				kept[i] = prev->ups[k];
		if (kept[i] ? upstream_prepare(kept[i], uc, &prep[i], err, errlen) == -1
			    : !(rt->ups[i] = upstream_new(base, &rt->cfg, uc, err, errlen)))
			break;
	}
	if (i < n) { /* undo: the new ones go, the kept ones never changed */
		for (unsigned j = 0; j <= i; j++) {
			upstream_prep_discard(&prep[j]);
			upstream_free(rt->ups[j]);
			rt->ups[j] = NULL;
		}
		goto out;
	}
	for (i = 0; i < n; i++)
		if (kept[i])
			rt->ups[i] = upstream_adopt(kept[i], &rt->cfg, &prep[i]);
	rt->nups = n;
	rc = 0;
out:
	free(kept);
	free(prep);
	return rc;
}

struct router *router_new(struct event_base *base, struct config *cfg, const struct router *prev, uint64_t generation,
			  char *err, size_t errlen)
{
	struct router *rt = calloc(1, sizeof(*rt));

	if (!rt) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	rt->refs = 1;
	rt->generation = generation;
	rt->cfg = *cfg; /* the strings stay where they are: owned by the copy */
	memset(cfg, 0, sizeof(*cfg));
	rt->ups = calloc(rt->cfg.nupstreams, sizeof(*rt->ups));
	rt->routes = calloc(rt->cfg.nroutes ? rt->cfg.nroutes : 1, sizeof(*rt->routes));
	if (!rt->ups || !rt->routes) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* a reload reads the certificate files again: renewed certificates
	 * take effect without a restart */
	{
		struct listener_conf ls[LISTENERS_MAX];
		rt->nlisteners = config_listeners(&rt->cfg, ls);
		for (unsigned i = 0; i < rt->nlisteners; i++)
			if (ls[i].tls_cert &&
			    !(rt->tls_listen[i] = tls_server_ctx(ls[i].tls_cert, ls[i].tls_key, err, errlen)))
				goto fail;
	}
	if (router_upstreams(rt, base, prev, err, errlen) == -1)
		goto fail;
	for (unsigned i = 0; i < rt->cfg.nroutes; i++) {
		const struct route_conf *rc = &rt->cfg.routes[i];
		struct route *r = &rt->routes[i];
		r->conf = rc;
		r->name = rc->name;
		if (rc->ntargets > ROUTE_TARGETS_MAX) {
			snprintf(err, errlen, "route %s: at most %d upstreams", rc->name, ROUTE_TARGETS_MAX);
			goto fail;
		}
		for (unsigned t = 0; t < rc->ntargets; t++) {
			r->targets[t].up =
				router_upstream(rt, rc->targets[t].upstream, strlen(rc->targets[t].upstream));
			r->targets[t].weight = rc->targets[t].weight;
			r->targets[t].counts = pick_counts_of(rc->name, rc->targets[t].upstream);
			r->targets[t].name_hash = bal_name_hash(rc->targets[t].upstream);
			if (!r->targets[t].up) {
				snprintf(err, errlen, "route %s: unknown upstream %s", rc->name,
					 rc->targets[t].upstream);
				goto fail;
			}
		}
		r->ntargets = rc->ntargets;
		if (rc->mirror_upstream &&
		    !(r->mirror = router_upstream(rt, rc->mirror_upstream, strlen(rc->mirror_upstream)))) {
			snprintf(err, errlen, "route %s: unknown mirror upstream %s", rc->name, rc->mirror_upstream);
			goto fail;
		}
		if (rc->model || rc->sticky == STICKY_JSON_FIELD ||
		    ((rc->balance == BALANCE_PREFIX || rc->balance == BALANCE_LATENCY) && rc->ntargets > 1))
			rt->needs_body = true;
		rt->nroutes++;
	}
	return rt;
fail:
	rt->refs = 1;
	router_unref(rt);
	return NULL;
}

void router_ref(struct router *rt)
{
	rt->refs++;
}

void router_unref(struct router *rt)
{
	if (!rt || --rt->refs > 0)
		return;
	for (unsigned i = 0; i < rt->nups; i++)
		upstream_free(rt->ups[i]);
	free(rt->ups);
	free(rt->routes);
	for (unsigned i = 0; i < LISTENERS_MAX; i++)
		tls_ctx_free(rt->tls_listen[i]);
	config_free(&rt->cfg);
	free(rt);
}

static bool host_matches(const char *want, const char *host, size_t hlen)
{
	size_t n = strlen(want);
	/* the Host header may carry a port */
	const char *colon = host[0] == '[' ? memchr(host, ']', hlen) : memchr(host, ':', hlen);
	if (colon && host[0] == '[')
		colon = (size_t)(colon - host) + 1 < hlen && colon[1] == ':' ? colon + 1 : NULL;
	size_t len = colon ? (size_t)(colon - host) : hlen;
	return len == n && strncasecmp(want, host, n) == 0;
}

struct route *router_match(const struct router *rt, const char *method, const char *path, size_t plen, const char *host,
			   size_t hlen, const char *model)
{
	for (unsigned i = 0; i < rt->nroutes; i++) {
		struct route *r = &rt->routes[i];
		const struct route_conf *c = r->conf;
		size_t pl = strlen(c->path_prefix);
		if (pl > plen || memcmp(path, c->path_prefix, pl) != 0)
			continue;
		if (c->method && strcasecmp(c->method, method) != 0)
			continue;
		if (c->host && (!host || !host_matches(c->host, host, hlen)))
			continue;
		if (c->model && (!model || strcmp(c->model, model) != 0))
			continue;
		return r;
	}
	return NULL;
}

/* 64-bit mix of a key and a target name (FNV-1a, then a finalizer). */
static uint64_t hash2(const char *a, size_t alen, const char *b)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < alen; i++)
		h = (h ^ (unsigned char)a[i]) * 1099511628211ull;
	h = (h ^ 0xff) * 1099511628211ull;
	for (; *b; b++)
		h = (h ^ (unsigned char)*b) * 1099511628211ull;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	return h ^ (h >> 33);
}

/* 64 random bits, per thread: picks in different workers draw apart. */
static uint64_t pick_rnd(void)
{
	static _Thread_local uint64_t state;

	if (!state)
		state = clock_now_ns() ^ ((uint64_t)(uintptr_t)&state << 17) ^ 0x2545f4914f6cdd1dull;
	state ^= state << 13;
	state ^= state >> 7;
	state ^= state << 17;
	return state;
}

/* An upstream with no TTFT sample this recent gets a probe (latency). */
#define LATENCY_STALE_NS (10ull * 1000000000u)

static int weighted_pick(struct route *r, uint64_t skip)
{
	int best = -1;
	int64_t total = 0;

	for (unsigned i = 0; i < r->ntargets; i++) {
		if ((skip & (1ull << i)) || !r->targets[i].weight)
			continue;
		r->targets[i].current += r->targets[i].weight;
		total += r->targets[i].weight;
		if (best < 0 || r->targets[i].current > r->targets[best].current)
			best = (int)i;
	}
	if (best >= 0)
		r->targets[best].current -= total;
	return best;
}

static int sticky_pick(const struct route *r, const char *key, size_t klen, uint64_t skip)
{
	/* weighted rendezvous: score = -weight / ln(u), u uniform in (0,1) */
	double best_score = 0;
	int best = -1;

	for (unsigned i = 0; i < r->ntargets; i++) {
		if ((skip & (1ull << i)) || !r->targets[i].weight)
			continue;
		uint64_t h = hash2(key, klen, r->targets[i].up->name);
		double u = ((double)(h >> 11) + 0.5) / 9007199254740992.0;
		double score = -(double)r->targets[i].weight / log(u);
		if (best < 0 || score > best_score) {
			best = (int)i;
			best_score = score;
		}
	}
	return best;
}

/* The latency choice (docs/routing.md): the candidates drawn, and the one
 * that got the longest leading run of the prompt last among them; their
 * fits, prefill counts and engine queues read (for these few only); each
 * one's prediction counts only the prompt tokens it is not expected to
 * hold. Returns the candidate index. */
static int latency_pick(const struct route *r, struct bal_cand *cand, const unsigned *map, unsigned n,
			const struct pick_req *q, uint64_t now, struct pick_out *out)
{
	unsigned idx[BAL_LATENCY_CHOICES + 1], run = 0, owner = 0;
	int prefer = -1;

	if (q->nchain)
		owner = upstream_held_owner(q->chain, q->nchain, &run);
	for (unsigned k = 0; owner && k < n; k++)
		if (upstream_held_id(r->targets[map[k]].up) == owner) {
			prefer = (int)k;
			break;
		}
	unsigned m = bal_latency_draw(cand, n, prefer, pick_rnd(), idx);
	for (unsigned j = 0; j < m; j++) {
		struct bal_cand *c = &cand[idx[j]];
		struct upstream *up = r->targets[map[idx[j]]].up;
		struct up_balance b;
		struct engine_seen es = { .known = false };
		upstream_balance_pick(up, &b, now);
		upstream_engine_note(up, &es, now);
		c->prefill_tokens = b.prefill_tokens;
		c->prefill_reqs = b.prefill_reqs;
		c->eng_waiting = es.known && es.fresh ? es.waiting : -1;
		c->fit = b.fit;
		if (!run)
			continue;
		/* no upstream got more than the owner's run */
		unsigned held = upstream_held_blocks(up, q->chain, run);
		c->cached_tokens = (double)held * PREFIX_BLOCK_TOKENS;
		if (c->cached_tokens > q->tokens)
			c->cached_tokens = q->tokens;
	}
	int k = bal_latency_choose(cand, idx, m, q->tokens, &out->pred_ms);
	if (k >= 0)
		out->held_blocks = (unsigned)(cand[k].cached_tokens / PREFIX_BLOCK_TOKENS);
	return k;
}

struct upstream *route_pick(struct route *r, const struct pick_req *q, uint64_t tried, struct pick_out *out)
{
	struct bal_cand cand[ROUTE_TARGETS_MAX];
	unsigned map[ROUTE_TARGETS_MAX], n = 0, live = 0;
	bool same_weight = true;
	uint64_t ejected = 0;
	int probe_due = -1, stale = -1, best = -1;
	enum balance_policy pol = r->conf->balance;
	uint64_t now = clock_now_ns();

	out->pred_ms = NAN;
	out->probe = false;
	out->held_blocks = 0;
	for (unsigned i = 0; i < r->ntargets; i++) {
		struct up_balance b;
		if ((tried & (1ull << i)) || !r->targets[i].weight)
			continue;
		upstream_balance_gate(r->targets[i].up, &b, now);
		if (b.eject == UP_EJECTED || (b.eject == UP_PROBE_DUE && b.probing)) {
			ejected |= 1ull << i;
			continue;
		}
		live++;
		if (b.eject == UP_PROBE_DUE && probe_due < 0)
			probe_due = (int)i;
		if (pol == BALANCE_LATENCY && !b.probing && b.fit_age_ns > LATENCY_STALE_NS && stale < 0)
			stale = (int)i;
		if (pol == BALANCE_WEIGHTED)
			continue; /* load-blind: the numbers below are not read */
		/* what every policy reads of every candidate; latency reads the
		 * rest for the few it draws (latency_fill) */
		struct bal_cand *c = &cand[n];
		struct upstream *up = r->targets[i].up;
		c->weight = r->targets[i].weight;
		c->active = upstream_inflight(up);
		c->queued = upstream_waiting(up);
		c->max_conc = up->conf.max_concurrency;
		c->score = q->has_prefix ? bal_rendezvous_uh(q->prefix_key, r->targets[i].name_hash) : 0;
		c->cached_tokens = 0;
		same_weight &= c->weight == cand[0].weight;
		map[n++] = i;
	}
	for (unsigned k = 0; q->has_prefix && !same_weight && k < n; k++)
		cand[k].score = -(double)cand[k].weight / log(cand[k].score);
	/* every one left is ejected: better a failing upstream than none */
	bool panic = ejected && !live;
	if (panic)
		ejected = 0;
	if (q->key) {
		best = sticky_pick(r, q->key, q->klen, tried | ejected);
		out->reason = PICK_STICKY;
	} else if (probe_due >= 0 && upstream_probe_claim(r->targets[probe_due].up)) {
		best = probe_due;
		out->reason = PICK_PROBE;
		out->probe = true;
	} else if (stale >= 0 && upstream_probe_claim(r->targets[stale].up)) {
		best = stale;
		out->reason = PICK_PROBE;
		out->probe = true;
	} else if (pol == BALANCE_WEIGHTED || panic) {
		best = weighted_pick(r, tried | ejected);
		out->reason = PICK_WEIGHTED;
	} else {
		int k = -1;
		unsigned rank = 0;
		switch (pol) {
		case BALANCE_LATENCY:
			k = latency_pick(r, cand, map, n, q, now, out);
			out->reason = isnan(out->pred_ms) ? PICK_LEAST_LOADED : PICK_LATENCY;
			break;
		case BALANCE_PREFIX:
			if (q->has_prefix) {
				k = bal_prefix(cand, n, r->conf->load_factor, r->conf->load_slack, &rank);
				out->reason = rank ? PICK_SATURATED_RELEASE : PICK_PREFIX;
				break;
			}
			__attribute__((fallthrough)); /* no prompt to key on */
		default:
			k = bal_least_request(cand, n, pick_rnd());
			out->reason = PICK_LEAST_LOADED;
			break;
		}
		best = k >= 0 ? (int)map[k] : -1;
	}
	if (best < 0)
		return NULL;
	if (q->failover)
		out->reason = q->deadline ? PICK_TTFT_DEADLINE : PICK_FAILOVER;
	out->index = (unsigned)best;
	route_note_pick(r, out->index, out->reason);
	return r->targets[best].up;
}

bool route_mirror_pick(struct route *r)
{
	if (!r->mirror || !r->conf->mirror_percent)
		return false;
	r->mirror_acc += r->conf->mirror_percent;
	if (r->mirror_acc < 100)
		return false;
	r->mirror_acc -= 100;
	return true;
}

int route_target_index(const struct route *r, const struct upstream *up)
{
	for (unsigned i = 0; i < r->ntargets; i++)
		if (r->targets[i].up == up)
			return (int)i;
	return -1;
}

struct upstream *router_upstream(const struct router *rt, const char *name, size_t len)
{
	for (unsigned i = 0; i < rt->nups; i++)
		if (strlen(rt->ups[i]->name) == len && memcmp(rt->ups[i]->name, name, len) == 0)
			return rt->ups[i];
	return NULL;
}

struct route *router_route(const struct router *rt, const char *name)
{
	for (unsigned i = 0; i < rt->nroutes; i++)
		if (strcmp(rt->routes[i].name, name) == 0)
			return &rt->routes[i];
	return NULL;
}

int route_set_weight(struct route *r, const char *upstream, unsigned weight)
{
	int idx = -1;

	for (unsigned i = 0; i < r->ntargets; i++)
		if (strcmp(r->targets[i].up->name, upstream) == 0)
			idx = (int)i;
	if (idx < 0)
		return -1;
	r->targets[idx].weight = weight;
	for (unsigned i = 0; i < r->ntargets; i++)
		r->targets[i].current = 0; /* restart the smooth sequence on the new weights */
	log_info("route %s: weight of %s set to %u", r->name, upstream, weight);
	return 0;
}
