/*
 * tunnel.c — a WebSocket tunnel (tunnel.h): the bytes moved both ways,
 * each direction's frames checked, the deadlines, the ending.
 *
 *   client_in ──[wsf c2s: masked, limits]──▶ upstream output
 *   upstream input ──[wsf s2c: unmasked, limits]──▶ to_client hook
 *
 * Bytes go on as soon as they are parsed, the frame they belong to whole or
 * not: a frame's payload is never held. Backpressure as in client.c: past
 * STREAM_BUFFER waiting for one side, the other side's reads stop until it
 * is down to half. The deadlines run on one timer, re-armed for whichever
 * is due first; the idle clock counts from the last byte moved either way,
 * so a client that never reads (the upstream paused behind it) times out.
 */
#include "tunnel.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdio.h>
#include <string.h>

#include <stdlib.h>

#include "exchange.h"
#include "log.h"
#include "loop.h"
#include "meter.h"
#include "realtime.h"
#include "router.h"
#include "upstream.h"

static void tunnel_end(struct tunnel *t, enum req_error kind, const char *why);

/* ---- a realtime session's responses ---- */

struct tunnel_resp {
	struct req_record rec;
	struct meter meter;
	enum rt_event from; /* the event its TTFT starts at */
	bool running;	    /* the server has begun it (response.created or a delta) */
};

/* A response begins: its record from the session's, arriving at `at`
 * (its TTFT's start), the event there `from`. */
static void resp_open(struct tunnel *t, uint64_t at, enum rt_event from)
{
	const struct req_record *s = t->x->rec;
	struct tunnel_resp *r = calloc(1, sizeof(*r));

	if (!r)
		return; /* not measured */
	struct req_record *rec = &r->rec;
	r->from = from;
	rec->usage = USAGE_UNKNOWN;
	rec->inputs = -1;
	rec->stream = 1;
	rec->itl_keep = s->itl_keep;
	rec->ttft_from = realtime_start_name(from);
	snprintf(rec->id, sizeof(rec->id), "%.*s/%u", REQUEST_ID_MAX - 12, s->id, ++t->nresp);
	snprintf(rec->method, sizeof(rec->method), "WS");
	memcpy(rec->path, s->path, sizeof(rec->path));
	memcpy(rec->model, s->model, sizeof(rec->model));
	rec->upstream = s->upstream;
	rec->up_url = s->up_url;
	rec->api = API_REALTIME;
	rec->status = 200;
	rec->pick_pred_ms = -1;
	rec->at[TL_ARRIVE] = rec->at[TL_REQ_HEADERS] = rec->at[TL_DISPATCH] = rec->at[TL_REQ_SENT] = at;
	meter_init(&r->meter, &t->x->env->meter, rec, NULL, 0, false);
	meter_label(&r->meter, t->x->route ? t->x->route->name : NULL, t->x->up ? t->x->up->name : NULL, false, 1);
	t->resp = r;
}

static void resp_free(struct tunnel_resp *r)
{
	meter_free(&r->meter);
	record_release(&r->rec);
	free(r);
}

/* The open response ends (response.done, or the tunnel's end: `err`). */
static void resp_finish(struct tunnel *t, enum req_error err)
{
	struct tunnel_resp *r = t->resp;

	if (!r)
		return;
	t->resp = NULL;
	if (err != REQ_ERR_NONE && r->rec.error == REQ_ERR_NONE)
		r->rec.error = err;
	r->rec.at[TL_RESP_END] = t->now ? t->now : clock_now_ns();
	record_apply_outcome(&r->rec);
	if (meter_finish(&r->meter) && t->x->up)
		upstream_count_outcome(t->x->up, &r->rec);
	resp_free(r);
}

static bool from_client_event(enum rt_event ev)
{
	return ev == RT_CREATE || ev == RT_COMMIT;
}

static bool turn_end(enum rt_event ev)
{
	return ev == RT_COMMIT || ev == RT_SPEECH_STOPPED;
}

/* A turn ended or a response was asked for: the response it starts opens
 * now when none is open. One open that the server has not begun yet keeps
 * its earlier start (commit, then response.create; speech_stopped, then
 * committed), except that a turn's end after another turn's end moves it
 * (the response answers the last turn: a commit, then another, then
 * response.create); one running keeps this start for the next response,
 * where the same holds. */
static void rt_start(struct tunnel *t, enum rt_event ev)
{
	struct tunnel_resp *r = t->resp;

	if (!r) {
		resp_open(t, t->now, ev);
	} else if (!r->running) {
		if (turn_end(ev) && turn_end(r->from)) {
			r->from = ev;
			r->rec.ttft_from = realtime_start_name(ev);
			r->rec.at[TL_ARRIVE] = r->rec.at[TL_REQ_HEADERS] = r->rec.at[TL_DISPATCH] =
				r->rec.at[TL_REQ_SENT] = t->now;
		}
	} else if (t->pend == RT_OTHER || (turn_end(ev) && turn_end(t->pend))) {
		t->pend = ev;
		t->pend_ns = t->now;
	}
}

/* The server runs a response (response.created, a delta): the open one,
 * else one opened now from response.created, whose TTFT then starts
 * there. A delta with none open is not measured. */
static struct tunnel_resp *rt_running(struct tunnel *t, enum rt_event ev)
{
	if (!t->resp && ev == RT_CREATED)
		resp_open(t, t->now, RT_CREATED);
	if (t->resp)
		t->resp->running = true;
	return t->resp;
}

static void rt_message(struct tunnel *t, bool from_client, const struct tunnel_msg *m)
{
	struct usage u = USAGE_UNKNOWN;
	enum rt_event ev = realtime_event(m->buf ? m->buf : "", m->len, !m->cut, from_client, &u);
	struct tunnel_resp *r;

	switch (ev) {
	case RT_CREATE:
	case RT_COMMIT:
	case RT_SPEECH_STOPPED:
	case RT_COMMITTED: rt_start(t, ev); break;
	case RT_CREATED: (void)rt_running(t, ev); break;
	case RT_DELTA:
		if ((r = rt_running(t, ev)) != NULL)
			meter_token(&r->meter, TOKEN_ANSWER, t->now);
		break;
	case RT_DONE:
		if (t->resp) {
			t->resp->rec.usage = u;
			resp_finish(t, REQ_ERR_NONE);
		}
		if (t->pend != RT_OTHER) { /* a turn that ended while that one ran */
			resp_open(t, t->pend_ns, t->pend);
			t->pend = RT_OTHER;
		}
		break;
	case RT_ERROR:
		/* the server refused a client's request: a response it asked
		 * for that has not begun is not one (no record, no number) */
		if (from_client_event(t->pend))
			t->pend = RT_OTHER;
		else if (t->resp && !t->resp->running && from_client_event(t->resp->from)) {
			resp_free(t->resp);
			t->resp = NULL;
			t->nresp--; /* its number goes to the next one */
		}
		break;
	case RT_OTHER: break;
	}
}

static struct tunnel_msg *rt_msg(struct tunnel *t, bool from_client)
{
	return &t->msg[from_client ? 0 : 1];
}

static void rt_frame(struct tunnel *t, bool from_client, const struct wsf_frame *f)
{
	struct tunnel_msg *m = rt_msg(t, from_client);

	if ((f->opcode & 8) || !f->msg_first)
		return;
	m->len = 0;
	m->cut = false;
	m->text = f->msg_opcode == WSF_OP_TEXT && !f->msg_compressed;
}

static void rt_payload(struct tunnel *t, bool from_client, const struct wsf_frame *f, const uint8_t *p, size_t n)
{
	struct tunnel_msg *m = rt_msg(t, from_client);

	if ((f->opcode & 8) || !m->text)
		return;
	if (n > RT_MSG_MAX - m->len) {
		n = RT_MSG_MAX - m->len;
		m->cut = true;
	}
	if (m->len + n > m->cap) {
		size_t cap = m->cap ? m->cap : 4096;
		while (cap < m->len + n)
			cap *= 2;
		char *b = realloc(m->buf, cap);
		if (!b) {
			m->cut = true;
			return;
		}
		m->buf = b;
		m->cap = cap;
	}
	memcpy(m->buf + m->len, p, n);
	m->len += n;
}

static void rt_frame_end(struct tunnel *t, bool from_client, const struct wsf_frame *f)
{
	if (!(f->opcode & 8) && f->fin && rt_msg(t, from_client)->text)
		rt_message(t, from_client, rt_msg(t, from_client));
}

static void c2s_frame(void *arg, const struct wsf_frame *f)
{
	rt_frame(arg, true, f);
}
static void c2s_payload(void *arg, const struct wsf_frame *f, const uint8_t *p, size_t n)
{
	rt_payload(arg, true, f, p, n);
}
static void c2s_end(void *arg, const struct wsf_frame *f)
{
	rt_frame_end(arg, true, f);
}
static void s2c_frame(void *arg, const struct wsf_frame *f)
{
	rt_frame(arg, false, f);
}
static void s2c_payload(void *arg, const struct wsf_frame *f, const uint8_t *p, size_t n)
{
	rt_payload(arg, false, f, p, n);
}
static void s2c_end(void *arg, const struct wsf_frame *f)
{
	rt_frame_end(arg, false, f);
}

static const struct wsf_hooks c2s_hooks = { .frame = c2s_frame, .payload = c2s_payload, .frame_end = c2s_end };
static const struct wsf_hooks s2c_hooks = { .frame = s2c_frame, .payload = s2c_payload, .frame_end = s2c_end };

static struct upconn *tunnel_uc(const struct tunnel *t)
{
	return t->x->uc;
}

/* The upstream's output is back under the low watermark. */
static void on_tun_up_write(struct bufferevent *bev, void *arg)
{
	struct tunnel *t = arg;
	CHECK_OBJ(t, TUNNEL_MAGIC);
	(void)bev;

	if (t->client_paused && !t->ended) {
		t->client_paused = false;
		bufferevent_setwatermark(tunnel_uc(t)->bev, EV_WRITE, 0, 0);
		t->hooks->client_reading(t->owner, true);
		tunnel_client_input(t);
	}
}

/* The bytes moved in p's direction end on a frame boundary: between
 * frames, or stopped before a bad frame whose header all came in the read
 * that broke off (wsf_feed). */
static bool moved_at_boundary(const struct wsf_parser *p)
{
	return p->err ? !p->err_split : wsf_at_boundary(p);
}

/* A close frame of tokentap's to each side whose stream stands at a frame
 * boundary (the violating one's: where its bytes stopped being moved). */
static void tunnel_close_frames(struct tunnel *t, uint16_t code, const char *reason, bool client_ok, bool up_ok)
{
	uint8_t fr[WSF_HEADER_MAX + WSF_CONTROL_MAX];
	size_t n;

	if (client_ok && moved_at_boundary(&t->s2c)) {
		struct evbuffer *b = evbuffer_new();
		n = wsf_close_frame(fr, code, reason, NULL);
		if (b && evbuffer_add(b, fr, n) == 0)
			t->hooks->to_client(t->owner, b, n);
		if (b)
			evbuffer_free(b);
	}
	if (up_ok && moved_at_boundary(&t->c2s) && tunnel_uc(t)) {
		uint8_t mask[4];
		uint32_t m = t->mask_seed = t->mask_seed * 1664525u + 1013904223u;
		memcpy(mask, &m, 4);
		n = wsf_close_frame(fr, code, reason, mask);
		(void)bufferevent_write(tunnel_uc(t)->bev, fr, n); /* written out by tunnel_end */
	}
}

/* One direction broke a rule: both sides told (where they can be), the
 * tunnel ended. */
static void tunnel_violation(struct tunnel *t, bool from_client)
{
	const struct wsf_parser *p = from_client ? &t->c2s : &t->s2c;
	char reason[WSF_CONTROL_MAX], why[200];

	snprintf(reason, sizeof(reason), "tokentap: %s", wsf_error_name(p->err));
	snprintf(why, sizeof(why), "WebSocket %s: %s", from_client ? "client" : "upstream", wsf_error_name(p->err));
	log_conn(LOG_INFO, t->x->log_id, "%s; closing the tunnel", why);
	/* the violator's own stream stopped before the bad frame, unless its
	 * header began in a read already moved */
	tunnel_close_frames(t, wsf_error_close_code(p->err), reason, true, true);
	tunnel_end(t, from_client ? REQ_ERR_BAD_REQUEST : REQ_ERR_UPSTREAM_PROTOCOL, why);
}

void tunnel_client_input(struct tunnel *t)
{
	CHECK_OBJ(t, TUNNEL_MAGIC);
	struct evbuffer *in = t->client_in;

	if (t->ended) {
		evbuffer_drain(in, evbuffer_get_length(in));
		return;
	}
	struct upconn *uc = tunnel_uc(t);
	struct evbuffer *out = bufferevent_get_output(uc->bev);
	size_t moved = 0;
	t->now = clock_now_ns();
	while (evbuffer_get_length(in)) {
		struct evbuffer_iovec v;
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		size_t took = wsf_feed(&t->c2s, v.iov_base, v.iov_len, NULL);
		if (took) {
			evbuffer_remove_buffer(in, out, took);
			moved += took;
		}
		if (t->c2s.err) {
			t->x->rec->bytes_in += moved;
			upconn_writing(uc);
			tunnel_violation(t, true);
			return;
		}
	}
	if (!moved)
		return;
	t->x->rec->bytes_in += moved;
	t->last_ns = clock_now_ns();
	upconn_writing(uc);
	if (!t->client_paused && evbuffer_get_length(out) > STREAM_BUFFER) {
		t->client_paused = true;
		t->hooks->client_reading(t->owner, false);
		bufferevent_setwatermark(uc->bev, EV_WRITE, STREAM_BUFFER / 2, 0);
	}
}

/* Moves what the upstream sent. True: the tunnel ended there, and `t` may
 * be gone with its request (the end hook closes the client). */
static bool tunnel_up_input(struct tunnel *t)
{
	struct upconn *uc = tunnel_uc(t);
	struct evbuffer *in = bufferevent_get_input(uc->bev);
	size_t moved = 0;

	t->now = clock_now_ns();
	while (!t->ended && evbuffer_get_length(in)) {
		struct evbuffer_iovec v;
		if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
			break;
		size_t took = wsf_feed(&t->s2c, v.iov_base, v.iov_len, NULL);
		if (took) {
			t->hooks->to_client(t->owner, in, took);
			moved += took;
		}
		if (t->s2c.err) {
			t->x->rec->bytes_out += moved;
			tunnel_violation(t, false);
			return true;
		}
	}
	if (!moved)
		return false;
	t->x->rec->bytes_out += moved;
	t->last_ns = clock_now_ns();
	if (!t->up_paused && t->hooks->client_backlog(t->owner) > STREAM_BUFFER) {
		t->up_paused = true;
		upconn_reading(uc, false, 0);
		t->hooks->client_want_drain(t->owner, STREAM_BUFFER / 2);
	}
	return false;
}

static void on_tun_up_read(struct bufferevent *bev, void *arg)
{
	struct tunnel *t = arg;
	CHECK_OBJ(t, TUNNEL_MAGIC);
	(void)bev;

	if (!t->ended && !t->up_paused)
		(void)tunnel_up_input(t);
}

static void on_tun_up_event(struct bufferevent *bev, short what, void *arg)
{
	struct tunnel *t = arg;
	CHECK_OBJ(t, TUNNEL_MAGIC);
	(void)bev;

	if (t->ended || (what & BEV_EVENT_CONNECTED))
		return;
	/* what the upstream sent before its close goes first */
	if (!t->up_paused && tunnel_up_input(t))
		return;
	bool clean = (what & BEV_EVENT_EOF) && wsf_at_boundary(&t->s2c);
	tunnel_end(t, clean ? REQ_ERR_NONE : REQ_ERR_UPSTREAM_RESET,
		   clean ? "upstream closed the WebSocket" : "upstream connection cut inside a WebSocket frame");
}

void tunnel_client_drained(struct tunnel *t)
{
	CHECK_OBJ(t, TUNNEL_MAGIC);

	if (!t->up_paused || t->ended)
		return;
	t->up_paused = false;
	t->hooks->client_want_drain(t->owner, 0);
	upconn_reading(tunnel_uc(t), true, 0);
	(void)tunnel_up_input(t);
}

void tunnel_client_closed(struct tunnel *t, bool error)
{
	CHECK_OBJ(t, TUNNEL_MAGIC);

	if (t->ended)
		return;
	bool clean = !error && wsf_at_boundary(&t->c2s);
	tunnel_end(t, clean ? REQ_ERR_NONE : REQ_ERR_CLIENT_ABORTED,
		   clean ? "client closed the WebSocket" : "client connection cut inside a WebSocket frame");
}

/* The timer: whichever deadline is due first. */
static void tunnel_arm(struct tunnel *t, uint64_t now)
{
	uint64_t due = 0;

	if (t->conf.idle_ms)
		due = t->last_ns + t->conf.idle_ms * 1000000u;
	if (t->conf.session_ms) {
		uint64_t s = t->started_ns + t->conf.session_ms * 1000000u;
		if (!due || s < due)
			due = s;
	}
	if (due)
		loop_timer_arm(t->timer, due > now ? (due - now + 999999u) / 1000000u : 0);
}

static void on_tun_timer(evutil_socket_t fd, short what, void *arg)
{
	struct tunnel *t = arg;
	CHECK_OBJ(t, TUNNEL_MAGIC);
	uint64_t now = clock_now_ns();
	char why[120];
	(void)fd;
	(void)what;

	if (t->ended)
		return;
	if (t->conf.session_ms && now >= t->started_ns + t->conf.session_ms * 1000000u) {
		snprintf(why, sizeof(why), "WebSocket session over its %llu ms deadline",
			 (unsigned long long)t->conf.session_ms);
		tunnel_close_frames(t, 1008, "tokentap: session deadline", true, true);
	} else if (t->conf.idle_ms && now >= t->last_ns + t->conf.idle_ms * 1000000u) {
		snprintf(why, sizeof(why), "WebSocket idle for %llu ms", (unsigned long long)t->conf.idle_ms);
		tunnel_close_frames(t, 1008, "tokentap: idle timeout", true, true);
	} else {
		tunnel_arm(t, now);
		return;
	}
	log_conn(LOG_INFO, t->x->log_id, "%s; closing the tunnel", why);
	tunnel_end(t, REQ_ERR_TIMEOUT, why);
}

/* Ends the tunnel: the upstream connection closed and its slot back, the
 * record's outcome, then the owner closes the client (after writing what
 * is queued for it). */
static void tunnel_end(struct tunnel *t, enum req_error kind, const char *why)
{
	if (t->ended)
		return;
	t->ended = true;
	evtimer_del(t->timer);
	t->now = clock_now_ns();
	resp_finish(t, REQ_ERR_RESPONSE_INCOMPLETE); /* a response left open: no response.done came */
	if (kind != REQ_ERR_NONE && t->x->rec->error == REQ_ERR_NONE)
		t->x->rec->error = kind;
	/* the session's end, not the 101's (meter_complete marked that) */
	t->x->rec->at[TL_RESP_END] = clock_now_ns();
	/* what is queued for the upstream (a close frame of tokentap's among
	 * it) goes out before its connection closes: as much as the socket
	 * takes now */
	if (t->x->uc) {
		struct evbuffer *out = bufferevent_get_output(t->x->uc->bev);
		for (int i = 0; i < 16 && evbuffer_get_length(out); i++)
			if (evbuffer_write(out, bufferevent_getfd(t->x->uc->bev)) <= 0)
				break;
	}
	exchange_release(t->x, false);
	t->hooks->end(t->owner, why);
}

static const struct wsf_limits *tunnel_limits(const struct tunnel_conf *c, struct wsf_limits *l)
{
	l->max_frame = c->max_frame;
	l->max_message = c->max_message;
	return l;
}

int tunnel_start(struct tunnel *t, struct event_base *base, const struct tunnel_conf *conf,
		 const struct tunnel_hooks *hooks, void *owner, struct exchange *x, struct evbuffer *client_in)
{
	struct wsf_limits lim;

	memset(t, 0, sizeof(*t));
	OBJ_MAGIC_SET(t, TUNNEL_MAGIC);
	t->hooks = hooks;
	t->owner = owner;
	t->x = x;
	t->client_in = client_in;
	t->conf = *conf;
	t->timer = evtimer_new(base, on_tun_timer, t);
	if (!t->timer)
		return -1;
	t->started_ns = t->last_ns = clock_now_ns();
	t->mask_seed = (uint32_t)(t->started_ns ^ (uintptr_t)t);
	t->realtime = x->rec->api == API_REALTIME;
	wsf_init(&t->c2s, true, tunnel_limits(conf, &lim), t->realtime ? &c2s_hooks : NULL, t);
	wsf_init(&t->s2c, false, &lim, t->realtime ? &s2c_hooks : NULL, t);
	t->running = true;
	struct upconn *uc = x->uc;
	upconn_set_direct(uc, NULL, NULL);
	bufferevent_setcb(uc->bev, on_tun_up_read, on_tun_up_write, on_tun_up_event, t);
	bufferevent_setwatermark(uc->bev, EV_WRITE, 0, 0);
	upconn_priority(uc, LOOP_PRIO_STREAM);
	upconn_reading(uc, true, 0);
	tunnel_arm(t, t->started_ns);
	/* frames that came with the 101, then those the client sent early
	 * (either may end the tunnel, and free it: nothing after) */
	if (!tunnel_up_input(t))
		tunnel_client_input(t);
	return 0;
}

void tunnel_free(struct tunnel *t)
{
	if (t->resp) {
		t->now = clock_now_ns();
		resp_finish(t, REQ_ERR_CLIENT_ABORTED);
	}
	for (int i = 0; i < 2; i++) {
		free(t->msg[i].buf);
		t->msg[i].buf = NULL;
	}
	if (t->timer)
		event_free(t->timer);
	t->timer = NULL;
	t->running = false;
}
