/*
 * sim_conn.c — one client connection of tokentap-sim: bytes in through
 * llhttp, requests queued in arrival order (pipelining), each answered in
 * turn at the pace its plan asks for, bytes out through a bufferevent.
 *
 *   socket -> bufferevent input -> llhttp -> [req][req][req] -> sim_api
 *                                            head is answered,
 *                                            the rest wait their turn
 *   tick timer / write callback -> pump(head) -> bufferevent output -> socket
 *
 * Invariants:
 * - EV_READ stays enabled for the connection's whole life, even while
 *   streaming or when parsing is paused, so that a client's EOF or reset is
 *   seen the moment it arrives; it ends generation and counts as an abort.
 * - A token is generated only while the output buffer holds less than
 *   SIM_HIGH_WATER bytes; a stalled stream resumes from the write callback.
 *   A slow reader therefore stalls generation and memory stays bounded.
 * - Only the head request has a pacing timer; responses leave in order.
 * - --events-per-write N > 1: a fixed-pace stream's token events are held
 *   in its `held` buffer and handed to the output N at a time (the last
 *   group with the closing events); at itl 0 the loop is yielded to after
 *   each group, so that one write carries one group while the client keeps up.
 * - With --batching, the head request is paced by the shared scheduler
 *   (sim_batch.c) instead of its timer: the scheduler counts the tokens
 *   generated and calls back; the connection writes them while its output
 *   holds under SIM_HIGH_WATER and otherwise only counts them, so a slow
 *   reader never holds up the batch. Unsent tokens are a counter, not
 *   bytes (the words are drawn in order when they are written), so memory
 *   stays bounded; past --backlog-tokens the reader is dropped.
 * - A connection is never freed inside one of its own callbacks: it is
 *   marked dead and freed from a zero-delay event (Redis' deferred free).
 */
#include "sim.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <llhttp.h>
#include <openssl/ssl.h>

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define SIM_HIGH_WATER (64 * 1024) /* stop generating above this */
#define SIM_LOW_WATER (16 * 1024)  /* write callback fires below */
#define SIM_BURST 64		   /* itl 0: tokens per loop turn */
#define SIM_MAX_QUEUED 64	   /* pipelined requests parsed ahead */
#define SIM_MAX_BODY (64 * 1024 * 1024)
#define SIM_MAX_URL 8192
#define SIM_MAX_HVALUE 4096
#define SIM_MAX_INPUT (16 * 1024 * 1024) /* unparsed input while paused */

enum req_state {
	REQ_RECEIVING, /* headers or body still arriving */
	REQ_QUEUED,    /* complete, waiting behind earlier requests */
	REQ_WAITING,   /* head: timer set for the first token / the block */
	REQ_STREAMING, /* head: token events flowing */
	REQ_DONE,      /* response fully queued on the output */
};

/* One request and, once it is the head, its response. Owned by its conn. */
struct sim_req {
	struct sim_req *next;
	enum req_state state;
	char method[16];
	char *url; /* path and query as received */
	size_t url_len;
	struct evbuffer *body;
	char *request_id;		 /* x-request-id, NULL if absent */
	int64_t ttft_ms, itl_ms, tokens; /* x-sim-* overrides, -1 absent */
	int64_t events_per_write;	 /* x-sim-events-per-write, -1 absent */
	int64_t reasoning_tokens, think_ms, cached_tokens, cache_write_tokens, tool_call, reasoning_hidden;
	int64_t spec_tokens;
	char *exception; /* x-sim-exception, NULL if absent */
	char *ws_key;	 /* Sec-WebSocket-Key, NULL if absent */
	bool ws_upgrade; /* "Upgrade: websocket" */
	const char *header_error;
	const char *parse_error; /* answer 400 with this and close */
	bool keep_alive;
	bool expect_continue; /* "Expect: 100-continue" */
	bool is_stats;	      /* /sim/stats: its bytes are not counted */
	bool counted;	      /* in sim_stats.requests, so ends in
			       * completed or aborted */
	uint64_t received_ns; /* request fully received */
	/* generation, valid from REQ_WAITING on */
	struct sim_stream *stream;
	struct sim_plan plan;
	uint64_t sent;	       /* token events written */
	uint64_t group;	       /* token events gathered into one write */
	struct evbuffer *held; /* events generated, not yet written (group > 1) */
	uint64_t deadline_ns;  /* when the next event is due */
	bool stalled;	       /* waiting for the output to drain */
	struct sim_seq seq;    /* --batching: its place in the scheduler */
};

/* One client connection; owned by the event loop through its callbacks. */
struct sim_conn {
	struct event_base *base;
	struct bufferevent *bev;
	struct event *tick;   /* pacing timer of the head request */
	struct event *reaper; /* zero-delay free, see conn_kill() */
	llhttp_t parser;
	struct sim_req *head, *tail; /* complete and receiving requests */
	struct sim_req *cur;	     /* the request llhttp is filling, or NULL */
	int queued;		     /* complete requests not yet answered */
	char field[32];		     /* current header name, truncated */
	size_t field_len;
	char *value; /* current header value */
	size_t value_len;
	bool value_overflow;
	bool parse_paused; /* too many queued: input waits unparsed */
	bool parse_dead;   /* parse error or close: ignore further input */
	bool close_after;  /* close once the output has drained */
	bool dead;	   /* freed at the end of this loop turn */
	bool handed_off;   /* the bufferevent now belongs to a realtime session */
	/* Re-entry guards: answering one request can finish it and start the
	 * next, which would otherwise recurse once per pipelined request. */
	bool in_read, read_again;
	bool in_advance;
};

static const llhttp_settings_t parser_settings;

static void conn_pump(struct sim_conn *c);
static void conn_read_input(struct sim_conn *c);

/* ---- lifetime ---- */

static void req_free(struct sim_req *r)
{
	if (r == NULL)
		return;
	sim_batch_cancel(&r->seq);
	sim_api_free(r->stream);
	if (r->held != NULL)
		evbuffer_free(r->held);
	if (r->body != NULL)
		evbuffer_free(r->body);
	free(r->url);
	free(r->request_id);
	free(r->exception);
	free(r->ws_key);
	free(r);
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
	struct sim_conn *c = arg;
	struct sim_req *r, *next;

	for (r = c->head; r != NULL; r = next) {
		next = r->next;
		req_free(r);
	}
	if (c->tick != NULL)
		event_free(c->tick);
	event_free(c->reaper);
	if (!c->handed_off) {
		bufferevent_free(c->bev);
		sim_stats.open_connections--; /* else the session counts itself out */
	}
	free(c->value);
	free(c);
}

/*
 * Ends the connection: no more callbacks, freed once the loop turn ends.
 * Every counted request not yet answered in full counts as aborted when
 * the client is the one who left.
 */
static void conn_kill(struct sim_conn *c, bool client_left)
{
	struct sim_req *r;
	uint64_t lost = 0;

	if (c->dead)
		return;
	c->dead = true;
	for (r = c->head; r != NULL; r = r->next) {
		if (r->counted)
			lost++;
		sim_batch_cancel(&r->seq); /* frees its batch slot and KV now */
	}
	if (client_left && lost > 0) {
		sim_stats.aborted += lost;
		sim_stats.last_abort_ns = sim_now_ns();
	}
	if (c->tick != NULL)
		event_del(c->tick);
	bufferevent_disable(c->bev, EV_READ | EV_WRITE);
	bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
	event_active(c->reaper, EV_TIMEOUT, 1);
}

/* ---- answering ---- */

static void out_add(struct sim_conn *c, struct sim_req *r, struct evbuffer *tmp)
{
	if (!r->is_stats)
		sim_stats.bytes_sent += evbuffer_get_length(tmp);
	bufferevent_write_buffer(c->bev, tmp);
}

static void tick_in(struct sim_conn *c, uint64_t delay_ns)
{
	struct timeval tv = {
		.tv_sec = (time_t)(delay_ns / 1000000000ULL),
		.tv_usec = (suseconds_t)(delay_ns % 1000000000ULL / 1000ULL),
	};

	evtimer_add(c->tick, &tv);
}

/* The head's response is fully queued: count it, move to the next one. */
static void req_done(struct sim_conn *c, struct sim_req *r)
{
	r->state = REQ_DONE;
	if (r->counted)
		sim_stats.completed++;
	c->head = r->next;
	if (c->tail == r)
		c->tail = NULL;
	c->queued--;
	if (!r->keep_alive || r->parse_error != NULL) {
		c->close_after = true;
		c->parse_dead = true;
	}
	req_free(r);
	if (c->close_after) {
		/* Fire the write callback only when everything has left. */
		bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
		if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
			conn_kill(c, false);
		return;
	}
	if (c->parse_paused && c->queued < SIM_MAX_QUEUED) {
		c->parse_paused = false;
		llhttp_resume(&c->parser);
		conn_read_input(c);
	}
}

/* Makes the head request's answer begin; immediate answers finish here. */
static void req_start(struct sim_conn *c, struct sim_req *r)
{
	struct evbuffer *tmp = evbuffer_new();
	struct sim_api_request rq = {
		.method = r->method,
		.request_id = r->request_id,
		.ttft_ms = r->ttft_ms,
		.itl_ms = r->itl_ms,
		.tokens = r->tokens,
		.reasoning_tokens = r->reasoning_tokens,
		.think_ms = r->think_ms,
		.cached_tokens = r->cached_tokens,
		.cache_write_tokens = r->cache_write_tokens,
		.tool_call = r->tool_call,
		.reasoning_hidden = r->reasoning_hidden,
		.spec_tokens = r->spec_tokens,
		.exception = r->exception,
		.header_error = r->header_error,
		.keep_alive = r->keep_alive && r->parse_error == NULL,
	};
	char *q;

	q = memchr(r->url, '?', r->url_len);
	if (q != NULL)
		*q = '\0';
	rq.path = r->url;
	rq.query = q != NULL ? q + 1 : NULL;
	evbuffer_add(r->body, "", 1); /* NUL-terminate for the JSON parser */
	rq.body_len = evbuffer_get_length(r->body) - 1;
	rq.body = (const char *)evbuffer_pullup(r->body, -1);

	if (r->parse_error != NULL) {
		/* llhttp's reasons are fixed ASCII phrases without quotes. */
		static const char fmt[] =
			"{\"error\":{\"message\":\"malformed HTTP request: %s\","
			"\"type\":\"invalid_request_error\",\"param\":null,\"code\":400}}";
		char body[256];
		int n = snprintf(body, sizeof(body), fmt, r->parse_error);

		if (n < 0 || (size_t)n >= sizeof(body))
			n = snprintf(body, sizeof(body), fmt, "unparsable");
		evbuffer_add_printf(tmp,
				    "HTTP/1.1 400 Bad Request\r\nserver: tokentap-sim\r\n"
				    "content-type: application/json\r\ncontent-length: %d\r\n"
				    "connection: close\r\n\r\n%s",
				    n, body);
	} else {
		r->stream = sim_api_begin(&rq, tmp, &r->plan);
	}
	out_add(c, r, tmp);
	evbuffer_free(tmp);
	if (r->stream == NULL) {
		req_done(c, r);
		return;
	}
	r->state = REQ_WAITING;
	if (r->plan.batched) {
		/* Queued for the batch; sim_conn_seq_progress() takes over. */
		r->seq.owner = c;
		r->seq.n_in = r->plan.prompt_tokens;
		r->seq.n_out = r->plan.tokens;
		sim_batch_submit(&r->seq);
		return;
	}
	/* --events-per-write: the fixed-pace streams only (a batch's steps
	 * already decide what leaves together). */
	r->group = r->events_per_write > 0 ? (uint64_t)r->events_per_write : sim_cfg.events_per_write;
	if (r->group > 1 && r->plan.streaming && (r->held = evbuffer_new()) == NULL)
		r->group = 1;
	/* The first event is due ttft after the request arrived in full; a
	 * block answer after ttft + tokens * itl, as a server would finish. */
	r->deadline_ns = r->received_ns + r->plan.ttft_ns;
	if (!r->plan.streaming)
		r->deadline_ns += r->plan.tokens * r->plan.itl_ns + r->plan.think_ns;
	else if (r->plan.reasoning_tokens == 0 && r->plan.tokens > 0)
		r->deadline_ns += r->plan.think_ns; /* hidden thinking */
	conn_pump(c);
}

/* Answers queued requests in order until one has to wait. */
static void conn_advance(struct sim_conn *c)
{
	if (c->in_advance)
		return; /* the loop below picks up the new head */
	c->in_advance = true;
	while (!c->dead && c->head != NULL && c->head->state == REQ_QUEUED)
		req_start(c, c->head);
	c->in_advance = false;
}

/*
 * --batching: writes the tokens the scheduler has generated for the head
 * request and not yet sent, while the output has room; then the closing
 * events once generation has finished. Called after each step that
 * advanced the request and from the write callback after a stall.
 */
static void conn_pump_batched(struct sim_conn *c, struct sim_req *r)
{
	struct evbuffer *output = bufferevent_get_output(c->bev);
	struct evbuffer *tmp = evbuffer_new();
	bool drop = false;

	r->stalled = false;
	for (;;) {
		if (evbuffer_get_length(output) >= SIM_HIGH_WATER) {
			uint64_t unsent = r->plan.streaming ? r->seq.generated - r->sent : 0;

			r->stalled = true;
			drop = sim_cfg.backlog_tokens > 0 && unsent > sim_cfg.backlog_tokens;
			break;
		}
		if (r->plan.streaming && r->sent < r->seq.generated) {
			r->state = REQ_STREAMING;
			sim_api_token(r->stream, tmp);
			out_add(c, r, tmp);
			r->sent++;
			continue;
		}
		if (r->seq.finished) {
			struct sim_timing t = sim_batch_timing(&r->seq);
			sim_api_timing(r->stream, &t);
			sim_api_finish(r->stream, tmp);
			out_add(c, r, tmp);
			req_done(c, r); /* frees r */
		}
		break;
	}
	evbuffer_free(tmp);
	if (drop) {
		/* A server whose send queue to one client grows without bound
		 * closes that client; the request counts as aborted. */
		sim_stats.dropped++;
		conn_kill(c, true);
		return;
	}
	conn_advance(c);
}

void sim_conn_seq_progress(struct sim_seq *q)
{
	struct sim_conn *c = q->owner;

	if (!c->dead && c->head != NULL && &c->head->seq == q)
		conn_pump_batched(c, c->head);
}

/*
 * Writes whatever the head request owes by now, then arranges to be called
 * again: by the tick timer when the next event is due, by the write
 * callback when the output is above the high-water mark.
 */
static void conn_pump(struct sim_conn *c)
{
	struct sim_req *r = c->head;
	struct evbuffer *output = bufferevent_get_output(c->bev);
	struct evbuffer *tmp;
	int burst = 0;

	if (c->dead || r == NULL || (r->state != REQ_WAITING && r->state != REQ_STREAMING))
		return;
	if (r->plan.batched) {
		conn_pump_batched(c, r);
		return;
	}
	tmp = evbuffer_new();
	r->stalled = false;
	for (;;) {
		uint64_t now = sim_now_ns();
		/* The closing events follow the last token at once, as the
		 * finish_reason rides on vLLM's last token chunk. */
		bool closing = r->plan.streaming && r->sent > 0 && r->sent == r->plan.tokens;

		if (!closing && now < r->deadline_ns) {
			tick_in(c, r->deadline_ns - now);
			break;
		}
		if (evbuffer_get_length(output) >= SIM_HIGH_WATER) {
			r->stalled = true;
			break;
		}
		if (!r->plan.streaming || r->sent == r->plan.tokens) {
			if (r->held != NULL)
				out_add(c, r, r->held); /* the last group, short or not */
			sim_api_finish(r->stream, tmp);
			out_add(c, r, tmp);
			req_done(c, r);
			break;
		}
		r->state = REQ_STREAMING;
		sim_api_token(r->stream, tmp);
		r->sent++;
		if (r->held == NULL) {
			out_add(c, r, tmp);
		} else {
			/* Gathered: held until the group is whole; the last
			 * token's group leaves with the closing events. */
			evbuffer_add_buffer(r->held, tmp);
			if (r->sent % r->group == 0)
				out_add(c, r, r->held);
		}
		/* Next event one itl after this one was due, so timer latency
		 * does not accumulate; but never catch up in a burst after a
		 * stall: when over one itl late, restart the beat from now. */
		r->deadline_ns += r->plan.itl_ns;
		if (r->deadline_ns + r->plan.itl_ns < now)
			r->deadline_ns = now + r->plan.itl_ns;
		/* The thinking pause: the last reasoning token, then think_ms
		 * more than one itl before the first answer token. */
		if (r->sent == r->plan.reasoning_tokens && r->sent < r->plan.tokens)
			r->deadline_ns += r->plan.think_ns;
		if (r->sent == r->plan.tokens || r->deadline_ns > now)
			continue; /* to close, or to set the timer */
		if (r->held != NULL ? r->sent % r->group == 0 : ++burst >= SIM_BURST) {
			/* itl 0: yield to the loop so other clients, and this
			 * client's EOF, are served between bursts; gathered,
			 * after each group, so that one write carries one. */
			tick_in(c, 0);
			break;
		}
	}
	evbuffer_free(tmp);
	conn_advance(c); /* the next request, if this one is done */
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	conn_pump(arg);
}

/* ---- llhttp callbacks: they record; the one write is "100 Continue" ---- */

static struct sim_conn *conn_of(llhttp_t *p)
{
	return p->data;
}

static int on_message_begin(llhttp_t *p)
{
	struct sim_conn *c = conn_of(p);
	struct sim_req *r = calloc(1, sizeof(*r));

	if (r == NULL || (r->body = evbuffer_new()) == NULL) {
		free(r);
		return -1;
	}
	r->ttft_ms = r->itl_ms = r->tokens = r->events_per_write = -1;
	r->reasoning_tokens = r->think_ms = r->cached_tokens = r->cache_write_tokens = r->tool_call = -1;
	r->reasoning_hidden = r->spec_tokens = -1;
	r->state = REQ_RECEIVING;
	if (c->tail != NULL)
		c->tail->next = r;
	else
		c->head = r;
	c->tail = r;
	c->cur = r;
	return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
	struct sim_req *r = conn_of(p)->cur;
	char *u;

	if (r->url_len + len > SIM_MAX_URL)
		return -1;
	u = realloc(r->url, r->url_len + len + 1);
	if (u == NULL)
		return -1;
	memcpy(u + r->url_len, at, len);
	r->url_len += len;
	u[r->url_len] = '\0';
	r->url = u;
	return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct sim_conn *c = conn_of(p);
	size_t room = sizeof(c->field) - 1 - c->field_len;

	/* Names longer than the buffer are not ones we look for; keep a
	 * truncated copy that cannot match. */
	memcpy(c->field + c->field_len, at, len < room ? len : room);
	c->field_len += len < room ? len : room;
	c->field[c->field_len] = '\0';
	if (len > room)
		c->field[0] = '\0';
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct sim_conn *c = conn_of(p);
	char *v;

	if (c->value_len + len > SIM_MAX_HVALUE) {
		c->value_overflow = true;
		return 0;
	}
	v = realloc(c->value, c->value_len + len + 1);
	if (v == NULL)
		return -1;
	memcpy(v + c->value_len, at, len);
	c->value_len += len;
	v[c->value_len] = '\0';
	c->value = v;
	return 0;
}

/* A non-negative decimal integer, or -1. */
static int64_t parse_count(const char *s)
{
	int64_t v = 0;

	if (s == NULL || *s == '\0')
		return -1;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9' || v > (INT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (*s - '0');
	}
	return v;
}

static int on_header_value_complete(llhttp_t *p)
{
	struct sim_conn *c = conn_of(p);
	struct sim_req *r = c->cur;
	const char *v = c->value ? c->value : "";
	int64_t *ov = NULL;
	const char *which = NULL;

	/* llhttp drops leading whitespace of a value but keeps trailing. */
	while (c->value_len > 0 && (c->value[c->value_len - 1] == ' ' || c->value[c->value_len - 1] == '\t'))
		c->value[--c->value_len] = '\0';

	if (strcasecmp(c->field, "upgrade") == 0) {
		r->ws_upgrade = strcasecmp(v, "websocket") == 0;
	} else if (strcasecmp(c->field, "sec-websocket-key") == 0 && !c->value_overflow) {
		free(r->ws_key);
		r->ws_key = strdup(v);
	} else if (strcasecmp(c->field, "expect") == 0) {
		r->expect_continue = strcasecmp(v, "100-continue") == 0;
	} else if (strcasecmp(c->field, "x-request-id") == 0 && !c->value_overflow) {
		free(r->request_id);
		r->request_id = strdup(v);
	} else if (strcasecmp(c->field, "x-sim-ttft-ms") == 0) {
		ov = &r->ttft_ms;
		which = "x-sim-ttft-ms must be a non-negative integer of milliseconds";
	} else if (strcasecmp(c->field, "x-sim-itl-ms") == 0) {
		ov = &r->itl_ms;
		which = "x-sim-itl-ms must be a non-negative integer of milliseconds";
	} else if (strcasecmp(c->field, "x-sim-events-per-write") == 0) {
		ov = &r->events_per_write;
		which = "x-sim-events-per-write must be an integer from 1 to 4096";
	} else if (strcasecmp(c->field, "x-sim-tokens") == 0) {
		ov = &r->tokens;
		which = "x-sim-tokens must be a non-negative integer";
	} else if (strcasecmp(c->field, "x-sim-reasoning-tokens") == 0) {
		ov = &r->reasoning_tokens;
		which = "x-sim-reasoning-tokens must be a non-negative integer";
	} else if (strcasecmp(c->field, "x-sim-think-ms") == 0) {
		ov = &r->think_ms;
		which = "x-sim-think-ms must be a non-negative integer of milliseconds";
	} else if (strcasecmp(c->field, "x-sim-cached-tokens") == 0) {
		ov = &r->cached_tokens;
		which = "x-sim-cached-tokens must be a non-negative integer";
	} else if (strcasecmp(c->field, "x-sim-cache-write-tokens") == 0) {
		ov = &r->cache_write_tokens;
		which = "x-sim-cache-write-tokens must be a non-negative integer";
	} else if (strcasecmp(c->field, "x-sim-tool-call") == 0) {
		ov = &r->tool_call;
		which = "x-sim-tool-call must be 0 or 1";
	} else if (strcasecmp(c->field, "x-sim-reasoning-hidden") == 0) {
		ov = &r->reasoning_hidden;
		which = "x-sim-reasoning-hidden must be 0 or 1";
	} else if (strcasecmp(c->field, "x-sim-spec-tokens") == 0) {
		ov = &r->spec_tokens;
		which = "x-sim-spec-tokens must be an integer from 1 to 64";
	} else if (strcasecmp(c->field, "x-sim-exception") == 0) {
		free(r->exception);
		r->exception = NULL;
		if (c->value_overflow || *v == '\0' || strlen(v) > 64 ||
		    strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(v))
			r->header_error = "x-sim-exception must be 1 to 64 letters (an exception type)";
		else
			r->exception = strdup(v);
	}
	if (ov != NULL) {
		*ov = c->value_overflow ? -1 : parse_count(v);
		if (*ov < 0 || ((ov == &r->tool_call || ov == &r->reasoning_hidden) && *ov > 1) ||
		    (ov == &r->events_per_write && (*ov < 1 || *ov > SIM_MAX_EVENTS_PER_WRITE)) ||
		    (ov == &r->spec_tokens && (*ov < 1 || *ov > SIM_MAX_SPEC_TOKENS)))
			r->header_error = which;
	}
	c->field_len = 0;
	c->field[0] = '\0';
	c->value_len = 0;
	c->value_overflow = false;
	if (c->value != NULL)
		c->value[0] = '\0';
	return 0;
}

static int on_headers_complete(llhttp_t *p)
{
	struct sim_conn *c = conn_of(p);
	struct sim_req *r = c->cur;
	const char *m = llhttp_method_name((llhttp_method_t)llhttp_get_method(p));
	size_t path_len;

	snprintf(r->method, sizeof(r->method), "%s", m);
	if (r->url == NULL && on_url(p, "/", 1) != 0)
		return -1;
	path_len = strcspn(r->url, "?");
	/* /metrics too: a scraper's GETs are not the load it measures */
	r->is_stats = (path_len == 10 && memcmp(r->url, "/sim/stats", 10) == 0) ||
		      (path_len == 8 && memcmp(r->url, "/metrics", 8) == 0);
	if (!r->is_stats) {
		r->counted = true;
		sim_stats.requests++;
		free(sim_stats.last_request_id);
		sim_stats.last_request_id = strdup(r->request_id ? r->request_id : "");
	}
	/* curl waits a second for this before sending a large body. Sent only
	 * when no earlier answer is owed, so it cannot land inside one. */
	if (r->expect_continue && c->head == r) {
		static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

		if (!r->is_stats)
			sim_stats.bytes_sent += sizeof(cont) - 1;
		bufferevent_write(c->bev, cont, sizeof(cont) - 1);
	}
	return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct sim_req *r = conn_of(p)->cur;

	if (evbuffer_get_length(r->body) + len > SIM_MAX_BODY) {
		llhttp_set_error_reason(p, "request body over 64 MiB");
		return HPE_USER;
	}
	return evbuffer_add(r->body, at, len) == 0 ? 0 : -1;
}

static int on_message_complete(llhttp_t *p)
{
	struct sim_conn *c = conn_of(p);
	struct sim_req *r = c->cur;

	r->keep_alive = llhttp_should_keep_alive(p);
	r->received_ns = sim_now_ns();
	r->state = REQ_QUEUED;
	c->cur = NULL;
	c->queued++;
	if (!r->keep_alive) {
		/* Nothing after a "Connection: close" request is answered. */
		c->parse_dead = true;
		return HPE_PAUSED;
	}
	return c->queued >= SIM_MAX_QUEUED ? HPE_PAUSED : 0;
}

static const llhttp_settings_t parser_settings = {
	.on_message_begin = on_message_begin,
	.on_url = on_url,
	.on_header_field = on_header_field,
	.on_header_value = on_header_value,
	.on_header_value_complete = on_header_value_complete,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

/*
 * A request llhttp rejected: answer 400 after the answers already owed and
 * close. The broken request takes the place of the one being received.
 */
static void conn_parse_failed(struct sim_conn *c, const char *why)
{
	struct sim_req *r = c->cur;

	c->parse_dead = true;
	if (r == NULL) {
		if (on_message_begin(&c->parser) != 0) {
			conn_kill(c, false);
			return;
		}
		r = c->cur;
	}
	if (r->url == NULL)
		r->url = strdup("");
	r->parse_error = why;
	r->keep_alive = false;
	r->state = REQ_QUEUED;
	c->cur = NULL;
	c->queued++;
}

static void conn_parse_input(struct sim_conn *c);

/*
 * GET /v1/realtime with "Upgrade: websocket", owing no earlier answer: the
 * bufferevent goes to a realtime session (sim_realtime.c) with the input
 * after the handshake, and this connection is freed. The session ends the
 * handshake's request as completed, or aborted when the client leaves
 * during a response.
 */
static bool conn_hand_off(struct sim_conn *c)
{
	struct sim_req *r = c->tail;
	struct sim_rt_open o;
	char *q;

	if (r == NULL || r != c->head || r->state != REQ_QUEUED || !r->ws_upgrade || r->ws_key == NULL ||
	    r->header_error != NULL || strcmp(r->method, "GET") != 0)
		return false;
	q = memchr(r->url, '?', r->url_len);
	if ((q != NULL ? (size_t)(q - r->url) : r->url_len) != 12 || memcmp(r->url, "/v1/realtime", 12) != 0)
		return false;
	o = (struct sim_rt_open){
		.key = r->ws_key,
		.query = q != NULL ? q + 1 : NULL,
		.request_id = r->request_id,
		.ttft_ms = r->ttft_ms,
		.itl_ms = r->itl_ms,
		.tokens = r->tokens,
		.counted = r->counted,
	};
	if (sim_realtime_take(c->base, c->bev, &o) != 0)
		return false;
	r->counted = false; /* the session ends it as completed or aborted */
	c->handed_off = true;
	c->dead = true;
	if (c->tick != NULL)
		event_del(c->tick);
	event_active(c->reaper, EV_TIMEOUT, 1);
	return true;
}

/* Feeds buffered input to llhttp and answers what it completes. */
static void conn_read_input(struct sim_conn *c)
{
	if (c->in_read) {
		c->read_again = true;
		return;
	}
	c->in_read = true;
	do {
		c->read_again = false;
		conn_parse_input(c);
		conn_advance(c);
	} while (c->read_again && !c->dead);
	c->in_read = false;
}

/* One pass of conn_read_input: parse until consumed, paused or broken. */
static void conn_parse_input(struct sim_conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);

	while (!c->dead && !c->parse_dead && !c->parse_paused) {
		size_t len = evbuffer_get_contiguous_space(in);
		const char *data;
		llhttp_errno_t err;

		if (len == 0)
			break;
		data = (const char *)evbuffer_pullup(in, (ev_ssize_t)len);
		err = llhttp_execute(&c->parser, data, len);
		if (err == HPE_OK) {
			evbuffer_drain(in, len);
		} else if (err == HPE_PAUSED) {
			evbuffer_drain(in, (size_t)(llhttp_get_error_pos(&c->parser) - data));
			if (!c->parse_dead)
				c->parse_paused = true;
		} else if (err == HPE_PAUSED_UPGRADE) {
			evbuffer_drain(in, (size_t)(llhttp_get_error_pos(&c->parser) - data));
			if (conn_hand_off(c))
				break;
			/* Any other upgrade offer (e.g. curl's h2c): decline
			 * by going on with HTTP/1.1 on the same bytes. */
			llhttp_resume_after_upgrade(&c->parser);
		} else {
			const char *reason = llhttp_get_error_reason(&c->parser);

			conn_parse_failed(c, reason ? reason : llhttp_errno_name(err));
		}
	}
	if (c->parse_dead)
		evbuffer_drain(in, evbuffer_get_length(in));
}

/* ---- bufferevent callbacks ---- */

static void on_read(struct bufferevent *bev, void *arg)
{
	struct sim_conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	if (c->parse_paused && evbuffer_get_length(in) > SIM_MAX_INPUT) {
		/* A client pipelining without reading: drop it rather than
		 * buffer without bound. Reading goes on so EOF is seen. */
		conn_kill(c, true);
		return;
	}
	conn_read_input(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct sim_conn *c = arg;

	if (c->close_after) {
		if (c->head == NULL && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
			conn_kill(c, false);
		return;
	}
	if (c->head != NULL && c->head->stalled)
		conn_pump(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct sim_conn *c = arg;

	/* EOF or error: the client is gone (or half-closed, which an HTTP
	 * server treats the same way, as uvicorn does). */
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		conn_kill(c, true);
}

int sim_conn_accept(struct event_base *base, int fd)
{
	struct sim_conn *c;
	int one = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == -1) {
		/* Not fatal, but Nagle would merge token events: refuse it
		 * loudly rather than measure the wrong thing quietly. */
		close(fd);
		return -1;
	}
	evutil_make_socket_nonblocking(fd);
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		goto fail_close;
	c->base = base;
	if (sim_tls_ctx != NULL) {
		SSL *ssl = SSL_new(sim_tls_ctx);
		c->bev = ssl == NULL ? NULL
				     : bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
								      BEV_OPT_CLOSE_ON_FREE);
		if (c->bev == NULL)
			SSL_free(ssl);
		else /* a client gone without close_notify is gone, as over TCP */
			bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
	} else {
		c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
	}
	if (c->bev == NULL)
		goto fail_free;
	c->tick = evtimer_new(base, on_tick, c);
	c->reaper = event_new(base, -1, 0, on_reap, c);
	if (c->tick == NULL || c->reaper == NULL)
		goto fail_events;
	llhttp_init(&c->parser, HTTP_REQUEST, &parser_settings);
	c->parser.data = c;
	bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
	bufferevent_setwatermark(c->bev, EV_WRITE, SIM_LOW_WATER, 0);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
	sim_stats.open_connections++;
	return 0;

fail_events:
	if (c->tick != NULL)
		event_free(c->tick);
	if (c->reaper != NULL)
		event_free(c->reaper);
	bufferevent_free(c->bev);
	free(c);
	return -1;
fail_free:
	free(c);
fail_close:
	close(fd);
	return -1;
}
