/*
 * meter.c — measuring a response as it passes, for a primary and a shadow
 * alike (meter.h says what is measured, and where each record goes).
 *
 *   respparse ─head/body/end─▶ meter ─▶ framer ─events─▶ classify ─▶ timeline, ITL runs ─▶ series
 *                                 └─ meter_finish ─▶ access log, stats, recent ring, spans
 *
 * Invariants: the ITL runs go to the series from three places only (a gap
 * of another length in on_event, meter_read_end, meter_finish); the series
 * is resolved once; a request is recorded once.
 */
#include "meter.h"

#include <event2/buffer.h>
#include <string.h>
#include <time.h>

#include "accesslog.h"
#include "classify.h"
#include "log.h"
#include "otlp.h"
#include "otlp_metrics.h"
#include "paired.h"
#include "recent.h"
#include "respparse.h"
#include "stats.h"
#include "timeline.h"
#include "workload.h"

/* The upstream answered 2xx: the one test behind the stream flag, the
 * body's usage and a new model name's admission (stats_series). */
static bool status_ok(int status)
{
	return status >= 200 && status < 300;
}

void meter_init(struct meter *m, const struct meter_env *env, struct req_record *rec, const struct respparse *resp,
		size_t max_event_size, bool shadow)
{
	memset(m, 0, sizeof(*m));
	m->env = *env;
	m->rec = rec;
	m->resp = resp;
	m->max_event_size = max_event_size;
	m->shadow = shadow;
}

void meter_free(struct meter *m)
{
	framer_free(&m->framer);
	paired_link_drop(&m->pair);
	if (m->body)
		evbuffer_free(m->body);
	m->body = NULL;
}

void meter_restart(struct meter *m)
{
	struct req_record *rec = m->rec;

	framer_free(&m->framer);
	memset(&m->framer, 0, sizeof(m->framer));
	if (m->body)
		evbuffer_free(m->body);
	m->body = NULL;
	m->body_tail = false;
	m->json_array = false;
	m->framer_failed = false;
	m->itl_run_gap = m->itl_run_n = 0;
	rec->status = 0;
	rec->usage = USAGE_UNKNOWN;
	rec->resp_model[0] = '\0';
	memset(&rec->hint, 0, sizeof(rec->hint));
	rec->events = rec->token_events = rec->reasoning_events = rec->tool_call_events = 0;
	rec->tpe_on = 0;
	rec->tpe_last = 0;
	rec->tpe_events = rec->tpe_tokens = 0;
	for (int e = TL_UP_CONNECTED; e <= TL_RESP_END; e++)
		rec->at[e] = 0;
}

void meter_label(struct meter *m, const char *route, const char *upstream, bool cold, unsigned load)
{
	m->route = route;
	m->upstream = upstream;
	m->cold = cold;
	m->load = load;
}

/* Resolved when first recorded into: at the first ITL run, which comes from
 * the response body, or when the request is recorded; so after the
 * response head, when the status that decides whether its model may be
 * admitted is known. */
static struct series *meter_series(struct meter *m)
{
	if (!m->series)
		m->series = stats_series(m->env.stats, m->route ? m->route : "none", m->upstream ? m->upstream : "none",
					 m->rec->model, m->cold, status_ok(m->rec->status));
	return m->series;
}

static void flush_itl(struct meter *m)
{
	if (m->itl_run_n)
		stats_record_itl_n(meter_series(m), m->itl_run_gap, m->load, m->itl_run_n);
	m->itl_run_n = 0;
}

void meter_read_end(struct meter *m)
{
	flush_itl(m);
}

/* The model a response names (classify_resp_model) in [p, end): a streamed
 * answer's first events, a body's first RESP_MODEL_SCAN bytes, or its last
 * ones where the API names it at the end (Gemini). */
#define RESP_MODEL_SCAN 4096
static void find_resp_model(struct req_record *rec, const char *p, const char *end)
{
	classify_resp_model(rec->api, p, (size_t)(end - p), rec->resp_model, sizeof(rec->resp_model));
}

/* A gap of `n` token events in a row: one ITL run holds gaps of one length. */
static void itl_gaps(struct meter *m, uint64_t gap, uint64_t n)
{
	if (m->itl_run_n && gap != m->itl_run_gap)
		flush_itl(m);
	m->itl_run_gap = gap;
	m->itl_run_n += n;
}

/* ev->run events of the armed shape in a row, all of this read: each is
 * what the on_event of each would have made of it. They carry the
 * shape's kind and hint (classify_event_shaped), its usage (so no new output count
 * either) and, past the first, a gap of 0 (one clock reading per read):
 * for an answer with no gaps kept (itl_keep), the record of n - 1 such
 * gaps is a sum. The first of the run is an event after the one that
 * armed the shape, so only it may be the stream's second event, which
 * the response's model is looked for in. */
static void on_shaped(struct meter *m, const struct framer_event *ev)
{
	struct req_record *rec = m->rec;
	enum token_kind kind = classify_shape_answer(&m->framer, &rec->hint);
	size_t n = ev->run;
	uint64_t gap;

	rec->events++;
	timeline_mark(rec, TL_FIRST_EVENT, m->now);
	if (rec->events <= 2 && !rec->resp_model[0] && ev->data)
		find_resp_model(rec, ev->data, ev->data + ev->data_len);
	if (kind == TOKEN_NONE) {
		rec->events += n - 1;
		return;
	}
	if (record_token_event_fast(rec, kind, m->now, &gap))
		itl_gaps(m, gap, 1);
	if (n == 1)
		return;
	rec->events += n - 1;
	if (kind == TOKEN_ANSWER && !rec->itl_keep && rec->at[TL_FIRST_ANSWER] && rec->at[TL_LAST_TOKEN] == m->now) {
		/* record_token_event_fast's path, n - 1 times, with gap 0 */
		rec->token_events += n - 1;
		rec->itl_total += n - 1;
		itl_gaps(m, 0, n - 1);
		return;
	}
	for (size_t i = 1; i < n; i++)
		if (record_token_event_fast(rec, kind, m->now, &gap))
			itl_gaps(m, gap, 1);
}

/* A framed event: the timeline learns about it (its bytes are already on
 * their way, or dropped for a shadow). */
static void on_event(void *arg, const struct framer_event *ev)
{
	struct meter *m = arg;
	struct req_record *rec = m->rec;
	uint64_t gap;

	if (ev->same_shape) {
		on_shaped(m, ev);
		return;
	}
	rec->events++;
	timeline_mark(rec, TL_FIRST_EVENT, m->now);
	if (rec->events <= 2 && !rec->resp_model[0] && ev->data)
		find_resp_model(rec, ev->data, ev->data + ev->data_len);
	enum token_kind kind = classify_event_armed(rec->api, &m->framer, ev, &rec->usage, &rec->hint);
	uint64_t n;
	if (kind != TOKEN_NONE && rec->tpe_on >= 0 && record_event_tokens(rec, &n))
		stats_record_event_tokens(meter_series(m), n);
	if (kind != TOKEN_NONE && record_token_event_fast(rec, kind, m->now, &gap))
		itl_gaps(m, gap, 1);
}

void meter_token(struct meter *m, enum token_kind kind, uint64_t now)
{
	struct req_record *rec = m->rec;
	uint64_t gap;

	rec->events++;
	timeline_mark(rec, TL_FIRST_EVENT, now);
	if (kind != TOKEN_NONE && record_token_event(rec, kind, now, &gap)) {
		if (m->itl_run_n && gap != m->itl_run_gap)
			flush_itl(m);
		m->itl_run_gap = gap;
		m->itl_run_n++;
	}
}

void meter_head(struct meter *m, const struct respparse *rp)
{
	m->rec->status = rp->status;
	if (rp->server.source != SERVER_NONE)
		m->rec->usage.server = rp->server; /* TGI's headers; a body's report may add to them */
	timeline_mark(m->rec, TL_RESP_HEADERS, m->now);
	m->json_array = rp->kind == FRAMER_NONE && !rp->content_encoded && status_ok(rp->status) &&
			classify_streams_json_array(m->rec->api);
	if (rp->kind != FRAMER_NONE || m->json_array) {
		m->rec->stream = 1;
		framer_init(&m->framer, m->json_array ? FRAMER_JSON_ARRAY : rp->kind, m->max_event_size, on_event, m);
		m->framer.runs = true; /* on_shaped */
	} else if (status_ok(rp->status)) {
		m->rec->stream = 0;
	}
}

/* A stream the framer could no longer read (an event stream's bad CRC or
 * length): recorded as the upstream's protocol error, once, unless another
 * error came first. Its bytes go on to the client as they came: the client's
 * own decoder checks the same CRCs, and tokentap only stops measuring. */
static void note_framer_error(struct meter *m)
{
	const char *why = framer_error(&m->framer);

	if (why == NULL || m->framer_failed)
		return;
	m->framer_failed = true;
	log_warn(
		"request %s: the upstream's event stream is malformed (%s at byte %llu of its body); not measured "
		"past it",
		m->rec->id, why, (unsigned long long)m->framer.evs.offset);
	if (m->rec->error == REQ_ERR_NONE)
		m->rec->error = REQ_ERR_UPSTREAM_PROTOCOL;
}

/* The parser's framer kind is read as each hook runs, not kept from the
 * head: a trailer named content-type sets it again before the end. */
void meter_body(struct meter *m, const char *at, size_t len)
{
	if (m->resp->kind != FRAMER_NONE || m->json_array) {
		framer_feed(&m->framer, at, len);
		if (m->framer.kind == FRAMER_EVENTSTREAM) /* the only framing that can break */
			note_framer_error(m);
		return;
	}
	if (!m->body)
		m->body = evbuffer_new();
	if (!m->body)
		return;
	if (!m->body_tail && evbuffer_get_length(m->body) + len <= RESP_BODY_MAX) {
		evbuffer_add(m->body, at, len);
	} else if (classify_inputs_key(m->rec->api) != NULL) {
		/* A batch answer past the bound: from now on only its tail. */
		if (len >= RESP_TAIL_MAX) {
			at += len - RESP_TAIL_MAX;
			len = RESP_TAIL_MAX;
		}
		size_t have = evbuffer_get_length(m->body);
		if (have + len > RESP_TAIL_MAX)
			evbuffer_drain(m->body, have + len - RESP_TAIL_MAX);
		evbuffer_add(m->body, at, len);
		m->body_tail = true;
	}
}

void meter_body_v(struct meter *m, const struct framer_slice *v, size_t n)
{
	if (m->resp->kind != FRAMER_NONE || m->json_array) {
		framer_feed_v(&m->framer, v, n);
		if (m->framer.kind == FRAMER_EVENTSTREAM)
			note_framer_error(m);
		return;
	}
	for (size_t i = 0; i < n; i++)
		meter_body(m, v[i].at, v[i].len);
}

void meter_resp_body(void *meter, const char *at, size_t len)
{
	meter_body(meter, at, len);
}

void meter_complete(struct meter *m)
{
	timeline_mark(m->rec, TL_RESP_END, m->now);
	if (m->resp->kind != FRAMER_NONE || m->json_array) {
		framer_finish(&m->framer);
		note_framer_error(m);
	} else if (m->body && status_ok(m->rec->status)) {
		size_t n = evbuffer_get_length(m->body);
		const char *body = (const char *)evbuffer_pullup(m->body, -1);
		size_t scan = n < RESP_MODEL_SCAN ? n : RESP_MODEL_SCAN;
		if (body && classify_resp_model_at_end(m->rec->api))
			find_resp_model(m->rec, body + n - scan, body + n); /* the kept tail has it too */
		else if (body && !m->body_tail)
			find_resp_model(m->rec, body, body + scan);
		if (body && m->body_tail)
			classify_body_tail(m->rec->api, body, n, &m->rec->usage);
		else if (body)
			classify_body(m->rec->api, body, n, &m->rec->usage);
	}
	record_apply_outcome(m->rec);
}

bool meter_finish(struct meter *m)
{
	struct req_record *rec = m->rec;

	if (m->recorded)
		return false;
	m->recorded = true;
	accesslog_write(m->env.alog, rec);
	flush_itl(m);
	stats_record_request(meter_series(m), rec, m->load);
	paired_link_finish(&m->pair, rec, m->shadow, m->route, m->upstream);
	if (!m->shadow) {
		recent_push(m->env.recent, rec, m->load, m->cold);
		workload_record(rec, rec->wl, m->route, m->upstream);
		otlp_record(rec, m->route);
		if (rec->tenant_on)
			stats_record_request(stats_tenant_series(m->env.stats, m->route ? m->route : "none",
								 rec->tenant, status_ok(rec->status)),
					     rec, m->load);
		otlp_metrics_record(rec);
	}
	return true;
}

void meter_pair(struct meter *primary, struct meter *shadow)
{
	if (primary->pair || shadow->pair || !(shadow->pair = paired_link_new()))
		return;
	primary->pair = shadow->pair;
}

void meter_record_shadow(struct req_record *dst, const struct req_record *primary)
{
	memcpy(dst->id, primary->id, sizeof(dst->id));
	memcpy(dst->method, primary->method, sizeof(dst->method));
	memcpy(dst->path, primary->path, sizeof(dst->path));
	memcpy(dst->model, primary->model, sizeof(dst->model));
	memcpy(dst->tenant, primary->tenant, sizeof(dst->tenant));
	dst->api = primary->api;
	dst->stream = primary->stream;
	dst->traced = primary->traced; /* the shadow is sent the primary's traceparent */
	dst->trace_state = primary->trace_state;
	dst->trace = primary->trace;
	dst->inputs = primary->inputs;
	dst->mirror = true;
	dst->usage = USAGE_UNKNOWN;
	/* the shadow's clock starts when the client's request did: its ttft
	 * compares with the primary's on the same footing */
	dst->at[TL_ARRIVE] = primary->at[TL_ARRIVE];
	dst->at[TL_REQ_HEADERS] = primary->at[TL_REQ_HEADERS];
}
