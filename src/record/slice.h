/*
 * slice.h — everything recorded about one series over one period.
 *
 * A series is (route, upstream, model, cold). A slice holds its counters and
 * its histograms for one second, minute, hour or all time; slices of the same
 * series merge exactly (counters add, histograms add buckets), which is how
 * windows are answered and how per-worker deltas reach the store.
 *
 * Histograms are allocated on first use, so a slice costs only what its
 * traffic touched; the encoded form (slice_encode) is sparse and versioned.
 * Each metric and counter is declared once below.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hist.h"
#include "timeline.h"

/* UNIT_MILLI: rates in milli-units/s; UNIT_MILLI_COUNT: a mean count in
 * thousandths (tokens per event of a request). */
enum metric_unit { UNIT_US, UNIT_MILLI, UNIT_COUNT, UNIT_MILLI_COUNT };

/* (ENUM, name, stored unit, source, help). Times are stored in µs and
 * shown in ms; decode rate is stored in milli-tokens/s and shown in
 * tokens/s. `source`: the per-request metric (timeline.h)
 * slice_record_request records it from, RM_NONE for the ones their own code
 * records (gaps, token counts, load). `help`: what one sample is, for the
 * Prometheus # HELP line of the time metrics (prom.c; docs/metrics.md has
 * the definitions). Rows do not move and new ones go at the end: a stored
 * slice carries its layout (a count of rows per kind, slice.c), so an
 * older one reads with the new rows empty, with no new encoding version. */
#define HIST_METRICS(X) \
	X(TTFT, ttft, UNIT_US, RM_TTFT, "Time to first token at the proxy, from the request's arrival") \
	X(UPSTREAM_TTFT, upstream_ttft, UNIT_US, RM_UPSTREAM_TTFT, \
	  "The upstream's share of time to first token, from the request sent") \
	X(ITL, itl, UNIT_US, RM_NONE, "Inter-token latency: one sample per gap between token events") \
	X(TPOT, tpot, UNIT_US, RM_TPOT, "Mean time per output token after the first") \
	X(E2E, e2e, UNIT_US, RM_E2E, "Whole request, from its arrival to the end of the response") \
	X(TTFB, ttfb, UNIT_US, RM_TTFB, "Time until the upstream answered with headers, from the request's arrival") \
	X(QUEUE, queue, UNIT_US, RM_QUEUE, "Wait in tokentap's admission queue for an upstream slot") \
	X(CONNECT, connect, UNIT_US, RM_CONNECT, "Connection and TLS set-up to the upstream; 0 on a reused one") \
	X(DECODE_RATE, decode_rate, UNIT_MILLI, RM_DECODE_RATE, "Output tokens per second after the first") \
	X(INPUT_TOKENS, input_tokens, UNIT_COUNT, RM_NONE, "Input (prompt) tokens per request") \
	X(OUTPUT_TOKENS, output_tokens, UNIT_COUNT, RM_NONE, "Output tokens per request") \
	X(INFLIGHT, inflight, UNIT_COUNT, RM_NONE, \
	  "Requests on or queued for the upstream when the request was routed, itself included") \
	X(ANSWER_TTFT, answer_ttft, UNIT_US, RM_ANSWER_TTFT, \
	  "Time to the first answer token (text or tool call, not reasoning), from the request's arrival") \
	X(REASONING, reasoning, UNIT_US, RM_REASONING, "Reasoning span: from the first reasoning token to the last") \
	X(UPLOAD, upload, UNIT_US, RM_UPLOAD, "Writing the request to the upstream, from connected to sent") \
	X(SERVER_QUEUE, server_queue, UNIT_US, RM_SERVER_QUEUE, \
	  "The engine's own queue wait, as it reported it (requests whose server reported one)") \
	X(SERVER_LOAD, server_load, UNIT_US, RM_SERVER_LOAD, \
	  "The engine's model load and runner wait, as it reported it (Ollama's load_duration)") \
	X(SERVER_PREFILL, server_prefill, UNIT_US, RM_SERVER_PREFILL, \
	  "The engine's prompt processing, as it reported it") \
	X(SERVER_DECODE, server_decode, UNIT_US, RM_SERVER_DECODE, \
	  "The engine's first output token to last, as it reported it") \
	X(SERVER_INFERENCE, server_inference, UNIT_US, RM_SERVER_INFERENCE, \
	  "The engine's prefill and decode together, where it does not split them (TGI)") \
	X(UNATTRIBUTED, unattributed, UNIT_US, RM_UNATTRIBUTED, \
	  "What neither tokentap nor the server accounts for (network, server front end), from 0; " \
	  "requests whose server reported timings") \
	X(PER_INPUT, per_input, UNIT_US, RM_PER_INPUT, \
	  "Whole request over its inputs: the time per input of a batch (embeddings, rerank, score, classify)") \
	X(TOKENS_PER_EVENT, tokens_per_event, UNIT_COUNT, RM_NONE, \
	  "Tokens one token event carried, where the server counts its output on every event") \
	X(REQUEST_TOKENS_PER_EVENT, request_tokens_per_event, UNIT_MILLI_COUNT, RM_TOKENS_PER_EVENT, \
	  "Mean tokens per token event of a request, where the server counts its output on every event")

enum hist_metric {
#define X(e, n, u, src, help) HM_##e,
	HIST_METRICS(X)
#undef X
		HM__COUNT
};

/* Counters, (ENUM, name, exported, help); errors by kind follow them, one
 * per enum req_error. `exported`: a Prometheus family of its own,
 * tokentap_<name>_total, with `help` as its # HELP (prom.c); the status
 * classes are exported together as tokentap_requests_total. New counters
 * go at the end (slice.c's decoder maps an older layout's positions). The
 * prefix-cache hit ratio is cached_tokens / cache_reported_input_tokens:
 * both only over the requests that reported caching. */
#define SLICE_COUNTERS(X) \
	X(REQUESTS, requests, 0, "Requests finished.") \
	X(STATUS_NONE, status_none, 0, "Requests finished with no status sent.") \
	X(STATUS_1XX, status_1xx, 0, "Requests finished with a 1xx status.") \
	X(STATUS_2XX, status_2xx, 0, "Requests finished with a 2xx status.") \
	X(STATUS_3XX, status_3xx, 0, "Requests finished with a 3xx status.") \
	X(STATUS_4XX, status_4xx, 0, "Requests finished with a 4xx status.") \
	X(STATUS_5XX, status_5xx, 0, "Requests finished with a 5xx status.") \
	X(INPUT_TOKENS, input_tokens, 1, "Input (prompt) tokens, as the server reported them.") \
	X(OUTPUT_TOKENS, output_tokens, 1, "Output tokens: the server's usage count, else token-bearing events.") \
	X(SLO_MET, slo_met, 1, "Requests that met the goodput SLO (TTFT and TPOT within bounds).") \
	X(SLO_MISSED, slo_missed, 1, "Requests that missed the goodput SLO, failed ones included.") \
	X(CACHED_TOKENS, cached_tokens, 1, "Input tokens the server read from its prefix cache, as it reported them.") \
	X(CACHE_WRITE_TOKENS, cache_write_tokens, 1, \
	  "Input tokens the server wrote to its prompt cache, as it reported them.") \
	X(REASONING_TOKENS, reasoning_tokens, 1, "Output tokens spent reasoning, as the server reported them.") \
	X(CACHE_REPORTED_INPUT_TOKENS, cache_reported_input_tokens, 1, \
	  "Input tokens of the requests whose server reported prefix caching (the hit ratio's denominator).")

enum slice_counter {
#define X(e, n, exported, help) CT_##e,
	SLICE_COUNTERS(X)
#undef X
		CT_ERR_BASE,
	CT__COUNT = CT_ERR_BASE + REQ_ERR__COUNT
};

/* The load curve: ttft, itl and e2e by requests in flight to the upstream
 * when the request arrived (1, 2, 3-4, 5-8, ... log2 buckets), and ttft by
 * prompt length (0-1, 2, 3-4, ... log2 buckets): SLOT_PROMPT by the tokens
 * the server had to prefill (input minus cached, when it reported caching;
 * else the input), SLOT_PROMPT_RAW by the input tokens as they are.
 *
 * The engine-queue curve is two more rows of the same width (appended: the
 * rows before keep their places): ttft and e2e by the engine's `waiting`
 * as last scraped when the request was dispatched (0, 1, 2-3, 4-7, ...
 * log2 buckets of waiting + 1: engine_queue_bucket), counting only requests
 * with a fresh engine view (engine_seen.fresh). */
#define INFLIGHT_BUCKETS 12
#define PROMPT_BUCKETS 22
enum curve_metric { CURVE_TTFT, CURVE_ITL, CURVE_E2E, CURVE_QUEUE_TTFT, CURVE_QUEUE_E2E, CURVE__COUNT };
#define ENGINE_QUEUE_BUCKETS INFLIGHT_BUCKETS
#define PROMPT_CURVES 2 /* by prefill, raw */

#define SLOT_CURVE(c, b) (HM__COUNT + (c)*INFLIGHT_BUCKETS + (b))
#define SLOT_PROMPT_CURVE(p, b) (HM__COUNT + CURVE__COUNT * INFLIGHT_BUCKETS + (p)*PROMPT_BUCKETS + (b))
#define SLOT_PROMPT(b) SLOT_PROMPT_CURVE(0, b)
#define SLOT_PROMPT_RAW(b) SLOT_PROMPT_CURVE(1, b)
#define SLICE_SLOTS (HM__COUNT + CURVE__COUNT * INFLIGHT_BUCKETS + PROMPT_CURVES * PROMPT_BUCKETS)

struct slice {
	uint64_t counters[CT__COUNT];
	struct hist *slot[SLICE_SLOTS]; /* NULL until used; owned by the slice */
};

/* Thresholds that make a request count as met or missed (goodput). */
struct slo {
	uint64_t ttft_us;
	uint64_t tpot_us;
	uint64_t itl_us; /* the longest gap between token events; 0: not checked */
};

const char *hist_metric_name(enum hist_metric m);
enum metric_unit hist_metric_unit(enum hist_metric m);
const char *slice_counter_name(unsigned c); /* includes "errors_<kind>" */

/* log2 bucket of a value: 0 for v <= 1, ceil(log2 v) above, capped at n-1. */
unsigned log2_bucket(uint64_t v, unsigned n);
/* Inclusive bounds of bucket b as log2_bucket defines it. */
uint64_t log2_bucket_low(unsigned b);
uint64_t log2_bucket_high(unsigned b, unsigned n);

/* The engine-queue curve's bucket of `waiting` requests, and its inclusive
 * bounds (the last bucket's high is UINT64_MAX). */
unsigned engine_queue_bucket(uint64_t waiting);
uint64_t engine_queue_low(unsigned b);
uint64_t engine_queue_high(unsigned b);

/* The histogram in `slot`, allocated on first use; NULL if out of memory
 * (the sample is then dropped, never the request). */
struct hist *slice_hist(struct slice *s, unsigned slot);

/* Records one finished request. `load` is how many requests were on or
 * queued for the upstream when it was routed, itself included (0: not
 * known); it is stored as the "inflight" histogram and picks the curve
 * bucket. The engine's queue at dispatch (r->engine, when fresh) picks the
 * engine-queue curve's bucket. */
void slice_record_request(struct slice *s, const struct req_record *r, unsigned load, const struct slo *slo);

/* Records `n` ITL gaps of the same length, in µs rounded to nearest as
 * every other duration is (and as the access log prints them). */
static inline void slice_record_itl_n(struct slice *s, uint64_t gap_ns, unsigned load, uint64_t n)
{
	struct hist *h = slice_hist(s, HM_ITL);
	struct hist *c = slice_hist(s, SLOT_CURVE(CURVE_ITL, log2_bucket(load, INFLIGHT_BUCKETS)));
	uint64_t us = (gap_ns + 500) / 1000;
	if (h)
		hist_record_n(h, us, n);
	if (c)
		hist_record_n(c, us, n);
}

/* Records one token event that carried `n` tokens (record_event_tokens). */
static inline void slice_record_event_tokens(struct slice *s, uint64_t n)
{
	struct hist *h = slice_hist(s, HM_TOKENS_PER_EVENT);
	if (h)
		hist_record(h, n);
}

/* Records one ITL gap. */
static inline void slice_record_itl(struct slice *s, uint64_t gap_ns, unsigned load)
{
	slice_record_itl_n(s, gap_ns, load, 1);
}

bool slice_empty(const struct slice *s);
void slice_merge(struct slice *dst, const struct slice *src);
/* Empties the slice, keeping its histograms allocated for reuse. */
void slice_clear(struct slice *s);
/* Frees the histograms; the slice is empty afterwards. */
void slice_release(struct slice *s);

/* Drops the load-curve and prompt-length histograms (kept at hour
 * granularity only, where minute slices would cost most of their size). */
void slice_drop_curves(struct slice *s);

/* Encodes into a malloc'd buffer; returns its length, 0 on failure. */
size_t slice_encode(const struct slice *s, uint8_t **out);
/* Adds an encoded slice into `dst`; -1 (dst unchanged) on malformed input. */
int slice_decode_merge(struct slice *dst, const uint8_t *in, size_t len);
