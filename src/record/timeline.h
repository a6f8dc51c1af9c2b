/*
 * timeline.h — the per-request timeline and the metrics derived from it.
 *
 * Every request carries an array of monotonic timestamps indexed by event;
 * 0 means "not reached". Each event is declared once in TIMELINE_EVENTS and
 * each derived metric once in REQUEST_METRICS: enums, JSON keys and later
 * exposition names are generated from those lists, never kept by hand.
 * Definitions and formulas: docs/metrics.md.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "classify.h"
#include "tenant.h"
#include "tracectx.h"

struct wl_req;

/* (ENUM, json key) in the order they normally happen. */
#define TIMELINE_EVENTS(X) \
	X(ARRIVE, arrive) \
	X(REQ_HEADERS, req_headers) \
	X(DISPATCH, dispatch) \
	X(UP_CONNECTED, up_connected) \
	X(REQ_SENT, req_sent) \
	X(RESP_HEADERS, resp_headers) \
	X(FIRST_EVENT, first_event) \
	X(FIRST_TOKEN, first_token) \
	X(FIRST_REASONING, first_reasoning) \
	X(LAST_REASONING, last_reasoning) \
	X(FIRST_ANSWER, first_answer) \
	X(LAST_TOKEN, last_token) \
	X(RESP_END, resp_end) \
	X(CLIENT_DONE, client_done)

enum tl_event {
#define X(e, k) TL_##e,
	TIMELINE_EVENTS(X)
#undef X
		TL__COUNT
};

/* (ENUM, json key, unit) — each a double, NaN when it does not apply. */
#define REQUEST_METRICS(X) \
	X(QUEUE, queue_ms, "ms") \
	X(CONNECT, connect_ms, "ms") \
	X(TTFB, ttfb_ms, "ms") \
	X(TTFT, ttft_ms, "ms") \
	X(UPSTREAM_TTFT, upstream_ttft_ms, "ms") \
	X(TPOT, tpot_ms, "ms") \
	X(E2E, e2e_ms, "ms") \
	X(DECODE_RATE, decode_tps, "tokens/s") \
	X(ANSWER_TTFT, answer_ttft_ms, "ms") \
	X(REASONING, reasoning_ms, "ms") \
	X(UPLOAD, upload_ms, "ms") \
	X(SERVER_QUEUE, server_queue_ms, "ms") \
	X(SERVER_LOAD, server_load_ms, "ms") \
	X(SERVER_VALIDATION, server_validation_ms, "ms") \
	X(SERVER_PREFILL, server_prefill_ms, "ms") \
	X(SERVER_DECODE, server_decode_ms, "ms") \
	X(SERVER_INFERENCE, server_inference_ms, "ms") \
	X(UNATTRIBUTED, unattributed_ms, "ms") \
	X(PER_INPUT, per_input_ms, "ms") \
	X(INPUT_RATE, input_tps, "tokens/s") \
	X(SERVER_TTFT, server_ttft_ms, "ms") \
	X(TOKENS_PER_EVENT, tokens_per_event, "tokens")

enum req_metric {
#define X(e, k, u) RM_##e,
	REQUEST_METRICS(X)
#undef X
		RM__COUNT
};
/* No per-request metric: a stored histogram that its own code records
 * (slice.h's HIST_METRICS source column). Outside the list, so the loops
 * over the access log's keys (i < RM__COUNT) never meet it. */
#define RM_NONE RM__COUNT

/* (ENUM, name) — why a request did not complete normally. New kinds go at
 * the end: a stored slice's counters are read by position (slice.c). */
#define REQUEST_ERRORS(X) \
	X(NONE, "none") \
	X(BAD_REQUEST, "bad_request") \
	X(CONNECT_FAILED, "connect_failed") \
	X(TIMEOUT, "timeout") \
	X(UPSTREAM_RESET, "upstream_reset") \
	X(UPSTREAM_PROTOCOL, "upstream_protocol") \
	X(CLIENT_ABORTED, "client_aborted") \
	X(QUEUE_FULL, "queue_full") \
	X(RESPONSE_FAILED, "response_failed") \
	X(RESPONSE_INCOMPLETE, "response_incomplete") \
	X(NO_MEMORY, "no_memory")

enum req_error {
#define X(e, n) REQ_ERR_##e,
	REQUEST_ERRORS(X)
#undef X
		REQ_ERR__COUNT
};

/* The longest request id kept: a client's x-request-id longer than this is
 * replaced by a generated one, so the id the log and the upstream see is
 * always the same, whole. */
#define REQUEST_ID_MAX 128

/* At most this many ITL gaps are kept per request for the access log. */
#define ITL_SAMPLES_MAX 4096

/* The engine's own view of the upstream (its /metrics, scraped: scrape.h)
 * as last scraped when the request was dispatched to it. */
struct engine_seen {
	bool known;		  /* a scrape had succeeded; else nothing below */
	int64_t running, waiting; /* -1: the engine does not report it */
	double kv_use;		  /* 0..1; NaN: not reported */
	uint64_t age_ms;	  /* how old the scrape was */
	bool fresh;		  /* age_ms within two metrics_intervals: the last scrape did not fail */
};

/*
 * What is measured of one request. Owned by the request it describes;
 * handed read-only to the access log (and, later, the stats recorder).
 */
struct req_record {
	char id[REQUEST_ID_MAX + 1];
	/* Its trace (traced): the client's trace, or one tokentap started, with
	 * tokentap's own span as trace.span_id, which the upstream receives as
	 * its parent; trace_state: the client's tracestate headers go with it. */
	bool traced, trace_state;
	struct trace_ctx trace;
	/* The client's span (the traceparent's parent id), the parent of
	 * tokentap's own; has_parent false: a trace tokentap started */
	bool has_parent;
	uint8_t parent_span_id[8];
	char method[16];
	char path[256]; /* without the query string, truncated to fit */
	char model[128];
	/* the tenant (tenant.h): a clean name, TENANT_INVALID, an API key's
	 * label or its configured name; "" none (no `tenant:`, or no value) */
	char tenant[TENANT_MAX + 1];
	bool tenant_on;	      /* a `tenant:` applied to it: recorded by tenant, "none" when tenant is "" */
	char resp_model[128]; /* the model the response names; "" none (gen_ai.response.model) */
	const char *upstream; /* borrowed: the upstream's name outlives every request */
	const char *up_url;   /* borrowed, as upstream: its url (the span's server.address) */
	enum api_kind api;
	int stream; /* 1, 0, or -1 unknown */
	int status; /* upstream status, or the status tokentap answered; 0 none */
	enum req_error error;
	struct usage usage;
	int64_t inputs;		   /* the batch's inputs, of the APIs that take one (reqinfo.h); -1 unknown */
	struct classify_hint hint; /* where the stream's last token event held its text */
	uint64_t events, token_events;
	uint64_t reasoning_events, tool_call_events; /* of token_events: what they carried */
	/* Tokens per token event, where the server counts its output on
	 * every chunk (vLLM's continuous_usage_stats): tpe_on 0 until the
	 * first token event decides, 1 counted, -1 not (record_event_tokens);
	 * tpe_last the output count at the last counted event. */
	int8_t tpe_on;
	int64_t tpe_last;
	uint64_t tpe_events, tpe_tokens;
	uint64_t bytes_in, bytes_out;
	uint64_t at[TL__COUNT];
	/* The gaps themselves (the first ITL_SAMPLES_MAX), kept only with
	 * itl_keep: the access log writes them out, nothing else needs them. */
	uint64_t *itl_ns;
	size_t itl_n, itl_cap;
	bool itl_keep;
	uint64_t itl_total;	   /* all gaps, also past the cap */
	uint64_t itl_sum, itl_max; /* of all gaps, in ns */
	bool mirror;		   /* a shadow copy: measured, its response dropped */
	struct wl_req *wl;	   /* the workload capture's scan of the body (workload.h); the request owns it */
	struct engine_seen engine; /* at the last dispatch */
	/* The route's ttft_deadline (0: none) and the upstreams that had no
	 * token within it: the ones left for another (failovers) and, when
	 * none could take it, the one that answered late */
	uint64_t deadline_ms;
	unsigned deadline_missed, deadline_failovers;
	/* how the upstream was chosen: the reason (balance.h's names, static
	 * text; NULL: not routed), the predicted ms to first token (latency;
	 * below 0: none) and the prompt blocks that keyed it (prefix) */
	const char *pick;
	double pick_pred_ms;
	unsigned pick_blocks;
	/* A realtime response's: the event its TTFT starts at (realtime.h's
	 * names, static text); NULL for every other record */
	const char *ttft_from;
};

static inline uint64_t clock_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Stamps `e` at `now` unless it was already reached. */
static inline void timeline_mark(struct req_record *r, enum tl_event e, uint64_t now)
{
	if (!r->at[e])
		r->at[e] = now;
}

const char *timeline_event_name(enum tl_event e);
const char *req_metric_key(enum req_metric m);
const char *req_error_name(enum req_error e);

/* Notes a token-bearing event carrying `kind` at `now`: first/last token,
 * the ITL gap (across kinds: the gaps are the stream's), the first answer
 * token (anything but reasoning) and the first/last reasoning token.
 * Returns true when a gap was measured (every token but the first; a gap
 * can be 0 when two token events arrive in one read) and stores it. */
bool record_token_event(struct req_record *r, enum token_kind kind, uint64_t now, uint64_t *gap);

/* record_token_event() inlined for the usual event: an answer token after
 * the first, in time order, whose gap needs no room made in itl_ns. Any
 * other goes to record_token_event(); the record comes out the same. */
static inline bool record_token_event_fast(struct req_record *r, enum token_kind kind, uint64_t now, uint64_t *gap)
{
	if (kind != TOKEN_ANSWER || !r->at[TL_FIRST_TOKEN] || !r->at[TL_FIRST_ANSWER] || now < r->at[TL_LAST_TOKEN] ||
	    (r->itl_keep && r->itl_n == r->itl_cap && r->itl_n != ITL_SAMPLES_MAX))
		return record_token_event(r, kind, now, gap);
	uint64_t g = now - r->at[TL_LAST_TOKEN];
	r->token_events++;
	*gap = g;
	r->at[TL_LAST_TOKEN] = now;
	r->itl_total++;
	r->itl_sum += g;
	if (g > r->itl_max)
		r->itl_max = g;
	if (r->itl_keep && r->itl_n < ITL_SAMPLES_MAX)
		r->itl_ns[r->itl_n++] = g;
	return true;
}

/* After a token event that was classified in full (not a same-shape one,
 * whose usage is its shape's): when the stream counts its output on every
 * event — an OpenAI chat or completions stream whose first token event
 * already carried usage — how many tokens this event carried, the rise of
 * the output count since the last counted event, into *n; false when the
 * stream does not (decided at its first token event, for good), or the
 * count did not rise. A count that falls stops the counting. */
bool record_event_tokens(struct req_record *r, uint64_t *n);

/* At the response's end: when the server's own word says it failed or is
 * incomplete (usage.outcome, from a Responses stream's terminal event or
 * body), that is the request's error, unless another came first. */
void record_apply_outcome(struct req_record *r);

/* Output token count used for tpot/decode rate: usage when the server sent
 * it, else the number of token-bearing events. */
int64_t record_output_tokens(const struct req_record *r);

/* Fills out[RM__COUNT] with the derived metrics (NaN when not applicable). */
void record_derive(const struct req_record *r, double out[RM__COUNT]);

/* Releases the ITL samples; the record can be reused after memset. */
void record_release(struct req_record *r);
