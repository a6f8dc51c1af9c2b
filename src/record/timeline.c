/*
 * timeline.c — metrics derived from a request's timeline.
 *
 * Formulas (docs/metrics.md): queue = dispatch - req_headers;
 * connect = up_connected - dispatch; ttfb = resp_headers - arrive;
 * ttft = first_token - arrive; upstream_ttft = first_token - req_sent;
 * tpot = (last_token - first_token) / (N - 1) for N > 1;
 * e2e = resp_end - arrive; decode rate = (N - 1) / (last_token - first_token);
 * answer_ttft = first_answer - arrive; reasoning = last_reasoning -
 * first_reasoning.
 */
#include "timeline.h"

#include <math.h>
#include <stdlib.h>

static const char *const event_names[] = {
#define X(e, k) #k,
	TIMELINE_EVENTS(X)
#undef X
};

static const char *const metric_keys[] = {
#define X(e, k, u) #k,
	REQUEST_METRICS(X)
#undef X
};

static const char *const error_names[] = {
#define X(e, n) n,
	REQUEST_ERRORS(X)
#undef X
};

const char *timeline_event_name(enum tl_event e)
{
	return event_names[e];
}

const char *req_metric_key(enum req_metric m)
{
	return metric_keys[m];
}

const char *req_error_name(enum req_error e)
{
	return error_names[e];
}

void record_apply_outcome(struct req_record *r)
{
	if (r->error != REQ_ERR_NONE)
		return;
	switch (r->usage.outcome) {
	case OUTCOME_FAILED: r->error = REQ_ERR_RESPONSE_FAILED; break;
	case OUTCOME_INCOMPLETE: r->error = REQ_ERR_RESPONSE_INCOMPLETE; break;
	case OUTCOME_NONE: break;
	}
}

/* The reasoning span and the first answer token. Reasoning after the
 * answer (a model that thinks again between tool calls) stretches the
 * span. */
static void note_kind(struct req_record *r, enum token_kind kind, uint64_t now)
{
	if (kind == TOKEN_REASONING) {
		r->reasoning_events++;
		timeline_mark(r, TL_FIRST_REASONING, now);
		if (now > r->at[TL_LAST_REASONING])
			r->at[TL_LAST_REASONING] = now;
		return;
	}
	if (kind == TOKEN_TOOL)
		r->tool_call_events++;
	timeline_mark(r, TL_FIRST_ANSWER, now);
}

bool record_event_tokens(struct req_record *r, uint64_t *n)
{
	int64_t out = r->usage.output_tokens;

	if (r->tpe_on == 0)
		r->tpe_on = (r->api == API_OPENAI_CHAT || r->api == API_OPENAI_COMPLETIONS) && out >= 0 ? 1 : -1;
	if (r->tpe_on < 0 || out == r->tpe_last)
		return false;
	if (out < r->tpe_last) {
		r->tpe_on = -1;
		return false;
	}
	*n = (uint64_t)(out - r->tpe_last);
	r->tpe_last = out;
	r->tpe_events++;
	r->tpe_tokens += *n;
	return true;
}

bool record_token_event(struct req_record *r, enum token_kind kind, uint64_t now, uint64_t *gap_out)
{
	r->token_events++;
	if (!r->at[TL_FIRST_TOKEN]) {
		r->at[TL_FIRST_TOKEN] = now;
		r->at[TL_LAST_TOKEN] = now;
		note_kind(r, kind, now);
		return false;
	}
	/* Stamps from a kernel receive time mapped onto CLOCK_MONOTONIC can
	 * land a little before the previous one (the mapping's offset is taken
	 * again each second): the timeline does not go back, the gap is 0. */
	if (now < r->at[TL_LAST_TOKEN])
		now = r->at[TL_LAST_TOKEN];
	note_kind(r, kind, now);
	uint64_t gap = now - r->at[TL_LAST_TOKEN];
	*gap_out = gap;
	r->at[TL_LAST_TOKEN] = now;
	r->itl_total++;
	r->itl_sum += gap;
	if (gap > r->itl_max)
		r->itl_max = gap;
	if (!r->itl_keep || r->itl_n == ITL_SAMPLES_MAX)
		return true;
	if (r->itl_n == r->itl_cap) {
		size_t cap = r->itl_cap ? r->itl_cap * 2 : 64;
		uint64_t *p = realloc(r->itl_ns, cap * sizeof(*p));
		if (!p)
			return true; /* losing a logged sample beats failing the stream */
		r->itl_ns = p;
		r->itl_cap = cap;
	}
	r->itl_ns[r->itl_n++] = gap;
	return true;
}

int64_t record_output_tokens(const struct req_record *r)
{
	if (r->usage.output_tokens >= 0)
		return r->usage.output_tokens;
	return (int64_t)r->token_events;
}

static double span_ms(const struct req_record *r, enum tl_event from, enum tl_event to)
{
	if (!r->at[from] || !r->at[to] || r->at[to] < r->at[from])
		return NAN;
	return (double)(r->at[to] - r->at[from]) / 1e6;
}

static double ns_ms(int64_t ns)
{
	return ns < 0 ? NAN : (double)ns / 1e6;
}

/*
 * What neither side accounts for, when the server reported its timings:
 * the time from the request sent to the first token (streamed) or to the
 * response's end (non-streamed), less every server phase that falls in it.
 * That is the network both ways and the server's front end (HTTP,
 * tokenizing, detokenizing) where the engine does not time it. NaN when
 * the server said nothing, or nothing that falls in the span. It can come
 * out below 0 only when the server's clock and tokentap's disagree
 * (docs/metrics.md).
 */
static double unattributed_ms(const struct req_record *r)
{
	const struct server_timing *t = &r->usage.server;
	double span, sum = 0;
	bool whole;

	if (t->source == SERVER_NONE)
		return NAN;
	whole = !r->at[TL_FIRST_TOKEN];
	span = whole ? span_ms(r, TL_REQ_SENT, TL_RESP_END) : span_ms(r, TL_REQ_SENT, TL_FIRST_TOKEN);
	if (isnan(span))
		return NAN;
	int64_t parts[] = { t->queue_ns,
			    t->load_ns,
			    t->validation_ns,
			    t->prefill_ns,
			    whole ? -1 : t->first_byte_ns, /* Bedrock: all of the server's part of the ttft */
			    whole ? t->decode_ns : -1,
			    whole ? t->inference_ns : -1 };
	bool any = false; /* the server reported some phase that falls in the span */
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		any |= parts[i] >= 0;
		if (parts[i] > 0)
			sum += (double)parts[i] / 1e6;
	}
	/* A stream whose server timed only the whole call (Bedrock Converse's
	 * latencyMs) says nothing of its ttft: no remainder to attribute. */
	return any ? span - sum : NAN;
}

void record_derive(const struct req_record *r, double out[RM__COUNT])
{
	int64_t n = record_output_tokens(r);
	double decode = span_ms(r, TL_FIRST_TOKEN, TL_LAST_TOKEN);

	out[RM_QUEUE] = span_ms(r, TL_REQ_HEADERS, TL_DISPATCH);
	out[RM_CONNECT] = span_ms(r, TL_DISPATCH, TL_UP_CONNECTED);
	out[RM_TTFB] = span_ms(r, TL_ARRIVE, TL_RESP_HEADERS);
	out[RM_TTFT] = span_ms(r, TL_ARRIVE, TL_FIRST_TOKEN);
	out[RM_UPSTREAM_TTFT] = span_ms(r, TL_REQ_SENT, TL_FIRST_TOKEN);
	out[RM_E2E] = span_ms(r, TL_ARRIVE, TL_RESP_END);
	out[RM_ANSWER_TTFT] = span_ms(r, TL_ARRIVE, TL_FIRST_ANSWER);
	out[RM_REASONING] = span_ms(r, TL_FIRST_REASONING, TL_LAST_REASONING);
	out[RM_UPLOAD] = span_ms(r, TL_UP_CONNECTED, TL_REQ_SENT);
	out[RM_SERVER_QUEUE] = ns_ms(r->usage.server.queue_ns);
	out[RM_SERVER_LOAD] = ns_ms(r->usage.server.load_ns);
	out[RM_SERVER_VALIDATION] = ns_ms(r->usage.server.validation_ns);
	out[RM_SERVER_PREFILL] = ns_ms(r->usage.server.prefill_ns);
	out[RM_SERVER_DECODE] = ns_ms(r->usage.server.decode_ns);
	out[RM_SERVER_INFERENCE] = ns_ms(r->usage.server.inference_ns);
	out[RM_SERVER_TTFT] = ns_ms(r->usage.server.first_byte_ns);
	out[RM_UNATTRIBUTED] = unattributed_ms(r);
	/* A batch API's answer comes whole: its time shared by its inputs, its
	 * prompt tokens over the whole request; only for an answer (2xx), as a
	 * refusal's time says nothing of the inputs. */
	bool answered = r->status >= 200 && r->status < 300;
	out[RM_PER_INPUT] = NAN;
	out[RM_INPUT_RATE] = NAN;
	if (answered && r->inputs > 0 && !isnan(out[RM_E2E]))
		out[RM_PER_INPUT] = out[RM_E2E] / (double)r->inputs;
	if (answered && r->inputs >= 0 && r->usage.input_tokens >= 0 && out[RM_E2E] > 0)
		out[RM_INPUT_RATE] = (double)r->usage.input_tokens / (out[RM_E2E] / 1e3);
	out[RM_TOKENS_PER_EVENT] = r->tpe_events ? (double)r->tpe_tokens / (double)r->tpe_events : NAN;
	out[RM_TPOT] = NAN;
	out[RM_DECODE_RATE] = NAN;
	if (n > 1 && !isnan(decode)) {
		out[RM_TPOT] = decode / (double)(n - 1);
		if (decode > 0)
			out[RM_DECODE_RATE] = (double)(n - 1) / (decode / 1e3);
	}
}

void record_release(struct req_record *r)
{
	free(r->itl_ns);
	r->itl_ns = NULL;
	r->itl_n = r->itl_cap = 0;
}
