/*
 * live.c — JSON views of routes and upstreams, built on the worker thread.
 */
#include "live.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proxy.h"
#include "router.h"
#include "scrape.h"
#include "timeline.h"
#include "upstream.h"

static json_t *count_or_null(int64_t v)
{
	return v < 0 ? json_null() : json_integer((json_int_t)v);
}

static json_t *frac_or_null(double v)
{
	return v != v ? json_null() : json_real(v);
}

/* The engine's own view (its /metrics, scrape.h) beside tokentap's: what
 * it runs and queues against what tokentap had in flight to it at the same
 * moment. More at the engine than tokentap sent means other traffic
 * reaches it around the proxy. */
static json_t *engine_json(const struct upstream *u)
{
	struct engine_state st;
	char note[200];

	if (!u->conf.metrics_url)
		return json_null();
	upstream_engine_state(u, &st);
	json_t *o = json_object();
	json_object_set_new(o, "metrics_url", json_string(u->conf.metrics_url));
	json_object_set_new(o, "engine", st.scraped ? json_string(scrape_engine_name(st.engine)) : json_null());
	json_object_set_new(o, "scraped", json_boolean(st.scraped));
	json_object_set_new(o, "failing", json_boolean(st.failing));
	json_object_set_new(o, "failures", json_integer((json_int_t)st.failures));
	json_object_set_new(o, "error", st.failing ? json_string(st.error) : json_null());
	if (!st.scraped)
		return o;
	uint64_t now = clock_now_ns();
	int64_t engine_total = (st.running < 0 ? 0 : st.running) + (st.waiting < 0 ? 0 : st.waiting);
	int64_t beyond = engine_total - (int64_t)st.in_flight_at;
	json_object_set_new(o, "running", count_or_null(st.running));
	json_object_set_new(o, "waiting", count_or_null(st.waiting));
	json_object_set_new(o, "kv_use", frac_or_null(st.kv_use));
	json_object_set_new(o, "prefix_hit", frac_or_null(st.prefix_hit));
	json_object_set_new(o, "scraped_at_unix_ms", json_integer((json_int_t)st.at_unix_ms));
	json_object_set_new(o, "age_ms", json_integer((json_int_t)(now > st.at_ns ? (now - st.at_ns) / 1000000 : 0)));
	json_object_set_new(o, "tokentap_in_flight", json_integer(st.in_flight_at));
	json_object_set_new(o, "beyond_proxy", json_integer(beyond > 0 ? beyond : 0));
	if (beyond > 0) {
		snprintf(
			note, sizeof(note),
			"the engine reported %lld more requests (running + waiting) than tokentap had in flight to it: "
			"traffic reaches it around the proxy",
			(long long)beyond);
		json_object_set_new(o, "note", json_string(note));
	} else {
		json_object_set_new(o, "note", json_null());
	}
	return o;
}

static char *dump(json_t *o, int status, int *out_status)
{
	char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(o);
	*out_status = s ? status : 500;
	return s;
}

static char *error(int status, const char *msg, int *out_status)
{
	return dump(json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg, "type", "invalid_request", "code", status),
		    status, out_status);
}

static json_t *labels_json(const struct upstream_conf *uc)
{
	json_t *o = json_object();
	for (unsigned i = 0; i < uc->nlabels; i++)
		json_object_set_new(o, uc->labels[i].key, json_string(uc->labels[i].value));
	return o;
}

static json_t *str_or_null(const char *s)
{
	return s ? json_string(s) : json_null();
}

/* The balancing view of an upstream: the same in every worker (shared). */
static json_t *balance_json(const struct upstream *u)
{
	struct up_balance b;

	upstream_balance(u, &b, clock_now_ns());
	json_t *o = json_pack("{s:I,s:I,s:o,s:I,s:s,s:I,s:b,s:I,s:I}", "prefill_requests", (json_int_t)b.prefill_reqs,
			      "prefill_tokens", (json_int_t)b.prefill_tokens, "predicted_ttft_ms",
			      isnan(b.pred_now_ms) ? json_null() : json_real(b.pred_now_ms), "ttft_samples",
			      (json_int_t)b.fit.n, "ejection",
			      b.eject == UP_IN	      ? "in"
			      : b.eject == UP_EJECTED ? "ejected"
						      : "probe_due",
			      "eject_left_ms", (json_int_t)b.eject_left_ms, "probing", b.probing, "fails_in_row",
			      (json_int_t)b.fails_in_row, "ejections", (json_int_t)b.ejections);
	if (o) {
		json_object_set_new(o, "predictions", json_integer((json_int_t)b.predictions));
		json_object_set_new(o, "prediction_error_ms",
				    isnan(b.pred_err_ms) ? json_null() : json_real(b.pred_err_ms));
		json_object_set_new(o, "prediction_bias_ms",
				    isnan(b.pred_bias_ms) ? json_null() : json_real(b.pred_bias_ms));
	}
	return o;
}

static json_t *route_json(const struct route *r)
{
	const struct route_conf *c = r->conf;
	json_t *o = json_object(), *match = json_object(), *targets = json_array();
	unsigned total = 0;

	for (unsigned i = 0; i < r->ntargets; i++)
		total += r->targets[i].weight;
	json_object_set_new(match, "path_prefix", json_string(c->path_prefix));
	json_object_set_new(match, "method", str_or_null(c->method));
	json_object_set_new(match, "host", str_or_null(c->host));
	json_object_set_new(match, "model", str_or_null(c->model));
	json_object_set_new(o, "balance", json_string(balance_policy_name(c->balance)));
	for (unsigned i = 0; i < r->ntargets; i++) {
		json_t *t = json_object();
		json_object_set_new(t, "upstream", json_string(r->targets[i].up->name));
		json_object_set_new(t, "weight", json_integer(r->targets[i].weight));
		json_object_set_new(t, "share", json_real(total ? (double)r->targets[i].weight / total : 0));
		json_object_set_new(t, "labels", labels_json(&r->targets[i].up->conf));
		json_array_append_new(targets, t);
	}
	json_object_set_new(o, "name", json_string(r->name));
	json_object_set_new(o, "match", match);
	json_object_set_new(o, "targets", targets);
	json_object_set_new(
		o, "sticky",
		c->sticky == STICKY_NONE
			? json_null()
			: json_pack("{s:s}", c->sticky == STICKY_HEADER ? "header" : "json_field", c->sticky_key));
	json_object_set_new(o, "failover", json_boolean(c->failover));
	json_object_set_new(o, "ttft_deadline_ms",
			    c->ttft_deadline_ms ? json_integer((json_int_t)c->ttft_deadline_ms) : json_null());
	json_object_set_new(o, "mirror",
			    r->mirror ? json_pack("{s:s,s:I,s:I,s:o}", "upstream", r->mirror->name, "percent",
						  (json_int_t)c->mirror_percent, "max_in_flight",
						  (json_int_t)c->mirror_max_in_flight, "labels",
						  labels_json(&r->mirror->conf))
				      : json_null());
	return o;
}

char *live_routes(void *proxy, const char *in, int *status)
{
	const struct router *rt = proxy_router(proxy);
	json_t *routes = json_array();

	for (unsigned i = 0; i < rt->nroutes; i++)
		json_array_append_new(routes, route_json(&rt->routes[i]));
	return dump(json_pack("{s:I,s:s?,s:o}", "generation", (json_int_t)rt->generation, "config", rt->cfg.path,
			      "routes", routes),
		    200, status);
}

char *live_upstreams(void *proxy, const char *in, int *status)
{
	const struct router *rt = proxy_router(proxy);
	json_t *ups = json_array();

	for (unsigned i = 0; i < rt->nups; i++) {
		const struct upstream *u = rt->ups[i];
		json_t *o = json_object(), *errors = json_object();
		for (int e = 1; e < REQ_ERR__COUNT; e++)
			if (u->errors[e])
				json_object_set_new(errors, req_error_name((enum req_error)e),
						    json_integer((json_int_t)u->errors[e]));
		json_object_set_new(o, "name", json_string(u->name));
		json_object_set_new(o, "url", json_string(u->conf.url));
		json_object_set_new(o, "labels", labels_json(&u->conf));
		json_object_set_new(o, "in_flight", json_integer(upstream_inflight(u)));
		json_object_set_new(o, "queued", json_integer(upstream_waiting(u)));
		json_object_set_new(o, "max_concurrency",
				    u->conf.max_concurrency ? json_integer(u->conf.max_concurrency) : json_null());
		json_object_set_new(o, "queue_max", json_integer(u->conf.queue_max));
		json_object_set_new(o, "requests", json_integer((json_int_t)u->requests));
		json_object_set_new(o, "rejected", json_integer((json_int_t)u->rejected));
		/* the server's, every worker's together: not added up again */
		for (unsigned c = 0; c < UPC__COUNT; c++)
			json_object_set_new(o, upstream_counter_keys[c],
					    json_integer((json_int_t)upstream_counter(u, (enum upstream_counter)c)));
		json_object_set_new(o, "errors", errors);
		json_object_set_new(o, "last_error",
				    u->last_error_unix ? json_pack("{s:s,s:I}", "kind", req_error_name(u->last_error),
								   "unix", (json_int_t)u->last_error_unix)
						       : json_null());
		json_object_set_new(o, "reachable", json_boolean(!u->failing));
		json_object_set_new(o, "engine", engine_json(u));
		json_object_set_new(o, "balance", balance_json(u));
		json_object_set_new(o, "pool",
				    json_pack("{s:i,s:I,s:I}", "idle", (int)u->n_idle, "opened", (json_int_t)u->opened,
					      "reused", (json_int_t)u->reused));
		json_array_append_new(ups, o);
	}
	return dump(json_pack("{s:I,s:o}", "generation", (json_int_t)rt->generation, "upstreams", ups), 200, status);
}

char *live_set_weights(void *proxy, const char *in, int *status)
{
	struct router *rt = proxy_router(proxy);
	json_error_t jerr;
	json_t *doc = in ? json_loads(in, 0, &jerr) : NULL, *weights, *v;
	const char *route_name = NULL, *key;
	struct route *r;
	char msg[256];
	unsigned total = 0;

	if (!doc || json_unpack(doc, "{s:s,s:o}", "route", &route_name, "weights", &weights) == -1 ||
	    !json_is_object(weights)) {
		json_decref(doc);
		return error(400, "expected {\"route\": NAME, \"weights\": {UPSTREAM: WEIGHT, ...}}", status);
	}
	json_t *gen = json_object_get(doc, "generation");
	if (gen && (!json_is_integer(gen) || (uint64_t)json_integer_value(gen) != rt->generation)) {
		/* an undo (admin.c) meant for a generation since replaced */
		json_decref(doc);
		return error(409, "the configuration was reloaded since; weights unchanged", status);
	}
	r = router_route(rt, route_name);
	if (!r) {
		snprintf(msg, sizeof(msg), "no route named %s", route_name);
		json_decref(doc);
		return error(404, msg, status);
	}
	/* validate everything first, so a bad request changes nothing */
	for (unsigned i = 0; i < r->ntargets; i++) {
		json_t *w = json_object_get(weights, r->targets[i].up->name);
		total += w ? (unsigned)json_integer_value(w) : r->targets[i].weight;
	}
	json_object_foreach (weights, key, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000) {
			snprintf(msg, sizeof(msg), "weight of %s: expected a whole number from 0 to 1000000", key);
			json_decref(doc);
			return error(400, msg, status);
		}
		bool found = false;
		for (unsigned i = 0; i < r->ntargets; i++)
			found |= strcmp(r->targets[i].up->name, key) == 0;
		if (!found) {
			snprintf(msg, sizeof(msg), "route %s does not send to an upstream named %s", r->name, key);
			json_decref(doc);
			return error(400, msg, status);
		}
	}
	if (total == 0) {
		json_decref(doc);
		return error(400, "the weights would add up to 0", status);
	}
	json_object_foreach (weights, key, v)
		route_set_weight(r, key, (unsigned)json_integer_value(v));
	json_decref(doc);
	return dump(route_json(r), 200, status);
}

static void add_int(json_t *dst, const char *key, json_t *src)
{
	json_t *a = json_object_get(dst, key), *b = json_object_get(src, key);
	if (json_is_integer(b))
		json_object_set_new(
			dst, key,
			json_integer((json_is_integer(a) ? json_integer_value(a) : 0) + json_integer_value(b)));
}

static json_t *find_named(json_t *arr, const char *name)
{
	size_t i;
	json_t *u;
	json_array_foreach (arr, i, u) {
		const char *n = json_string_value(json_object_get(u, "name"));
		if (n && strcmp(n, name) == 0)
			return u;
	}
	return NULL;
}

static void merge_upstream(json_t *into, json_t *from)
{
	json_t *errs = json_object_get(into, "errors"), *ferrs = json_object_get(from, "errors");
	json_t *pool = json_object_get(into, "pool"), *fpool = json_object_get(from, "pool");
	json_t *le = json_object_get(into, "last_error"), *fle = json_object_get(from, "last_error");
	const char *key;
	json_t *v;

	add_int(into, "requests", from);
	add_int(into, "rejected", from);
	if (json_is_object(errs) && json_is_object(ferrs))
		json_object_foreach (ferrs, key, v)
			add_int(errs, key, ferrs);
	if (json_is_object(pool) && json_is_object(fpool)) {
		add_int(pool, "idle", fpool);
		add_int(pool, "opened", fpool);
		add_int(pool, "reused", fpool);
	}
	if (json_is_object(fle) && (!json_is_object(le) || json_integer_value(json_object_get(fle, "unix")) >
								   json_integer_value(json_object_get(le, "unix"))))
		json_object_set(into, "last_error", fle);
	if (!json_is_true(json_object_get(from, "reachable")))
		json_object_set_new(into, "reachable", json_false());
}

char *live_upstreams_merge(const char *const *texts, unsigned n)
{
	json_t *docs[WORKERS_MAX] = { NULL }, *ups;
	char *out = NULL;
	size_t i;
	json_t *u;

	if (n == 0 || n > WORKERS_MAX)
		return NULL;
	for (unsigned k = 0; k < n; k++)
		if (!(docs[k] = json_loads(texts[k], 0, NULL)))
			goto done;
	ups = json_object_get(docs[0], "upstreams");
	json_array_foreach (ups, i, u) {
		const char *name = json_string_value(json_object_get(u, "name"));
		for (unsigned k = 1; name && k < n; k++) {
			json_t *other = find_named(json_object_get(docs[k], "upstreams"), name);
			if (other)
				merge_upstream(u, other);
		}
	}
	out = json_dumps(docs[0], JSON_COMPACT | JSON_PRESERVE_ORDER);
done:
	for (unsigned k = 0; k < n; k++)
		json_decref(docs[k]);
	return out;
}
