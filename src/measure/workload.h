/*
 * workload.h — capturing the live workload as a trace (docs/workload.md).
 *
 * Off unless `--workload PATH` / `workload.path` is set. Each finished
 * primary request becomes one JSON line with the Mooncake trace fields
 * (`timestamp`, `input_length`, `output_length`, `hash_ids`) and tokentap's
 * extras beside them.
 *
 * The prompt text of a request body (the string values under `content`,
 * `text`, `prompt`, `input`, `system`) is hashed as it streams through
 * request.c, without a copy of the body: cut into blocks of `block_bytes` and
 * hashed as a chain (each block's hash covers the salt, the previous block's
 * hash and its own bytes), so two requests sharing a prefix share their
 * first hashes. The salt is random per capture and never written. The
 * writer thread numbers the hashes in order of first appearance; those
 * numbers are the `hash_ids` written.
 *
 * Writing is off the forwarding path: workload_record copies the record
 * into a bounded queue and returns; a writer thread drains it. A full queue,
 * a full disk or an unwritable path drops records, counted, with a
 * rate-limited warning; a worker never waits on the disk.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct req_record;

/* Defaults and bounds, documented in docs/workload.md. */
#define WL_BYTES_PER_TOKEN 4	       /* the approximation behind block_bytes */
#define WL_HASHES_MAX 16384	       /* blocks hashed per request; the rest of a longer prompt is not */
#define WL_QUEUE_MAX 4096	       /* records waiting for the writer */
#define WL_SUMMARY_WINDOW 4096	       /* records the summary's distributions are over */
#define WL_TURN_SLOTS 32768	       /* conversations whose last turn the capture remembers (a power of two) */
#define WL_GROUPS_MAX 64	       /* the summary's groups: 63 (route, model) pairs and "(other)" */
#define WL_SERIES_SLOTS 240	       /* the arrival series' slots: its step grows as the capture ages */
#define WL_HASH_IDS_DEFAULT (1u << 20) /* workload.max_hash_ids' default */
/* The largest max_tokens recorded: the largest integer a reader of the
 * trace in double precision keeps exact; a larger one is absent. */
#define WL_MAX_TOKENS_MAX (((int64_t)1 << 53) - 1)

struct workload_options {
	const char *path;
	uint64_t max_size;	/* bytes per file before it is rotated */
	unsigned max_files;	/* files kept, the one being written included */
	unsigned block_tokens;	/* block size in tokens (block_bytes = block_tokens * WL_BYTES_PER_TOKEN) */
	uint64_t group_idle_ms; /* the summary: a (route, model) pair idle this long may lose its group; 0: never */
	unsigned max_hash_ids;	/* hashes remembered for their ids; 0: WL_HASH_IDS_DEFAULT */
};

/* Starts the capture (the process has one) and its writer thread. The file
 * is opened by the writer: an unwritable path is reported there, and the
 * proxy runs on. Returns -1 with `err` only when the thread cannot start. */
int workload_open(const struct workload_options *o, char *err, size_t errlen) __attribute__((warn_unused_result));

/* Writes what is queued, stops the writer; safe without a capture. */
void workload_close(void);

/* Whether a capture runs. */
bool workload_active(void);

/* The summary GET /workload answers, as JSON text (free() it; NULL: out of
 * memory): {"capturing": false} without a capture; else the capture's
 * counters (records, drops by reason, the last write error, the hash ids
 * remembered and forgotten) and, for the
 * records of `route` and `model` (NULL: any), lifetime counts (records,
 * stream and cached-token shares, prefix blocks shared with an earlier
 * request, arrivals per step since the capture began) and, over the last
 * WL_SUMMARY_WINDOW records written, the arrival rate, the coefficient of
 * variation of inter-arrival gaps, the prompt / output length and
 * concurrency-at-arrival distributions; then the same per route and per
 * model (by_route, by_model). docs/workload.md has the fields. Any thread;
 * bounded work: O(WL_SUMMARY_WINDOW log) per route and model listed. */
char *workload_summary_json(const char *route, const char *model);

/* The capture's counters for /metrics: lines written, records lost by
 * reason and block ids not remembered (tokentap_workload_written_total,
 * tokentap_workload_dropped_total, tokentap_workload_hash_ids_forgotten_total).
 * False without a capture. Any thread. */
enum wl_drop {
	WL_DROP_QUEUE_FULL,
	WL_DROP_NO_SPACE,
	WL_DROP_WRITE_ERROR,
	WL_DROP_OPEN_ERROR,
	WL_DROP_TOO_LARGE, /* a line longer than max_size: no file may hold it */
	WL_DROP__COUNT
};
struct workload_counts {
	uint64_t written;
	uint64_t dropped[WL_DROP__COUNT];
	uint64_t hash_ids_forgotten; /* block ids given past workload.max_hash_ids */
};
extern const char *const workload_drop_reasons[WL_DROP__COUNT]; /* "queue_full", … */
bool workload_counts(struct workload_counts *c);

/* ---- per request ---- */

struct wl_req;

/* Request body bytes, in order, as they are forwarded: their prompt text is
 * hashed. `*slot` is allocated at the first call (nothing when no capture
 * runs); bounded work per byte. */
void workload_feed(struct wl_req **slot, const char *at, size_t len);

void workload_req_free(struct wl_req *w);

/* A finished primary request: its record is queued for the writer (or
 * counted as dropped). `w` may be NULL (no body). */
void workload_record(const struct req_record *rec, struct wl_req *w, const char *route, const char *upstream);

/* ---- the parts, for tests ---- */

/* The scan and hash chain of one request body, with a given salt. */
struct wl_req *wl_req_new(const uint8_t salt[16], size_t block_bytes);
void wl_req_feed(struct wl_req *w, const char *at, size_t len);
/* The chain's hashes so far, the last partial block included. */
size_t wl_req_hashes(struct wl_req *w, const uint64_t **out);
int64_t wl_req_max_tokens(const struct wl_req *w); /* -1: not asked */
uint64_t wl_req_prompt_bytes(const struct wl_req *w);
/* The chain's hash through the end of the first message whose role is
 * "user" (an object with "role": "user" and prompt text of its own:
 * every prompt byte up to there, its own text and separator included, the
 * open block's part too), and the prompt bytes it covers. False when no
 * such message has ended in what was fed, or the chain stopped before it. */
bool wl_req_first_turn(const struct wl_req *w, uint64_t *hash, uint64_t *bytes);
/* Whether that message has ended (the hash may still be missing). */
bool wl_req_first_turn_seen(const struct wl_req *w);

/* Hash → id in order of first appearance (ids from 0), remembering up to
 * `max` hashes (0: WL_HASH_IDS_DEFAULT); past it a new hash gets a new id
 * each time it is met, counted as forgotten. */
struct wl_ids;
struct wl_ids *wl_ids_new(size_t max);
void wl_ids_free(struct wl_ids *t);
uint64_t wl_ids_get(struct wl_ids *t, uint64_t hash);
size_t wl_ids_count(const struct wl_ids *t);	   /* hashes remembered */
uint64_t wl_ids_forgotten(const struct wl_ids *t); /* ids given to hashes not remembered */
