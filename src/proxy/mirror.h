/*
 * mirror.h — shadow copies of requests, sent to another upstream, measured
 * under that upstream's own series and discarded.
 *
 * A route may mirror a percentage of its requests to a shadow upstream. The
 * shadow gets the same head and body bytes as they arrive, on a connection
 * of its own; its response is parsed, timed and classified like any other
 * (so /compare can lay it beside the primary on the same requests), then
 * dropped. It never delays or fails the primary: it takes an admission slot
 * only when one is free at once and the shadow runs fewer than the route's
 * mirror.max_in_flight requests, and if it falls behind by more than
 * MIRROR_PENDING_MAX bytes of request it is abandoned, never buffered
 * without bound. Its failures count against its own series only.
 *
 * The shadow is an exchange (exchange.h, `shadow`) whose owner is the
 * mirror: the same connect, send, read path and meter as a primary's.
 *
 * Ownership: the mirror owns itself and frees itself when its exchange
 * ends. The primary request holds a pointer that the mirror clears (through
 * `owner`) when it goes first; the primary detaches when it is done.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include <stdint.h>

struct evbuffer;
struct exchange_env;
struct meter;
struct reqhead;
struct upstream;

#define MIRROR_PENDING_MAX (1u << 20)

struct mirror;

/* The mirrors in flight, so that shutdown can end them. Owned by the
 * proxy; mirrors add and remove themselves. */
struct mirror_list {
	struct mirror *head;
};

struct mirror_env {
	const struct exchange_env *x; /* the primaries' (the proxy's) */
	struct mirror_list *list;
	uint64_t log_id; /* the primary's connection, for the log */
};

/* Ends every mirror still in flight, unrecorded (shutdown). */
void mirror_abort_all(struct mirror_list *list);

/* Starts a shadow exchange of the request `primary` measures (its id,
 * method, path, API and model; the two meters are paired, paired.h) and
 * whose parsed head is `head` (its method and version, read at once) on
 * `up`, with `bytes` (head and body so far; their contents are moved). NULL
 * when the shadow is skipped: no free slot, `max_in_flight` requests
 * already running on `up` (every worker's), out of memory, no connection. A
 * skip for want of room counts in up->rejected. `*owner` is cleared when the
 * mirror ends before the primary detaches. */
struct mirror *mirror_start(const struct mirror_env *env, struct upstream *up, const char *route,
			    unsigned max_in_flight, struct meter *primary, const struct reqhead *head,
			    struct evbuffer *bytes, struct mirror **owner);

/* More request bytes, exactly as the primary sends them; they go out at
 * the next mirror_flush. May end the mirror, unrecorded (it fell behind,
 * or the copy failed for want of memory): the owner's pointer is then
 * cleared. */
void mirror_feed(struct mirror *m, const void *data, size_t len);
/* Sends what mirror_feed gave. May end the mirror (the owner's pointer is
 * then cleared). */
void mirror_flush(struct mirror *m);

/* The request body is complete: the shadow's first-byte clock may start. */
void mirror_body_done(struct mirror *m);

/* The primary is done with the mirror. When the request body was not
 * complete (`complete` false) the shadow request cannot be finished either,
 * and is aborted. */
void mirror_detach(struct mirror *m, bool complete);
