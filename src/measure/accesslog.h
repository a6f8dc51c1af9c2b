/*
 * accesslog.h — one JSON line per finished request.
 *
 * The line holds the request id, what was asked (method, path, API, model),
 * what came back (status, error kind, usage) and the whole timeline, in
 * milliseconds since the request's first byte, plus every ITL gap. Field
 * reference: docs/metrics.md.
 */
#pragma once

#include <jansson.h>

#include "recent.h"
#include "timeline.h"

struct accesslog;

/* Opens `path` for appending ("-" is stdout). NULL with a message in `err`. */
struct accesslog *accesslog_open(const char *path, char *err, size_t errlen);

/* Writes the record as one line. Failures are logged once, never fatal. */
void accesslog_write(struct accesslog *log, const struct req_record *r);

/* Accepts NULL. */
void accesslog_close(struct accesslog *log);

/* One request as JSON, for both of its readers, made from RECORD_FIELDS
 * in accesslog.c: with `e` NULL, the access log's object (its time "ts" now,
 * the ITL gaps kept); with `e` (the ring's copy of `r`), the object of
 * GET /requests/recent (finished, cold, inflight, the ITL summary), in that
 * answer's key order. NULL when out of memory. */
json_t *record_json(const struct req_record *r, const struct recent_entry *e);
