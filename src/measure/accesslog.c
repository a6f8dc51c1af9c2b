/*
 * accesslog.c — JSON lines, built with jansson, one write(2) each so lines
 * stay whole when several workers share the file.
 */
#include "accesslog.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "classify.h"
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

/* Milliseconds with microsecond precision; null for NaN (not applicable,
 * not reached). */
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

static json_t *u64_json(uint64_t v)
{
	return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
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

/* The engine's queue and KV use as last scraped at dispatch (scrape.h);
 * null without a scrape. */
static json_t *engine_json(const struct engine_seen *e)
{
	if (!e->known)
		return json_null();
	return json_pack("{s:o,s:o,s:o,s:I}", "running", e->running < 0 ? json_null() : json_integer(e->running),
			 "waiting", e->waiting < 0 ? json_null() : json_integer(e->waiting), "kv_use",
			 e->kv_use != e->kv_use ? json_null() : json_real(e->kv_use), "age_ms", (json_int_t)e->age_ms);
}

/* The trace id (span: tokentap's span id) in lower-case hex; null when the
 * request has no trace. */
static json_t *trace_json(const struct req_record *r, bool span)
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

/* Every timeline event in ms since `arrive`, null where not reached; into
 * `tl`, or a new object when NULL. */
static json_t *timeline_json(const struct req_record *r, json_t *tl)
{
	const uint64_t t0 = r->at[TL_ARRIVE];

	if (!tl)
		tl = json_object();

	for (int i = 0; i < TL__COUNT && tl; i++) {
		uint64_t at = r->at[i];
		double v = at && t0 && at >= t0 ? (double)(at - t0) / 1e6 : NAN;
		json_object_set_new(tl, timeline_event_name((enum tl_event)i), ms_or_null(v));
	}
	return tl;
}

/* The gaps the record kept, in ms; into `itl`, or a new array when NULL. */
static json_t *itl_array_json(const struct req_record *r, json_t *itl)
{
	if (!itl)
		itl = json_array();

	for (size_t i = 0; i < r->itl_n && itl; i++)
		json_array_append_new(itl, json_real(round((double)r->itl_ns[i] / 1e3) / 1e3));
	return itl;
}

/* The ring's ITL summary: the count of every gap, mean and max over the
 * gaps the record kept. */
static json_t *itl_summary_json(const struct recent_entry *e)
{
	json_t *itl = json_object();

	if (itl) {
		json_object_set_new(itl, "count", u64_json(e->rec.itl_total));
		json_object_set_new(itl, "mean_ms", ms_or_null(e->itl_mean_ms));
		json_object_set_new(itl, "max_ms", ms_or_null(e->itl_max_ms));
	}
	return itl;
}

/*
 * The request record's keys, one row each, for the access log and
 * GET /requests/recent alike. Rows stand in the access log's key order.
 * Columns: (ID, key, LOG, RECENT, WHEN, VALUE). LOG: 1 when the access log
 * has the key. RECENT: the key's place in /requests/recent, ascending (0:
 * not there); numbers go by tens so that a row can be put between two. WHEN:
 * the key is written only when it holds (the log's optional keys). VALUE: a
 * json_t * made from `r` (the struct req_record) and `e` (its struct
 * recent_entry: rows with LOG 0 only) and `ts` (the log line's time: rows
 * with RECENT 0 only); pre_tl and pre_itl are the log's containers, made
 * up front as the log always has (NULL for /requests/recent). The NULL key stands for the derived metrics of
 * record_derive, each under its req_metric_key, in their list's order.
 */
/* clang-format off */
#define RECORD_FIELDS(X) \
	X(TS,			"ts",			1, 0,	1,		json_string(ts)) \
	X(ID,			"id",			1, 10,	1,		json_string(r->id)) \
	X(TRACE_ID,		"trace_id",		1, 20,	1,		trace_json(r, false)) \
	X(SPAN_ID,		"span_id",		1, 30,	1,		trace_json(r, true)) \
	X(FINISHED,		"finished",		0, 40,	1,		iso_ms(e->unix_ms)) \
	X(METHOD,		"method",		1, 50,	1,		json_string(r->method)) \
	X(PATH,			"path",			1, 60,	1,		json_string(r->path)) \
	X(API,			"api",			1, 70,	1,		json_string(classify_api_name(r->api))) \
	X(UPSTREAM,		"upstream",		1, 90,	1,		str_or_null(r->upstream)) \
	X(PICK,			"pick",			1, 100,	1,		str_or_null(r->pick)) \
	X(PICK_PRED,		"pick_predicted_ttft_ms", 1, 110, 1, \
	  r->pick && r->pick_pred_ms > 0 ? json_real(r->pick_pred_ms) : json_null()) \
	X(PICK_BLOCKS,		"pick_prefix_blocks",	1, 120,	1,		json_integer(r->pick_blocks)) \
	X(MIRROR,		"mirror",		1, 0,	r->mirror,	json_true()) \
	X(MODEL,		"model",		1, 80,	1,		str_or_null(r->model)) \
	X(TENANT,		"tenant",		1, 85,	1,		str_or_null(r->tenant)) \
	X(TTFT_FROM,		"ttft_from",		1, 0,	r->ttft_from != NULL, json_string(r->ttft_from)) \
	X(STREAM,		"stream",		1, 130,	1, \
	  r->stream < 0 ? json_null() : json_boolean(r->stream)) \
	X(STATUS,		"status",		1, 140,	1,		json_integer(r->status)) \
	X(ERROR,		"error",		1, 150,	1, \
	  r->error == REQ_ERR_NONE ? json_null() : json_string(req_error_name(r->error))) \
	X(INPUT_TOKENS,		"input_tokens",		1, 160,	1,		int_or_null(r->usage.input_tokens)) \
	X(OUTPUT_TOKENS,	"output_tokens",	1, 170,	1,		int_or_null(r->usage.output_tokens)) \
	X(CACHED_TOKENS,	"cached_tokens",	1, 180,	1,		int_or_null(r->usage.cached_tokens)) \
	X(CACHE_WRITE_TOKENS,	"cache_write_tokens",	1, 190,	1,		int_or_null(r->usage.cache_write_tokens)) \
	X(REASONING_TOKENS,	"reasoning_tokens",	1, 200,	1,		int_or_null(r->usage.reasoning_tokens)) \
	X(SERVER_TIMING,	"server_timing",	1, 210,	1, \
	  str_or_null(classify_server_name(r->usage.server.source))) \
	X(ENGINE,		"engine",		1, 220,	1,		engine_json(&r->engine)) \
	X(DEADLINE_MISSED,	"deadline_missed",	1, 0,	r->deadline_ms,	json_integer(r->deadline_missed)) \
	X(DEADLINE_FAILOVERS,	"deadline_failovers",	1, 0,	r->deadline_ms,	json_integer(r->deadline_failovers)) \
	X(EVENTS,		"events",		1, 260,	1,		u64_json(r->events)) \
	X(TOKEN_EVENTS,		"token_events",		1, 230,	1,		u64_json(r->token_events)) \
	X(REASONING_EVENTS,	"reasoning_events",	1, 240,	1,		u64_json(r->reasoning_events)) \
	X(TOOL_CALL_EVENTS,	"tool_call_events",	1, 250,	1,		u64_json(r->tool_call_events)) \
	X(INPUTS,		"inputs",		1, 0,	1,		int_or_null(r->inputs)) \
	X(BYTES_IN,		"bytes_in",		1, 270,	1,		u64_json(r->bytes_in)) \
	X(BYTES_OUT,		"bytes_out",		1, 280,	1,		u64_json(r->bytes_out)) \
	X(COLD,			"cold",			0, 290,	1,		json_boolean(e->cold)) \
	X(INFLIGHT,		"inflight",		0, 300,	1,		json_integer((json_int_t)e->load)) \
	X(METRICS,		NULL,			1, 320,	1,		NULL) \
	X(ITL_MS,		"itl_ms",		1, 0,	1,		itl_array_json(r, pre_itl)) \
	X(ITL_COUNT,		"itl_count",		1, 0,	1,		u64_json(r->itl_total)) \
	X(TIMELINE,		"timeline_ms",		1, 310,	1,		timeline_json(r, pre_tl)) \
	X(ITL,			"itl",			0, 330,	1,		itl_summary_json(e))
/* clang-format on */

enum record_field {
#define RECORD_ENUM(ID, key, log, recent, when, value) RF_##ID,
	RECORD_FIELDS(RECORD_ENUM)
#undef RECORD_ENUM
		RF__COUNT
};

/* Adds row `f` to `o` when its WHEN holds. The access log's line keeps a
 * value that could not be made out (json_object_set_new refuses NULL);
 * /requests/recent shows it as null. Inlined with a constant `f`, the
 * switch folds to the one row. */
static inline __attribute__((always_inline)) void put_row(json_t *o, enum record_field f, const struct req_record *r,
							  const struct recent_entry *e, const char *ts, const double *m,
							  json_t *pre_tl, json_t *pre_itl)
{
	const char *key = NULL;
	json_t *v = NULL;

	(void)ts;
	switch (f) {
#define RECORD_CASE(ID, k, log, recent, when, value) \
	case RF_##ID: \
		if (!(when)) \
			return; \
		key = k; \
		v = k ? (value) : NULL; \
		break;
		RECORD_FIELDS(RECORD_CASE)
#undef RECORD_CASE
	case RF__COUNT: return;
	}
	if (!key) {
		for (int i = 0; i < RM__COUNT; i++)
			json_object_set_new(o, req_metric_key((enum req_metric)i), ms_or_null(m[i]));
	} else if (e) {
		json_object_set_new(o, key, v ? v : json_null());
	} else {
		json_object_set_new(o, key, v);
	}
}

/* Row ids in /requests/recent's order, sorted once from the RECENT column. */
static enum record_field recent_order[RF__COUNT];
static size_t recent_rows;
static pthread_once_t recent_once = PTHREAD_ONCE_INIT;

static void recent_order_sort(void)
{
	static const unsigned place[RF__COUNT] = {
#define RECORD_PLACE(ID, key, log, recent, when, value) [RF_##ID] = recent,
		RECORD_FIELDS(RECORD_PLACE)
#undef RECORD_PLACE
	};

	for (int f = 0; f < RF__COUNT; f++) {
		size_t j;
		if (!place[f])
			continue;
		for (j = recent_rows; j > 0 && place[recent_order[j - 1]] > place[f]; j--)
			recent_order[j] = recent_order[j - 1];
		recent_order[j] = (enum record_field)f;
		recent_rows++;
	}
}

json_t *record_json(const struct req_record *r, const struct recent_entry *e)
{
	double m[RM__COUNT];
	json_t *o = json_object();

	if (!o)
		return NULL;
	if (e) {
		record_derive(r, m);
		pthread_once(&recent_once, recent_order_sort);
		for (size_t i = 0; i < recent_rows; i++)
			put_row(o, recent_order[i], r, e, NULL, m, NULL, NULL);
	} else {
		/* the containers first, then the clock: the order the log's
		 * allocations have always had */
		json_t *pre_tl = json_object(), *pre_itl = json_array();
		char ts[40];
		record_derive(r, m);
		iso_time(ts, sizeof(ts));
#define RECORD_LOG(ID, key, log, recent, when, value) \
	if (log) \
		put_row(o, RF_##ID, r, NULL, ts, m, pre_tl, pre_itl);
		RECORD_FIELDS(RECORD_LOG)
#undef RECORD_LOG
	}
	return o;
}

void accesslog_write(struct accesslog *log, const struct req_record *r)
{
	json_t *o;
	char *line;
	size_t len;

	if (!log)
		return;
	o = record_json(r, NULL);
	if (!o)
		return;
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
