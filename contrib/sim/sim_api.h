/*
 * sim_api.h — what sim_api.c shares with the files that write each API's
 * bytes: the stream of one response (struct sim_stream), the HTTP framing
 * (sim_http.c), what a request body asks for (sim_request.c), and each
 * API's writers, called by sim_api.c at the stream's steps (preamble,
 * reasoning opened and closed, answer opened, each token, the end of a
 * stream, a whole body):
 *   sim_openai.c     OpenAI chat and completions, shaped like vLLM
 *   sim_responses.c  OpenAI Responses, shaped like the hosted API
 *   sim_anthropic.c  Anthropic messages
 *   sim_ollama.c     Ollama chat and generate
 *   sim_llamacpp.c   llama.cpp's native /completion
 *   sim_tgi.c        TGI's /generate and /generate_stream
 *   sim_gemini.c     Gemini's :generateContent and :streamGenerateContent
 *   sim_bedrock.c    AWS Bedrock's Converse and InvokeModel
 *
 * A writer appends to the stream's scratch event (s->ev) or to the body it
 * is given; writers that send several events emit each as one HTTP chunk
 * themselves (emit_chunk). Private to tokentap-sim's API files; sim_conn.c
 * sees only sim.h.
 */
#pragma once

#include "sim.h"

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

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
	/* ... with continuous_usage_stats too (vLLM): usage on every chunk,
	 * completion_tokens counting what the chunks so far carried */
	bool continuous_usage;
	/* Speculative decoding (--spec-tokens, x-sim-spec-tokens): each chat
	 * or completions event carries 1 to `spec` tokens, the group drawn
	 * from spec_prng when its first token is due; the rest of the group's
	 * token steps send nothing (group_left of them remain). */
	uint64_t spec, group_left;
	struct sim_prng spec_prng;
	uint64_t counted; /* output tokens the events so far carried (their usage) */
	bool hit_limit;	  /* stopped by max_tokens: "length" */
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

/* ---- sim_http.c: the HTTP bytes ---- */

/* content_length < 0 selects chunked transfer encoding; `extra`: more
 * header lines, each ending in CRLF, or NULL. */
void write_head_with(struct evbuffer *out, int status, const char *ctype, int64_t content_length,
		     const char *request_id, bool keep_alive, const char *extra);
void write_head(struct evbuffer *out, int status, const char *ctype, int64_t content_length, const char *request_id,
		bool keep_alive);
/* A complete response whose body is the contents of body (drained). */
void write_whole_with(struct evbuffer *out, int status, const char *ctype, struct evbuffer *body,
		      const char *request_id, bool keep_alive, const char *extra);
void write_whole(struct evbuffer *out, int status, const char *ctype, struct evbuffer *body, const char *request_id,
		 bool keep_alive);
/* Moves the scratch event into out as exactly one HTTP chunk. */
void emit_chunk(struct sim_stream *s, struct evbuffer *out);
/* An error answer in the family's body shape. */
void write_error(struct evbuffer *out, enum sim_family fam, int status, const char *message,
		 const struct sim_api_request *rq);

/* ---- sim_request.c: what the request body asks for ---- */

/* Appends the prompt's text (whose length gives the prompt tokens). */
void prompt_text(enum sim_endpoint ep, const json_t *req, struct evbuffer *text);
/* The request's own output limit: 0 and *limit (-1 when none), or -1 and
 * *why for a limit no server would accept. */
int output_limit(enum sim_endpoint ep, const json_t *req, int64_t *limit, const char **why);
/* Reasoning the request asks for: -1 nothing, 0 off, else tokens. */
int64_t request_reasoning(enum sim_endpoint ep, const json_t *req);
/* The tool a tool-call answer calls, or NULL. */
const char *request_tool(enum sim_endpoint ep, const json_t *req);
bool endpoint_has_tools(enum sim_endpoint ep);

/* ---- sim_api.c: shared by the writers ---- */

/* Why the answer stopped, in the API's own words. */
const char *finish_reason(const struct sim_stream *s);
/* The contents of b as a string (valid until b changes). */
const char *buf_text(struct evbuffer *b, size_t *len);
/* An id: prefix and the first n of the stream's hex digits. */
const char *hex_id(const struct sim_stream *s, const char *prefix, int n, char *buf, size_t size);
/* The nominal moment of token k (k == all tokens: the end). */
uint64_t nominal_ns(const struct sim_stream *s, uint64_t k);
/* Reasoning the client sees: tokens, not hidden. */
bool shows_reasoning(const struct sim_stream *s);
/* The answer block's index: after the thinking block when there is one. */
int answer_index(const struct sim_stream *s);
/* ns as a JSON number of ms, exact (six decimals): `"key":ms`. */
void add_ms(struct evbuffer *b, const char *key, uint64_t ns);

/* ---- sim_openai.c: chat and completions ---- */

void openai_preamble(struct sim_stream *s, struct evbuffer *out);
void openai_chat_token(struct sim_stream *s, uint64_t k, bool reasoning, const char *p, size_t plen);
void openai_completion_token(struct sim_stream *s, const char *p, size_t plen);
void openai_finish_stream(struct sim_stream *s, struct evbuffer *out);
void openai_block(struct sim_stream *s, struct evbuffer *b);
/* The scheduler's report, with a leading comma (also in Responses). */
void openai_timing(struct sim_stream *s, struct evbuffer *b);

/* ---- sim_responses.c ---- */

void resp_preamble(struct sim_stream *s, struct evbuffer *out);
void resp_open_reasoning(struct sim_stream *s, struct evbuffer *out);
void resp_close_reasoning(struct sim_stream *s, struct evbuffer *out);
void resp_open_answer(struct sim_stream *s, struct evbuffer *out);
void resp_delta(struct sim_stream *s, struct evbuffer *out, bool reasoning, const char *w, size_t wlen);
void resp_finish(struct sim_stream *s, struct evbuffer *out);
/* The Response object: in progress, or completed (also the whole body). */
void resp_object(struct sim_stream *s, struct evbuffer *b, bool done);

/* ---- sim_anthropic.c ---- */

enum anthropic_usage_at { AU_START, AU_DELTA, AU_BLOCK };

void anthropic_preamble(struct sim_stream *s, struct evbuffer *out);
void anthropic_open_reasoning(struct sim_stream *s, struct evbuffer *out);
void anthropic_close_reasoning(struct sim_stream *s, struct evbuffer *out);
void anthropic_open_answer(struct sim_stream *s, struct evbuffer *out);
void anthropic_token(struct sim_stream *s, bool reasoning, const char *p, size_t plen);
void anthropic_finish_stream(struct sim_stream *s, struct evbuffer *out);
void anthropic_block(struct sim_stream *s, struct evbuffer *b);
/* Anthropic's usage object (also in Bedrock's InvokeModel). */
void anthropic_usage(struct sim_stream *s, struct evbuffer *b, enum anthropic_usage_at at);

/* ---- sim_ollama.c ---- */

void ollama_token(struct sim_stream *s, uint64_t k, bool reasoning, bool last, const char *p, size_t plen);
void ollama_finish_stream(struct sim_stream *s, struct evbuffer *out);
void ollama_block(struct sim_stream *s, struct evbuffer *b);

/* ---- sim_llamacpp.c ---- */

void llamacpp_token(struct sim_stream *s, uint64_t k, const char *p, size_t plen);
void llamacpp_finish_stream(struct sim_stream *s, struct evbuffer *out);
void llamacpp_block(struct sim_stream *s, struct evbuffer *b);

/* ---- sim_tgi.c ---- */

void tgi_token(struct sim_stream *s, uint64_t k, const char *p, size_t plen, bool last);
void tgi_finish_stream(struct sim_stream *s, struct evbuffer *out);
void tgi_block(struct sim_stream *s, struct evbuffer *b);
/* /generate's x-* timing headers, CRLF-terminated lines, into buf. */
void tgi_headers(struct sim_stream *s, char *buf, size_t size);

/* ---- sim_gemini.c ---- */

/* A Gemini path: its method as *ep, its model into `model` (cap bytes). */
bool gemini_endpoint(const char *path, enum sim_endpoint *ep, char *model, size_t cap);
/* The query names alt=sse. */
bool query_alt_sse(const char *q);
void gemini_token(struct sim_stream *s, uint64_t k, bool reasoning, bool last, const char *p, size_t plen);
void gemini_finish_stream(struct sim_stream *s, struct evbuffer *out);
void gemini_block(struct sim_stream *s, struct evbuffer *b);

/* ---- sim_bedrock.c ---- */

void bedrock_preamble(struct sim_stream *s, struct evbuffer *out);
void bedrock_open_block(struct sim_stream *s, struct evbuffer *out, int index, bool thinking);
void bedrock_close_block(struct sim_stream *s, struct evbuffer *out, int index);
void bedrock_token(struct sim_stream *s, struct evbuffer *out, bool reasoning, const char *p, size_t plen);
void bedrock_finish(struct sim_stream *s, struct evbuffer *out);
void bedrock_block(struct sim_stream *s, struct evbuffer *b);
/* InvokeModel's x-amzn-bedrock-* headers, CRLF-terminated lines, into buf. */
void bedrock_invoke_headers(struct sim_stream *s, char *buf, size_t size);
