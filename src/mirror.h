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
 * Ownership: the mirror owns itself and frees itself when its exchange
 * ends. The primary request holds a pointer that the mirror clears (through
 * `owner`) when it goes first; the primary detaches when it is done.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct event_base;
struct evbuffer;
struct upstream;
struct stats_shard;
struct accesslog;
struct meter;

#define MIRROR_PENDING_MAX (1u << 20)

struct mirror;

/* The mirrors in flight, so that shutdown can end them. Owned by the
 * proxy; mirrors add and remove themselves. */
struct mirror_list {
	struct mirror *head;
};

struct mirror_env {
	struct event_base *base;
	struct stats_shard *stats;
	struct accesslog *alog;
	size_t max_event_size;
	struct mirror_list *list;
};

/* Ends every mirror still in flight, unrecorded (shutdown). */
void mirror_abort_all(struct mirror_list *list);

/* Starts a shadow exchange of the request `primary` measures (its id,
 * method, path, API and model; the two meters are paired, paired.h) on `up`, with `bytes` (head and body so far;
 * their contents are moved). NULL when the shadow is skipped: no free slot,
 * `max_in_flight` requests already running on `up` (every worker's), no
 * connection. A skip for want of room counts in up->rejected. `*owner` is
 * cleared when the mirror ends before the primary detaches. */
struct mirror *mirror_start(const struct mirror_env *env, struct upstream *up, const char *route,
			    unsigned max_in_flight, struct meter *primary, struct evbuffer *bytes,
			    struct mirror **owner);

/* More request bytes, exactly as the primary sends them. May end the
 * mirror (it fell behind): the owner's pointer is then cleared. */
void mirror_feed(struct mirror *m, const void *data, size_t len);

/* The request body is complete: the shadow's first-byte clock may start. */
void mirror_body_done(struct mirror *m);

/* The primary is done with the mirror. When the request body was not
 * complete (`complete` false) the shadow request cannot be finished either,
 * and is aborted. */
void mirror_detach(struct mirror *m, bool complete);
