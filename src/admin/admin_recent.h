/*
 * admin_recent.h — the JSON of GET /requests/recent: the last finished
 * requests' full timelines, from a snapshot of the recent ring.
 *
 * Pure functions: no I/O, no lock, no clock, so they run on the admin thread
 * and in unit tests alike. Keys of timeline events, derived metrics and
 * error kinds come from the X-macro lists in timeline.h.
 */
#pragma once

#include <stddef.h>

#include "recent.h"

/* Requests shown when the query names no `n`. */
#define RECENT_DEFAULT_N 50

/*
 * Parses the `n` parameter: a decimal integer from 1 to `max`, nothing else
 * (no sign, no spaces, no suffix). 0, or -1 with a message for the caller's
 * 400 answer in `err`.
 */
int admin_recent_parse_n(const char *s, size_t max, size_t *out, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/*
 * The answer for `n` entries, newest first, as recent_snapshot returns them;
 * `capacity` is the ring's size, shown so a reader knows how far back it can
 * ask. Malloc'd, NUL-terminated; NULL when out of memory.
 */
char *admin_recent_render(const struct recent_entry *e, size_t n, size_t capacity);
