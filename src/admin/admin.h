/*
 * admin.h — the admin HTTP API: the operator's read side (health, stats,
 * load curve, Prometheus) and the guarded write side (reset).
 *
 * It runs on its own thread with its own event loop and evhttp server, so a
 * slow scrape or a large /stats answer never delays forwarding. Its read
 * endpoints touch nothing of the proxy but the store, the recent-requests
 * ring, the upstreams' shared in-flight counts (all thread-safe) and the
 * upstream labels it keeps (admin_labels_use); /routes, /upstreams and the
 * weight change run on the workers' loops through their control channels.
 * It also serves the dashboard page (GET /), compiled into the binary from
 * src/admin/dashboard.html.
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
#include "slice.h"

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
	struct slo slo; /* the goodput thresholds the workers judge by, for /stats to name */
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

/*
 * The upstreams' labels of a configuration, for /stats, /stats/curve,
 * /stats/prompt and /compare, and each route's balance policy, targets and
 * mirror, for /compare, which keep them in the admin thread instead
 * of asking a worker. admin_start takes those of its `cfg`; a reload takes
 * admin_labels_of(next config) before the workers take that configuration
 * over and, once one has, hands them in with admin_labels_use (which takes
 * them; with a NULL admin it frees them). NULL when out of memory.
 */
struct admin_labels;
struct admin_labels *admin_labels_of(const struct config *cfg);
void admin_labels_use(struct admin *a, struct admin_labels *labels);

/* The address actually bound, "ADDR:PORT" ("[v6]:PORT" for IPv6). */
const char *admin_listen_addr(const struct admin *a);

/* Stops the loop, joins the thread, closes the listener. NULL ok. */
void admin_stop(struct admin *a);

#define ADMIN_TOKEN_MIN 16 /* bytes: the shortest admin token accepted */

/*
 * Reads a token from a file (trailing whitespace and newline dropped) into a
 * malloc'd string. Refuses an empty token, one shorter than
 * ADMIN_TOKEN_MIN, or one with spaces or control characters inside. 0, or
 * -1 with `err`.
 */
int admin_token_load(const char *path, char **out, char *err, size_t errlen) __attribute__((warn_unused_result));

/* The token of the TOKENTAP_ADMIN_TOKEN environment variable, checked as a
 * file's is, in a malloc'd string; *out NULL when it is unset or empty. 0,
 * or -1 with `err`. */
int admin_token_env(char **out, char *err, size_t errlen) __attribute__((warn_unused_result));

/* admin_host_allowed, the Host / Origin check, is in admin_gate.h. */
