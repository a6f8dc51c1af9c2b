/*
 * store_query.c — the read side of the store: window queries over the
 * ring, LMDB and what is held in memory; the lifetime total; the record
 * walk behind store_verify; building a result series by series.
 *
 * Invariants:
 *   - no read transaction outlives the call that opened it, and each holds
 *     map_lock for reading (store.c resizes the map under it);
 *   - a window query holds held_lock for reading across its LMDB read and
 *     the held minutes (store_held.c), so no minute is counted twice or
 *     missed; lock order: held_lock, then map_lock;
 *   - hours are read from their 'h' slices and from the day packs in one
 *     read transaction, so each hour counts once whether it is packed or
 *     not.
 */
#include "store_int.h"

#include <lmdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static struct store_series *result_find(struct store_result *r, const char *key, size_t keylen)
{
	for (size_t i = 0; i < r->n; i++)
		if (r->series[i].keylen == keylen && memcmp(r->series[i].key, key, keylen) == 0)
			return &r->series[i];
	return NULL;
}

struct store_series *store_result_series(struct store_result *r, const char *key, size_t keylen)
{
	struct store_series *found = result_find(r, key, keylen);

	if (found)
		return found;
	if (keylen > SERIES_KEY_MAX)
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

int store_query_lifetime(struct store *st, struct store_result *out)
{
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->end_sec = unix_now();
	pthread_mutex_lock(&st->life_lock);
	out->start_sec = st->life_since;
	if (st->life.n && !(out->series = calloc(st->life.n, sizeof(*out->series))))
		rc = -1;
	for (size_t i = 0; i < st->life.n && rc == 0; i++) {
		const struct store_series *from = &st->life.series[i];
		struct store_series *se = &out->series[out->n++];
		memcpy(se->key, from->key, from->keylen);
		se->keylen = from->keylen;
		slice_merge(&se->slice, &from->slice);
	}
	out->cap = out->n;
	pthread_mutex_unlock(&st->life_lock);
	if (rc == -1)
		store_result_free(out);
	return rc;
}

static int ring_query(struct store *st, uint64_t from, uint64_t to, struct store_result *r)
{
	pthread_mutex_lock(&st->ring_lock);
	for (unsigned i = 0; i < RING_SECONDS; i++) {
		struct ring_slot *s = &st->ring[i];
		if (s->sec < from || s->sec > to)
			continue;
		for (size_t j = 0; j < s->n; j++) {
			struct store_series *se = store_result_series(r, s->items[j].key, s->items[j].keylen);
			if (se && slice_decode_merge(&se->slice, s->items[j].blob, s->items[j].len) == -1)
				log_warn("store: undecodable slice in the live ring skipped");
		}
	}
	pthread_mutex_unlock(&st->ring_lock);
	return 0;
}

int store_query_range(struct store *st, uint64_t from, uint64_t to, struct store_result *out)
{
	memset(out, 0, sizeof(*out));
	out->start_sec = from;
	out->end_sec = to;
	return ring_query(st, from, to, out);
}

/* ---- LMDB ---- */

/* Series ids already looked up in one query, and where their slices go. */
struct query_ids {
	struct {
		uint32_t id;
		size_t idx;
	} * map;
	size_t n, cap;
};

/* The result slice that stored slices of series `id` add to; NULL for a
 * slice without its series (nothing to label it with) or, with
 * `curves_only`, of a series the minute slices did not bring (a series
 * idle all window long is not in it). */
static struct slice *query_target(struct store *st, MDB_txn *txn, const uint8_t idb[4], bool curves_only,
				  struct store_result *r, struct query_ids *q)
{
	uint32_t id = get_be32(idb);
	size_t m;

	for (m = 0; m < q->n; m++)
		if (q->map[m].id == id)
			return &r->series[q->map[m].idx].slice;
	MDB_val ik = { 4, (void *)idb }, iv;
	if (mdb_get(txn, st->dbi_by_id, &ik, &iv) != 0)
		return NULL;
	struct store_series *se =
		curves_only ? result_find(r, iv.mv_data, iv.mv_size) : store_result_series(r, iv.mv_data, iv.mv_size);
	if (!se)
		return NULL;
	if (q->n == q->cap) {
		size_t cap = q->cap ? q->cap * 2 : 16;
		void *p = realloc(q->map, cap * sizeof(*q->map));
		if (!p)
			return NULL;
		q->map = p;
		q->cap = cap;
	}
	q->map[q->n].id = id;
	q->map[q->n].idx = (size_t)(se - r->series);
	q->n++;
	return &se->slice;
}

/* Adds an encoded slice to `dst`; with `curves_only`, only its load-curve
 * and prompt-length histograms. -1 when it does not decode. */
static int query_add(struct slice *dst, const uint8_t *enc, size_t len, bool curves_only)
{
	struct slice tmp;
	int rc;

	if (!curves_only)
		return slice_decode_merge(dst, enc, len);
	memset(&tmp, 0, sizeof(tmp));
	rc = slice_decode_merge(&tmp, enc, len);
	if (rc == 0) {
		for (unsigned i = HM__COUNT; i < SLICE_SLOTS; i++) {
			struct hist *h;
			if (tmp.slot[i] && tmp.slot[i]->count && (h = slice_hist(dst, i)))
				hist_merge(h, tmp.slot[i]);
		}
	}
	slice_release(&tmp);
	return rc;
}

/* Merges the slices of `kind` numbered from..to into `r`; with
 * `curves_only`, only their load-curve and prompt-length histograms. Hours
 * are read from their 'h' slices and from the day packs in one read
 * transaction, so each hour counts once whether it is packed or not. */
static int lmdb_query(struct store *st, char kind, uint32_t from, uint32_t to, bool curves_only, struct store_result *r,
		      char *err, size_t errlen)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	uint8_t start[9];
	MDB_val k = { 9, start }, v;
	struct query_ids q = { 0 };
	int rc;

	pthread_rwlock_rdlock(&st->map_lock);
	rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
	if (rc) {
		pthread_rwlock_unlock(&st->map_lock);
		return store_check_rc(rc, "read", err, errlen) ? -1 : 0;
	}
	if ((rc = mdb_cursor_open(txn, st->dbi_slices, &cur)) != 0)
		goto out;
	slice_key(start, kind, from, 0);
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		const uint8_t *kb = k.mv_data;
		if (k.mv_size != 9 || kb[0] != (uint8_t)kind || get_be32(kb + 1) > to)
			break;
		struct slice *dst = query_target(st, txn, kb + 5, curves_only, r, &q);
		const uint8_t *enc;
		size_t len;
		uint8_t *owned;
		if (!dst)
			continue;
		if (store_value_raw(v.mv_data, v.mv_size, &enc, &len, &owned) == -1 ||
		    query_add(dst, enc, len, curves_only) == -1)
			log_warn("store: undecodable slice skipped");
		free(owned);
	}
	if (kind == 'h') {
		slice_key(start, 'd', from / 24, 0);
		k.mv_size = 9;
		k.mv_data = start;
		for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0;
		     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
			const uint8_t *kb = k.mv_data;
			uint32_t day = get_be32(kb + 1);
			struct pack pk;
			if (k.mv_size != 9 || kb[0] != 'd' || day > to / 24)
				break;
			struct slice *dst = query_target(st, txn, kb + 5, curves_only, r, &q);
			if (!dst)
				continue;
			if (store_pack_parse(v.mv_data, v.mv_size, &pk) == -1) {
				log_warn("store: undecodable day of hour slices skipped");
				continue;
			}
			for (unsigned i = 0; i < pk.n; i++) {
				uint32_t hour = day * 24 + pk.e[i].hour;
				if (hour >= from && hour <= to &&
				    query_add(dst, pk.e[i].p, pk.e[i].len, curves_only) == -1)
					log_warn("store: undecodable slice skipped");
			}
			store_pack_free(&pk);
		}
	}
	mdb_cursor_close(cur);
	rc = 0;
out:
	mdb_txn_abort(txn);
	pthread_rwlock_unlock(&st->map_lock);
	free(q.map);
	return store_check_rc(rc, "query", err, errlen) ? -1 : 0;
}

int store_query(struct store *st, enum store_window w, struct store_result *out, char *err, size_t errlen)
{
	uint64_t now = unix_now();
	uint32_t cur;
	int rc;

	memset(out, 0, sizeof(*out));
	out->end_sec = now;
	switch (w) {
	case WIN_1M:
	case WIN_5M:
		out->start_sec = now - (w == WIN_1M ? 60 : 300) + 1;
		return ring_query(st, out->start_sec, now, out);
	case WIN_1H:
	case WIN_24H: {
		uint32_t n = w == WIN_1H ? 60 : 1440;
		cur = (uint32_t)(now / 60);
		out->start_sec = (uint64_t)(cur - n + 1) * 60;
		break;
	}
	case WIN_7D:
		cur = (uint32_t)(now / 3600);
		out->start_sec = (uint64_t)(cur - (WEEK_HOURS - 1)) * 3600;
		break;
	case WIN_ALL:
	default: out->start_sec = 0; break;
	}
	if (!st->env)
		return ring_query(st, out->start_sec, now, out);

	/* LMDB, plus what is held in memory while commits fail */
	pthread_rwlock_rdlock(&st->held_lock);
	switch (w) {
	case WIN_1H:
	case WIN_24H:
		/* minute slices carry no curves: those come from the hours the
		 * window touches */
		cur = (uint32_t)(now / 60);
		rc = lmdb_query(st, 'm', (uint32_t)(out->start_sec / 60), cur, false, out, err, errlen);
		if (rc == 0)
			rc = lmdb_query(st, 'h', (uint32_t)(out->start_sec / 3600), (uint32_t)(now / 3600), true, out,
					err, errlen);
		break;
	case WIN_7D:
		rc = lmdb_query(st, 'h', (uint32_t)(out->start_sec / 3600), (uint32_t)(now / 3600), false, out, err,
				errlen);
		break;
	default: rc = lmdb_query(st, 'a', 0, 0, false, out, err, errlen); break;
	}
	if (rc == 0)
		store_held_query(st, out->start_sec / 60, now / 60, out);
	pthread_rwlock_unlock(&st->held_lock);
	return rc;
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
			if (k.mv_size != 4 || (series_key_parse(v.mv_data, v.mv_size, &r, &u, &m, &cold) == -1 &&
					       series_key_parse_tenant(v.mv_data, v.mv_size, &r, &m) == -1))
				(*bad)++;
			else
				(*series)++;
		}
		mdb_cursor_close(cur);
	}
	if (rc == 0 && (rc = mdb_cursor_open(txn, st->dbi_slices, &cur)) == 0) {
		while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
			struct slice s;
			struct pack pk;
			memset(&s, 0, sizeof(s));
			if (k.mv_size == 9 && ((const uint8_t *)k.mv_data)[0] == 'd') {
				/* a day pack: each hour in it counts as the slice it was */
				if (store_pack_parse(v.mv_data, v.mv_size, &pk) == -1) {
					(*bad)++;
					continue;
				}
				for (unsigned i = 0; i < pk.n; i++) {
					if (slice_decode_merge(&s, pk.e[i].p, pk.e[i].len) == -1)
						(*bad)++;
					else
						(*slices)++;
					slice_release(&s);
				}
				store_pack_free(&pk);
				continue;
			}
			if (k.mv_size != 9 || store_value_merge(&s, v.mv_data, v.mv_size) == -1)
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
	return store_check_rc(rc, "verify", err, errlen) ? -1 : 0;
}
