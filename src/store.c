/*
 * store.c — the LMDB writer thread, the per-second ring and window queries.
 *
 * Invariants:
 *   - only the writer thread opens LMDB write transactions, except a reset,
 *     which LMDB serializes with the writer's;
 *   - no read transaction outlives the call that opened it;
 *   - the map is resized only under map_lock held for writing, which every
 *     transaction holds for reading, because LMDB requires that no
 *     transaction be active in the process while it resizes;
 *   - the ring is touched only under ring_lock.
 */
#include "store.h"

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

#include "log.h"
#include "varint.h"

#define STORE_LAYOUT "tokentap-stats-1"
#define RING_SECONDS 360 /* the live view: a little over five minutes */
#define QUEUE_MAX 600	 /* batches waiting for the writer before the oldest is dropped */
#define MAP_SIZE_MAX ((uint64_t)64 << 30)

struct ring_slot {
	uint64_t sec;
	size_t n, cap;
	struct store_item *items;
};

struct store {
	struct store_options opt;
	char *dir;
	int lock_fd;

	MDB_env *env;
	MDB_dbi dbi_meta, dbi_series, dbi_by_id, dbi_slices;
	uint64_t map_size;
	pthread_rwlock_t map_lock;

	/* series ids, writer thread only */
	struct id_entry {
		char *key;
		size_t keylen;
		uint32_t id;
	} *ids;
	size_t n_ids, cap_ids;
	uint32_t next_id;

	pthread_mutex_t ring_lock;
	struct ring_slot ring[RING_SECONDS];

	pthread_t writer;
	bool writer_running;
	pthread_mutex_t q_lock;
	pthread_cond_t q_cond, q_done;
	struct store_batch *q_head, *q_tail;
	size_t q_len;
	uint64_t submitted, committed, dropped;
	bool stopping;
	uint64_t last_prune;
	uint64_t last_drop_warn;
};

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
	memset(o, 0, sizeof(*o));
	o->minute_retention_s = 24 * 3600;
	o->hour_retention_s = 30 * 24 * 3600;
	o->map_size = 64u << 20;
	o->prune_every_s = 60;
}

static uint64_t unix_now(void)
{
	return (uint64_t)time(NULL);
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

/* ---- keys ---- */

static void be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void slice_key(uint8_t out[9], char kind, uint32_t t, uint32_t id)
{
	out[0] = (uint8_t)kind;
	be32(out + 1, t);
	be32(out + 5, id);
}

/* ---- result building ---- */

static struct store_series *result_find(struct store_result *r, const char *key, size_t keylen)
{
	for (size_t i = 0; i < r->n; i++)
		if (r->series[i].keylen == keylen && memcmp(r->series[i].key, key, keylen) == 0)
			return &r->series[i];
	return NULL;
}

static struct store_series *result_series(struct store_result *r, const char *key, size_t keylen)
{
	for (size_t i = 0; i < r->n; i++)
		if (r->series[i].keylen == keylen && memcmp(r->series[i].key, key, keylen) == 0)
			return &r->series[i];
	if (keylen >= SERIES_KEY_MAX)
		return NULL;
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 16;
		struct store_series *p = realloc(r->series, cap * sizeof(*p));
		if (!p)
			return NULL;
		r->series = p;
		r->cap = cap;
	}
	struct store_series *s = &r->series[r->n++];
	memset(s, 0, sizeof(*s));
	memcpy(s->key, key, keylen);
	s->keylen = keylen;
	return s;
}

void store_result_free(struct store_result *r)
{
	for (size_t i = 0; i < r->n; i++)
		slice_release(&r->series[i].slice);
	free(r->series);
	memset(r, 0, sizeof(*r));
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

static int ring_query(struct store *st, uint64_t from, uint64_t to, struct store_result *r)
{
	pthread_mutex_lock(&st->ring_lock);
	for (unsigned i = 0; i < RING_SECONDS; i++) {
		struct ring_slot *s = &st->ring[i];
		if (s->sec < from || s->sec > to)
			continue;
		for (size_t j = 0; j < s->n; j++) {
			struct store_series *se = result_series(r, s->items[j].key, s->items[j].keylen);
			if (se && slice_decode_merge(&se->slice, s->items[j].blob, s->items[j].len) == -1)
				log_warn("store: undecodable slice in the live ring skipped");
		}
	}
	pthread_mutex_unlock(&st->ring_lock);
	return 0;
}

/* ---- LMDB ---- */

static int map_grow(struct store *st)
{
	uint64_t size = st->map_size * 2;
	int rc;

	if (size > MAP_SIZE_MAX)
		return MDB_MAP_FULL;
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

static uint8_t *value_pack(const uint8_t *raw, size_t n, size_t *outlen)
{
	uLongf zlen = compressBound((uLong)n);
	uint8_t *out = malloc(1 + VARINT_MAX + zlen);

	if (!out)
		return NULL;
	size_t hdr = 1 + varint_put(out + 1, n);
	if (compress2(out + hdr, &zlen, raw, (uLong)n, 6) == Z_OK && hdr + zlen < 1 + n) {
		out[0] = 'z';
		*outlen = hdr + zlen;
		return out;
	}
	out[0] = 'r';
	memcpy(out + 1, raw, n);
	*outlen = 1 + n;
	return out;
}

/* Decodes a stored value into `dst` (adding). -1 when it does not decode. */
static int value_merge(struct slice *dst, const uint8_t *v, size_t n)
{
	const uint8_t *p = v + 1, *end = v + n;
	uint64_t raw_len;
	int rc = -1;

	if (n < 1)
		return -1;
	if (v[0] == 'r')
		return slice_decode_merge(dst, v + 1, n - 1);
	if (v[0] != 'z' || varint_get(&p, end, &raw_len) == -1 || raw_len == 0 || raw_len > VALUE_MAX)
		return -1;
	uint8_t *raw = malloc(raw_len);
	uLongf got = (uLongf)raw_len;
	if (raw && uncompress(raw, &got, p, (uLong)(end - p)) == Z_OK && got == raw_len)
		rc = slice_decode_merge(dst, raw, raw_len);
	free(raw);
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
		if (value_merge(&s, v.mv_data, v.mv_size) == -1)
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
	packed = value_pack(raw, rawlen, &packedlen);
	free(raw);
	if (!packed)
		return ENOMEM;
	v.mv_size = packedlen;
	v.mv_data = packed;
	rc = mdb_put(txn, st->dbi_slices, &k, &v, 0);
	free(packed);
	return rc;
}

static int commit_batches(struct store *st, struct store_batch *list)
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

/* Deletes 'm' and 'h' slices older than their retention. */
static void prune(struct store *st, uint64_t now)
{
	static const struct {
		char kind;
		uint64_t unit;
	} kinds[] = { { 'm', 60 }, { 'h', 3600 } };
	uint64_t keep[2] = { st->opt.minute_retention_s, st->opt.hour_retention_s };
	MDB_txn *txn;
	MDB_cursor *cur;
	size_t removed = 0;

	pthread_rwlock_rdlock(&st->map_lock);
	if (mdb_txn_begin(st->env, NULL, 0, &txn)) {
		pthread_rwlock_unlock(&st->map_lock);
		return;
	}
	if (mdb_cursor_open(txn, st->dbi_slices, &cur) == 0) {
		for (int i = 0; i < 2; i++) {
			uint64_t oldest = now > keep[i] ? (now - keep[i]) / kinds[i].unit : 0;
			uint8_t start[9];
			MDB_val k = { 9, start }, v;
			slice_key(start, kinds[i].kind, 0, 0);
			int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
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
	if (mdb_txn_commit(txn))
		log_warn("store: pruning old slices failed");
	pthread_rwlock_unlock(&st->map_lock);
	if (removed)
		log_debug("store: pruned %zu slices past retention", removed);
}

static void *writer_main(void *arg)
{
	struct store *st = arg;

	pthread_mutex_lock(&st->q_lock);
	for (;;) {
		while (!st->q_head && !st->stopping)
			pthread_cond_wait(&st->q_cond, &st->q_lock);
		if (!st->q_head && st->stopping)
			break;
		struct store_batch *list = st->q_head;
		size_t n = st->q_len;
		st->q_head = st->q_tail = NULL;
		st->q_len = 0;
		pthread_mutex_unlock(&st->q_lock);

		if (st->env) {
			int rc = commit_batches(st, list);
			if (rc == MDB_MAP_FULL && map_grow(st) == 0)
				rc = commit_batches(st, list);
			if (rc) {
				log_error("store: commit failed, %zu batch(es) of stats lost: %s", n, mdb_strerror(rc));
				__atomic_add_fetch(&st->dropped, n, __ATOMIC_RELAXED);
			}
		}
		uint64_t now = unix_now();
		for (struct store_batch *b = list, *next; b; b = next) {
			next = b->next;
			ring_add(st, b);
			store_batch_free(b);
		}
		if (st->env && now - st->last_prune >= st->opt.prune_every_s) {
			st->last_prune = now;
			prune(st, now);
		}

		pthread_mutex_lock(&st->q_lock);
		st->committed += n;
		pthread_cond_broadcast(&st->q_done);
	}
	pthread_mutex_unlock(&st->q_lock);
	return NULL;
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

static int check_rc(int rc, const char *what, char *err, size_t errlen)
{
	if (rc)
		snprintf(err, errlen, "store: %s: %s", what, mdb_strerror(rc));
	return rc;
}

static int load_layout(struct store *st, char *err, size_t errlen)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	int rc;

	if (check_rc(mdb_txn_begin(st->env, NULL, 0, &txn), "begin", err, errlen))
		return -1;
	if (check_rc(mdb_dbi_open(txn, "meta", MDB_CREATE, &st->dbi_meta), "open meta", err, errlen) ||
	    check_rc(mdb_dbi_open(txn, "series", MDB_CREATE, &st->dbi_series), "open series", err, errlen) ||
	    check_rc(mdb_dbi_open(txn, "series_by_id", MDB_CREATE, &st->dbi_by_id), "open series_by_id", err,
		     errlen) ||
	    check_rc(mdb_dbi_open(txn, "slices", MDB_CREATE, &st->dbi_slices), "open slices", err, errlen))
		goto fail;

	k.mv_data = "layout";
	k.mv_size = 6;
	rc = mdb_get(txn, st->dbi_meta, &k, &v);
	if (rc == MDB_NOTFOUND) {
		v.mv_data = STORE_LAYOUT;
		v.mv_size = strlen(STORE_LAYOUT);
		if (check_rc(mdb_put(txn, st->dbi_meta, &k, &v, 0), "write layout", err, errlen))
			goto fail;
	} else if (rc) {
		check_rc(rc, "read layout", err, errlen);
		goto fail;
	} else if (v.mv_size != strlen(STORE_LAYOUT) || memcmp(v.mv_data, STORE_LAYOUT, v.mv_size) != 0) {
		snprintf(err, errlen,
			 "store: %s holds stats in layout '%.*s', but this tokentap reads '%s'; move the directory "
			 "aside or choose another --data-dir",
			 st->dir, (int)(v.mv_size > 64 ? 64 : v.mv_size), (const char *)v.mv_data, STORE_LAYOUT);
		goto fail;
	}
	if (check_rc(mdb_cursor_open(txn, st->dbi_series, &cur), "cursor", err, errlen))
		goto fail;
	while ((rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
		if (v.mv_size != 4 || k.mv_size >= SERIES_KEY_MAX)
			continue;
		if (id_remember(st, k.mv_data, k.mv_size, get_be32(v.mv_data)) == -1)
			break;
	}
	mdb_cursor_close(cur);
	if (check_rc(mdb_txn_commit(txn), "commit", err, errlen))
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
		snprintf(err, errlen, "store: data directory %s is in use by another tokentap (pid %s); give each "
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
	pthread_mutex_init(&st->ring_lock, NULL);
	pthread_mutex_init(&st->q_lock, NULL);
	pthread_cond_init(&st->q_cond, NULL);
	pthread_cond_init(&st->q_done, NULL);

	if (o->dir) {
		st->dir = strdup(o->dir);
		if (mkdir(st->dir, 0750) == -1 && errno != EEXIST) {
			snprintf(err, errlen, "store: cannot create data directory %s: %s", st->dir, strerror(errno));
			goto fail;
		}
		if (lock_dir(st, err, errlen) == -1)
			goto fail;
		st->map_size = o->map_size;
		if (check_rc(mdb_env_create(&st->env), "create", err, errlen))
			goto fail;
		mdb_env_set_maxdbs(st->env, 8);
		mdb_env_set_mapsize(st->env, (size_t)st->map_size);
		rc = mdb_env_open(st->env, st->dir, MDB_NOTLS, 0640);
		if (rc) {
			snprintf(err, errlen, "store: cannot open the database in %s: %s", st->dir, mdb_strerror(rc));
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
	pthread_rwlock_destroy(&st->map_lock);
	pthread_mutex_destroy(&st->ring_lock);
	pthread_mutex_destroy(&st->q_lock);
	pthread_cond_destroy(&st->q_cond);
	pthread_cond_destroy(&st->q_done);
	free(st->dir);
	free(st);
}

/* ---- queries ---- */

/* Merges the slices of `kind` numbered from..to into `r`; with
 * `curves_only`, only their load-curve and prompt-length histograms. */
static int lmdb_query(struct store *st, char kind, uint32_t from, uint32_t to, bool curves_only,
		      struct store_result *r, char *err, size_t errlen)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	uint8_t start[9];
	MDB_val k = { 9, start }, v;
	struct {
		uint32_t id;
		size_t idx;
	} *map = NULL;
	size_t nmap = 0, capmap = 0;
	int rc;

	pthread_rwlock_rdlock(&st->map_lock);
	rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
	if (rc) {
		pthread_rwlock_unlock(&st->map_lock);
		return check_rc(rc, "read", err, errlen) ? -1 : 0;
	}
	if ((rc = mdb_cursor_open(txn, st->dbi_slices, &cur)) != 0)
		goto out;
	slice_key(start, kind, from, 0);
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		const uint8_t *kb = k.mv_data;
		if (k.mv_size != 9 || kb[0] != (uint8_t)kind || get_be32(kb + 1) > to)
			break;
		uint32_t id = get_be32(kb + 5);
		size_t m;
		for (m = 0; m < nmap; m++)
			if (map[m].id == id)
				break;
		if (m == nmap) {
			MDB_val ik = { 4, (void *)(kb + 5) }, iv;
			if (mdb_get(txn, st->dbi_by_id, &ik, &iv) != 0)
				continue; /* a slice without its series: nothing to label it with */
			/* curves only add to series the minute slices brought: a
			 * series idle all window long is not in it */
			struct store_series *se = curves_only ? result_find(r, iv.mv_data, iv.mv_size)
							      : result_series(r, iv.mv_data, iv.mv_size);
			if (!se)
				continue;
			if (nmap == capmap) {
				capmap = capmap ? capmap * 2 : 16;
				void *p = realloc(map, capmap * sizeof(*map));
				if (!p)
					break;
				map = p;
			}
			map[nmap].id = id;
			map[nmap].idx = (size_t)(se - r->series);
			nmap++;
		}
		struct slice *dst = &r->series[map[m].idx].slice;
		if (!curves_only) {
			if (value_merge(dst, v.mv_data, v.mv_size) == -1)
				log_warn("store: undecodable slice skipped");
			continue;
		}
		struct slice tmp;
		memset(&tmp, 0, sizeof(tmp));
		if (value_merge(&tmp, v.mv_data, v.mv_size) == 0) {
			for (unsigned i = HM__COUNT; i < SLICE_SLOTS; i++) {
				struct hist *h;
				if (tmp.slot[i] && tmp.slot[i]->count && (h = slice_hist(dst, i)))
					hist_merge(h, tmp.slot[i]);
			}
		}
		slice_release(&tmp);
	}
	mdb_cursor_close(cur);
	rc = 0;
out:
	mdb_txn_abort(txn);
	pthread_rwlock_unlock(&st->map_lock);
	free(map);
	return check_rc(rc, "query", err, errlen) ? -1 : 0;
}

int store_query(struct store *st, enum store_window w, struct store_result *out, char *err, size_t errlen)
{
	uint64_t now = unix_now();

	memset(out, 0, sizeof(*out));
	out->end_sec = now;
	switch (w) {
	case WIN_1M:
	case WIN_5M: {
		uint64_t span = w == WIN_1M ? 60 : 300;
		out->start_sec = now - span + 1;
		return ring_query(st, out->start_sec, now, out);
	}
	case WIN_1H:
	case WIN_24H: {
		uint32_t cur = (uint32_t)(now / 60), n = w == WIN_1H ? 60 : 1440;
		out->start_sec = (uint64_t)(cur - n + 1) * 60;
		if (!st->env)
			return ring_query(st, out->start_sec, now, out);
		/* minute slices carry no curves: those come from the hours the
		 * window touches */
		if (lmdb_query(st, 'm', cur - n + 1, cur, false, out, err, errlen) == -1)
			return -1;
		return lmdb_query(st, 'h', (uint32_t)(out->start_sec / 3600), (uint32_t)(now / 3600), true, out, err,
				  errlen);
	}
	case WIN_7D: {
		uint32_t cur = (uint32_t)(now / 3600);
		out->start_sec = (uint64_t)(cur - 167) * 3600;
		if (!st->env)
			return ring_query(st, out->start_sec, now, out);
		return lmdb_query(st, 'h', cur - 167, cur, false, out, err, errlen);
	}
	case WIN_ALL:
	default:
		out->start_sec = 0;
		if (!st->env)
			return ring_query(st, 0, now, out);
		return lmdb_query(st, 'a', 0, 0, false, out, err, errlen);
	}
}

int store_verify(struct store *st, uint64_t *series, uint64_t *slices, uint64_t *bad, char *err, size_t errlen)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	int rc;

	*series = *slices = *bad = 0;
	if (!st->env)
		return 0;
	pthread_rwlock_rdlock(&st->map_lock);
	rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
	if (rc)
		goto out_unlock;
	if ((rc = mdb_cursor_open(txn, st->dbi_by_id, &cur)) == 0) {
		while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
			const char *r, *u, *m;
			bool cold;
			if (k.mv_size != 4 || series_key_parse(v.mv_data, v.mv_size, &r, &u, &m, &cold) == -1)
				(*bad)++;
			else
				(*series)++;
		}
		mdb_cursor_close(cur);
	}
	if (rc == 0 && (rc = mdb_cursor_open(txn, st->dbi_slices, &cur)) == 0) {
		while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
			struct slice s;
			memset(&s, 0, sizeof(s));
			if (k.mv_size != 9 || value_merge(&s, v.mv_data, v.mv_size) == -1)
				(*bad)++;
			else
				(*slices)++;
			slice_release(&s);
		}
		mdb_cursor_close(cur);
	}
	mdb_txn_abort(txn);
out_unlock:
	pthread_rwlock_unlock(&st->map_lock);
	return check_rc(rc, "verify", err, errlen) ? -1 : 0;
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
	pthread_mutex_lock(&st->ring_lock);
	for (unsigned i = 0; i < RING_SECONDS; i++)
		ring_slot_clear(&st->ring[i]);
	pthread_mutex_unlock(&st->ring_lock);
	return check_rc(rc, "reset", err, errlen) ? -1 : 0;
}
