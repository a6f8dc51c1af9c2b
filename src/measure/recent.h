/*
 * recent.h — the last finished requests, for GET /requests/recent.
 *
 * A fixed-size ring of copies, written by workers as each request is logged
 * and read by the admin thread; one short mutex hold per request (a memcpy),
 * never an allocation. Per-gap ITL samples are not kept, only their count,
 * mean and maximum.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "timeline.h"

struct recent_entry {
	struct req_record rec; /* itl_ns is always NULL here */
	uint64_t unix_ms;      /* wall clock when it finished */
	unsigned load;	       /* requests on or queued for its upstream when it was routed, itself included */
	bool cold;
	double itl_mean_ms, itl_max_ms; /* over the gaps the record kept; NaN when none */
};

struct recent;

/* NULL when out of memory. */
struct recent *recent_new(size_t capacity);
void recent_free(struct recent *rc);

void recent_push(struct recent *rc, const struct req_record *r, unsigned load, bool cold);

/* The ring's size, fixed at recent_new; 0 for NULL. */
size_t recent_capacity(const struct recent *rc);

/* Copies up to `n` entries, newest first; returns how many. */
size_t recent_snapshot(struct recent *rc, struct recent_entry *out, size_t n);
