/*
 * sim_api.c — the endpoints of tokentap-sim: which path is which API, the
 * fixed answers (the model list, /metrics, /health, the simulator's own
 * /sim/stats), the start of a generating response (its request read into a
 * struct sim_stream: tokens, reasoning, cache, tool call, id, timing), and
 * the stream's steps, each handed to the file of its API (sim_api.h):
 * the preamble, the reasoning block opened and closed, the answer opened,
 * one event per token, the end of a stream, or the whole body.
 *
 * This file decides *what* is sent; sim_conn.c decides *when*. sim_conn
 * calls sim_api_token() once per token at the pace it chooses, then
 * sim_api_finish(). Every streamed event is written as one HTTP chunk.
 *
 * Invariant: response bodies depend only on (seed, path, body, x-sim-*
 * overrides). "created" stamps and Ollama's created_at / durations are
 * derived from the seed and the nominal timing, never from a clock.
 */
#include "sim_api.h"

#include <event2/buffer.h>
#include <jansson.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- fixed endpoints ---- */

static uint64_t created_from_seed(void)
{
	/* 2023-11-14 plus up to a year: plausible, fixed for a given seed. */
	return 1700000000ULL + sim_mix(sim_cfg.seed ^ 0x6372656174656400ULL) % 31536000ULL;
}

static void write_models(struct evbuffer *out, const struct sim_api_request *rq)
{
	struct evbuffer *b = evbuffer_new();

	evbuffer_add(b, "{\"object\":\"list\",\"data\":[{\"id\":", 31);
	sim_json_str(b, sim_cfg.model, strlen(sim_cfg.model));
	evbuffer_add_printf(b, ",\"object\":\"model\",\"created\":%" PRIu64 ",\"owned_by\":\"tokentap-sim\",\"root\":",
			    created_from_seed());
	sim_json_str(b, sim_cfg.model, strlen(sim_cfg.model));
	evbuffer_add(b, "}]}", 3);
	write_whole(out, 200, "application/json", b, rq->request_id, rq->keep_alive);
	evbuffer_free(b);
}

static void write_metrics(struct evbuffer *out, const struct sim_api_request *rq)
{
	struct evbuffer *b = evbuffer_new();

	sim_metrics_write(b);
	write_whole(out, 200, "text/plain; version=0.0.4; charset=utf-8", b, rq->request_id, rq->keep_alive);
	evbuffer_free(b);
}

static void write_stats(struct evbuffer *out, const struct sim_api_request *rq)
{
	struct evbuffer *b = evbuffer_new();
	const char *id = sim_stats.last_request_id ? sim_stats.last_request_id : "";

	evbuffer_add_printf(b,
			    "{\"requests\":%" PRIu64 ",\"completed\":%" PRIu64 ",\"aborted\":%" PRIu64
			    ",\"last_abort_ns\":%" PRIu64 ",\"open_connections\":%" PRIu64 ",\"bytes_sent\":%" PRIu64
			    ",\"last_request_id\":",
			    sim_stats.requests, sim_stats.completed, sim_stats.aborted, sim_stats.last_abort_ns,
			    sim_stats.open_connections, sim_stats.bytes_sent);
	sim_json_str(b, id, strlen(id));
	if (sim_cfg.batching) {
		evbuffer_add(b, ",\"batch\":", 9);
		sim_batch_stats_json(b);
	}
	if (sim_cfg.prefix_cache) {
		const struct sim_cache_stats *cs = sim_cache_stats();

		evbuffer_add_printf(b,
				    ",\"prefix_cache\":{\"lookups\":%" PRIu64 ",\"prompt_tokens\":%" PRIu64
				    ",\"cached_tokens\":%" PRIu64 ",\"capacity_tokens\":%" PRIu64
				    ",\"resident_tokens\":%" PRIu64 ",\"evicted_blocks\":%" PRIu64 "}",
				    cs->lookups, cs->prompt_tokens, cs->cached_tokens, cs->capacity_tokens,
				    cs->resident_tokens, cs->evicted_blocks);
	}
	evbuffer_add(b, "}", 1);
	write_whole(out, 200, "application/json", b, rq->request_id, rq->keep_alive);
	evbuffer_free(b);
}

static void set_id(struct sim_stream *s)
{
	static const char b62[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
	uint64_t a = sim_prng_next(&s->prng), b = sim_prng_next(&s->prng);

	snprintf(s->hex, sizeof(s->hex), "%016" PRIx64 "%016" PRIx64, a, b);
	switch (s->ep) {
	case EP_CHAT: snprintf(s->id, sizeof(s->id), "chatcmpl-%016" PRIx64 "%016" PRIx64, a, b); break;
	case EP_COMPLETIONS: snprintf(s->id, sizeof(s->id), "cmpl-%016" PRIx64 "%016" PRIx64, a, b); break;
	case EP_RESPONSES: /* "resp_" + 32 hex; the message item's id is "msg_" + the same hex */
		snprintf(s->id, sizeof(s->id), "resp_%016" PRIx64 "%016" PRIx64, a, b);
		break;
	case EP_BEDROCK_INVOKE:
	case EP_MESSAGES: {
		char *p = s->id + 6;

		memcpy(s->id, "msg_01", 6);
		for (int i = 0; i < 22; i++) {
			uint64_t *src = i < 11 ? &a : &b;

			*p++ = b62[*src % 62];
			*src /= 62;
		}
		*p = '\0';
		break;
	}
	case EP_GEMINI:
	case EP_GEMINI_STREAM: /* responseId: 22 letters and digits */
		for (int i = 0; i < 22; i++) {
			uint64_t *src = i < 11 ? &a : &b;

			s->id[i] = b62[*src % 62];
			*src /= 62;
		}
		s->id[22] = '\0';
		break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE:
	case EP_LLAMACPP:
	case EP_TGI:
	case EP_TGI_STREAM:
	case EP_BEDROCK_CONVERSE:
		s->id[0] = '\0'; /* Ollama, llama.cpp's, TGI's and Converse's answers carry no id */
		break;
	}
}

static char *json_literal(const char *s)
{
	struct evbuffer *b = evbuffer_new();
	size_t n;
	char *r;

	sim_json_str(b, s, strlen(s));
	n = evbuffer_get_length(b);
	r = malloc(n + 1);
	if (r != NULL) {
		evbuffer_remove(b, r, n);
		r[n] = '\0';
	}
	evbuffer_free(b);
	return r;
}

static bool endpoint_of(const char *path, enum sim_endpoint *ep)
{
	static const struct {
		const char *path;
		enum sim_endpoint ep;
	} map[] = {
		{ "/v1/chat/completions", EP_CHAT },
		{ "/v1/completions", EP_COMPLETIONS },
		{ "/v1/messages", EP_MESSAGES },
		{ "/api/chat", EP_OLLAMA_CHAT },
		{ "/api/generate", EP_OLLAMA_GENERATE },
		{ "/v1/responses", EP_RESPONSES },
		{ "/responses", EP_RESPONSES },
		{ "/completion", EP_LLAMACPP },
		{ "/generate", EP_TGI },
		{ "/generate_stream", EP_TGI_STREAM },
	};

	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
		if (strcmp(path, map[i].path) == 0) {
			*ep = map[i].ep;
			return true;
		}
	}
	return false;
}

static enum sim_family family_of(enum sim_endpoint ep)
{
	switch (ep) {
	case EP_GEMINI:
	case EP_GEMINI_STREAM: return FAM_GOOGLE;
	case EP_MESSAGES: return FAM_ANTHROPIC;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE: return FAM_OLLAMA;
	default: return FAM_OPENAI;
	}
}

/* Parses the body of a generation request into a stream, or answers 400. */
static struct sim_stream *begin_generation(enum sim_endpoint ep, const struct sim_api_request *rq, struct evbuffer *out,
					   struct sim_plan *plan, const char *path_model)
{
	enum sim_family fam = family_of(ep);
	struct sim_stream *s = NULL;
	json_error_t jerr;
	json_t *req = NULL, *model, *stream;
	const char *why = NULL;
	char msg[256];
	int64_t limit;
	uint64_t ttft_ms, itl_ms;

	if (rq->header_error != NULL) {
		write_error(out, fam, 400, rq->header_error, rq);
		goto out;
	}
	req = json_loadb(rq->body, rq->body_len, JSON_ALLOW_NUL, &jerr);
	if (req == NULL) {
		snprintf(msg, sizeof(msg), "request body is not valid JSON: %s (line %d, column %d)", jerr.text,
			 jerr.line, jerr.column);
		write_error(out, fam, 400, msg, rq);
		goto out;
	}
	if (!json_is_object(req)) {
		write_error(out, fam, 400, "request body must be a JSON object", rq);
		goto out;
	}
	if (output_limit(ep, req, &limit, &why) == -1) {
		write_error(out, fam, 400, why, rq);
		goto out;
	}

	if (rq->think_ms > 86400000 || rq->reasoning_tokens > (1LL << 40) || rq->cached_tokens > (1LL << 40) ||
	    rq->cache_write_tokens > (1LL << 40) || rq->tokens > (1LL << 40)) {
		write_error(out, fam, 400, "an x-sim-* header is out of range (ms up to 86400000, tokens up to 2^40)",
			    rq);
		goto out;
	}

	s = calloc(1, sizeof(*s));
	if (s == NULL || (s->ev = evbuffer_new()) == NULL || (s->text = evbuffer_new()) == NULL ||
	    (s->reason = evbuffer_new()) == NULL || (s->piece = evbuffer_new()) == NULL) {
		write_error(out, fam, 500, "out of memory", rq);
		sim_api_free(s);
		s = NULL;
		goto out;
	}
	s->ep = ep;
	s->keep_alive = rq->keep_alive;
	stream = json_object_get(req, "stream");
	if (fam == FAM_OLLAMA)
		s->streaming = !json_is_false(stream); /* Ollama streams by default */
	else if (ep == EP_TGI || ep == EP_TGI_STREAM || ep == EP_GEMINI || ep == EP_GEMINI_STREAM)
		s->streaming = ep == EP_TGI_STREAM || ep == EP_GEMINI_STREAM; /* the route decides, not the body */
	else if (ep == EP_BEDROCK_CONVERSE || ep == EP_BEDROCK_INVOKE)
		s->streaming = strstr(rq->path, "-stream") != NULL; /* so does Bedrock's */
	else
		s->streaming = json_is_true(stream);
	s->details = json_is_true(json_object_get(json_object_get(req, "parameters"), "details"));
	s->sse = ep == EP_GEMINI_STREAM && query_alt_sse(rq->query);
	s->include_usage = json_is_true(json_object_get(json_object_get(req, "stream_options"), "include_usage"));
	s->continuous_usage = s->include_usage && json_is_true(json_object_get(json_object_get(req, "stream_options"),
									       "continuous_usage_stats"));
	s->spec = ep == EP_CHAT || ep == EP_COMPLETIONS
			  ? (rq->spec_tokens >= 0 ? (uint64_t)rq->spec_tokens : sim_cfg.spec_tokens)
			  : 1;

	if (rq->tokens >= 0)
		s->n_out = (uint64_t)rq->tokens;
	else if (limit >= 0)
		s->n_out = (uint64_t)limit;
	else
		s->n_out = sim_cfg.tokens;
	s->hit_limit = limit >= 0 && s->n_out >= (uint64_t)limit;
	prompt_text(ep, req, s->piece); /* scratch until the first token */
	s->n_in = (evbuffer_get_length(s->piece) + 3) / 4;
	if (s->n_in == 0)
		s->n_in = 1;

	/* Reasoning: the header, else the request turning it off, else the
	 * flag, else what the request asks for. */
	{
		int64_t asked = request_reasoning(ep, req);

		if (ep == EP_COMPLETIONS || ep == EP_LLAMACPP || ep == EP_TGI || ep == EP_TGI_STREAM)
			s->n_reason = 0; /* the APIs without a reasoning field */
		else if (rq->reasoning_tokens >= 0)
			s->n_reason = (uint64_t)rq->reasoning_tokens;
		else if (asked == 0)
			s->n_reason = 0;
		else if (sim_cfg.reasoning_tokens > 0)
			s->n_reason = sim_cfg.reasoning_tokens;
		else
			s->n_reason = asked > 0 ? (uint64_t)asked : 0;
	}
	s->think_ns = (rq->think_ms >= 0 ? (uint64_t)rq->think_ms : sim_cfg.think_ms) * 1000000ULL;
	s->hidden =
		s->n_reason > 0 && (rq->reasoning_hidden >= 0 ? rq->reasoning_hidden == 1 : sim_cfg.reasoning_hidden);
	/* Gemini sends thoughts (summaries) only with includeThoughts */
	if ((ep == EP_GEMINI || ep == EP_GEMINI_STREAM) && rq->reasoning_hidden < 0 &&
	    !json_is_true(json_object_get(json_object_get(json_object_get(req, "generationConfig"), "thinkingConfig"),
					  "includeThoughts")))
		s->hidden = s->n_reason > 0;
	s->summary =
		ep == EP_RESPONSES && json_is_string(json_object_get(json_object_get(req, "reasoning"), "summary"));

	/* The prefix cache: what the header or the flag says, within the
	 * prompt; else, with --prefix-cache, what the cache model remembers. */
	if (rq->cached_tokens >= 0 || sim_cfg.cached_tokens >= 0 || !sim_cfg.prefix_cache) {
		int64_t c = rq->cached_tokens >= 0 ? rq->cached_tokens : sim_cfg.cached_tokens;
		uint64_t w =
			rq->cache_write_tokens >= 0 ? (uint64_t)rq->cache_write_tokens : sim_cfg.cache_write_tokens;

		s->cache_report = c >= 0 || rq->cache_write_tokens >= 0 || sim_cfg.cache_write_tokens > 0;
		s->n_cached = c > 0 ? ((uint64_t)c < s->n_in ? (uint64_t)c : s->n_in) : 0;
		s->n_cache_write = w < s->n_in - s->n_cached ? w : s->n_in - s->n_cached;
	} else {
		size_t plen = evbuffer_get_length(s->piece);

		s->cache_report = true;
		sim_cache_use(plen ? (const char *)evbuffer_pullup(s->piece, -1) : "", plen, s->n_in, &s->n_cached,
			      &s->n_cache_write);
	}
	evbuffer_drain(s->piece, evbuffer_get_length(s->piece));

	/* Tool calls: the header, else tools in the request, else the flag. */
	if (endpoint_has_tools(ep) && rq->tool_call != 0) {
		const char *tool = request_tool(ep, req);

		if (tool == NULL && (rq->tool_call == 1 || sim_cfg.tool_calls))
			tool = "sim_tool";
		if (tool != NULL) {
			s->tool = true;
			s->tool_json = json_literal(tool);
			if (s->tool_json == NULL) {
				sim_api_free(s);
				s = NULL;
				write_error(out, fam, 500, "out of memory", rq);
				goto out;
			}
			if (s->n_out == 0)
				s->n_out = 1; /* a call has arguments */
		}
	}

	model = json_object_get(req, "model");
	if (ep == EP_BEDROCK_CONVERSE || ep == EP_BEDROCK_INVOKE) {
		const char *op;
		char *m = NULL;
		if (sim_bedrock_path(rq->path, &op, &m))
			s->model_json = json_literal(m); /* Bedrock names it in the path */
		free(m);
		if (rq->exception != NULL)
			s->exception = strdup(rq->exception);
	} else if (path_model != NULL) {
		s->model_json = json_literal(path_model); /* so does Gemini */
	} else {
		s->model_json =
			json_literal(json_is_string(model) && json_string_length(model) > 0 ? json_string_value(model)
											    : sim_cfg.model);
	}
	if (rq->request_id != NULL)
		s->request_id = strdup(rq->request_id);
	if (s->model_json == NULL || (rq->request_id != NULL && s->request_id == NULL) ||
	    (rq->exception != NULL && (ep == EP_BEDROCK_CONVERSE || ep == EP_BEDROCK_INVOKE) && s->exception == NULL)) {
		sim_api_free(s);
		s = NULL;
		write_error(out, fam, 500, "out of memory", rq);
		goto out;
	}

	/* The whole body, not just the prompt, picks the words: two requests
	 * differing in any byte are different streams. */
	s->prng.state = sim_mix(sim_cfg.seed ^ sim_hash(rq->body, rq->body_len,
							sim_hash(rq->path, strlen(rq->path), 0xcbf29ce484222325ULL)));
	s->created = created_from_seed();
	s->spec_prng.state = sim_mix(s->prng.state ^ 0x5bd1e995u); /* its own stream: the words stay the same */
	set_id(s);

	ttft_ms = rq->ttft_ms >= 0 ? (uint64_t)rq->ttft_ms : sim_cfg.ttft_ms;
	itl_ms = rq->itl_ms >= 0 ? (uint64_t)rq->itl_ms : sim_cfg.itl_ms;
	s->ttft_ns = ttft_ms * 1000000ULL;
	s->itl_ns = itl_ms * 1000000ULL;
	/* --batching paces every request the scheduler's way, except one
	 * asking for fixed timing. Bodies stay a pure function of the request:
	 * Ollama's nominal times are then those of an unloaded server. */
	plan->batched = sim_cfg.batching && rq->ttft_ms < 0 && rq->itl_ms < 0;
	if (plan->batched) {
		s->ttft_ns = sim_batch_nominal_ttft_ns(s->n_in - s->n_cached > 0 ? s->n_in - s->n_cached : 1);
		s->itl_ns = sim_batch_nominal_itl_ns();
	}

	plan->ttft_ns = s->ttft_ns;
	plan->itl_ns = s->itl_ns;
	plan->tokens = s->n_reason + s->n_out;
	plan->reasoning_tokens = s->n_reason;
	plan->think_ns = plan->batched ? 0 : s->think_ns;
	if (plan->batched)
		s->think_ns = 0; /* the batch paces every token alike */
	/* Cached prompt tokens need no prefill (the batching model's ttft). */
	plan->prompt_tokens = s->n_in - s->n_cached > 0 ? s->n_in - s->n_cached : 1;
	plan->streaming = s->streaming;

	if (s->streaming && fam == FAM_GOOGLE && !s->sse)
		write_head(out, 200, "application/json; charset=UTF-8", -1, s->request_id, s->keep_alive);
	else if (s->streaming)
		write_head(out, 200,
			   fam == FAM_OLLAMA					  ? "application/x-ndjson"
			   : ep == EP_BEDROCK_CONVERSE || ep == EP_BEDROCK_INVOKE ? "application/vnd.amazon.eventstream"
										  : "text/event-stream; charset=utf-8",
			   -1, s->request_id, s->keep_alive);
out:
	json_decref(req);
	return s;
}

/* An embeddings or rerank request: the whole answer is made now (in s->ev)
 * and sent after x-sim-itl-ms (else --itl-ms) per input, no token events,
 * whatever --batching says. */
static struct sim_stream *begin_embed(bool rerank, const struct sim_api_request *rq, struct evbuffer *out,
				      struct sim_plan *plan)
{
	struct sim_stream *s = NULL;
	json_error_t jerr;
	json_t *req = NULL, *model;
	char msg[256];
	uint64_t inputs = 0, itl_ms = rq->itl_ms >= 0 ? (uint64_t)rq->itl_ms : sim_cfg.itl_ms;
	int rc;

	if (rq->header_error != NULL) {
		write_error(out, FAM_OPENAI, 400, rq->header_error, rq);
		goto out;
	}
	req = json_loadb(rq->body, rq->body_len, JSON_ALLOW_NUL, &jerr);
	if (!json_is_object(req)) {
		write_error(out, FAM_OPENAI, 400, "request body is not a JSON object", rq);
		goto out;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL || (s->ev = evbuffer_new()) == NULL)
		goto oom;
	s->whole = true;
	s->keep_alive = rq->keep_alive;
	model = json_object_get(req, "model");
	s->model_json = json_literal(json_is_string(model) && json_string_length(model) > 0 ? json_string_value(model)
											    : sim_cfg.model);
	if (rq->request_id != NULL)
		s->request_id = strdup(rq->request_id);
	if (s->model_json == NULL || (rq->request_id != NULL && s->request_id == NULL))
		goto oom;
	rc = rerank ? sim_rerank_body(req, s->model_json, s->ev, &inputs, msg, sizeof(msg))
		    : sim_embed_body(req, s->model_json, s->ev, &inputs, msg, sizeof(msg));
	if (rc == -1) {
		sim_api_free(s);
		s = NULL;
		write_error(out, FAM_OPENAI, 400, msg, rq);
		goto out;
	}
	plan->ttft_ns = inputs * itl_ms * 1000000ULL;
	goto out;
oom:
	sim_api_free(s);
	s = NULL;
	write_error(out, FAM_OPENAI, 500, "out of memory", rq);
out:
	json_decref(req);
	return s;
}

struct sim_stream *sim_api_begin(const struct sim_api_request *rq, struct evbuffer *out, struct sim_plan *plan)
{
	enum sim_endpoint ep;
	char msg[320];

	memset(plan, 0, sizeof(*plan));
	if (strcmp(rq->path, "/metrics") == 0 && strcmp(rq->method, "GET") == 0) {
		write_metrics(out, rq);
		return NULL;
	}
	if (strcmp(rq->path, "/sim/stats") == 0 || strcmp(rq->path, "/v1/models") == 0 ||
	    strcmp(rq->path, "/health") == 0) {
		if (strcmp(rq->method, "GET") != 0) {
			snprintf(msg, sizeof(msg), "%s takes GET, not %s", rq->path, rq->method);
			write_error(out, FAM_OPENAI, 405, msg, rq);
		} else if (rq->path[1] == 's') {
			write_stats(out, rq);
		} else if (rq->path[1] == 'v') {
			write_models(out, rq);
		} else {
			write_head(out, 200, NULL, 0, rq->request_id, rq->keep_alive);
		}
		return NULL;
	}
	if (strcmp(rq->path, "/v1/embeddings") == 0 || strcmp(rq->path, "/v1/rerank") == 0 ||
	    strcmp(rq->path, "/rerank") == 0) {
		if (strcmp(rq->method, "POST") == 0)
			return begin_embed(rq->path[strlen(rq->path) - 1] == 'k', rq, out, plan);
		snprintf(msg, sizeof(msg), "%s takes POST, not %s", rq->path, rq->method);
		write_error(out, FAM_OPENAI, 405, msg, rq);
		return NULL;
	}
	{
		const char *op;
		char *m = NULL;
		if (sim_bedrock_path(rq->path, &op, &m)) {
			free(m);
			ep = strncmp(op, "converse", 8) == 0 ? EP_BEDROCK_CONVERSE : EP_BEDROCK_INVOKE;
			if (strcmp(rq->method, "POST") == 0)
				return begin_generation(ep, rq, out, plan, NULL);
			snprintf(msg, sizeof(msg), "%s takes POST, not %s", rq->path, rq->method);
			write_error(out, FAM_OPENAI, 405, msg, rq);
			return NULL;
		}
	}
	char gmodel[256];
	bool gemini = gemini_endpoint(rq->path, &ep, gmodel, sizeof(gmodel));
	if (!gemini && !endpoint_of(rq->path, &ep)) {
		snprintf(msg, sizeof(msg), "no such endpoint: %s %.200s", rq->method, rq->path);
		write_error(out, FAM_OPENAI, 404, msg, rq);
		return NULL;
	}
	if (strcmp(rq->method, "POST") != 0) {
		snprintf(msg, sizeof(msg), "%.200s takes POST, not %s", rq->path, rq->method);
		write_error(out, family_of(ep), 405, msg, rq);
		return NULL;
	}
	return begin_generation(ep, rq, out, plan, gemini ? gmodel : NULL);
}

/* ---- shared by the writers of each API ---- */

const char *finish_reason(const struct sim_stream *s)
{
	if (s->ep == EP_BEDROCK_CONVERSE)
		return s->hit_limit ? "max_tokens" : "end_turn";
	if (s->ep == EP_MESSAGES || s->ep == EP_BEDROCK_INVOKE)
		return s->tool ? "tool_use" : s->hit_limit ? "max_tokens" : "end_turn";
	if (s->tool && s->ep != EP_OLLAMA_CHAT) /* Ollama says "stop" after a call */
		return "tool_calls";
	return s->hit_limit ? "length" : "stop";
}

/* The contents of b as a string (valid until b changes). */
const char *buf_text(struct evbuffer *b, size_t *len)
{
	*len = evbuffer_get_length(b);
	return *len ? (const char *)evbuffer_pullup(b, -1) : "";
}

/* Appends t JSON-escaped without the quotes: text inside a JSON string. */
static void json_inner(struct evbuffer *b, const char *t, size_t len)
{
	struct evbuffer *tmp = evbuffer_new();
	size_t n;

	sim_json_str(tmp, t, len);
	n = evbuffer_get_length(tmp);
	evbuffer_drain(tmp, 1);
	evbuffer_remove_buffer(tmp, b, n - 2);
	evbuffer_free(tmp);
}

/*
 * Draws the next word and appends the text its token carries to dst: the
 * word itself, or, for the answer of a tool call, its piece of the
 * arguments {"input":"<the words>"} (the first piece opens the object, the
 * last closes it, so the pieces join into one JSON object). Returns true
 * for a reasoning token. The first reasoning word and the first answer
 * word carry no leading space.
 */
static bool draw_piece(struct sim_stream *s, struct evbuffer *dst)
{
	uint64_t k = s->drawn++;
	bool reasoning = k < s->n_reason;
	size_t wlen;
	const char *w = sim_text_word(&s->prng, k == 0 || k == s->n_reason, &wlen);

	if (reasoning || !s->tool) {
		evbuffer_add(dst, w, wlen);
		return reasoning;
	}
	if (k == s->n_reason)
		evbuffer_add(dst, "{\"input\":\"", 10);
	json_inner(dst, w, wlen);
	if (k + 1 == s->n_reason + s->n_out)
		evbuffer_add(dst, "\"}", 2);
	return false;
}

/* An id: prefix and the first n of the stream's hex digits. */
const char *hex_id(const struct sim_stream *s, const char *prefix, int n, char *buf, size_t size)
{
	snprintf(buf, size, "%s%.*s", prefix, n, s->hex);
	return buf;
}

/* The nominal moment of token k (k == all tokens: the end). */
uint64_t nominal_ns(const struct sim_stream *s, uint64_t k)
{
	return s->ttft_ns + k * s->itl_ns + (k >= s->n_reason ? s->think_ns : 0);
}

/* Reasoning the client sees: tokens, not hidden. */
bool shows_reasoning(const struct sim_stream *s)
{
	return s->n_reason > 0 && !s->hidden;
}

/* The answer block's index: after the thinking block when there is one. */
int answer_index(const struct sim_stream *s)
{
	return shows_reasoning(s) ? 1 : 0;
}

/* ns as a JSON number of ms, exact (six decimals). */
void add_ms(struct evbuffer *b, const char *key, uint64_t ns)
{
	evbuffer_add_printf(b, "\"%s\":%" PRIu64 ".%06" PRIu64, key, ns / (uint64_t)1000000, ns % (uint64_t)1000000);
}

/* ---- the stream: preamble, reasoning, answer, closing ---- */

/* Events before the first token: sent together with it, at ttft, as vLLM
 * and Anthropic's API do (the role chunk comes with the first output). */
static void write_preamble(struct sim_stream *s, struct evbuffer *out)
{
	switch (s->ep) {
	case EP_CHAT: openai_preamble(s, out); break;
	case EP_MESSAGES: anthropic_preamble(s, out); break;
	case EP_RESPONSES: resp_preamble(s, out); break;
	case EP_BEDROCK_CONVERSE:
	case EP_BEDROCK_INVOKE: bedrock_preamble(s, out); break;
	case EP_COMPLETIONS:
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE:
	case EP_LLAMACPP:
	case EP_TGI:
	case EP_TGI_STREAM:
	case EP_GEMINI:
	case EP_GEMINI_STREAM: break;
	}
}

/* The first block (Anthropic) or item (Responses) opens with a ping. */
static void open_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	if (s->ep == EP_BEDROCK_CONVERSE || s->ep == EP_BEDROCK_INVOKE) {
		bedrock_open_block(s, out, 0, true);
	} else if (s->ep == EP_MESSAGES) {
		anthropic_open_reasoning(s, out);
	} else if (s->ep == EP_RESPONSES) {
		resp_open_reasoning(s, out);
	}
}

/* After the last reasoning token: the signature and the block's end
 * (Anthropic), the reasoning item's .done events (Responses). */
static void close_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	if (s->ep == EP_BEDROCK_CONVERSE || s->ep == EP_BEDROCK_INVOKE) {
		bedrock_close_block(s, out, 0);
	} else if (s->ep == EP_MESSAGES) {
		anthropic_close_reasoning(s, out);
	} else if (s->ep == EP_RESPONSES) {
		resp_close_reasoning(s, out);
	}
}

static void open_answer(struct sim_stream *s, struct evbuffer *out)
{
	s->answer_open = true;
	if (s->ep == EP_BEDROCK_CONVERSE || s->ep == EP_BEDROCK_INVOKE) {
		bedrock_open_block(s, out, answer_index(s), false);
	} else if (s->ep == EP_MESSAGES) {
		anthropic_open_answer(s, out);
	} else if (s->ep == EP_RESPONSES) {
		resp_open_answer(s, out);
	}
}

void sim_api_token(struct sim_stream *s, struct evbuffer *out)
{
	uint64_t k = s->emitted;
	bool reasoning, last;
	size_t plen;
	const char *p;

	if (k == 0) {
		write_preamble(s, out);
		if (shows_reasoning(s))
			open_reasoning(s, out);
	}
	if (k == s->n_reason)
		open_answer(s, out);
	if (s->group_left > 0) {
		/* a token of the group the last event carried */
		s->group_left--;
		s->emitted++;
		return;
	}
	evbuffer_drain(s->piece, evbuffer_get_length(s->piece));
	reasoning = draw_piece(s, s->piece);
	p = buf_text(s->piece, &plen);
	evbuffer_add(reasoning ? s->reason : s->text, p, plen);
	if (reasoning && s->hidden) {
		s->emitted++; /* thought, not said: as OpenAI's hosted models */
		s->counted++;
		return;
	}
	if (s->spec > 1) {
		/* 1 to spec tokens in this event, within reasoning or within
		 * the answer, drawn up front (words keep their order) */
		uint64_t end = reasoning ? s->n_reason : s->n_reason + s->n_out;
		uint64_t g = 1 + sim_prng_next(&s->spec_prng) % s->spec;
		if (g > end - k)
			g = end - k;
		for (uint64_t i = 1; i < g; i++) {
			size_t before = evbuffer_get_length(s->piece);
			draw_piece(s, s->piece);
			p = buf_text(s->piece, &plen);
			evbuffer_add(reasoning ? s->reason : s->text, p + before, plen - before);
		}
		s->group_left = g - 1;
	}
	s->counted += 1 + s->group_left;
	p = buf_text(s->piece, &plen);
	last = k + 1 == s->n_reason + s->n_out;
	switch (s->ep) {
	case EP_CHAT: openai_chat_token(s, k, reasoning, p, plen); break;
	case EP_COMPLETIONS: openai_completion_token(s, p, plen); break;
	case EP_MESSAGES: anthropic_token(s, reasoning, p, plen); break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE: ollama_token(s, k, reasoning, last, p, plen); break;
	case EP_RESPONSES: resp_delta(s, out, reasoning, p, plen); break;
	case EP_LLAMACPP: llamacpp_token(s, k, p, plen); break;
	case EP_TGI_STREAM: tgi_token(s, k, p, plen, last); break;
	case EP_TGI: break; /* never streamed */
	case EP_GEMINI:
	case EP_GEMINI_STREAM: gemini_token(s, k, reasoning, last, p, plen); break;
	case EP_BEDROCK_CONVERSE:
	case EP_BEDROCK_INVOKE: bedrock_token(s, out, reasoning, p, plen); break;
	}
	emit_chunk(s, out);
	s->emitted++;
	if (reasoning && s->emitted == s->n_reason)
		close_reasoning(s, out);
}

void sim_api_timing(struct sim_stream *s, const struct sim_timing *t)
{
	if (s != NULL && t != NULL && sim_cfg.server_timing != SIM_TIMING_OFF)
		s->timing = *t;
}

static void finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	if (s->emitted == 0)
		write_preamble(s, out);
	if (!s->answer_open)
		open_answer(s, out);
	switch (s->ep) {
	case EP_CHAT:
	case EP_COMPLETIONS: openai_finish_stream(s, out); break;
	case EP_MESSAGES: anthropic_finish_stream(s, out); break;
	case EP_RESPONSES: resp_finish(s, out); break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE: ollama_finish_stream(s, out); break;
	case EP_LLAMACPP: llamacpp_finish_stream(s, out); break;
	case EP_TGI_STREAM: tgi_finish_stream(s, out); break;
	case EP_TGI: break; /* never streamed */
	case EP_GEMINI:
	case EP_GEMINI_STREAM: gemini_finish_stream(s, out); break;
	case EP_BEDROCK_CONVERSE:
	case EP_BEDROCK_INVOKE: bedrock_finish(s, out); break;
	}
	evbuffer_add(out, "0\r\n\r\n", 5);
}

/* A non-streaming answer: all tokens at once, with Content-Length. */
static void finish_block(struct sim_stream *s, struct evbuffer *out)
{
	struct evbuffer *b = evbuffer_new();

	while (s->drawn < s->n_reason + s->n_out)
		draw_piece(s, s->drawn < s->n_reason ? s->reason : s->text);

	switch (s->ep) {
	case EP_CHAT:
	case EP_COMPLETIONS: openai_block(s, b); break;
	case EP_MESSAGES: anthropic_block(s, b); break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE: ollama_block(s, b); break;
	case EP_RESPONSES: resp_object(s, b, true); break;
	case EP_LLAMACPP: llamacpp_block(s, b); break;
	case EP_GEMINI:
	case EP_GEMINI_STREAM: gemini_block(s, b); break;
	case EP_TGI:
	case EP_TGI_STREAM: tgi_block(s, b); break;
	case EP_BEDROCK_CONVERSE:
	case EP_BEDROCK_INVOKE: bedrock_block(s, b); break;
	}
	if (s->ep == EP_BEDROCK_INVOKE) {
		char extra[256];
		bedrock_invoke_headers(s, extra, sizeof(extra));
		write_whole_with(out, 200, "application/json", b, s->request_id, s->keep_alive, extra);
		evbuffer_free(b);
		return;
	}
	if (s->ep == EP_TGI) {
		char extra[512];
		tgi_headers(s, extra, sizeof(extra));
		write_whole_with(out, 200, "application/json", b, s->request_id, s->keep_alive, extra);
		evbuffer_free(b);
		return;
	}
	write_whole(out, 200, "application/json", b, s->request_id, s->keep_alive);
	evbuffer_free(b);
}

void sim_api_finish(struct sim_stream *s, struct evbuffer *out)
{
	if (s->whole)
		write_whole(out, 200, "application/json", s->ev, s->request_id, s->keep_alive);
	else if (s->streaming)
		finish_stream(s, out);
	else
		finish_block(s, out);
}

void sim_api_free(struct sim_stream *s)
{
	if (s == NULL)
		return;
	if (s->ev != NULL)
		evbuffer_free(s->ev);
	if (s->text != NULL)
		evbuffer_free(s->text);
	if (s->reason != NULL)
		evbuffer_free(s->reason);
	if (s->piece != NULL)
		evbuffer_free(s->piece);
	free(s->model_json);
	free(s->tool_json);
	free(s->request_id);
	free(s->exception);
	free(s);
}
