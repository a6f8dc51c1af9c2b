/*
 * stats.c — the per-worker series table and its flush to the store.
 *
 * Series live as long as the shard (bounded by the model cap), so the
 * request holding a series pointer never sees it freed. A series' slice is
 * cleared in place at each flush, keeping its histograms allocated: in steady
 * state recording allocates nothing.
 *
 * The model cap is the process's, per route: which model names a route
 * tracks is kept once for all workers and upstreams, and consulted only
 * when a shard meets a series key it has not seen. It is read without a
 * lock (the lists only grow, and each name is written before the count
 * that covers it is published); models_lock is taken only to admit a new
 * name, so a request for a known series, or for a model refused because
 * the route is full, never takes it.
 */
#include "stats.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "store.h"

struct series {
	struct stats_shard *shard;
	char key[SERIES_KEY_MAX];
	size_t keylen;
	uint64_t hash;
	struct slice slice;
	bool dirty;
	struct series *next_dirty;
	struct series *next_in_bucket;
};

/* The models a route tracks, for the cap; one list per route for the whole
 * process. Copies of the names: a reload frees the configuration they came
 * from. Kept until exit, as a shard keeps its series. Written under
 * models_lock, read without it: `route`, `cap`, `names` (the array) and
 * `next` never change once the entry is published, names[i] never once
 * `n` covers it. */
struct route_models {
	char *route;
	char **names; /* cap slots */
	unsigned cap;
	_Atomic unsigned n;
	struct route_models *next;
};

static pthread_mutex_t models_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct route_models *) route_models;

#define SERIES_BUCKETS 256

struct stats_shard {
	struct store *store;
	struct slo slo;
	unsigned max_models;
	struct series *buckets[SERIES_BUCKETS];
	struct series *dirty;
	struct event *timer;
	uint64_t flush_ms;
};

int series_key_parse(const char *key, size_t len, const char **route, const char **upstream, const char **model,
		     bool *cold)
{
	const char *p = key, *end = key + len;
	const char *parts[3];

	for (int i = 0; i < 3; i++) {
		const char *z = memchr(p, '\0', (size_t)(end - p));
		if (!z)
			return -1;
		parts[i] = p;
		p = z + 1;
	}
	if (end - p != 1 || (*p != '0' && *p != '1'))
		return -1;
	*route = parts[0];
	*upstream = parts[1];
	*model = parts[2];
	*cold = *p == '1';
	return 0;
}

static size_t key_build(char *out, const char *route, const char *upstream, const char *model, bool cold)
{
	size_t lr = strlen(route), lu = strlen(upstream), lm = strlen(model);

	if (lr + lu + lm + 4 > SERIES_KEY_MAX)
		return 0;
	memcpy(out, route, lr + 1);
	memcpy(out + lr + 1, upstream, lu + 1);
	memcpy(out + lr + lu + 2, model, lm + 1);
	out[lr + lu + lm + 3] = cold ? '1' : '0';
	return lr + lu + lm + 4;
}

static uint64_t fnv1a(const char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)p[i];
		h *= 1099511628211ull;
	}
	return h;
}

static struct series *lookup(struct stats_shard *sh, const char *key, size_t len, uint64_t hash)
{
	for (struct series *s = sh->buckets[hash % SERIES_BUCKETS]; s; s = s->next_in_bucket)
		if (s->hash == hash && s->keylen == len && memcmp(s->key, key, len) == 0)
			return s;
	return NULL;
}

static struct series *insert(struct stats_shard *sh, const char *key, size_t len, uint64_t hash)
{
	struct series *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->shard = sh;
	memcpy(s->key, key, len);
	s->keylen = len;
	s->hash = hash;
	s->next_in_bucket = sh->buckets[hash % SERIES_BUCKETS];
	sh->buckets[hash % SERIES_BUCKETS] = s;
	return s;
}

static struct route_models *route_find(const char *route)
{
	struct route_models *r = atomic_load_explicit(&route_models, memory_order_acquire);
	while (r && strcmp(r->route, route) != 0)
		r = r->next;
	return r;
}

/* True when `model` is among r's first n names. */
static bool route_has(const struct route_models *r, unsigned n, const char *model)
{
	for (unsigned i = 0; i < n; i++)
		if (strcmp(r->names[i], model) == 0)
			return true;
	return false;
}

/* True when `model` is tracked for `route`: already one of its models, or
 * admitted now under the cap. */
static bool model_admit(struct stats_shard *sh, const char *route, const char *model)
{
	struct route_models *r = route_find(route);
	unsigned n;
	bool ok = false;

	if (r) {
		n = atomic_load_explicit(&r->n, memory_order_acquire);
		if (route_has(r, n, model))
			return true;
		if (n >= r->cap)
			return false; /* full: refused without the lock */
	}
	pthread_mutex_lock(&models_lock);
	if (!(r = route_find(route)) && (r = calloc(1, sizeof(*r)))) {
		r->route = strdup(route);
		r->cap = sh->max_models;
		r->names = r->cap ? calloc(r->cap, sizeof(*r->names)) : NULL;
		if (!r->route || (r->cap && !r->names)) {
			free(r->route);
			free(r->names);
			free(r);
			r = NULL;
		} else {
			r->next = atomic_load_explicit(&route_models, memory_order_relaxed);
			atomic_store_explicit(&route_models, r, memory_order_release);
		}
	}
	if (r) {
		n = atomic_load_explicit(&r->n, memory_order_relaxed);
		ok = route_has(r, n, model);
		if (!ok && n < r->cap && (r->names[n] = strdup(model))) {
			atomic_store_explicit(&r->n, n + 1, memory_order_release);
			ok = true;
		}
	}
	pthread_mutex_unlock(&models_lock);
	return ok;
}

struct series *stats_series(struct stats_shard *sh, const char *route, const char *upstream, const char *model,
			    bool cold)
{
	char key[SERIES_KEY_MAX];
	size_t len;
	uint64_t hash;
	struct series *s;

	if (!sh)
		return NULL;
	if (!model || !*model)
		model = SERIES_MODEL_UNKNOWN;
	len = key_build(key, route, upstream, model, cold);
	if (!len)
		len = key_build(key, route, upstream, SERIES_MODEL_OTHER, cold);
	hash = fnv1a(key, len);
	if ((s = lookup(sh, key, len, hash)))
		return s;
	/* A new series: its model admitted under the route's cap (counted once
	 * for warm and cold, every upstream and every worker), else folded into
	 * "other". */
	char other[SERIES_KEY_MAX];
	size_t olen = key_build(other, route, upstream, model, !cold);
	bool known = olen && lookup(sh, other, olen, fnv1a(other, olen));
	if (!known && strcmp(model, SERIES_MODEL_OTHER) != 0 && !model_admit(sh, route, model)) {
		len = key_build(key, route, upstream, SERIES_MODEL_OTHER, cold);
		hash = fnv1a(key, len);
		if ((s = lookup(sh, key, len, hash)))
			return s;
	}
	return insert(sh, key, len, hash);
}

static void mark_dirty(struct series *se)
{
	if (se->dirty)
		return;
	se->dirty = true;
	se->next_dirty = se->shard->dirty;
	se->shard->dirty = se;
}

void stats_record_itl_n(struct series *se, uint64_t gap_ns, unsigned inflight, uint64_t n)
{
	if (!se || n == 0)
		return;
	slice_record_itl_n(&se->slice, gap_ns, inflight, n);
	mark_dirty(se);
}

void stats_record_itl(struct series *se, uint64_t gap_ns, unsigned inflight)
{
	stats_record_itl_n(se, gap_ns, inflight, 1);
}

void stats_record_request(struct series *se, const struct req_record *r, unsigned inflight)
{
	if (!se)
		return;
	slice_record_request(&se->slice, r, inflight, &se->shard->slo);
	mark_dirty(se);
}

void stats_shard_flush(struct stats_shard *sh)
{
	struct store_batch *b;
	size_t n = 0;

	if (!sh || !sh->dirty)
		return;
	for (struct series *s = sh->dirty; s; s = s->next_dirty)
		n++;
	b = calloc(1, sizeof(*b));
	if (b)
		b->items = calloc(n, sizeof(*b->items));
	if (b && b->items) {
		b->sec = (uint64_t)time(NULL);
		b->cap = n;
	}
	for (struct series *s = sh->dirty, *next; s; s = next) {
		next = s->next_dirty;
		if (b && b->items && !slice_empty(&s->slice)) {
			struct store_item *it = &b->items[b->n];
			it->len = slice_encode(&s->slice, &it->blob);
			if (it->len) {
				memcpy(it->key, s->key, s->keylen);
				it->keylen = s->keylen;
				b->n++;
			}
		}
		slice_clear(&s->slice);
		s->dirty = false;
		s->next_dirty = NULL;
	}
	sh->dirty = NULL;
	if (!b || !b->items) {
		log_warn("stats: out of memory; one flush interval of stats lost");
		store_batch_free(b);
		return;
	}
	store_submit(sh->store, b);
}

static void on_flush_timer(evutil_socket_t fd, short what, void *arg)
{
	stats_shard_flush(arg);
}

struct stats_shard *stats_shard_new(struct event_base *base, struct store *store, unsigned max_models,
				    const struct slo *slo, uint64_t flush_ms)
{
	struct stats_shard *sh = calloc(1, sizeof(*sh));

	if (!sh)
		return NULL;
	sh->store = store;
	sh->slo = *slo;
	sh->max_models = max_models;
	sh->flush_ms = flush_ms;
	if (base) {
		struct timeval tv = { (time_t)(flush_ms / 1000), (suseconds_t)(flush_ms % 1000) * 1000 };
		sh->timer = event_new(base, -1, EV_PERSIST, on_flush_timer, sh);
		if (!sh->timer || event_add(sh->timer, &tv) == -1) {
			stats_shard_free(sh);
			return NULL;
		}
	}
	return sh;
}

void stats_shard_free(struct stats_shard *sh)
{
	if (!sh)
		return;
	stats_shard_flush(sh);
	if (sh->timer)
		event_free(sh->timer);
	for (unsigned i = 0; i < SERIES_BUCKETS; i++) {
		for (struct series *s = sh->buckets[i], *next; s; s = next) {
			next = s->next_in_bucket;
			slice_release(&s->slice);
			free(s);
		}
	}
	free(sh);
}
