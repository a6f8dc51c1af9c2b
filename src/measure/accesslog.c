/*
 * accesslog.c — JSON lines, built with jansson, one write(2) each so lines
 * stay whole when several workers share the file.
 */
#include "accesslog.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

struct accesslog {
	int fd;
	int owns_fd;
	int failed; /* a write failed: said once, not per line */
};

struct accesslog *accesslog_open(const char *path, char *err, size_t errlen)
{
	struct accesslog *log = calloc(1, sizeof(*log));

	if (!log) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (strcmp(path, "-") == 0) {
		log->fd = STDOUT_FILENO;
		return log;
	}
	log->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (log->fd == -1) {
		snprintf(err, errlen, "access log %s: %s", path, strerror(errno));
		free(log);
		return NULL;
	}
	log->owns_fd = 1;
	return log;
}

void accesslog_close(struct accesslog *log)
{
	if (!log)
		return;
	if (log->owns_fd)
		close(log->fd);
	free(log);
}

/* Milliseconds with microsecond precision; null when not applicable. */
static json_t *ms_or_null(double ms)
{
	if (isnan(ms))
		return json_null();
	return json_real(round(ms * 1000.0) / 1000.0);
}

static json_t *int_or_null(int64_t v)
{
	return v < 0 ? json_null() : json_integer(v);
}

static json_t *str_or_null(const char *s)
{
	return s && *s ? json_string(s) : json_null();
}

static void iso_time(char *buf, size_t len)
{
	struct timeval tv;
	struct tm tm;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, len - n, ".%06ldZ", (long)tv.tv_usec);
}

json_t *accesslog_engine_json(const struct engine_seen *e)
{
	if (!e->known)
		return json_null();
	return json_pack("{s:o,s:o,s:o,s:I}", "running", e->running < 0 ? json_null() : json_integer(e->running),
			 "waiting", e->waiting < 0 ? json_null() : json_integer(e->waiting), "kv_use",
			 e->kv_use != e->kv_use ? json_null() : json_real(e->kv_use), "age_ms", (json_int_t)e->age_ms);
}

json_t *accesslog_trace_json(const struct req_record *r, bool span)
{
	char hex[33];

	if (!r->traced)
		return json_null();
	if (span)
		tracectx_hex(r->trace.span_id, sizeof(r->trace.span_id), hex);
	else
		tracectx_hex(r->trace.trace_id, sizeof(r->trace.trace_id), hex);
	return json_string(hex);
}

static json_t *record_to_json(const struct req_record *r)
{
	double m[RM__COUNT];
	char ts[40];
	json_t *o = json_object(), *tl = json_object(), *itl = json_array();
	uint64_t t0 = r->at[TL_ARRIVE];

	record_derive(r, m);
	iso_time(ts, sizeof(ts));
	json_object_set_new(o, "ts", json_string(ts));
	json_object_set_new(o, "id", json_string(r->id));
	json_object_set_new(o, "trace_id", accesslog_trace_json(r, false));
	json_object_set_new(o, "span_id", accesslog_trace_json(r, true));
	json_object_set_new(o, "method", json_string(r->method));
	json_object_set_new(o, "path", json_string(r->path));
	json_object_set_new(o, "api", json_string(classify_api_name(r->api)));
	json_object_set_new(o, "upstream", str_or_null(r->upstream));
	json_object_set_new(o, "pick", str_or_null(r->pick));
	json_object_set_new(o, "pick_predicted_ttft_ms",
			    r->pick && r->pick_pred_ms > 0 ? json_real(r->pick_pred_ms) : json_null());
	json_object_set_new(o, "pick_prefix_blocks", json_integer(r->pick_blocks));
	if (r->mirror)
		json_object_set_new(o, "mirror", json_true());
	json_object_set_new(o, "model", str_or_null(r->model));
	json_object_set_new(o, "stream", r->stream < 0 ? json_null() : json_boolean(r->stream));
	json_object_set_new(o, "status", json_integer(r->status));
	json_object_set_new(o, "error", r->error == REQ_ERR_NONE ? json_null() : json_string(req_error_name(r->error)));
	json_object_set_new(o, "input_tokens", int_or_null(r->usage.input_tokens));
	json_object_set_new(o, "output_tokens", int_or_null(r->usage.output_tokens));
	json_object_set_new(o, "cached_tokens", int_or_null(r->usage.cached_tokens));
	json_object_set_new(o, "cache_write_tokens", int_or_null(r->usage.cache_write_tokens));
	json_object_set_new(o, "reasoning_tokens", int_or_null(r->usage.reasoning_tokens));
	json_object_set_new(o, "server_timing", str_or_null(classify_server_name(r->usage.server.source)));
	json_object_set_new(o, "engine", accesslog_engine_json(&r->engine));
	if (r->deadline_ms) {
		json_object_set_new(o, "deadline_missed", json_integer(r->deadline_missed));
		json_object_set_new(o, "deadline_failovers", json_integer(r->deadline_failovers));
	}
	json_object_set_new(o, "events", json_integer((json_int_t)r->events));
	json_object_set_new(o, "token_events", json_integer((json_int_t)r->token_events));
	json_object_set_new(o, "reasoning_events", json_integer((json_int_t)r->reasoning_events));
	json_object_set_new(o, "tool_call_events", json_integer((json_int_t)r->tool_call_events));
	json_object_set_new(o, "inputs", int_or_null(r->inputs));
	json_object_set_new(o, "bytes_in", json_integer((json_int_t)r->bytes_in));
	json_object_set_new(o, "bytes_out", json_integer((json_int_t)r->bytes_out));
	for (int i = 0; i < RM__COUNT; i++)
		json_object_set_new(o, req_metric_key((enum req_metric)i), ms_or_null(m[i]));
	for (size_t i = 0; i < r->itl_n; i++)
		json_array_append_new(itl, json_real(round((double)r->itl_ns[i] / 1e3) / 1e3));
	json_object_set_new(o, "itl_ms", itl);
	json_object_set_new(o, "itl_count", json_integer((json_int_t)r->itl_total));
	for (int e = 0; e < TL__COUNT; e++) {
		double v = r->at[e] && t0 && r->at[e] >= t0 ? (double)(r->at[e] - t0) / 1e6 : NAN;
		json_object_set_new(tl, timeline_event_name((enum tl_event)e), ms_or_null(v));
	}
	json_object_set_new(o, "timeline_ms", tl);
	return o;
}

void accesslog_write(struct accesslog *log, const struct req_record *r)
{
	json_t *o;
	char *line;
	size_t len;

	if (!log)
		return;
	o = record_to_json(r);
	line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
	json_decref(o);
	if (!line)
		return;
	len = strlen(line);
	line[len] = '\n'; /* json_dumps leaves room: the NUL becomes the newline */
	if (write(log->fd, line, len + 1) != (ssize_t)(len + 1) && !log->failed) {
		log->failed = 1;
		log_error("access log write failed: %s", strerror(errno));
	}
	free(line);
}
