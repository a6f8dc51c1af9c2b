/*
 * admin_gate.h — what the admin API decides about a request before any
 * handler runs: which endpoint it names, and whether it may run.
 *
 * In order: the Host check (403: a host name that is not this admin API is
 * a DNS-rebinding page in a browser), the path (404), the method (405 with
 * Allow), for writes the Origin and bearer-token checks (403/401), the query
 * parameters (400: unknown or repeated). A pure function of the request's
 * method, path, query and three headers, so that it runs under a fuzzer
 * (tests/fuzz/fuzz_admin_gate.c) without a socket.
 */
#pragma once

#include <event2/http.h>
#include <stdbool.h>
#include <stddef.h>

struct evkeyvalq;

#define ADMIN_GET_LIKE (EVHTTP_REQ_GET | EVHTTP_REQ_HEAD)

/* Every endpoint: id, path, methods, Allow, needs the token, parameters,
 * handler (admin.c's; ignored here). */
#define ADMIN_ROUTES(X) \
	X(DASHBOARD, "/", ADMIN_GET_LIKE, "GET, HEAD", false, admin_no_params, on_dashboard) \
	X(HEALTHZ, "/healthz", ADMIN_GET_LIKE, "GET, HEAD", false, admin_no_params, on_healthz) \
	X(READYZ, "/readyz", ADMIN_GET_LIKE, "GET, HEAD", false, admin_no_params, on_readyz) \
	X(STATS, "/stats", ADMIN_GET_LIKE, "GET, HEAD", false, admin_stats_params, on_stats) \
	X(STATS_PROMPT, "/stats/prompt", ADMIN_GET_LIKE, "GET, HEAD", false, admin_prompt_params, on_stats_prompt) \
	X(STATS_CURVE, "/stats/curve", ADMIN_GET_LIKE, "GET, HEAD", false, admin_prompt_params, on_stats_curve) \
	X(STATS_HISTORY, "/stats/history", ADMIN_GET_LIKE, "GET, HEAD", false, admin_history_params, on_stats_history) \
	X(METRICS, "/metrics", ADMIN_GET_LIKE, "GET, HEAD", false, admin_no_params, on_metrics) \
	X(RECENT, "/requests/recent", ADMIN_GET_LIKE, "GET, HEAD", false, admin_recent_params, on_requests_recent) \
	X(RESET, "/reset", EVHTTP_REQ_POST, "POST", true, admin_no_params, on_reset) \
	X(ROUTES, "/routes", ADMIN_GET_LIKE, "GET, HEAD", false, admin_no_params, on_routes) \
	X(COMPARE, "/compare", ADMIN_GET_LIKE, "GET, HEAD", false, admin_compare_params, on_compare) \
	X(UPSTREAMS, "/upstreams", ADMIN_GET_LIKE, "GET, HEAD", false, admin_no_params, on_upstreams) \
	X(WEIGHTS, "/routes/weights", EVHTTP_REQ_POST, "POST", true, admin_no_params, on_weights) \
	X(WORKLOAD, "/workload", ADMIN_GET_LIKE, "GET, HEAD", false, admin_workload_params, on_workload)

enum admin_route_id {
#define X(e, path, methods, allow, write, params, fn) ADMIN_R_##e,
	ADMIN_ROUTES(X)
#undef X
		ADMIN_R__COUNT
};

struct admin_route {
	const char *path;
	unsigned methods; /* EVHTTP_REQ_* bits */
	const char *allow;
	bool write;		   /* needs the token */
	const char *const *params; /* NULL-terminated */
};

extern const struct admin_route admin_routes[ADMIN_R__COUNT];

/* The parts of a request the gate reads; NULL where absent. */
struct admin_request {
	unsigned method;  /* one EVHTTP_REQ_* */
	const char *path; /* NULL or "": "/" */
	const char *query;
	const char *host, *origin, *authorization;
};

/* Who the admin API is: the bound host part ("127.0.0.1", "[::1]",
 * "0.0.0.0"), the full address for messages, and the token (NULL: writes
 * are refused). */
struct admin_identity {
	const char *bound_host;
	const char *listen_addr;
	const char *token;
	size_t token_len;
};

struct admin_verdict {
	int status;	       /* 0: run admin_routes[route]; else answer this */
	int route;	       /* the endpoint, -1 when none matched */
	char param[72];	       /* 400: the parameter at fault (at most 64 bytes of it), or "" */
	const char *allow;     /* 405: the Allow header to send */
	bool www_authenticate; /* 401: send WWW-Authenticate */
	char message[384];
};

/* Decides about `r`. On status 0, `params` holds the parsed query
 * (evhttp_clear_headers frees it); otherwise it is empty. */
void admin_gate(const struct admin_request *r, const struct admin_identity *id, struct evkeyvalq *params,
		struct admin_verdict *v);

/* The Host / Origin check: true when `host` (a Host header value, with or
 * without port) names the admin itself, given the bound host part. */
int admin_host_allowed(const char *host, const char *bound_host);
