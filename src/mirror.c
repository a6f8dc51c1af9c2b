/*
 * mirror.c — one shadow exchange: send the copied request, read and measure
 * the response, drop its bytes.
 */
#include "mirror.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#include "accesslog.h"
#include "classify.h"
#include "framer.h"
#include "log.h"
#include "loop.h"
#include "respparse.h"
#include "stats.h"
#include "timeline.h"
#include "upstream.h"

enum mirror_timer { MT_CONNECT, MT_FIRST_BYTE, MT_IDLE };

struct mirror {
	struct mirror_env env;
	struct mirror *next, *prev; /* in env.list */
	struct upstream *up;
	char route[128];
	struct upconn *uc;
	struct req_record rec;
	struct evbuffer *pending; /* request bytes until connected */
	struct respparse rp;	  /* the same parser and rules as a primary's */
	struct framer framer;
	bool keepalive;
	struct event *timer;
	enum mirror_timer timer_kind;
	struct mirror **owner;
	bool detached, body_complete;
	uint64_t now;
	uint64_t itl_run_gap, itl_run_n; /* equal ITL gaps not yet recorded */
	unsigned inflight;		 /* requests on the upstream when admitted, this one included */
};

static void timer_set(struct mirror *m, enum mirror_timer kind, uint64_t ms)
{
	m->timer_kind = kind;
	loop_timer_arm(m->timer, ms);
}

static struct series *mirror_series(struct mirror *m)
{
	return stats_series(m->env.stats, m->route, m->up->name, m->rec.model, false,
			    m->rec.status >= 200 && m->rec.status < 300);
}

/* The events of one read share a clock reading: their gaps (mostly 0 at a
 * high event rate) are recorded as a run, once per read, as a primary's. */
static void mirror_flush_itl(struct mirror *m)
{
	if (m->itl_run_n)
		stats_record_itl_n(mirror_series(m), m->itl_run_gap, m->inflight, m->itl_run_n);
	m->itl_run_n = 0;
}

/* Ends the shadow exchange: measured (unless skipped), then freed. */
static void mirror_end(struct mirror *m, enum req_error err, bool record)
{
	mirror_flush_itl(m);
	if (err != REQ_ERR_NONE && m->rec.error == REQ_ERR_NONE)
		m->rec.error = err;
	if (record) {
		stats_record_request(mirror_series(m), &m->rec, m->inflight);
		if (m->rec.error != REQ_ERR_NONE)
			m->up->errors[m->rec.error]++;
		m->up->requests++;
		accesslog_write(m->env.alog, &m->rec);
	}
	if (m->uc)
		upstream_release(m->uc, m->rp.done && m->keepalive && m->body_complete && err == REQ_ERR_NONE);
	upstream_leave(m->up);
	upstream_free(m->up); /* the mirror's own reference */
	if (m->owner && !m->detached)
		*m->owner = NULL;
	if (m->prev)
		m->prev->next = m->next;
	else if (m->env.list && m->env.list->head == m)
		m->env.list->head = m->next;
	if (m->next)
		m->next->prev = m->prev;
	framer_free(&m->framer);
	record_release(&m->rec);
	evbuffer_free(m->pending);
	event_free(m->timer);
	free(m);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct mirror *m = arg;
	log_debug("mirror %s to %s: timed out", m->rec.id, m->up->name);
	mirror_end(m, m->timer_kind == MT_CONNECT ? REQ_ERR_CONNECT_FAILED : REQ_ERR_TIMEOUT, true);
}

static void on_event_frame(void *arg, const struct framer_event *ev)
{
	struct mirror *m = arg;
	uint64_t gap;

	m->rec.events++;
	timeline_mark(&m->rec, TL_FIRST_EVENT, m->now);
	enum token_kind kind = classify_event(m->rec.api, ev, &m->rec.usage, &m->rec.hint);
	if (kind != TOKEN_NONE && record_token_event(&m->rec, kind, m->now, &gap)) {
		if (m->itl_run_n && gap != m->itl_run_gap)
			mirror_flush_itl(m);
		m->itl_run_gap = gap;
		m->itl_run_n++;
	}
}

/* ---- the response, through respparse's hooks ---- */

static void on_resp_head(void *arg, const struct respparse *rp)
{
	struct mirror *m = arg;

	m->rec.status = rp->status;
	timeline_mark(&m->rec, TL_RESP_HEADERS, m->now);
	timer_set(m, MT_IDLE, m->up->idle_timeout_ms);
	if (rp->kind != FRAMER_NONE) {
		m->rec.stream = 1;
		framer_init(&m->framer, rp->kind, m->env.max_event_size, on_event_frame, m);
	}
}

static void on_resp_body(void *arg, const char *at, size_t len)
{
	struct mirror *m = arg;

	if (m->rp.kind != FRAMER_NONE)
		framer_feed(&m->framer, at, len);
}

static void on_resp_complete(void *arg, bool keep_alive)
{
	struct mirror *m = arg;

	timeline_mark(&m->rec, TL_RESP_END, m->now);
	timeline_mark(&m->rec, TL_CLIENT_DONE, m->now); /* nothing to deliver */
	if (m->rp.kind != FRAMER_NONE)
		framer_finish(&m->framer);
	record_apply_outcome(&m->rec);
	m->keepalive = keep_alive;
}

static const struct respparse_hooks resp_hooks = { on_resp_head, on_resp_body, on_resp_complete };

static void on_read(struct bufferevent *bev, void *arg)
{
	struct mirror *m = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v;
	size_t n;

	m->now = clock_now_ns();
	if (m->rp.head_done)
		timer_set(m, MT_IDLE, m->up->idle_timeout_ms);
	while (!m->rp.done && evbuffer_peek(in, -1, NULL, &v, 1) == 1) {
		size_t used;
		enum respparse_status rs = respparse_feed(&m->rp, v.iov_base, v.iov_len, &used);
		if (rs == RESPPARSE_INVALID || rs == RESPPARSE_SWITCHING) {
			mirror_end(m, REQ_ERR_UPSTREAM_PROTOCOL, true);
			return;
		}
		m->rec.bytes_out += used;
		evbuffer_drain(in, used); /* measured, then dropped */
		if (rs == RESPPARSE_DONE)
			break;
	}
	mirror_flush_itl(m);
	/* the bytes are dropped, not forwarded: take only bounds the head */
	if (respparse_take(&m->rp, &n) == RESPPARSE_HEAD_TOO_LARGE) {
		mirror_end(m, REQ_ERR_UPSTREAM_PROTOCOL, true);
		return;
	}
	if (m->rp.done) {
		if (evbuffer_get_length(in))
			m->keepalive = false;
		mirror_end(m, REQ_ERR_NONE, true);
	}
}

static void check_sent(struct mirror *m)
{
	if (m->body_complete && m->uc && m->uc->connected && !m->rec.at[TL_REQ_SENT] &&
	    !evbuffer_get_length(m->pending) && !evbuffer_get_length(bufferevent_get_output(m->uc->bev))) {
		timeline_mark(&m->rec, TL_REQ_SENT, clock_now_ns());
		if (!m->rp.head_done)
			timer_set(m, MT_FIRST_BYTE, m->up->first_byte_timeout_ms);
	}
}

static void on_write(struct bufferevent *bev, void *arg)
{
	check_sent(arg);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct mirror *m = arg;

	if (what & BEV_EVENT_CONNECTED) {
		m->uc->connected = true;
		timeline_mark(&m->rec, TL_UP_CONNECTED, clock_now_ns());
		evtimer_del(m->timer);
		bufferevent_enable(bev, EV_WRITE);
		upconn_reading(m->uc, true, 0);
		evbuffer_add_buffer(bufferevent_get_output(bev), m->pending);
		check_sent(m);
		return;
	}
	if ((what & BEV_EVENT_EOF) && m->rp.head_done && !m->rp.done && respparse_needs_eof(&m->rp)) {
		m->now = clock_now_ns();
		respparse_finish(&m->rp);
		if (m->rp.done) {
			m->keepalive = false;
			mirror_end(m, REQ_ERR_NONE, true);
			return;
		}
	}
	mirror_end(m, m->uc->connected ? REQ_ERR_UPSTREAM_RESET : REQ_ERR_CONNECT_FAILED, true);
}

struct mirror *mirror_start(const struct mirror_env *env, struct upstream *up, const char *route,
			    unsigned max_in_flight, const struct req_record *primary, struct evbuffer *bytes,
			    struct mirror **owner)
{
	struct up_waiter w = { 0 };
	struct mirror *m;
	bool reused = false;
	unsigned running = upstream_inflight(up);

	/* a shadow never waits: a full upstream skips it, and so does one
	 * already holding max_in_flight (a slow shadow would otherwise gather
	 * connections and request bytes without bound) */
	if ((up->conf.max_concurrency && running >= up->conf.max_concurrency) || running >= max_in_flight) {
		up->rejected++;
		return NULL;
	}
	switch (upstream_admit(up, &w)) {
	case ADMIT_NOW: break;
	case ADMIT_QUEUED: upstream_cancel(up, &w); return NULL; /* w lives on this stack */
	case ADMIT_FULL: return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m || !(m->pending = evbuffer_new()) || !(m->timer = evtimer_new(env->base, on_timer, m))) {
		if (m)
			evbuffer_free(m->pending);
		free(m);
		upstream_leave(up);
		return NULL;
	}
	m->env = *env;
	m->inflight = upstream_inflight(up); /* a shadow never queues: admitted on arrival */
	upstream_ref(up);
	if (env->list) {
		m->next = env->list->head;
		if (m->next)
			m->next->prev = m;
		env->list->head = m;
	}
	m->up = up;
	snprintf(m->route, sizeof(m->route), "%s", route);
	m->owner = owner;
	memcpy(m->rec.id, primary->id, sizeof(m->rec.id));
	memcpy(m->rec.method, primary->method, sizeof(m->rec.method));
	memcpy(m->rec.path, primary->path, sizeof(m->rec.path));
	memcpy(m->rec.model, primary->model, sizeof(m->rec.model));
	m->rec.api = primary->api;
	m->rec.stream = primary->stream;
	m->rec.upstream = up->name;
	m->rec.mirror = true;
	m->rec.itl_keep = m->env.alog != NULL;
	m->rec.usage = USAGE_UNKNOWN;
	/* the shadow's clock starts when the client's request did: its ttft
	 * compares with the primary's on the same footing */
	m->rec.at[TL_ARRIVE] = primary->at[TL_ARRIVE];
	m->rec.at[TL_REQ_HEADERS] = primary->at[TL_REQ_HEADERS];
	m->rec.at[TL_DISPATCH] = clock_now_ns();
	respparse_init(&m->rp, &resp_hooks, m);
	m->rp.head_request = strcmp(m->rec.method, "HEAD") == 0;
	evbuffer_add_buffer(m->pending, bytes); /* the caller built it for us: moved */
	m->rec.bytes_in = evbuffer_get_length(m->pending);

	m->uc = upstream_acquire(up, &reused);
	if (!m->uc) {
		mirror_end(m, REQ_ERR_CONNECT_FAILED, true);
		return NULL;
	}
	bufferevent_setcb(m->uc->bev, on_read, on_write, on_event, m);
	bufferevent_setwatermark(m->uc->bev, EV_WRITE, 0, 0);
	upconn_priority(m->uc, LOOP_PRIO_STREAM); /* a shadow never goes before the primaries */
	if (reused) {
		m->rec.at[TL_UP_CONNECTED] = m->rec.at[TL_DISPATCH];
		upconn_writing(m->uc);
		upconn_reading(m->uc, true, 0);
		evbuffer_add_buffer(bufferevent_get_output(m->uc->bev), m->pending);
	} else {
		timer_set(m, MT_CONNECT, up->connect_timeout_ms);
	}
	return m;
}

void mirror_feed(struct mirror *m, const void *data, size_t len)
{
	struct evbuffer *out = m->uc && m->uc->connected ? bufferevent_get_output(m->uc->bev) : m->pending;

	if (evbuffer_get_length(out) + len > MIRROR_PENDING_MAX) {
		/* behind by a megabyte: let it go rather than buffer more */
		log_debug("mirror %s to %s: fell behind; abandoned", m->rec.id, m->up->name);
		m->up->rejected++;
		mirror_end(m, REQ_ERR_CLIENT_ABORTED, false);
		return;
	}
	evbuffer_add(out, data, len);
	m->rec.bytes_in += len;
}

void mirror_abort_all(struct mirror_list *list)
{
	while (list->head)
		mirror_end(list->head, REQ_ERR_CLIENT_ABORTED, false);
}

void mirror_body_done(struct mirror *m)
{
	m->body_complete = true;
	check_sent(m);
}

void mirror_detach(struct mirror *m, bool complete)
{
	m->detached = true;
	m->body_complete = complete;
	if (!complete) {
		mirror_end(m, REQ_ERR_CLIENT_ABORTED, true);
		return;
	}
	check_sent(m);
}
