/*
 * proxy.h — the listener and the proxy object of one worker: its listening
 * sockets, accept (with the connection cap and the pause after a failed
 * accept), the router generation new requests start with, and draining at
 * shutdown.
 *
 * A proxy only accepts: each connection becomes a client (client.h), which
 * reads and parses its requests (reqparse.h) and keeps the connection's
 * state machine (CLIENT_STATES); each request's upstream side is an
 * exchange (exchange.h), with a state machine of its own.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct accesslog;
struct stats_shard;
struct recent;
struct router;
struct proxy;

/* What a proxy records into and shares with the other workers' proxies. */
struct proxy_env {
	struct accesslog *alog;	   /* NULL: no access log */
	struct stats_shard *stats; /* NULL: no stats */
	struct recent *recent;	   /* NULL: no recent ring */
	const struct proxy *first; /* the first worker's proxy; NULL for that one */
	bool reuseport;		   /* SO_REUSEPORT: proxies of several workers share the ports */
	_Atomic unsigned *clients; /* client connections of all workers (max_connections) */
};

/* Binds the router's listen addresses and starts accepting; takes over one
 * reference to `router`. With env->reuseport the sockets are bound with
 * SO_REUSEPORT, so that several proxies (one per worker) share each port;
 * a proxy after the first binds exactly the addresses env->first got (a
 * port 0 resolves once). NULL with a message in `err`. */
struct proxy *proxy_new(struct event_base *base, struct router *router, const struct proxy_env *env, char *err,
			size_t errlen);

/* The address actually bound (port 0 resolved), as ADDR:PORT. */
const char *proxy_listen_addr(const struct proxy *px);

/* A reloaded configuration: new requests route with `router` (whose
 * reference the proxy takes over); requests already running finish on the
 * generation they started with. */
void proxy_set_router(struct proxy *px, struct router *router);
struct router *proxy_router(const struct proxy *px);

/* Graceful shutdown: stop accepting, close idle connections, let running
 * requests finish (each connection closes after its response), and call
 * `done` once none is left. After `grace_ms` the rest are cut. */
void proxy_drain(struct proxy *px, uint64_t grace_ms, void (*done)(void *arg), void *arg);

/* Stops accepting and closes every connection. Accepts NULL. */
void proxy_free(struct proxy *px);
