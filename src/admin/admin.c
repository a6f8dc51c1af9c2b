/*
 * admin.c — the admin API's thread, listener, request routing and guards.
 *
 * One thread owns an event_base and an evhttp server; everything below runs
 * on it, except admin_start (binds before the thread exists) and admin_stop
 * (wakes the loop through a pipe, since libevent here is built without
 * thread support, then joins). Each request passes admin_gate.c's checks
 * (Host, path, method, origin and token for writes, parameters), then its
 * handler. The
 * JSON of the stats views lives in admin_stats.c, the Prometheus text in
 * prom.c, the recent requests' in admin_recent.c; the dashboard page is
 * src/admin/dashboard.html, embedded at build time (dashboard.h).
 *
 * What it shares with forwarding: the store (short read transactions, the
 * lifetime total's copy), the recent ring (a copy under its mutex), the
 * upstreams' shared in-flight counts (a copy under the lock workers take
 * when an upstream object comes or goes, for /metrics), and the upstreams'
 * labels, which it keeps itself (admin_labels_use, at start and on each
 * reload). So the read endpoints (/stats*, /compare, /metrics,
 * /requests/recent) never wait on a worker. Only the live views (/routes,
 * /upstreams) and the weight change run a job on the workers' loops
 * (control.h), since that state belongs to them; each waits at most
 * LIVE_TIMEOUT_MS per worker and answers 503 past it.
 *
 * Invariants: the token is read only by admin_gate.c, never logged or
 * returned; every answer carries a content type and Cache-Control: no-store;
 * the thread runs niced, so forwarding wins the CPU.
 * tests/bench/admin_flood.py measures what a flood does to forwarding.
 */
#define _GNU_SOURCE /* statx */
#include "admin.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "admin_gate.h"
#include "admin_recent.h"
#include "admin_stats.h"
#include "router.h"
#include "config.h"
#include "dashboard.h"
#include "fdlimit.h"
#include "log.h"
#include "prom.h"
#include "prom_accept.h"
#include "prom_proto.h"
#include "recent.h"
#include "compare.h"
#include "otlp.h"
#include "otlp_metrics.h"
#include "workload.h"
#include "control.h"
#include "live.h"
#include "store.h"

#define ADMIN_TIMEOUT_S 30
/* A request must arrive whole within this of its connection opening or of
 * the previous answer on it (ADMIN_MAX_CONNECTIONS, the cap, is fdlimit.h's). */
#define ADMIN_REQUEST_DEADLINE_S 10
#define ADMIN_MAX_HEADERS (16u << 10)
#define ADMIN_MAX_BODY (64u << 10)
#define LIVE_TIMEOUT_MS 2000
#define TOKEN_MAX 4096

/*
 * One admin connection, from its accept to evhttp's close of it: counted
 * against the cap, and timing the request it waits for. evhttp (2.1) has no
 * connection cap and re-arms its timeout on every byte read, so the admin
 * makes each connection's bufferevent itself (evhttp_set_bevcb), which
 * tells it of every connection, and learns of the close through the
 * connection's close callback, set once evhttp has made the connection
 * (the timer's first run, at once, before any of its bytes are read).
 * Owned by the admin (its list); the bufferevent is evhttp's, with one
 * reference held here, so that one evhttp dropped without the callback is
 * seen as such (no callbacks left) rather than read after its free.
 */
struct admin_conn {
	struct admin *a;
	struct bufferevent *bev;
	struct event *timer; /* hooks the connection up, then its deadline */
	bool hooked, over_cap;
	LIST_ENTRY(admin_conn) link;
};

struct admin {
	struct event_base *base;
	struct evhttp *http;
	LIST_HEAD(, admin_conn) conns;
	unsigned nconns; /* in conns, over the cap ones too until they close */
	bool cap_warned;
	struct event *wake;
	int wake_fd[2];
	pthread_t thread;
	bool running;

	struct store *store;
	const struct config *cfg;
	struct recent *recent; /* borrowed; NULL: /requests/recent is off */
	/* borrowed, one per worker; none: /routes, /upstreams are off */
	struct control *controls[WORKERS_MAX];
	void *proxies[WORKERS_MAX];
	unsigned nworkers;
	char *token; /* NULL: writes are refused */
	size_t token_len;

	/* {"upstreams": {upstream: labels}, "routes": {route: {balance,
	 * targets, mirror}}} of the configuration in force: set at start and
	 * by each reload (admin_labels_use, on the main thread), copied out by
	 * the read endpoints, so that they never wait on a worker */
	pthread_mutex_t labels_lock;
	json_t *labels;

	char bound_host[INET6_ADDRSTRLEN + 3]; /* "127.0.0.1", "[::1]" */
	char listen_addr[INET6_ADDRSTRLEN + 12];
	uint64_t since_sec; /* when collection began, for rates */
	struct slo slo;	    /* the goodput thresholds the workers judge by */
};

/* ---- answers ---- */

/* The error "type", in the shape the proxy's own errors use. */
static const char *error_type_of(int code)
{
	switch (code) {
	case 400: return "invalid_request";
	case 401: return "unauthorized";
	case 403: return "forbidden";
	case 404: return "not_found";
	case 405: return "method_not_allowed";
	default: return "internal_error";
	}
}

static const char *reason_of(int code)
{
	switch (code) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 500: return "Internal Server Error";
	case 503: return "Service Unavailable";
	default: return "Error";
	}
}

static void reply(struct evhttp_request *req, int code, const char *ctype, const char *body, size_t len)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);

	evhttp_add_header(h, "Content-Type", ctype);
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
	if (body)
		evbuffer_add(evhttp_request_get_output_buffer(req), body, len);
	evhttp_send_reply(req, code, reason_of(code), NULL);
}

static void reply_json_text(struct evhttp_request *req, int code, const char *text)
{
	reply(req, code, "application/json", text, strlen(text));
}

/* {"error": {"message", "type", "code", "parameter"?}}, as the proxy's own
 * errors; `param` names the query parameter at fault, NULL when none is. */
static void reply_error(struct evhttp_request *req, int code, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void reply_error(struct evhttp_request *req, int code, const char *param, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *root, *e;
	char *text;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	root = json_object();
	e = json_object();
	if (root && e) {
		json_object_set_new(e, "message", json_string(msg));
		json_object_set_new(e, "type", json_string(param ? "invalid_parameter" : error_type_of(code)));
		json_object_set_new(e, "code", json_integer(code));
		if (param)
			json_object_set_new(e, "parameter", json_string(param));
		json_object_set(root, "error", e);
	}
	text = root ? json_dumps(root, JSON_COMPACT) : NULL;
	if (text) {
		reply(req, code, "application/json", text, strlen(text));
		free(text);
	} else {
		static const char oom[] =
			"{\"error\":{\"message\":\"out of memory\",\"type\":\"internal_error\",\"code\":500}}";
		reply(req, 500, "application/json", oom, sizeof(oom) - 1);
	}
	json_decref(e);
	json_decref(root);
}

/* ---- handlers ---- */

static void on_healthz(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	reply_json_text(req, 200, "{\"status\":\"ok\"}\n");
}

/* The proxy's listeners and the store exist before admin_start is called. */
static void on_readyz(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	reply_json_text(req, 200, "{\"ready\":true}\n");
}

/* A copy of {upstream: labels} for one answer; NULL when out of memory
 * (the answer then goes without labels rather than failing). */
static json_t *upstream_labels(struct admin *a)
{
	json_t *copy;

	pthread_mutex_lock(&a->labels_lock);
	copy = a->labels ? json_deep_copy(json_object_get(a->labels, "upstreams")) : NULL;
	pthread_mutex_unlock(&a->labels_lock);
	return copy;
}

/* A copy of how the configuration in force has `route` assign its traffic
 * ({balance, targets, mirror}); NULL for a route it does not have, or when
 * out of memory. */
static json_t *route_assignment(struct admin *a, const char *route)
{
	json_t *copy;

	pthread_mutex_lock(&a->labels_lock);
	copy = a->labels ? json_deep_copy(json_object_get(json_object_get(a->labels, "routes"), route)) : NULL;
	pthread_mutex_unlock(&a->labels_lock);
	return copy;
}

/* The `window` and `cold` parameters, shared by the stats endpoints and
 * /compare; false after answering 400. */
static bool window_cold_parse(struct evhttp_request *req, struct evkeyvalq *p, enum store_window *window,
			      enum cold_filter *cold)
{
	const char *v;

	if ((v = evhttp_find_header(p, "window")) && store_window_parse(v, window) == -1) {
		char names[64] = "";
		for (int w = 0; w < WIN__COUNT; w++) {
			strncat(names, w ? ", " : "", sizeof(names) - strlen(names) - 1);
			strncat(names, store_window_name((enum store_window)w), sizeof(names) - strlen(names) - 1);
		}
		reply_error(req, 400, "window", "unknown window '%.64s'; one of %s", v, names);
		return false;
	}
	if ((v = evhttp_find_header(p, "cold")) && cold_filter_parse(v, cold) == -1) {
		reply_error(req, 400, "cold", "bad value '%.64s' for cold; one of include, exclude, only", v);
		return false;
	}
	return true;
}

static bool query(struct admin *a, struct evhttp_request *req, enum store_window window, struct store_result *res)
{
	char err[256];

	if (store_query(a->store, window, res, err, sizeof(err)) == 0)
		return true;
	log_warn("admin: stats query failed: %s", err);
	reply_error(req, 500, NULL, "stats query failed: %s", err);
	return false;
}

/* Sends a rendered JSON answer and frees it; NULL means rendering ran out
 * of memory. */
static void reply_rendered(struct evhttp_request *req, char *text)
{
	if (!text) {
		reply_error(req, 500, NULL, "out of memory rendering the answer");
		return;
	}
	reply(req, 200, "application/json", text, strlen(text));
	free(text);
}

static void on_stats_view(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p, enum stats_view view)
{
	struct stats_query q = { .window = WIN_1H, .cold = COLD_INCLUDE };
	struct store_result res;
	const char *by;
	char *text;

	if (!window_cold_parse(req, p, &q.window, &q.cold))
		return;
	if (view == VIEW_PROMPT && (by = evhttp_find_header(p, "by")) != NULL) {
		if (strcmp(by, "prompt") != 0 && strcmp(by, "prefill") != 0) {
			reply_error(req, 400, "by", "bad value '%.64s' for by; one of prefill, prompt", by);
			return;
		}
		q.prompt_raw = strcmp(by, "prompt") == 0;
	}
	if (view == VIEW_CURVE && (by = evhttp_find_header(p, "by")) != NULL) {
		if (strcmp(by, "inflight") != 0 && strcmp(by, "engine_queue") != 0) {
			reply_error(req, 400, "by", "bad value '%.64s' for by; one of inflight, engine_queue", by);
			return;
		}
		q.engine_queue = strcmp(by, "engine_queue") == 0;
	}
	if (view == VIEW_SUMMARY && (by = evhttp_find_header(p, "by")) != NULL) {
		if (strcmp(by, "tenant") != 0 && strcmp(by, "series") != 0) {
			reply_error(req, 400, "by", "bad value '%.64s' for by; one of series, tenant", by);
			return;
		}
		q.by_tenant = strcmp(by, "tenant") == 0;
	}
	q.tenant = evhttp_find_header(p, "tenant");
	q.route = evhttp_find_header(p, "route");
	q.upstream = evhttp_find_header(p, "upstream");
	q.model = evhttp_find_header(p, "model");
	q.slo = &a->slo;
	if (!query(a, req, q.window, &res))
		return;
	q.labels = upstream_labels(a);
	text = admin_stats_render(&res, &q, view, a->since_sec);
	json_decref(q.labels);
	store_result_free(&res);
	reply_rendered(req, text);
}

static void on_stats(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	on_stats_view(a, req, p, VIEW_SUMMARY);
}

static void on_stats_prompt(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	on_stats_view(a, req, p, VIEW_PROMPT);
}

static void on_stats_curve(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	on_stats_view(a, req, p, VIEW_CURVE);
}

/*
 * GET /stats/history: what /stats?window=1m answered every `step` seconds
 * (a divisor of 60, default 10) over the last five minutes, from the
 * per-second ring, so that the dashboard's time charts open already drawn.
 * The ring is read in chunks of `step` seconds, each once; a point merges
 * the 60 / step chunks of its minute, so only those are held. Points before
 * collection began are left out; the current second is not a point (the
 * page's own first poll is).
 */
#define HISTORY_SPAN_S 60
#define HISTORY_REACH_S (STORE_RING_SECONDS - HISTORY_SPAN_S) /* the oldest point, seconds back */
static void on_stats_history(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	struct stats_query q = { .window = WIN_1M, .cold = COLD_INCLUDE };
	struct store_result chunks[HISTORY_SPAN_S];
	uint64_t now = (uint64_t)time(NULL), c, c_first, c_last;
	unsigned long step = 10, k;
	json_t *points = NULL;
	const char *v;
	char *end, *text = NULL;

	if ((v = evhttp_find_header(p, "cold")) && cold_filter_parse(v, &q.cold) == -1) {
		reply_error(req, 400, "cold", "bad value '%.64s' for cold; one of include, exclude, only", v);
		return;
	}
	if ((v = evhttp_find_header(p, "step"))) {
		errno = 0;
		step = strtoul(v, &end, 10);
		if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || step < 1 || step > 60 ||
		    HISTORY_SPAN_S % step != 0) {
			reply_error(req, 400, "step",
				    "step must be a divisor of 60 (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60), "
				    "not '%.64s'",
				    v);
			return;
		}
	}
	q.route = evhttp_find_header(p, "route");
	q.upstream = evhttp_find_header(p, "upstream");
	q.model = evhttp_find_header(p, "model");
	q.slo = &a->slo;
	q.labels = upstream_labels(a);
	memset(chunks, 0, sizeof(chunks));
	points = json_array();
	if (!points)
		goto out;
	/* chunk c holds seconds [c*step, c*step + step - 1]; a point ends a chunk */
	k = HISTORY_SPAN_S / step;
	c_last = (now - step) / step;
	c_first = (now - HISTORY_REACH_S + step - 1) / step;
	for (c = c_first - k + 1; c <= c_last; c++) {
		struct store_result *ch = &chunks[c % k];
		uint64_t t = c * step + step - 1;

		store_result_free(ch);
		if (store_query_range(a->store, c * step, t, ch) == -1)
			goto fail;
		admin_stats_history_trim(ch);
		if (c >= c_first && t >= a->since_sec &&
		    admin_stats_history_point(points, chunks, k, t, &q, a->since_sec) == -1)
			goto fail;
	}
	text = admin_stats_history_render(points, (unsigned)step);
	points = NULL;
	goto out;
fail:
	json_decref(points);
	points = NULL;
out:
	for (size_t i = 0; i < HISTORY_SPAN_S; i++)
		store_result_free(&chunks[i]);
	json_decref(q.labels);
	reply_rendered(req, text);
}

/* The workload capture's counters, when one runs, after the rest. */
static int workload_metrics(struct evbuffer *out, bool proto)
{
	struct workload_counts c;

	if (!workload_counts(&c))
		return 0;
	const struct prom_counter_family f[3] = {
		{ "tokentap_workload_written_total", "Records written to the workload capture's file.", NULL, 1, NULL,
		  &c.written, 0, NULL },
		{ "tokentap_workload_dropped_total",
		  "Workload capture records lost, by reason (queue_full, no_space, write_error, open_error, "
		  "too_large).",
		  "reason", WL_DROP__COUNT, workload_drop_reasons, c.dropped, 0, NULL },
		{ "tokentap_workload_hash_ids_forgotten_total",
		  "Block ids the workload capture gave past workload.max_hash_ids, without remembering the block.",
		  NULL, 1, NULL, &c.hash_ids_forgotten, 0, NULL },
	};
	return proto ? prom_render_proto_counters(out, f, 3) : prom_render_counters(out, f, 3);
}

/* The span exporter's counters, when one runs (otlp.h). */
static int otlp_metrics(struct evbuffer *out, bool proto)
{
	struct otlp_counts c;

	if (!otlp_counts(&c))
		return 0;
	const struct prom_counter_family f[4] = {
		{ "tokentap_otlp_spans_exported_total", "Spans an OTLP collector accepted.", NULL, 1, NULL, &c.exported,
		  0, NULL },
		{ "tokentap_otlp_spans_dropped_total", "Spans lost, by reason (queue_full, export_failed, shutdown).",
		  "reason", OTLP_DROP__COUNT, otlp_drop_reasons, c.dropped, 0, NULL },
		{ "tokentap_otlp_export_failures_total",
		  "OTLP export POSTs that failed: no answer within the timeout, or not 2xx (each retry counts).", NULL,
		  1, NULL, &c.failures, 0, NULL },
		{ "tokentap_otlp_exports_total", "OTLP export POSTs answered 2xx.", NULL, 1, NULL, &c.exports, 0,
		  NULL },
	};
	return proto ? prom_render_proto_counters(out, f, 4) : prom_render_counters(out, f, 4);
}

/* The GenAI metrics exporter's counters, when it exports (otlp_metrics.h). */
static int otlp_metric_counters(struct evbuffer *out, bool proto)
{
	struct otlp_metrics_counts c;

	if (!otlp_metrics_counts(&c))
		return 0;
	const struct prom_counter_family f[5] = {
		{ "tokentap_otlp_metric_points_exported_total", "GenAI metric data points an OTLP collector accepted.",
		  NULL, 1, NULL, &c.points, 0, NULL },
		{ "tokentap_otlp_metric_drops_total",
		  "GenAI metrics lost: queue_full counts requests never aggregated, export_failed the data points of "
		  "exports that failed every attempt.",
		  "reason", OTLPM_DROP__COUNT, otlpm_drop_reasons, c.dropped, 0, NULL },
		{ "tokentap_otlp_metric_export_failures_total",
		  "OTLP metrics POSTs that failed: no answer within the timeout, or not 2xx (each retry counts).", NULL,
		  1, NULL, &c.failures, 0, NULL },
		{ "tokentap_otlp_metric_exports_total", "OTLP metrics POSTs answered 2xx.", NULL, 1, NULL, &c.exports,
		  0, NULL },
		{ "tokentap_otlp_metric_overflow_total",
		  "Requests counted under otel.metric.overflow: past metrics.otlp.max_series attribute sets.", NULL, 1,
		  NULL, &c.overflow, 0, NULL },
	};
	return proto ? prom_render_proto_counters(out, f, 5) : prom_render_counters(out, f, 5);
}

/* The routes' decisions by route, upstream and reason (router.h). */
static int route_pick_metrics(struct evbuffer *out, bool proto)
{
	static const char *const label_names[3] = { "route", "upstream", "reason" };
	struct route_pick_count *c = NULL;
	size_t n = 0;
	int rc = -1;

	if (route_pick_counts(&c, &n) == -1)
		return -1;
	const char **values = calloc(n * PICK__COUNT * 3 + 1, sizeof(*values));
	uint64_t *counts = calloc(n * PICK__COUNT + 1, sizeof(*counts));
	if (!values || !counts)
		goto out;
	for (size_t i = 0; i < n; i++)
		for (unsigned k = 0; k < PICK__COUNT; k++) {
			size_t at = i * PICK__COUNT + k;
			values[at * 3] = c[i].route;
			values[at * 3 + 1] = c[i].upstream;
			values[at * 3 + 2] = pick_reason_name((enum pick_reason)k);
			counts[at] = c[i].n[k];
		}
	const struct prom_counter_family f = {
		.name = "tokentap_route_decisions_total",
		.help = "Upstream choices of each route, by upstream and reason (docs/routing.md).",
		.n = n * PICK__COUNT,
		.values = values,
		.counts = counts,
		.nlabels = 3,
		.label_names = label_names,
	};
	rc = n ? (proto ? prom_render_proto_counters(out, &f, 1) : prom_render_counters(out, &f, 1)) : 0;
out:
	free(values);
	free(counts);
	route_pick_counts_free(c, n);
	return rc;
}

static void on_metrics(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	struct store_result res;
	struct evbuffer *out = evhttp_request_get_output_buffer(req);

	/* counts since the process started, never the windows, so that
	 * neither /reset nor the ring's retention makes a counter go down */
	if (store_query_lifetime(a->store, &res) == -1) {
		reply_error(req, 500, NULL, "out of memory reading the metrics");
		return;
	}
	/* a scraper that asks for protobuf gets native histograms too */
	bool proto = prom_accept_protobuf(evhttp_find_header(evhttp_request_get_input_headers(req), "Accept"));
	struct upstream_gauge *g = NULL;
	size_t n = 0;
	int rc = upstream_gauges(&g, &n);
	if (rc == 0 && proto) {
		rc = prom_render_proto(out, &res, g, n);
		if (rc == 0 && a->cfg->tenant_metrics)
			rc = prom_render_proto_tenants(out, &res);
	} else if (rc == 0) {
		rc = prom_render(out, &res);
		if (rc == 0 && a->cfg->tenant_metrics)
			rc = prom_render_tenants(out, &res);
		if (rc == 0)
			rc = prom_render_gauges(out, g, n);
	}
	if (rc == 0)
		rc = workload_metrics(out, proto);
	if (rc == 0)
		rc = otlp_metrics(out, proto);
	if (rc == 0)
		rc = otlp_metric_counters(out, proto);
	if (rc == 0 && !proto)
		rc = otlp_metrics_prom(out); /* metrics.genai_prometheus: the GenAI families, text only */
	if (rc == 0)
		rc = route_pick_metrics(out, proto);
	upstream_gauges_free(g, n);
	store_result_free(&res);
	if (rc == -1) {
		evbuffer_drain(out, evbuffer_get_length(out));
		reply_error(req, 500, NULL, "out of memory rendering the metrics");
		return;
	}
	evhttp_add_header(evhttp_request_get_output_headers(req), "Vary", "Accept");
	reply(req, 200, proto ? PROM_PROTO_CONTENT_TYPE : "text/plain; version=0.0.4; charset=utf-8", NULL, 0);
}

static void on_requests_recent(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	size_t cap = recent_capacity(a->recent), n = RECENT_DEFAULT_N, got;
	struct recent_entry *snap;
	const char *v;
	char err[160], *text;

	if (!a->recent) {
		reply_error(req, 404, NULL, "recent requests are not kept by this tokentap");
		return;
	}
	if ((v = evhttp_find_header(p, "n")) && admin_recent_parse_n(v, cap, &n, err, sizeof(err)) == -1) {
		reply_error(req, 400, "n", "%s", err);
		return;
	}
	if (n > cap)
		n = cap; /* the default, on a ring smaller than it */
	snap = malloc(n * sizeof(*snap));
	if (!snap) {
		reply_error(req, 500, NULL, "out of memory reading the recent requests");
		return;
	}
	got = recent_snapshot(a->recent, snap, n);
	text = admin_recent_render(snap, got, cap);
	free(snap);
	if (!text) {
		reply_error(req, 500, NULL, "out of memory rendering the answer");
		return;
	}
	reply(req, 200, "application/json", text, strlen(text));
	free(text);
}

/* The page is static and self-contained; its policy forbids anything from
 * elsewhere (scripts, styles, images, connections), so it keeps working
 * offline and cannot be turned into a way out of the admin API. */
static void on_dashboard(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);

	evhttp_add_header(h, "Content-Security-Policy",
			  "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
			  "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
			  "frame-ancestors 'none'");
	evhttp_add_header(h, "X-Frame-Options", "DENY");
	evhttp_add_header(h, "Referrer-Policy", "no-referrer");
	reply(req, 200, "text/html; charset=utf-8", (const char *)dashboard_html, dashboard_html_len);
}

static void on_reset(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	char err[256], *peer = NULL;
	ev_uint16_t port = 0;

	if (store_reset(a->store, err, sizeof(err)) == -1) {
		log_error("admin: reset failed: %s", err);
		reply_error(req, 500, NULL, "reset failed: %s", err);
		return;
	}
	/* Rates restart with the data. */
	a->since_sec = (uint64_t)time(NULL);
	evhttp_connection_get_peer(evhttp_request_get_connection(req), &peer, &port);
	log_info("admin: stats reset by a request from %s:%u", peer ? peer : "?", (unsigned)port);
	reply_json_text(req, 200, "{\"reset\":true}\n");
}

/* How a live view spans the workers. */
enum live_span {
	LIVE_FIRST, /* the same everywhere (configuration, weights): the first worker's */
	LIVE_MERGE, /* per-worker counters: every worker's, merged */
	LIVE_EACH,  /* a change: the first worker validates and answers, then the rest follow */
};

/*
 * The weight change that puts `route` back as the first worker has it now
 * (NULL when it has no such route): {"route", "weights", "generation"}, so
 * that a worker reloaded since ignores it.
 */
static char *weights_undo(struct admin *a, const char *in)
{
	json_t *doc = json_loads(in, 0, NULL), *cur = NULL, *undo = NULL, *routes, *r, *t;
	const char *name = NULL;
	char *out = NULL, *text = NULL;
	int status = 0;
	size_t i, k;

	if (!doc || json_unpack(doc, "{s:s}", "route", &name) == -1)
		goto out;
	if (control_call(a->controls[0], live_routes, a->proxies[0], NULL, &text, &status, LIVE_TIMEOUT_MS) == -1 ||
	    !text || status != 200 || !(cur = json_loads(text, 0, NULL)))
		goto out;
	routes = json_object_get(cur, "routes");
	json_array_foreach (routes, i, r) {
		if (!json_is_string(json_object_get(r, "name")) ||
		    strcmp(json_string_value(json_object_get(r, "name")), name) != 0)
			continue;
		json_t *weights = json_object();
		json_array_foreach (json_object_get(r, "targets"), k, t)
			json_object_set(weights, json_string_value(json_object_get(t, "upstream")),
					json_object_get(t, "weight"));
		undo = json_pack("{s:s,s:o,s:O}", "route", name, "weights", weights, "generation",
				 json_object_get(cur, "generation"));
		break;
	}
	if (undo)
		out = json_dumps(undo, JSON_COMPACT);
out:
	json_decref(undo);
	json_decref(cur);
	json_decref(doc);
	free(text);
	return out;
}

/* Runs a live-state function on the workers and relays its JSON answer. A
 * change (LIVE_EACH) is true to its answer: 200 when every worker applied
 * it; when one did not answer in time (its job is then never run), the
 * workers before it are given the previous weights back, and the answer is
 * 503. */
static void relay_live(struct admin *a, struct evhttp_request *req, control_fn fn, const char *in, enum live_span span)
{
	char *outs[WORKERS_MAX] = { NULL }, *undo = NULL;
	int status = 500, st;
	unsigned n = span == LIVE_FIRST ? 1 : a->nworkers;

	if (!a->nworkers) {
		reply_error(req, 404, NULL, "live proxy state is not available in this process");
		return;
	}
	if (span == LIVE_EACH && n > 1)
		undo = weights_undo(a, in); /* NULL: no such route (the first worker says so), or no answer */
	for (unsigned i = 0; i < n; i++) {
		int rc = span == LIVE_EACH ? control_call_cancel(a->controls[i], fn, a->proxies[i], in, &outs[i],
								 i ? &st : &status, LIVE_TIMEOUT_MS)
					   : control_call(a->controls[i], fn, a->proxies[i], in, &outs[i],
							  i ? &st : &status, LIVE_TIMEOUT_MS);
		if (rc == -1 || !outs[i]) {
			unsigned undone = 0;
			for (unsigned j = 0; span == LIVE_EACH && undo && j < i; j++) {
				char *o = NULL;
				int s = 0;
				/* a plain call: should it time out, it still runs */
				if (control_call(a->controls[j], fn, a->proxies[j], undo, &o, &s, LIVE_TIMEOUT_MS) ==
					    0 &&
				    s == 200)
					undone++;
				free(o);
			}
			if (span == LIVE_EACH && i > 0)
				log_error(
					"admin: worker %u did not answer a weight change within %d ms; undone on %u of "
					"the "
					"%u worker(s) that applied it",
					i, LIVE_TIMEOUT_MS, undone, i);
			reply_error(req, 503, NULL, "the proxy did not answer within %d ms%s", LIVE_TIMEOUT_MS,
				    span == LIVE_EACH ? "; the change was not applied" : "");
			goto out;
		}
		if (i == 0 && span == LIVE_EACH && status != 200)
			break; /* refused: nothing changed anywhere */
		if (i && span == LIVE_EACH && st != 200)
			log_error("admin: worker %u refused a change the first accepted: %s", i, outs[i]);
	}
	if (span == LIVE_MERGE && n > 1) {
		char *merged = live_upstreams_merge((const char *const *)outs, n);
		if (!merged) {
			reply_error(req, 500, NULL, "out of memory merging the workers' views");
			goto out;
		}
		reply_json_text(req, status, merged);
		free(merged);
		goto out;
	}
	reply_json_text(req, status, outs[0]);
out:
	for (unsigned i = 0; i < n; i++)
		free(outs[i]);
	free(undo);
}

static void on_routes(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	relay_live(a, req, live_routes, NULL, LIVE_FIRST);
}

static void on_upstreams(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	relay_live(a, req, live_upstreams, NULL, LIVE_MERGE);
}

static void on_weights(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	struct evbuffer *body = evhttp_request_get_input_buffer(req);
	size_t len = evbuffer_get_length(body);
	char *in = malloc(len + 1);

	if (!in) {
		reply_error(req, 500, NULL, "out of memory");
		return;
	}
	evbuffer_copyout(body, in, len);
	in[len] = '\0';
	relay_live(a, req, live_set_weights, in, LIVE_EACH);
	free(in);
}

static void on_compare(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	enum store_window window = WIN_1H;
	enum cold_filter cold = COLD_EXCLUDE;
	const char *route = evhttp_find_header(p, "route");
	struct store_result res;
	char *text;
	json_t *labels, *assign;

	if (!route || !*route) {
		reply_error(req, 400, "route", "route is required: /compare?route=NAME");
		return;
	}
	if (!window_cold_parse(req, p, &window, &cold) || !query(a, req, window, &res))
		return;
	labels = upstream_labels(a);
	assign = route_assignment(a, route);
	text = compare_render(&res, route, window, (int)cold, a->since_sec, labels, assign);
	json_decref(assign);
	json_decref(labels);
	store_result_free(&res);
	reply_rendered(req, text);
}

/* The workload capture's summary (workload.c keeps it; docs/workload.md). */
static void on_workload(struct admin *a, struct evhttp_request *req, struct evkeyvalq *p)
{
	char *text = workload_summary_json(evhttp_find_header(p, "route"), evhttp_find_header(p, "model"));

	if (!text) {
		reply_error(req, 500, NULL, "out of memory");
		return;
	}
	reply_json_text(req, 200, text);
	free(text);
}

/* ---- routing ---- */

static void (*const handlers[ADMIN_R__COUNT])(struct admin *, struct evhttp_request *, struct evkeyvalq *) = {
#define X(e, path, methods, allow, write, params, fn) [ADMIN_R_##e] = fn,
	ADMIN_ROUTES(X)
#undef X
};

/* ---- connections: the cap and the request deadline ---- */

static void conn_free(struct admin_conn *c)
{
	struct admin *a = c->a;

	LIST_REMOVE(c, link);
	if (--a->nconns < ADMIN_MAX_CONNECTIONS)
		a->cap_warned = false;
	event_free(c->timer);
	bufferevent_decref(c->bev);
	free(c);
}

static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
	evhttp_connection_set_closecb(evcon, NULL, NULL);
	conn_free(arg);
}

static void conn_deadline(struct admin_conn *c)
{
	struct timeval tv = { ADMIN_REQUEST_DEADLINE_S, 0 };

	evtimer_add(c->timer, &tv);
}

/* First run (made active when the connection was accepted): hook the
 * connection up, or close it when it is past the cap. Later runs: the
 * request did not arrive in time, so close it. Closing is what evhttp does
 * on a read timeout (no answer, the connection freed), asked for through
 * its own event callback; on_conn_close then frees `c`. */
static void on_conn_timer(evutil_socket_t fd, short what, void *arg)
{
	struct admin_conn *c = arg;
	bufferevent_event_cb eventcb = NULL;
	void *evcon = NULL;

	bufferevent_getcb(c->bev, NULL, NULL, &eventcb, &evcon);
	if (!eventcb) {
		conn_free(c); /* evhttp freed it already */
		return;
	}
	if (!c->hooked) {
		c->hooked = true;
		evhttp_connection_set_closecb(evcon, on_conn_close, c);
		if (!c->over_cap) {
			conn_deadline(c);
			return;
		}
		if (!c->a->cap_warned) {
			c->a->cap_warned = true;
			log_warn("admin: connection cap of %u reached: new connections are closed",
				 ADMIN_MAX_CONNECTIONS);
		}
	}
	eventcb(c->bev, BEV_EVENT_READING | BEV_EVENT_TIMEOUT, evcon);
}

/* evhttp accepted a connection and asks for its bufferevent. NULL lets it
 * make its own (out of memory here: that connection goes uncounted). */
static struct bufferevent *on_conn_new(struct event_base *base, void *arg)
{
	struct admin *a = arg;
	struct admin_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->a = a;
	c->bev = bufferevent_socket_new(base, -1, 0); /* as evhttp's own: it closes the socket */
	c->timer = evtimer_new(base, on_conn_timer, c);
	if (!c->bev || !c->timer) {
		if (c->bev)
			bufferevent_free(c->bev);
		if (c->timer)
			event_free(c->timer);
		free(c);
		return NULL;
	}
	bufferevent_incref(c->bev);
	c->over_cap = a->nconns >= ADMIN_MAX_CONNECTIONS;
	a->nconns++;
	LIST_INSERT_HEAD(&a->conns, c, link);
	/* runs in this pass of the loop, after evhttp has set the connection
	 * up and before any read on it */
	event_active(c->timer, EV_TIMEOUT, 1);
	return c->bev;
}

/* The answer went out: the next request on the connection gets a deadline
 * of its own. */
static void on_answered(struct evhttp_request *req, void *arg)
{
	conn_deadline(arg);
}

/* A whole request arrived: its deadline is met. */
static void conn_request_arrived(struct admin *a, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
	struct admin_conn *c;

	LIST_FOREACH (c, &a->conns, link) {
		if (c->bev == bev) {
			evtimer_del(c->timer);
			evhttp_request_set_on_complete_cb(req, on_answered, c);
			return;
		}
	}
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct admin *a = arg;
	struct evkeyvalq *in = evhttp_request_get_input_headers(req);
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	struct admin_request r = {
		(unsigned)evhttp_request_get_command(req), uri ? evhttp_uri_get_path(uri) : NULL,
		uri ? evhttp_uri_get_query(uri) : NULL,	   evhttp_find_header(in, "Host"),
		evhttp_find_header(in, "Origin"),	   evhttp_find_header(in, "Authorization"),
	};
	struct admin_identity id = { a->bound_host, a->listen_addr, a->token, a->token_len };
	struct admin_verdict v;
	struct evkeyvalq params;

	conn_request_arrived(a, req);
	admin_gate(&r, &id, &params, &v);
	if (v.status) {
		struct evkeyvalq *out = evhttp_request_get_output_headers(req);
		if (v.allow)
			evhttp_add_header(out, "Allow", v.allow);
		if (v.www_authenticate)
			evhttp_add_header(out, "WWW-Authenticate", "Bearer realm=\"tokentap-admin\"");
		reply_error(req, v.status, v.param[0] ? v.param : NULL, "%s", v.message);
		return;
	}
	handlers[v.route](a, req, &params);
	evhttp_clear_headers(&params);
}

/* ---- set-up ---- */

static bool is_loopback(int family, const char *host)
{
	unsigned char b[16];

	if (family == AF_INET)
		return inet_pton(AF_INET, host, b) == 1 && b[0] == 127;
	if (inet_pton(AF_INET6, host, b) != 1)
		return false;
	static const unsigned char lo6[16] = { [15] = 1 };
	static const unsigned char mapped[12] = { [10] = 0xff, [11] = 0xff };
	return memcmp(b, lo6, 16) == 0 || (memcmp(b, mapped, 12) == 0 && b[12] == 127);
}

/* When collection began, as far as the stats on disk can tell: the creation
 * of the database file, else now (memory-only stores start empty). */
static uint64_t collection_start(const struct config *cfg, uint64_t now)
{
	char path[PATH_MAX];
	struct statx stx;

	if (!cfg || !cfg->data_dir)
		return now;
	if (snprintf(path, sizeof(path), "%s/data.mdb", cfg->data_dir) >= (int)sizeof(path))
		return now;
	if (statx(AT_FDCWD, path, 0, STATX_BTIME, &stx) == -1 || !(stx.stx_mask & STATX_BTIME))
		return now;
	return (uint64_t)stx.stx_btime.tv_sec < now ? (uint64_t)stx.stx_btime.tv_sec : now;
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	evconnlistener_enable(arg);
}

/* accept() failed (out of descriptors, most often; libevent retries the
 * passing errors itself): the listener pauses instead of reporting the
 * same error on every pass of the loop, as the proxy's do. evhttp owns the
 * listener and its argument, hence a one-off timer that knows only the
 * listener: it cannot outlive it, since admin_stop ends this loop before
 * evhttp_free, and event_base_free drops the timer unrun. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
	struct timeval pause = { ACCEPT_PAUSE_MS / 1000, (ACCEPT_PAUSE_MS % 1000) * 1000 };

	fdlimit_accept_failed("admin", EVUTIL_SOCKET_ERROR());
	if (event_base_once(evconnlistener_get_base(lev), -1, EV_TIMEOUT, on_accept_resume, lev, &pause) == 0)
		evconnlistener_disable(lev);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct admin *a = arg;
	event_base_loopbreak(a->base);
}

/* Admin work yields the CPU to forwarding: on Linux a thread has its own
 * nice value, and a loaded machine then runs the proxy's loop first. Best
 * effort; failing leaves the default priority. */
#define ADMIN_NICE 10

static void *admin_main(void *arg)
{
	struct admin *a = arg;

	errno = 0;
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), ADMIN_NICE) == -1)
		log_debug("admin: cannot lower the admin thread's priority: %s", strerror(errno));
	event_base_dispatch(a->base);
	return NULL;
}

struct admin *admin_start(const struct admin_options *o, struct store *store, const struct config *cfg,
			  struct recent *recent, char *err, size_t errlen)
{
	struct admin *a;
	struct evhttp_bound_socket *bound;
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	char host[INET6_ADDRSTRLEN + 1];
	int port, family;
	sigset_t block, old;

	if (!o || !o->listen) {
		snprintf(err, errlen, "admin: no listen address");
		return NULL;
	}
	if (config_parse_admin_listen(o->listen, host, sizeof(host), &port, &family) == -1) {
		snprintf(err, errlen,
			 "admin: cannot use '%s' as the admin address: expected ADDR:PORT with an IP address, such as "
			 "127.0.0.1:9901 or [::1]:9901 (or 'off')",
			 o->listen);
		return NULL;
	}
	if (!is_loopback(family, host) && !(o->token && *o->token)) {
		snprintf(err, errlen,
			 "admin: refusing to listen on %s without a token: the admin API would be reachable beyond "
			 "this machine with nothing guarding it; set --admin-token-file PATH or TOKENTAP_ADMIN_TOKEN, "
			 "or listen on 127.0.0.1",
			 o->listen);
		return NULL;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		snprintf(err, errlen, "admin: out of memory");
		return NULL;
	}
	a->wake_fd[0] = a->wake_fd[1] = -1;
	LIST_INIT(&a->conns);
	pthread_mutex_init(&a->labels_lock, NULL);
	a->labels = (json_t *)admin_labels_of(cfg);
	a->store = store;
	a->cfg = cfg;
	a->slo = o->slo;
	a->recent = recent;
	for (unsigned i = 0; i < o->nworkers && i < WORKERS_MAX; i++) {
		a->controls[i] = o->controls[i];
		a->proxies[i] = o->proxies[i];
	}
	a->nworkers = o->nworkers;
	if (o->token && *o->token) {
		a->token = strdup(o->token);
		if (!a->token) {
			snprintf(err, errlen, "admin: out of memory");
			goto fail;
		}
		a->token_len = strlen(a->token);
	}
	if (!(a->base = event_base_new()) || !(a->http = evhttp_new(a->base))) {
		snprintf(err, errlen, "admin: cannot create the event loop");
		goto fail;
	}
	evhttp_set_timeout(a->http, ADMIN_TIMEOUT_S);
	evhttp_set_max_headers_size(a->http, ADMIN_MAX_HEADERS);
	evhttp_set_max_body_size(a->http, ADMIN_MAX_BODY);
	/* Every method reaches on_request, so a wrong one gets 405 with Allow. */
	evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
						    EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
						    EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	evhttp_set_gencb(a->http, on_request, a);
	evhttp_set_bevcb(a->http, on_conn_new, a);
	bound = evhttp_bind_socket_with_handle(a->http, host, (ev_uint16_t)port);
	if (!bound) {
		snprintf(err, errlen, "admin: cannot listen on %s: %s", o->listen, strerror(errno));
		goto fail;
	}
	evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(bound), on_accept_error);
	if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &sslen) == -1) {
		snprintf(err, errlen, "admin: getsockname: %s", strerror(errno));
		goto fail;
	}
	port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
				       : ((struct sockaddr_in6 *)&ss)->sin6_port);
	if (family == AF_INET6)
		snprintf(a->bound_host, sizeof(a->bound_host), "[%s]", host);
	else
		snprintf(a->bound_host, sizeof(a->bound_host), "%s", host);
	snprintf(a->listen_addr, sizeof(a->listen_addr), "%s:%d", a->bound_host, port);

	if (pipe2(a->wake_fd, O_CLOEXEC | O_NONBLOCK) == -1) {
		snprintf(err, errlen, "admin: pipe: %s", strerror(errno));
		goto fail;
	}
	a->wake = event_new(a->base, a->wake_fd[0], EV_READ, on_wake, a);
	if (!a->wake || event_add(a->wake, NULL) == -1) {
		snprintf(err, errlen, "admin: cannot watch the wake-up pipe");
		goto fail;
	}
	a->since_sec = collection_start(cfg, (uint64_t)time(NULL));

	/* Signals belong to the main loop, never to this thread. */
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	int rc = pthread_create(&a->thread, NULL, admin_main, a);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		snprintf(err, errlen, "admin: cannot start its thread: %s", strerror(rc));
		goto fail;
	}
	a->running = true;
	log_info("admin listening on %s%s", a->listen_addr, a->token ? "" : " (no token: writes disabled)");
	return a;
fail:
	admin_stop(a);
	return NULL;
}

struct admin_labels *admin_labels_of(const struct config *cfg)
{
	json_t *doc = json_object(), *map = json_object(), *routes = json_object();

	if (!doc || !map || !routes)
		goto fail;
	json_object_set_new(doc, "upstreams", map);
	json_object_set_new(doc, "routes", routes);
	for (unsigned i = 0; cfg && i < cfg->nupstreams; i++) {
		const struct upstream_conf *uc = &cfg->upstreams[i];
		json_t *labels = json_object();
		for (unsigned l = 0; labels && l < uc->nlabels; l++)
			json_object_set_new(labels, uc->labels[l].key, json_string(uc->labels[l].value));
		if (!labels || json_object_set_new(map, uc->name, labels) == -1)
			goto fail_doc;
	}
	/* what /compare needs to know of how the route assigned its traffic */
	for (unsigned i = 0; cfg && i < cfg->nroutes; i++) {
		const struct route_conf *rc = &cfg->routes[i];
		json_t *o = json_pack("{s:s,s:I,s:o}", "balance", balance_policy_name(rc->balance), "targets",
				      (json_int_t)rc->ntargets, "mirror",
				      rc->mirror_upstream ? json_string(rc->mirror_upstream) : json_null());
		if (!o || json_object_set_new(routes, rc->name, o) == -1)
			goto fail_doc;
	}
	return (struct admin_labels *)doc;
fail:
	json_decref(map);
	json_decref(routes);
fail_doc:
	json_decref(doc);
	return NULL;
}

void admin_labels_use(struct admin *a, struct admin_labels *labels)
{
	json_t *old;

	if (!a) {
		json_decref((json_t *)labels);
		return;
	}
	pthread_mutex_lock(&a->labels_lock);
	old = a->labels;
	a->labels = (json_t *)labels;
	pthread_mutex_unlock(&a->labels_lock);
	json_decref(old);
}

const char *admin_listen_addr(const struct admin *a)
{
	return a ? a->listen_addr : "";
}

void admin_stop(struct admin *a)
{
	if (!a)
		return;
	if (a->running) {
		ssize_t w = write(a->wake_fd[1], "x", 1);
		(void)w; /* a full pipe already holds a wake-up */
		pthread_join(a->thread, NULL);
		a->running = false;
	}
	if (a->wake)
		event_free(a->wake);
	if (a->http)
		evhttp_free(a->http); /* closes every connection: on_conn_close */
	while (!LIST_EMPTY(&a->conns))
		conn_free(LIST_FIRST(&a->conns)); /* accepted in the loop's last pass, never hooked up */
	if (a->base)
		event_base_free(a->base);
	for (int i = 0; i < 2; i++)
		if (a->wake_fd[i] != -1)
			close(a->wake_fd[i]);
	if (a->token) {
		explicit_bzero(a->token, a->token_len);
		free(a->token);
	}
	json_decref(a->labels);
	pthread_mutex_destroy(&a->labels_lock);
	free(a);
}

/* What any admin token must be, from a file or the environment: one line
 * of ADMIN_TOKEN_MIN to TOKEN_MAX bytes without spaces or control
 * characters. A shorter one could be guessed by whoever reaches the port. */
static int token_check(const char *tok, size_t n, const char *where, char *err, size_t errlen)
{
	if (n > TOKEN_MAX) {
		snprintf(err, errlen, "%s: the token is longer than %d bytes", where, TOKEN_MAX);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)tok[i];
		if (c <= ' ' || c == 0x7f) {
			snprintf(err, errlen, "%s: the token must be one line without spaces or control characters",
				 where);
			return -1;
		}
	}
	if (n < ADMIN_TOKEN_MIN) {
		snprintf(err, errlen,
			 "%s: the token is %zu bytes; it needs at least %d (a long random string, such as the "
			 "output of: openssl rand -hex 32)",
			 where, n, ADMIN_TOKEN_MIN);
		return -1;
	}
	return 0;
}

int admin_token_env(char **out, char *err, size_t errlen)
{
	const char *v = getenv("TOKENTAP_ADMIN_TOKEN");

	*out = NULL;
	if (!v || !*v)
		return 0;
	if (token_check(v, strlen(v), "TOKENTAP_ADMIN_TOKEN", err, errlen) == -1)
		return -1;
	if (!(*out = strdup(v))) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

int admin_token_load(const char *path, char **out, char *err, size_t errlen)
{
	char buf[TOKEN_MAX + 2];
	size_t n;
	FILE *f = fopen(path, "re");

	*out = NULL;
	if (!f) {
		snprintf(err, errlen, "cannot read the admin token file %s: %s", path, strerror(errno));
		return -1;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	if (n > TOKEN_MAX) {
		snprintf(err, errlen, "admin token file %s: the token is longer than %d bytes", path, TOKEN_MAX);
		return -1;
	}
	buf[n] = '\0';
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		buf[--n] = '\0';
	if (n == 0) {
		snprintf(err, errlen, "admin token file %s is empty: put a long random string in it", path);
		return -1;
	}
	char where[300];
	snprintf(where, sizeof(where), "admin token file %s", path);
	if (token_check(buf, n, where, err, errlen) == -1) {
		explicit_bzero(buf, sizeof(buf));
		return -1;
	}
	*out = strdup(buf);
	explicit_bzero(buf, sizeof(buf));
	if (!*out) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}
