/*
 * store_int.h — the store's insides, shared by store.c (the writer, the
 * ring, open and close), store_query.c (the window queries), store_held.c
 * (stats held in memory while commits fail) and store_pack.c (the day
 * packs), and by no other file: tokentap's modules use store.h.
 *
 * What crosses the files: struct store itself; the key of a stored slice;
 * the stored-value container ('r' as is, 'z' deflated), which store.c
 * writes for slices and store_pack.c for packs; growing the map when a
 * commit finds it full; committing a batch list; adding a series to a
 * result; committing or holding, and the held minutes a query adds; and
 * reading a day pack (queries and store_verify) and the writer's pack pass.
 */
#pragma once

#include <lmdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "log.h"
#include "slice.h"
#include "store.h"

#define RING_SECONDS STORE_RING_SECONDS /* the live view: a little over five minutes */
#define WEEK_HOURS 168			/* the 7d window: this hour and the 167 before it */

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
	} * ids;
	size_t n_ids, cap_ids;
	uint32_t next_id;

	pthread_mutex_t ring_lock;
	struct ring_slot ring[RING_SECONDS];

	/* Every batch since the store opened, merged per series: what
	 * /metrics exposes. Neither pruning, the ring's turn nor a reset takes
	 * anything from it. The writer adds under life_lock; queries copy. */
	pthread_mutex_t life_lock;
	struct store_result life;
	uint64_t life_since;
	struct slice life_scratch; /* writer thread only: a delta decoded */

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

	/* While commits fail: what could not be written, one batch per minute
	 * (items merged per series), oldest first. The writer changes it under
	 * held_lock for writing; queries read it under held_lock for reading. */
	pthread_rwlock_t held_lock;
	struct store_batch *held_head, *held_tail;
	size_t held_bytes;
	/* writer thread only */
	int fault; /* what the first failed commit said; 0 while commits succeed */
	uint64_t fault_since, retry_at, retry_s, held_lost;
	/* A store at its limit can flap (pruning frees a little, the next
	 * minute takes it): a fault is said at level error, and its end at
	 * info, only when it differs from the last one said or that was
	 * FAULT_QUIET_S ago; otherwise at debug. */
	int said_fault;
	uint64_t said_at;
	enum log_level fault_level, end_level;

	/* day packs, writer thread only: see store_pack.c */
	uint32_t pack_trimmed, pack_stripped;
	uint32_t pack_trim_at, pack_trim_from; /* a trim cut short: see pack_state */
	bool pack_more;			       /* the last pass left work: go on at the next flush */
	int pack_said;			       /* the last failure said, 0 after a pass that worked */
};

/* ---- keys: kind, u32 big-endian minute, hour or day, u32 big-endian series id ---- */

static inline void be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void slice_key(uint8_t out[9], char kind, uint32_t t, uint32_t id)
{
	out[0] = (uint8_t)kind;
	be32(out + 1, t);
	be32(out + 5, id);
}

static inline uint64_t unix_now(void)
{
	return (uint64_t)time(NULL);
}

/* ---- store.c ---- */

/* The stored value of `raw` (`n` bytes), after `lead` bytes left for the
 * caller; *outlen counts them. NULL when out of memory. */
uint8_t *store_value_pack(const uint8_t *raw, size_t n, size_t lead, size_t *outlen);

/* The bytes a stored value holds: in place for 'r', inflated into *owned
 * (the caller frees it) for 'z'. -1 when it does not unpack. */
int store_value_raw(const uint8_t *v, size_t n, const uint8_t **raw, size_t *rawlen, uint8_t **owned);

/* Decodes a stored value into `dst` (adding). -1 when it does not decode. */
int store_value_merge(struct slice *dst, const uint8_t *v, size_t n);

/* Doubles the map, up to map_size_max: 0, MDB_MAP_FULL once there, or
 * LMDB's error. Writer thread, no transaction of the caller's open. */
int store_map_grow(struct store *st);

/* Writes every batch of `list` in one write transaction: 0, or LMDB's
 * error (nothing written). Writer thread. */
int store_commit_batches(struct store *st, struct store_batch *list);

/* When `rc` is an LMDB error, says it into `err` as "store: WHAT: why".
 * Returns `rc`. */
int store_check_rc(int rc, const char *what, char *err, size_t errlen);

/* ---- store_held.c ---- */

/* Commits `list`, or holds it in memory while commits fail: a failed commit
 * is said once, with its cause, and retried with backoff. Writer thread. */
void store_commit_or_hold(struct store *st, struct store_batch *list, uint64_t now);

/* Tries to write what is held; leaves fault mode when that works. With
 * `last` (shutdown), a failure is final and says what is lost. Writer
 * thread. */
void store_held_retry(struct store *st, uint64_t now, bool last);

/* Frees everything held. Caller holds held_lock for writing (or is the
 * last user of the store). */
void store_held_clear(struct store *st);

/* Adds the held minutes in from..to (minute numbers) to `r`. Caller holds
 * held_lock. */
void store_held_query(struct store *st, uint64_t from, uint64_t to, struct store_result *r);

/* ---- store_pack.c ---- */

/* A day pack read back: the hour slices of one series and day. */
struct pack {
	uint8_t flags;
	unsigned n;
	struct pack_entry {
		unsigned hour; /* of the day */
		const uint8_t *p;
		size_t len;
	} e[24];
	uint8_t *raw; /* owned: the entries point into it */
};

/* Reads a stored pack into `pk` (a copy: it outlives the transaction's next
 * write). -1, with `pk` empty, when it does not decode. */
int store_pack_parse(const uint8_t *v, size_t n, struct pack *pk);
void store_pack_free(struct pack *pk);

/* The writer's pack pass: packs what is due, up to pack_per_pass packs, in
 * its own write transaction, or nothing; sets st->pack_more when work is
 * left. A failure is said once per cause and tried again later. */
void store_pack_run(struct store *st, uint64_t now);
