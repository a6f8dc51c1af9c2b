/*
 * compare.c — rank tests on histograms and the /compare answer.
 */
#include "compare.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin_stats.h"
#include "paired.h"
#include "slice.h"

void rank_test_hist(const struct hist *a, const struct hist *b, struct rank_test *out)
{
	double below_b = 0, u = 0, ties = 0;

	memset(out, 0, sizeof(*out));
	out->p = 1;
	out->prob_a_greater = 0.5;
	if (!a || !b || !a->count || !b->count)
		return;
	out->na = a->count;
	out->nb = b->count;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		double ai = (double)a->buckets[i], bi = (double)b->buckets[i], t = ai + bi;
		u += ai * (below_b + 0.5 * bi); /* a's samples above b's, ties half */
		below_b += bi;
		ties += t * t * t - t;
	}
	double na = (double)out->na, nb = (double)out->nb, n = na + nb;
	double mean = na * nb / 2;
	double var = na * nb / 12.0 * ((n + 1) - ties / (n * (n - 1)));
	out->u = u;
	out->prob_a_greater = u / (na * nb);
	if (var <= 0) /* every sample in one bucket: nothing to tell apart */
		return;
	out->z = (u - mean) / sqrt(var);
	out->p = erfc(fabs(out->z) / M_SQRT2);
}

double ks_distance(const struct hist *a, const struct hist *b)
{
	double ca = 0, cb = 0, d = 0;

	if (!a || !b || !a->count || !b->count)
		return 0;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		ca += (double)a->buckets[i];
		cb += (double)b->buckets[i];
		double gap = fabs(ca / (double)a->count - cb / (double)b->count);
		if (gap > d)
			d = gap;
	}
	return d;
}

double ks_critical(uint64_t na, uint64_t nb, double confidence)
{
	if (!na || !nb)
		return 1;
	double alpha = 1 - confidence;
	double c = sqrt(-log(alpha / 2) / 2);
	return c * sqrt((double)(na + nb) / ((double)na * (double)nb));
}

void prop_test(uint64_t x, uint64_t n, uint64_t y, uint64_t m, struct prop_test *out)
{
	memset(out, 0, sizeof(*out));
	out->p = 1;
	if (!n || !m)
		return;
	double pa = (double)x / (double)n, pb = (double)y / (double)m;
	double pool = (double)(x + y) / (double)(n + m);
	double se = sqrt(pool * (1 - pool) * (1 / (double)n + 1 / (double)m));
	out->diff = pa - pb;
	if (se <= 0) /* all or none on both sides: nothing to tell apart */
		return;
	out->z = out->diff / se;
	out->p = erfc(fabs(out->z) / M_SQRT2);
}

/* ---- the answer ---- */

struct up_group {
	const char *upstream;
	struct slice slice;
};

static json_t *u64(uint64_t v)
{
	return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *ratio(double num, double den)
{
	return den > 0 ? json_real(num / den) : json_null();
}

static uint64_t errors_of(const struct slice *s)
{
	uint64_t n = 0;
	for (unsigned e = 1; e < REQ_ERR__COUNT; e++)
		n += s->counters[CT_ERR_BASE + e];
	return n;
}

static const unsigned compared[] = { HM_TTFT, HM_ITL, HM_TPOT, HM_E2E, HM_ANSWER_TTFT, HM_REASONING };

/* The phases a ttft splits into (docs/metrics.md, "Where the time went"),
 * each with the words /compare names it by. The time before the request's
 * head is whole (req_headers - arrive) has no histogram: it is the client's
 * upload to tokentap, not a difference between upstreams. */
static const struct {
	unsigned metric;
	const char *label;
} phases[] = {
	{ HM_QUEUE, "queueing (tokentap)" },	     { HM_CONNECT, "connect" },	       { HM_UPLOAD, "upload" },
	{ HM_SERVER_QUEUE, "queueing (server)" },    { HM_SERVER_LOAD, "model load" }, { HM_SERVER_PREFILL, "prefill" },
	{ HM_UNATTRIBUTED, "network/unattributed" },
};
#define PHASES (sizeof(phases) / sizeof(phases[0]))

/* The rest of the decomposition, shown per upstream beside the phases. */
static const unsigned shown_too[] = { HM_SERVER_DECODE, HM_SERVER_INFERENCE };

/* A phase's share of the ttft difference, at least, to be named its cause. */
#define CAUSE_SHARE_MIN 0.25

static json_t *upstream_json(const struct up_group *g, uint64_t elapsed, json_t *labels)
{
	const struct slice *s = &g->slice;
	uint64_t reqs = s->counters[CT_REQUESTS];
	json_t *o = json_object(), *m = json_object(), *lab = labels ? json_object_get(labels, g->upstream) : NULL;

	json_object_set_new(o, "upstream", json_string(g->upstream));
	json_object_set_new(o, "labels", lab ? json_incref(lab) : json_object());
	json_object_set_new(o, "requests", u64(reqs));
	json_object_set_new(o, "requests_per_s", json_real((double)reqs / (double)elapsed));
	json_object_set_new(o, "input_tokens_per_s", json_real((double)s->counters[CT_INPUT_TOKENS] / (double)elapsed));
	json_object_set_new(o, "output_tokens_per_s",
			    json_real((double)s->counters[CT_OUTPUT_TOKENS] / (double)elapsed));
	json_object_set_new(o, "error_rate", ratio((double)errors_of(s), (double)reqs));
	json_object_set_new(
		o, "goodput_ratio",
		ratio((double)s->counters[CT_SLO_MET], (double)(s->counters[CT_SLO_MET] + s->counters[CT_SLO_MISSED])));
	json_object_set_new(
		o, "prefix_cache_hit_ratio",
		ratio((double)s->counters[CT_CACHED_TOKENS], (double)s->counters[CT_CACHE_REPORTED_INPUT_TOKENS]));
	for (size_t i = 0; i < sizeof(compared) / sizeof(compared[0]); i++)
		json_object_set_new(m, hist_metric_name(compared[i]), stats_hist_json(s->slot[compared[i]], UNIT_US));
	for (size_t i = 0; i < PHASES; i++)
		json_object_set_new(m, hist_metric_name(phases[i].metric),
				    stats_hist_json(s->slot[phases[i].metric], UNIT_US));
	for (size_t i = 0; i < sizeof(shown_too) / sizeof(shown_too[0]); i++)
		json_object_set_new(m, hist_metric_name(shown_too[i]), stats_hist_json(s->slot[shown_too[i]], UNIT_US));
	json_object_set_new(o, "metrics", m);
	return o;
}

static uint64_t count_of(const struct hist *h)
{
	return h ? h->count : 0;
}

/* Quantile q of x less that of the baseline, in ms. */
static double quantile_diff_ms(const struct hist *x, const struct hist *b, double q)
{
	return ((double)hist_quantile(x, q) - (double)hist_quantile(b, q)) / 1000;
}

/* Which phases account for a worse ttft here than on the baseline: each
 * phase's p50 and p90 differences, largest p50 difference first (phases
 * without a sample on either side last, their differences null), with the
 * counts behind them; `cause`, when this ttft is significantly slower, the
 * phase with the largest p50 difference if that is at least a quarter of
 * the ttft's. The quantiles of the parts need not add up to the quantile of
 * the whole: each difference is that phase's own. */
static json_t *attribution_json(const struct slice *x, const struct slice *base, bool slower)
{
	const struct hist *tx = x->slot[HM_TTFT], *tb = base->slot[HM_TTFT];
	json_t *o = json_object(), *arr = json_array();
	struct {
		size_t i;
		bool have;
		double p50, p90;
	} row[PHASES], tmp;
	double ttft50 = NAN;

	if (count_of(tx) && count_of(tb)) {
		ttft50 = quantile_diff_ms(tx, tb, 0.5);
		json_object_set_new(o, "ttft_p50_diff_ms", json_real(ttft50));
		json_object_set_new(o, "ttft_p90_diff_ms", json_real(quantile_diff_ms(tx, tb, 0.9)));
	} else {
		json_object_set_new(o, "ttft_p50_diff_ms", json_null());
		json_object_set_new(o, "ttft_p90_diff_ms", json_null());
	}
	json_object_set_new(o, "slower", json_boolean(slower));
	for (size_t i = 0; i < PHASES; i++) {
		const struct hist *hx = x->slot[phases[i].metric], *hb = base->slot[phases[i].metric];
		row[i].i = i;
		row[i].have = count_of(hx) && count_of(hb);
		row[i].p50 = row[i].have ? quantile_diff_ms(hx, hb, 0.5) : NAN;
		row[i].p90 = row[i].have ? quantile_diff_ms(hx, hb, 0.9) : NAN;
	}
	/* insertion sort, stable: the list's order among equals */
	for (size_t i = 1; i < PHASES; i++) {
		size_t j = i;
		tmp = row[i];
		while (j > 0 && tmp.have &&
		       (!row[j - 1].have || tmp.p50 > row[j - 1].p50 ||
			(tmp.p50 == row[j - 1].p50 && tmp.p90 > row[j - 1].p90))) {
			row[j] = row[j - 1];
			j--;
		}
		row[j] = tmp;
	}
	for (size_t k = 0; k < PHASES; k++) {
		unsigned m = phases[row[k].i].metric;
		json_t *e = json_object();
		json_object_set_new(e, "phase", json_string(hist_metric_name(m)));
		json_object_set_new(e, "label", json_string(phases[row[k].i].label));
		json_object_set_new(e, "p50_diff_ms", row[k].have ? json_real(row[k].p50) : json_null());
		json_object_set_new(e, "p90_diff_ms", row[k].have ? json_real(row[k].p90) : json_null());
		json_object_set_new(e, "share",
				    row[k].have && ttft50 > 0 ? json_real(row[k].p50 / ttft50) : json_null());
		json_object_set_new(e, "count", u64(count_of(x->slot[m])));
		json_object_set_new(e, "baseline_count", u64(count_of(base->slot[m])));
		json_array_append_new(arr, e);
	}
	bool named = slower && ttft50 > 0 && row[0].have && row[0].p50 > 0 && row[0].p50 >= CAUSE_SHARE_MIN * ttft50;
	json_object_set_new(o, "cause", named ? json_string(hist_metric_name(phases[row[0].i].metric)) : json_null());
	json_object_set_new(o, "cause_label", named ? json_string(phases[row[0].i].label) : json_null());
	json_object_set_new(o, "phases", arr);
	return o;
}

static json_t *traffic_json(const struct hist *a, const struct hist *b)
{
	double d = ks_distance(a, b), crit = ks_critical(a ? a->count : 0, b ? b->count : 0, COMPARE_CONFIDENCE);
	bool have = a && b && a->count && b->count;
	return json_pack("{s:o,s:o,s:o}", "ks_distance", have ? json_real(d) : json_null(), "ks_critical",
			 have ? json_real(crit) : json_null(), "comparable",
			 have ? json_boolean(d <= crit || d <= 0.1) : json_null());
}

/* x of n against y of m: the difference of the proportions and whether it
 * is outside the noise (null and false when either side has no sample). */
static json_t *proportion_json(uint64_t x, uint64_t n, uint64_t y, uint64_t m)
{
	struct prop_test pt;

	prop_test(x, n, y, m, &pt);
	if (!n || !m)
		return json_pack("{s:n,s:n,s:n,s:b}", "diff", "z", "p_value", "significant", 0);
	return json_pack("{s:f,s:f,s:f,s:b}", "diff", pt.diff, "z", pt.z, "p_value", pt.p, "significant",
			 pt.p < 1 - COMPARE_CONFIDENCE);
}

/* A rate here against the baseline's: difference and ratio. */
static json_t *rate_json(uint64_t x, uint64_t b, uint64_t elapsed)
{
	double rx = (double)x / (double)elapsed, rb = (double)b / (double)elapsed;
	return json_pack("{s:f,s:o}", "diff", rx - rb, "ratio", ratio(rx, rb));
}

/* Requests a bucket of the load curve needs on both sides to be compared. */
#define EQUAL_LOAD_MIN 10

/* TTFT at equal load: for each bucket of requests in flight to the
 * upstream at arrival (the load curve, /stats/curve) where both sides have
 * EQUAL_LOAD_MIN requests with a ttft, the two p50s and the same rank test
 * and verdict rule as the whole. Under a load-aware policy the upstreams
 * ran at different concurrency; at one concurrency level each, the
 * comparison is between like and like. Empty where the window's slices
 * keep no curve (minute slices: slice_drop_curves) or no level has enough
 * on both. */
static json_t *equal_load_json(const struct slice *x, const struct slice *base)
{
	json_t *arr = json_array();

	for (unsigned b = 0; arr && b < INFLIGHT_BUCKETS; b++) {
		const struct hist *hx = x->slot[SLOT_CURVE(CURVE_TTFT, b)], *hb = base->slot[SLOT_CURVE(CURVE_TTFT, b)];
		struct rank_test rt;
		if (count_of(hx) < EQUAL_LOAD_MIN || count_of(hb) < EQUAL_LOAD_MIN)
			continue;
		rank_test_hist(hx, hb, &rt);
		double px50 = (double)hist_quantile(hx, 0.5), pb50 = (double)hist_quantile(hb, 0.5);
		double rel = pb50 > 0 ? px50 / pb50 : NAN;
		bool sig = rt.p < 1 - COMPARE_CONFIDENCE && !isnan(rel) && fabs(rel - 1) > 0.01;
		uint64_t high = log2_bucket_high(b, INFLIGHT_BUCKETS);
		json_t *e = json_object();
		if (!e)
			continue;
		json_object_set_new(e, "inflight_low", u64(b == 0 ? 1 : log2_bucket_low(b)));
		json_object_set_new(e, "inflight_high", high == UINT64_MAX ? json_null() : u64(high));
		json_object_set_new(e, "requests", u64(hx->count));
		json_object_set_new(e, "baseline_requests", u64(hb->count));
		json_object_set_new(e, "ttft_p50_ms", json_real(px50 / 1000));
		json_object_set_new(e, "baseline_ttft_p50_ms", json_real(pb50 / 1000));
		json_object_set_new(e, "p50_diff_ms", json_real((px50 - pb50) / 1000));
		json_object_set_new(e, "p_value", json_real(rt.p));
		json_object_set_new(e, "significant", json_boolean(sig));
		json_object_set_new(e, "verdict", json_string(!sig ? "no difference" : rt.z > 0 ? "slower" : "faster"));
		json_array_append_new(arr, e);
	}
	return arr ? arr : json_null();
}

static json_t *difference_json(const struct up_group *x, const struct up_group *base, uint64_t elapsed, bool causal)
{
	json_t *o = json_object(), *m = json_object(), *t = json_object(), *tp = json_object();
	uint64_t rx = x->slice.counters[CT_REQUESTS], rb = base->slice.counters[CT_REQUESTS];
	const uint64_t *cx = x->slice.counters, *cb = base->slice.counters;

	bool ttft_slower = false;

	json_object_set_new(o, "upstream", json_string(x->upstream));
	json_object_set_new(o, "baseline", json_string(base->upstream));
	for (size_t i = 0; i < sizeof(compared) / sizeof(compared[0]); i++) {
		const struct hist *hx = x->slice.slot[compared[i]], *hb = base->slice.slot[compared[i]];
		struct rank_test rt;
		json_t *e = json_object();
		rank_test_hist(hx, hb, &rt);
		if (hx && hb && hx->count && hb->count) {
			double px50 = (double)hist_quantile(hx, 0.5), pb50 = (double)hist_quantile(hb, 0.5);
			double px99 = (double)hist_quantile(hx, 0.99), pb99 = (double)hist_quantile(hb, 0.99);
			double rel = pb50 > 0 ? px50 / pb50 : NAN;
			/* significant: the rank test rejects at 99 % and the medians
			 * differ by more than a bucket (1 %) could explain */
			bool sig = rt.p < 1 - COMPARE_CONFIDENCE && !isnan(rel) && fabs(rel - 1) > 0.01;
			json_object_set_new(e, "p50_diff_ms", json_real((px50 - pb50) / 1000));
			json_object_set_new(e, "p99_diff_ms", json_real((px99 - pb99) / 1000));
			json_object_set_new(e, "p50_ratio", isnan(rel) ? json_null() : json_real(rel));
			json_object_set_new(e, "z", json_real(rt.z));
			json_object_set_new(e, "p_value", json_real(rt.p));
			json_object_set_new(e, "prob_slower", json_real(rt.prob_a_greater));
			json_object_set_new(e, "significant", json_boolean(sig));
			if (compared[i] == HM_TTFT)
				ttft_slower = sig && rt.z > 0;
			json_object_set_new(e, "verdict",
					    json_string(!sig	   ? "no difference"
							: rt.z > 0 ? "slower"
								   : "faster"));
		} else {
			json_object_set_new(e, "verdict", json_string("not enough data"));
			json_object_set_new(e, "significant", json_false());
		}
		json_object_set_new(m, hist_metric_name(compared[i]), e);
	}
	json_object_set_new(o, "metrics", m);
	json_object_set_new(o, "ttft_attribution", attribution_json(&x->slice, &base->slice, ttft_slower));
	json_object_set_new(o, "error_rate_diff",
			    rx && rb ? json_real((double)errors_of(&x->slice) / (double)rx -
						 (double)errors_of(&base->slice) / (double)rb)
				     : json_null());
	json_object_set_new(o, "error_rate", proportion_json(errors_of(&x->slice), rx, errors_of(&base->slice), rb));
	json_object_set_new(o, "goodput_ratio",
			    proportion_json(cx[CT_SLO_MET], cx[CT_SLO_MET] + cx[CT_SLO_MISSED], cb[CT_SLO_MET],
					    cb[CT_SLO_MET] + cb[CT_SLO_MISSED]));
	json_object_set_new(tp, "requests_per_s", rate_json(rx, rb, elapsed));
	json_object_set_new(tp, "input_tokens_per_s", rate_json(cx[CT_INPUT_TOKENS], cb[CT_INPUT_TOKENS], elapsed));
	json_object_set_new(tp, "output_tokens_per_s", rate_json(cx[CT_OUTPUT_TOKENS], cb[CT_OUTPUT_TOKENS], elapsed));
	json_object_set_new(o, "throughput", tp);
	json_object_set_new(t, "input_tokens",
			    traffic_json(x->slice.slot[HM_INPUT_TOKENS], base->slice.slot[HM_INPUT_TOKENS]));
	json_object_set_new(t, "concurrency", traffic_json(x->slice.slot[HM_INFLIGHT], base->slice.slot[HM_INFLIGHT]));
	json_object_set_new(o, "traffic", t);
	json_object_set_new(o, "causal", json_boolean(causal));
	json_object_set_new(o, "equal_load", equal_load_json(&x->slice, &base->slice));
	return o;
}

/* How the route assigned its requests, from `assign` ({balance, targets,
 * mirror} of the configuration in force; NULL for a route it does not
 * have): `balance`, `assignment` and `assignment_note` on `root`. Returns
 * whether the unpaired verdicts may be read as causal: only when the
 * assignment did not depend on load, as weights alone do not. */
static bool assignment_json(json_t *root, json_t *assign)
{
	const char *policy = json_string_value(json_object_get(assign, "balance"));
	json_int_t targets = json_integer_value(json_object_get(assign, "targets"));
	const char *mirror = json_string_value(json_object_get(assign, "mirror"));
	char note[640];
	const char *kind;
	bool causal;

	if (!policy) {
		kind = "unknown";
		causal = false;
		snprintf(note, sizeof(note),
			 "the configuration in force has no such route, so how its requests were assigned is not "
			 "known: read the differences as descriptions, not as causes");
	} else if (strcmp(policy, "weighted") == 0 || targets < 2) {
		kind = "load_independent";
		causal = true;
		snprintf(note, sizeof(note),
			 "%s: each request went to an upstream whatever the upstreams' load, so the upstreams drew "
			 "from the same traffic and the differences can be read as the upstreams' own",
			 targets < 2 ? "one upstream in the split" : "weighted split");
	} else {
		kind = "load_dependent";
		causal = false;
		snprintf(note, sizeof(note),
			 "balance %s chose each request's upstream by the upstreams' load, so they ran at different "
			 "concurrency on different requests: the differences below describe what each served, not "
			 "how each would serve the same requests, and their verdicts are not valid as a causal "
			 "comparison. %s; `equal_load` in each difference compares ttft at the same requests in "
			 "flight",
			 policy,
			 mirror ? "The route's mirror sends the same requests to both sides: read `paired`, which is"
				  " valid"
				: "For a valid comparison, mirror a share of the route to the upstream under test "
				  "(`mirror`, docs/workload.md, paired comparison) and read `paired`, or compare under "
				  "balance: weighted");
	}
	json_object_set_new(root, "balance", policy ? json_string(policy) : json_null());
	json_object_set_new(root, "assignment", json_string(kind));
	json_object_set_new(root, "assignment_note", json_string(note));
	return causal;
}

/* ---- paired: mirrored requests against their primaries ---- */

/* The sequential verdict in words: b is the shadow, a the primary. */

/* One metric's pairs in the window: the statistics paired.c writes. */
static json_t *paired_window_json(const struct paired_metric_view *mv, enum paired_metric m)
{
	double d[PAIRED_WINDOW];
	struct signrank sr;

	for (size_t i = 0; i < mv->n; i++)
		d[i] = mv->b[i] - mv->a[i];
	if (signrank_test(d, mv->n, COMPARE_CONFIDENCE, &sr) == -1)
		return json_null();
	json_t *o = paired_metric_json(&sr, signrank_median(mv->a, mv->n), &mv->seq, m);
	return o ? o : json_null();
}

/* The `paired` section: every (primary, shadow) series of the route, kept
 * in memory since start (paired.h); NULL when out of memory. */
static json_t *paired_json(const char *route)
{
	struct paired_view *v;
	size_t n;
	json_t *arr;

	if (paired_snapshot(route, &v, &n) == -1 || !(arr = json_array())) {
		free(v);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_object(), *m = json_object();
		json_object_set_new(o, "a", json_string(v[i].primary));
		json_object_set_new(o, "b", json_string(v[i].shadow));
		json_object_set_new(o, "model", json_string(v[i].model));
		json_object_set_new(o, "pairs", u64(v[i].pairs));
		json_object_set_new(o, "errors",
				    json_pack("{s:o,s:o,s:o}", "a", u64(v[i].errors_primary), "b",
					      u64(v[i].errors_shadow), "both", u64(v[i].both_errors)));
		for (unsigned k = 0; k < PM__COUNT; k++)
			json_object_set_new(m, paired_metric_name(k), paired_window_json(&v[i].metric[k], k));
		json_object_set_new(o, "metrics", m);
		json_array_append_new(arr, o);
	}
	free(v);
	return arr;
}

char *compare_render(const struct store_result *r, const char *route, enum store_window window, int cold_mode,
		     uint64_t since_sec, json_t *labels, json_t *assign)
{
	struct stats_query q = { .window = window, .route = route, .cold = (enum cold_filter)cold_mode };
	struct stats_groups gs;
	struct up_group *ups = NULL;
	size_t nups = 0;
	char *text = NULL;

	if (stats_groups_build(r, &q, &gs) == -1)
		return NULL;
	ups = calloc(gs.n ? gs.n : 1, sizeof(*ups));
	if (!ups) {
		stats_groups_free(&gs);
		return NULL;
	}
	/* one entry per upstream: its models merged */
	for (size_t i = 0; i < gs.n; i++) {
		if (!gs.g[i].matched || strcmp(gs.g[i].route, route) != 0)
			continue;
		size_t k;
		for (k = 0; k < nups; k++)
			if (strcmp(ups[k].upstream, gs.g[i].upstream) == 0)
				break;
		if (k == nups)
			ups[nups++].upstream = gs.g[i].upstream;
		slice_merge(&ups[k].slice, &gs.g[i].slice);
	}
	size_t base = 0;
	for (size_t k = 1; k < nups; k++)
		if (ups[k].slice.counters[CT_REQUESTS] > ups[base].slice.counters[CT_REQUESTS])
			base = k;

	uint64_t elapsed = stats_elapsed(r, since_sec);
	json_t *root = json_object(), *arr = json_array(), *diffs = json_array();
	char ts[32];
	struct tm tm;
	time_t t;
	json_object_set_new(root, "route", json_string(route));
	json_object_set_new(root, "window", json_string(store_window_name(window)));
	t = (time_t)(window == WIN_ALL ? (since_sec > r->start_sec ? since_sec : r->start_sec) : r->start_sec);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
	json_object_set_new(root, "start", json_string(ts));
	t = (time_t)r->end_sec;
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
	json_object_set_new(root, "end", json_string(ts));
	json_object_set_new(root, "elapsed_s", u64(elapsed));
	json_object_set_new(root, "cold", json_string(cold_filter_name(q.cold)));
	json_object_set_new(root, "test",
			    json_string("two-sided Mann-Whitney U on the histograms (ties by bucket, "
					"normal approximation); significant when p < 0.01 and the "
					"medians differ by more than 1 %; error rate and goodput ratio: "
					"two-proportion z-test (pooled), significant when p < 0.01"));
	json_object_set_new(root, "confidence", json_real(COMPARE_CONFIDENCE));
	bool causal = assignment_json(root, assign);
	for (size_t k = 0; k < nups; k++)
		json_array_append_new(arr, upstream_json(&ups[k], elapsed, labels));
	json_object_set_new(root, "upstreams", arr);
	json_object_set_new(root, "baseline", nups ? json_string(ups[base].upstream) : json_null());
	for (size_t k = 0; k < nups; k++)
		if (k != base)
			json_array_append_new(diffs, difference_json(&ups[k], &ups[base], elapsed, causal));
	json_object_set_new(root, "differences", diffs);
	json_object_set_new(root, "paired_test",
			    json_string("mirrored requests paired with their primaries (a: primary, b: shadow; "
					"difference b - a over the last 512 pairs): two-sided Wilcoxon signed-rank "
					"(zeros dropped, mid-ranks; exact up to 50 non-zero differences, else normal "
					"with tie correction), Hodges-Lehmann shift with its interval; significant "
					"when p < 0.01 and the shift exceeds 1 % of a's median and 1 ms; verdict: "
					"sequential sign test (Beta(1,1) mixture, differences within 1 % or 1 ms "
					"are ties), called when the evidence reaches 1/0.01 (valid however often it "
					"is looked at) and shown while the HL shift exceeds 1 % and 1 ms too"));
	json_object_set_new(root, "paired", paired_json(route));
	text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	for (size_t k = 0; k < nups; k++)
		slice_release(&ups[k].slice);
	free(ups);
	stats_groups_free(&gs);
	return text;
}
