/*
 * sim.h — shared declarations of tokentap-sim, the bundled fake LLM
 * inference server used by the demo and the integration tests.
 *
 * The simulator is split by concern:
 *   sim.c       main: command line, listener, signals
 *   sim_conn.c  one client connection: HTTP/1.1 parsing (llhttp),
 *               pipelining, token pacing, backpressure, abort detection
 *   sim_api.c   the endpoints, the start of a response and its steps, each
 *               handed to its API's file through sim_api.h (their private
 *               header): sim_openai.c, sim_responses.c, sim_anthropic.c,
 *               sim_ollama.c, sim_llamacpp.c, sim_tgi.c, sim_gemini.c and
 *               sim_bedrock.c (with Bedrock's event-stream framing and
 *               base64 chunks)
 *   sim_http.c  response heads, chunks and error bodies
 *   sim_request.c what a request body asks for: prompt, limit, reasoning, tool
 *   sim_embed.c the embeddings and rerank bodies
 *   sim_text.c  determinism: hashing, the PRNG, the word list, JSON escaping
 *   sim_batch.c the optional continuous-batching model (--batching): one
 *               step scheduler shared by all connections
 *   sim_cache.c the optional prefix-cache model (--prefix-cache)
 *   sim_metrics.c GET /metrics in vLLM's, SGLang's or llama.cpp's names
 *   sim_realtime.c GET /v1/realtime upgraded to a WebSocket: an
 *               OpenAI-Realtime-shaped text session (sim_conn hands the
 *               connection over once the handshake is parsed)
 *
 * Invariant kept across all files: the bytes of a response body are a pure
 * function of (--seed, request path, request body, x-sim-* overrides). No
 * wall clock, no address, no counter ever reaches a response body except in
 * GET /sim/stats, and, with --prefix-cache only, the cached counts in usage
 * (which depend on the prompts seen before), and with --server-timing only,
 * the engine-shaped report of the time a batched request really took.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct event_base;

/* Largest --spec-tokens / x-sim-spec-tokens: tokens one event may carry. */
#define SIM_MAX_SPEC_TOKENS 64

/* Largest --events-per-write / x-sim-events-per-write. */
#define SIM_MAX_EVENTS_PER_WRITE 4096

/* Command line settings; owned by main, read-only once the loop runs. */
struct sim_config {
	uint64_t ttft_ms;	   /* request fully received -> first token event */
	uint64_t itl_ms;	   /* gap between token events */
	uint64_t events_per_write; /* token events gathered into one write (1: each as due) */
	uint64_t tokens;	   /* output length when the request sets none */
	uint64_t seed;		   /* folded into every PRNG stream and id */
	const char *model;	   /* model name when the request names none */

	/* Reasoning, prompt caching and tool calls (docs/simulator.md,
	 * "Reasoning, caching, tool calls"); x-sim-* headers override. */
	uint64_t reasoning_tokens;   /* reasoning tokens before the answer, 0 off */
	uint64_t think_ms;	     /* extra pause before the first answer token */
	int64_t cached_tokens;	     /* prompt tokens read from the cache, -1 none reported */
	uint64_t cache_write_tokens; /* Anthropic: prompt tokens written to the cache */
	bool tool_calls;	     /* answer with a tool call even without tools */
	bool prefix_cache;	     /* the prefix-cache model (sim_cache.c) */
	uint64_t cache_tokens;	     /* its size: tokens held before evicting */
	bool reasoning_hidden;	     /* reasoning takes time and counts, sends nothing */
	uint64_t spec_tokens;	     /* chat/completions: up to this many tokens per event, 1 off */

	/* --batching: a continuous-batching server (sim_batch.c). Off by
	 * default; requests with x-sim-ttft-ms / x-sim-itl-ms keep the fixed
	 * timing above even when it is on. */
	bool batching;
	uint64_t max_batch;	  /* sequences in the running batch */
	uint64_t kv_tokens;	  /* KV-cache budget, tokens */
	double prefill_tps;	  /* prompt tokens prefilled per second */
	uint64_t chunked_prefill; /* prefill tokens per step, 0 = whole prompt */
	double step_base_ms;	  /* fixed cost of one step */
	double step_per_seq_ms;	  /* added per sequence emitting in the step */
	uint64_t cold_start_ms;	  /* delay of the first request after idle */
	uint64_t idle_ms;	  /* no traffic this long makes the server cold */
	uint64_t backlog_tokens;  /* unsent tokens of a stalled reader before
				   * its connection is dropped, 0 = never */

	/* --server-timing: batched responses report the queue, prefill and
	 * decode they really took, as the engine named would (Ollama's routes
	 * always as Ollama). Off by default: the report depends on the clock. */
	enum sim_server_timing { SIM_TIMING_OFF, SIM_TIMING_VLLM, SIM_TIMING_LLAMACPP } server_timing;

	/* --metrics-style: whose names GET /metrics uses (sim_metrics.c) */
	enum sim_metrics_style {
		SIM_METRICS_VLLM,
		SIM_METRICS_SGLANG,
		SIM_METRICS_LLAMACPP,
		SIM_METRICS_ALL
	} metrics_style;

	/* --tls-cert/--tls-key: the listener speaks TLS (an https upstream
	 * for the proxy benchmarks); --tls-ciphersuites narrows TLS 1.3's
	 * suites so that every proxy negotiates the same one. */
	const char *tls_cert, *tls_key, *tls_ciphersuites;
};

/* What the batch scheduler did with one request, in ns, for --server-timing:
 * waiting in its queue (fully received to admitted into a step), prefill
 * (admitted to the end of the step that emitted the first token, as it was
 * processed) and decode (first token to last). */
struct sim_timing {
	bool known;
	uint64_t queue_ns, prefill_ns, decode_ns;
};

/*
 * Process-wide counters served at GET /sim/stats. Single-threaded: only the
 * event loop touches them. Invariant: requests == completed + aborted +
 * (requests still being received or answered).
 */
struct sim_stats {
	uint64_t requests;	/* requests seen, any path but /sim/stats */
	uint64_t completed;	/* responses fully queued for the socket */
	uint64_t aborted;	/* client went away before its response ended */
	uint64_t last_abort_ns; /* CLOCK_MONOTONIC of the latest abort, 0 none */
	uint64_t open_connections;
	uint64_t bytes_sent;   /* response bytes, /sim/stats answers excluded */
	char *last_request_id; /* x-request-id of the latest request, or "" */
	uint64_t dropped;      /* --batching: readers dropped for stalling */
};

extern struct sim_config sim_cfg;
extern struct sim_stats sim_stats;

/* CLOCK_MONOTONIC in nanoseconds: the clock of last_abort_ns and pacing. */
uint64_t sim_now_ns(void);

/* ---- sim_conn.c ---- */

/* Takes ownership of an accepted socket. Returns 0, or -1 (fd closed). */
int sim_conn_accept(struct event_base *base, int fd);
/* The listener's TLS context (an SSL_CTX *), NULL for plain HTTP; sim.c
 * sets it before the loop runs. */
extern void *sim_tls_ctx;

/* ---- sim_api.c ---- */

/* One fully received request, as sim_conn hands it to sim_api. */
struct sim_api_request {
	const char *method;
	const char *path;  /* without the query string */
	const char *query; /* after the '?', NULL when there is none */
	const char *body;  /* NUL-terminated copy of the body */
	size_t body_len;
	const char *request_id;	    /* echoed as x-request-id, NULL if absent */
	int64_t ttft_ms;	    /* x-sim-ttft-ms, -1 if absent */
	int64_t itl_ms;		    /* x-sim-itl-ms, -1 if absent */
	int64_t tokens;		    /* x-sim-tokens, -1 if absent */
	int64_t reasoning_tokens;   /* x-sim-reasoning-tokens, -1 if absent */
	int64_t think_ms;	    /* x-sim-think-ms, -1 if absent */
	int64_t cached_tokens;	    /* x-sim-cached-tokens, -1 if absent */
	int64_t cache_write_tokens; /* x-sim-cache-write-tokens, -1 if absent */
	int64_t tool_call;	    /* x-sim-tool-call 0 or 1, -1 if absent */
	int64_t reasoning_hidden;   /* x-sim-reasoning-hidden 0 or 1, -1 if absent */
	int64_t spec_tokens;	    /* x-sim-spec-tokens 1 to SIM_MAX_SPEC_TOKENS, -1 if absent */
	const char *exception;	    /* x-sim-exception: a Bedrock stream ends in this exception, NULL none */
	const char *header_error;   /* a malformed x-sim-* header, or NULL */
	bool keep_alive;
};

/* How sim_conn must pace a generating response. */
struct sim_plan {
	uint64_t ttft_ns;
	uint64_t itl_ns;
	uint64_t tokens;	   /* token events in all, reasoning included */
	uint64_t reasoning_tokens; /* the first this many are reasoning */
	uint64_t think_ns;	   /* added before the first answer token */
	uint64_t prompt_tokens;	   /* to prefill: cached tokens excluded */
	bool streaming;		   /* token events as they come, else one block at end */
	bool batched;		   /* paced by the batch scheduler, not ttft/itl */
};

struct sim_stream; /* generation state of one response; owned by its request */

/*
 * Starts the answer to rq. Either writes the complete response to out and
 * returns NULL (errors, /v1/models, /sim/stats, ...), or returns a stream,
 * fills *plan, and for a streaming response writes its head to out.
 */
struct sim_stream *sim_api_begin(const struct sim_api_request *rq, struct evbuffer *out, struct sim_plan *plan);

/* Appends the next token event (and, before the first, the preamble). */
void sim_api_token(struct sim_stream *s, struct evbuffer *out);

/* Appends the closing events (streaming) or the whole response (block). */
void sim_api_finish(struct sim_stream *s, struct evbuffer *out);

/* Accepts NULL. */
void sim_api_free(struct sim_stream *s);

/* The scheduler's account of s, reported in its closing events when
 * --server-timing is on; call before sim_api_finish(). */
void sim_api_timing(struct sim_stream *s, const struct sim_timing *t);

/* ---- sim_batch.c ---- */

enum sim_seq_where { SEQ_NONE, SEQ_QUEUED, SEQ_RUNNING };

/*
 * One request inside the batching model. Embedded in its request (owned by
 * sim_conn); the scheduler only links it into its queue or running batch
 * and counts the tokens it has generated. The scheduler never writes to a
 * socket: after each step it calls sim_conn_seq_progress() for every
 * sequence that advanced, and the connection writes what it can.
 */
struct sim_seq {
	struct sim_seq *prev, *next; /* queue or running list */
	struct sim_seq *notify_next; /* end-of-step notification list */
	void *owner;		     /* the sim_conn */
	enum sim_seq_where where;
	uint64_t n_in, n_out;  /* prompt and output tokens */
	uint64_t kv;	       /* KV tokens reserved: n_in + n_out */
	uint64_t prefilled;    /* prompt tokens prefilled so far */
	uint64_t step_prefill; /* prompt tokens in the current step */
	uint64_t generated;    /* tokens the engine has produced */
	bool step_emits;       /* the current step emits a token for it */
	bool notify_pending;   /* on the notification list */
	bool finished;	       /* all n_out generated; left the batch */
	/* CLOCK_MONOTONIC ns: submitted, admitted into a step (never before
	 * submitted), the moments the step ends of the first and of the last
	 * token were processed (just before those tokens are written) */
	uint64_t submit_ns, admit_ns, first_ns, last_ns;
};

/* What q's times say it took (known once it finished). */
struct sim_timing sim_batch_timing(const struct sim_seq *q);

/* Creates the step timers; call once before the loop runs. */
int sim_batch_init(struct event_base *base);
void sim_batch_shutdown(void);

/* Queues q (FIFO); fields other than owner, n_in, n_out are reset. */
void sim_batch_submit(struct sim_seq *q);

/* Takes q out of the queue or the batch, freeing its KV. Accepts a
 * sequence that is in neither. */
void sim_batch_cancel(struct sim_seq *q);

/* Nominal times at batch size 1, for the Ollama durations in bodies. */
uint64_t sim_batch_nominal_ttft_ns(uint64_t n_in);
uint64_t sim_batch_nominal_itl_ns(void);

/* The scheduler's counters, as a JSON object, for /sim/stats. */
void sim_batch_stats_json(struct evbuffer *out);
/* The batch's sequences, the queue's, and the KV tokens they hold. */
void sim_batch_gauges(uint64_t *running, uint64_t *queued, uint64_t *kv_used);

/* ---- sim_metrics.c ---- */

/* GET /metrics: the load in an engine's Prometheus names. */
void sim_metrics_write(struct evbuffer *out);

/* sim_conn.c: q advanced (a token, or the end of its generation). */
void sim_conn_seq_progress(struct sim_seq *q);

/* ---- sim_cache.c ---- */

/*
 * --prefix-cache: looks the prompt's text up in the cache, then stores its
 * blocks. *cached: prompt tokens of the leading blocks found (at most
 * n_in - 1); *written: tokens of the blocks newly stored.
 */
void sim_cache_use(const char *text, size_t len, uint64_t n_in, uint64_t *cached, uint64_t *written);

struct sim_cache_stats {
	uint64_t lookups, prompt_tokens, cached_tokens;
	uint64_t capacity_tokens, resident_tokens, evicted_blocks;
};
const struct sim_cache_stats *sim_cache_stats(void);

/* Sizes the cache for `tokens` tokens (whole blocks, at least one); call
 * once before the loop runs. Returns 0, or -1 out of memory. */
int sim_cache_init(uint64_t tokens);
void sim_cache_shutdown(void);

/* ---- sim_realtime.c ---- */

struct bufferevent;

/* What the WebSocket handshake of GET /v1/realtime carried. */
struct sim_rt_open {
	const char *key;		 /* Sec-WebSocket-Key */
	const char *query;		 /* after the '?', NULL none (?model=NAME) */
	const char *request_id;		 /* echoed as x-request-id, NULL none */
	int64_t ttft_ms, itl_ms, tokens; /* x-sim-* overrides, -1 absent */
	bool counted;			 /* in sim_stats.requests: the session ends it completed or aborted */
};

/* Answers the handshake (101) and takes bev over for the session, its
 * unread input included: 0. Returns -1 (nothing written, bev still the
 * caller's) when the key is unusable or memory runs out. The session
 * counts itself out of sim_stats.open_connections when it ends, and its
 * handshake (o->counted) as completed, or aborted if the client left
 * during a response. */
int sim_realtime_take(struct event_base *base, struct bufferevent *bev, const struct sim_rt_open *o);

/* ---- sim_text.c ---- */

uint64_t sim_hash(const void *data, size_t len, uint64_t h);
uint64_t sim_mix(uint64_t x);

/* splitmix64: tiny, fast and identical on every platform. */
struct sim_prng {
	uint64_t state;
};
uint64_t sim_prng_next(struct sim_prng *p);

/* The text of one output token; first token carries no leading space. */
const char *sim_text_word(struct sim_prng *p, bool first, size_t *len);

/* Appends s as a JSON string literal, quotes included. */
void sim_json_str(struct evbuffer *out, const char *s, size_t len);

/* ---- sim_bedrock.c ---- */

/* Appends one event-stream message: an event of `event_type` whose JSON
 * payload gets Bedrock's "p" padding member; an exception (no padding);
 * an InvokeModel `chunk` carrying `json` base64-encoded. */
void sim_es_event(struct evbuffer *out, const char *event_type, const char *json, size_t len);
void sim_es_exception(struct evbuffer *out, const char *exception_type, const char *json, size_t len);
void sim_es_chunk(struct evbuffer *out, const char *json, size_t len);

/* A Bedrock path /model/MODEL/OP: *op points into path at OP, *model is
 * MODEL percent-decoded (malloc'd, the caller frees it). */
bool sim_bedrock_path(const char *path, const char **op, char **model);

/* ---- sim_embed.c ---- */

struct json_t;

/* The whole body of an embeddings (rerank) answer to the parsed request
 * `req`, appended to `body`, and the inputs (documents) it held. Returns
 * 0, or -1 with what the API would refuse in `err` (a 400). */
int sim_embed_body(const struct json_t *req, const char *model_json, struct evbuffer *body, uint64_t *inputs, char *err,
		   size_t errlen);
int sim_rerank_body(const struct json_t *req, const char *model_json, struct evbuffer *body, uint64_t *inputs,
		    char *err, size_t errlen);
