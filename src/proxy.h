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

struct event_base;
struct config;
struct upstream;
struct accesslog;
struct stats_shard;
struct recent;
struct proxy;

/* Binds cfg->listen and starts accepting; records into `stats` and
 * `recent` (either may be NULL). NULL with a message in `err`. */
struct proxy *proxy_new(struct event_base *base, const struct config *cfg, struct upstream *up,
			struct accesslog *alog, struct stats_shard *stats, struct recent *recent, char *err,
			size_t errlen);

/* The address actually bound (port 0 resolved), as ADDR:PORT. */
const char *proxy_listen_addr(const struct proxy *px);

/* Stops accepting and closes every connection. Accepts NULL. */
void proxy_free(struct proxy *px);
