/*
 * mirror.c — the owner of one shadow exchange: the copy of the request as
 * it arrives, the slot rule (never queued, at most max_in_flight), the
 * detachment from its primary, the abandonment of a shadow that falls
 * behind, and the record at its end. Connecting, sending, reading and
 * measuring the response are the exchange's (exchange.c, `shadow`), whose
 * hooks here count the response's bytes and drop them.
 */
#include "mirror.h"

#include <event2/buffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "exchange.h"
#include "log.h"
#include "meter.h"
#include "timeline.h"
#include "upstream.h"

#define MIRROR_MAGIC 0x4d495252u /* "MIRR" */
struct mirror {
	OBJ_MAGIC_FIELD
	struct mirror_list *list;
	struct mirror *next, *prev; /* in list */
	struct upstream *up;	    /* one reference of the mirror's own */
	char route[128];
	struct req_record rec;
	struct exchange x; /* the shadow exchange: rec measured through x.meter */
	struct mirror **owner;
	bool detached;
};

/* Ends the shadow: recorded (unless abandoned or shut down), then freed.
 * An unrecorded end comes between reads, with no ITL run left unrecorded. */
static void mirror_end(struct mirror *m, enum req_error err, bool record)
{
	if (err != REQ_ERR_NONE && m->rec.error == REQ_ERR_NONE)
		m->rec.error = err;
	if (record)
		if (meter_finish(&m->x.meter))
			upstream_count_outcome(m->up, &m->rec);
	exchange_free(&m->x); /* the connection and the slot go back */
	upstream_free(m->up);
	if (m->owner && !m->detached)
		*m->owner = NULL;
	if (m->prev)
		m->prev->next = m->next;
	else if (m->list && m->list->head == m)
		m->list->head = m->next;
	if (m->next)
		m->next->prev = m->prev;
	record_release(&m->rec);
	OBJ_MAGIC_CLEAR(m);
	free(m);
}

/* ---- the shadow exchange's hooks (exchange.h): measured, then dropped ---- */

static enum xr mh_forward(void *owner, const struct xsrc *src, size_t n)
{
	(void)owner;
	if (src->buf)
		evbuffer_drain(src->buf, n); /* counted in bytes_out by the exchange */
	return XR_OK;
}

static size_t mh_backlog(void *owner, bool deep)
{
	(void)owner;
	(void)deep;
	return 0; /* nobody to wait for: the exchange never pauses */
}

static void mh_want_drain(void *owner, size_t low)
{
	(void)owner;
	(void)low;
}

/* The copy's bound is MIRROR_PENDING_MAX (mirror_feed), not the upload
 * pause: the primary's client is never held back for its shadow. */
static enum xr mh_upload(void *owner, bool on)
{
	(void)owner;
	(void)on;
	return XR_OK;
}

static void mh_fail(void *owner, enum xfail why, const char *msg)
{
	struct mirror *m = owner;

	CHECK_OBJ(m, MIRROR_MAGIC);
	log_debug("mirror %s to %s: %s", m->rec.id, m->up->name, msg);
	mirror_end(m, exchange_fails[why].shadow_kind, true);
}

static void mh_done(void *owner)
{
	struct mirror *m = owner;

	CHECK_OBJ(m, MIRROR_MAGIC);
	timeline_mark(&m->rec, TL_CLIENT_DONE, m->x.meter.now); /* nothing to deliver */
	mirror_end(m, REQ_ERR_NONE, true);
}

static const struct exchange_hooks mirror_xhooks = {
	.forward = mh_forward,
	.backlog = mh_backlog,
	.want_drain = mh_want_drain,
	.upload = mh_upload,
	.fail = mh_fail,
	.done = mh_done,
};

struct mirror *mirror_start(const struct mirror_env *env, struct upstream *up, const char *route,
			    unsigned max_in_flight, struct meter *primary, const struct reqhead *head,
			    struct evbuffer *bytes, struct mirror **owner)
{
	struct mirror *m;
	unsigned running = upstream_inflight(up);

	/* a shadow never waits: a full upstream skips it, and so does one
	 * already holding max_in_flight (a slow shadow would otherwise gather
	 * connections and request bytes without bound) */
	if ((up->conf.max_concurrency && running >= up->conf.max_concurrency) || running >= max_in_flight) {
		up->rejected++;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	OBJ_MAGIC_SET(m, MIRROR_MAGIC);
	bool made = exchange_init(&m->x, env->x, &mirror_xhooks, m, &m->rec, NULL, NULL, env->log_id, true) == 0 &&
		    evbuffer_add_buffer(m->x.pending, bytes) == 0; /* the caller built it for us: moved */
	if (!made || !upstream_try_admit(up)) {
		if (made)
			up->rejected++; /* no slot free at once: others wait for one */
		exchange_free(&m->x);
		OBJ_MAGIC_CLEAR(m);
		free(m);
		return NULL;
	}
	upstream_ref(up);
	m->up = up;
	m->list = env->list;
	if (m->list) {
		m->next = m->list->head;
		if (m->next)
			m->next->prev = m;
		m->list->head = m;
	}
	snprintf(m->route, sizeof(m->route), "%s", route);
	m->owner = owner;
	meter_record_shadow(&m->rec, primary->rec);
	m->rec.itl_keep = env->x->meter.alog != NULL;
	m->rec.bytes_in = evbuffer_get_length(m->x.pending);
	meter_pair(primary, &m->x.meter);
	meter_label(&m->x.meter, m->route, up->name, false, upstream_inflight(up));
	/* a failure here ran mh_fail: the mirror is gone */
	if (exchange_shadow_start(&m->x, up, head->method, head->http10) == XR_ENDED)
		return NULL;
	return m;
}

/* Lets the shadow go, unrecorded: it fell behind, or a copy failed. */
static void mirror_abandon(struct mirror *m, const char *why)
{
	log_debug("mirror %s to %s: %s; abandoned", m->rec.id, m->up->name, why);
	mirror_end(m, REQ_ERR_CLIENT_ABORTED, false);
}

void mirror_feed(struct mirror *m, const void *data, size_t len)
{
	if (exchange_upload_waiting(&m->x) + len > MIRROR_PENDING_MAX) {
		/* behind by a megabyte: let it go rather than buffer more */
		m->up->rejected++;
		mirror_abandon(m, "fell behind");
		return;
	}
	if (evbuffer_add(m->x.pending, data, len) == -1) {
		mirror_abandon(m, "out of memory copying the request");
		return;
	}
	m->rec.bytes_in += len;
}

void mirror_flush(struct mirror *m)
{
	(void)exchange_flush(&m->x); /* may end it: out of memory, the fail hook */
}

void mirror_abort_all(struct mirror_list *list)
{
	while (list->head)
		mirror_end(list->head, REQ_ERR_CLIENT_ABORTED, false);
}

void mirror_body_done(struct mirror *m)
{
	m->x.body_done = true;
	exchange_check_sent(&m->x);
}

void mirror_detach(struct mirror *m, bool complete)
{
	m->detached = true;
	if (!complete) {
		mirror_end(m, REQ_ERR_CLIENT_ABORTED, true);
		return;
	}
	mirror_body_done(m);
}
