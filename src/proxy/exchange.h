/*
 * exchange.h — one exchange with an upstream: routing, admission,
 * connecting (with failover and replay), sending the request and reading
 * the response through the meter. The exchange reaches whoever owns it (the
 * client's request, client.c; a shadow copy's mirror, mirror.c) only
 * through the hooks table below: it includes nothing above it and reads no
 * field of its owner.
 *
 * A shadow exchange (`shadow` at exchange_init) must never delay or fail
 * its primary, and its traffic is not the upstream's own, so it differs
 * from a primary's: it is routed by its owner, which hands it an upstream
 * whose slot it took and the whole request head in `pending`: no queueing, no failover, no cold
 * tracking (upstream_note_result), the streams' loop priority from the start
 * and its bytes written by the bufferevent, never in the primary's turn (a
 * shadow never goes before a primary), a connect timeout counted as the
 * failure to connect (EXCHANGE_FAILS' shadow column).
 *
 * Lifetime rules:
 *
 * - The exchange never frees itself. Its owner frees it (exchange_free),
 *   which accepts a zeroed exchange and is safe twice.
 * - The `fail` and `done` hooks may free the exchange (the client closes,
 *   or finishes and frees the request). The exchange calls them last and
 *   returns at once; every exchange function that may call them returns
 *   `enum xr`, XR_ENDED when it did, so that a caller up the stack knows
 *   not to touch the exchange again. `forward` and `upload` return the same
 *   (XR_ENDED: the owner ended the exchange, and may have freed it).
 * - `forward`, `backlog` and `want_drain` never end it by themselves
 *   (`forward` returns XR_ENDED when it had to).
 */
#pragma once

#include <event2/util.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "loop.h"
#include "meter.h"
#include "reqparse.h"
#include "respparse.h"
#include "router.h"
#include "timeline.h"
#include "upstream.h"

struct event;
struct event_base;
struct evbuffer;
struct route;
struct router;

/*
 * The exchange's states (exchange.c: exchange_set_state is the one place
 * they change, checked against a table of the legal transitions), each with
 * the timer it runs on x->timer, XT_NONE when it runs none. The setter
 * arms or deletes the timer from the state: a state whose timer differs from
 * the one before deletes it and arms its own; STREAMING <-> PAUSED leaves the
 * idle clock running. An admission slot on x->up is held exactly in
 * CONNECTING, SENDING, AWAIT_HEAD, STREAMING, PAUSED and TUNNEL.
 */
#define EXCHANGE_STATES(X) \
	X(NEW, XT_NONE)		     /* made with its request; nothing asked of any upstream */ \
	X(AWAIT_BODY, XT_NONE)	     /* routing needs the body prefix: the model or a sticky JSON field */ \
	X(AWAIT_CHUNK, XT_NONE)	     /* chunked body: routing waits for a valid first chunk line */ \
	X(ROUTING, XT_NONE)	     /* choosing route and upstream (again on failover); transient */ \
	X(QUEUED, XT_QUEUE)	     /* waiting for an admission slot: up->conf.queue_timeout_ms */ \
	X(CONNECTING, XT_CONNECT)    /* admitted, a connection opening: up->connect_timeout_ms */ \
	X(SENDING, XT_NONE)	     /* connected, request bytes going out; the client side times the upload */ \
	X(AWAIT_HEAD, XT_FIRST_BYTE) /* all of the request written, no response head: first_byte_timeout_ms */ \
	X(STREAMING, XT_IDLE)	     /* response head parsed, bytes flowing to the client: up->idle_timeout_ms */ \
	X(PAUSED, XT_IDLE)	     /* STREAMING with upstream reads off until the client drains */ \
	X(TUNNEL, XT_NONE) /* a WebSocket's 101 forwarded: the tunnel (tunnel.c) moves the bytes and times it */ \
	X(DONE, XT_NONE)   /* complete, failed or aborted; the upstream side released */

enum xtimer { XT_NONE, XT_QUEUE, XT_CONNECT, XT_FIRST_BYTE, XT_IDLE };

enum xstate {
#define X(s, t) XS_##s,
	EXCHANGE_STATES(X)
#undef X
};

#define X(s, t) +1
enum { XS__COUNT = 0 EXCHANGE_STATES(X) };
#undef X

/*
 * How an exchange fails, one row each: (ENUM, status, kind, type, shadow
 * kind). A primary answers `status` with the error `type` and counts
 * `kind` (enum req_error); a shadow would count only `shadow kind`.
 */
#define EXCHANGE_FAILS(X) \
	X(NO_ROUTE, 404, BAD_REQUEST, "no_route", BAD_REQUEST) \
	X(BAD_OVERRIDE, 400, BAD_REQUEST, "invalid_request", BAD_REQUEST) \
	X(NO_TARGET, 503, CONNECT_FAILED, "upstream_unavailable", CONNECT_FAILED) \
	X(QUEUE_FULL, 503, QUEUE_FULL, "upstream_busy", QUEUE_FULL) \
	X(QUEUE_TIMEOUT, 503, TIMEOUT, "upstream_busy", TIMEOUT) \
	X(NO_SOCKET, 502, CONNECT_FAILED, "upstream_unreachable", CONNECT_FAILED) \
	X(CONNECT_TIMEOUT, 504, TIMEOUT, "upstream_timeout", CONNECT_FAILED) \
	X(UNREACHABLE, 502, CONNECT_FAILED, "upstream_unreachable", CONNECT_FAILED) \
	X(TLS, 502, CONNECT_FAILED, "upstream_tls", CONNECT_FAILED) \
	X(FIRST_BYTE, 504, TIMEOUT, "upstream_timeout", TIMEOUT) \
	X(IDLE, 504, TIMEOUT, "upstream_timeout", TIMEOUT) \
	X(CLIENT_STALLED, 504, CLIENT_ABORTED, "client_timeout", CLIENT_ABORTED) \
	X(RESET, 502, UPSTREAM_RESET, "upstream_reset", UPSTREAM_RESET) \
	X(BAD_RESPONSE, 502, UPSTREAM_PROTOCOL, "upstream_protocol", UPSTREAM_PROTOCOL) \
	X(HEAD_TOO_LARGE, 502, UPSTREAM_PROTOCOL, "upstream_protocol", UPSTREAM_PROTOCOL) \
	X(NO_MEMORY, 503, NO_MEMORY, "overloaded", NO_MEMORY)

enum xfail {
#define X(e, status, kind, type, shadow) XF_##e,
	EXCHANGE_FAILS(X)
#undef X
		XF__COUNT
};

struct xfail_info {
	int status;
	enum req_error kind;
	const char *type;
	enum req_error shadow_kind;
};
extern const struct xfail_info exchange_fails[XF__COUNT];

/* Whether the caller may go on touching the exchange. */
enum xr {
	XR_OK,
	XR_ENDED, /* a terminal hook ran (or the owner closed): the exchange may be freed */
};

/* A request this small (head and body) is kept whole when it goes out on a
 * pooled connection, to be sent again should that connection turn out to
 * have been closed by the server. */
#define REPLAY_MAX (64u << 10)
/* Bytes queued in one direction before its source stops reading (the
 * request bytes for the upstream, the response bytes for the client): the
 * high watermark; the low one is half of it. */
#define STREAM_BUFFER (256u << 10)
/* A request that is not idempotent is sent again only when its pooled
 * connection failed before it was all written, or within this long (plus
 * two of the connection's round trips) after: the server closed the
 * connection without having seen it. A later failure means the server had
 * it, and may have run it (exchange.c, request_replay). */
#define REPLAY_WINDOW_MS 50

/*
 * The bytes of one read from the upstream: in the connection's input buffer
 * (a head not yet parsed, bytes that came while the client was behind, the
 * rest at a close), or in the per-thread scratch buffer of a direct read
 * (upconn_set_direct: `mem`, `len`; plain recv, or a TLS connection's
 * records decrypted there after its handshake), which must be done with
 * when the read returns.
 */
struct xsrc {
	struct evbuffer *buf; /* NULL for a direct read */
	const char *mem;
	size_t len;
};

/* How an exchange reaches its owner. `owner` is the pointer given to
 * exchange_init. */
struct exchange_hooks {
	/* The first n bytes of `src` are the owner's: taken (moved, written or
	 * copied) before it returns. XR_ENDED when the owner had to end the
	 * exchange (out of memory: its client is closed). */
	enum xr (*forward)(void *owner, const struct xsrc *src, size_t n);
	/* Bytes on their way to the owner's peer: its output buffer, plus the
	 * socket's send queue when `deep`. */
	size_t (*backlog)(void *owner, bool deep);
	/* The exchange paused the upstream: the owner calls exchange_resume()
	 * once its backlog is at most `low` (0: drained, the default again). */
	void (*want_drain)(void *owner, size_t low);
	/* Upload flow: `on` false when the request bytes waiting for the
	 * upstream passed the stream buffer, true each time they are back
	 * under half of it (the owner resumes reading and parsing its client
	 * if it had stopped). XR_ENDED: the request ended meanwhile. */
	enum xr (*upload)(void *owner, bool on);
	/* The exchange failed; `why` says how (EXCHANGE_FAILS), `msg` is for
	 * the user and the log. Terminal. */
	void (*fail)(void *owner, enum xfail why, const char *msg);
	/* The response is complete and all of it handed to forward; the
	 * upstream side is released. Terminal. */
	void (*done)(void *owner);
	/* A WebSocket's 101 has been handed to forward; the exchange is in
	 * TUNNEL, its connection (x->uc, the frames after the 101 in its input
	 * buffer) and slot held for the owner's tunnel, which releases them.
	 * Terminal for the exchange's own reading. NULL: a 101 is refused. */
	void (*upgraded)(void *owner);
};

/* What the exchanges of one proxy share. */
struct exchange_env {
	struct event_base *base;
	struct meter_env meter;
	struct evbuffer *tail; /* a response's last bytes between its upstream and its client */
	/* the proxy's current generation: max_event_size is read from it, not
	 * from the request's, since a reload applies it to running requests */
	struct router *const *current;
};

/* One exchange with the upstream, embedded in its owner's request. */
#define EXCHANGE_MAGIC 0x58434847u /* "XCHG" */
struct exchange {
	OBJ_MAGIC_FIELD
	const struct exchange_hooks *hooks;
	void *owner;
	const struct exchange_env *env;
	uint64_t log_id;	    /* the client connection's id, for log_conn */
	struct req_record *rec;	    /* the owner's record */
	const struct reqhead *head; /* the owner's parsed request head; NULL for a shadow */
	bool shadow;		    /* a shadow copy's exchange (exchange.h's top comment) */
	enum llhttp_method method;  /* the request's, from head once routed (a shadow's: its primary's) */
	bool http10;		    /* likewise: the client spoke HTTP/1.0 */
	bool body_done;		    /* the whole request body is in pending (or gone out) */
	bool corked;		    /* the owner is inside a parse pass: it flushes after each (exchange_flush) */
	bool upload_stopped;	    /* the owner was told to stop reading the body (exchange_flush) */
	bool resp_close;	    /* the response ends the client's connection (on_resp_complete) */
	char sticky_value[128];	    /* the route's sticky JSON field, from the body */

	/* routing */
	struct router *rt; /* the generation this request runs on; the owner holds the reference */
	struct route *route;
	struct upstream *up; /* chosen upstream, NULL before routing */
	struct up_waiter waiter;
	uint64_t tried;	      /* route targets that refused a connection */
	struct pick_req pick; /* what the choice knows of the request (prefix key, tokens), set before routing */
	bool probe;	      /* this request is x->up's probe (router.h) */
	bool prefill_held;    /* prefill_tok count in x->up's prefill until the first token */
	double prefill_tok;   /* pick.tokens less those x->up was expected to hold (latency) */
	double tokens_ahead;  /* prompt tokens in flight on x->up when routed there, its own included */
	size_t head_len;      /* bytes of the head at the front of pending */

	/* upstream side */
	struct upconn *uc;
	bool reused;		       /* uc came from the pool */
	bool retried;		       /* a replay already happened */
	struct evbuffer *replay;       /* the whole request, kept while a pooled connection may turn out dead */
	struct evbuffer *replay_spare; /* an empty buffer for the next replay copy (replay_open) */
	/* requests running on or queued for the upstream when it was routed
	 * there, this one included */
	unsigned load;
	bool cold;
	struct evbuffer *pending;   /* request bytes waiting for the connection */
	uint64_t wrote_at;	    /* the last request bytes went out in a write begun then; 0: by the bufferevent */
	enum xstate xstate;	    /* EXCHANGE_STATES; changed only by exchange_set_state */
	struct loop_deadline timer; /* the state's timer (exchange_set_state), or a pending upstream close */
	uint64_t idle_from;	    /* XT_IDLE: silence is counted from here */
	/* A TLS upstream's close, acted on at the next loop turn (on_up_event
	 * says why): its BEV_EVENT_* flags, never 0, while it waits. It holds
	 * x->timer (armed for 0 ms) meanwhile: the close is decided first,
	 * and state changes arm no timer until it is; DONE drops it. */
	short up_closed;
	size_t paused_waiting; /* PAUSED: the fewest bytes seen waiting for the client */
	struct respparse resp; /* its response; resp.held: bytes at the front of the input parsed, not yet moved;
				* resp.keep_alive: the response's word on the connection */
	bool upstream_dirty;   /* bytes past the response end: never reuse */
	struct meter meter;    /* measures the response into rec, and records it */
	/* The route's ttft_deadline, armed at each dispatch (request_connect)
	 * while resp.hold keeps the response from the client; NULL until a
	 * route with one is dispatched to */
	struct event *deadline;
	uint64_t deadline_at; /* when it is due (clock_now_ns): on_deadline waits for it */
	bool body_seen;	      /* a body byte of the response has parsed */
};

/* Makes the exchange of a request (its pending buffer, timer, response
 * parser and meter); `shadow`: a shadow copy's (head and rt NULL). `x` is
 * zeroed but for the buffers and timers exchange_recycle kept, which it
 * takes. -1: out of memory (exchange_free cleans up). */
int exchange_init(struct exchange *x, const struct exchange_env *env, const struct exchange_hooks *hooks, void *owner,
		  struct req_record *rec, const struct reqhead *head, struct router *rt, uint64_t log_id, bool shadow);
/* Releases the upstream (unpooled) and frees what exchange_init made.
 * Accepts a zeroed exchange; safe twice. */
void exchange_free(struct exchange *x);
/* Ends the exchange as exchange_free does, but keeps its pending and
 * replay buffers (emptied) and its timers (stopped) for the owner's next request: the
 * owner zeroes the rest and calls exchange_init on the same memory. */
void exchange_recycle(struct exchange *x);

/* Whether the exchange may go from `from` to `to` (an unknown state: never). */
bool exchange_transition_legal(enum xstate from, enum xstate to);
enum xtimer exchange_state_timer(enum xstate s);
const char *exchange_state_name(enum xstate s);
/* The one place x->xstate changes: the transition is checked (CHECK: an
 * illegal one aborts), logged at debug and the timer armed or deleted as the
 * new state's timer says. The same state again is a no-op. */
void exchange_set_state(struct exchange *x, enum xstate to);

/* A slot on x->up is held in these states (upstream_admit gave one,
 * upstream_leave has not yet given it back). */
static inline bool exchange_admitted(enum xstate s)
{
	return s == XS_CONNECTING || s == XS_SENDING || s == XS_AWAIT_HEAD || s == XS_STREAMING || s == XS_PAUSED ||
	       s == XS_TUNNEL;
}

/* The response head has parsed and the rest of it is being moved. */
static inline bool exchange_streaming(const struct exchange *x)
{
	return x->xstate == XS_STREAMING || x->xstate == XS_PAUSED;
}

/* Ends the exchange with the upstream: a queued waiter cancelled, the
 * connection back (pooled only when `reusable`), the state DONE, then the
 * admission slot of an admitted state back to the next waiter. Safe to
 * call again. */
void exchange_release(struct exchange *x, bool reusable);
/* The route the request matches with what is known of it so far (the
 * model once the body prefix is read), or NULL. */
struct route *exchange_match(const struct exchange *x);
/* Chooses the route and the upstream. XR_ENDED: refused (the fail hook
 * ran). `*pinned`: the upstream was named by the override header (no
 * failover, no shadow). */
enum xr exchange_pick(struct exchange *x, bool *pinned);
/* Asks x->up for a slot: now (and connects), after a wait in its queue,
 * or the fail hook. */
enum xr exchange_admit(struct exchange *x);
/* A shadow's exchange begins on `up`, whose slot its owner took
 * (upstream_try_admit): it connects and sends what `pending` holds (the
 * head and the body so far). `method` and `http10` are its primary's.
 * XR_ENDED: it failed at once (the fail hook ran). */
enum xr exchange_shadow_start(struct exchange *x, struct upstream *up, enum llhttp_method method, bool http10);
/* The meter's labels from the routing as it stands (route, upstream, cold,
 * load): before anything the meter does may resolve the series. */
void exchange_meter_label(struct exchange *x);
/* The head an upstream gets for `head` (the request's id and method from
 * `rec`), written to `out`. -1: out of memory, `out` holds part of it. */
__attribute__((warn_unused_result)) int exchange_head_write(const struct reqhead *head, const struct req_record *rec,
							    const struct upstream *up, struct evbuffer *out);
/* Request bytes not yet on the wire: in `pending`, and in the connection's
 * output buffer. */
size_t exchange_upload_waiting(const struct exchange *x);
/* Moves pending request bytes to the upstream, and tells the owner to stop
 * uploading past the stream buffer (the upload hook). XR_ENDED: out of
 * memory, the exchange failed. */
enum xr exchange_flush(struct exchange *x);
/* Stamps TL_REQ_SENT (and enters AWAIT_HEAD) once the whole request is on
 * the wire. */
void exchange_check_sent(struct exchange *x);
/* PAUSED: the client caught up; reading from the upstream goes on, from
 * the bytes that arrived meanwhile. XR_ENDED: the exchange ended there. */
enum xr exchange_resume(struct exchange *x);
