/*
 * sim_api.c — the endpoints of tokentap-sim and the exact bytes of every
 * response: OpenAI chat and completions (shaped like vLLM), OpenAI
 * Responses (shaped like the hosted API), Anthropic messages, Ollama chat
 * and generate, llama.cpp's native /completion, TGI's /generate and
 * /generate_stream, Gemini's :generateContent and :streamGenerateContent
 * (Google AI and Vertex AI paths; SSE or a streamed JSON array), AWS
 * Bedrock's Converse and InvokeModel (streamed as an event stream,
 * sim_bedrock.c), the model list, errors and the simulator's own /sim/stats.
 *
 * This file decides *what* is sent; sim_conn.c decides *when*. A
 * generating response is a struct sim_stream: sim_conn calls
 * sim_api_token() once per token at the pace it chooses, then
 * sim_api_finish(). Every streamed event is written as one HTTP chunk.
 *
 * Invariant: response bodies depend only on (seed, path, body, x-sim-*
 * overrides). "created" stamps and Ollama's created_at / durations are
 * derived from the seed and the nominal timing, never from a clock.
 */
#include "sim.h"

#include <event2/buffer.h>
#include <jansson.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum sim_endpoint {
	EP_CHAT,	     /* POST /v1/chat/completions */
	EP_COMPLETIONS,	     /* POST /v1/completions */
	EP_MESSAGES,	     /* POST /v1/messages (Anthropic) */
	EP_OLLAMA_CHAT,	     /* POST /api/chat */
	EP_OLLAMA_GENERATE,  /* POST /api/generate */
	EP_RESPONSES,	     /* POST /v1/responses (OpenAI Responses API) */
	EP_LLAMACPP,	     /* POST /completion (llama.cpp native) */
	EP_TGI,		     /* POST /generate (TGI, never streamed) */
	EP_TGI_STREAM,	     /* POST /generate_stream (TGI, always streamed) */
	EP_GEMINI,	     /* POST .../models/MODEL:generateContent (Gemini, Vertex AI) */
	EP_GEMINI_STREAM,    /* POST .../models/MODEL:streamGenerateContent[?alt=sse] */
	EP_BEDROCK_CONVERSE, /* POST /model/MODEL/converse(-stream) (AWS Bedrock) */
	EP_BEDROCK_INVOKE,   /* POST /model/MODEL/invoke(-with-response-stream): Anthropic's body */
};

/* Which error body a path answers with, so each client sees its own shape. */
enum sim_family { FAM_OPENAI, FAM_ANTHROPIC, FAM_OLLAMA, FAM_GOOGLE };

struct sim_stream {
	enum sim_endpoint ep;
	bool streaming;
	bool include_usage; /* OpenAI stream_options.include_usage */
	bool hit_limit;	    /* stopped by max_tokens: "length" */
	bool keep_alive;
	bool details;			  /* TGI: parameters.details, the body's "details" */
	uint64_t n_in;			  /* prompt tokens, ceil(text bytes / 4) >= 1 */
	uint64_t n_out;			  /* answer tokens to produce (text or tool call) */
	uint64_t n_reason;		  /* reasoning tokens before the answer */
	uint64_t think_ns;		  /* extra pause before the first answer token */
	uint64_t n_cached, n_cache_write; /* prompt tokens read from / written to the cache */
	bool cache_report;		  /* usage says n_cached (and n_cache_write) */
	bool summary;			  /* Responses: reasoning as a summary */
	bool hidden;			  /* reasoning tokens take time and count, but send nothing */
	bool tool;			  /* the answer is a tool call */
	bool answer_open;		  /* the answer's block / item has begun */
	char *tool_json;		  /* the tool's name, a JSON string literal */
	uint64_t emitted;		  /* token events written so far */
	uint64_t drawn;			  /* words drawn so far (== emitted while streaming) */
	uint64_t seq;			  /* Responses: the next event's sequence_number */
	uint64_t created;		  /* unix seconds, derived from the seed */
	uint64_t ttft_ns, itl_ns;
	struct sim_prng prng; /* draws the words, in order */
	char id[48];
	char hex[33];		  /* 32 hex digits of the ids: item, call and tool ids reuse them */
	char *model_json;	  /* model name, already a JSON string literal */
	char *request_id;	  /* echoed header value, or NULL */
	struct evbuffer *ev;	  /* scratch: the event being built */
	struct evbuffer *text;	  /* the answer so far (text, or tool-call arguments) */
	struct evbuffer *reason;  /* the reasoning so far */
	struct evbuffer *piece;	  /* scratch: the piece of text of one token */
	struct sim_timing timing; /* the scheduler's account, with --server-timing */
	bool whole;		  /* embeddings, rerank: the answer is made, in ev (begin_embed) */
	bool sse;		  /* Gemini: ?alt=sse, else the stream is one JSON array */
	char *exception;	  /* Bedrock: the exception the stream ends in (x-sim-exception), or NULL */
};

/* ---- HTTP framing ---- */

static const char *status_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	default: return "Internal Server Error";
	}
}

/* content_length < 0 selects chunked transfer encoding; `extra`: more
 * header lines, each ending in CRLF, or NULL. */
static void write_head_with(struct evbuffer *out, int status, const char *ctype, int64_t content_length,
			    const char *request_id, bool keep_alive, const char *extra)
{
	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nserver: tokentap-sim\r\n", status, status_reason(status));
	if (ctype != NULL)
		evbuffer_add_printf(out, "content-type: %s\r\n", ctype);
	if (content_length < 0)
		evbuffer_add_printf(out, "transfer-encoding: chunked\r\n");
	else
		evbuffer_add_printf(out, "content-length: %" PRId64 "\r\n", content_length);
	if (request_id != NULL)
		evbuffer_add_printf(out, "x-request-id: %s\r\n", request_id);
	if (!keep_alive)
		evbuffer_add_printf(out, "connection: close\r\n");
	if (extra != NULL)
		evbuffer_add(out, extra, strlen(extra));
	evbuffer_add(out, "\r\n", 2);
}

static void write_head(struct evbuffer *out, int status, const char *ctype, int64_t content_length,
		       const char *request_id, bool keep_alive)
{
	write_head_with(out, status, ctype, content_length, request_id, keep_alive, NULL);
}

/* A complete response whose body is the contents of body (drained). */
static void write_whole_with(struct evbuffer *out, int status, const char *ctype, struct evbuffer *body,
			     const char *request_id, bool keep_alive, const char *extra)
{
	write_head_with(out, status, ctype, (int64_t)evbuffer_get_length(body), request_id, keep_alive, extra);
	evbuffer_add_buffer(out, body);
}

static void write_whole(struct evbuffer *out, int status, const char *ctype, struct evbuffer *body,
			const char *request_id, bool keep_alive)
{
	write_whole_with(out, status, ctype, body, request_id, keep_alive, NULL);
}

/* Moves the scratch event into out as exactly one HTTP chunk. */
static void emit_chunk(struct sim_stream *s, struct evbuffer *out)
{
	size_t n = evbuffer_get_length(s->ev);

	if (n == 0)
		return;
	evbuffer_add_printf(out, "%zx\r\n", n);
	evbuffer_add_buffer(out, s->ev);
	evbuffer_add(out, "\r\n", 2);
}

/* ---- errors ---- */

static void write_error(struct evbuffer *out, enum sim_family fam, int status, const char *message,
			const struct sim_api_request *rq)
{
	struct evbuffer *b = evbuffer_new();
	const char *type = status == 404   ? "not_found_error"
			   : status == 405 ? "method_not_allowed"
					   : "invalid_request_error";

	switch (fam) {
	case FAM_ANTHROPIC:
		evbuffer_add_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", type);
		sim_json_str(b, message, strlen(message));
		evbuffer_add(b, "}}", 2);
		break;
	case FAM_OLLAMA:
		evbuffer_add(b, "{\"error\":", 9);
		sim_json_str(b, message, strlen(message));
		evbuffer_add(b, "}", 1);
		break;
	case FAM_GOOGLE: /* a google.rpc.Status */
		evbuffer_add_printf(b, "{\"error\":{\"code\":%d,\"message\":", status);
		sim_json_str(b, message, strlen(message));
		evbuffer_add_printf(b, ",\"status\":\"%s\"}}",
				    status == 404   ? "NOT_FOUND"
				    : status == 400 ? "INVALID_ARGUMENT"
				    : status == 405 ? "UNIMPLEMENTED"
						    : "INTERNAL");
		break;
	case FAM_OPENAI:
		evbuffer_add(b, "{\"error\":{\"message\":", 20);
		sim_json_str(b, message, strlen(message));
		evbuffer_add_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":%d}}", type, status);
		break;
	}
	write_whole(out, status, "application/json", b, rq->request_id, rq->keep_alive);
	evbuffer_free(b);
}

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

/* ---- reading the request body ---- */

/* Appends the text of a message content (a string, or an array of parts)
 * to `text`: the prompt's text, whose length gives the prompt tokens and
 * whose prefixes the --prefix-cache model remembers. */
static void content_text(const json_t *c, struct evbuffer *text)
{
	size_t i;
	json_t *part;

	if (json_is_string(c)) {
		evbuffer_add(text, json_string_value(c), json_string_length(c));
		return;
	}
	if (!json_is_array(c))
		return;
	json_array_foreach (c, i, part) {
		if (json_is_object(part))
			part = json_object_get(part, "text");
		if (json_is_string(part))
			evbuffer_add(text, json_string_value(part), json_string_length(part));
	}
}

static void messages_text(const json_t *msgs, struct evbuffer *text)
{
	size_t i;
	json_t *m;

	if (!json_is_array(msgs))
		return;
	json_array_foreach (msgs, i, m)
		content_text(json_object_get(m, "content"), text);
}

static void prompt_text(enum sim_endpoint ep, const json_t *req, struct evbuffer *text)
{
	switch (ep) {
	case EP_CHAT:
	case EP_OLLAMA_CHAT: messages_text(json_object_get(req, "messages"), text); break;
	case EP_MESSAGES:
		content_text(json_object_get(req, "system"), text);
		messages_text(json_object_get(req, "messages"), text);
		break;
	case EP_COMPLETIONS: content_text(json_object_get(req, "prompt"), text); break;
	case EP_RESPONSES: {
		/* "input" is a string, or a list of message items (content a
		 * string or parts) and parts; "instructions" a string. */
		const json_t *in = json_object_get(req, "input");
		content_text(json_object_get(req, "instructions"), text);
		content_text(in, text);
		messages_text(in, text);
		break;
	}
	case EP_OLLAMA_GENERATE:
		content_text(json_object_get(req, "system"), text);
		content_text(json_object_get(req, "prompt"), text);
		break;
	case EP_LLAMACPP: content_text(json_object_get(req, "prompt"), text); break;
	case EP_TGI:
	case EP_TGI_STREAM: content_text(json_object_get(req, "inputs"), text); break;
	case EP_GEMINI:
	case EP_GEMINI_STREAM: {
		/* systemInstruction.parts[].text, contents[].parts[].text */
		const json_t *c = json_object_get(req, "contents"), *m;
		size_t i;
		content_text(json_object_get(json_object_get(req, "systemInstruction"), "parts"), text);
		if (json_is_array(c))
			json_array_foreach (c, i, m)
				content_text(json_object_get(m, "parts"), text);
		break;
	}
	case EP_BEDROCK_CONVERSE: /* system and content: lists of {"text"} blocks */
	case EP_BEDROCK_INVOKE:
		content_text(json_object_get(req, "system"), text);
		messages_text(json_object_get(req, "messages"), text);
		break;
	}
}

/*
 * The request's own output limit. Returns 0 and sets *limit (-1 when the
 * request sets none), or -1 with *why for a limit no server would accept.
 */
static int output_limit(enum sim_endpoint ep, const json_t *req, int64_t *limit, const char **why)
{
	const json_t *v = NULL;

	*limit = -1;
	switch (ep) {
	case EP_CHAT:
		v = json_object_get(req, "max_completion_tokens");
		if (v == NULL || json_is_null(v))
			v = json_object_get(req, "max_tokens");
		break;
	case EP_COMPLETIONS:
	case EP_MESSAGES: v = json_object_get(req, "max_tokens"); break;
	case EP_RESPONSES: v = json_object_get(req, "max_output_tokens"); break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE:
		v = json_object_get(json_object_get(req, "options"), "num_predict");
		/* Ollama: a negative num_predict means "until the model stops". */
		if (json_is_integer(v) && json_integer_value(v) < 0)
			return 0;
		break;
	case EP_LLAMACPP:
		v = json_object_get(req, "n_predict");
		/* llama.cpp: -1 is "no limit" */
		if (json_is_integer(v) && json_integer_value(v) < 0)
			return 0;
		break;
	case EP_TGI:
	case EP_TGI_STREAM: v = json_object_get(json_object_get(req, "parameters"), "max_new_tokens"); break;
	case EP_GEMINI:
	case EP_GEMINI_STREAM: v = json_object_get(json_object_get(req, "generationConfig"), "maxOutputTokens"); break;
	case EP_BEDROCK_CONVERSE: v = json_object_get(json_object_get(req, "inferenceConfig"), "maxTokens"); break;
	case EP_BEDROCK_INVOKE: v = json_object_get(req, "max_tokens"); break;
	}
	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0) {
		*why = "max_tokens must be a non-negative integer";
		return -1;
	}
	*limit = json_integer_value(v);
	return 0;
}

/* Reasoning tokens when a request asks for reasoning without a count. */
#define SIM_REASONING_DEFAULT 32

/* An effort level as reasoning tokens: -1 when v says nothing. */
static int64_t effort_tokens(const json_t *v)
{
	static const struct {
		const char *name;
		int64_t tokens;
	} levels[] = {
		{ "none", 0 }, { "minimal", 8 }, { "low", 16 }, { "medium", 32 }, { "high", 64 }, { "xhigh", 128 },
	};

	if (json_is_true(v))
		return SIM_REASONING_DEFAULT;
	if (json_is_false(v))
		return 0;
	if (!json_is_string(v))
		return -1;
	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
		if (strcmp(json_string_value(v), levels[i].name) == 0)
			return levels[i].tokens;
	}
	return SIM_REASONING_DEFAULT;
}

/*
 * What the request's own fields say about reasoning: -1 nothing, 0 off,
 * else a number of tokens. Chat `reasoning_effort`; Responses
 * `reasoning.effort` (a `reasoning` object without one: the default);
 * Anthropic `thinking.type` "enabled" (at most `budget_tokens`) or
 * "disabled"; Ollama `think` (true, false or a level).
 */
static int64_t request_reasoning(enum sim_endpoint ep, const json_t *req)
{
	const json_t *o, *v;

	switch (ep) {
	case EP_CHAT: return effort_tokens(json_object_get(req, "reasoning_effort"));
	case EP_RESPONSES:
		o = json_object_get(req, "reasoning");
		if (!json_is_object(o))
			return -1;
		v = json_object_get(o, "effort");
		return v == NULL || json_is_null(v) ? SIM_REASONING_DEFAULT : effort_tokens(v);
	case EP_BEDROCK_CONVERSE: /* Claude's thinking, passed through additionalModelRequestFields */
	case EP_BEDROCK_INVOKE:
	case EP_MESSAGES: {
		const char *type;

		o = json_object_get(req, "thinking");
		if (o == NULL)
			o = json_object_get(json_object_get(req, "additionalModelRequestFields"), "thinking");
		type = json_string_value(json_object_get(o, "type"));
		if (type == NULL)
			return -1;
		if (strcmp(type, "disabled") == 0)
			return 0;
		v = json_object_get(o, "budget_tokens");
		if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < SIM_REASONING_DEFAULT)
			return json_integer_value(v);
		return SIM_REASONING_DEFAULT;
	}
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE: return effort_tokens(json_object_get(req, "think"));
	case EP_GEMINI:
	case EP_GEMINI_STREAM: {
		/* generationConfig.thinkingConfig.thinkingBudget: 0 off, -1
		 * dynamic (the default), else at most that many */
		o = json_object_get(json_object_get(req, "generationConfig"), "thinkingConfig");
		if (!json_is_object(o))
			return -1;
		v = json_object_get(o, "thinkingBudget");
		if (json_is_integer(v) && json_integer_value(v) == 0)
			return 0;
		if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < SIM_REASONING_DEFAULT)
			return json_integer_value(v);
		return SIM_REASONING_DEFAULT;
	}
	case EP_COMPLETIONS:
	case EP_LLAMACPP:
	case EP_TGI:
	case EP_TGI_STREAM: return 0; /* no field carries reasoning */
	}
	return -1;
}

/*
 * The tool a tool-call answer calls, or NULL when the request offers none
 * (or says "none"): the one `tool_choice` names, else the first of `tools`,
 * else "sim_tool" (a tool call forced by x-sim-tool-call or --tool-calls).
 */
static const char *request_tool(enum sim_endpoint ep, const json_t *req)
{
	const json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice"), *t0;
	const char *name;

	if (!json_is_array(tools) || json_array_size(tools) == 0)
		return NULL;
	if (json_is_string(choice) && strcmp(json_string_value(choice), "none") == 0)
		return NULL;
	if (json_is_object(choice)) {
		const char *type = json_string_value(json_object_get(choice, "type"));

		if (type != NULL && strcmp(type, "none") == 0)
			return NULL;
		/* chat {"type":"function","function":{"name"}}; Responses and
		 * Anthropic {"type":"function"|"tool","name"} */
		name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
		if (name == NULL)
			name = json_string_value(json_object_get(choice, "name"));
		if (name != NULL && *name != '\0')
			return name;
	}
	t0 = json_array_get(tools, 0);
	if (ep == EP_GEMINI || ep == EP_GEMINI_STREAM) /* tools[0].functionDeclarations[0].name */
		t0 = json_array_get(json_object_get(t0, "functionDeclarations"), 0);
	name = json_string_value(json_object_get(json_object_get(t0, "function"), "name")); /* chat, Ollama */
	if (name == NULL)
		name = json_string_value(json_object_get(t0, "name")); /* Responses, Anthropic */
	return name != NULL && *name != '\0' ? name : "sim_tool";
}

static bool endpoint_has_tools(enum sim_endpoint ep)
{
	return ep == EP_CHAT || ep == EP_RESPONSES || ep == EP_MESSAGES || ep == EP_OLLAMA_CHAT || ep == EP_GEMINI ||
	       ep == EP_GEMINI_STREAM;
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

/* Moves *p past `lit` when it starts there. */
static bool skip_prefix(const char **p, const char *lit)
{
	size_t n = strlen(lit);

	if (strncmp(*p, lit, n) != 0)
		return false;
	*p += n;
	return true;
}

/* Moves *p past a non-empty segment and its '/'. */
static bool skip_seg(const char **p)
{
	size_t n = strcspn(*p, "/:");

	if (n == 0 || (*p)[n] != '/')
		return false;
	*p += n + 1;
	return true;
}

/* Gemini's paths: /v1beta/models/MODEL:METHOD (also /v1/, /v1alpha/) and
 * Vertex AI's /v1/projects/P/locations/L/publishers/google/models/MODEL:
 * METHOD (also /v1beta1/); the model into `model` (cap bytes). */
static bool gemini_endpoint(const char *path, enum sim_endpoint *ep, char *model, size_t cap)
{
	const char *p = path, *colon;
	size_t n;

	if (skip_prefix(&p, "/v1/projects/") || skip_prefix(&p, "/v1beta1/projects/")) {
		if (!skip_seg(&p) || !skip_prefix(&p, "locations/") || !skip_seg(&p) ||
		    !skip_prefix(&p, "publishers/google/models/"))
			return false;
	} else if (!skip_prefix(&p, "/v1beta/models/") && !skip_prefix(&p, "/v1/models/") &&
		   !skip_prefix(&p, "/v1alpha/models/")) {
		return false;
	}
	colon = strchr(p, ':');
	n = colon ? (size_t)(colon - p) : 0;
	if (n == 0 || n >= cap || memchr(p, '/', n) != NULL)
		return false;
	if (strcmp(colon, ":generateContent") == 0)
		*ep = EP_GEMINI;
	else if (strcmp(colon, ":streamGenerateContent") == 0)
		*ep = EP_GEMINI_STREAM;
	else
		return false;
	memcpy(model, p, n);
	model[n] = '\0';
	return true;
}

/* The query names alt=sse. */
static bool query_alt_sse(const char *q)
{
	for (; q != NULL && *q != '\0'; q += strcspn(q, "&"), q += *q == '&') {
		if (strncmp(q, "alt=sse", 7) == 0 && (q[7] == '\0' || q[7] == '&'))
			return true;
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

/* ---- the events of each shape ---- */

static const char *finish_reason(const struct sim_stream *s)
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
static const char *buf_text(struct evbuffer *b, size_t *len)
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
static const char *hex_id(const struct sim_stream *s, const char *prefix, int n, char *buf, size_t size)
{
	snprintf(buf, size, "%s%.*s", prefix, n, s->hex);
	return buf;
}

/* `{"id":..,"object":..,"created":..,"model":..,"choices":[` */
static void openai_prefix(struct sim_stream *s, struct evbuffer *b, const char *object)
{
	evbuffer_add_printf(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%" PRIu64 ",\"model\":%s,\"choices\":[",
			    s->id, object, s->created, s->model_json);
}

/* Usage; the details only where there is something to say, as vLLM. */
static void openai_usage(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t out = s->n_reason + s->n_out;

	evbuffer_add_printf(b,
			    "\"usage\":{\"prompt_tokens\":%" PRIu64 ",\"completion_tokens\":%" PRIu64
			    ",\"total_tokens\":%" PRIu64,
			    s->n_in, out, s->n_in + out);
	if (s->cache_report)
		evbuffer_add_printf(b, ",\"prompt_tokens_details\":{\"cached_tokens\":%" PRIu64 "}", s->n_cached);
	if (s->n_reason > 0)
		evbuffer_add_printf(b, ",\"completion_tokens_details\":{\"reasoning_tokens\":%" PRIu64 "}",
				    s->n_reason);
	evbuffer_add(b, "}", 1);
}

static const char *openai_object(const struct sim_stream *s, bool chunk)
{
	if (s->ep == EP_COMPLETIONS)
		return "text_completion";
	return chunk ? "chat.completion.chunk" : "chat.completion";
}

/* A chat tool call, whole: `{"id":..,"type":"function","function":{..}}`. */
static void chat_tool_call(struct sim_stream *s, struct evbuffer *b, const char *args, size_t alen, bool with_index)
{
	char cid[48];

	evbuffer_add_printf(b, "{%s\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":%s,\"arguments\":",
			    with_index ? "\"index\":0," : "", hex_id(s, "call_", 24, cid, sizeof(cid)), s->tool_json);
	sim_json_str(b, args, alen);
	evbuffer_add(b, "}}", 2);
}

/* Ollama's created_at: the nominal moment of event k, from the seed's epoch. */
static void ollama_time(struct sim_stream *s, struct evbuffer *b, uint64_t offset_ns)
{
	time_t t = (time_t)(s->created + offset_ns / 1000000000ULL);
	struct tm tm;
	char date[32];

	gmtime_r(&t, &tm);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
	evbuffer_add_printf(b, "\"created_at\":\"%s.%09" PRIu64 "Z\"", date, (uint64_t)(offset_ns % 1000000000ULL));
}

/* The nominal moment of token k (k == all tokens: the end). */
static uint64_t nominal_ns(const struct sim_stream *s, uint64_t k)
{
	return s->ttft_ns + k * s->itl_ns + (k >= s->n_reason ? s->think_ns : 0);
}

/* Ollama: a tool call, whole (arguments an object, as Ollama sends them). */
static void ollama_tool_calls(struct sim_stream *s, struct evbuffer *b, const char *args, size_t alen)
{
	char cid[48];

	evbuffer_add_printf(b, ",\"tool_calls\":[{\"id\":\"%s\",\"function\":{\"index\":0,\"name\":%s,\"arguments\":",
			    hex_id(s, "call_", 8, cid, sizeof(cid)), s->tool_json);
	evbuffer_add(b, args, alen);
	evbuffer_add(b, "}}]", 3);
}

static void anthropic_event(struct sim_stream *s, struct evbuffer *out, const char *name, const char *fmt_json)
{
	evbuffer_add_printf(s->ev, "event: %s\ndata: %s\n\n", name, fmt_json);
	emit_chunk(s, out);
}

enum anthropic_usage_at { AU_START, AU_DELTA, AU_BLOCK };

/*
 * Anthropic's usage: input_tokens excludes what was read from or written
 * to the cache (the total prompt is the sum of the three). message_start
 * says output_tokens 1, as the real API; message_delta repeats the input
 * counts only when the cache is reported.
 */
static void anthropic_usage(struct sim_stream *s, struct evbuffer *b, enum anthropic_usage_at at)
{
	uint64_t fresh = s->n_in - s->n_cached - s->n_cache_write;

	evbuffer_add(b, "{", 1);
	if (at != AU_DELTA || s->cache_report)
		evbuffer_add_printf(b, "\"input_tokens\":%" PRIu64 ",", fresh);
	if (s->cache_report)
		evbuffer_add_printf(
			b, "\"cache_creation_input_tokens\":%" PRIu64 ",\"cache_read_input_tokens\":%" PRIu64 ",",
			s->n_cache_write, s->n_cached);
	evbuffer_add_printf(b, "\"output_tokens\":%" PRIu64, at == AU_START ? 1 : s->n_reason + s->n_out);
	if (at != AU_START && s->n_reason > 0)
		evbuffer_add_printf(b, ",\"output_tokens_details\":{\"thinking_tokens\":%" PRIu64 "}", s->n_reason);
	evbuffer_add(b, "}", 1);
}

/* The thinking block's signature: opaque to clients, fixed per stream. */
static void anthropic_signature(const struct sim_stream *s, struct evbuffer *b)
{
	evbuffer_add_printf(b, "\"EqoBCkgIARAB%s%s\"", s->hex, s->id + 6);
}

/* Reasoning the client sees: tokens, not hidden. */
static bool shows_reasoning(const struct sim_stream *s)
{
	return s->n_reason > 0 && !s->hidden;
}

/* The answer block's index: after the thinking block when there is one. */
static int answer_index(const struct sim_stream *s)
{
	return shows_reasoning(s) ? 1 : 0;
}

/* ---- OpenAI Responses: events named twice (`event:` and "type"),
 * numbered by sequence_number, no [DONE] ---- */

/* Opens event `type` in the scratch buffer, up to its sequence_number. */
static void resp_event_open(struct sim_stream *s, const char *type)
{
	evbuffer_add_printf(s->ev, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%" PRIu64, type, type,
			    s->seq++);
}

/* Closes the event opened above (its last member written) as one chunk. */
static void resp_event_close(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add(s->ev, "}\n\n", 3);
	emit_chunk(s, out);
}

/* The answer item's id: "msg_" (a message) or "fc_" (a function call) and
 * the response id's hex; the reasoning item's: "rs_" and the same. */
static const char *resp_item_id(const struct sim_stream *s, char *buf, size_t n)
{
	return hex_id(s, s->tool ? "fc_" : "msg_", 32, buf, n);
}

/* The answer item: a message holding the text, or a function call. */
static void resp_item(struct sim_stream *s, struct evbuffer *b, const char *status, bool with_content)
{
	char mid[48], cid[48];
	size_t tlen;
	const char *t = buf_text(s->text, &tlen);

	if (s->tool) {
		evbuffer_add_printf(b, "{\"id\":\"%s\",\"type\":\"function_call\",\"status\":\"%s\",\"arguments\":",
				    resp_item_id(s, mid, sizeof(mid)), status);
		sim_json_str(b, with_content ? t : "", with_content ? tlen : 0);
		evbuffer_add_printf(b, ",\"call_id\":\"%s\",\"name\":%s}", hex_id(s, "call_", 32, cid, sizeof(cid)),
				    s->tool_json);
		return;
	}
	evbuffer_add_printf(
		b, "{\"id\":\"%s\",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[",
		resp_item_id(s, mid, sizeof(mid)), status);
	if (with_content) {
		evbuffer_add(b, "{\"type\":\"output_text\",\"text\":", 29);
		sim_json_str(b, t, tlen);
		evbuffer_add(b, ",\"annotations\":[],\"logprobs\":[]}", 32);
	}
	evbuffer_add(b, "]}", 2);
}

/* The reasoning item: raw reasoning text (as vLLM, SGLang, llama.cpp), or
 * with a `reasoning.summary` request a summary (as the hosted API). */
static void resp_reason_item(struct sim_stream *s, struct evbuffer *b, bool done)
{
	char rid[48];
	size_t rlen;
	const char *r = buf_text(s->reason, &rlen);

	evbuffer_add_printf(b, "{\"id\":\"%s\",\"type\":\"reasoning\",\"status\":\"%s\",\"summary\":[",
			    hex_id(s, "rs_", 32, rid, sizeof(rid)), done ? "completed" : "in_progress");
	if (done && s->summary) {
		evbuffer_add(b, "{\"type\":\"summary_text\",\"text\":", 30);
		sim_json_str(b, r, rlen);
		evbuffer_add(b, "}", 1);
	}
	evbuffer_add(b, "]", 1);
	if (done && !s->summary) {
		evbuffer_add(b, ",\"content\":[{\"type\":\"reasoning_text\",\"text\":", 44);
		sim_json_str(b, r, rlen);
		evbuffer_add(b, "}]", 2);
	}
	evbuffer_add(b, "}", 1);
}

/* The Response object: in progress (no output, usage null) or completed
 * with its items and usage. */
static void openai_timing(struct sim_stream *s, struct evbuffer *b);

static void resp_object(struct sim_stream *s, struct evbuffer *b, bool done)
{
	uint64_t out = s->n_reason + s->n_out;

	evbuffer_add_printf(b,
			    "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%" PRIu64
			    ",\"status\":\"%s\",\"model\":%s,\"output\":[",
			    s->id, s->created, done ? "completed" : "in_progress", s->model_json);
	if (done && shows_reasoning(s)) {
		resp_reason_item(s, b, true);
		evbuffer_add(b, ",", 1);
	}
	if (done)
		resp_item(s, b, "completed", true);
	evbuffer_add(b, "],\"usage\":", 10);
	if (done)
		evbuffer_add_printf(b,
				    "{\"input_tokens\":%" PRIu64 ",\"input_tokens_details\":{\"cached_tokens\":%" PRIu64
				    "},\"output_tokens\":%" PRIu64
				    ",\"output_tokens_details\":{\"reasoning_tokens\":%" PRIu64
				    "},\"total_tokens\":%" PRIu64 "}",
				    s->n_in, s->n_cached, out, s->n_reason, s->n_in + out);
	else
		evbuffer_add(b, "null", 4);
	/* vLLM reports in the finished Response (llama.cpp's has none) */
	if (done && sim_cfg.server_timing == SIM_TIMING_VLLM)
		openai_timing(s, b);
	evbuffer_add(b, ",\"error\":null,\"incomplete_details\":null}", 40);
}

/* created, in_progress. */
static void resp_preamble(struct sim_stream *s, struct evbuffer *out)
{
	resp_event_open(s, "response.created");
	evbuffer_add(s->ev, ",\"response\":", 12);
	resp_object(s, s->ev, false);
	resp_event_close(s, out);
	resp_event_open(s, "response.in_progress");
	evbuffer_add(s->ev, ",\"response\":", 12);
	resp_object(s, s->ev, false);
	resp_event_close(s, out);
}

/* `"item_id":..,"output_index":..,` then the part's own index member. */
static void resp_where(struct sim_stream *s, const char *item_id, int output_index, const char *index_name)
{
	evbuffer_add_printf(s->ev, ",\"item_id\":\"%s\",\"output_index\":%d", item_id, output_index);
	if (index_name != NULL)
		evbuffer_add_printf(s->ev, ",\"%s\":0", index_name);
}

/* The reasoning item added, its (summary) part added. */
static void resp_open_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	char rid[48];

	hex_id(s, "rs_", 32, rid, sizeof(rid));
	resp_event_open(s, "response.output_item.added");
	evbuffer_add(s->ev, ",\"output_index\":0,\"item\":", 25);
	resp_reason_item(s, s->ev, false);
	resp_event_close(s, out);
	resp_event_open(s, s->summary ? "response.reasoning_summary_part.added" : "response.content_part.added");
	resp_where(s, rid, 0, s->summary ? "summary_index" : "content_index");
	evbuffer_add_printf(s->ev, ",\"part\":{\"type\":\"%s\",\"text\":\"\"}",
			    s->summary ? "summary_text" : "reasoning_text");
	resp_event_close(s, out);
}

/* The reasoning text's .done events and the item's. */
static void resp_close_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	char rid[48];
	size_t rlen;
	const char *r = buf_text(s->reason, &rlen);

	hex_id(s, "rs_", 32, rid, sizeof(rid));
	resp_event_open(s, s->summary ? "response.reasoning_summary_text.done" : "response.reasoning_text.done");
	resp_where(s, rid, 0, s->summary ? "summary_index" : "content_index");
	evbuffer_add(s->ev, ",\"text\":", 8);
	sim_json_str(s->ev, r, rlen);
	resp_event_close(s, out);
	resp_event_open(s, s->summary ? "response.reasoning_summary_part.done" : "response.content_part.done");
	resp_where(s, rid, 0, s->summary ? "summary_index" : "content_index");
	evbuffer_add_printf(s->ev,
			    ",\"part\":{\"type\":\"%s\",\"text\":", s->summary ? "summary_text" : "reasoning_text");
	r = buf_text(s->reason, &rlen);
	sim_json_str(s->ev, r, rlen);
	evbuffer_add(s->ev, "}", 1);
	resp_event_close(s, out);
	resp_event_open(s, "response.output_item.done");
	evbuffer_add(s->ev, ",\"output_index\":0,\"item\":", 25);
	resp_reason_item(s, s->ev, true);
	resp_event_close(s, out);
}

/* The answer item added and, for a message, its text part added. */
static void resp_open_answer(struct sim_stream *s, struct evbuffer *out)
{
	char mid[48];

	resp_event_open(s, "response.output_item.added");
	evbuffer_add_printf(s->ev, ",\"output_index\":%d,\"item\":", answer_index(s));
	resp_item(s, s->ev, "in_progress", false);
	resp_event_close(s, out);
	if (s->tool)
		return;
	resp_event_open(s, "response.content_part.added");
	resp_where(s, resp_item_id(s, mid, sizeof(mid)), answer_index(s), "content_index");
	evbuffer_add(s->ev, ",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[],\"logprobs\":[]}",
		     71);
	resp_event_close(s, out);
}

/* One token's delta event: reasoning, text or function-call arguments. */
static void resp_delta(struct sim_stream *s, struct evbuffer *out, bool reasoning, const char *w, size_t wlen)
{
	char id[48];

	if (reasoning) {
		resp_event_open(s,
				s->summary ? "response.reasoning_summary_text.delta" : "response.reasoning_text.delta");
		resp_where(s, hex_id(s, "rs_", 32, id, sizeof(id)), 0, s->summary ? "summary_index" : "content_index");
	} else if (s->tool) {
		resp_event_open(s, "response.function_call_arguments.delta");
		resp_where(s, resp_item_id(s, id, sizeof(id)), answer_index(s), NULL);
	} else {
		resp_event_open(s, "response.output_text.delta");
		resp_where(s, resp_item_id(s, id, sizeof(id)), answer_index(s), "content_index");
	}
	evbuffer_add(s->ev, ",\"delta\":", 9);
	sim_json_str(s->ev, w, wlen);
	if (!reasoning && !s->tool)
		evbuffer_add(s->ev, ",\"logprobs\":[]", 14);
	resp_event_close(s, out);
}

/* The answer's .done events, then completed. */
static void resp_finish(struct sim_stream *s, struct evbuffer *out)
{
	size_t tlen;
	const char *t;
	char mid[48];
	int ai = answer_index(s);

	resp_item_id(s, mid, sizeof(mid));
	if (s->tool) {
		resp_event_open(s, "response.function_call_arguments.done");
		resp_where(s, mid, ai, NULL);
		evbuffer_add_printf(s->ev, ",\"name\":%s,\"arguments\":", s->tool_json);
		t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		resp_event_close(s, out);
	} else {
		resp_event_open(s, "response.output_text.done");
		resp_where(s, mid, ai, "content_index");
		evbuffer_add(s->ev, ",\"text\":", 8);
		t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		evbuffer_add(s->ev, ",\"logprobs\":[]", 14);
		resp_event_close(s, out);
		resp_event_open(s, "response.content_part.done");
		resp_where(s, mid, ai, "content_index");
		evbuffer_add(s->ev, ",\"part\":{\"type\":\"output_text\",\"text\":", 37);
		t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		evbuffer_add(s->ev, ",\"annotations\":[],\"logprobs\":[]}", 32);
		resp_event_close(s, out);
	}
	resp_event_open(s, "response.output_item.done");
	evbuffer_add_printf(s->ev, ",\"output_index\":%d,\"item\":", ai);
	resp_item(s, s->ev, "completed", true);
	resp_event_close(s, out);
	resp_event_open(s, "response.completed");
	evbuffer_add(s->ev, ",\"response\":", 12);
	resp_object(s, s->ev, true);
	resp_event_close(s, out);
}

/* ---- Gemini: every event a whole GenerateContentResponse, no [DONE];
 * with ?alt=sse one `data:` frame each, else the elements of one JSON
 * array, written as the Gemini API writes it ("[{" then ",\r\n{" then
 * "\n]") ---- */

/* usageMetadata after `reason` thought and `answer` answer tokens: the
 * counts so far, zero ones left out as proto3's JSON does; thoughts are
 * not in candidatesTokenCount. */
static void gemini_usage(struct sim_stream *s, struct evbuffer *b, uint64_t reason, uint64_t answer)
{
	evbuffer_add_printf(b, "\"usageMetadata\": {\"promptTokenCount\": %" PRIu64, s->n_in);
	if (answer)
		evbuffer_add_printf(b, ",\"candidatesTokenCount\": %" PRIu64, answer);
	evbuffer_add_printf(b, ",\"totalTokenCount\": %" PRIu64, s->n_in + reason + answer);
	if (s->cache_report && s->n_cached)
		evbuffer_add_printf(b, ",\"cachedContentTokenCount\": %" PRIu64, s->n_cached);
	if (reason)
		evbuffer_add_printf(b, ",\"thoughtsTokenCount\": %" PRIu64, reason);
	evbuffer_add_printf(b, ",\"promptTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": %" PRIu64 "}]}",
			    s->n_in);
}

/* What goes before a streamed response: "data: ", or the array's "[" or
 * the separator. s->seq counts the responses written. */
static void gemini_frame_open(struct sim_stream *s)
{
	if (s->sse)
		evbuffer_add(s->ev, "data: ", 6);
	else
		evbuffer_add(s->ev, s->seq == 0 ? "[" : ",\r\n", s->seq == 0 ? 1 : 3);
	s->seq++;
}

static void gemini_open(struct evbuffer *b)
{
	evbuffer_add_printf(b, "{\"candidates\": [{\"content\": {\"parts\": [");
}

/* Closes the parts and the response: finishReason on the last one. */
static void gemini_close(struct sim_stream *s, struct evbuffer *b, bool last, uint64_t reason, uint64_t answer)
{
	evbuffer_add_printf(b, "],\"role\": \"model\"}");
	if (last)
		evbuffer_add_printf(b, ",\"finishReason\": \"%s\"", s->hit_limit ? "MAX_TOKENS" : "STOP");
	evbuffer_add_printf(b, ",\"index\": 0}],");
	gemini_usage(s, b, reason, answer);
	evbuffer_add_printf(b, ",\"modelVersion\": %s,\"responseId\": \"%s\"}", s->model_json, s->id);
}

/* A part: text (a thought), or the function call whole. */
static void gemini_part(struct sim_stream *s, struct evbuffer *b, const char *t, size_t tlen, bool thought)
{
	if (s->tool && !thought) {
		size_t alen;
		const char *args = buf_text(s->text, &alen);

		evbuffer_add_printf(b, "{\"functionCall\": {\"name\": %s,\"args\": ", s->tool_json);
		evbuffer_add(b, args, alen);
		evbuffer_add(b, "}}", 2);
		return;
	}
	evbuffer_add(b, "{\"text\": ", 9);
	sim_json_str(b, t, tlen);
	if (thought)
		evbuffer_add(b, ",\"thought\": true", 16);
	evbuffer_add(b, "}", 1);
}

/* ---- AWS Bedrock: JSON built here, framed by sim_bedrock.c ---- */

/* Frames the JSON in s->ev as one event-stream message (a Converse event
 * of `type`, or an InvokeModel chunk) into one HTTP chunk. */
static void bedrock_emit(struct sim_stream *s, struct evbuffer *out, const char *type)
{
	struct evbuffer *frame = evbuffer_new();
	size_t n = evbuffer_get_length(s->ev);
	const char *json = (const char *)evbuffer_pullup(s->ev, -1);

	if (s->ep == EP_BEDROCK_INVOKE)
		sim_es_chunk(frame, json, n);
	else
		sim_es_event(frame, type, json, n);
	evbuffer_drain(s->ev, n);
	evbuffer_add_buffer(s->ev, frame);
	evbuffer_free(frame);
	emit_chunk(s, out);
}

static void bedrock_event(struct sim_stream *s, struct evbuffer *out, const char *type, const char *json)
{
	evbuffer_add(s->ev, json, strlen(json));
	bedrock_emit(s, out, type);
}

/* Bedrock's nominal timings, whole ms: the first byte at the ttft, the
 * call at the last token. */
static uint64_t bedrock_first_byte_ms(const struct sim_stream *s)
{
	return s->ttft_ns / 1000000;
}

static uint64_t bedrock_latency_ms(const struct sim_stream *s)
{
	return nominal_ns(s, s->n_reason + s->n_out) / 1000000;
}

/* Converse's usage and metrics: inputTokens without the cache's part. */
static void converse_usage(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t out = s->n_reason + s->n_out, fresh = s->n_in - s->n_cached - s->n_cache_write;

	evbuffer_add_printf(b, "\"metrics\":{\"latencyMs\":%" PRIu64 "},\"usage\":{", bedrock_latency_ms(s));
	if (s->cache_report)
		evbuffer_add_printf(b, "\"cacheReadInputTokens\":%" PRIu64 ",\"cacheWriteInputTokens\":%" PRIu64 ",",
				    s->n_cached, s->n_cache_write);
	evbuffer_add_printf(b, "\"inputTokens\":%" PRIu64 ",\"outputTokens\":%" PRIu64 ",\"totalTokens\":%" PRIu64 "}",
			    fresh, out, s->n_in + out);
}

static void bedrock_preamble(struct sim_stream *s, struct evbuffer *out)
{
	if (s->ep == EP_BEDROCK_CONVERSE) {
		bedrock_event(s, out, "messageStart", "{\"role\":\"assistant\"}");
		return;
	}
	evbuffer_add_printf(s->ev,
			    "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\","
			    "\"role\":\"assistant\",\"model\":%s,\"content\":[],\"stop_reason\":null,"
			    "\"stop_sequence\":null,\"usage\":",
			    s->id, s->model_json);
	anthropic_usage(s, s->ev, AU_START);
	evbuffer_add(s->ev, "}}", 2);
	bedrock_emit(s, out, "chunk");
}

/* A block opens (InvokeModel's Anthropic events; Converse sends no start
 * for a text or reasoning block). */
static void bedrock_open_block(struct sim_stream *s, struct evbuffer *out, int index, bool thinking)
{
	if (s->ep != EP_BEDROCK_INVOKE)
		return;
	evbuffer_add_printf(s->ev, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":%s}", index,
			    thinking ? "{\"type\":\"thinking\",\"thinking\":\"\"}"
				     : "{\"type\":\"text\",\"text\":\"\"}");
	bedrock_emit(s, out, "chunk");
}

static void bedrock_close_block(struct sim_stream *s, struct evbuffer *out, int index)
{
	if (s->ep == EP_BEDROCK_CONVERSE)
		evbuffer_add_printf(s->ev, "{\"contentBlockIndex\":%d}", index);
	else
		evbuffer_add_printf(s->ev, "{\"type\":\"content_block_stop\",\"index\":%d}", index);
	bedrock_emit(s, out, "contentBlockStop");
}

static void bedrock_token(struct sim_stream *s, struct evbuffer *out, bool reasoning, const char *p, size_t plen)
{
	int index = reasoning ? 0 : answer_index(s);

	if (s->ep == EP_BEDROCK_CONVERSE) {
		evbuffer_add_printf(s->ev, "{\"contentBlockIndex\":%d,\"delta\":{%s", index,
				    reasoning ? "\"reasoningContent\":{\"text\":" : "\"text\":");
		sim_json_str(s->ev, p, plen);
		evbuffer_add(s->ev, reasoning ? "}}}" : "}}", reasoning ? 3 : 2);
	} else {
		evbuffer_add_printf(
			s->ev,
			"{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", index,
			reasoning ? "thinking_delta" : "text_delta", reasoning ? "thinking" : "text");
		sim_json_str(s->ev, p, plen);
		evbuffer_add(s->ev, "}}", 2);
	}
	bedrock_emit(s, out, "contentBlockDelta");
}

/* The end: the answer block's stop, then either the exception asked for
 * (Bedrock ends a stream with it) or the stop and the usage. */
static void bedrock_finish(struct sim_stream *s, struct evbuffer *out)
{
	bedrock_close_block(s, out, answer_index(s));
	if (s->exception != NULL) {
		struct evbuffer *frame = evbuffer_new();
		static const char msg[] = "{\"message\":\"Too many requests, please wait before trying again.\"}";
		sim_es_exception(frame, s->exception, msg, sizeof(msg) - 1);
		evbuffer_add_buffer(s->ev, frame);
		evbuffer_free(frame);
		emit_chunk(s, out);
		return;
	}
	if (s->ep == EP_BEDROCK_CONVERSE) {
		evbuffer_add_printf(s->ev, "{\"stopReason\":\"%s\"}", finish_reason(s));
		bedrock_emit(s, out, "messageStop");
		evbuffer_add(s->ev, "{", 1);
		converse_usage(s, s->ev);
		evbuffer_add(s->ev, "}", 1);
		bedrock_emit(s, out, "metadata");
		return;
	}
	evbuffer_add_printf(s->ev,
			    "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":null},"
			    "\"usage\":",
			    finish_reason(s));
	anthropic_usage(s, s->ev, AU_DELTA);
	evbuffer_add(s->ev, "}", 1);
	bedrock_emit(s, out, "chunk");
	evbuffer_add_printf(
		s->ev,
		"{\"type\":\"message_stop\",\"amazon-bedrock-invocationMetrics\":{\"inputTokenCount\":%" PRIu64
		",\"outputTokenCount\":%" PRIu64 ",\"invocationLatency\":%" PRIu64 ",\"firstByteLatency\":%" PRIu64
		"}}",
		s->n_in - s->n_cached - s->n_cache_write, s->n_reason + s->n_out, bedrock_latency_ms(s),
		bedrock_first_byte_ms(s));
	bedrock_emit(s, out, "chunk");
}

/* ---- the stream: preamble, reasoning, answer, closing ---- */

/* Events before the first token: sent together with it, at ttft, as vLLM
 * and Anthropic's API do (the role chunk comes with the first output). */
static void write_preamble(struct sim_stream *s, struct evbuffer *out)
{
	switch (s->ep) {
	case EP_CHAT:
		evbuffer_add(s->ev, "data: ", 6);
		openai_prefix(s, s->ev, "chat.completion.chunk");
		evbuffer_add_printf(s->ev,
				    "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
				    "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
		emit_chunk(s, out);
		break;
	case EP_MESSAGES:
		evbuffer_add_printf(s->ev,
				    "event: message_start\ndata: {\"type\":\"message_start\","
				    "\"message\":{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\","
				    "\"model\":%s,\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
				    "\"usage\":",
				    s->id, s->model_json);
		anthropic_usage(s, s->ev, AU_START);
		evbuffer_add(s->ev, "}}\n\n", 4);
		emit_chunk(s, out);
		break;
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

/* TGI's details: why it stopped, the tokens, the prompt's length on the
 * stream (input_length), the seed. */
static void tgi_details(struct sim_stream *s, struct evbuffer *b, bool stream)
{
	evbuffer_add_printf(b, "{\"finish_reason\":\"%s\",\"generated_tokens\":%" PRIu64 ",\"seed\":null",
			    s->hit_limit ? "length" : "eos_token", s->n_out);
	if (stream)
		evbuffer_add_printf(b, ",\"input_length\":%" PRIu64, s->n_in);
	evbuffer_add(b, "}", 1);
}

/* One /generate_stream event: the token, and on the last one the whole
 * text and the details (TGI sends them with its last token). */
static void tgi_token(struct sim_stream *s, uint64_t k, const char *p, size_t plen, bool last)
{
	evbuffer_add_printf(s->ev, "data:{\"index\":%" PRIu64 ",\"token\":{\"id\":%" PRIu64 ",\"text\":", k + 1,
			    1000 + (k * 7919) % 30000);
	sim_json_str(s->ev, p, plen);
	evbuffer_add_printf(s->ev, ",\"logprob\":-0.25,\"special\":false},\"generated_text\":");
	if (last) {
		size_t tlen;
		const char *t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		evbuffer_add_printf(s->ev, ",\"details\":");
		tgi_details(s, s->ev, true);
	} else {
		evbuffer_add_printf(s->ev, "null,\"details\":null");
	}
	evbuffer_add_printf(s->ev, "}\n\n");
}

/* The first block (Anthropic) or item (Responses) opens with a ping. */
static void open_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	if (s->ep == EP_BEDROCK_CONVERSE || s->ep == EP_BEDROCK_INVOKE) {
		bedrock_open_block(s, out, 0, true);
	} else if (s->ep == EP_MESSAGES) {
		anthropic_event(s, out, "content_block_start",
				"{\"type\":\"content_block_start\",\"index\":0,"
				"\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}");
		anthropic_event(s, out, "ping", "{\"type\": \"ping\"}");
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
		evbuffer_add(s->ev,
			     "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
			     "\"delta\":{\"type\":\"signature_delta\",\"signature\":",
			     119);
		anthropic_signature(s, s->ev);
		evbuffer_add(s->ev, "}}\n\n", 4);
		emit_chunk(s, out);
		anthropic_event(s, out, "content_block_stop", "{\"type\":\"content_block_stop\",\"index\":0}");
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
		char tid[48];

		evbuffer_add_printf(s->ev,
				    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":%d,",
				    answer_index(s));
		if (s->tool)
			evbuffer_add_printf(
				s->ev,
				"\"content_block\":{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":%s,\"input\":{}}}\n\n",
				hex_id(s, "toolu_01", 24, tid, sizeof(tid)), s->tool_json);
		else
			evbuffer_add(s->ev, "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n", 44);
		emit_chunk(s, out);
		if (!shows_reasoning(s))
			anthropic_event(s, out, "ping", "{\"type\": \"ping\"}");
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
	evbuffer_drain(s->piece, evbuffer_get_length(s->piece));
	reasoning = draw_piece(s, s->piece);
	p = buf_text(s->piece, &plen);
	evbuffer_add(reasoning ? s->reason : s->text, p, plen);
	p = buf_text(s->piece, &plen);
	if (reasoning && s->hidden) {
		s->emitted++; /* thought, not said: as OpenAI's hosted models */
		return;
	}
	last = k + 1 == s->n_reason + s->n_out;
	switch (s->ep) {
	case EP_CHAT:
		evbuffer_add(s->ev, "data: ", 6);
		openai_prefix(s, s->ev, "chat.completion.chunk");
		if (reasoning) {
			evbuffer_add(s->ev, "{\"index\":0,\"delta\":{\"reasoning_content\":", 40);
			sim_json_str(s->ev, p, plen);
		} else if (s->tool && k == s->n_reason) {
			evbuffer_add(s->ev, "{\"index\":0,\"delta\":{\"tool_calls\":[", 34);
			chat_tool_call(s, s->ev, p, plen, true);
			evbuffer_add(s->ev, "]", 1);
		} else if (s->tool) {
			evbuffer_add(
				s->ev,
				"{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":",
				69);
			sim_json_str(s->ev, p, plen);
			evbuffer_add(s->ev, "}}]", 3);
		} else {
			evbuffer_add(s->ev, "{\"index\":0,\"delta\":{\"content\":", 30);
			sim_json_str(s->ev, p, plen);
		}
		evbuffer_add_printf(s->ev, "},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
		break;
	case EP_COMPLETIONS:
		evbuffer_add(s->ev, "data: ", 6);
		openai_prefix(s, s->ev, "text_completion");
		evbuffer_add(s->ev, "{\"index\":0,\"text\":", 18);
		sim_json_str(s->ev, p, plen);
		evbuffer_add_printf(s->ev, ",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
		break;
	case EP_MESSAGES:
		evbuffer_add_printf(s->ev,
				    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
				    "\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":",
				    reasoning ? 0 : answer_index(s),
				    reasoning ? "thinking_delta"
				    : s->tool ? "input_json_delta"
					      : "text_delta",
				    reasoning ? "thinking"
				    : s->tool ? "partial_json"
					      : "text");
		sim_json_str(s->ev, p, plen);
		evbuffer_add(s->ev, "}}\n\n", 4);
		break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE:
		/* Ollama sends a tool call whole, once parsed: one line at its
		 * last token, none before. */
		if (s->tool && !reasoning && !last)
			break;
		evbuffer_add_printf(s->ev, "{\"model\":%s,", s->model_json);
		ollama_time(s, s->ev, nominal_ns(s, k));
		if (s->ep == EP_OLLAMA_CHAT)
			evbuffer_add(s->ev, ",\"message\":{\"role\":\"assistant\",\"content\":", 41);
		else
			evbuffer_add(s->ev, ",\"response\":", 12);
		if (reasoning) {
			evbuffer_add(s->ev, "\"\",\"thinking\":", 14);
			sim_json_str(s->ev, p, plen);
		} else if (s->tool) {
			size_t alen;
			const char *args = buf_text(s->text, &alen);

			evbuffer_add(s->ev, "\"\"", 2);
			ollama_tool_calls(s, s->ev, args, alen);
		} else {
			sim_json_str(s->ev, p, plen);
		}
		evbuffer_add_printf(s->ev, "%s,\"done\":false}\n", s->ep == EP_OLLAMA_CHAT ? "}" : "");
		break;
	case EP_RESPONSES: resp_delta(s, out, reasoning, p, plen); break;
	case EP_LLAMACPP:
		evbuffer_add_printf(s->ev, "data: {\"index\":0,\"content\":");
		sim_json_str(s->ev, p, plen);
		evbuffer_add_printf(s->ev,
				    ",\"tokens\":[],\"stop\":false,\"id_slot\":0,\"tokens_predicted\":%" PRIu64
				    ",\"tokens_evaluated\":%" PRIu64 "}\n\n",
				    k + 1, s->n_in);
		break;
	case EP_TGI_STREAM: tgi_token(s, k, p, plen, last); break;
	case EP_TGI: break; /* never streamed */
	case EP_GEMINI:
	case EP_GEMINI_STREAM:
		/* Gemini sends a function call whole: at its last token */
		if (s->tool && !reasoning && !last)
			break;
		gemini_frame_open(s);
		gemini_open(s->ev);
		gemini_part(s, s->ev, p, plen, reasoning);
		gemini_close(s, s->ev, false, reasoning ? k + 1 : s->n_reason, reasoning ? 0 : k + 1 - s->n_reason);
		if (s->sse)
			evbuffer_add(s->ev, "\r\n\r\n", 4);
		break;
	case EP_BEDROCK_CONVERSE:
	case EP_BEDROCK_INVOKE: bedrock_token(s, out, reasoning, p, plen); break;
	}
	emit_chunk(s, out);
	s->emitted++;
	if (reasoning && s->emitted == s->n_reason)
		close_reasoning(s, out);
}

/* Ollama's closing fields, shared by the last NDJSON line and the block.
 * Nominal durations, unless the scheduler's account is reported: then its
 * queue wait is the load_duration (Ollama's runs from the request to a
 * runner being ready, its own scheduler's wait included). */
static void ollama_tail(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t n = s->n_reason + s->n_out, eval_ns = nominal_ns(s, n) - s->ttft_ns;
	uint64_t load = 0, prompt = s->ttft_ns;

	if (s->timing.known) {
		load = s->timing.queue_ns;
		prompt = s->timing.prefill_ns;
		eval_ns = s->timing.decode_ns;
	}
	evbuffer_add_printf(b,
			    "\"done_reason\":\"%s\",\"done\":true,\"total_duration\":%" PRIu64
			    ",\"load_duration\":%" PRIu64 ",\"prompt_eval_count\":%" PRIu64
			    ",\"prompt_eval_duration\":%" PRIu64 ",\"eval_count\":%" PRIu64
			    ",\"eval_duration\":%" PRIu64 "}",
			    finish_reason(s), load + prompt + eval_ns, load, s->n_in, prompt, n, eval_ns);
}

void sim_api_timing(struct sim_stream *s, const struct sim_timing *t)
{
	if (s != NULL && t != NULL && sim_cfg.server_timing != SIM_TIMING_OFF)
		s->timing = *t;
}

/* ns as a JSON number of ms, exact (six decimals). */
static void add_ms(struct evbuffer *b, const char *key, uint64_t ns)
{
	evbuffer_add_printf(b, "\"%s\":%" PRIu64 ".%06" PRIu64, key, ns / (uint64_t)1000000, ns % (uint64_t)1000000);
}

/* The OpenAI routes' report, with a leading comma: vLLM's "metrics" (on the
 * usage chunk or body) or llama.cpp's "timings" (on the stream's last
 * chunk or the body). Nothing when the account is not reported. */
static void openai_timing(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t out = s->n_reason + s->n_out;

	if (!s->timing.known)
		return;
	if (sim_cfg.server_timing == SIM_TIMING_VLLM) {
		evbuffer_add(b, ",\"metrics\":{", 12);
		add_ms(b, "time_to_first_token_ms", s->timing.prefill_ns);
		evbuffer_add(b, ",", 1);
		add_ms(b, "generation_time_ms", s->timing.decode_ns);
		evbuffer_add(b, ",", 1);
		add_ms(b, "queue_time_ms", s->timing.queue_ns);
		if (out > 1) {
			evbuffer_add(b, ",", 1);
			add_ms(b, "mean_itl_ms", s->timing.decode_ns / (out - 1));
		} else {
			evbuffer_add(b, ",\"mean_itl_ms\":null", 18);
		}
		evbuffer_add(b, "}", 1);
	} else if (sim_cfg.server_timing == SIM_TIMING_LLAMACPP) {
		uint64_t prompt_n = s->n_in > s->n_cached ? s->n_in - s->n_cached : 0;
		evbuffer_add_printf(b, ",\"timings\":{\"cache_n\":%" PRIu64 ",\"prompt_n\":%" PRIu64 ",", s->n_cached,
				    prompt_n);
		add_ms(b, "prompt_ms", s->timing.prefill_ns);
		evbuffer_add_printf(b, ",\"predicted_n\":%" PRIu64 ",", out);
		add_ms(b, "predicted_ms", s->timing.decode_ns);
		evbuffer_add(b, "}", 1);
	}
}

/* llama.cpp's closing fields of /completion (the streamed last object and
 * the body), after its "content": its counts, why it stopped and its
 * timings, always sent: the scheduler's account when reported, else the
 * nominal times. */
static void llamacpp_tail(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t n = s->n_out, prompt_n = s->n_in > s->n_cached ? s->n_in - s->n_cached : 0;
	uint64_t prompt_ns = s->ttft_ns, decode_ns = nominal_ns(s, n) - s->ttft_ns;

	if (s->timing.known) {
		prompt_ns = s->timing.prefill_ns;
		decode_ns = s->timing.decode_ns;
	}
	evbuffer_add_printf(b,
			    ",\"tokens\":[],\"id_slot\":0,\"stop\":true,\"model\":%s,\"tokens_predicted\":%" PRIu64
			    ",\"tokens_evaluated\":%" PRIu64
			    ",\"prompt\":\"\",\"has_new_line\":false,\"truncated\":false,"
			    "\"stop_type\":\"%s\",\"stopping_word\":\"\",\"tokens_cached\":%" PRIu64 ",\"timings\":{",
			    s->model_json, n, s->n_in, s->hit_limit ? "limit" : "eos", s->n_in + n);
	evbuffer_add_printf(b, "\"cache_n\":%" PRIu64 ",\"prompt_n\":%" PRIu64 ",", s->n_cached, prompt_n);
	add_ms(b, "prompt_ms", prompt_ns);
	evbuffer_add_printf(b, ",\"predicted_n\":%" PRIu64 ",", n);
	add_ms(b, "predicted_ms", decode_ns);
	evbuffer_add_printf(b, "}}");
}

/* TGI's x-* headers on /generate, integer ms truncated as TGI's
 * as_millis(): the scheduler's queue and its prefill + decode as the
 * inference when reported, else none queued and the nominal times; no
 * validation is simulated (0). */
static void tgi_headers(struct sim_stream *s, char *buf, size_t size)
{
	uint64_t queue_ns = 0, infer_ns = nominal_ns(s, s->n_out);

	if (s->timing.known) {
		queue_ns = s->timing.queue_ns;
		infer_ns = s->timing.prefill_ns + s->timing.decode_ns;
	}
	uint64_t q = queue_ns / 1000000, inf = infer_ns / 1000000;
	snprintf(buf, size,
		 "x-compute-type: gpu+optimized\r\nx-total-time: %" PRIu64
		 "\r\nx-validation-time: 0\r\n"
		 "x-queue-time: %" PRIu64 "\r\nx-inference-time: %" PRIu64 "\r\nx-time-per-token: %" PRIu64
		 "\r\nx-prompt-tokens: %" PRIu64 "\r\nx-generated-tokens: %" PRIu64 "\r\n",
		 (queue_ns + infer_ns) / 1000000, q, inf, s->n_out ? inf / s->n_out : 0, s->n_in, s->n_out);
}

static void finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	if (s->emitted == 0)
		write_preamble(s, out);
	if (!s->answer_open)
		open_answer(s, out);
	switch (s->ep) {
	case EP_CHAT:
	case EP_COMPLETIONS:
		evbuffer_add(s->ev, "data: ", 6);
		openai_prefix(s, s->ev, openai_object(s, true));
		evbuffer_add_printf(s->ev, "{\"index\":0,%s,\"logprobs\":null,\"finish_reason\":\"%s\"}]",
				    s->ep == EP_CHAT ? "\"delta\":{}" : "\"text\":\"\"", finish_reason(s));
		/* llama.cpp: timings on the burst's last chunk; vLLM: only
		 * on the usage chunk */
		if (!s->include_usage && sim_cfg.server_timing == SIM_TIMING_LLAMACPP)
			openai_timing(s, s->ev);
		evbuffer_add(s->ev, "}\n\n", 3);
		emit_chunk(s, out);
		if (s->include_usage) {
			evbuffer_add(s->ev, "data: ", 6);
			openai_prefix(s, s->ev, openai_object(s, true));
			evbuffer_add(s->ev, "],", 2);
			openai_usage(s, s->ev);
			openai_timing(s, s->ev);
			evbuffer_add(s->ev, "}\n\n", 3);
			emit_chunk(s, out);
		}
		evbuffer_add(s->ev, "data: [DONE]\n\n", 14);
		emit_chunk(s, out);
		break;
	case EP_MESSAGES:
		evbuffer_add_printf(
			s->ev, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":%d}\n\n",
			answer_index(s));
		emit_chunk(s, out);
		evbuffer_add_printf(s->ev,
				    "event: message_delta\ndata: {\"type\":\"message_delta\","
				    "\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":null},\"usage\":",
				    finish_reason(s));
		anthropic_usage(s, s->ev, AU_DELTA);
		evbuffer_add(s->ev, "}\n\n", 3);
		emit_chunk(s, out);
		anthropic_event(s, out, "message_stop", "{\"type\":\"message_stop\"}");
		break;
	case EP_RESPONSES: resp_finish(s, out); break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE:
		evbuffer_add_printf(s->ev, "{\"model\":%s,", s->model_json);
		ollama_time(s, s->ev, nominal_ns(s, s->n_reason + s->n_out));
		if (s->ep == EP_OLLAMA_CHAT)
			evbuffer_add_printf(s->ev, ",\"message\":{\"role\":\"assistant\",\"content\":\"\"},");
		else
			evbuffer_add_printf(s->ev, ",\"response\":\"\",");
		ollama_tail(s, s->ev);
		evbuffer_add(s->ev, "\n", 1);
		emit_chunk(s, out);
		break;
	case EP_LLAMACPP:
		evbuffer_add_printf(s->ev, "data: {\"index\":0,\"content\":\"\"");
		llamacpp_tail(s, s->ev);
		evbuffer_add_printf(s->ev, "\n\n");
		emit_chunk(s, out);
		break;
	case EP_TGI_STREAM:
		if (s->emitted == 0) { /* no token: the closing event alone */
			evbuffer_add_printf(s->ev,
					    "data:{\"index\":1,\"token\":{\"id\":0,\"text\":\"\",\"logprob\":0.0,"
					    "\"special\":true},\"generated_text\":\"\",\"details\":");
			tgi_details(s, s->ev, true);
			evbuffer_add_printf(s->ev, "}\n\n");
			emit_chunk(s, out);
		}
		break;
	case EP_TGI: break; /* never streamed */
	case EP_GEMINI:
	case EP_GEMINI_STREAM:
		/* the closing response: an empty text, why it stopped, the
		 * final counts; then the array's end */
		gemini_frame_open(s);
		gemini_open(s->ev);
		evbuffer_add(s->ev, "{\"text\": \"\"}", 12);
		gemini_close(s, s->ev, true, s->n_reason, s->n_out);
		evbuffer_add(s->ev, s->sse ? "\r\n\r\n" : "\n]", s->sse ? 4 : 2);
		emit_chunk(s, out);
		break;
	case EP_BEDROCK_CONVERSE:
	case EP_BEDROCK_INVOKE: bedrock_finish(s, out); break;
	}
	evbuffer_add(out, "0\r\n\r\n", 5);
}

/* A non-streaming answer: all tokens at once, with Content-Length. */
static void finish_block(struct sim_stream *s, struct evbuffer *out)
{
	struct evbuffer *b = evbuffer_new();
	size_t tlen, rlen;
	const char *t, *r;

	while (s->drawn < s->n_reason + s->n_out)
		draw_piece(s, s->drawn < s->n_reason ? s->reason : s->text);
	t = buf_text(s->text, &tlen);

	switch (s->ep) {
	case EP_CHAT:
	case EP_COMPLETIONS:
		openai_prefix(s, b, openai_object(s, false));
		if (s->ep == EP_CHAT) {
			evbuffer_add_printf(b, "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
			if (s->tool)
				evbuffer_add(b, "null", 4);
			else
				sim_json_str(b, t, tlen);
			if (shows_reasoning(s)) {
				evbuffer_add(b, ",\"reasoning_content\":", 21);
				r = buf_text(s->reason, &rlen);
				sim_json_str(b, r, rlen);
			}
			if (s->tool) {
				evbuffer_add(b, ",\"tool_calls\":[", 15);
				t = buf_text(s->text, &tlen);
				chat_tool_call(s, b, t, tlen, false);
				evbuffer_add(b, "]", 1);
			}
			evbuffer_add(b, "}", 1);
		} else {
			evbuffer_add_printf(b, "{\"index\":0,\"text\":");
			sim_json_str(b, t, tlen);
		}
		evbuffer_add_printf(b, ",\"logprobs\":null,\"finish_reason\":\"%s\"}],", finish_reason(s));
		openai_usage(s, b);
		openai_timing(s, b);
		evbuffer_add(b, "}", 1);
		break;
	case EP_MESSAGES:
		evbuffer_add_printf(b,
				    "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%s,"
				    "\"content\":[",
				    s->id, s->model_json);
		if (shows_reasoning(s)) {
			evbuffer_add(b, "{\"type\":\"thinking\",\"thinking\":", 30);
			r = buf_text(s->reason, &rlen);
			sim_json_str(b, r, rlen);
			evbuffer_add(b, ",\"signature\":", 13);
			anthropic_signature(s, b);
			evbuffer_add(b, "},", 2);
		}
		if (s->tool) {
			char tid[48];

			evbuffer_add_printf(b, "{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":%s,\"input\":",
					    hex_id(s, "toolu_01", 24, tid, sizeof(tid)), s->tool_json);
			t = buf_text(s->text, &tlen);
			evbuffer_add(b, t, tlen);
		} else {
			evbuffer_add(b, "{\"type\":\"text\",\"text\":", 22);
			t = buf_text(s->text, &tlen);
			sim_json_str(b, t, tlen);
		}
		evbuffer_add_printf(b, "}],\"stop_reason\":\"%s\",\"stop_sequence\":null,\"usage\":", finish_reason(s));
		anthropic_usage(s, b, AU_BLOCK);
		evbuffer_add(b, "}", 1);
		break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE:
		evbuffer_add_printf(b, "{\"model\":%s,", s->model_json);
		ollama_time(s, b, nominal_ns(s, s->n_reason + s->n_out));
		if (s->ep == EP_OLLAMA_CHAT)
			evbuffer_add_printf(b, ",\"message\":{\"role\":\"assistant\",\"content\":");
		else
			evbuffer_add_printf(b, ",\"response\":");
		if (s->tool)
			evbuffer_add(b, "\"\"", 2);
		else
			sim_json_str(b, t, tlen);
		if (shows_reasoning(s)) {
			evbuffer_add(b, ",\"thinking\":", 12);
			r = buf_text(s->reason, &rlen);
			sim_json_str(b, r, rlen);
		}
		if (s->tool) {
			t = buf_text(s->text, &tlen);
			ollama_tool_calls(s, b, t, tlen);
		}
		evbuffer_add_printf(b, "%s,", s->ep == EP_OLLAMA_CHAT ? "}" : "");
		ollama_tail(s, b);
		break;
	case EP_RESPONSES: resp_object(s, b, true); break;
	case EP_LLAMACPP:
		evbuffer_add_printf(b, "{\"index\":0,\"content\":");
		sim_json_str(b, t, tlen);
		llamacpp_tail(s, b);
		break;
	case EP_GEMINI:
	case EP_GEMINI_STREAM:
		gemini_open(b);
		if (shows_reasoning(s)) {
			r = buf_text(s->reason, &rlen);
			gemini_part(s, b, r, rlen, true);
			evbuffer_add(b, ",", 1);
		}
		t = buf_text(s->text, &tlen);
		gemini_part(s, b, t, tlen, false);
		gemini_close(s, b, true, s->n_reason, s->n_out);
		break;
	case EP_TGI:
	case EP_TGI_STREAM:
		evbuffer_add_printf(b, "{\"generated_text\":");
		sim_json_str(b, t, tlen);
		if (s->details) {
			evbuffer_add_printf(b, ",\"details\":");
			tgi_details(s, b, false);
		}
		evbuffer_add_printf(b, "}");
		break;
	case EP_BEDROCK_CONVERSE:
		evbuffer_add(b, "{", 1);
		converse_usage(s, b);
		evbuffer_add(b, ",\"output\":{\"message\":{\"content\":[", 33);
		if (shows_reasoning(s)) {
			evbuffer_add(b, "{\"reasoningContent\":{\"reasoningText\":{\"text\":", 45);
			r = buf_text(s->reason, &rlen);
			sim_json_str(b, r, rlen);
			evbuffer_add(b, "}}},", 4);
		}
		evbuffer_add(b, "{\"text\":", 8);
		sim_json_str(b, t, tlen);
		evbuffer_add_printf(b, "}],\"role\":\"assistant\"}},\"stopReason\":\"%s\"}", finish_reason(s));
		break;
	case EP_BEDROCK_INVOKE:
		evbuffer_add_printf(b,
				    "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%s,"
				    "\"content\":[{\"type\":\"text\",\"text\":",
				    s->id, s->model_json);
		sim_json_str(b, t, tlen);
		evbuffer_add_printf(b, "}],\"stop_reason\":\"%s\",\"stop_sequence\":null,\"usage\":", finish_reason(s));
		anthropic_usage(s, b, AU_BLOCK);
		evbuffer_add(b, "}", 1);
		break;
	}
	if (s->ep == EP_BEDROCK_INVOKE) {
		char extra[256];
		snprintf(extra, sizeof(extra),
			 "x-amzn-bedrock-invocation-latency: %" PRIu64 "\r\nx-amzn-bedrock-input-token-count: %" PRIu64
			 "\r\nx-amzn-bedrock-output-token-count: %" PRIu64 "\r\n",
			 bedrock_latency_ms(s), s->n_in - s->n_cached - s->n_cache_write, s->n_reason + s->n_out);
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
