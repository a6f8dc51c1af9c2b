/*
 * store.h — where the numbers live: per-second slices in memory, per-minute,
 * per-hour and all-time slices in LMDB, and the window queries over them;
 * and, for /metrics, a lifetime total per series in memory that only grows.
 *
 * Workers hand in batches of encoded series deltas (store_submit, once per
 * flush interval each). One writer thread owns every LMDB write: it merges a
 * batch into the minute, hour and all-time slices of each series in a single
 * write transaction, keeps the batch in the in-memory ring of per-second
 * slices for the live windows, and prunes slices past their retention.
 * Queries run on any thread with short read transactions. Nothing here ever
 * blocks or fails forwarding: a store that cannot write (map at its limit,
 * disk full) says why once, holds new stats in memory, bounded, answers
 * queries from there too, and retries until a commit succeeds.
 *
 * At start-up, a data.mdb that does not read back (docs/storage.md, "Store
 * faults") is renamed to data.mdb.corrupt-<unix time> and the store starts
 * empty, so that a damaged file never makes tokentap crash in a loop.
 *
 * On-disk layout version 2 (docs/storage.md): named databases "meta"
 * (layout version), "series" (serialized series key -> u32 id),
 * "series_by_id" (id -> key) and "slices" (kind 'm'|'h'|'a', u32 big-endian
 * minute or hour number, u32 big-endian series id -> encoded slice; kind
 * 'd', u32 big-endian day number, series id -> that day's hour slices of
 * the series, packed once no 1h or 24h window reads them).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "series_key.h"
#include "slice.h"

struct store_item {
	char key[SERIES_KEY_MAX];
	size_t keylen;
	uint8_t *blob;
	size_t len;
};

/* Deltas of one flush interval from one worker. Owned by whoever holds it:
 * the shard builds it, store_submit takes it. */
struct store_batch {
	uint64_t sec; /* unix time of the flush */
	size_t n, cap;
	struct store_item *items;
	struct store_batch *next;
};

struct store_options {
	const char *dir; /* NULL: memory only (live windows, no persistence) */
	uint64_t minute_retention_s;
	uint64_t hour_retention_s;
	uint64_t map_size;	/* initial LMDB map size; grows when full ... */
	uint64_t map_size_max;	/* ... up to this (store.max_size, default 64g) */
	uint64_t prune_every_s; /* how often old slices are looked for */
	unsigned pack_per_pass; /* day packs one pass rewrites at most (0: no bound); the rest at the next flushes */
	bool set_aside_corrupt; /* move a corrupt data.mdb aside (default) or fail */
};

enum store_window { WIN_1M, WIN_5M, WIN_1H, WIN_24H, WIN_7D, WIN_ALL, WIN__COUNT };

struct store_series {
	char key[SERIES_KEY_MAX];
	size_t keylen;
	struct slice slice;
};

struct store_result {
	uint64_t start_sec, end_sec; /* the period the merged slices cover */
	size_t n, cap;
	struct store_series *series;
};

/* The defaults, those of struct config where it has the setting. */
void store_options_defaults(struct store_options *o);

/* Opens (creating) the data directory, refuses one in use by another
 * tokentap or written in another layout, moves a corrupt database aside
 * (or, without set_aside_corrupt, refuses it), and starts the writer. */
struct store *store_open(const struct store_options *o, char *err, size_t errlen);

/* Stops the writer after it has committed everything submitted; while
 * commits fail, after one last try that says what is lost. NULL ok. */
void store_close(struct store *st);

/* Queues a batch for the writer; never blocks on I/O. Takes ownership. */
void store_submit(struct store *st, struct store_batch *b);
void store_batch_free(struct store_batch *b);

/* Merged slices per series for a window ending now. 0, or -1 with `err`. */
int store_query(struct store *st, enum store_window w, struct store_result *out, char *err, size_t errlen);
void store_result_free(struct store_result *r);

/* The series of `key` in `r`, added empty when new; NULL when out of memory
 * or when the key is longer than SERIES_KEY_MAX. */
struct store_series *store_result_series(struct store_result *r, const char *key, size_t keylen);

/* Merged slices per series over the seconds [from, to] (unix time) of the
 * in-memory per-second ring, which holds about the last six minutes
 * (STORE_RING_SECONDS; older seconds give nothing): the live history the
 * dashboard opens with (/stats/history). start_sec, end_sec are from, to.
 * 0, or -1 when out of memory. */
#define STORE_RING_SECONDS 360
int store_query_range(struct store *st, uint64_t from, uint64_t to, struct store_result *out);

/* Everything submitted since the store opened, merged per series: the
 * counters and per-request metric histograms /metrics exposes (no load
 * curves), which only ever grow (store_reset and the windows' retention
 * leave them be; a restart starts them at zero). start_sec is when the
 * store opened. 0, or -1 when out of memory. */
int store_query_lifetime(struct store *st, struct store_result *out);

/* Forgets every stored slice (admin reset); the lifetime counts stay.
 * 0, or -1 with `err`. */
int store_reset(struct store *st, char *err, size_t errlen);

/* Reads every stored slice and series; counts those that decode and those
 * that do not. 0, or -1 with `err` when the database cannot be read. */
int store_verify(struct store *st, uint64_t *series, uint64_t *slices, uint64_t *bad, char *err, size_t errlen);

/* Blocks until every batch submitted so far is committed (tests, shutdown). */
void store_sync(struct store *st);

int store_window_parse(const char *s, enum store_window *w);
const char *store_window_name(enum store_window w);
