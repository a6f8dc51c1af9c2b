/*
 * proxy.h — the listener and the client side of tokentap.
 *
 * A proxy accepts client connections, parses their requests, forwards each
 * to the upstream and streams the response back byte for byte while the
 * timeline of every request is stamped. See proxy.c for the connection
 * state machine.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct accesslog;
struct stats_shard;
struct recent;
struct router;
struct proxy;

/* Binds the router's listen address and starts accepting; takes over one
 * reference to `router`. Records into `stats` and `recent` (either may be
 * NULL). NULL with a message in `err`. */
struct proxy *proxy_new(struct event_base *base, struct router *router, struct accesslog *alog,
			struct stats_shard *stats, struct recent *recent, char *err, size_t errlen);

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
