/*
 * bench.h — tokentap-bench, the load generator: declarations shared by its
 * files.
 *
 * Reading order: bench.c (command line, run and sweep orchestration),
 * bench_dist.c (random numbers, length distributions, arrival gaps, prompt
 * text), bench_run.c (the event loop: connections, requests, timestamps),
 * bench_report.c (table, JSON, per-request log, progress line),
 * bench_sweep.c (the concurrency sweep's JSON and SVG chart),
 * bench_admin.c (--compare-admin: tokentap's /stats beside the client's),
 * bench_replay.c (--replay: a trace's arrivals, lengths and prompts),
 * bench_session.c (--sessions: multi-turn conversations, history resent),
 * bench_tls.c (https: the client context, sessions resumed).
 *
 * One definition of a token event: responses are split by tokentap's own
 * framer (src/parse/framer.h) and each event is judged by its classifier
 * (src/parse/classify.h); a request's timeline and derived metrics are tokentap's
 * struct req_record and record_derive() (src/record/timeline.h), with `arrive` set
 * to the moment the first request byte was written. Latencies go into
 * tokentap's histograms (src/record/hist.h) in microseconds, as tokentap records
 * them.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "classify.h"
#include "hist.h"
#include "timeline.h"

#define BENCH_NAME "tokentap-bench"

/* Bounds on what a command line can ask for. */
#define BENCH_MAX_HEADERS 32
#define BENCH_MAX_SWEEP 32
#define BENCH_MAX_CONCURRENCY 10000
#define BENCH_MAX_RATE 100000.0
#define BENCH_MAX_LEN 1000000u	    /* tokens, prompt or output */
#define BENCH_MAX_TURNS 1000u	    /* --turns: a turn's body holds the whole history */
#define BENCH_MAX_FILE_LENS 1000000 /* lines in a --input-len file:PATH */
#define BENCH_MAX_BODY (16u << 20)  /* a non-streamed response body kept */
#define BENCH_BYTES_PER_TOKEN 4	    /* the simulator's count: ceil(bytes / 4) */

/* ---- length distributions and random numbers (bench_dist.c) ---- */

enum dist_kind { DIST_FIXED, DIST_UNIFORM, DIST_NORMAL, DIST_FILE };

struct dist {
	enum dist_kind kind;
	double a, b;	/* fixed: a; uniform: [a, b]; normal: mean a, sd b */
	uint32_t *vals; /* file: the lengths, replayed in order (owned) */
	size_t n;
	char desc[96]; /* as the user wrote it, for reports */
};

/* splitmix64: small, fast, good enough for lengths and arrival gaps. */
struct rng {
	uint64_t s;
};

void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
double rng_unit(struct rng *r); /* in (0, 1) */

/* Parses `fixed:N`, `uniform:A:B`, `normal:MEAN:SD` or `file:PATH` (a bare
 * N means fixed). `min` is the smallest length allowed. 0, or -1 with a
 * sentence in err. */
int dist_parse(struct dist *d, const char *s, unsigned min, char *err, size_t errlen);
/* The length for request number `seq`: a pure function of (seed, seq), so a
 * sweep step or a rerun gets the same lengths in the same order. */
uint32_t dist_draw(const struct dist *d, uint64_t seed, uint64_t seq, unsigned min);
void dist_free(struct dist *d);

enum arrivals { ARRIVALS_POISSON, ARRIVALS_GAMMA };

/* Seconds to the next arrival for `rate` requests/s: exponential (poisson)
 * or gamma with shape `burstiness` and the same mean (burstiness 1 is
 * poisson; below 1 burstier, above 1 more regular). */
double arrival_gap_s(struct rng *r, enum arrivals kind, double rate, double burstiness);

struct evbuffer;
/* Appends synthetic prompt text of exactly tokens * 4 bytes (letters and
 * spaces only, so it needs no JSON escaping), different per seq. */
void prompt_text_add(struct evbuffer *out, uint32_t tokens, uint64_t seed, uint64_t seq);

/* ---- a trace to replay (bench_replay.c) ---- */

struct replay_entry {
	uint64_t t_ms; /* as written */
	uint64_t t_ns; /* from the first arrival, scaled by --speed */
	uint32_t in_len, out_len;
	uint32_t nids;
	uint64_t *ids; /* hash_ids (owned) */
	size_t line;   /* in the file: ties keep file order */
};

struct replay {
	struct replay_entry *e; /* sorted by arrival */
	size_t n;
	unsigned block_tokens; /* tokens a hash id stands for */
};

/* Reads a Mooncake-shaped JSONL trace, sorts it by timestamp, keeps the
 * first `limit` (0: all) and scales the gaps by 1/speed. 0, or -1 with a
 * sentence in err. */
int replay_load(struct replay *rp, const char *path, double speed, uint64_t limit, char *err, size_t errlen);
void replay_free(struct replay *rp);
/* Appends request `seq`'s prompt: exactly in_len * 4 bytes, equal hash id
 * prefixes giving equal text prefixes. */
void replay_prompt_add(struct evbuffer *out, const struct replay *rp, uint64_t seq, uint64_t seed);

/* ---- options (bench.c) ---- */

enum bench_api {
	BAPI_OPENAI_CHAT,
	BAPI_OPENAI_COMPLETIONS,
	BAPI_ANTHROPIC,
	BAPI_OLLAMA_CHAT,
	BAPI_OLLAMA_GENERATE,
	BAPI_OPENAI_RESPONSES,
	BAPI_GEMINI,	       /* /v1beta/models/MODEL:streamGenerateContent?alt=sse (SSE) or :generateContent */
	BAPI_GEMINI_ARRAY,     /* the same stream without ?alt=sse: one JSON array */
	BAPI_BEDROCK_CONVERSE, /* the model and the stream in the path (bench.c) */
	BAPI_BEDROCK_INVOKE,   /* an Anthropic Messages body */
	BAPI_REALTIME,	       /* WebSocket sessions on /v1/realtime (bench_realtime.c) */
};

struct bench_opts {
	char host[256];
	unsigned port;
	bool tls;		      /* https:// */
	bool tls_insecure;	      /* --insecure: the server's certificate is not checked */
	const char *tls_ca;	      /* --ca FILE; NULL: the system store */
	const char *tls_ciphersuites; /* --tls-ciphersuites: TLS 1.3 suites offered; NULL: OpenSSL's */
	void *tls_ctx;		      /* SSL_CTX * of the whole process (so that sessions outlive a sweep step) */
	char base_path[256];	      /* URL path prefix, no trailing slash; often "" */
	const char *url;
	enum bench_api api;
	const char *api_name;
	const char *path; /* base_path + the API's path */
	bool stream;
	const char *model; /* NULL: not sent */
	const char *headers[BENCH_MAX_HEADERS];
	unsigned nheaders;

	unsigned concurrency; /* closed loop; 0 in open loop */
	double rate;	      /* open loop requests/s; 0 in closed loop */
	enum arrivals arrivals;
	double burstiness;
	unsigned max_inflight; /* open loop: requests in flight at most */
	uint64_t duration_ms;  /* 0: none */
	uint64_t requests;     /* measured requests; 0: none */
	uint64_t warmup;
	uint64_t timeout_ms; /* no byte for this long fails a request */

	struct dist input_len, output_len;
	bool sim_headers, ignore_eos;
	bool continuous_usage; /* OpenAI streams: usage on every chunk (vLLM continuous_usage_stats) */
	bool kernel_ts;	       /* stamp reads with the kernel's receive time */
	bool new_conn;	       /* --new-connection: each request on a connection of its own (Connection: close) */

	const char *json_path, *requests_log_path, *svg_path, *compare_admin;
	int progress; /* 1 on, 0 off, -1 when stderr is a TTY */
	bool quiet;   /* no table */
	unsigned sweep[BENCH_MAX_SWEEP];
	unsigned nsweep;
	uint64_t seed;
	char run_id[40];
	struct replay *replay; /* --replay: arrivals, lengths and prompts from a trace; NULL: none */
	/* --sessions (bench_session.c): multi-turn conversations; 0: off */
	uint64_t sessions;
	unsigned turns, system_prompts;
	struct dist system_len;
	const char *session_header; /* its value names the session */
	/* --compare URL_A URL_B (bench_compare.c): this struct is A's;
	 * compare_b holds B's host, port, scheme and path */
	const char *compare_url[2];
	const struct bench_opts *compare_b;
	/* set by bench_compare for each of its two runs: */
	uint64_t start_ns; /* the run's clock starts here (both runs alike); 0: now */
	unsigned stagger;  /* 0: none; 1: odd requests go BENCH_STAGGER_NS late; 2: even ones */
	bool no_signals;   /* the run leaves SIGINT/SIGTERM alone (two loops cannot share them) */
};

/* ---- multi-turn sessions (bench_session.c) ---- */

/* What request seq is in a --sessions workload. in_len: the whole history's
 * prompt tokens (system prompt, user turns and answers so far, this turn);
 * out_len: this turn's answer, asked as max_tokens. */
struct session_turn {
	uint64_t session;
	unsigned turn, system;
	uint32_t in_len, out_len;
};
void session_turn_of(const struct bench_opts *o, uint64_t seq, struct session_turn *st);
/* Appends the body's prompt member(s) for st: "messages":[...] (with
 * "system" apart for Anthropic, "input" for Responses) or "prompt":"..." */
void session_body_add(struct evbuffer *b, const struct bench_opts *o, const struct session_turn *st);

/* ---- measurement (bench_run.c) ---- */

/* (ENUM, name): why a request failed. */
#define BENCH_ERRORS(X) \
	X(CONNECT, "connect_failed") \
	X(TIMEOUT, "timeout") \
	X(CLOSED, "connection_closed") \
	X(PROTOCOL, "protocol") \
	X(HTTP_4XX, "http_4xx") \
	X(HTTP_5XX, "http_5xx") \
	X(HTTP_OTHER, "http_other") \
	X(RESPONSE_FAILED, "response_failed")

enum bench_error {
	BERR_NONE = -1,
#define X(e, n) BERR_##e,
	BENCH_ERRORS(X)
#undef X
		BERR__COUNT
};

const char *bench_error_name(enum bench_error e);

/* The client-side metrics, each a histogram in microseconds. answer_ttft
 * (to the first token that is not reasoning) is recorded only for streams
 * that reasoned first: elsewhere it is the ttft. */
#define BENCH_METRICS(X) \
	X(TTFT, ttft) \
	X(ITL, itl) \
	X(TPOT, tpot) \
	X(E2E, e2e) \
	X(ANSWER_TTFT, answer_ttft)

enum bench_metric {
#define X(e, k) BM_##e,
	BENCH_METRICS(X)
#undef X
		BM__COUNT
};

const char *bench_metric_key(enum bench_metric m);

/* What a set of requests (the measured ones, or the warm-up) produced. */
struct bench_stats {
	uint64_t started;   /* first byte written, or a connect attempted */
	uint64_t ok;	    /* completed with a 2xx */
	uint64_t failed;    /* sum of errors[] */
	uint64_t cancelled; /* in flight when the run was interrupted */
	uint64_t errors[BERR__COUNT];
	uint64_t input_tokens;	    /* of ok requests: usage, else the prompt's length */
	uint64_t output_tokens;	    /* of ok requests: usage, else token events */
	uint64_t input_from_usage;  /* ok requests whose input count came from usage */
	uint64_t output_from_usage; /* ok requests whose output count came from usage */
	uint64_t first_send_ns;	    /* first byte of the first request */
	uint64_t last_end_ns;	    /* end of the last ok response */
	struct hist h[BM__COUNT];
};

struct bench_result {
	struct bench_stats m; /* measured */
	struct bench_stats w; /* warm-up */
	unsigned concurrency;
	double rate;
	double elapsed_s; /* measured window: first send .. last end */
	double wall_s;	  /* whole run, warm-up and drain included */
	bool interrupted; /* SIGINT/SIGTERM */
	bool fatal;	  /* stopped early: the server could not be reached */
	char fatal_msg[640];
	uint64_t connections;		/* TCP connections opened */
	uint64_t delayed;		/* open loop: arrivals that waited for --max-inflight */
	uint64_t max_lag_us;		/* open loop: worst wait of an arrival */
	uint64_t reads, kernel_stamped; /* socket reads; those stamped by the kernel */
	uint64_t max_timer_late_us;	/* open loop: worst lateness of the arrival timer */
	uint64_t tls_handshakes;	/* TLS: handshakes completed */
	uint64_t tls_resumed;		/* TLS: of those, sessions resumed (no full handshake) */
	char tls_protocol[24];		/* TLS: as negotiated on the last handshake, e.g. TLSv1.3 */
	char tls_cipher[64];		/* e.g. TLS_AES_128_GCM_SHA256 */
};

/* Runs one load phase: closed loop with `concurrency` > 0, else open loop at
 * o->rate. Request n of the phase is sent as x-request-id
 * bench-<run>-<id_base + n>, so ids stay unique across sweep steps; its
 * lengths depend on n alone. `reqlog` (may be NULL) gets one JSON line per
 * finished request. SIGINT/SIGTERM end the phase early (res->interrupted).
 * Returns 0, or -1 when the loop could not be set up (message printed). */
int bench_run(const struct bench_opts *o, unsigned concurrency, uint64_t id_base, FILE *reqlog,
	      struct bench_result *res);

/* --api realtime (bench_realtime.c): `concurrency` sessions, closed loop;
 * bench_run() hands over to it. 0, or -1 (message printed). */
int bench_realtime_run(const struct bench_opts *o, unsigned concurrency, uint64_t id_base, struct bench_result *res);

/* ---- TLS (bench_tls.c) ---- */

struct bufferevent;
struct event_base;
/* The process's client context into o->tls_ctx. 0, or -1 with a sentence. */
int bench_tls_setup(struct bench_opts *o, char *err, size_t errlen);
void bench_tls_free(struct bench_opts *o);
/* A connecting TLS bufferevent (fd -1: bufferevent_socket_connect follows)
 * offering the newest session; NULL when out of memory. */
struct bufferevent *bench_tls_bev(struct event_base *base, const struct bench_opts *o);
/* Counts a completed handshake and what it negotiated into res. */
void bench_tls_connected(struct bufferevent *bev, struct bench_result *res);
/* Why the TLS layer of bev failed ("" when it did not). */
const char *bench_tls_error(struct bufferevent *bev, char *buf, size_t len);

/* ---- reports (bench_report.c) ---- */

void report_table(FILE *f, const struct bench_opts *o, const struct bench_result *r);
/* The result as a JSON object (jansson json_t *, returned as void * so that
 * this header does not need jansson). */
void *report_result_json(const struct bench_opts *o, const struct bench_result *r);
void *report_config_json(const struct bench_opts *o);
/* Writes `root` (a json_t *, consumed) to path; 0 or -1 with a message. */
int report_write_json(const char *path, void *root);
/* One line of the progress display. */
void report_progress(FILE *f, bool tty, const struct bench_result *r, double t_s, unsigned inflight);
/* Percentile `q` of a histogram in ms; NaN when empty. */
double report_quantile_ms(const struct hist *h, double q);

/* ---- sweep (bench_sweep.c) ---- */

int sweep_write(const struct bench_opts *o, const struct bench_result *steps, unsigned n);
void sweep_table(FILE *f, const struct bench_opts *o, const struct bench_result *steps, unsigned n);

/* ---- --compare URL_A URL_B (bench_compare.c) ---- */

/* Within a pair, the second request leaves this much after the first. */
#define BENCH_STAGGER_NS 20000u

/* Runs the trace against both targets at once and prints the paired
 * differences to `f` (and into --json). 0, or -1 with a message. */
int bench_compare(FILE *f, const struct bench_opts *o);

/* ---- --compare-admin (bench_admin.c) ---- */

/* Prints client vs tokentap percentiles to `f`; adds them to `json_root` (a
 * json_t * object, may be NULL) as "compare_admin". 0, or -1 with a message. */
int admin_compare(FILE *f, const struct bench_opts *o, const struct bench_result *r, void *json_root);
