/*
 * classify.h — which streamed events carry tokens, and where usage lives.
 *
 * The API of a request is known from its path. For each framed event the
 * classifier answers what it carries (nothing, answer text, reasoning, a
 * tool call) and picks the token counts out of the event that carries
 * usage. Both are byte scans over the
 * event, never a JSON parse or an allocation: a key search for the token
 * decision, and a walk over the members of the objects that hold the counts
 * (classify.c says why that is safe). Definitions: docs/metrics.md.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "framer.h"

enum api_kind {
	API_UNKNOWN = 0,
	API_OPENAI_CHAT,	/* /v1/chat/completions */
	API_OPENAI_COMPLETIONS, /* /v1/completions, /completions (also llama.cpp's native shape) */
	API_ANTHROPIC,		/* /v1/messages */
	API_TGI,		/* /generate_stream, /generate */
	API_LLAMACPP,		/* /completion (llama.cpp native) */
	API_OLLAMA_GENERATE,	/* /api/generate */
	API_OLLAMA_CHAT,	/* /api/chat */
	API_OPENAI_RESPONSES,	/* /v1/responses, /responses (OpenAI's Responses API) */
	/* One answer per request, never streamed: no token events, usage
	 * from the body and the inputs of a batch (reqinfo.h). */
	API_EMBEDDINGS, /* /v1/embeddings, /embeddings (OpenAI, vLLM, SGLang, llama.cpp, Ollama) */
	API_RERANK,	/* /v1/rerank, /rerank, /v2/rerank (vLLM, Jina, Cohere, TEI) */
	API_SCORE,	/* /v1/score, /score (vLLM) */
	API_CLASSIFY,	/* /classify, /v1/classify (vLLM) */
	API_TEI_EMBED,	/* /embed (TEI's native API: a bare array, no usage) */
	/* Gemini: the model is in the path, /v1beta/models/MODEL:METHOD
	 * (Google AI) or /v1/projects/P/locations/L/publishers/google/
	 * models/MODEL:METHOD (Vertex AI); both named "gemini". */
	API_GEMINI,	   /* :generateContent, one body */
	API_GEMINI_STREAM, /* :streamGenerateContent: SSE with ?alt=sse, else one JSON array */
	/* AWS Bedrock: /model/MODEL/OP, the model in the path; streamed as
	 * an event stream (framer.h). */
	API_BEDROCK_CONVERSE, /* OP converse-stream, converse */
	API_BEDROCK_INVOKE,   /* OP invoke-with-response-stream, invoke: the model family's own JSON */
	API_REALTIME,	      /* /v1/realtime: a WebSocket session (OpenAI Realtime, vLLM), realtime.h */
};

/* How the server itself says a response ended, where its API says it (the
 * Responses API's terminal event or body status). Ordered: a later event
 * can make it worse, never better. */
enum resp_outcome {
	OUTCOME_NONE = 0,   /* nothing said, or completed */
	OUTCOME_INCOMPLETE, /* status "incomplete": cut by max_output_tokens or a content filter */
	OUTCOME_FAILED,	    /* status "failed", or an `error` event */
};

/* What a token-bearing event carries. TOKEN_NONE is 0, so the result reads
 * as "bears tokens or not" too. An event that carries more than one kind is
 * the first of answer, tool call, reasoning that it holds: the answer is
 * what the user sees. */
enum token_kind {
	TOKEN_NONE = 0,
	TOKEN_ANSWER,	 /* text the user reads: content, output_text, a refusal */
	TOKEN_REASONING, /* the model thinking: reasoning_content, thinking, reasoning_text */
	TOKEN_TOOL,	 /* a tool call: tool_calls, function_call_arguments, input_json_delta */
};

/* Which engine's own per-request report filled a struct server_timing. */
enum server_source {
	SERVER_NONE = 0, /* the server said nothing: tokentap's phases only */
	SERVER_LLAMACPP, /* llama.cpp's "timings" object */
	SERVER_OLLAMA,	 /* Ollama's final-object durations */
	SERVER_VLLM,	 /* vLLM's "metrics" object (--enable-per-request-metrics) */
	SERVER_TGI,	 /* TGI's x-*-time response headers (non-streamed) */
	SERVER_BEDROCK,	 /* Bedrock's invocation metrics, Converse's latencyMs */
};

/* The server's own account of where a request's time went, in ns; -1 where
 * it did not say. Read as the response passes, never asked for: which
 * engine fills which field is in docs/metrics.md ("Server timings"). */
struct server_timing {
	int64_t queue_ns;      /* waiting in the engine's scheduler queue */
	int64_t load_ns;       /* loading the model (Ollama: also its wait for a runner) */
	int64_t validation_ns; /* tokenizing and validating before the queue (TGI) */
	int64_t prefill_ns;    /* processing the prompt, to the first token */
	int64_t decode_ns;     /* first token to last */
	int64_t inference_ns;  /* prefill and decode together, where not split (TGI); the whole call (Bedrock) */
	int64_t first_byte_ns; /* the server's own time to its first byte (Bedrock's firstByteLatency) */
	enum server_source source;
};

#define SERVER_TIMING_UNKNOWN \
	((struct server_timing){ .queue_ns = -1, \
				 .load_ns = -1, \
				 .validation_ns = -1, \
				 .prefill_ns = -1, \
				 .decode_ns = -1, \
				 .inference_ns = -1, \
				 .first_byte_ns = -1, \
				 .source = SERVER_NONE })

/* Usage as reported by the server; -1 where not (yet) known, so "not
 * reported" stays distinct from 0. input_tokens is the whole prompt for
 * every API (Anthropic's own input_tokens, which leaves out cache reads and
 * writes, is normalised); cached_tokens and cache_write_tokens are parts
 * of it, reasoning_tokens a part of output_tokens. `outcome` rides along
 * because it comes from the same terminal event. */
struct usage {
	int64_t input_tokens;
	int64_t output_tokens;
	int64_t cached_tokens;	    /* prompt tokens read from the server's prefix cache */
	int64_t cache_write_tokens; /* prompt tokens written to it (Anthropic, OpenAI's cache_write_tokens) */
	int64_t reasoning_tokens;   /* output tokens spent reasoning */
	enum resp_outcome outcome;
	struct server_timing server; /* from the same final event or body */
};

#define USAGE_UNKNOWN \
	((struct usage){ .input_tokens = -1, \
			 .output_tokens = -1, \
			 .cached_tokens = -1, \
			 .cache_write_tokens = -1, \
			 .reasoning_tokens = -1, \
			 .outcome = OUTCOME_NONE, \
			 .server = SERVER_TIMING_UNKNOWN })

/* The API a request path (without query string) speaks. */
enum api_kind classify_api(const char *path, size_t len);

/* For an API that names its model in the path (Gemini): the model's bytes
 * in `path`, *model pointing at them, and their length; 0 when the path
 * names none or one that is not plain visible ASCII. */
size_t classify_path_model(enum api_kind api, const char *path, size_t len, const char **model);

/* A 2xx answer of this API that is not SSE or NDJSON is a streamed JSON
 * array, framed as FRAMER_JSON_ARRAY (Gemini's :streamGenerateContent
 * without ?alt=sse). */
bool classify_streams_json_array(enum api_kind api);
/* A Bedrock path's model: the segment between "/model/" and the
 * operation, as sent (URL-encoded; an ARN may hold unencoded '/'), in
 * *off and *len; false for any other path. */
bool classify_bedrock_path_model(const char *path, size_t len, size_t *off, size_t *mlen);

/* The path says the answer is streamed (Bedrock's -stream operations). */
bool classify_path_streams(enum api_kind api, const char *path, size_t len);

/* Short stable name for logs: "openai-chat", "anthropic", ... */
const char *classify_api_name(enum api_kind api);

/* The top-level request field whose top-level elements are the inputs of
 * a batch ("input", "documents", ...), for the APIs that take one; NULL
 * for the others. */
const char *classify_inputs_key(enum api_kind api);

/* Where the request has no countable classify_inputs_key field: the one
 * another server of the same path uses (TEI's rerank: "texts"); NULL
 * when there is none. */
const char *classify_inputs_alt_key(enum api_kind api);

/* Where the last token-bearing event of a stream proved itself: which of
 * its API's token keys, at what offset. The events of one stream share
 * their head (id, model, the same nesting up to the text), so the next one
 * is probed there first instead of searched from its start. A hint only
 * ever makes the answer cheaper, never different: a probe can confirm a
 * token, and when it does not the event is searched in full. Zero it for
 * each response. */
struct classify_hint {
	uint32_t at;  /* offset of the key that held the text */
	uint8_t rule; /* 1 + index of that key in the API's token keys; 0: none yet */
};

/* Short stable name for logs: "llamacpp", "ollama", "vllm", "tgi"; NULL for
 * SERVER_NONE. */
const char *classify_server_name(enum server_source src);

/* Reads one response header for the server timings it may carry (TGI's
 * x-queue-time, x-inference-time, x-validation-time: integer ms). `name` is
 * compared without regard to case; other headers leave `t` as it was. */
void classify_header(const char *name, size_t nlen, const char *val, size_t vlen, struct server_timing *t);

/* Classifies one streamed event: what it carries, TOKEN_NONE when it bears
 * no tokens. Updates `usage` when the event carries counts (later values
 * win field by field) or says how the response ended (the worse outcome
 * wins). `hint` may be NULL (each event decided on its own); the answer is
 * the same with it or without. */
enum token_kind classify_event(enum api_kind api, const struct framer_event *ev, struct usage *usage,
			       struct classify_hint *hint);

/*
 * classify_event() for an event of framer `f`, which may skip the
 * classifying: the answer, usage and hint come out as classify_event()'s.
 * After an event classified in full whose token text is a plain string and
 * that left the usage as it was (chat completions, an Anthropic
 * content_block_delta, a Responses API token event, each by its SSE name
 * where it has one), the event is armed as the framer's shape, holes at
 * its text (and a Responses event's sequence_number); an event framed as
 * that shape (same_shape) is answered with that event's kind and hint,
 * leaving usage alone, as classify_event() would: classify.c, "Same-shape
 * events", says why. Any other event is classified in full and re-arms
 * the shape, or, when it cannot be armed itself, leaves the shape armed
 * before if it left usage and hint as that shape has them, else clears it
 * (classify_event_armed, the same without the same-shape test). `usage`
 * and `hint` may not be NULL.
 */
enum token_kind classify_event_armed(enum api_kind api, struct framer *f, const struct framer_event *ev,
				     struct usage *usage, struct classify_hint *hint);

/* The answer to an event of `f`'s shape (same_shape): the kind of the
 * event the shape was armed from, and its hint, which classify_event()
 * would give this event too. */
static inline enum token_kind classify_shape_answer(const struct framer *f, struct classify_hint *hint)
{
	uint64_t tag = framer_shape_tag(f);

	hint->rule = (uint8_t)(tag >> 8);
	hint->at = (uint32_t)(tag >> 32);
	return (enum token_kind)(tag & 0xff);
}

static inline enum token_kind classify_event_shaped(enum api_kind api, struct framer *f, const struct framer_event *ev,
						    struct usage *usage, struct classify_hint *hint)
{
	if (ev->same_shape)
		return classify_shape_answer(f, hint);
	return classify_event_armed(api, f, ev, usage, hint);
}

/* Reads usage (and, for the Responses API, the outcome) from a whole
 * non-streamed JSON response body. */
void classify_body(enum api_kind api, const char *body, size_t len, struct usage *usage);

/* Reads a batch API's usage from the last bytes of a body too large to
 * keep whole: the object of the last top-level-looking "usage" key in
 * them (an embeddings answer puts it after the vectors, where no string
 * holds a quote). Other APIs are left as they were. */
void classify_body_tail(enum api_kind api, const char *tail, size_t len, struct usage *usage);

/* gen_ai.response.model: the model an answer names, in [p, p + len) (one
 * streamed event, or part of a body): the string value of a "model" key,
 * the first one (OpenAI's, Anthropic's message_start and body, Ollama's,
 * the Responses API's response.created, Bedrock InvokeModel's model family
 * JSON where it has one); for Gemini the last "modelVersion" key (each
 * GenerateContentResponse ends with it). A "model" that is a value, not a
 * key ("role": "model"), is passed over. Bedrock Converse names no model:
 * never. Taken only as plain visible ASCII without escapes, shorter than
 * cap, copied NUL-terminated into out; false (out untouched) when none. */
bool classify_resp_model(enum api_kind api, const char *p, size_t len, char *out, size_t cap);

/* Whether a body names its model at its end rather than its start
 * (Gemini's modelVersion follows the candidates): the caller scans the
 * body's last bytes for it. */
bool classify_resp_model_at_end(enum api_kind api);
