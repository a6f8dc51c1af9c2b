/*
 * proxy.h — the listener and the client side of tokentap.
 *
 * A proxy accepts client connections, parses their requests, forwards each
 * to the upstream and streams the response back byte for byte while the
 * timeline of every request is stamped. See proxy.c for the connection
 * state machine.
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
