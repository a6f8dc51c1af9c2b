/*
 * bench_admin.c — --compare-admin: after a run, read tokentap's /stats and
 * print the client's percentiles beside tokentap's, with the difference.
 *
 * The window is the smallest of tokentap's windows (5m at least) that covers
 * the run. Stats reach the admin API once per flush interval, so /stats is
 * polled (a few seconds at most) until it has seen as many requests as the
 * client finished. tokentap's numbers cover everything in its window —
 * warm-up requests and anybody else's traffic included — which the output
 * says next to them.
 */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#define ADMIN_TIMEOUT_S 5
#define ADMIN_POLL_MAX 25 /* 200 ms apart: 5 s */

struct fetch {
	struct event_base *base;
	int status;
	char *body;
	size_t len;
	bool done;
};

static void on_response(struct evhttp_request *req, void *arg)
{
	struct fetch *f = arg;
	f->done = true;
	if (req) {
		struct evbuffer *b = evhttp_request_get_input_buffer(req);
		f->status = evhttp_request_get_response_code(req);
		f->len = evbuffer_get_length(b);
		if (f->len < (8u << 20) && (f->body = malloc(f->len + 1))) {
			evbuffer_remove(b, f->body, f->len);
			f->body[f->len] = '\0';
		}
	}
	event_base_loopexit(f->base, NULL);
}

/* GET host:port/path_query; the body (malloc'd) or NULL with `err` set. */
static char *http_get(const char *host, unsigned port, const char *path_query, char *err, size_t errlen)
{
	struct fetch f = { 0 };
	struct evhttp_connection *conn = NULL;
	struct evhttp_request *req;
	char hostport[300];

	if (!(f.base = event_base_new()))
		goto fail;
	if (!(conn = evhttp_connection_base_new(f.base, NULL, host, (unsigned short)port)))
		goto fail;
	evhttp_connection_set_timeout(conn, ADMIN_TIMEOUT_S);
	if (!(req = evhttp_request_new(on_response, &f)))
		goto fail;
	snprintf(hostport, sizeof(hostport), "%s:%u", host, port);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Host", hostport);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
	if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, path_query) == -1)
		goto fail;
	event_base_dispatch(f.base);
	if (!f.done || f.status == 0)
		snprintf(err, errlen, "no answer from %s", hostport);
	else if (f.status != 200)
		snprintf(err, errlen, "GET %s answered %d: %.200s", path_query, f.status, f.body ? f.body : "");
	else if (!f.body)
		snprintf(err, errlen, "GET %s: answer too large", path_query);
	if (f.status != 200) {
		free(f.body);
		f.body = NULL;
	}
	evhttp_connection_free(conn);
	event_base_free(f.base);
	return f.body;
fail:
	snprintf(err, errlen, "cannot send a request to %s:%u", host, port);
	if (conn)
		evhttp_connection_free(conn);
	if (f.base)
		event_base_free(f.base);
	return NULL;
}

/* "http://HOST:PORT[/prefix]" */
static int parse_admin_url(const char *url, char *host, size_t hostlen, unsigned *port, char *prefix, size_t plen)
{
	const char *p = url, *end, *colon;
	if (strncmp(p, "http://", 7))
		return -1;
	p += 7;
	end = p + strcspn(p, "/");
	if (*p == '[') {
		const char *rb = memchr(p, ']', (size_t)(end - p));
		if (!rb)
			return -1;
		colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
		if ((size_t)(rb - p - 1) >= hostlen)
			return -1;
		memcpy(host, p + 1, (size_t)(rb - p - 1));
		host[rb - p - 1] = '\0';
	} else {
		colon = memchr(p, ':', (size_t)(end - p));
		size_t hl = (size_t)((colon ? colon : end) - p);
		if (hl == 0 || hl >= hostlen)
			return -1;
		memcpy(host, p, hl);
		host[hl] = '\0';
	}
	*port = 80;
	if (colon) {
		char *e;
		unsigned long v = strtoul(colon + 1, &e, 10);
		if (e != end || v == 0 || v > 65535)
			return -1;
		*port = (unsigned)v;
	}
	size_t pl = strlen(end);
	while (pl && end[pl - 1] == '/')
		pl--;
	if (pl >= plen)
		return -1;
	memcpy(prefix, end, pl);
	prefix[pl] = '\0';
	return 0;
}

static const char *window_for(double wall_s)
{
	if (wall_s < 280)
		return "5m";
	if (wall_s < 3500)
		return "1h";
	if (wall_s < 86000)
		return "24h";
	return "7d";
}

/* The series to compare with: the only one, else the busiest. */
static json_t *pick_series(json_t *root, size_t *nseries, uint64_t *total)
{
	json_t *arr = json_object_get(root, "series"), *best = NULL, *s;
	size_t i;
	json_int_t most = -1;

	*total = 0;
	*nseries = json_is_array(arr) ? json_array_size(arr) : 0;
	json_array_foreach (arr, i, s) {
		json_int_t n = json_integer_value(json_object_get(s, "requests"));
		*total += (uint64_t)(n > 0 ? n : 0);
		if (n > most) {
			most = n;
			best = s;
		}
	}
	return best;
}

static void put_cell(FILE *out, double v)
{
	if (isnan(v))
		fprintf(out, " %12s", "-");
	else
		fprintf(out, " %12.3f", v);
}

static const char *jstr(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "?";
}

static double jnum(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

int admin_compare(FILE *out, const struct bench_opts *o, const struct bench_result *r, void *json_root)
{
	char host[256], prefix[256], pq[1024], err[512] = "";
	unsigned port;
	const char *win = window_for(r->wall_s);
	uint64_t expect = r->m.ok + r->m.failed + r->w.ok + r->w.failed, seen = 0;
	json_t *root = NULL, *series = NULL;
	size_t nseries = 0;

	if (parse_admin_url(o->compare_admin, host, sizeof(host), &port, prefix, sizeof(prefix)) == -1) {
		fprintf(stderr, BENCH_NAME ": --compare-admin: '%s' is not http://HOST:PORT\n", o->compare_admin);
		return -1;
	}
	snprintf(pq, sizeof(pq), "%s/stats?window=%s", prefix, win);
	if (o->model) {
		char *enc = evhttp_uriencode(o->model, -1, 0);
		if (enc) {
			snprintf(pq + strlen(pq), sizeof(pq) - strlen(pq), "&model=%s", enc);
			free(enc);
		}
	}
	for (int i = 0; i < ADMIN_POLL_MAX; i++) {
		char *body = http_get(host, port, pq, err, sizeof(err));
		if (!body)
			break;
		json_decref(root);
		root = json_loads(body, 0, NULL);
		free(body);
		if (!root) {
			snprintf(err, sizeof(err), "GET %.480s: the answer is not JSON", pq);
			break;
		}
		series = pick_series(root, &nseries, &seen);
		if (seen >= expect)
			break;
		struct timespec ts = { 0, 200 * 1000000L };
		nanosleep(&ts, NULL);
	}
	if (!root || err[0]) {
		fprintf(stderr, BENCH_NAME ": --compare-admin: %s\n", err[0] ? err : "no answer");
		json_decref(root);
		return -1;
	}
	if (!series) {
		fprintf(out, "\ntokentap (http://%s:%u%s): no series in window %s%s%s\n", host, port, pq, win,
			o->model ? " for model " : "", o->model ? o->model : "");
		json_decref(root);
		return 0;
	}

	json_t *cmp = json_object(), *rows = json_array();
	fprintf(out, "\nclient vs tokentap — http://%s:%u%s (series %s / %s / %s: %lld requests", host, port, pq,
		jstr(series, "route"), jstr(series, "upstream"), jstr(series, "model"),
		(long long)json_integer_value(json_object_get(series, "requests")));
	if (nseries > 1)
		fprintf(out, "; the busiest of %zu series", nseries);
	fprintf(out, ")\n");
	fprintf(out,
		"client: %llu measured requests, warm-up excluded; tokentap: every request in its window "
		"(warm-up and other traffic included)%s\n",
		(unsigned long long)r->m.ok,
		seen < expect ? "; NOTE: tokentap had not yet seen every request when read" : "");
	fprintf(out,
		"client ttft starts when the first byte is written, tokentap's when it reads it: expect "
		"tokentap's ttft lower by the network legs\n");
	fprintf(out, "%-6s %-6s %12s %12s %10s %8s\n", "metric", "stat", "client ms", "tokentap ms", "diff ms",
		"diff %");

	static const char *const stat_keys[] = {
		"mean_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms"
	};
	static const char *const stat_names[] = { "mean", "p50", "p90", "p95", "p99", "p99.9", "max" };
	static const double qs[] = { -1, 0.5, 0.9, 0.95, 0.99, 0.999, 2 };
	json_t *metrics = json_object_get(series, "metrics");
	for (int m = 0; m < BM__COUNT; m++) {
		const struct hist *h = &r->m.h[m];
		json_t *tm = json_object_get(metrics, bench_metric_key((enum bench_metric)m));
		for (size_t k = 0; k < sizeof(qs) / sizeof(qs[0]); k++) {
			double c = !h->count   ? NAN
				   : qs[k] < 0 ? hist_mean(h) / 1000.0
				   : qs[k] > 1 ? (double)h->max / 1000.0
					       : report_quantile_ms(h, qs[k]);
			double t = jnum(tm, stat_keys[k]);
			if (isnan(c) && isnan(t))
				continue;
			fprintf(out, "%-6s %-6s", bench_metric_key((enum bench_metric)m), stat_names[k]);
			put_cell(out, c);
			put_cell(out, t);
			if (!isnan(c) && !isnan(t))
				fprintf(out, " %+10.3f %+7.2f%%\n", t - c, c != 0 ? (t - c) / c * 100.0 : 0.0);
			else
				fputc('\n', out);
			json_t *row = json_object();
			json_object_set_new(row, "metric", json_string(bench_metric_key((enum bench_metric)m)));
			json_object_set_new(row, "stat", json_string(stat_keys[k]));
			json_object_set_new(row, "client", isnan(c) ? json_null() : json_real(c));
			json_object_set_new(row, "tokentap", isnan(t) ? json_null() : json_real(t));
			json_object_set_new(row, "diff", isnan(c) || isnan(t) ? json_null() : json_real(t - c));
			json_array_append_new(rows, row);
		}
	}
	json_object_set_new(cmp, "url", json_string(o->compare_admin));
	json_object_set_new(cmp, "query", json_string(pq));
	json_object_set_new(cmp, "tokentap_requests", json_incref(json_object_get(series, "requests")));
	json_object_set_new(cmp, "rows", rows);
	if (json_root)
		json_object_set_new((json_t *)json_root, "compare_admin", cmp);
	else
		json_decref(cmp);
	json_decref(root);
	return 0;
}
