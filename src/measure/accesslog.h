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

#include "timeline.h"

struct accesslog;

/* Opens `path` for appending ("-" is stdout). NULL with a message in `err`. */
struct accesslog *accesslog_open(const char *path, char *err, size_t errlen);

/* Writes the record as one line. Failures are logged once, never fatal. */
void accesslog_write(struct accesslog *log, const struct req_record *r);

/* Accepts NULL. */
void accesslog_close(struct accesslog *log);

/* The engine's queue and KV use as last scraped at dispatch (scrape.h), as
 * the access log and /requests/recent show it; null without a scrape. */
json_t *accesslog_engine_json(const struct engine_seen *e);
/* The request's trace id (span: tokentap's span id) in lower-case hex, as
 * the access log and /requests/recent show it; null when it has no trace. */
json_t *accesslog_trace_json(const struct req_record *r, bool span);
