/*
 * upstream.h — an upstream server and its pool of idle connections.
 *
 * An upstream is resolved once at start-up. Connections to it are handed
 * out by upstream_acquire (a pooled idle one when there is one, else a fresh
 * connect) and come back through upstream_release, which pools them only
 * when the exchange ended cleanly. While idle, a pooled connection is watched:
 * a byte or a close from the server drops it, so a stale connection is
 * rarely handed out.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

struct event_base;
struct bufferevent;
struct config;

/* One connection to an upstream. Owned by the request using it, or by the
 * pool while idle. */
struct upconn {
	struct upstream *up;
	struct bufferevent *bev;
	TAILQ_ENTRY(upconn) link;
	uint64_t id;
	unsigned served; /* requests completed on this connection */
	bool connected;
};

struct upstream {
	char *name; /* host:port as the user wrote it; used in logs and records */
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct event_base *base;
	const struct config *cfg;
	TAILQ_HEAD(, upconn) idle;
	unsigned n_idle;
	unsigned in_flight; /* connections handed out and not yet released */
	uint64_t opened, reused;
	/* for labelling cold requests */
	uint64_t completed;    /* exchanges that got a response */
	uint64_t last_done_ns; /* when the last one ended */
	bool failing;	       /* the last connect attempt failed */
};

/* Parses `url` (http://host[:port][/]) and resolves it. NULL with a message
 * in `err` when the URL is unusable. */
struct upstream *upstream_new(struct event_base *base, const struct config *cfg, const char *url, char *err,
			      size_t errlen);

/* Closes idle connections and frees `up`. Connections still handed out must
 * have been released first. Accepts NULL. */
void upstream_free(struct upstream *up);

/* A connection for one exchange. `*reused` tells whether it came from the
 * pool (already connected) or is connecting now (the caller sees
 * BEV_EVENT_CONNECTED or an error on its own callbacks). NULL when no socket
 * could even be created. The caller sets the bufferevent's callbacks. */
struct upconn *upstream_acquire(struct upstream *up, bool *reused);

/* Gives a connection back: pooled when `reusable`, else closed at once. */
void upstream_release(struct upconn *c, bool reusable);

/* Whether a request dispatched now runs cold: on a freshly opened
 * connection while the upstream has served nothing yet in this process,
 * has been idle for cfg->cold_idle_ms, or was failing. */
bool upstream_dispatch_cold(const struct upstream *up, bool reused, uint64_t now_ns);

/* Notes how an exchange ended, for upstream_dispatch_cold. */
void upstream_note_result(struct upstream *up, bool responded, uint64_t now_ns);
