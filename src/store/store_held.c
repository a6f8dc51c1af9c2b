/*
 * store_held.c — the stats held in memory while commits fail (map or disk
 * full), and saying so: the writer commits each batch list, or holds it,
 * one merged batch per minute, retrying with backoff until a commit
 * succeeds; queries add what is held to what LMDB gives.
 *
 * Invariants:
 *   - what is held moves to disk under held_lock held for writing, which
 *     queries hold for reading across their LMDB read (store_query.c), so
 *     no minute is counted twice or missed; lock order: held_lock, then
 *     map_lock;
 *   - the held list and its size are changed by the writer thread only
 *     (and by a reset), always under held_lock for writing; the fault
 *     state (fault, retry_at, said_fault...) is the writer thread's alone.
 */
#include "store_int.h"

#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "log.h"

#define HELD_MAX (64u << 20) /* bytes of unwritten stats kept while commits fail */
#define RETRY_MIN_S 1	     /* first retry after a failed commit; doubles ... */
#define RETRY_MAX_S 60	     /* ... up to this */
#define FAULT_QUIET_S 600    /* the same fault back this soon is not said again */

/* "256 KiB", "64 MiB", "2 GiB": sizes in messages. */
static const char *size_text(char *buf, size_t n, uint64_t bytes)
{
	if (bytes >= (1u << 30) && bytes % (1u << 30) == 0)
		snprintf(buf, n, "%llu GiB", (unsigned long long)(bytes >> 30));
	else if (bytes >= (1u << 20))
		snprintf(buf, n, "%llu MiB", (unsigned long long)(bytes >> 20));
	else
		snprintf(buf, n, "%llu KiB", (unsigned long long)(bytes >> 10));
	return buf;
}

static void held_free_batch(struct store *st, struct store_batch *h)
{
	for (size_t i = 0; i < h->n; i++)
		st->held_bytes -= h->items[i].len;
	store_batch_free(h);
}

/* Frees everything held. Caller holds held_lock for writing. */
void store_held_clear(struct store *st)
{
	while (st->held_head) {
		struct store_batch *h = st->held_head;
		st->held_head = h->next;
		held_free_batch(st, h);
	}
	st->held_tail = NULL;
}

static size_t held_minutes(const struct store *st)
{
	size_t n = 0;
	for (const struct store_batch *h = st->held_head; h; h = h->next)
		n++;
	return n;
}

/* The held batch of `minute`, created in order when new; NULL when out of
 * memory. Almost always the newest; batches from several workers can come
 * a little out of order, so an older minute is looked for from the start. */
static struct store_batch *held_minute(struct store *st, uint64_t minute)
{
	struct store_batch *prev = NULL, *h;

	if (st->held_tail && st->held_tail->sec / 60 <= minute) {
		if (st->held_tail->sec / 60 == minute)
			return st->held_tail;
		prev = st->held_tail;
		h = NULL;
	} else {
		for (h = st->held_head; h && h->sec / 60 < minute; h = h->next)
			prev = h;
	}
	if (h && h->sec / 60 == minute)
		return h;
	struct store_batch *nb = calloc(1, sizeof(*nb));
	if (!nb)
		return NULL;
	nb->sec = minute * 60;
	nb->next = h;
	if (prev)
		prev->next = nb;
	else
		st->held_head = nb;
	if (!h)
		st->held_tail = nb;
	return nb;
}

/* Adds one series' delta to its minute: merged into what is held for that
 * series, or copied. A delta that does not decode is dropped, as
 * merge_into drops it. -1 when out of memory. */
static int held_item(struct store *st, struct store_batch *h, const struct store_item *it)
{
	struct slice s;
	uint8_t *blob;
	size_t len, i;

	for (i = 0; i < h->n; i++)
		if (h->items[i].keylen == it->keylen && memcmp(h->items[i].key, it->key, it->keylen) == 0)
			break;
	if (i < h->n) {
		memset(&s, 0, sizeof(s));
		if (slice_decode_merge(&s, h->items[i].blob, h->items[i].len) == -1 ||
		    slice_decode_merge(&s, it->blob, it->len) == -1) {
			slice_release(&s);
			return 0;
		}
		len = slice_encode(&s, &blob);
		slice_release(&s);
		if (!len)
			return -1;
		st->held_bytes = st->held_bytes - h->items[i].len + len;
		free(h->items[i].blob);
		h->items[i].blob = blob;
		h->items[i].len = len;
		return 0;
	}
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 8;
		struct store_item *p = realloc(h->items, cap * sizeof(*p));
		if (!p)
			return -1;
		h->items = p;
		h->cap = cap;
	}
	if (!(blob = malloc(it->len)))
		return -1;
	memcpy(blob, it->blob, it->len);
	h->items[h->n] = *it;
	h->items[h->n].blob = blob;
	h->n++;
	st->held_bytes += it->len;
	return 0;
}

/* Holds the batches of `list` (copies: the ring takes the originals), then
 * keeps the total under HELD_MAX by dropping the oldest minutes. */
static void held_add(struct store *st, const struct store_batch *list)
{
	char sz[32];
	size_t lost = 0;

	pthread_rwlock_wrlock(&st->held_lock);
	for (const struct store_batch *b = list; b; b = b->next) {
		struct store_batch *h = held_minute(st, b->sec / 60);
		for (size_t i = 0; i < b->n; i++)
			if (!h || held_item(st, h, &b->items[i]) == -1)
				lost++;
	}
	while (st->held_bytes > HELD_MAX && st->held_head && st->held_head != st->held_tail) {
		struct store_batch *h = st->held_head;
		st->held_head = h->next;
		held_free_batch(st, h);
		if (st->held_lost++ == 0)
			log_warn(
				"store: %s of unwritten stats are held in memory, the most it keeps; from now on the "
				"oldest minute is dropped for each new one",
				size_text(sz, sizeof(sz), HELD_MAX));
	}
	pthread_rwlock_unlock(&st->held_lock);
	if (lost)
		log_warn("store: out of memory: %zu series delta(s) of stats lost", lost);
}

/* Adds the held minutes in from..to (minute numbers) to `r`. Caller holds
 * held_lock. Held slices keep their load curves: added whole, they give the
 * curves of the window as hour slices would. */
void store_held_query(struct store *st, uint64_t from, uint64_t to, struct store_result *r)
{
	for (const struct store_batch *h = st->held_head; h; h = h->next) {
		uint64_t minute = h->sec / 60;
		if (minute < from || minute > to)
			continue;
		for (size_t i = 0; i < h->n; i++) {
			struct store_series *se = store_result_series(r, h->items[i].key, h->items[i].keylen);
			if (se && slice_decode_merge(&se->slice, h->items[i].blob, h->items[i].len) == -1)
				log_warn("store: undecodable slice held in memory skipped");
		}
	}
}

/* Why a commit failed, for an operator: which limit, and what makes room. */
static void fault_text(struct store *st, int rc, char *out, size_t n)
{
	struct statvfs fs;
	char sz[32];
	uint64_t avail = UINT64_MAX;

	if (statvfs(st->dir, &fs) == 0)
		avail = (uint64_t)fs.f_bavail * fs.f_frsize;
	if (rc == MDB_MAP_FULL)
		snprintf(out, n,
			 "the database reached its size limit of %s (store.max_size); a higher limit or "
			 "shorter retention makes room",
			 size_text(sz, sizeof(sz), st->opt.map_size_max));
	else if (rc == ENOSPC || (rc == EIO && avail < (64u << 10)))
		snprintf(out, n, "its filesystem is full (%s, %s free)", mdb_strerror(rc),
			 size_text(sz, sizeof(sz), avail));
	else if (rc == EDQUOT)
		snprintf(out, n, "the disk quota is used up (%s)", mdb_strerror(rc));
	else if (rc == EFBIG)
		snprintf(out, n, "the file size limit was reached (%s)", mdb_strerror(rc));
	else if (rc == MDB_PANIC)
		snprintf(out, n, "%s; restart tokentap to reopen the database", mdb_strerror(rc));
	else
		snprintf(out, n, "%s", mdb_strerror(rc));
}

/* Commits `list`, growing the map once if it is full. */
static int commit_grow(struct store *st, struct store_batch *list)
{
	int rc = store_commit_batches(st, list);
	if (rc == MDB_MAP_FULL && store_map_grow(st) == 0)
		rc = store_commit_batches(st, list);
	return rc;
}

/* Tries to write what is held; leaves fault mode when that works. With
 * `last` (shutdown), a failure is final and says what is lost. */
void store_held_retry(struct store *st, uint64_t now, bool last)
{
	size_t minutes;
	int rc;

	pthread_rwlock_wrlock(&st->held_lock);
	minutes = held_minutes(st);
	/* an empty commit writes nothing and so proves nothing */
	rc = minutes ? commit_grow(st, st->held_head) : -1;
	if (rc == 0)
		store_held_clear(st);
	pthread_rwlock_unlock(&st->held_lock);
	if (rc == 0) {
		log_msg(st->end_level,
			"store: writing to %s again after %llu s; the %zu minute(s) of stats held in memory are "
			"committed%s",
			st->dir, (unsigned long long)(now - st->fault_since), minutes,
			st->held_lost ? " (older ones were dropped, see above)" : "");
		st->fault = 0;
		return;
	}
	if (last) {
		if (minutes)
			log_error("store: %zu minute(s) of stats held in memory could not be written and are lost: %s",
				  minutes, rc == -1 ? "nothing to write" : mdb_strerror(rc));
		return;
	}
	if (rc != -1)
		log_debug("store: commit retried, still failing: %s", mdb_strerror(rc));
	st->retry_s = st->retry_s * 2 > RETRY_MAX_S ? RETRY_MAX_S : st->retry_s * 2;
	st->retry_at = now + st->retry_s;
}

/* Commits `list`, or holds it in memory while commits fail: a failed commit
 * is said once, with its cause, and retried with backoff; forwarding and
 * the live windows never notice. */
void store_commit_or_hold(struct store *st, struct store_batch *list, uint64_t now)
{
	char why[256];

	if (!st->fault) {
		int rc = commit_grow(st, list);
		if (rc == 0)
			return;
		fault_text(st, rc, why, sizeof(why));
		if (rc != st->said_fault || now - st->said_at >= FAULT_QUIET_S) {
			st->said_fault = rc;
			st->said_at = now;
			st->fault_level = LOG_ERROR;
			st->end_level = LOG_INFO;
		} else {
			st->fault_level = st->end_level = LOG_DEBUG;
		}
		log_msg(st->fault_level,
			"store: cannot commit stats to %s: %s; forwarding goes on, new stats are kept in memory (up to "
			"%u MiB) and served from there, and writing is retried until it succeeds",
			st->dir, why, HELD_MAX >> 20);
		st->fault = rc;
		st->fault_since = now;
		st->held_lost = 0;
		st->retry_s = RETRY_MIN_S;
		st->retry_at = now + RETRY_MIN_S;
	}
	held_add(st, list);
	if (now >= st->retry_at)
		store_held_retry(st, now, false);
}
