/*
 * admin_stats.c — groups store series by (route, upstream, model) and renders
 * the JSON of /stats, /stats/prompt and /stats/curve.
 *
 * Every key naming a metric, a counter, a status class or an error kind is
 * generated from the X-macro lists (HIST_METRICS, SLICE_COUNTERS,
 * REQUEST_ERRORS) through their name functions; nothing here lists them
 * again. Units are converted once, in unit_views[]: the stored integers
 * (µs, milli-tokens/s, counts) become ms, tokens/s and counts.
 */
#include "admin_stats.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "knee.h"
#include "series_key.h"
#include "timeline.h"

/* How a stored unit is shown: key suffix and divisor. */
static const struct unit_view {
	const char *suffix;
	double div;
} unit_views[] = {
	[UNIT_US] = { "_ms", 1000.0 },		    /* stored µs */
	[UNIT_MILLI] = { "_tokens_per_s", 1000.0 }, /* slice.h: decode rate in milli-tokens/s */
	[UNIT_COUNT] = { "", 1.0 },
	[UNIT_MILLI_COUNT] = { "", 1000.0 }, /* a mean count in thousandths */
};

static const struct {
	double q;
	const char *name;
} quantiles[] = {
	{ 0.5, "p50" }, { 0.9, "p90" }, { 0.95, "p95" }, { 0.99, "p99" }, { 0.999, "p99_9" },
};

static const char *const cold_names[COLD__COUNT] = { "include", "exclude", "only" };

int cold_filter_parse(const char *s, enum cold_filter *out)
{
	for (int i = 0; i < COLD__COUNT; i++) {
		if (strcmp(s, cold_names[i]) == 0) {
			*out = (enum cold_filter)i;
			return 0;
		}
	}
	return -1;
}

const char *cold_filter_name(enum cold_filter c)
{
	return c < COLD__COUNT ? cold_names[c] : "include";
}

/* ---- grouping ---- */

static bool label_matches(const char *want, const char *have)
{
	return !want || !*want || strcmp(want, have) == 0;
}

static int group_cmp(const void *a, const void *b)
{
	const struct stats_group *x = a, *y = b;
	int c = strcmp(x->route, y->route);
	if (!c)
		c = strcmp(x->upstream, y->upstream);
	if (!c)
		c = strcmp(x->model, y->model);
	return c;
}

static struct stats_group *group_get(struct stats_groups *gs, const char *route, const char *upstream,
				     const char *model)
{
	for (size_t i = 0; i < gs->n; i++) {
		struct stats_group *g = &gs->g[i];
		if (strcmp(g->route, route) == 0 && strcmp(g->upstream, upstream) == 0 && strcmp(g->model, model) == 0)
			return g;
	}
	if (gs->n == gs->cap) {
		size_t cap = gs->cap ? gs->cap * 2 : 8;
		struct stats_group *p = realloc(gs->g, cap * sizeof(*p));
		if (!p)
			return NULL;
		gs->g = p;
		gs->cap = cap;
	}
	struct stats_group *g = &gs->g[gs->n++];
	memset(g, 0, sizeof(*g));
	g->route = route;
	g->upstream = upstream;
	g->model = model;
	return g;
}

/* By route, then the most requests first, then by name. */
static int tenant_group_cmp(const void *a, const void *b)
{
	const struct stats_group *x = a, *y = b;
	int c = strcmp(x->route, y->route);
	if (c)
		return c;
	if (x->slice.counters[CT_REQUESTS] != y->slice.counters[CT_REQUESTS])
		return x->slice.counters[CT_REQUESTS] > y->slice.counters[CT_REQUESTS] ? -1 : 1;
	return strcmp(x->model, y->model);
}

static int tenant_groups_build(const struct store_result *r, const struct stats_query *q, struct stats_groups *out)
{
	for (size_t i = 0; i < r->n; i++) {
		const struct store_series *s = &r->series[i];
		const char *route, *tenant;

		if (series_key_parse_tenant(s->key, s->keylen, &route, &tenant) == -1)
			continue;
		if (!label_matches(q->route, route) || !label_matches(q->tenant, tenant))
			continue;
		struct stats_group *g = group_get(out, route, "", tenant);
		if (!g) {
			stats_groups_free(out);
			return -1;
		}
		g->warm_requests += s->slice.counters[CT_REQUESTS];
		slice_merge(&g->slice, &s->slice);
		g->matched = true;
	}
	if (out->n > 1)
		qsort(out->g, out->n, sizeof(*out->g), tenant_group_cmp);
	return 0;
}

int stats_groups_build(const struct store_result *r, const struct stats_query *q, struct stats_groups *out)
{
	memset(out, 0, sizeof(*out));
	if (q->by_tenant)
		return tenant_groups_build(r, q, out);
	for (size_t i = 0; i < r->n; i++) {
		const struct store_series *s = &r->series[i];
		const char *route, *upstream, *model;
		bool cold;

		if (series_key_parse(s->key, s->keylen, &route, &upstream, &model, &cold) == -1)
			continue;
		if (!label_matches(q->route, route) || !label_matches(q->upstream, upstream) ||
		    !label_matches(q->model, model))
			continue;
		struct stats_group *g = group_get(out, route, upstream, model);
		if (!g) {
			stats_groups_free(out);
			return -1;
		}
		if (cold)
			g->cold_requests += s->slice.counters[CT_REQUESTS];
		else
			g->warm_requests += s->slice.counters[CT_REQUESTS];
		if (q->cold == COLD_INCLUDE || (q->cold == COLD_EXCLUDE && !cold) || (q->cold == COLD_ONLY && cold)) {
			slice_merge(&g->slice, &s->slice);
			g->matched = true;
		}
	}
	/* A group the cold filter left empty is not part of the answer. */
	size_t kept = 0;
	for (size_t i = 0; i < out->n; i++) {
		if (out->g[i].matched)
			out->g[kept++] = out->g[i];
		else
			slice_release(&out->g[i].slice);
	}
	out->n = kept;
	if (out->n > 1)
		qsort(out->g, out->n, sizeof(*out->g), group_cmp);
	return 0;
}

void stats_groups_free(struct stats_groups *g)
{
	for (size_t i = 0; i < g->n; i++)
		slice_release(&g->g[i].slice);
	free(g->g);
	memset(g, 0, sizeof(*g));
}

/* ---- JSON pieces ---- */

/* Adds `v` under `key`; a failed allocation leaves the key out, which the
 * final json_dumps cannot tell from success, so the caller checks `root`
 * only. Small answers, so that trade is fine. */
static void put(json_t *o, const char *key, json_t *v)
{
	json_object_set_new(o, key, v ? v : json_null());
}

static json_t *json_u64(uint64_t v)
{
	return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *json_bound(uint64_t v)
{
	return v == UINT64_MAX ? json_null() : json_u64(v);
}

static json_t *json_ratio(double num, double den)
{
	return den > 0 ? json_real(num / den) : json_null();
}

static void iso8601(uint64_t sec, char out[32])
{
	time_t t = (time_t)sec;
	struct tm tm;
	if (!gmtime_r(&t, &tm) || !strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(out, 32, "%llu", (unsigned long long)sec);
}

/* count, mean, percentiles and max of `h` in the unit's display form; the
 * values are null when the histogram is empty (or absent). */
json_t *stats_hist_json(const struct hist *h, enum metric_unit unit)
{
	const struct unit_view *u = &unit_views[unit];
	json_t *o = json_object();
	char key[48];
	bool empty = !h || h->count == 0;

	if (!o)
		return NULL;
	put(o, "count", json_u64(empty ? 0 : h->count));
	snprintf(key, sizeof(key), "mean%s", u->suffix);
	put(o, key, empty ? json_null() : json_real(hist_mean(h) / u->div));
	for (size_t i = 0; i < sizeof(quantiles) / sizeof(quantiles[0]); i++) {
		snprintf(key, sizeof(key), "%s%s", quantiles[i].name, u->suffix);
		put(o, key, empty ? json_null() : json_real((double)hist_quantile(h, quantiles[i].q) / u->div));
	}
	snprintf(key, sizeof(key), "max%s", u->suffix);
	put(o, key, empty ? json_null() : json_real((double)h->max / u->div));
	return o;
}

static const struct hist *slot(const struct slice *s, unsigned i)
{
	return s->slot[i];
}

static void put_labels(json_t *o, const struct stats_group *g, const struct stats_query *q)
{
	put(o, "route", json_string(g->route));
	if (q->by_tenant) {
		put(o, "tenant", json_string(g->model));
		put(o, "requests", json_u64(g->slice.counters[CT_REQUESTS]));
		return;
	}
	put(o, "upstream", json_string(g->upstream));
	put(o, "model", json_string(g->model));
	{
		json_t *lab = q->labels ? json_object_get(q->labels, g->upstream) : NULL;
		put(o, "labels", lab ? json_incref(lab) : json_object());
	}
	put(o, "cold", json_string(cold_filter_name(q->cold)));
	put(o, "requests", json_u64(g->slice.counters[CT_REQUESTS]));
	put(o, "cold_requests", json_u64(q->cold == COLD_EXCLUDE ? 0 : g->cold_requests));
}

/* ---- /stats ---- */

/* The thresholds a request's goodput is judged against, in ms: one row per
 * field of struct slo, so a threshold added there is named by adding its
 * row here. */
static const struct {
	const char *key;
	size_t offset; /* of a uint64_t in µs */
} slo_fields[] = {
	{ "ttft_ms", offsetof(struct slo, ttft_us) },
	{ "tpot_ms", offsetof(struct slo, tpot_us) },
	{ "itl_ms", offsetof(struct slo, itl_us) }, /* 0: not checked, shown as null */
};

static json_t *slo_json(const struct slo *slo)
{
	json_t *o = json_object();

	for (size_t i = 0; o && i < sizeof(slo_fields) / sizeof(slo_fields[0]); i++) {
		uint64_t us;
		memcpy(&us, (const char *)slo + slo_fields[i].offset, sizeof(us));
		if (!us)
			put(o, slo_fields[i].key, json_null());
		else if (us % 1000)
			put(o, slo_fields[i].key, json_real((double)us / 1000.0));
		else
			put(o, slo_fields[i].key, json_u64(us / 1000));
	}
	return o;
}

static json_t *summary_json(const struct stats_group *g, const struct stats_query *q, uint64_t elapsed_s)
{
	const struct slice *s = &g->slice;
	const size_t status_prefix = strlen("status_");
	json_t *o = json_object(), *st, *er, *tp, *gp, *mx, *cx, *cd, *pc;

	if (!o)
		return NULL;
	put_labels(o, g, q);

	st = json_object();
	for (unsigned c = CT_STATUS_NONE; c <= CT_STATUS_5XX && st; c++) {
		const char *name = slice_counter_name(c);
		put(st, strlen(name) > status_prefix ? name + status_prefix : name, json_u64(s->counters[c]));
	}
	put(o, "status", st);

	er = json_object();
	for (unsigned e = REQ_ERR_NONE + 1; e < REQ_ERR__COUNT && er; e++)
		put(er, req_error_name((enum req_error)e), json_u64(s->counters[CT_ERR_BASE + e]));
	put(o, "errors", er);

	put(o, "input_tokens", json_u64(s->counters[CT_INPUT_TOKENS]));
	put(o, "output_tokens", json_u64(s->counters[CT_OUTPUT_TOKENS]));
	put(o, "cached_tokens", json_u64(s->counters[CT_CACHED_TOKENS]));
	put(o, "cache_write_tokens", json_u64(s->counters[CT_CACHE_WRITE_TOKENS]));
	put(o, "reasoning_tokens", json_u64(s->counters[CT_REASONING_TOKENS]));

	/* Token-weighted prefix-cache hit ratio, over the requests whose
	 * server reported caching (their input tokens are counted apart). */
	pc = json_object();
	if (pc) {
		uint64_t in = s->counters[CT_CACHE_REPORTED_INPUT_TOKENS];
		put(pc, "input_tokens", json_u64(in));
		put(pc, "cached_tokens", json_u64(s->counters[CT_CACHED_TOKENS]));
		put(pc, "hit_ratio", json_ratio((double)s->counters[CT_CACHED_TOKENS], (double)in));
	}
	put(o, "prefix_cache", pc);

	tp = json_object();
	if (tp) {
		double el = (double)elapsed_s;
		put(tp, "requests_per_s", json_real((double)s->counters[CT_REQUESTS] / el));
		put(tp, "input_tokens_per_s", json_real((double)s->counters[CT_INPUT_TOKENS] / el));
		put(tp, "output_tokens_per_s", json_real((double)s->counters[CT_OUTPUT_TOKENS] / el));
		put(tp, "elapsed_s", json_u64(elapsed_s));
	}
	put(o, "throughput", tp);

	gp = json_object();
	if (gp) {
		uint64_t met = s->counters[CT_SLO_MET], missed = s->counters[CT_SLO_MISSED];
		put(gp, "slo_met", json_u64(met));
		put(gp, "slo_missed", json_u64(missed));
		put(gp, "ratio", json_ratio((double)met, (double)(met + missed)));
		if (q->slo)
			put(gp, "slo", slo_json(q->slo));
	}
	put(o, "goodput", gp);

	mx = json_object();
	for (unsigned m = 0; m < HM__COUNT && mx; m++)
		put(mx, hist_metric_name((enum hist_metric)m),
		    stats_hist_json(slot(s, m), hist_metric_unit((enum hist_metric)m)));
	put(o, "metrics", mx);

	cx = json_object();
	if (cx) {
		put(cx, "concurrency", stats_hist_json(slot(s, HM_INFLIGHT), hist_metric_unit(HM_INFLIGHT)));
		put(cx, "input_tokens", stats_hist_json(slot(s, HM_INPUT_TOKENS), hist_metric_unit(HM_INPUT_TOKENS)));
		put(cx, "output_tokens",
		    stats_hist_json(slot(s, HM_OUTPUT_TOKENS), hist_metric_unit(HM_OUTPUT_TOKENS)));
		cd = json_object();
		if (cd) {
			put(cd, "warm_requests", json_u64(g->warm_requests));
			put(cd, "cold_requests", json_u64(g->cold_requests));
		}
		put(cx, "cold", cd);
	}
	put(o, "context", cx);
	return o;
}

/* ---- /stats/prompt ---- */

/* A series of a bucketed answer (/stats/prompt, /stats/curve): an object
 * with the series' labels, and in *arr the empty array of its buckets;
 * NULL (nothing to free) when out of memory. */
static json_t *bucketed_open(const struct stats_group *g, const struct stats_query *q, json_t **arr)
{
	json_t *o = json_object();

	*arr = json_array();
	if (!o || !*arr) {
		json_decref(o);
		json_decref(*arr);
		return NULL;
	}
	put_labels(o, g, q);
	return o;
}

static json_t *prompt_json(const struct stats_group *g, const struct stats_query *q)
{
	json_t *arr, *o = bucketed_open(g, q, &arr);

	if (!o)
		return NULL;
	put(o, "by", json_string(q->prompt_raw ? "prompt" : "prefill"));
	for (unsigned b = 0; b < PROMPT_BUCKETS; b++) {
		const struct hist *h = slot(&g->slice, q->prompt_raw ? SLOT_PROMPT_RAW(b) : SLOT_PROMPT(b));
		json_t *e;
		if (!h || !h->count || !(e = json_object()))
			continue;
		put(e, "input_tokens_low", json_u64(log2_bucket_low(b)));
		put(e, "input_tokens_high", json_bound(log2_bucket_high(b, PROMPT_BUCKETS)));
		put(e, "requests", json_u64(h->count));
		put(e, "ttft", stats_hist_json(h, UNIT_US));
		json_array_append_new(arr, e);
	}
	put(o, "buckets", arr);
	return o;
}

/* ---- /stats/curve ---- */

/* The in-flight count bucket b stands for: its midpoint; the open-ended last
 * bucket stands for its lower bound, and bucket 0 (0-1) for 1, since a
 * request counts itself. */
static double inflight_load(unsigned b)
{
	uint64_t lo = log2_bucket_low(b), hi = log2_bucket_high(b, INFLIGHT_BUCKETS);
	if (b == 0)
		return 1.0;
	if (hi == UINT64_MAX)
		return (double)lo;
	return ((double)lo + (double)hi) / 2.0;
}

/* The TTFT and e2e curve by the engine's queue when each request was
 * dispatched (by=engine_queue): no knee and no throughput estimate, since
 * the engine's waiting requests are not the requests in flight that
 * Little's law needs. */
static json_t *queue_curve_json(const struct stats_group *g, const struct stats_query *q, uint64_t elapsed_s)
{
	json_t *arr, *o = bucketed_open(g, q, &arr);

	if (!o)
		return NULL;
	for (unsigned b = 0; b < ENGINE_QUEUE_BUCKETS; b++) {
		const struct hist *ttft = slot(&g->slice, SLOT_CURVE(CURVE_QUEUE_TTFT, b));
		const struct hist *e2e = slot(&g->slice, SLOT_CURVE(CURVE_QUEUE_E2E, b));
		uint64_t reqs = e2e ? e2e->count : 0;
		json_t *e;

		if (!reqs && (!ttft || !ttft->count))
			continue;
		if (!(e = json_object()))
			continue;
		put(e, "waiting_low", json_u64(engine_queue_low(b)));
		put(e, "waiting_high", json_bound(engine_queue_high(b)));
		put(e, "requests", json_u64(reqs));
		put(e, "requests_per_s", json_real((double)reqs / (double)elapsed_s));
		put(e, "ttft", stats_hist_json(ttft, UNIT_US));
		put(e, "e2e", stats_hist_json(e2e, UNIT_US));
		json_array_append_new(arr, e);
	}
	put(o, "buckets", arr);
	return o;
}

static json_t *curve_json(const struct stats_group *g, const struct stats_query *q, uint64_t elapsed_s)
{
	struct knee_point pts[INFLIGHT_BUCKETS];
	unsigned bucket_of[INFLIGHT_BUCKETS];
	json_t *entries[INFLIGHT_BUCKETS];
	size_t n = 0;
	bool use_ttft = true;
	json_t *arr, *o = bucketed_open(g, q, &arr);

	if (!o)
		return NULL;

	/* The knee's latency is p50 TTFT; traffic without TTFT (not streamed)
	 * falls back to p50 E2E, for the whole curve so points compare. */
	for (unsigned b = 0; b < INFLIGHT_BUCKETS; b++) {
		const struct hist *e2e = slot(&g->slice, SLOT_CURVE(CURVE_E2E, b));
		const struct hist *ttft = slot(&g->slice, SLOT_CURVE(CURVE_TTFT, b));
		if (e2e && e2e->count >= KNEE_MIN_REQUESTS && (!ttft || ttft->count < KNEE_MIN_REQUESTS))
			use_ttft = false;
	}

	for (unsigned b = 0; b < INFLIGHT_BUCKETS; b++) {
		const struct hist *ttft = slot(&g->slice, SLOT_CURVE(CURVE_TTFT, b));
		const struct hist *itl = slot(&g->slice, SLOT_CURVE(CURVE_ITL, b));
		const struct hist *e2e = slot(&g->slice, SLOT_CURVE(CURVE_E2E, b));
		uint64_t reqs = e2e ? e2e->count : 0;
		json_t *e;

		if (!reqs && (!ttft || !ttft->count) && (!itl || !itl->count))
			continue;
		if (!(e = json_object()))
			continue;
		double load = inflight_load(b);
		double mean_e2e_s = reqs ? hist_mean(e2e) / 1e6 : 0;
		const struct hist *lat = use_ttft ? ttft : e2e;
		struct knee_point *p = &pts[n];
		p->load = load;
		p->throughput = mean_e2e_s > 0 ? load / mean_e2e_s : 0; /* Little's law */
		p->latency = lat && lat->count ? (double)hist_quantile(lat, 0.5) / 1000.0 : 0;
		p->requests = reqs;

		put(e, "inflight_low", json_u64(b == 0 ? 1 : log2_bucket_low(b)));
		put(e, "inflight_high", json_bound(log2_bucket_high(b, INFLIGHT_BUCKETS)));
		put(e, "requests", json_u64(reqs));
		put(e, "requests_per_s", json_real((double)reqs / (double)elapsed_s));
		put(e, "throughput_estimate_rps", p->throughput > 0 ? json_real(p->throughput) : json_null());
		put(e, "ttft", stats_hist_json(ttft, UNIT_US));
		put(e, "itl", stats_hist_json(itl, UNIT_US));
		put(e, "e2e", stats_hist_json(e2e, UNIT_US));
		bucket_of[n] = b;
		entries[n] = e;
		n++;
	}

	struct knee k = knee_find(pts, n, KNEE_MIN_REQUESTS);
	for (size_t i = 0; i < n; i++) {
		json_object_set_new(entries[i], "knee", json_boolean(k.index == (int)i));
		json_array_append_new(arr, entries[i]);
	}
	put(o, "buckets", arr);
	if (k.index >= 0) {
		const struct knee_point *p = &pts[k.index];
		unsigned b = bucket_of[k.index];
		json_t *kn = json_object();
		if (kn) {
			put(kn, "inflight_low", json_u64(b == 0 ? 1 : log2_bucket_low(b)));
			put(kn, "inflight_high", json_bound(log2_bucket_high(b, INFLIGHT_BUCKETS)));
			put(kn, "throughput_estimate_rps", json_real(p->throughput));
			put(kn, "latency_p50_ms", json_real(p->latency));
			put(kn, "latency_basis", json_string(use_ttft ? "ttft" : "e2e"));
			put(kn, "saturated", json_boolean(k.saturated));
		}
		put(o, "knee", kn);
	} else {
		put(o, "knee", json_null());
	}
	return o;
}

/* ---- the answer ---- */

uint64_t stats_elapsed(const struct store_result *r, uint64_t since_sec)
{
	uint64_t from = since_sec > r->start_sec ? since_sec : r->start_sec;
	return r->end_sec >= from ? r->end_sec - from + 1 : 1;
}

/* The answer for one view as a JSON object; NULL when out of memory. */
static json_t *render_doc(const struct store_result *r, const struct stats_query *q, enum stats_view view,
			  uint64_t since_sec)
{
	struct stats_groups gs;
	json_t *root, *arr;
	char ts[32];
	uint64_t start = r->start_sec, from, elapsed_s;

	if (stats_groups_build(r, q, &gs) == -1)
		return NULL;
	from = since_sec > start ? since_sec : start;
	/* "all" has no start of its own: it starts when collection did. */
	if (q->window == WIN_ALL)
		start = from;
	elapsed_s = stats_elapsed(r, since_sec);

	root = json_object();
	arr = json_array();
	if (!root || !arr)
		goto fail;
	put(root, "window", json_string(store_window_name(q->window)));
	iso8601(start, ts);
	put(root, "start", json_string(ts));
	iso8601(r->end_sec, ts);
	put(root, "end", json_string(ts));
	iso8601(from, ts);
	put(root, "elapsed_from", json_string(ts));
	put(root, "elapsed_s", json_u64(elapsed_s));
	put(root, "cold", json_string(cold_filter_name(q->cold)));
	if (q->by_tenant)
		put(root, "by", json_string("tenant"));
	if (view == VIEW_CURVE)
		put(root, "basis", json_string(q->engine_queue ? "engine_queue" : "inflight"));
	for (size_t i = 0; i < gs.n; i++) {
		json_t *s = view == VIEW_PROMPT			    ? prompt_json(&gs.g[i], q)
			    : view == VIEW_CURVE && q->engine_queue ? queue_curve_json(&gs.g[i], q, elapsed_s)
			    : view == VIEW_CURVE		    ? curve_json(&gs.g[i], q, elapsed_s)
								    : summary_json(&gs.g[i], q, elapsed_s);
		if (!s)
			goto fail;
		json_array_append_new(arr, s);
	}
	json_object_set_new(root, "series", arr);
	stats_groups_free(&gs);
	return root;
fail:
	json_decref(arr);
	json_decref(root);
	stats_groups_free(&gs);
	return NULL;
}

char *admin_stats_render(const struct store_result *r, const struct stats_query *q, enum stats_view view,
			 uint64_t since_sec)
{
	json_t *root = render_doc(r, q, view, since_sec);
	char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) : NULL;

	json_decref(root);
	return text;
}

void admin_stats_history_trim(struct store_result *chunk)
{
	for (size_t i = 0; i < chunk->n; i++)
		slice_drop_curves(&chunk->series[i].slice);
}

/* Adds the counters and per-request histograms of `src` to `dst`'s series
 * of the same key (appended when new). -1 when out of memory. */
static int history_merge(struct store_result *dst, const struct store_result *src)
{
	for (size_t i = 0; i < src->n; i++) {
		const struct store_series *from = &src->series[i];
		struct store_series *to = store_result_series(dst, from->key, from->keylen);

		if (!to)
			return -1;
		for (unsigned c = 0; c < CT__COUNT; c++)
			to->slice.counters[c] += from->slice.counters[c];
		for (unsigned m = 0; m < HM__COUNT; m++) {
			struct hist *h;
			if (from->slice.slot[m] && from->slice.slot[m]->count) {
				if (!(h = slice_hist(&to->slice, m)))
					return -1;
				hist_merge(h, from->slice.slot[m]);
			}
		}
	}
	return 0;
}

int admin_stats_history_point(json_t *points, const struct store_result *chunks, size_t n, uint64_t t,
			      const struct stats_query *q, uint64_t since_sec)
{
	struct store_result pt = { .start_sec = t - 59, .end_sec = t };
	json_t *doc = NULL;
	int rc = -1;

	for (size_t i = 0; i < n; i++)
		if (history_merge(&pt, &chunks[i]) == -1)
			goto out;
	doc = render_doc(&pt, q, VIEW_SUMMARY, since_sec);
	if (!doc)
		goto out;
	put(doc, "t", json_u64(t));
	rc = json_array_append_new(points, doc);
out:
	store_result_free(&pt);
	return rc;
}

char *admin_stats_history_render(json_t *points, unsigned step_s)
{
	json_t *root = json_object();
	char *text = NULL;

	if (root) {
		put(root, "step_s", json_u64(step_s));
		put(root, "span_s", json_u64(60));
		json_object_set(root, "points", points);
		text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(10));
	}
	json_decref(root);
	json_decref(points);
	return text;
}
