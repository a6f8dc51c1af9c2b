/*
 * admin_recent.c — renders GET /requests/recent from a snapshot of the ring.
 *
 * One object per request, in the access log's vocabulary (same keys, same
 * units) so that a line of either reads the same: identity, outcome, usage,
 * the whole timeline in ms since `arrive` (null where not reached), the
 * derived metrics of record_derive under their X-macro keys, and the ITL
 * summary the ring keeps (count of every gap; mean and max over the gaps
 * the record kept, the first ITL_SAMPLES_MAX).
 */
#include "admin_recent.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "accesslog.h"
#include "classify.h"
#include "timeline.h"

int admin_recent_parse_n(const char *s, size_t max, size_t *out, char *err, size_t errlen)
{
	unsigned long long v;
	char *end;

	if (!s || !*s || strspn(s, "0123456789") != strlen(s))
		goto bad;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < 1 || v > max)
		goto bad;
	*out = (size_t)v;
	return 0;
bad:
	snprintf(err, errlen, "bad value '%.32s' for n: expected a whole number from 1 to %zu", s ? s : "", max);
	return -1;
}

/* Milliseconds to the microsecond, as the access log writes them; null for
 * NaN (not applicable, not reached). */
static json_t *ms_json(double ms)
{
	return isnan(ms) ? json_null() : json_real(round(ms * 1000.0) / 1000.0);
}

static json_t *count_or_null(int64_t v)
{
	return v < 0 ? json_null() : json_integer(v);
}

static json_t *str_or_null(const char *s)
{
	return s && *s ? json_string(s) : json_null();
}

static json_t *u64_json(uint64_t v)
{
	return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

/* "2026-11-29T18:56:44.123Z" from unix milliseconds. */
static json_t *iso_ms(uint64_t unix_ms)
{
	char buf[40];
	time_t t = (time_t)(unix_ms / 1000);
	struct tm tm;
	size_t n;

	if (!gmtime_r(&t, &tm) || !(n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm)))
		return json_null();
	snprintf(buf + n, sizeof(buf) - n, ".%03uZ", (unsigned)(unix_ms % 1000));
	return json_string(buf);
}

/* Adds `v` under `key`, null when its allocation failed. */
static void put(json_t *o, const char *key, json_t *v)
{
	json_object_set_new(o, key, v ? v : json_null());
}

static json_t *entry_json(const struct recent_entry *e)
{
	const struct req_record *r = &e->rec;
	const uint64_t t0 = r->at[TL_ARRIVE];
	double m[RM__COUNT];
	json_t *o = json_object(), *tl, *itl;

	if (!o)
		return NULL;
	record_derive(r, m);
	put(o, "id", json_string(r->id));
	put(o, "trace_id", accesslog_trace_json(r, false));
	put(o, "span_id", accesslog_trace_json(r, true));
	put(o, "finished", iso_ms(e->unix_ms));
	put(o, "method", json_string(r->method));
	put(o, "path", json_string(r->path));
	put(o, "api", json_string(classify_api_name(r->api)));
	put(o, "model", str_or_null(r->model));
	put(o, "upstream", str_or_null(r->upstream));
	put(o, "pick", str_or_null(r->pick));
	put(o, "pick_predicted_ttft_ms", r->pick && r->pick_pred_ms > 0 ? json_real(r->pick_pred_ms) : json_null());
	put(o, "pick_prefix_blocks", json_integer(r->pick_blocks));
	put(o, "stream", r->stream < 0 ? json_null() : json_boolean(r->stream));
	put(o, "status", json_integer(r->status));
	put(o, "error", r->error == REQ_ERR_NONE ? json_null() : json_string(req_error_name(r->error)));
	put(o, "input_tokens", count_or_null(r->usage.input_tokens));
	put(o, "output_tokens", count_or_null(r->usage.output_tokens));
	put(o, "cached_tokens", count_or_null(r->usage.cached_tokens));
	put(o, "cache_write_tokens", count_or_null(r->usage.cache_write_tokens));
	put(o, "reasoning_tokens", count_or_null(r->usage.reasoning_tokens));
	put(o, "server_timing", str_or_null(classify_server_name(r->usage.server.source)));
	put(o, "engine", accesslog_engine_json(&r->engine));
	put(o, "token_events", u64_json(r->token_events));
	put(o, "reasoning_events", u64_json(r->reasoning_events));
	put(o, "tool_call_events", u64_json(r->tool_call_events));
	put(o, "events", u64_json(r->events));
	put(o, "bytes_in", u64_json(r->bytes_in));
	put(o, "bytes_out", u64_json(r->bytes_out));
	put(o, "cold", json_boolean(e->cold));
	put(o, "inflight", json_integer((json_int_t)e->load));

	tl = json_object();
	for (int i = 0; i < TL__COUNT && tl; i++) {
		uint64_t at = r->at[i];
		double v = at && t0 && at >= t0 ? (double)(at - t0) / 1e6 : NAN;
		put(tl, timeline_event_name((enum tl_event)i), ms_json(v));
	}
	put(o, "timeline_ms", tl);

	for (int i = 0; i < RM__COUNT; i++)
		put(o, req_metric_key((enum req_metric)i), ms_json(m[i]));

	itl = json_object();
	if (itl) {
		put(itl, "count", u64_json(r->itl_total));
		put(itl, "mean_ms", ms_json(e->itl_mean_ms));
		put(itl, "max_ms", ms_json(e->itl_max_ms));
	}
	put(o, "itl", itl);
	return o;
}

char *admin_recent_render(const struct recent_entry *e, size_t n, size_t capacity)
{
	json_t *root = json_object(), *arr = json_array();
	char *text = NULL;

	if (!root || !arr)
		goto out;
	put(root, "capacity", json_integer((json_int_t)capacity));
	put(root, "n", json_integer((json_int_t)n));
	for (size_t i = 0; i < n; i++) {
		json_t *o = entry_json(&e[i]);
		if (!o || json_array_append_new(arr, o) == -1)
			goto out;
	}
	json_object_set(root, "requests", arr);
	text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
out:
	json_decref(arr);
	json_decref(root);
	return text;
}
