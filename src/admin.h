/*
 * admin.h — the admin HTTP API: the operator's read side (health, stats,
 * load curve, Prometheus) and the guarded write side (reset).
 *
 * It runs on its own thread with its own event loop and evhttp server, so a
 * slow scrape or a large /stats answer never delays forwarding; it touches
 * nothing of the proxy but the store and the recent-requests ring (both
 * thread-safe) and the read-only config. It also serves the dashboard page
 * (GET /), compiled into the binary from src/dashboard.html.
 * Endpoints, parameters and errors: docs/admin-api.md.
 *
 * Safety: a listen address outside loopback needs a token; requests whose
 * Host is not the admin address or a loopback name are refused (DNS
 * rebinding); writes need the bearer token, compared in constant time. The
 * token is never logged nor shown.
 */
#pragma once

#include <stddef.h>

#include "config.h"

struct store;
struct config;
struct recent;
struct admin;

struct control;

struct admin_options {
	const char *listen; /* "127.0.0.1:9901", "[::1]:9901", "localhost:0"; NULL = off */
	const char *token;  /* bearer token for writes, or NULL; copied */
	/* The workers' live state (routes, upstreams, weights), reached through
	 * their control channels; none (nworkers 0): those endpoints answer 404. */
	struct control *controls[WORKERS_MAX];
	void *proxies[WORKERS_MAX];
	unsigned nworkers;
};

/*
 * Binds (port 0 picks a free port) and starts the admin thread. Refuses a
 * listen address outside loopback without a token, and an unparsable one,
 * with a message saying what to change. NULL with `err` on failure.
 * `store`, `cfg` and `recent` (the ring behind /requests/recent; NULL: that
 * endpoint answers 404) must outlive the admin.
 */
struct admin *admin_start(const struct admin_options *o, struct store *store, const struct config *cfg,
			  struct recent *recent, char *err, size_t errlen);

/* The address actually bound, "ADDR:PORT" ("[v6]:PORT" for IPv6). */
const char *admin_listen_addr(const struct admin *a);

/* Stops the loop, joins the thread, closes the listener. NULL ok. */
void admin_stop(struct admin *a);

/*
 * Reads a token from a file (trailing whitespace and newline dropped) into a
 * malloc'd string. Refuses an empty token or one with spaces or control
 * characters inside. 0, or -1 with `err`.
 */
int admin_token_load(const char *path, char **out, char *err, size_t errlen) __attribute__((warn_unused_result));

/* admin_host_allowed, the Host / Origin check, is in admin_gate.h. */
