/*
 * bench_realtime.c — --api realtime: `concurrency` WebSocket sessions on
 * /v1/realtime (OpenAI Realtime, text), closed loop. Each session sends a
 * user item (conversation.item.create, --input-len tokens of text) and
 * response.create (response.max_output_tokens --output-len) and, once
 * response.done came, the next pair, until --requests (or --duration) are
 * done. A response is measured as tokentap measures it (src/parse/
 * realtime.c classifies the messages, one definition of a token event for
 * proxy and client): TTFT from writing its response.create to the first
 * delta, the gaps between deltas as ITL, E2E to response.done, tokens from
 * response.done's usage (else the deltas).
 *
 * Session S is sent as x-request-id bench-RUN-S; tokentap names its
 * responses bench-RUN-S/1, /2, .... Plain ws:// only; closed loop only.
 */
#include "bench.h"
#include "realtime.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/evp.h>

#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define RTB_MAX_MSG (1u << 20) /* a server message longer than this fails the session */

struct rtb_run;

struct rtb_sess {
	struct rtb_run *run;
	struct bufferevent *bev;
	uint64_t id;
	bool open;	      /* the 101 is read */
	bool busy;	      /* a response is in flight */
	bool warm;	      /* the response in flight is a warm-up one */
	struct evbuffer *msg; /* the server message being reassembled */
	uint64_t send_ns, first_ns, last_ns, deltas, in_len;
	struct usage usage;
};

struct rtb_run {
	const struct bench_opts *o;
	struct bench_result *res;
	struct event_base *base;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct rtb_sess *s;
	unsigned n, alive;
	uint64_t issued, limit, t_start, id_base;
	struct event *deadline;
	bool stopping;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void ws_send(struct rtb_sess *s, const char *p, size_t n)
{
	unsigned char h[14];
	size_t hl = 2;
	uint32_t mask = (uint32_t)(s->id * 2654435761u) ^ (uint32_t)n;
	unsigned char m[4] = { (unsigned char)(mask >> 24), (unsigned char)(mask >> 16), (unsigned char)(mask >> 8),
			       (unsigned char)mask };
	struct evbuffer *out = bufferevent_get_output(s->bev);
	unsigned char *dst;
	struct evbuffer_iovec v;

	h[0] = 0x81;
	if (n < 126) {
		h[1] = (unsigned char)(0x80 | n);
	} else if (n < 65536) {
		h[1] = 0x80 | 126;
		h[2] = (unsigned char)(n >> 8);
		h[3] = (unsigned char)n;
		hl = 4;
	} else {
		h[1] = 0x80 | 127;
		for (int i = 0; i < 8; i++)
			h[2 + i] = (unsigned char)((uint64_t)n >> (56 - 8 * i));
		hl = 10;
	}
	memcpy(h + hl, m, 4);
	evbuffer_add(out, h, hl + 4);
	if (evbuffer_reserve_space(out, (ev_ssize_t)n, &v, 1) != 1)
		return;
	dst = v.iov_base;
	for (size_t i = 0; i < n; i++)
		dst[i] = (unsigned char)p[i] ^ m[i % 4];
	v.iov_len = n;
	evbuffer_commit_space(out, &v, 1);
}

static void sess_end(struct rtb_sess *s, enum bench_error err);

/* The next response, or the end of the session when none is left. */
static void sess_next(struct rtb_sess *s)
{
	struct rtb_run *r = s->run;
	const struct bench_opts *o = r->o;
	struct evbuffer *b;
	uint64_t seq;
	uint32_t in_len, out_len;
	struct bench_stats *st;

	if (r->stopping || (r->limit && r->issued >= r->limit)) {
		/* close 1000, masked with zeros; sent at once (freeing the
		 * bufferevent drops what it holds) */
		static const unsigned char close_frame[] = { 0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8 };
		if (evbuffer_get_length(bufferevent_get_output(s->bev)) == 0)
			(void)send(bufferevent_getfd(s->bev), close_frame, sizeof(close_frame), MSG_NOSIGNAL);
		sess_end(s, BERR_NONE);
		return;
	}
	seq = r->id_base + r->issued++;
	s->warm = seq - r->id_base < o->warmup;
	st = s->warm ? &r->res->w : &r->res->m;
	in_len = dist_draw(&o->input_len, o->seed, seq, 1);
	out_len = dist_draw(&o->output_len, o->seed ^ 0x6f7574ull, seq, 1);
	b = evbuffer_new();
	if (b == NULL) {
		sess_end(s, BERR_CLOSED);
		return;
	}
	evbuffer_add_printf(b,
			    "{\"type\":\"conversation.item.create\",\"item\":{\"type\":\"message\",\"role\":\"user\","
			    "\"content\":[{\"type\":\"input_text\",\"text\":\"");
	for (uint32_t i = 0; i < in_len; i++)
		evbuffer_add(b, i ? " tok" : "tok ", 4); /* four bytes a token */
	evbuffer_add_printf(b, "\"}]}}");
	ws_send(s, (const char *)evbuffer_pullup(b, -1), evbuffer_get_length(b));
	evbuffer_drain(b, evbuffer_get_length(b));
	evbuffer_add_printf(b,
			    "{\"type\":\"response.create\",\"response\":{\"output_modalities\":[\"text\"],"
			    "\"max_output_tokens\":%" PRIu32 "}}",
			    out_len);
	ws_send(s, (const char *)evbuffer_pullup(b, -1), evbuffer_get_length(b));
	evbuffer_free(b);
	s->busy = true;
	s->in_len = in_len;
	s->send_ns = now_ns();
	s->first_ns = s->last_ns = 0;
	s->deltas = 0;
	memset(&s->usage, 0, sizeof(s->usage));
	s->usage.input_tokens = s->usage.output_tokens = s->usage.cached_tokens = -1;
	st->started++;
	if (!st->first_send_ns)
		st->first_send_ns = s->send_ns;
}

static void response_done(struct rtb_sess *s, uint64_t now)
{
	struct bench_stats *st = s->warm ? &s->run->res->w : &s->run->res->m;
	uint64_t out = s->usage.output_tokens >= 0 ? (uint64_t)s->usage.output_tokens : s->deltas;

	s->busy = false;
	if (s->usage.outcome == OUTCOME_FAILED) {
		st->failed++;
		st->errors[BERR_RESPONSE_FAILED]++;
		return;
	}
	st->ok++;
	st->input_tokens += s->usage.input_tokens >= 0 ? (uint64_t)s->usage.input_tokens : s->in_len;
	st->input_from_usage += s->usage.input_tokens >= 0;
	st->output_tokens += out;
	st->output_from_usage += s->usage.output_tokens >= 0;
	st->last_end_ns = now;
	if (s->first_ns) {
		hist_record(&st->h[BM_TTFT], (s->first_ns - s->send_ns + 500) / 1000);
		if (out > 1 && s->last_ns > s->first_ns)
			hist_record(&st->h[BM_TPOT], ((s->last_ns - s->first_ns) / (out - 1) + 500) / 1000);
	}
	hist_record(&st->h[BM_E2E], (now - s->send_ns + 500) / 1000);
}

/* One whole text message from the server. */
static void on_message(struct rtb_sess *s, const char *p, size_t n, uint64_t now)
{
	enum rt_event ev = realtime_event(p, n, true, false, &s->usage);

	switch (ev) {
	case RT_DELTA:
		if (!s->busy)
			return;
		if (!s->first_ns) {
			s->first_ns = now;
		} else {
			struct bench_stats *st = s->warm ? &s->run->res->w : &s->run->res->m;
			hist_record(&st->h[BM_ITL], (now - s->last_ns) / 1000); /* as tokentap: truncated µs */
		}
		s->last_ns = now;
		s->deltas++;
		break;
	case RT_DONE:
		if (!s->busy)
			return;
		response_done(s, now);
		sess_next(s);
		break;
	case RT_ERROR: sess_end(s, BERR_RESPONSE_FAILED); break;
	default: break;
	}
}

/* Frames from the server (unmasked). */
static void read_frames(struct rtb_sess *s, uint64_t now)
{
	struct evbuffer *in = bufferevent_get_input(s->bev);

	while (s->bev != NULL) {
		size_t have = evbuffer_get_length(in), hl = 2;
		unsigned char h[10];
		uint64_t n;
		unsigned op;

		if (have < 2)
			return;
		evbuffer_copyout(in, h, have < sizeof(h) ? have : sizeof(h));
		op = h[0] & 0x0F;
		n = h[1] & 0x7F;
		hl = n == 126 ? 4 : n == 127 ? 10 : 2;
		if (have < hl)
			return;
		if (n == 126)
			n = (uint64_t)h[2] << 8 | h[3];
		else if (n == 127)
			for (int i = 0; i < 8; i++)
				n = (i ? n << 8 : 0) | h[2 + i];
		if ((h[1] & 0x80) || n > RTB_MAX_MSG || evbuffer_get_length(s->msg) + n > RTB_MAX_MSG) {
			sess_end(s, BERR_PROTOCOL);
			return;
		}
		if (have < hl + n)
			return;
		evbuffer_drain(in, hl);
		if (op == 8) {
			sess_end(s, s->busy ? BERR_CLOSED : BERR_NONE);
			return;
		}
		if (op == 9) { /* a pong with the same payload */
			unsigned char pl[125];
			size_t k = n < sizeof(pl) ? (size_t)n : sizeof(pl);
			unsigned char ph[6] = { 0x8A, (unsigned char)(0x80 | k), 0, 0, 0, 0 };
			evbuffer_remove(in, pl, k);
			evbuffer_add(bufferevent_get_output(s->bev), ph, 6);
			evbuffer_add(bufferevent_get_output(s->bev), pl, k);
			continue;
		}
		if (op > 2) {
			evbuffer_drain(in, n);
			continue;
		}
		evbuffer_remove_buffer(in, s->msg, n);
		if (h[0] & 0x80) {
			size_t ml = evbuffer_get_length(s->msg);
			on_message(s, ml ? (const char *)evbuffer_pullup(s->msg, -1) : "", ml, now);
			if (s->msg != NULL)
				evbuffer_drain(s->msg, evbuffer_get_length(s->msg));
		}
	}
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct rtb_sess *s = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	uint64_t now = now_ns();

	if (!s->open) {
		struct evbuffer_ptr e = evbuffer_search(in, "\r\n\r\n", 4, NULL);
		char line[16] = { 0 };

		if (e.pos < 0) {
			if (evbuffer_get_length(in) > 16384)
				sess_end(s, BERR_PROTOCOL);
			return;
		}
		evbuffer_copyout(in, line, sizeof(line) - 1);
		evbuffer_drain(in, (size_t)e.pos + 4);
		if (strncmp(line, "HTTP/1.1 101", 12) != 0) {
			int code = atoi(line + 9);
			sess_end(s, code >= 500 ? BERR_HTTP_5XX : code >= 400 ? BERR_HTTP_4XX : BERR_HTTP_OTHER);
			return;
		}
		s->open = true;
		sess_next(s);
		if (s->bev == NULL)
			return;
	}
	read_frames(s, now);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct rtb_sess *s = arg;

	(void)bev;
	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		return;
	}
	if (what & BEV_EVENT_TIMEOUT)
		sess_end(s, BERR_TIMEOUT);
	else if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		sess_end(s, !s->open && !(what & BEV_EVENT_EOF) ? BERR_CONNECT : BERR_CLOSED);
}

/* Ends the session: a response in flight fails with err (or, stopping,
 * is cancelled); the socket is closed once what is queued has been tried. */
static void sess_end(struct rtb_sess *s, enum bench_error err)
{
	struct rtb_run *r = s->run;

	if (s->bev == NULL)
		return;
	if (s->busy || (err != BERR_NONE && !s->open)) {
		struct bench_stats *st = s->warm ? &r->res->w : &r->res->m;
		if (r->stopping) {
			st->cancelled++;
		} else {
			if (!s->busy)
				st->started++;
			st->failed++;
			st->errors[err == BERR_NONE ? BERR_CLOSED : err]++;
		}
	}
	s->busy = false;
	bufferevent_free(s->bev); /* deferred by libevent when in a callback */
	s->bev = NULL;
	evbuffer_free(s->msg);
	s->msg = NULL;
	if (--r->alive == 0)
		event_base_loopexit(r->base, NULL);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct rtb_run *r = arg;

	(void)fd;
	(void)what;
	r->stopping = true;
	for (unsigned i = 0; i < r->n; i++)
		sess_end(&r->s[i], BERR_NONE);
}

static int sess_open(struct rtb_run *r, struct rtb_sess *s)
{
	const struct bench_opts *o = r->o;
	struct evbuffer *out;
	struct timeval tmo = { (time_t)(o->timeout_ms / 1000), (suseconds_t)(o->timeout_ms % 1000 * 1000) };
	unsigned char key[16];
	char key64[32];

	s->run = r;
	s->msg = evbuffer_new();
	s->bev = bufferevent_socket_new(r->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (s->msg == NULL || s->bev == NULL)
		return -1;
	r->alive++;
	r->res->connections++;
	for (int i = 0; i < 16; i++)
		key[i] = (unsigned char)(s->id * 131 + (uint64_t)i * 7 + o->seed);
	EVP_EncodeBlock((unsigned char *)key64, key, 16);
	out = bufferevent_get_output(s->bev);
	evbuffer_add_printf(out,
			    "GET %s%s%s HTTP/1.1\r\nHost: %s:%u\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
			    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: %s\r\nx-request-id: bench-%s-%" PRIu64
			    "\r\n",
			    o->path, o->model ? "?model=" : "", o->model ? o->model : "", o->host, o->port, key64,
			    o->run_id, s->id);
	for (unsigned i = 0; i < o->nheaders; i++)
		evbuffer_add_printf(out, "%s\r\n", o->headers[i]);
	evbuffer_add(out, "\r\n", 2);
	bufferevent_setcb(s->bev, on_read, NULL, on_event, s);
	if (o->timeout_ms)
		bufferevent_set_timeouts(s->bev, &tmo, NULL);
	bufferevent_enable(s->bev, EV_READ | EV_WRITE);
	if (bufferevent_socket_connect(s->bev, (struct sockaddr *)&r->addr, (int)r->addrlen) == -1) {
		sess_end(s, BERR_CONNECT);
		return 0;
	}
	return 0;
}

int bench_realtime_run(const struct bench_opts *o, unsigned concurrency, uint64_t id_base, struct bench_result *res)
{
	struct rtb_run r = { 0 };
	struct addrinfo hints = { 0 }, *ai = NULL;
	char port[16];
	int rc = -1;

	memset(res, 0, sizeof(*res));
	for (int i = 0; i < BM__COUNT; i++) {
		hist_init(&res->m.h[i]);
		hist_init(&res->w.h[i]);
	}
	res->concurrency = concurrency;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(port, sizeof(port), "%u", o->port);
	if (getaddrinfo(o->host, port, &hints, &ai) != 0 || ai == NULL) {
		fprintf(stderr, BENCH_NAME ": --url: cannot resolve '%s'\n", o->host);
		return -1;
	}
	memcpy(&r.addr, ai->ai_addr, ai->ai_addrlen);
	r.addrlen = ai->ai_addrlen;
	freeaddrinfo(ai);
	r.o = o;
	r.res = res;
	r.id_base = id_base;
	r.n = concurrency ? concurrency : 1;
	r.limit = o->requests ? o->requests + o->warmup : 0;
	r.base = event_base_new();
	r.s = calloc(r.n, sizeof(*r.s));
	if (r.base == NULL || r.s == NULL)
		goto out;
	r.t_start = now_ns();
	if (o->duration_ms) {
		struct timeval d = { (time_t)(o->duration_ms / 1000), (suseconds_t)(o->duration_ms % 1000 * 1000) };
		r.deadline = evtimer_new(r.base, on_deadline, &r);
		if (r.deadline == NULL || evtimer_add(r.deadline, &d) == -1)
			goto out;
	}
	for (unsigned i = 0; i < r.n; i++) {
		r.s[i].id = id_base + i;
		if (sess_open(&r, &r.s[i]) == -1)
			goto out;
	}
	if (r.alive)
		event_base_dispatch(r.base);
	rc = 0;
out:
	if (rc == -1)
		fprintf(stderr, BENCH_NAME ": cannot set up the event loop (out of memory?)\n");
	res->wall_s = (double)(now_ns() - r.t_start) / 1e9;
	if (res->m.first_send_ns && res->m.last_end_ns > res->m.first_send_ns)
		res->elapsed_s = (double)(res->m.last_end_ns - res->m.first_send_ns) / 1e9;
	if (r.s != NULL) {
		r.stopping = true;
		for (unsigned i = 0; i < r.n; i++) {
			if (r.s[i].bev != NULL)
				sess_end(&r.s[i], BERR_NONE);
			if (r.s[i].msg != NULL)
				evbuffer_free(r.s[i].msg);
		}
	}
	if (r.deadline != NULL)
		event_free(r.deadline);
	free(r.s);
	if (r.base != NULL)
		event_base_free(r.base);
	return rc;
}
