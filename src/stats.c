/*
 * stats.c — the per-worker series table and its flush to the store.
 *
 * Series live as long as the shard (bounded by the model cap), so the
 * request holding a series pointer never sees it freed. A series' slice is
 * cleared in place at each flush, keeping its histograms allocated: in steady
 * state recording allocates nothing.
 *
 * The model cap is the process's, per route: which model names a route
 * tracks is kept once for all workers and upstreams (under models_lock),
 * and consulted only when a shard meets a series key it has not seen; a
 * request for a known series never takes the lock.
 */
#include "stats.h"

#include <event2/event.h>
#include <pthread.h>
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
 * from. Kept until exit, as a shard keeps its series. */
struct route_models {
	char *route;
	char **names;
	unsigned n;
	struct route_models *next;
};

static pthread_mutex_t models_lock = PTHREAD_MUTEX_INITIALIZER;
static struct route_models *route_models; /* under models_lock */

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

/* True when `model` is tracked for `route`: already one of its models, or
 * admitted now under the cap. */
static bool model_admit(struct stats_shard *sh, const char *route, const char *model)
{
	struct route_models *r;
	bool ok = false;

	pthread_mutex_lock(&models_lock);
	for (r = route_models; r && strcmp(r->route, route) != 0; r = r->next)
		;
	if (!r && (r = calloc(1, sizeof(*r)))) {
		if (!(r->route = strdup(route))) {
			free(r);
			r = NULL;
		} else {
			r->next = route_models;
			route_models = r;
		}
	}
	for (unsigned i = 0; r && i < r->n && !ok; i++)
		ok = strcmp(r->names[i], model) == 0;
	if (r && !ok && r->n < sh->max_models) {
		char **p = realloc(r->names, (r->n + 1) * sizeof(*p));
		char *name = strdup(model);
		if (p)
			r->names = p;
		if (p && name) {
			r->names[r->n++] = name;
			ok = true;
		} else {
			free(name);
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
