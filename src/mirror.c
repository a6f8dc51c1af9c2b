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

#include "log.h"
#include "loop.h"
#include "meter.h"
#include "respparse.h"
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
	struct meter meter;	  /* and the same measuring */
	bool keepalive;
	struct event *timer;
	enum mirror_timer timer_kind;
	struct mirror **owner;
	bool detached, body_complete;
};

static void timer_set(struct mirror *m, enum mirror_timer kind, uint64_t ms)
{
	m->timer_kind = kind;
	loop_timer_arm(m->timer, ms);
}

/* Ends the shadow exchange: recorded (unless skipped), then freed. An
 * unrecorded end comes between reads, with no ITL run left unrecorded. */
static void mirror_end(struct mirror *m, enum req_error err, bool record)
{
	if (err != REQ_ERR_NONE && m->rec.error == REQ_ERR_NONE)
		m->rec.error = err;
	if (record)
		meter_finish(&m->meter, m->up);
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
	meter_free(&m->meter);
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

/* ---- the response, through respparse's hooks: the meter's, then ours ---- */

/* The hooks' `arg` is the mirror's meter. */
static struct mirror *meter_mirror(void *meter)
{
	return (struct mirror *)((char *)meter - offsetof(struct mirror, meter));
}

static void on_resp_head(void *arg, const struct respparse *rp)
{
	struct mirror *m = meter_mirror(arg);

	meter_head(&m->meter, rp);
	timer_set(m, MT_IDLE, m->up->idle_timeout_ms);
}

static void on_resp_complete(void *arg, bool keep_alive)
{
	struct mirror *m = meter_mirror(arg);

	meter_complete(&m->meter);
	timeline_mark(&m->rec, TL_CLIENT_DONE, m->meter.now); /* nothing to deliver */
	m->keepalive = keep_alive;
}

static const struct respparse_hooks resp_hooks = { on_resp_head, meter_resp_body, on_resp_complete };

static void on_read(struct bufferevent *bev, void *arg)
{
	struct mirror *m = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v;
	size_t n;

	meter_read_begin(&m->meter, clock_now_ns());
	if (m->rp.head_done)
		timer_set(m, MT_IDLE, m->up->idle_timeout_ms);
	while (!m->rp.done && evbuffer_peek(in, -1, NULL, &v, 1) == 1) {
		size_t used;
		enum respparse_status rs = respparse_feed(&m->rp, v.iov_base, v.iov_len, &used);
		if (rs == RESPPARSE_INVALID || rs == RESPPARSE_SWITCHING) {
			mirror_end(m, REQ_ERR_UPSTREAM_PROTOCOL, true);
			return;
		}
		evbuffer_drain(in, used); /* measured, then dropped */
		if (rs == RESPPARSE_DONE)
			break;
	}
	meter_read_end(&m->meter);
	/* the bytes are dropped, not forwarded: take only bounds the head */
	if (respparse_take(&m->rp, &n) == RESPPARSE_HEAD_TOO_LARGE) {
		mirror_end(m, REQ_ERR_UPSTREAM_PROTOCOL, true);
		return;
	}
	m->rec.bytes_out += n; /* what a primary would have handed its client */
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
		meter_read_begin(&m->meter, clock_now_ns());
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
			    unsigned max_in_flight, struct meter *primary, struct evbuffer *bytes,
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
	unsigned load = upstream_inflight(up); /* a shadow never queues: admitted on arrival */
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
	meter_record_shadow(&m->rec, primary->rec);
	m->rec.upstream = up->name;
	m->rec.itl_keep = m->env.alog != NULL;
	m->rec.at[TL_DISPATCH] = clock_now_ns();
	respparse_init(&m->rp, &resp_hooks, &m->meter);
	const struct meter_env menv = { env->stats, env->alog, NULL };
	meter_init(&m->meter, &menv, &m->rec, &m->rp, env->max_event_size, true);
	meter_pair(primary, &m->meter);
	meter_label(&m->meter, m->route, up->name, false, load);
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
