/*
 * proxy_int.h — what proxy.c (the client side: connections, the request
 * state machine, error answers) and exchange.c (the upstream side: routing,
 * admission, connecting, response parsing) share: the connection and
 * request objects and the functions each calls in the other. Not for other
 * modules: they use proxy.h.
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

#define CLIENT_STATES(X) \
	X(IDLE) \
	X(HEAD) \
	X(BODY) \
	X(WAIT) \
	X(CLOSING)

enum client_state {
#define X(s) CL_##s,
	CLIENT_STATES(X)
#undef X
};

/* RT_UP_CLOSED: not a timeout; a TLS upstream's close, acted on at the next
 * loop turn (on_up_event says why). */
enum req_timer { RT_NONE, RT_QUEUE, RT_CONNECT, RT_FIRST_BYTE, RT_IDLE, RT_UP_CLOSED };

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
	bool admitted;		/* holds an admission slot on `up` */
	bool awaiting_body;	/* routing needs the body's model or sticky field */
	uint32_t tried;		/* route targets that refused a connection */
	bool awaiting_chunk;	/* chunked: routing waits for a valid first chunk line */
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
	struct event *timer;
	enum req_timer timer_kind;
	uint64_t idle_from;    /* RT_IDLE: silence is counted from here */
	short up_closed;       /* RT_UP_CLOSED: the BEV_EVENT_* flags of the upstream's close */
	size_t paused_waiting; /* upstream_paused: the fewest bytes seen waiting for the client */
	struct respparse rp;   /* its response; rp.held: bytes at the front of the input parsed, not yet moved */
	bool resp_done, resp_started, resp_keepalive; /* the head: rp.head_done */
	bool upstream_paused;
	bool upstream_dirty; /* bytes past the response end: never reuse */
	struct meter meter;  /* measures the response into rec, and records it */
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
	bool closing;
	bool reading_blocked; /* upload backpressure: client_upload_blocked */
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
	return !cl->closing && cl->req && cl->req->seq == seq;
}

/* proxy.c: the client side */
void request_drop_upstream(struct request *req, bool reusable);
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
/* The route the request matches with what is known of it so far (the
 * model once the body prefix is read), or NULL. */
struct route *request_match(const struct request *req);
void request_route(struct request *req);
void request_flush_upstream(struct request *req);
void request_check_sent(struct request *req);
void request_timer_set(struct request *req, enum req_timer kind, uint64_t ms);
void request_idle_from(struct request *req, uint64_t now);
void on_request_timer(evutil_socket_t fd, short what, void *arg);
void on_up_read(struct bufferevent *bev, void *arg);
