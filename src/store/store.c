/*
 * store.c — the LMDB writer thread, the per-second ring, the lifetime
 * total behind /metrics, and opening and closing the store. The window
 * queries are in store_query.c, the stats held in memory while commits
 * fail in store_held.c, the day packs the writer makes of old hour slices
 * in store_pack.c; what the files share is in store_int.h.
 *
 * Invariants:
 *   - only the writer thread opens LMDB write transactions, except a reset,
 *     which LMDB serializes with the writer's;
 *   - no read transaction outlives the call that opened it;
 *   - the map is resized only under map_lock held for writing, which every
 *     transaction holds for reading, because LMDB requires that no
 *     transaction be active in the process while it resizes;
 *   - the ring is touched only under ring_lock;
 *   - an hour of a series is in its 'h' slice, its day pack ('d'), or
 *     both (a late delta not packed yet), and readers add them up; an
 *     hour moves into its pack in one write transaction (store_pack.c);
 *   - a database that does not read back at start-up is moved aside, never
 *     opened in this process: the check that reads it runs in a child, so
 *     that LMDB faulting on a damaged page cannot take tokentap down.
 */
#include "store_int.h"
#include "store_check.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "config.h"
#include "log.h"
#include "varint.h"

#define STORE_LAYOUT "tokentap-stats-2" /* 2: histograms with geometric buckets from 1024 (hist.h) */
#define QUEUE_MAX 600			/* batches waiting for the writer before the oldest is dropped */
/* Day packs rewritten per pass: a busy series' day costs the writer 10-20 ms
 * on a loaded 2-core machine, so a pass takes about as long as a flush of
 * 100 series, and 100 series are packed over 13 flushes. */
#define PACK_PER_PASS 8

static const char *const window_names[WIN__COUNT] = { "1m", "5m", "1h", "24h", "7d", "all" };

int store_window_parse(const char *s, enum store_window *w)
{
	for (int i = 0; i < WIN__COUNT; i++) {
		if (strcmp(s, window_names[i]) == 0) {
			*w = (enum store_window)i;
			return 0;
		}
	}
	return -1;
}

const char *store_window_name(enum store_window w)
{
	return window_names[w];
}

void store_options_defaults(struct store_options *o)
{
	struct config c;

	config_defaults(&c); /* the settings table's retentions and size */
	memset(o, 0, sizeof(*o));
	o->minute_retention_s = c.minute_retention_s;
	o->hour_retention_s = c.hour_retention_s;
	o->map_size = 64u << 20;
	o->map_size_max = c.store_max_size;
	o->prune_every_s = 60;
	o->pack_per_pass = PACK_PER_PASS;
	o->set_aside_corrupt = true;
}

void store_batch_free(struct store_batch *b)
{
	if (!b)
		return;
	for (size_t i = 0; i < b->n; i++)
		free(b->items[i].blob);
	free(b->items);
	free(b);
}

/* ---- the ring ---- */

static void ring_slot_clear(struct ring_slot *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->items[i].blob);
	s->n = 0;
}

/* Moves the batch's blobs into the ring slot of its second. */
static void ring_add(struct store *st, struct store_batch *b)
{
	pthread_mutex_lock(&st->ring_lock);
	struct ring_slot *s = &st->ring[b->sec % RING_SECONDS];
	if (s->sec != b->sec) {
		ring_slot_clear(s);
		s->sec = b->sec;
	}
	for (size_t i = 0; i < b->n; i++) {
		if (s->n == s->cap) {
			size_t cap = s->cap ? s->cap * 2 : 8;
			struct store_item *p = realloc(s->items, cap * sizeof(*p));
			if (!p)
				break;
			s->items = p;
			s->cap = cap;
		}
		s->items[s->n++] = b->items[i];
		b->items[i].blob = NULL;
	}
	pthread_mutex_unlock(&st->ring_lock);
}

/* Adds the batch to the lifetime counts (before ring_add takes its blobs):
 * the counters and the per-request metrics' histograms, not the load curves
 * (nothing reads them there, and they are most of a slice's memory). */
static void life_add(struct store *st, const struct store_batch *b)
{
	struct slice *tmp = &st->life_scratch; /* writer thread only; kept allocated */

	pthread_mutex_lock(&st->life_lock);
	for (size_t i = 0; i < b->n; i++) {
		struct store_series *se = store_result_series(&st->life, b->items[i].key, b->items[i].keylen);
		if (!se) {
			log_warn("store: out of memory: a delta is missing from the lifetime counts");
			continue;
		}
		slice_clear(tmp);
		if (slice_decode_merge(tmp, b->items[i].blob, b->items[i].len) == -1) {
			log_warn("store: undecodable delta left out of the lifetime counts");
			continue;
		}
		for (unsigned c = 0; c < CT__COUNT; c++)
			se->slice.counters[c] += tmp->counters[c];
		for (unsigned m = 0; m < HM__COUNT; m++) {
			struct hist *h;
			if (tmp->slot[m] && tmp->slot[m]->count && (h = slice_hist(&se->slice, m)))
				hist_merge(h, tmp->slot[m]);
		}
	}
	pthread_mutex_unlock(&st->life_lock);
}

/* ---- LMDB ---- */

/* Doubles the map, up to map_size_max; MDB_MAP_FULL once there. */
int store_map_grow(struct store *st)
{
	uint64_t size = st->map_size * 2;
	int rc;

	if (st->map_size >= st->opt.map_size_max)
		return MDB_MAP_FULL;
	if (size > st->opt.map_size_max)
		size = st->opt.map_size_max;
	pthread_rwlock_wrlock(&st->map_lock);
	rc = mdb_env_set_mapsize(st->env, (size_t)size);
	pthread_rwlock_unlock(&st->map_lock);
	if (rc == 0) {
		log_info("store: map grown to %llu KiB", (unsigned long long)(size >> 10));
		st->map_size = size;
	}
	return rc;
}

static int id_lookup(struct store *st, const char *key, size_t keylen, uint32_t *id)
{
	for (size_t i = 0; i < st->n_ids; i++) {
		if (st->ids[i].keylen == keylen && memcmp(st->ids[i].key, key, keylen) == 0) {
			*id = st->ids[i].id;
			return 0;
		}
	}
	return -1;
}

static int id_remember(struct store *st, const char *key, size_t keylen, uint32_t id)
{
	if (st->n_ids == st->cap_ids) {
		size_t cap = st->cap_ids ? st->cap_ids * 2 : 32;
		struct id_entry *p = realloc(st->ids, cap * sizeof(*p));
		if (!p)
			return -1;
		st->ids = p;
		st->cap_ids = cap;
	}
	char *k = malloc(keylen);
	if (!k)
		return -1;
	memcpy(k, key, keylen);
	st->ids[st->n_ids++] = (struct id_entry){ k, keylen, id };
	if (id >= st->next_id)
		st->next_id = id + 1;
	return 0;
}

/* The id of a series, registered in this transaction when new. */
static int series_id(struct store *st, MDB_txn *txn, const char *key, size_t keylen, uint32_t *id, bool *added)
{
	uint8_t idb[4];
	MDB_val k = { keylen, (void *)key }, v = { 4, idb }, ik = { 4, idb }, iv = { keylen, (void *)key };
	int rc;

	*added = false;
	if (id_lookup(st, key, keylen, id) == 0)
		return 0;
	*id = st->next_id;
	be32(idb, *id);
	if ((rc = mdb_put(txn, st->dbi_series, &k, &v, 0)) || (rc = mdb_put(txn, st->dbi_by_id, &ik, &iv, 0)))
		return rc;
	*added = true;
	st->next_id++;
	return 0;
}

/*
 * Stored values: one byte saying how the encoded slice follows — 'r' as is,
 * 'z' deflated (zlib) after a varint of its inflated length. Deflate about
 * halves a busy slice; the writer thread pays for it, never a worker.
 */
#define VALUE_MAX (8u << 20)

/* The stored value of `raw`, after `lead` bytes left for the caller. */
uint8_t *store_value_pack(const uint8_t *raw, size_t n, size_t lead, size_t *outlen)
{
	uLongf zlen = compressBound((uLong)n);
	uint8_t *buf = malloc(lead + 1 + VARINT_MAX + zlen), *out;

	if (!buf)
		return NULL;
	out = buf + lead;
	size_t hdr = 1 + varint_put(out + 1, n);
	if (compress2(out + hdr, &zlen, raw, (uLong)n, 6) == Z_OK && hdr + zlen < 1 + n) {
		out[0] = 'z';
		*outlen = lead + hdr + zlen;
		return buf;
	}
	out[0] = 'r';
	memcpy(out + 1, raw, n);
	*outlen = lead + 1 + n;
	return buf;
}

/* The bytes a stored value holds: in place for 'r', inflated into *owned
 * (the caller frees it) for 'z'. -1 when it does not unpack. */
int store_value_raw(const uint8_t *v, size_t n, const uint8_t **raw, size_t *rawlen, uint8_t **owned)
{
	const uint8_t *p = v + 1, *end = v + n;
	uint64_t len;

	*owned = NULL;
	if (n < 1)
		return -1;
	if (v[0] == 'r') {
		*raw = v + 1;
		*rawlen = n - 1;
		return 0;
	}
	if (v[0] != 'z' || varint_get(&p, end, &len) == -1 || len == 0 || len > VALUE_MAX)
		return -1;
	uint8_t *buf = malloc(len);
	uLongf got = (uLongf)len;
	if (!buf || uncompress(buf, &got, p, (uLong)(end - p)) != Z_OK || got != len) {
		free(buf);
		return -1;
	}
	*raw = *owned = buf;
	*rawlen = len;
	return 0;
}

/* Decodes a stored value into `dst` (adding). -1 when it does not decode. */
int store_value_merge(struct slice *dst, const uint8_t *v, size_t n)
{
	const uint8_t *raw;
	size_t len;
	uint8_t *owned;
	int rc = -1;

	if (store_value_raw(v, n, &raw, &len, &owned) == 0)
		rc = slice_decode_merge(dst, raw, len);
	free(owned);
	return rc;
}

/* Merges `blob` into the stored slice under `k` (read, merge, write back).
 * Minute slices keep no load curve: see slice_drop_curves. */
static int merge_into(struct store *st, MDB_txn *txn, const uint8_t k9[9], const uint8_t *blob, size_t len)
{
	MDB_val k = { 9, (void *)k9 }, v;
	struct slice s;
	uint8_t *raw = NULL, *packed;
	size_t rawlen, packedlen;
	int rc;

	memset(&s, 0, sizeof(s));
	rc = mdb_get(txn, st->dbi_slices, &k, &v);
	if (rc == 0) {
		if (store_value_merge(&s, v.mv_data, v.mv_size) == -1)
			log_warn("store: a stored slice did not decode; it is replaced");
	} else if (rc != MDB_NOTFOUND) {
		return rc;
	}
	if (slice_decode_merge(&s, blob, len) == -1) {
		slice_release(&s);
		return 0; /* a bad delta is dropped, the stored slice kept */
	}
	if (k9[0] == 'm')
		slice_drop_curves(&s);
	rawlen = slice_encode(&s, &raw);
	slice_release(&s);
	if (!rawlen)
		return ENOMEM;
	packed = store_value_pack(raw, rawlen, 0, &packedlen);
	free(raw);
	if (!packed)
		return ENOMEM;
	v.mv_size = packedlen;
	v.mv_data = packed;
	rc = mdb_put(txn, st->dbi_slices, &k, &v, 0);
	free(packed);
	return rc;
}

int store_commit_batches(struct store *st, struct store_batch *list)
{
	MDB_txn *txn;
	int rc;
	size_t ids_before = st->n_ids;

	pthread_rwlock_rdlock(&st->map_lock);
	rc = mdb_txn_begin(st->env, NULL, 0, &txn);
	if (rc) {
		pthread_rwlock_unlock(&st->map_lock);
		return rc;
	}
	for (struct store_batch *b = list; b && !rc; b = b->next) {
		uint32_t minute = (uint32_t)(b->sec / 60), hour = (uint32_t)(b->sec / 3600);
		for (size_t i = 0; i < b->n && !rc; i++) {
			struct store_item *it = &b->items[i];
			uint32_t id;
			bool added;
			uint8_t k[9];
			if ((rc = series_id(st, txn, it->key, it->keylen, &id, &added)))
				break;
			if (added && id_remember(st, it->key, it->keylen, id) == -1) {
				rc = ENOMEM;
				break;
			}
			slice_key(k, 'm', minute, id);
			if ((rc = merge_into(st, txn, k, it->blob, it->len)))
				break;
			slice_key(k, 'h', hour, id);
			if ((rc = merge_into(st, txn, k, it->blob, it->len)))
				break;
			slice_key(k, 'a', 0, id);
			rc = merge_into(st, txn, k, it->blob, it->len);
		}
	}
	if (rc) {
		mdb_txn_abort(txn);
	} else {
		rc = mdb_txn_commit(txn);
	}
	pthread_rwlock_unlock(&st->map_lock);
	if (rc) {
		/* ids registered in the aborted transaction are not on disk */
		for (size_t i = ids_before; i < st->n_ids; i++)
			free(st->ids[i].key);
		if (st->n_ids > ids_before) {
			st->n_ids = ids_before;
			st->next_id = 0;
			for (size_t i = 0; i < st->n_ids; i++)
				if (st->ids[i].id >= st->next_id)
					st->next_id = st->ids[i].id + 1;
		}
	}
	return rc;
}

/* Deletes 'm', 'h' and 'd' slices older than their retention. */
/* ('d': a day pack whose last hour is past retention) */
static void prune(struct store *st, uint64_t now)
{
	static const struct {
		char kind;
		uint64_t unit;
	} kinds[] = { { 'm', 60 }, { 'h', 3600 }, { 'd', 86400 } };
	uint64_t keep[3] = { st->opt.minute_retention_s, st->opt.hour_retention_s, st->opt.hour_retention_s };
	MDB_txn *txn;
	MDB_cursor *cur;
	size_t removed = 0;
	int rc;

	pthread_rwlock_rdlock(&st->map_lock);
	if (mdb_txn_begin(st->env, NULL, 0, &txn)) {
		pthread_rwlock_unlock(&st->map_lock);
		return;
	}
	if (mdb_cursor_open(txn, st->dbi_slices, &cur) == 0) {
		for (int i = 0; i < 3; i++) {
			uint64_t oldest = now > keep[i] ? (now - keep[i]) / kinds[i].unit : 0;
			uint8_t start[9];
			MDB_val k = { 9, start }, v;
			slice_key(start, kinds[i].kind, 0, 0);
			rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
			while (rc == 0 && k.mv_size == 9 && ((uint8_t *)k.mv_data)[0] == (uint8_t)kinds[i].kind &&
			       get_be32((uint8_t *)k.mv_data + 1) < oldest) {
				if (mdb_cursor_del(cur, 0))
					break;
				removed++;
				rc = mdb_cursor_get(cur, &k, &v, MDB_GET_CURRENT);
				if (rc == 0)
					continue;
				rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
			}
		}
		mdb_cursor_close(cur);
	}
	rc = mdb_txn_commit(txn);
	pthread_rwlock_unlock(&st->map_lock);
	/* while commits fail, the fault line has said why already */
	if (rc && st->fault)
		log_debug("store: pruning old slices failed: %s", mdb_strerror(rc));
	else if (rc)
		log_warn("store: pruning old slices failed: %s", mdb_strerror(rc));
	if (removed && !rc)
		log_debug("store: pruned %zu slices past retention", removed);
}

static void *writer_main(void *arg)
{
	struct store *st = arg;

	pthread_mutex_lock(&st->q_lock);
	for (;;) {
		bool retry_due = false;
		/* while commits fail, wake up to retry even when no stats come */
		while (!st->q_head && !st->stopping && !retry_due) {
			if (st->fault) {
				struct timespec at = { (time_t)st->retry_at, 0 };
				retry_due = pthread_cond_timedwait(&st->q_cond, &st->q_lock, &at) == ETIMEDOUT;
			} else {
				pthread_cond_wait(&st->q_cond, &st->q_lock);
			}
		}
		struct store_batch *list = st->q_head;
		size_t n = st->q_len;
		bool stopping = st->stopping;
		st->q_head = st->q_tail = NULL;
		st->q_len = 0;
		pthread_mutex_unlock(&st->q_lock);

		uint64_t now = unix_now();
		if (!list) {
			/* a timed retry, or the last chance before shutdown */
			if (st->env && st->fault)
				store_held_retry(st, now, stopping);
			if (stopping)
				return NULL;
			pthread_mutex_lock(&st->q_lock);
			continue;
		}
		if (st->env)
			store_commit_or_hold(st, list, now);
		for (struct store_batch *b = list, *next; b; b = next) {
			next = b->next;
			life_add(st, b);
			ring_add(st, b);
			store_batch_free(b);
		}
		if (st->env) {
			/* pruning once a minute, then packing, which, cut short
			 * at its bound, goes on at each flush until done */
			bool due = now - st->last_prune >= st->opt.prune_every_s;
			if (due) {
				st->last_prune = now;
				prune(st, now);
			}
			if (due || st->pack_more)
				store_pack_run(st, now);
		}

		pthread_mutex_lock(&st->q_lock);
		st->committed += n;
		pthread_cond_broadcast(&st->q_done);
	}
}

void store_submit(struct store *st, struct store_batch *b)
{
	struct store_batch *old = NULL;

	if (!st) {
		store_batch_free(b);
		return;
	}
	b->next = NULL;
	pthread_mutex_lock(&st->q_lock);
	if (st->q_len >= QUEUE_MAX) { /* the writer is stuck: shed, never block */
		old = st->q_head;
		st->q_head = old->next;
		st->q_len--;
		st->committed++;
		st->dropped++;
	}
	if (st->q_tail)
		st->q_tail->next = b;
	else
		st->q_head = b;
	st->q_tail = b;
	st->q_len++;
	st->submitted++;
	pthread_cond_signal(&st->q_cond);
	pthread_mutex_unlock(&st->q_lock);
	if (old) {
		/* said once per burst, not once per batch */
		uint64_t now = unix_now();
		if (now - __atomic_exchange_n(&st->last_drop_warn, now, __ATOMIC_RELAXED) >= 10)
			log_warn("store: writer is behind; dropping the oldest pending stats batches");
		store_batch_free(old);
	}
}

void store_sync(struct store *st)
{
	if (!st)
		return;
	pthread_mutex_lock(&st->q_lock);
	uint64_t target = st->submitted;
	while (st->committed < target && st->writer_running)
		pthread_cond_wait(&st->q_done, &st->q_lock);
	pthread_mutex_unlock(&st->q_lock);
}

/* ---- open / close ---- */

int store_check_rc(int rc, const char *what, char *err, size_t errlen)
{
	if (rc)
		snprintf(err, errlen, "store: %s: %s", what, mdb_strerror(rc));
	return rc;
}

/* Refuses an environment that some other program wrote: tokentap neither
 * writes to it nor moves it. */
static void say_foreign(struct store *st, const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen,
		 "store: %s/data.mdb is an LMDB database but not a tokentap store (%s); tokentap leaves it as it "
		 "is: choose another --data-dir, or move it aside",
		 st->dir, what);
}

/* True when the environment holds nothing: no record, no named database. */
static int env_empty(MDB_txn *txn, bool *empty)
{
	MDB_dbi main;
	MDB_cursor *cur;
	MDB_val k, v;
	int rc;

	if ((rc = mdb_dbi_open(txn, NULL, 0, &main)) != 0 || (rc = mdb_cursor_open(txn, main, &cur)) != 0)
		return rc;
	rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
	mdb_cursor_close(cur);
	*empty = rc == MDB_NOTFOUND;
	return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Opens tokentap's databases, writing the layout record into a new store,
 * and reads the series ids. A store in another tokentap layout, and an
 * environment that is not tokentap's at all, are refused unchanged. */
static int load_layout(struct store *st, char *err, size_t errlen)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	bool empty = false;
	int rc;

	if (store_check_rc(mdb_txn_begin(st->env, NULL, 0, &txn), "begin", err, errlen))
		return -1;
	k.mv_data = "layout";
	k.mv_size = 6;
	rc = mdb_dbi_open(txn, "meta", 0, &st->dbi_meta);
	if (rc == MDB_NOTFOUND) {
		/* A new store, unless something else lives here. */
		if (store_check_rc(env_empty(txn, &empty), "read the database", err, errlen))
			goto fail;
		if (!empty) {
			say_foreign(st, "it has records but no tokentap layout record", err, errlen);
			goto fail;
		}
		v.mv_data = STORE_LAYOUT;
		v.mv_size = strlen(STORE_LAYOUT);
		if (store_check_rc(mdb_dbi_open(txn, "meta", MDB_CREATE, &st->dbi_meta), "open meta", err, errlen) ||
		    store_check_rc(mdb_put(txn, st->dbi_meta, &k, &v, 0), "write layout", err, errlen))
			goto fail;
	} else if (rc == MDB_INCOMPATIBLE) {
		say_foreign(st, "its 'meta' is a record, not a database", err, errlen);
		goto fail;
	} else if (store_check_rc(rc, "open meta", err, errlen)) {
		goto fail;
	} else if ((rc = mdb_get(txn, st->dbi_meta, &k, &v)) == MDB_NOTFOUND) {
		say_foreign(st, "its meta database has no layout record", err, errlen);
		goto fail;
	} else if (rc) {
		store_check_rc(rc, "read layout", err, errlen);
		goto fail;
	} else if (v.mv_size != strlen(STORE_LAYOUT) || memcmp(v.mv_data, STORE_LAYOUT, v.mv_size) != 0) {
		char what[128];
		int n = (int)(v.mv_size > 64 ? 64 : v.mv_size);
		if (v.mv_size < 15 || memcmp(v.mv_data, "tokentap-stats-", 15) != 0) {
			snprintf(what, sizeof(what), "its layout record says '%.*s'", n, (const char *)v.mv_data);
			say_foreign(st, what, err, errlen);
		} else {
			snprintf(err, errlen,
				 "store: %s holds stats in layout '%.*s', but this tokentap reads '%s'; move the "
				 "directory aside or choose another --data-dir",
				 st->dir, n, (const char *)v.mv_data, STORE_LAYOUT);
		}
		goto fail;
	}
	if (store_check_rc(mdb_dbi_open(txn, "series", MDB_CREATE, &st->dbi_series), "open series", err, errlen) ||
	    store_check_rc(mdb_dbi_open(txn, "series_by_id", MDB_CREATE, &st->dbi_by_id), "open series_by_id", err,
			   errlen) ||
	    store_check_rc(mdb_dbi_open(txn, "slices", MDB_CREATE, &st->dbi_slices), "open slices", err, errlen))
		goto fail;
	if (store_check_rc(mdb_cursor_open(txn, st->dbi_series, &cur), "cursor", err, errlen))
		goto fail;
	while ((rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
		if (v.mv_size != 4 || k.mv_size > SERIES_KEY_MAX)
			continue;
		if (id_remember(st, k.mv_data, k.mv_size, get_be32(v.mv_data)) == -1)
			break;
	}
	mdb_cursor_close(cur);
	if (store_check_rc(mdb_txn_commit(txn), "commit", err, errlen))
		return -1;
	return 0;
fail:
	mdb_txn_abort(txn);
	return -1;
}

static int lock_dir(struct store *st, char *err, size_t errlen)
{
	char path[4096], pid[32];

	snprintf(path, sizeof(path), "%s/tokentap.lock", st->dir);
	st->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (st->lock_fd == -1) {
		snprintf(err, errlen, "store: cannot create %s: %s", path, strerror(errno));
		return -1;
	}
	if (flock(st->lock_fd, LOCK_EX | LOCK_NB) == -1) {
		ssize_t n = pread(st->lock_fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		snprintf(err, errlen,
			 "store: data directory %s is in use by another tokentap (pid %s); give each "
			 "instance its own --data-dir",
			 st->dir, pid[0] ? pid : "unknown");
		close(st->lock_fd);
		st->lock_fd = -1;
		return -1;
	}
	int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
	if (ftruncate(st->lock_fd, 0) == 0 && pwrite(st->lock_fd, pid, (size_t)len, 0) != len)
		log_warn("store: cannot write the pid into %s", path);
	return 0;
}

/* Renames data.mdb to data.mdb.corrupt-<unix time>, kept for a post-mortem,
 * and removes lock.mdb, whose reader table described the bad file. */
static int db_set_aside(struct store *st, const char *why, char *err, size_t errlen)
{
	char from[4096], to[4200], lock[4096];
	struct stat sb;
	uint64_t now = unix_now();

	snprintf(from, sizeof(from), "%s/data.mdb", st->dir);
	for (int i = 0; i < 100; i++) {
		if (i == 0)
			snprintf(to, sizeof(to), "%s.corrupt-%llu", from, (unsigned long long)now);
		else
			snprintf(to, sizeof(to), "%s.corrupt-%llu-%d", from, (unsigned long long)now, i);
		if (lstat(to, &sb) == -1 && errno == ENOENT)
			break;
	}
	if (rename(from, to) == -1) {
		snprintf(err, errlen, "store: %s is corrupt (%s) and cannot be moved to %s: %s; move it away by hand",
			 from, why, to, strerror(errno));
		return -1;
	}
	snprintf(lock, sizeof(lock), "%s/lock.mdb", st->dir);
	if (unlink(lock) == -1 && errno != ENOENT)
		log_warn("store: cannot remove %s: %s", lock, strerror(errno));
	log_error("store: %s is corrupt (%s); moved it to %s and starting with an empty store", from, why, to);
	return 0;
}

struct store *store_open(const struct store_options *o, char *err, size_t errlen)
{
	struct store *st = calloc(1, sizeof(*st));
	int rc, dead = 0;

	if (!st) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	st->opt = *o;
	st->lock_fd = -1;
	st->last_prune = 0;
	pthread_rwlock_init(&st->map_lock, NULL);
	pthread_rwlock_init(&st->held_lock, NULL);
	pthread_mutex_init(&st->ring_lock, NULL);
	pthread_mutex_init(&st->life_lock, NULL);
	st->life_since = unix_now();
	pthread_mutex_init(&st->q_lock, NULL);
	pthread_cond_init(&st->q_cond, NULL);
	pthread_cond_init(&st->q_done, NULL);

	if (o->dir) {
		/* The 24h window reads minute slices and the 7d window hour slices:
		 * shorter retention quietly shortens them. */
		if (o->minute_retention_s < 24 * 3600)
			log_warn(
				"store: store.minute_retention is %llu s, under 24 h: the 24h window shows only that "
				"much",
				(unsigned long long)o->minute_retention_s);
		if (o->hour_retention_s < WEEK_HOURS * 3600)
			log_warn(
				"store: store.hour_retention is %llu s, under 7 days: the 7d window shows only that "
				"much",
				(unsigned long long)o->hour_retention_s);
		st->dir = strdup(o->dir);
		if (mkdir(st->dir, 0750) == -1 && errno != EEXIST) {
			snprintf(err, errlen, "store: cannot create data directory %s: %s", st->dir, strerror(errno));
			goto fail;
		}
		if (lock_dir(st, err, errlen) == -1)
			goto fail;
		st->map_size = o->map_size < o->map_size_max ? o->map_size : o->map_size_max;
		char why[512];
		enum store_health health = store_check_file(st->dir, st->map_size, why, sizeof(why));
		if (health == STORE_UNKNOWN)
			log_debug("store: the start-up check of %s gave no verdict: %s", st->dir, why);
		if (health == STORE_CORRUPT) {
			if (!o->set_aside_corrupt) {
				snprintf(err, errlen,
					 "store: %s/data.mdb is corrupt (%s); a tokentap server started on it moves it "
					 "aside and starts empty",
					 st->dir, why);
				goto fail;
			}
			if (db_set_aside(st, why, err, errlen) == -1)
				goto fail;
		}
		if (store_check_rc(mdb_env_create(&st->env), "create", err, errlen))
			goto fail;
		mdb_env_set_maxdbs(st->env, 8);
		mdb_env_set_mapsize(st->env, (size_t)st->map_size);
		rc = mdb_env_open(st->env, st->dir, MDB_NOTLS, 0640);
		if (rc) {
			snprintf(err, errlen, "store: cannot open the database in %s: %s", st->dir, mdb_strerror(rc));
			goto fail;
		}
		if (mdb_env_get_maxkeysize(st->env) < SERIES_KEY_MAX) {
			snprintf(err, errlen, "store: this LMDB takes keys of at most %d bytes; tokentap needs %d",
				 mdb_env_get_maxkeysize(st->env), SERIES_KEY_MAX);
			goto fail;
		}
		/* A map grown by an earlier run is kept. */
		MDB_envinfo info;
		if (mdb_env_info(st->env, &info) == 0 && info.me_mapsize > st->map_size)
			st->map_size = info.me_mapsize;
		mdb_reader_check(st->env, &dead);
		if (dead)
			log_info("store: cleared %d stale reader slot(s) left by a killed process", dead);
		if (load_layout(st, err, errlen) == -1)
			goto fail;
	}
	if (pthread_create(&st->writer, NULL, writer_main, st) != 0) {
		snprintf(err, errlen, "store: cannot start the writer thread");
		goto fail;
	}
	st->writer_running = true;
	if (st->dir)
		log_info("store: %s opened, %zu series known", st->dir, st->n_ids);
	return st;
fail:
	store_close(st);
	return NULL;
}

void store_close(struct store *st)
{
	if (!st)
		return;
	if (st->writer_running) {
		pthread_mutex_lock(&st->q_lock);
		st->stopping = true;
		pthread_cond_signal(&st->q_cond);
		pthread_mutex_unlock(&st->q_lock);
		pthread_join(st->writer, NULL);
		st->writer_running = false;
	}
	if (st->env)
		mdb_env_close(st->env);
	if (st->lock_fd != -1)
		close(st->lock_fd);
	for (size_t i = 0; i < st->n_ids; i++)
		free(st->ids[i].key);
	free(st->ids);
	for (unsigned i = 0; i < RING_SECONDS; i++) {
		ring_slot_clear(&st->ring[i]);
		free(st->ring[i].items);
	}
	while (st->q_head) {
		struct store_batch *b = st->q_head;
		st->q_head = b->next;
		store_batch_free(b);
	}
	store_held_clear(st);
	store_result_free(&st->life);
	slice_release(&st->life_scratch);
	pthread_rwlock_destroy(&st->map_lock);
	pthread_rwlock_destroy(&st->held_lock);
	pthread_mutex_destroy(&st->ring_lock);
	pthread_mutex_destroy(&st->life_lock);
	pthread_mutex_destroy(&st->q_lock);
	pthread_cond_destroy(&st->q_cond);
	pthread_cond_destroy(&st->q_done);
	free(st->dir);
	free(st);
}

int store_reset(struct store *st, char *err, size_t errlen)
{
	int rc = 0;

	if (st->env) {
		MDB_txn *txn;
		pthread_rwlock_rdlock(&st->map_lock);
		rc = mdb_txn_begin(st->env, NULL, 0, &txn);
		if (rc == 0) {
			rc = mdb_drop(txn, st->dbi_slices, 0);
			if (rc == 0)
				rc = mdb_txn_commit(txn);
			else
				mdb_txn_abort(txn);
		}
		pthread_rwlock_unlock(&st->map_lock);
	}
	pthread_rwlock_wrlock(&st->held_lock);
	store_held_clear(st);
	pthread_rwlock_unlock(&st->held_lock);
	pthread_mutex_lock(&st->ring_lock);
	for (unsigned i = 0; i < RING_SECONDS; i++)
		ring_slot_clear(&st->ring[i]);
	pthread_mutex_unlock(&st->ring_lock);
	return store_check_rc(rc, "reset", err, errlen) ? -1 : 0;
}
