/*
 * proxy_int.h — what proxy.c (the client side: connections, the client
 * state machine, error answers) and exchange.c (the upstream side: the
 * exchange state machine, routing, admission, connecting, response parsing)
 * share: the connection and request objects, both machines' states, and the
 * functions each calls in the other. Not for other modules: they use
 * proxy.h.
 */
#pragma once

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <llhttp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "config.h"
#include "meter.h"
#include "mirror.h"
#include "reqparse.h"
#include "respparse.h"
#include "router.h"
#include "rxstamp.h"
#include "timeline.h"
#include "upstream.h"

struct accesslog;
struct stats_shard;
struct recent;
struct series;
struct mirror;

/* Client states: proxy.c's header comment draws them; client_set_state is
 * the one place they change, checked against a table of the legal
 * transitions. LINGER: an error answer going out, the client's further
 * bytes read and dropped; CLOSED: the sockets gone, the memory freed at the
 * next loop turn. */
#define CLIENT_STATES(X) \
	X(IDLE) \
	X(HEAD) \
	X(BODY) \
	X(WAIT) \
	X(LINGER) \
	X(CLOSED)

enum client_state {
#define X(s) CL_##s,
	CLIENT_STATES(X)
#undef X
};

#define X(s) +1
enum { CLIENT_STATE_COUNT = 0 CLIENT_STATES(X) };
#undef X

/* Whether a client may go from `from` to `to` (an unknown state: never). */
bool client_transition_legal(enum client_state from, enum client_state to);

/*
 * The exchange's states (exchange.c: exchange_set_state is the one place
 * they change, checked against a table of the legal transitions), each with
 * the timer it runs on req->timer, XT_NONE when it runs none. The setter
 * arms or deletes the timer from the state: a state whose timer differs from
 * the one before deletes it and arms its own; STREAMING <-> PAUSED leaves the
 * idle clock running. An admission slot on req->up is held exactly in
 * CONNECTING, SENDING, AWAIT_HEAD, STREAMING and PAUSED.
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
	X(DONE, XT_NONE)	     /* complete, failed or aborted; the upstream side released */

enum xtimer { XT_NONE, XT_QUEUE, XT_CONNECT, XT_FIRST_BYTE, XT_IDLE };

enum xstate {
#define X(s, t) XS_##s,
	EXCHANGE_STATES(X)
#undef X
};

#define X(s, t) +1
enum { XS__COUNT = 0 EXCHANGE_STATES(X) };
#undef X

/* Lingering close: after an error response, keep reading (and dropping)
 * what the client still sends for a moment, so it sees the response rather
 * than a reset. */
#define LINGER_MS 2000
/* Client input kept unparsed while a response runs (pipelined requests). */
#define CLIENT_INPUT_MAX (64u << 10)
/* A request this small (head and body) is kept whole when it goes out on a
 * pooled connection, to be sent again should that connection turn out to
 * have been closed by the server. */
#define REPLAY_MAX (64u << 10)
/* A request that is not idempotent is sent again only when its pooled
 * connection failed before it was all written, or within this long (plus
 * two of the connection's round trips) after: the server closed the
 * connection without having seen it. A later failure means the server had
 * it, and may have run it (exchange.c, request_replay). */
#define REPLAY_WINDOW_MS 50

struct proxy {
	struct event_base *base;
	struct router *router; /* the current generation; one reference held */
	bool draining;
	struct event *drain_timer;
	void (*drained)(void *arg);
	void *drained_arg;
	struct accesslog *alog;
	struct stats_shard *stats;
	struct recent *recent;
	struct rxclock rxclock; /* maps client sockets' receive stamps onto the monotonic clock */
	struct listener {
		struct evconnlistener *lev;
		struct proxy *px;
		unsigned index;		       /* into the router's tls_listen[] */
		struct sockaddr_storage bound; /* the address it got */
		socklen_t boundlen;
	} listeners[LISTENERS_MAX];
	unsigned nlisteners;
	char listen_addr[LISTENERS_MAX * 64]; /* "ADDR:PORT, ADDR:PORT" */
	uint64_t next_client_id;
	unsigned nclients;	       /* in px->clients, closing ones included */
	_Atomic unsigned *clients_all; /* the same, over all workers */
	_Atomic unsigned clients_own;  /* clients_all when the proxy is alone */
	struct mirror_list mirrors;    /* shadow exchanges in flight */
	struct evbuffer *tail;	       /* a response's last bytes between its upstream and its client */
	bool cap_warned;
	struct event *accept_timer; /* ends the listeners' pause after a failed accept */
	uint64_t id_seed, id_counter;
	LIST_HEAD(, client) clients;
};

/* One request and its exchange with the upstream. Owned by its client. */
struct request {
	struct client *cl;
	uint64_t seq; /* its number on cl: cl->nrequests when it began */
	struct req_record rec;

	struct reqhead head; /* as parsed: URL, headers, framing (reqparse.h) */
	bool body_done;
	char *body_prefix; /* the first cfg->body_inspect_max bytes, for the model */
	size_t body_prefix_len;
	bool reqinfo_done;

	/* routing */
	struct router *rt; /* the generation this request runs on; a reference */
	struct route *route;
	struct upstream *up; /* chosen upstream, NULL before routing */
	struct up_waiter waiter;
	uint32_t tried;		/* route targets that refused a connection */
	size_t head_len;	/* bytes of the head at the front of up_pending */
	char sticky_value[128]; /* the route's sticky JSON field, from the body */

	/* upstream side */
	struct upconn *uc;
	bool reused;		 /* uc came from the pool */
	bool retried;		 /* a replay already happened */
	struct evbuffer *replay; /* the whole request, kept while a pooled connection may turn out dead */
	/* requests running on or queued for the upstream when it was routed
	 * there, this one included */
	unsigned inflight;
	bool cold;
	struct mirror
		*mirror; /* its shadow copy, while the body still flows; cleared by the mirror when it ends first */
	struct evbuffer *up_pending; /* request bytes waiting for the connection */
	enum xstate xstate;	     /* EXCHANGE_STATES; changed only by exchange_set_state */
	struct event *timer;	     /* the state's timer (exchange_set_state), or a pending upstream close */
	uint64_t idle_from;	     /* XT_IDLE: silence is counted from here */
	/* A TLS upstream's close, acted on at the next loop turn (on_up_event
	 * says why): its BEV_EVENT_* flags, never 0, while it waits. It holds
	 * req->timer (armed for 0 ms) meanwhile: the close is decided first,
	 * and state changes arm no timer until it is; DONE drops it. */
	short up_closed;
	size_t paused_waiting; /* PAUSED: the fewest bytes seen waiting for the client */
	struct respparse rp;   /* its response; rp.held: bytes at the front of the input parsed, not yet moved;
				* rp.keep_alive: the response's word on the connection */
	bool upstream_dirty;   /* bytes past the response end: never reuse */
	struct meter meter;    /* measures the response into rec, and records it */
};

/* One client connection. Owned by the proxy's client list. */
struct client {
	struct proxy *px;
	uint64_t id;
	struct bufferevent *bev;
	struct event *rev;  /* plain TCP: the read event (see client_reading); NULL over TLS */
	struct reqparse rp; /* its requests, one at a time */
	enum client_state state;
	struct event *timer; /* keep-alive idle, header deadline, upload idle or deadline, linger */
	struct request *req;
	uint64_t nrequests; /* requests begun on this connection */
	char peer[64];
	uint64_t last_read_ns; /* when the bytes last read arrived (kernel stamp where there is one) */
	bool reading;	       /* reading wanted (rev added unless input_full) */
	bool input_full;       /* CLIENT_INPUT_MAX buffered: reading paused until parsed */
	bool close_after;      /* close once the current response is written */
	bool reading_blocked;  /* upload backpressure: client_upload_blocked */
	/* the upload's deadline (timeouts.body from the end of the head; 0:
	 * no body expected), moved on by the time reading_blocked held it */
	uint64_t body_deadline_ns, blocked_since_ns;
	uint64_t body_timeout_ms; /* the setting the deadline was set with */
	bool body_timer_deadline; /* the timer is armed for the deadline, not the idle stall */
	bool parsing;		  /* inside client_parse(): it flushes to the upstream after each pass */
	LIST_ENTRY(client) link;
};

static inline const struct config *pcfg(const struct proxy *px)
{
	return &px->router->cfg;
}

/*
 * Whether the request numbered `seq` on `cl` is still its running one,
 * after a call that may have finished it (and closed the client, or begun
 * the next request). Asked by number, never by address: the next request
 * is allocated inside that call, and malloc typically hands it the block of
 * the one just freed.
 */
static inline bool client_runs(const struct client *cl, uint64_t seq)
{
	return cl->state != CL_CLOSED && cl->req && cl->req->seq == seq;
}

/* An error answer is going out (LINGER) or the connection is gone (CLOSED):
 * no more requests are read, nothing more is answered. */
static inline bool client_ending(const struct client *cl)
{
	return cl->state == CL_LINGER || cl->state == CL_CLOSED;
}

/* A slot on req->up is held in these states (upstream_admit gave one,
 * upstream_leave has not yet given it back). */
static inline bool exchange_admitted(enum xstate s)
{
	return s == XS_CONNECTING || s == XS_SENDING || s == XS_AWAIT_HEAD || s == XS_STREAMING || s == XS_PAUSED;
}

/* The response head has parsed and the rest of it is being moved. */
static inline bool exchange_streaming(const struct request *req)
{
	return req->xstate == XS_STREAMING || req->xstate == XS_PAUSED;
}

/* proxy.c: the client side */
void request_finish(struct request *req);
void client_fail(struct client *cl, int status, enum req_error kind, const char *type, const char *msg);
void client_parse(struct client *cl);
void client_reading(struct client *cl, bool on);
/* Upload backpressure: stop (or resume) reading the client while its
 * upstream cannot take more of the body; the time stopped does not count
 * against the body deadline. */
void client_upload_blocked(struct client *cl, bool blocked);
void client_forward(struct client *cl, struct evbuffer *src, size_t n);
bool client_forward_mem(struct client *cl, const char *p, size_t n);

/* exchange.c: the upstream side */
void exchange_request_init(struct request *req); /* its response parser, with exchange.c's hooks, and its meter */
/* The meter's labels from the routing as it stands (route, upstream, cold,
 * load): before anything the meter does may resolve the series. */
void request_meter_label(struct request *req);
/* Whether the exchange may go from `from` to `to` (an unknown state: never). */
bool exchange_transition_legal(enum xstate from, enum xstate to);
enum xtimer exchange_state_timer(enum xstate s);
const char *exchange_state_name(enum xstate s);
/* The one place req->xstate changes: the transition is checked (CHECK: an
 * illegal one aborts), logged at debug and the timer armed or deleted as the
 * new state's timer says. The same state again is a no-op. */
void exchange_set_state(struct request *req, enum xstate to);
/* Ends the exchange with the upstream: a queued waiter cancelled, the
 * connection back (pooled only when `reusable`), the state DONE, then the
 * admission slot of an admitted state back to the next waiter. Safe to
 * call again. */
void request_drop_upstream(struct request *req, bool reusable);
/* The route the request matches with what is known of it so far (the
 * model once the body prefix is read), or NULL. */
struct route *request_match(const struct request *req);
void request_route(struct request *req);
void request_flush_upstream(struct request *req);
void request_check_sent(struct request *req);
void on_exchange_timer(evutil_socket_t fd, short what, void *arg);
/* PAUSED: the client caught up; reading from the upstream goes on, from
 * the bytes that arrived meanwhile. The request may have ended on return. */
void exchange_resume(struct request *req);
