/*
 * bench_run.c — one load phase on a libevent loop: connections, requests,
 * and the timestamps the metrics come from.
 *
 *   closed loop:  N connections, each sends its next request the moment the
 *                 previous response ends (keep-alive; a closed connection is
 *                 replaced by a new one; with --new-connection every request
 *                 is sent with Connection: close and gets a new one).
 *   open loop:    an arrival timer fires at poisson/gamma times; each arrival
 *                 takes an idle keep-alive connection from the pool, or opens
 *                 one, up to --max-inflight; arrivals beyond that wait in a
 *                 bounded FIFO and their wait is reported (never hidden).
 *
 * Timestamps (CLOCK_MONOTONIC): a request's `arrive` is taken just before its
 * first byte is written, which is done here with a direct write on the
 * socket rather than on the next loop turn. Response bytes are stamped in
 * the read callback before any parsing, and all events framed out of one
 * read share that stamp. The stamp is, by default, the kernel's receive time
 * of the newest segment read (SO_TIMESTAMPNS, mapped from CLOCK_REALTIME onto
 * CLOCK_MONOTONIC by src/record/rxstamp.c, as tokentap does for `arrive`): on a
 * loaded machine that leaves this process's own wake-up latency out of ttft
 * and itl. With --timestamps read it is the clock
 * read at the top of the callback. Sockets have TCP_NODELAY.
 *
 * Why reads do not go through the bufferevent: a kernel timestamp arrives
 * only as ancillary data of recvmsg(), which bufferevents never call. So a
 * bufferevent connects and writes (its write timeout and error reporting
 * included), and a plain read event on the same socket calls recvmsg() and
 * feeds llhttp straight from the received bytes.
 *
 * Over TLS (https://, bench_tls.c) the bytes must be decrypted first, so an
 * OpenSSL bufferevent does everything: its read callback stamps the clock at
 * its top and feeds llhttp what it decrypted; its read timeout is the request
 * timeout; the connect counts as done when the handshake is. The stamp is
 * then the read callback's clock (kernel stamps name TCP segments, not the
 * records decrypted from them).
 *
 * Invariants: a connection (struct conn, owned by the run's list) carries at
 * most one request; it is never freed inside its own callback — conn_close()
 * frees the bufferevent (libevent defers that safely) and moves the struct to
 * a list that a zero-delay event frees after the callback. Every request
 * issued is counted exactly once as ok, failed (by kind) or cancelled.
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <jansson.h>
#include <llhttp.h>

#include "framer.h"
#include "rxstamp.h"

#define PENDING_MAX 65536    /* open loop: arrivals waiting for a slot */
#define CONNECT_FAIL_MAX 100 /* consecutive connect failures end the run */
#define READ_BUF 65536

static const char *const error_names[] = {
#define X(e, n) n,
	BENCH_ERRORS(X)
#undef X
};

static const char *const metric_keys[] = {
#define X(e, k) #k,
	BENCH_METRICS(X)
#undef X
};

const char *bench_error_name(enum bench_error e)
{
	return e >= 0 && e < BERR__COUNT ? error_names[e] : "none";
}

const char *bench_metric_key(enum bench_metric m)
{
	return metric_keys[m];
}

enum conn_state {
	CS_CONNECTING, /* TCP connect in progress; a request may wait in it */
	CS_IDLE,       /* connected, no request (open loop pool) */
	CS_BUSY,       /* a request is on the wire */
	CS_CLOSED,     /* waiting to be freed */
};

/* One request on a connection; embedded in its conn. */
struct breq {
	bool active;
	bool warmup;
	bool sent;
	uint64_t seq;
	uint32_t in_len, out_len;
	struct session_turn turn; /* --sessions: which session and turn */
	struct req_record rec;	  /* tokentap's timeline; at[TL_ARRIVE] = first byte written */
	struct framer fr;
	bool framed; /* fr is initialised */
	bool whole;  /* the body is kept and read whole (not streamed, or not framed) */
	bool done;   /* llhttp: message complete */
	bool keep_alive;
	int status;
	uint64_t now; /* stamp of the read being parsed */
	char field[32];
	size_t field_len;
	bool in_ctype; /* the header value being read is Content-Type */
	char ctype[128];
	size_t ctype_len;
	struct evbuffer *body;
	bool body_over;
};

struct run;

/* A client connection. Owned by run->conns until closed, then by
 * run->closing until the reaper frees it. */
struct conn {
	struct run *run;
	struct bufferevent *bev; /* connect and write */
	struct event *rev;	 /* read, with recvmsg(); freed by the reaper */
	llhttp_t parser;
	enum conn_state state;
	bool connected_once;
	struct conn *prev, *next; /* run->conns */
	struct conn *link;	  /* run->idle or run->closing */
	struct breq req;
};

struct run {
	const struct bench_opts *o;
	struct bench_result *res;
	struct event_base *base;
	enum api_kind api;
	unsigned concurrency; /* closed loop; 0 for open loop */
	uint64_t id_base;
	FILE *reqlog;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	char *model_json; /* the model as a JSON string, or NULL */
	struct evbuffer *scratch_body, *scratch_req;
	char *rbuf;		/* READ_BUF bytes: every read lands here, then goes to llhttp */
	struct rxclock rxclock; /* kernel receive stamps onto CLOCK_MONOTONIC */

	uint64_t next_seq;
	uint64_t limit; /* warmup + requests; 0: unbounded */
	uint64_t t_start, deadline_ns;
	bool measuring, stopping, finished;
	bool arrivals_done; /* open loop: no arrival is due any more */
	bool connected_any; /* some connection of this run was established */
	unsigned inflight, nconns;
	unsigned connect_fail_streak;

	struct conn *conns, *idle, *closing;
	struct event *reaper, *deadline_ev, *arrival_ev, *progress_ev, *sigint_ev, *sigterm_ev;
	struct rng arrival_rng;
	uint64_t next_arrival_ns;
	uint64_t narrivals;   /* arrivals made: with --replay, the trace's next one */
	uint64_t arrival_now; /* clock of the arrival call running now; 0 outside it */
	uint64_t *pending;    /* ring of arrival times waiting for a slot */
	size_t pend_head, pend_n;
	bool progress_tty;
	bool progress_drawn;
};

static void conn_issue(struct conn *c);
static void run_check_done(struct run *r);
static void open_loop_dispatch(struct run *r);

static const llhttp_settings_t *parser_settings(void);

static enum api_kind api_kind_of(enum bench_api a)
{
	switch (a) {
	case BAPI_OPENAI_CHAT: return API_OPENAI_CHAT;
	case BAPI_OPENAI_COMPLETIONS: return API_OPENAI_COMPLETIONS;
	case BAPI_ANTHROPIC: return API_ANTHROPIC;
	case BAPI_OLLAMA_CHAT: return API_OLLAMA_CHAT;
	case BAPI_OLLAMA_GENERATE: return API_OLLAMA_GENERATE;
	case BAPI_OPENAI_RESPONSES: return API_OPENAI_RESPONSES;
	case BAPI_GEMINI:
	case BAPI_GEMINI_ARRAY: return API_GEMINI_STREAM; /* the same events and body as API_GEMINI */
	case BAPI_BEDROCK_CONVERSE: return API_BEDROCK_CONVERSE;
	case BAPI_BEDROCK_INVOKE: return API_BEDROCK_INVOKE;
	case BAPI_REALTIME: break; /* bench_realtime.c, no HTTP request */
	}
	return API_UNKNOWN;
}

static struct bench_stats *stats_of(struct run *r, const struct breq *q)
{
	return q->warmup ? &r->res->w : &r->res->m;
}

static uint64_t ms_to_us_round(double ms)
{
	return (uint64_t)llround(ms * 1000.0);
}

/* ---- connections ---- */

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
	struct run *r = arg;
	while (r->closing) {
		struct conn *c = r->closing;
		r->closing = c->link;
		if (c->rev)
			event_free(c->rev);
		free(c);
	}
}

static void idle_remove(struct run *r, struct conn *c)
{
	for (struct conn **p = &r->idle; *p; p = &(*p)->link) {
		if (*p == c) {
			*p = c->link;
			c->link = NULL;
			return;
		}
	}
}

/* Closes the connection (its request must have been finished). Safe inside
 * the connection's own callbacks; safe to call twice. */
static void conn_close(struct conn *c)
{
	struct run *r = c->run;

	if (c->state == CS_CLOSED)
		return;
	if (c->state == CS_IDLE)
		idle_remove(r, c);
	if (c->prev)
		c->prev->next = c->next;
	else
		r->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	if (c->rev)
		event_del(c->rev); /* freed by the reaper: we may be inside its callback */
	if (c->bev)
		bufferevent_free(c->bev); /* closes the socket */
	c->bev = NULL;
	c->state = CS_CLOSED;
	r->nconns--;
	c->link = r->closing;
	r->closing = c;
	event_active(r->reaper, EV_TIMEOUT, 1);
}

static void req_reset(struct breq *q)
{
	record_release(&q->rec);
	framer_free(&q->fr);
	if (q->body)
		evbuffer_free(q->body);
	memset(q, 0, sizeof(*q));
}

static void reqlog_write(struct run *r, const struct breq *q, enum bench_error err, const double *m, int64_t in,
			 int64_t out)
{
	FILE *f = r->reqlog;
	if (!f)
		return;
	fprintf(f, "{\"id\":\"%s\",\"seq\":%llu,\"warmup\":%s,\"ok\":%s,\"status\":%d,\"error\":", q->rec.id,
		(unsigned long long)(r->id_base + q->seq), q->warmup ? "true" : "false",
		err == BERR_NONE ? "true" : "false", q->status);
	if (err == BERR_NONE)
		fputs("null", f);
	else
		fprintf(f, "\"%s\"", bench_error_name(err));
	fprintf(f, ",\"concurrency\":%u,\"input_len\":%u,\"output_len\":%u", r->concurrency, q->in_len, q->out_len);
	if (r->o->sessions)
		fprintf(f, ",\"session\":%llu,\"turn\":%u,\"system_prompt\":%u", (unsigned long long)q->turn.session,
			q->turn.turn, q->turn.system);
	if (in >= 0)
		fprintf(f, ",\"input_tokens\":%lld", (long long)in);
	else
		fputs(",\"input_tokens\":null", f);
	if (out >= 0)
		fprintf(f, ",\"output_tokens\":%lld", (long long)out);
	else
		fputs(",\"output_tokens\":null", f);
	/* the server's prefix-cache hits, when its usage says (a routing
	 * benchmark's hit ratio, warm-up left out) */
	if (err == BERR_NONE && q->rec.usage.cached_tokens >= 0)
		fprintf(f, ",\"cached_tokens\":%lld", (long long)q->rec.usage.cached_tokens);
	else
		fputs(",\"cached_tokens\":null", f);
	fprintf(f, ",\"token_events\":%llu,\"start_ms\":%.3f", (unsigned long long)q->rec.token_events,
		q->rec.at[TL_ARRIVE] ? (double)(q->rec.at[TL_ARRIVE] - r->t_start) / 1e6 : 0.0);
	static const enum req_metric keys[] = { RM_TTFB, RM_TTFT, RM_TPOT, RM_E2E };
	static const char *const names[] = { "ttfb_ms", "ttft_ms", "tpot_ms", "e2e_ms" };
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (m && !isnan(m[keys[i]]))
			fprintf(f, ",\"%s\":%.3f", names[i], m[keys[i]]);
		else
			fprintf(f, ",\"%s\":null", names[i]);
	}
	fputs(",\"itl_ms\":[", f);
	for (size_t i = 0; i < q->rec.itl_n; i++)
		fprintf(f, i ? ",%.3f" : "%.3f", round((double)q->rec.itl_ns[i] / 1e3) / 1e3);
	fprintf(f, "],\"itl_count\":%llu}\n", (unsigned long long)q->rec.itl_total);
}

/* Accounts for the connection's request: ok (err BERR_NONE and a 2xx) or
 * failed by kind. The connection is left as it is. */
static void req_finish(struct conn *c, enum bench_error err, uint64_t now)
{
	struct run *r = c->run;
	struct breq *q = &c->req;
	struct bench_stats *st;
	double m[RM__COUNT];
	int64_t in = -1, out = -1;

	if (!q->active)
		return;
	st = stats_of(r, q);
	if (err == BERR_NONE && (q->status < 200 || q->status > 299))
		err = q->status >= 500 ? BERR_HTTP_5XX : q->status >= 400 ? BERR_HTTP_4XX : BERR_HTTP_OTHER;
	if (err == BERR_NONE && q->body_over)
		err = BERR_PROTOCOL;
	if (err == BERR_NONE) {
		if (q->framed)
			framer_finish(&q->fr); /* a last event without its blank line */
		if (q->whole && q->body) {
			size_t len = evbuffer_get_length(q->body);
			const char *p = len ? (const char *)evbuffer_pullup(q->body, -1) : "";
			classify_body(r->api, p, len, &q->rec.usage);
		}
		/* A Responses API answer the server itself says failed. One it
		 * says is incomplete (cut at max_output_tokens, which every
		 * request here sets) is a result, as a chat "length" finish is. */
		if (q->rec.usage.outcome == OUTCOME_FAILED)
			err = BERR_RESPONSE_FAILED;
	}
	if (err == BERR_NONE) {
		q->rec.at[TL_RESP_END] = now;
		record_derive(&q->rec, m);
		in = q->rec.usage.input_tokens >= 0 ? q->rec.usage.input_tokens : (int64_t)q->in_len;
		if (q->rec.usage.output_tokens >= 0 || q->rec.token_events)
			out = record_output_tokens(&q->rec);
		st->ok++;
		st->input_tokens += (uint64_t)in;
		st->input_from_usage += q->rec.usage.input_tokens >= 0;
		if (out >= 0)
			st->output_tokens += (uint64_t)out;
		st->output_from_usage += q->rec.usage.output_tokens >= 0;
		st->last_end_ns = now;
		if (!isnan(m[RM_TTFT]))
			hist_record(&st->h[BM_TTFT], ms_to_us_round(m[RM_TTFT]));
		if (!isnan(m[RM_TPOT]))
			hist_record(&st->h[BM_TPOT], ms_to_us_round(m[RM_TPOT]));
		if (!isnan(m[RM_E2E]))
			hist_record(&st->h[BM_E2E], ms_to_us_round(m[RM_E2E]));
		if (q->rec.reasoning_events && !isnan(m[RM_ANSWER_TTFT]))
			hist_record(&st->h[BM_ANSWER_TTFT], ms_to_us_round(m[RM_ANSWER_TTFT]));
		reqlog_write(r, q, err, m, in, out);
	} else {
		st->failed++;
		st->errors[err]++;
		reqlog_write(r, q, err, NULL, -1, -1);
	}
	req_reset(q);
	r->inflight--;
}

/* The run is being torn down or interrupted: the request is neither ok nor
 * failed. */
static void req_cancel(struct conn *c)
{
	struct breq *q = &c->req;
	if (!q->active)
		return;
	stats_of(c->run, q)->cancelled++;
	req_reset(q);
	c->run->inflight--;
}

static void on_readable(evutil_socket_t fd, short what, void *arg);
static void on_tls_read(struct bufferevent *bev, void *arg);
static void on_event(struct bufferevent *bev, short what, void *arg);

/* (Re)arms the read event: with the request timeout while a request runs,
 * without one while idle. */
static void conn_arm_read(struct conn *c, bool busy)
{
	const struct bench_opts *o = c->run->o;
	struct timeval tv = { (time_t)(o->timeout_ms / 1000), (suseconds_t)(o->timeout_ms % 1000) * 1000 };
	if (c->rev)
		event_add(c->rev, busy ? &tv : NULL);
	else if (o->tls && c->bev)
		bufferevent_set_timeouts(c->bev, busy ? &tv : NULL, &tv);
}

static struct conn *conn_new(struct run *r)
{
	struct conn *c = calloc(1, sizeof(*c));
	int one = 1;

	if (!c)
		return NULL;
	c->run = r;
	c->bev = r->o->tls ? bench_tls_bev(r->base, r->o) : bufferevent_socket_new(r->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!c->bev) {
		free(c);
		return NULL;
	}
	bufferevent_setcb(c->bev, r->o->tls ? on_tls_read : NULL, NULL, on_event, c);
	c->state = CS_CONNECTING;
	c->next = r->conns;
	if (r->conns)
		r->conns->prev = c;
	r->conns = c;
	r->nconns++;
	r->res->connections++;
	struct timeval tv = { (time_t)(r->o->timeout_ms / 1000), (suseconds_t)(r->o->timeout_ms % 1000) * 1000 };
	bufferevent_set_timeouts(c->bev, &tv, &tv);
	if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&r->addr, (int)r->addrlen) == -1) {
		/* no socket at all (file descriptors exhausted): nothing was reported */
		int e = errno;
		conn_close(c);
		errno = e;
		return NULL;
	}
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	if (fd >= 0) {
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (r->o->kernel_ts)
			(void)rxstamp_enable(fd);
		if (!r->o->tls)
			c->rev = event_new(r->base, fd, EV_READ | EV_PERSIST, on_readable, c);
	}
	if (!c->rev && !r->o->tls) {
		conn_close(c);
		return NULL;
	}
	/* plain: reading is on_readable's; TLS: the bufferevent's */
	bufferevent_enable(c->bev, r->o->tls ? EV_READ | EV_WRITE : EV_WRITE);
	return c;
}

/* ---- requests ---- */

static bool has_header(const struct bench_opts *o, const char *name)
{
	size_t n = strlen(name);
	for (unsigned i = 0; i < o->nheaders; i++)
		if (!strncasecmp(o->headers[i], name, n) && o->headers[i][n] == ':')
			return true;
	return false;
}

/* Serialises request `q` into r->scratch_req. */
static void request_build(struct run *r, const struct breq *q)
{
	const struct bench_opts *o = r->o;
	struct evbuffer *b = r->scratch_body, *h = r->scratch_req;
	const char *stream = o->stream ? "true" : "false";

	evbuffer_drain(b, evbuffer_get_length(b));
	evbuffer_drain(h, evbuffer_get_length(h));
	bool bedrock = o->api == BAPI_BEDROCK_CONVERSE || o->api == BAPI_BEDROCK_INVOKE;

	evbuffer_add_printf(b, "{");
	bool gemini = o->api == BAPI_GEMINI || o->api == BAPI_GEMINI_ARRAY;
	if (r->model_json && !gemini && !bedrock) /* Gemini's and Bedrock's are in the path */
		evbuffer_add_printf(b, "\"model\":%s,", r->model_json);
	if (o->sessions) {
		session_body_add(b, o, &q->turn);
		goto prompt_done;
	}
	switch (o->api) {
	case BAPI_OPENAI_CHAT:
	case BAPI_ANTHROPIC:
	case BAPI_OLLAMA_CHAT: evbuffer_add_printf(b, "\"messages\":[{\"role\":\"user\",\"content\":\""); break;
	case BAPI_OPENAI_RESPONSES: evbuffer_add_printf(b, "\"input\":[{\"role\":\"user\",\"content\":\""); break;
	case BAPI_OPENAI_COMPLETIONS:
	case BAPI_OLLAMA_GENERATE: evbuffer_add_printf(b, "\"prompt\":\""); break;
	case BAPI_GEMINI:
	case BAPI_GEMINI_ARRAY:
		evbuffer_add_printf(b, "\"contents\":[{\"role\":\"user\",\"parts\":[{\"text\":\"");
		break;
	case BAPI_BEDROCK_CONVERSE:
		evbuffer_add_printf(b, "\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"");
		break;
	case BAPI_BEDROCK_INVOKE:
		evbuffer_add_printf(b,
				    "\"anthropic_version\":\"bedrock-2023-05-31\",\"messages\":[{\"role\":"
				    "\"user\",\"content\":\"");
		break;
	case BAPI_REALTIME: break; /* never an HTTP request */
	}
	if (o->replay && q->seq < o->replay->n)
		replay_prompt_add(b, o->replay, q->seq, o->seed);
	else
		prompt_text_add(b, q->in_len, o->seed, q->seq);
	if (o->api == BAPI_BEDROCK_CONVERSE)
		evbuffer_add_printf(b, "\"}]}]");
	else if (o->api == BAPI_OPENAI_CHAT || o->api == BAPI_ANTHROPIC || o->api == BAPI_OLLAMA_CHAT ||
		 o->api == BAPI_OPENAI_RESPONSES || o->api == BAPI_BEDROCK_INVOKE)
		evbuffer_add_printf(b, "\"}]");
	else if (gemini)
		evbuffer_add_printf(b, "\"}]}]");
	else
		evbuffer_add_printf(b, "\"");
prompt_done:
	switch (o->api) {
	case BAPI_OPENAI_CHAT:
	case BAPI_OPENAI_COMPLETIONS:
		evbuffer_add_printf(b, ",\"max_tokens\":%u,\"stream\":%s", q->out_len, stream);
		if (o->stream)
			evbuffer_add_printf(b, ",\"stream_options\":{\"include_usage\":true%s}",
					    o->continuous_usage ? ",\"continuous_usage_stats\":true" : "");
		if (o->ignore_eos)
			evbuffer_add_printf(b, ",\"ignore_eos\":true");
		break;
	case BAPI_ANTHROPIC: evbuffer_add_printf(b, ",\"max_tokens\":%u,\"stream\":%s", q->out_len, stream); break;
	case BAPI_OPENAI_RESPONSES:
		/* Usage always comes in response.completed: no stream_options. */
		evbuffer_add_printf(b, ",\"max_output_tokens\":%u,\"stream\":%s", q->out_len, stream);
		break;
	case BAPI_OLLAMA_CHAT:
	case BAPI_OLLAMA_GENERATE:
		evbuffer_add_printf(b, ",\"stream\":%s,\"options\":{\"num_predict\":%u}", stream, q->out_len);
		break;
	case BAPI_GEMINI:
	case BAPI_GEMINI_ARRAY: /* the method streams, not a field */
		evbuffer_add_printf(b, ",\"generationConfig\":{\"maxOutputTokens\":%u}", q->out_len);
		break;
	case BAPI_BEDROCK_CONVERSE: /* the path says whether it streams */
		evbuffer_add_printf(b, ",\"inferenceConfig\":{\"maxTokens\":%u}", q->out_len);
		break;
	case BAPI_BEDROCK_INVOKE: evbuffer_add_printf(b, ",\"max_tokens\":%u", q->out_len); break;
	case BAPI_REALTIME: break;
	}
	evbuffer_add_printf(b, "}");

	evbuffer_add_printf(h,
			    "POST %s HTTP/1.1\r\nHost: %s:%u\r\nUser-Agent: " BENCH_NAME
			    "\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nx-request-id: %s\r\n",
			    o->path, o->host, o->port, evbuffer_get_length(b), q->rec.id);
	if (o->stream)
		evbuffer_add_printf(h, "Accept: %s\r\n",
				    o->api == BAPI_OLLAMA_CHAT || o->api == BAPI_OLLAMA_GENERATE
					    ? "application/x-ndjson"
				    : o->api == BAPI_GEMINI_ARRAY ? "application/json"
				    : bedrock			  ? "application/vnd.amazon.eventstream"
								  : "text/event-stream");
	if (o->api == BAPI_ANTHROPIC && !has_header(o, "anthropic-version"))
		evbuffer_add_printf(h, "anthropic-version: 2023-06-01\r\n");
	if (o->sim_headers)
		evbuffer_add_printf(h, "x-sim-tokens: %u\r\n", q->out_len);
	if (o->new_conn)
		evbuffer_add_printf(h, "Connection: close\r\n");
	if (o->sessions)
		evbuffer_add_printf(h, "%s: sess-%llu-%llu\r\n", o->session_header, (unsigned long long)o->seed,
				    (unsigned long long)q->turn.session);
	for (unsigned i = 0; i < o->nheaders; i++)
		evbuffer_add_printf(h, "%s\r\n", o->headers[i]);
	evbuffer_add(h, "\r\n", 2);
	evbuffer_add_buffer(h, b);
}

/* Writes the request: stamps `arrive`, writes what the socket takes at once,
 * and leaves any rest to the bufferevent. */
static void req_send(struct conn *c)
{
	struct run *r = c->run;
	struct breq *q = &c->req;
	struct evbuffer *out = bufferevent_get_output(c->bev);
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	struct bench_stats *st = stats_of(r, q);

	request_build(r, q);
	llhttp_init(&c->parser, HTTP_RESPONSE, parser_settings());
	c->parser.data = c;
	q->sent = true;
	c->state = CS_BUSY;
	q->rec.at[TL_ARRIVE] = clock_now_ns();
	if (!st->first_send_ns)
		st->first_send_ns = q->rec.at[TL_ARRIVE];
	if (fd >= 0 && !r->o->tls && evbuffer_get_length(out) == 0)
		(void)evbuffer_write(r->scratch_req, fd);
	if (evbuffer_get_length(r->scratch_req))
		bufferevent_write_buffer(c->bev, r->scratch_req);
	q->rec.at[TL_REQ_SENT] = evbuffer_get_length(out) ? 0 : clock_now_ns();
}

static bool run_may_issue(struct run *r)
{
	if (r->stopping)
		return false;
	if (r->limit && r->next_seq >= r->limit)
		return false;
	if (r->deadline_ns && clock_now_ns() >= r->deadline_ns)
		return false;
	return true;
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct run *r = arg;
	r->stopping = true;
	if (r->arrival_ev)
		event_del(r->arrival_ev);
	r->pend_n = 0; /* arrivals never sent are not requests */
	run_check_done(r);
}

/* Assigns the next request number to the connection and sends it (or
 * leaves it waiting for the connect). */
static void conn_issue(struct conn *c)
{
	struct run *r = c->run;
	struct breq *q = &c->req;
	const struct bench_opts *o = r->o;
	uint64_t seq = r->next_seq++;

	memset(q, 0, sizeof(*q));
	q->active = true;
	q->seq = seq;
	q->warmup = seq < o->warmup;
	q->rec.usage = USAGE_UNKNOWN;
	q->rec.itl_keep = r->reqlog != NULL; /* the request log lists the gaps */
	if (o->replay && seq < o->replay->n) {
		q->in_len = o->replay->e[seq].in_len;
		q->out_len = o->replay->e[seq].out_len;
	} else if (o->sessions) {
		session_turn_of(o, seq, &q->turn);
		q->in_len = q->turn.in_len;
		q->out_len = q->turn.out_len;
	} else {
		q->in_len = dist_draw(&o->input_len, o->seed ^ 0x1f2e3d4cu, seq, 1);
		q->out_len = dist_draw(&o->output_len, o->seed ^ 0x5a6b7c8du, seq, 1);
	}
	snprintf(q->rec.id, sizeof(q->rec.id), "bench-%s-%llu", o->run_id, (unsigned long long)(r->id_base + seq));
	r->inflight++;
	stats_of(r, q)->started++;
	if (!q->warmup && !r->measuring) {
		r->measuring = true;
		if (o->duration_ms) {
			struct timeval tv = { (time_t)(o->duration_ms / 1000),
					      (suseconds_t)(o->duration_ms % 1000) * 1000 };
			r->deadline_ns = clock_now_ns() + o->duration_ms * 1000000ull;
			event_add(r->deadline_ev, &tv);
		}
	}
	if (c->state == CS_IDLE || c->state == CS_BUSY) {
		conn_arm_read(c, true);
		req_send(c);
	}
}

static void run_fatal_socket(struct run *r)
{
	snprintf(r->res->fatal_msg, sizeof(r->res->fatal_msg), "cannot open a connection: %s (raise ulimit -n?)",
		 strerror(errno));
	r->res->fatal = true;
	r->stopping = true;
}

/* Closed loop: a worker slot needs a connection carrying its next request. */
static void closed_loop_refill(struct run *r)
{
	while (r->concurrency && r->nconns < r->concurrency && run_may_issue(r)) {
		struct conn *c = conn_new(r);
		if (!c) {
			run_fatal_socket(r);
			break;
		}
		conn_issue(c);
	}
}

/* What a connection does once its request has been accounted for. */
static void conn_after_request(struct conn *c, bool reusable)
{
	struct run *r = c->run;

	if (!reusable) {
		conn_close(c);
	} else if (r->concurrency) {
		if (run_may_issue(r))
			conn_issue(c);
		else
			conn_close(c);
	} else {
		c->state = CS_IDLE;
		conn_arm_read(c, false);
		c->link = r->idle;
		r->idle = c;
	}
	if (r->concurrency)
		closed_loop_refill(r);
	else
		open_loop_dispatch(r);
	run_check_done(r);
}

/* ---- parsing the response ---- */

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct breq *q = &((struct conn *)p->data)->req;
	if (q->field_len + len < sizeof(q->field)) {
		memcpy(q->field + q->field_len, at, len);
		q->field_len += len;
	} else {
		q->field_len = sizeof(q->field); /* too long to be Content-Type */
	}
	return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
	struct breq *q = &((struct conn *)p->data)->req;
	q->in_ctype = q->field_len == 12 && !strncasecmp(q->field, "content-type", 12);
	q->field_len = 0;
	if (q->in_ctype)
		q->ctype_len = 0;
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct breq *q = &((struct conn *)p->data)->req;
	if (q->in_ctype) {
		size_t room = sizeof(q->ctype) - 1 - q->ctype_len;
		len = len < room ? len : room;
		memcpy(q->ctype + q->ctype_len, at, len);
		q->ctype_len += len;
	}
	return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
	((struct conn *)p->data)->req.in_ctype = false;
	return 0;
}

static void on_framed_event(void *arg, const struct framer_event *ev)
{
	struct conn *c = arg;
	struct breq *q = &c->req;
	uint64_t gap;

	q->rec.events++;
	timeline_mark(&q->rec, TL_FIRST_EVENT, q->now);
	enum token_kind kind = classify_event(c->run->api, ev, &q->rec.usage, &q->rec.hint);
	if (kind != TOKEN_NONE && record_token_event(&q->rec, kind, q->now, &gap))
		hist_record(&stats_of(c->run, q)->h[BM_ITL], gap / 1000); /* as tokentap: truncated µs */
}

static int on_headers_complete(llhttp_t *p)
{
	struct conn *c = p->data;
	struct breq *q = &c->req;

	q->status = p->status_code;
	if (q->status >= 100 && q->status < 200)
		return 0; /* an interim answer; the real one follows */
	timeline_mark(&q->rec, TL_RESP_HEADERS, q->now);
	if (q->status >= 200 && q->status <= 299) {
		enum framer_kind k =
			c->run->o->stream ? framer_kind_for_content_type(q->ctype, q->ctype_len) : FRAMER_NONE;
		if (k == FRAMER_NONE && c->run->o->stream && classify_streams_json_array(c->run->api))
			k = FRAMER_JSON_ARRAY; /* Gemini without ?alt=sse, as tokentap frames it */
		if (k != FRAMER_NONE) {
			framer_init(&q->fr, k, 0, on_framed_event, c);
			q->framed = true;
		} else {
			q->whole = true;
			q->body = evbuffer_new();
		}
	}
	return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct breq *q = &((struct conn *)p->data)->req;
	q->rec.bytes_in += len;
	if (q->framed) {
		framer_feed(&q->fr, at, len);
	} else if (q->body && !q->body_over) {
		if (evbuffer_get_length(q->body) + len > BENCH_MAX_BODY)
			q->body_over = true;
		else
			evbuffer_add(q->body, at, len);
	}
	return 0;
}

static int on_message_complete(llhttp_t *p)
{
	struct conn *c = p->data;
	struct breq *q = &c->req;
	if (q->status >= 100 && q->status < 200)
		return 0;
	q->done = true;
	q->keep_alive = llhttp_should_keep_alive(p);
	return HPE_PAUSED; /* nothing after this response belongs to it */
}

static const llhttp_settings_t *parser_settings(void)
{
	static llhttp_settings_t s;
	static bool ready;
	if (!ready) {
		llhttp_settings_init(&s);
		s.on_header_field = on_header_field;
		s.on_header_field_complete = on_header_field_complete;
		s.on_header_value = on_header_value;
		s.on_header_value_complete = on_header_value_complete;
		s.on_headers_complete = on_headers_complete;
		s.on_body = on_body;
		s.on_message_complete = on_message_complete;
		ready = true;
	}
	return &s;
}

/* Feeds received bytes to llhttp. Returns true when the connection's
 * request was finished (and the connection dealt with). */
static bool conn_parse(struct conn *c, const char *buf, size_t len, uint64_t stamp)
{
	struct breq *q = &c->req;

	if (c->state != CS_BUSY || !q->active) {
		/* bytes nobody asked for: the connection cannot be trusted */
		conn_after_request(c, false);
		return true;
	}
	q->now = stamp;
	if (!q->rec.at[TL_REQ_SENT])
		q->rec.at[TL_REQ_SENT] = stamp;
	enum llhttp_errno e = llhttp_execute(&c->parser, buf, len);
	if (e != HPE_OK && e != HPE_PAUSED) {
		req_finish(c, BERR_PROTOCOL, stamp);
		conn_after_request(c, false);
		return true;
	}
	if (q->done) { /* paused there: anything after the response is dropped */
		bool keep = q->keep_alive && !c->run->o->new_conn && e == HPE_PAUSED &&
			    llhttp_get_error_pos(&c->parser) == buf + len;
		req_finish(c, BERR_NONE, stamp);
		conn_after_request(c, keep);
		return true;
	}
	return false;
}

/* The server closed the connection (`eof`) or reading it failed: a body
 * delimited by the close ends here (after an orderly close only); any
 * other request in flight failed. */
static void conn_end_at_close(struct conn *c, bool eof, uint64_t now)
{
	struct breq *q = &c->req;
	enum bench_error err = BERR_CLOSED;

	if (eof && q->active && q->sent) {
		q->now = now;
		if (llhttp_finish(&c->parser) == HPE_OK && q->done)
			err = BERR_NONE;
	}
	if (q->active)
		req_finish(c, err, now);
	conn_after_request(c, false);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	uint64_t now = clock_now_ns(); /* first: the bytes arrived just now */
	struct conn *c = arg;
	struct run *r = c->run;
	struct breq *q = &c->req;
	union rxstamp_ctl ctl;
	struct iovec iov = { r->rbuf, READ_BUF };
	struct msghdr msg = { 0 };
	ssize_t n;

	if (what & EV_TIMEOUT) {
		if (q->active)
			req_finish(c, BERR_TIMEOUT, now);
		conn_after_request(c, false);
		return;
	}
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	rxstamp_prepare(&msg, &ctl);
	n = recvmsg(fd, &msg, MSG_DONTWAIT);
	if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n > 0) {
		uint64_t stamp = r->o->kernel_ts ? rxstamp_of(&r->rxclock, &msg, now) : now;
		r->res->reads++;
		r->res->kernel_stamped += stamp != now;
		conn_parse(c, r->rbuf, (size_t)n, stamp);
		return;
	}
	conn_end_at_close(c, n == 0, now);
}

/* TLS: what the bufferevent decrypted, all stamped with this call's clock. */
static void on_tls_read(struct bufferevent *bev, void *arg)
{
	uint64_t now = clock_now_ns(); /* first: the bytes arrived just now */
	struct conn *c = arg;
	struct run *r = c->run;
	int n;

	r->res->reads++;
	/* a finished request may close the connection (c->bev then NULL) */
	while (c->state != CS_CLOSED && c->bev &&
	       (n = evbuffer_remove(bufferevent_get_input(c->bev), r->rbuf, READ_BUF)) > 0)
		conn_parse(c, r->rbuf, (size_t)n, now);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	uint64_t now = clock_now_ns();
	struct conn *c = arg;
	struct run *r = c->run;
	struct breq *q = &c->req;

	if (what & BEV_EVENT_CONNECTED) {
		if (r->o->tls)
			bench_tls_connected(bev, r->res);
		c->connected_once = true;
		r->connected_any = true;
		r->connect_fail_streak = 0;
		if (q->active && !q->sent) {
			conn_arm_read(c, true);
			req_send(c);
		} else {
			c->state = CS_IDLE;
			conn_arm_read(c, false);
			c->link = r->idle;
			r->idle = c;
			open_loop_dispatch(r);
		}
		return;
	}
	if (c->state == CS_CONNECTING && !c->connected_once) {
		int e = EVUTIL_SOCKET_ERROR();
		char tls_why[256] = "";
		const char *why = what & BEV_EVENT_TIMEOUT ? "timed out" : evutil_socket_error_to_string(e);
		if (r->o->tls && !(what & BEV_EVENT_TIMEOUT) && *bench_tls_error(bev, tls_why, sizeof(tls_why)))
			why = tls_why;
		else if (r->o->tls && !(what & BEV_EVENT_TIMEOUT) && !e)
			why = "TLS handshake failed";
		r->connect_fail_streak++;
		req_finish(c, what & BEV_EVENT_TIMEOUT ? BERR_TIMEOUT : BERR_CONNECT, now);
		if (!r->connected_any || r->connect_fail_streak >= CONNECT_FAIL_MAX) {
			/* nothing reaches the server: no point hammering it */
			r->res->fatal = true;
			if (!r->connected_any)
				snprintf(r->res->fatal_msg, sizeof(r->res->fatal_msg), "cannot connect to %s:%u: %s",
					 r->o->host, r->o->port, why);
			else
				snprintf(r->res->fatal_msg, sizeof(r->res->fatal_msg),
					 "%u connections in a row to %s:%u failed (%s)", r->connect_fail_streak,
					 r->o->host, r->o->port, why);
			r->stopping = true;
		}
		conn_after_request(c, false);
		return;
	}
	if (r->o->tls && (what & BEV_EVENT_EOF) && !(what & BEV_EVENT_TIMEOUT)) {
		conn_end_at_close(c, true, now);
		return;
	}
	/* writing failed or timed out (and, over TLS, reading too); plain
	 * reading is on_readable's */
	if (q->active)
		req_finish(c, what & BEV_EVENT_TIMEOUT ? BERR_TIMEOUT : BERR_CLOSED, now);
	conn_after_request(c, false);
}

/* ---- open loop ---- */

/* Sends waiting arrivals while there is room. */
static void open_loop_dispatch(struct run *r)
{
	if (r->concurrency)
		return;
	while (r->pend_n > 0 && r->inflight < r->o->max_inflight && !r->stopping) {
		uint64_t arrived = r->pending[r->pend_head];
		struct conn *c = r->idle;
		if (c) {
			r->idle = c->link;
			c->link = NULL;
		} else if (!(c = conn_new(r))) {
			run_fatal_socket(r);
			r->pend_n = 0;
			break;
		}
		r->pend_head = (r->pend_head + 1) % PENDING_MAX;
		r->pend_n--;
		if (arrived != r->arrival_now) {
			/* queued by an earlier arrival call: it waited for a slot */
			uint64_t lag_us = (clock_now_ns() - arrived) / 1000;
			r->res->delayed++;
			if (lag_us > r->res->max_lag_us)
				r->res->max_lag_us = lag_us;
		}
		conn_issue(c);
	}
}

/* May one more arrival be generated? Arrivals take their request numbers
 * in order, so those still waiting count against --requests. */
static bool arrival_allowed(struct run *r, uint64_t now)
{
	if (r->stopping || r->arrivals_done)
		return false;
	if (r->limit && r->next_seq + r->pend_n >= r->limit)
		return false;
	if (r->deadline_ns && now >= r->deadline_ns)
		return false;
	return true;
}

/* A replayed request's arrival: the trace's time from the run's start; under
 * --compare, every other request a little later, so that which of the two
 * targets gets a request first alternates. */
static uint64_t arrival_at(const struct run *r, uint64_t n)
{
	uint64_t t = r->t_start + (r->o->replay ? r->o->replay->e[n].t_ns : 0);
	if (r->o->stagger && (n & 1) == (r->o->stagger == 1))
		t += BENCH_STAGGER_NS;
	return t;
}

static void on_arrival(evutil_socket_t fd, short what, void *arg)
{
	struct run *r = arg;
	uint64_t now = clock_now_ns();

	/* every arrival that is due, so a late timer does not thin the rate */
	for (int i = 0; i < 100000 && r->next_arrival_ns <= now; i++) {
		if (!arrival_allowed(r, now)) {
			r->arrivals_done = true;
			break;
		}
		if (r->pend_n == PENDING_MAX) {
			/* the server is far behind: stop rather than queue without end */
			r->res->fatal = true;
			snprintf(r->res->fatal_msg, sizeof(r->res->fatal_msg),
				 "%d arrivals waiting for one of --max-inflight %u slots: the server cannot keep up "
				 "with "
				 "--rate %g",
				 PENDING_MAX, r->o->max_inflight, r->o->rate);
			r->stopping = true;
			r->pend_n = 0;
			break;
		}
		uint64_t late = now - r->next_arrival_ns;
		if (late / 1000 > r->res->max_timer_late_us)
			r->res->max_timer_late_us = late / 1000;
		r->pending[(r->pend_head + r->pend_n) % PENDING_MAX] = now;
		r->pend_n++;
		r->arrival_now = now;
		open_loop_dispatch(r);
		r->arrival_now = 0;
		r->narrivals++;
		if (r->o->replay) {
			/* the trace's own times, from the run's start */
			if (r->narrivals < r->o->replay->n)
				r->next_arrival_ns = arrival_at(r, r->narrivals);
		} else {
			double gap = arrival_gap_s(&r->arrival_rng, r->o->arrivals, r->o->rate, r->o->burstiness);
			r->next_arrival_ns += (uint64_t)(gap * 1e9);
		}
	}
	if (!arrival_allowed(r, now))
		r->arrivals_done = true;
	if (r->arrivals_done || r->stopping) {
		run_check_done(r);
		return;
	}
	uint64_t wait = r->next_arrival_ns > now ? r->next_arrival_ns - now : 0;
	struct timeval tv = { (time_t)(wait / 1000000000ull), (suseconds_t)((wait % 1000000000ull) / 1000) };
	event_add(r->arrival_ev, &tv);
}

/* ---- the run ---- */

static void run_check_done(struct run *r)
{
	if (r->finished)
		return;
	bool more;
	if (r->concurrency)
		more = run_may_issue(r);
	else
		more = !r->stopping && (r->pend_n > 0 || !r->arrivals_done);
	if (r->res->fatal)
		more = false;
	if (!more && r->inflight == 0) {
		r->finished = true;
		event_base_loopexit(r->base, NULL);
	}
}

static void progress_clear(struct run *r)
{
	if (r->progress_drawn && r->progress_tty)
		fputs("\r\033[K", stderr);
	r->progress_drawn = false;
}

static void on_progress(evutil_socket_t fd, short what, void *arg)
{
	struct run *r = arg;
	double t = (double)(clock_now_ns() - r->t_start) / 1e9;
	report_progress(stderr, r->progress_tty, r->res, t, r->inflight);
	r->progress_drawn = true;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct run *r = arg;
	r->res->interrupted = true;
	r->stopping = true;
	r->pend_n = 0;
	/* in-flight requests are cancelled, not failed: the user stopped them */
	for (struct conn *c = r->conns, *next; c; c = next) {
		next = c->next;
		req_cancel(c);
		conn_close(c);
	}
	r->finished = true;
	event_base_loopexit(r->base, NULL);
}

static int resolve(struct run *r)
{
	struct addrinfo hints = { 0 }, *ai = NULL;
	char port[16];
	int e;

	hints.ai_socktype = SOCK_STREAM;
	hints.ai_family = AF_UNSPEC;
	snprintf(port, sizeof(port), "%u", r->o->port);
	if ((e = getaddrinfo(r->o->host, port, &hints, &ai)) != 0 || !ai) {
		fprintf(stderr, BENCH_NAME ": --url: cannot resolve '%s': %s\n", r->o->host, gai_strerror(e));
		return -1;
	}
	memcpy(&r->addr, ai->ai_addr, ai->ai_addrlen);
	r->addrlen = ai->ai_addrlen;
	freeaddrinfo(ai);
	return 0;
}

int bench_run(const struct bench_opts *o, unsigned concurrency, uint64_t id_base, FILE *reqlog,
	      struct bench_result *res)
{
	struct run r = { 0 };
	struct event_config *cfg = NULL;
	int rc = -1;

	if (o->api == BAPI_REALTIME)
		return bench_realtime_run(o, concurrency, id_base, res);
	memset(res, 0, sizeof(*res));
	for (int i = 0; i < BM__COUNT; i++) {
		hist_init(&res->m.h[i]);
		hist_init(&res->w.h[i]);
	}
	res->concurrency = concurrency;
	res->rate = concurrency ? 0 : o->rate;
	r.o = o;
	r.res = res;
	r.api = api_kind_of(o->api);
	r.concurrency = concurrency;
	r.id_base = id_base;
	r.reqlog = reqlog;
	r.limit = o->requests ? o->requests + o->warmup : 0;
	r.progress_tty = isatty(STDERR_FILENO);
	if (resolve(&r) == -1)
		return -1;
	if (o->model) {
		json_t *s = json_string(o->model);
		r.model_json = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
		json_decref(s);
		if (!r.model_json)
			goto out;
	}
	/* Precise timers: the coarse monotonic clock ticks in 4 ms and would
	 * bunch open-loop arrivals. */
	if (!(cfg = event_config_new()))
		goto out;
	event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
	event_config_set_flag(cfg, EVENT_BASE_FLAG_NO_CACHE_TIME);
	if (!(r.base = event_base_new_with_config(cfg)))
		goto out;
	r.scratch_body = evbuffer_new();
	r.scratch_req = evbuffer_new();
	r.rbuf = malloc(READ_BUF);
	r.reaper = event_new(r.base, -1, 0, on_reap, &r);
	r.deadline_ev = evtimer_new(r.base, on_deadline, &r);
	r.sigint_ev = evsignal_new(r.base, SIGINT, on_signal, &r);
	r.sigterm_ev = evsignal_new(r.base, SIGTERM, on_signal, &r);
	if (!r.scratch_body || !r.scratch_req || !r.rbuf || !r.reaper || !r.deadline_ev || !r.sigint_ev ||
	    !r.sigterm_ev ||
	    (!o->no_signals && (evsignal_add(r.sigint_ev, NULL) == -1 || evsignal_add(r.sigterm_ev, NULL) == -1)))
		goto out;
	if (o->progress == 1 || (o->progress == -1 && r.progress_tty)) {
		struct timeval one = { 1, 0 };
		r.progress_ev = event_new(r.base, -1, EV_PERSIST, on_progress, &r);
		if (!r.progress_ev || event_add(r.progress_ev, &one) == -1)
			goto out;
	}

	r.t_start = o->start_ns ? o->start_ns : clock_now_ns();
	if (concurrency) {
		closed_loop_refill(&r);
	} else {
		r.pending = malloc(PENDING_MAX * sizeof(*r.pending));
		r.arrival_ev = evtimer_new(r.base, on_arrival, &r);
		if (!r.pending || !r.arrival_ev)
			goto out;
		rng_seed(&r.arrival_rng, o->seed ^ 0xa5a5a5a5a5a5a5a5ull ^ id_base);
		r.next_arrival_ns = arrival_at(&r, 0); /* the first request goes out at once */
		event_active(r.arrival_ev, EV_TIMEOUT, 1);
	}
	run_check_done(&r);
	if (!r.finished)
		event_base_dispatch(r.base);
	progress_clear(&r);
	rc = 0;
out:
	if (rc == -1)
		fprintf(stderr, BENCH_NAME ": cannot set up the event loop (out of memory?)\n");
	{
		uint64_t end = clock_now_ns();
		res->wall_s = r.t_start ? (double)(end - r.t_start) / 1e9 : 0;
		if (res->m.first_send_ns && res->m.last_end_ns > res->m.first_send_ns)
			res->elapsed_s = (double)(res->m.last_end_ns - res->m.first_send_ns) / 1e9;
	}
	for (struct conn *c = r.conns, *next; c; c = next) {
		next = c->next;
		req_cancel(c);
		conn_close(c);
	}
	if (r.reaper)
		on_reap(-1, 0, &r);
	if (r.progress_ev)
		event_free(r.progress_ev);
	if (r.arrival_ev)
		event_free(r.arrival_ev);
	if (r.deadline_ev)
		event_free(r.deadline_ev);
	if (r.sigint_ev)
		event_free(r.sigint_ev);
	if (r.sigterm_ev)
		event_free(r.sigterm_ev);
	if (r.reaper)
		event_free(r.reaper);
	if (r.scratch_body)
		evbuffer_free(r.scratch_body);
	if (r.scratch_req)
		evbuffer_free(r.scratch_req);
	if (r.base)
		event_base_free(r.base);
	if (cfg)
		event_config_free(cfg);
	free(r.pending);
	free(r.rbuf);
	free(r.model_json);
	if (reqlog)
		fflush(reqlog);
	return rc;
}
