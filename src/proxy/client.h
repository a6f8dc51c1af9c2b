/*
 * client.h — one client connection: reading (recvmsg and its receive
 * stamps), the request parser's hooks, error answers, forwarding response
 * bytes to the socket, keep-alive, linger and close. The client owns its
 * current request and is the owner its exchange reaches through the hooks
 * (client.c, client_xhooks). What the clients of one proxy share is
 * struct client_set, embedded in the proxy.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "check.h"
#include "loop.h"
#include "reqparse.h"
#include "request.h"
#include "rxstamp.h"

struct bufferevent;
struct event;
struct event_base;
struct ssl_ctx_st;

/* Client states: client.c's header comment draws them; client_set_state is
 * the one place they change, checked against a table of the legal
 * transitions. TUNNEL: a WebSocket's 101 forwarded, the connection the
 * request's tunnel's (tunnel.h) until it closes. LINGER: an error answer going out, the client's further
 * bytes read and dropped; CLOSED: the sockets gone, the memory freed at the
 * next loop turn. */
#define CLIENT_STATES(X) \
	X(IDLE) \
	X(HEAD) \
	X(BODY) \
	X(WAIT) \
	X(TUNNEL) \
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

/* Lingering close: after an error response, keep reading (and dropping)
 * what the client still sends for a moment, so it sees the response rather
 * than a reset. */
#define LINGER_MS 2000
/* Client input kept unparsed while a response runs (pipelined requests). */
#define CLIENT_INPUT_MAX (64u << 10)

/* What the clients of one proxy share; embedded in struct proxy, so that
 * client.c never reads the proxy. */
struct client_set {
	struct event_base *base;
	struct request_env renv; /* renv.router: the current generation */
	struct rxclock rxclock;	 /* maps client sockets' receive stamps onto the monotonic clock */
	uint64_t next_client_id;
	unsigned nclients;	       /* in `clients`, closing ones included */
	_Atomic unsigned *clients_all; /* the same, over all workers */
	bool draining;
	void (*drained)(void *arg); /* called once, when draining and the last client is freed */
	void *drained_arg;
	LIST_HEAD(, client) clients;
};

/* One client connection. Owned by its set's client list. */
#define CLIENT_MAGIC 0x434c4e54u /* "CLNT" */
struct client {
	OBJ_MAGIC_FIELD
	struct client_set *set;
	uint64_t id;
	struct bufferevent *bev;
	struct event *rev;	/* plain TCP: the read event (see client_reading); NULL over TLS */
	struct reqparse parser; /* its requests, one at a time */
	enum client_state state;
	struct loop_deadline timer; /* keep-alive idle, header deadline, upload idle or deadline, linger */
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
	/* TLS: response bytes SSL_written in the upstream read's own call, and
	 * those left to the output buffer (the socket full, or bytes before them
	 * still there); in the debug log at the close */
	uint64_t tls_now, tls_queued;
	LIST_ENTRY(client) link;
};

/*
 * Whether the request numbered `seq` on `cl` is still its running one,
 * after a call that may have finished it (and closed the client, or begun
 * the next request). Asked by number, never by address: the next request
 * is made inside that call, typically in the memory of the one just
 * finished (request_retire).
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

/* A connection accepted on `fd` from `peer`, over TLS when `tls` (an
 * SSL_CTX) is given. Counted in set->clients_all by the caller already; on
 * failure uncounted again and closed. */
void client_new(struct client_set *set, int fd, const char *peer, struct ssl_ctx_st *tls);
/* Frees every client now (shutdown). */
void client_set_free_all(struct client_set *set);
/* Draining: closes the idle clients; returns how many still run a request. */
unsigned client_set_close_idle(struct client_set *set);
/* The grace period is over: closes every client; returns how many. */
unsigned client_set_cut(struct client_set *set);
