/*
 * stats.c — the per-worker series table and its flush to the store.
 *
 * Series live as long as the shard (bounded by the model cap), so the
 * request holding a series pointer never sees it freed. A series' slice is
 * cleared in place at each flush, keeping its histograms allocated: in steady
 * state recording allocates nothing.
 *
 * The model cap is the process's, per route: which model names a route
 * tracks is kept once for all workers and upstreams, in max_models slots. A
 * name takes a slot only with a successful (2xx) answer, so names an
 * upstream refuses never crowd out real ones; once the slots are full, a
 * name unused for model_idle gives its slot to the next new name. Every
 * slot carries a generation, bumped when it is given to another name; a
 * shard's series remembers the slot and generation it was admitted under,
 * so the hot path (a known series) checks one atomic and marks the slot's
 * last use (by the shard's clock of its last flush: no clock read; the
 * shared line written at most once a second), lock-free; the flush marks
 * it too for the series that were recorded into (a running stream holds
 * its series); and a
 * series whose name lost its slot is admitted again (or folded into
 * "other") the next time it is met. A slot's name string is read and
 * written only under models_lock; without the lock, a shard reads only the
 * slots' atomics (hash of the name, generation, last use), so a name
 * refused because it is not in the list and the list is full, or because
 * its answer failed, never takes the lock.
 */
#include "stats.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "log.h"
#include "store.h"
#include "tenant.h"
#include "timeline.h"

struct series {
	struct stats_shard *shard;
	char key[SERIES_KEY_MAX];
	size_t keylen;
	uint64_t hash;
	struct slice slice;
	struct model_slot *slot; /* the name's slot; NULL for "other" */
	uint64_t gen;		 /* slot->gen when this series was admitted */
	bool dirty;
	struct series *next_dirty;
	struct series *next_in_bucket;
};

/* One tracked name. `name` is read and written under models_lock only;
 * the atomics are read without it. `hash` (fnv1a of the name, never 0) is 0
 * while the slot is empty; `gen` is bumped each time the slot is given to
 * a name; `seen_ms` is the last use (monotonic ms, refreshed at most once a
 * second, or an eighth of a shorter model_idle). */
struct model_slot {
	char *name;
	_Atomic uint64_t hash;
	_Atomic uint64_t gen;
	_Atomic uint64_t seen_ms;
};

/* The models a route tracks, for the cap; one list per route for the whole
 * process. Copies of the names: a reload frees the configuration they came
 * from. Kept until exit, as a shard keeps its series. `route`, `cap`,
 * `slots` (the array) and `next` never change once the entry is
 * published. `evict_at_ms`: while the slots are full, no name can be
 * evicted before then (a lower bound, recomputed under the lock). */
struct route_models {
	char *route;
	struct model_slot *slots; /* cap slots */
	unsigned cap;
	_Atomic uint64_t evict_at_ms;
	_Atomic bool full_noted; /* the warning that the list is full was logged */
	struct route_models *next;
};

/* One cap's lists: the models' and the tenants' (the same rules, apart). */
struct name_cap {
	_Atomic(struct route_models *) routes;
	const char *what;    /* "model", "tenant": for the log */
	const char *setting; /* the cap's setting, for the log */
};

static pthread_mutex_t models_lock = PTHREAD_MUTEX_INITIALIZER;
static struct name_cap model_cap = { NULL, "model", "store.max_models" },
		       tenant_cap = { NULL, "tenant", "tenant.max_per_route" };

/* A name answered 2xx found the route's list full (none idle yet): said
 * once per route, as a list that fills is what a server with many models
 * (one per LoRA adapter) meets, and every name after it counts as other. */
static void note_full(const struct name_cap *nc, struct route_models *r, const char *name)
{
	if (atomic_load_explicit(&r->full_noted, memory_order_relaxed) ||
	    atomic_exchange_explicit(&r->full_noted, true, memory_order_relaxed))
		return;
	log_warn(
		"stats: route %s: %s list full (%s: %u); %s and further new names are counted as \"other\" "
		"until a tracked one goes idle: raise %s to track more (each name costs memory: docs/storage.md, "
		"\"The model cap\"); said once",
		r->route, nc->what, nc->setting, r->cap, name, nc->setting);
}

#define SERIES_BUCKETS 256

struct stats_shard {
	struct store *store;
	struct slo slo;
	unsigned max_models, max_tenants;
	uint64_t model_idle_ms, tenant_idle_ms; /* 0: a name keeps its slot for good */
	uint64_t clock_ms;			/* now_ms() at the last flush: the hot path reads no clock */
	uint64_t touch_ms;			/* a slot's last use is written at most this often */
	struct series *buckets[SERIES_BUCKETS];
	struct series *dirty;
	struct event *timer;
	uint64_t flush_ms;
};

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

static struct route_models *route_find(struct name_cap *nc, const char *route)
{
	struct route_models *r = atomic_load_explicit(&nc->routes, memory_order_acquire);
	while (r && strcmp(r->route, route) != 0)
		r = r->next;
	return r;
}

/* The timeline's monotonic clock, in ms. */
static uint64_t now_ms(void)
{
	return clock_now_ns() / 1000000u;
}

/* Marks the slot used now; writes the shared line at most once per
 * `every` ms. Another thread may have written a later `now` than ours:
 * comparisons with seen_ms are written so as not to wrap. */
static void slot_touch(struct model_slot *slot, uint64_t now, uint64_t every)
{
	if (now >= atomic_load_explicit(&slot->seen_ms, memory_order_relaxed) + every)
		atomic_store_explicit(&slot->seen_ms, now, memory_order_relaxed);
}

/* While every slot is taken: when the least recently used one may go. */
static uint64_t evict_at(const struct route_models *r, uint64_t idle_ms)
{
	uint64_t oldest = UINT64_MAX;

	if (!idle_ms || !r->cap)
		return UINT64_MAX;
	for (unsigned i = 0; i < r->cap; i++) {
		uint64_t seen = atomic_load_explicit(&r->slots[i].seen_ms, memory_order_relaxed);
		if (seen < oldest)
			oldest = seen;
	}
	return oldest + idle_ms;
}

static struct route_models *route_add(struct name_cap *nc, const char *route, unsigned cap)
{
	struct route_models *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->route = strdup(route);
	r->cap = cap;
	r->slots = cap ? calloc(cap, sizeof(*r->slots)) : NULL;
	if (!r->route || (cap && !r->slots)) {
		free(r->route);
		free(r->slots);
		free(r);
		return NULL;
	}
	r->next = atomic_load_explicit(&nc->routes, memory_order_relaxed);
	atomic_store_explicit(&nc->routes, r, memory_order_release);
	return r;
}

/*
 * The slot tracking `model` for `route` (its generation in *gen), or NULL
 * when the model counts as "other". A name already in the list is found
 * whatever the answer; a new one takes a slot only when `ok` (the answer
 * was 2xx): a free one, else the least recently used one idle for
 * model_idle. Without the lock, a name whose hash is in no slot is refused
 * when it failed, or when the list is full and no slot can be idle yet.
 */
static struct model_slot *name_admit(struct name_cap *nc, unsigned cap, uint64_t idle_ms, const char *route,
				     const char *model, bool ok, uint64_t *gen)
{
	uint64_t h = fnv1a(model, strlen(model)) | 1, now;
	struct route_models *r = route_find(nc, route);
	struct model_slot *found = NULL;
	bool full = false;

	if (!r && !ok)
		return NULL;
	if (r) {
		bool maybe = false, room = false;
		for (unsigned i = 0; i < r->cap; i++) {
			uint64_t hv = atomic_load_explicit(&r->slots[i].hash, memory_order_acquire);
			maybe |= hv == h;
			room |= hv == 0;
		}
		if (!maybe && !ok)
			return NULL;
		if (!maybe && !room && now_ms() < atomic_load_explicit(&r->evict_at_ms, memory_order_relaxed)) {
			note_full(nc, r, model);
			return NULL;
		}
	}
	pthread_mutex_lock(&models_lock);
	now = now_ms();
	if (!r && !(r = route_find(nc, route)))
		r = route_add(nc, route, cap);
	if (!r)
		goto out;
	for (unsigned i = 0; i < r->cap && !found; i++)
		if (r->slots[i].name && strcmp(r->slots[i].name, model) == 0)
			found = &r->slots[i];
	if (!found && ok) {
		struct model_slot *lru = NULL;
		for (unsigned i = 0; i < r->cap; i++) {
			struct model_slot *s = &r->slots[i];
			if (!s->name) {
				lru = s;
				break;
			}
			if (idle_ms && now >= atomic_load_explicit(&s->seen_ms, memory_order_relaxed) + idle_ms &&
			    (!lru || atomic_load_explicit(&s->seen_ms, memory_order_relaxed) <
					     atomic_load_explicit(&lru->seen_ms, memory_order_relaxed)))
				lru = s;
		}
		char *copy = lru ? strdup(model) : NULL;
		if (copy) {
			if (lru->name)
				log_info("stats: route %s: %s %s, idle, gives its slot to %s", route, nc->what,
					 lru->name, model);
			free(lru->name);
			lru->name = copy;
			atomic_store_explicit(&lru->hash, h, memory_order_release);
			atomic_fetch_add_explicit(&lru->gen, 1, memory_order_release);
			atomic_store_explicit(&lru->seen_ms, now, memory_order_relaxed);
			found = lru;
		}
		full = lru == NULL;
	}
	if (found) {
		slot_touch(found, now, 0);
		*gen = atomic_load_explicit(&found->gen, memory_order_relaxed);
	}
	atomic_store_explicit(&r->evict_at_ms, evict_at(r, idle_ms), memory_order_relaxed);
out:
	pthread_mutex_unlock(&models_lock);
	if (full)
		note_full(nc, r, model);
	return found;
}

struct series *stats_series(struct stats_shard *sh, const char *route, const char *upstream, const char *model,
			    bool cold, bool ok)
{
	char key[SERIES_KEY_MAX];
	size_t len;
	uint64_t hash, gen = 0;
	struct series *s;
	struct model_slot *slot = NULL;

	if (!sh)
		return NULL;
	if (!model || !*model)
		model = SERIES_MODEL_UNKNOWN;
	len = series_key_build(key, route, upstream, model, cold);
	if (!len) {
		model = SERIES_MODEL_OTHER;
		len = series_key_build(key, route, upstream, model, cold);
	}
	hash = fnv1a(key, len);
	s = lookup(sh, key, len, hash);
	if (s && (!s->slot || atomic_load_explicit(&s->slot->gen, memory_order_acquire) == s->gen)) {
		if (s->slot)
			slot_touch(s->slot, sh->clock_ms, sh->touch_ms);
		return s;
	}
	/* A new series, or one whose name lost its slot: the model admitted
	 * under the route's cap (counted once for warm and cold, every upstream
	 * and every worker), else folded into "other". */
	if (strcmp(model, SERIES_MODEL_OTHER) != 0 &&
	    (slot = name_admit(&model_cap, sh->max_models, sh->model_idle_ms, route, model, ok, &gen))) {
		if (!s)
			s = insert(sh, key, len, hash);
	} else {
		len = series_key_build(key, route, upstream, SERIES_MODEL_OTHER, cold);
		hash = fnv1a(key, len);
		if (!(s = lookup(sh, key, len, hash)))
			s = insert(sh, key, len, hash);
	}
	if (s) {
		s->slot = slot;
		s->gen = gen;
	}
	return s;
}

struct series *stats_tenant_series(struct stats_shard *sh, const char *route, const char *tenant, bool ok)
{
	char key[SERIES_KEY_MAX];
	size_t len;
	uint64_t hash, gen = 0;
	struct series *s;
	struct model_slot *slot = NULL;
	bool fixed;

	if (!sh)
		return NULL;
	if (!tenant || !*tenant)
		tenant = TENANT_ABSENT;
	/* the labels that are no client's name take no slot */
	fixed = strcmp(tenant, TENANT_ABSENT) == 0 || strcmp(tenant, TENANT_INVALID) == 0 ||
		strcmp(tenant, TENANT_OTHER) == 0;
	len = series_key_build_tenant(key, route, tenant);
	if (!len) {
		fixed = true;
		tenant = TENANT_OTHER;
		len = series_key_build_tenant(key, route, tenant);
	}
	hash = fnv1a(key, len);
	s = lookup(sh, key, len, hash);
	if (s && (!s->slot || atomic_load_explicit(&s->slot->gen, memory_order_acquire) == s->gen) &&
	    (fixed || s->slot)) {
		if (s->slot)
			slot_touch(s->slot, sh->clock_ms, sh->touch_ms);
		return s;
	}
	if (fixed) {
		if (!s)
			s = insert(sh, key, len, hash);
	} else if ((slot = name_admit(&tenant_cap, sh->max_tenants, sh->tenant_idle_ms, route, tenant, ok, &gen))) {
		if (!s)
			s = insert(sh, key, len, hash);
	} else {
		len = series_key_build_tenant(key, route, TENANT_OTHER);
		hash = fnv1a(key, len);
		if (!(s = lookup(sh, key, len, hash)))
			s = insert(sh, key, len, hash);
	}
	if (s) {
		s->slot = slot;
		s->gen = gen;
	}
	return s;
}

static void mark_dirty(struct series *se)
{
	if (se->dirty)
		return;
	se->dirty = true;
	se->next_dirty = se->shard->dirty;
	se->shard->dirty = se;
}

void stats_record_itl_n(struct series *se, uint64_t gap_ns, unsigned load, uint64_t n)
{
	if (!se || n == 0)
		return;
	slice_record_itl_n(&se->slice, gap_ns, load, n);
	mark_dirty(se);
}

const struct slice *stats_series_slice(const struct series *se)
{
	return &se->slice;
}

void stats_record_event_tokens(struct series *se, uint64_t n)
{
	if (!se)
		return;
	slice_record_event_tokens(&se->slice, n);
	mark_dirty(se);
}

void stats_record_itl(struct series *se, uint64_t gap_ns, unsigned load)
{
	stats_record_itl_n(se, gap_ns, load, 1);
}

void stats_record_request(struct series *se, const struct req_record *r, unsigned load)
{
	if (!se)
		return;
	slice_record_request(&se->slice, r, load, &se->shard->slo);
	mark_dirty(se);
}

void stats_shard_flush(struct stats_shard *sh)
{
	struct store_batch *b;
	size_t n = 0;

	if (!sh)
		return;
	sh->clock_ms = now_ms();
	if (!sh->dirty)
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
	uint64_t now = sh->clock_ms;
	for (struct series *s = sh->dirty, *next; s; s = next) {
		next = s->next_dirty;
		/* recorded into since the last flush: its name is in use (a stream
		 * holding the series included) */
		if (s->slot && atomic_load_explicit(&s->slot->gen, memory_order_relaxed) == s->gen)
			slot_touch(s->slot, now, sh->touch_ms);
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

struct slo stats_slo(const struct config *boot)
{
	return (struct slo){ .ttft_us = boot->slo_ttft_ms * 1000,
			     .tpot_us = boot->slo_tpot_ms * 1000,
			     .itl_us = boot->slo_itl_ms * 1000 };
}

struct stats_shard *stats_shard_new(struct event_base *base, struct store *store, const struct config *boot)
{
	struct stats_shard *sh = calloc(1, sizeof(*sh));
	uint64_t model_idle_ms = boot->model_idle_ms, flush_ms = boot->flush_ms;

	if (!sh)
		return NULL;
	sh->store = store;
	sh->slo = stats_slo(boot);
	sh->max_models = boot->max_models;
	sh->model_idle_ms = model_idle_ms;
	sh->max_tenants = boot->max_tenants;
	sh->tenant_idle_ms = boot->tenant_idle_ms;
	if (sh->tenant_idle_ms && (!model_idle_ms || sh->tenant_idle_ms < model_idle_ms))
		model_idle_ms = sh->tenant_idle_ms; /* the touch period: of the shorter one */
	sh->clock_ms = now_ms();
	/* once a second; finer for a short model_idle (tests) */
	sh->touch_ms = model_idle_ms && model_idle_ms / 8 < 1000 ? model_idle_ms / 8 : 1000;
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
