/*
 * prom.c — renders the lifetime stats (store_query_lifetime: since the process
 * started, never reset) as Prometheus text format 0.0.4.
 *
 * Families, each with # HELP and # TYPE, in this order: one histogram
 * tokentap_<metric>_seconds per time metric of HIST_METRICS (names and help
 * generated from the X-macro), tokens per event, then the counters (the plain ones from
 * SLICE_COUNTERS' exported rows). Every family lists every (route,
 * upstream, model) group, warm and cold requests merged, so a series never
 * appears in one family and not in its neighbour. Then the gauges of what
 * runs and waits now, by upstream, and of the engines of scraped upstreams
 * (prom_render_gauges, prom_engine_families).
 */
#include "prom.h"

#include <event2/buffer.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_stats.h"
#include "timeline.h"

/* The sorted union of vLLM's TTFT buckets (0.001 .. 2560 s) and its
 * inter-token-latency buckets (0.01 .. 80 s), written as vLLM's exporter
 * writes them, for every time family. vLLM's request-latency edges (e2e,
 * queue: 0.3 .. 7680 s) are not among them: they reach past HIST_LIMIT, and
 * µs values must stay below it (71 min). */
static const struct {
	uint64_t us;
	const char *label;
} le_bounds[] = {
	{ 1000, "0.001" },	   { 5000, "0.005" },	 { 10000, "0.01" },	 { 20000, "0.02" },
	{ 25000, "0.025" },	   { 40000, "0.04" },	 { 50000, "0.05" },	 { 60000, "0.06" },
	{ 75000, "0.075" },	   { 80000, "0.08" },	 { 100000, "0.1" },	 { 150000, "0.15" },
	{ 200000, "0.2" },	   { 250000, "0.25" },	 { 300000, "0.3" },	 { 400000, "0.4" },
	{ 500000, "0.5" },	   { 750000, "0.75" },	 { 1000000, "1.0" },	 { 2500000, "2.5" },
	{ 5000000, "5.0" },	   { 7500000, "7.5" },	 { 10000000, "10.0" },	 { 20000000, "20.0" },
	{ 40000000, "40.0" },	   { 80000000, "80.0" }, { 160000000, "160.0" }, { 640000000, "640.0" },
	{ 2560000000u, "2560.0" },
};
#define LE_COUNT (sizeof(le_bounds) / sizeof(le_bounds[0]))

/* What one sample of each histogram is, from HIST_METRICS. */
static const char *const hist_help[HM__COUNT] = {
#define X(e, n, u, src, help) help,
	HIST_METRICS(X)
#undef X
};

/* The counters of SLICE_COUNTERS marked exported, each its own family
 * tokentap_<counter name>_total, with the list's help. */
const char *prom_counter_help(unsigned c)
{
	static const struct {
		bool exported;
		const char *help;
	} counter_export[CT_ERR_BASE] = {
#define X(e, n, exported, help) { exported, help },
		SLICE_COUNTERS(X)
#undef X
	};
	return c < CT_ERR_BASE && counter_export[c].exported ? counter_export[c].help : NULL;
}

size_t prom_le_count(void)
{
	return LE_COUNT;
}

const char *prom_le_label(size_t i)
{
	return i < LE_COUNT ? le_bounds[i].label : "+Inf";
}

uint64_t prom_le_us(size_t i)
{
	return i < LE_COUNT ? le_bounds[i].us : UINT64_MAX;
}

void prom_classic_counts(const struct hist *h, uint64_t *cum)
{
	uint64_t count = h ? h->count : 0, prev = 0;

	for (size_t b = 0; b < LE_COUNT; b++) {
		double v = count ? hist_count_le(h, le_bounds[b].us) : 0;
		uint64_t c = v > 0 ? (uint64_t)llround(v) : 0;
		/* rounding must not make the cumulative series step back */
		c = c < prev ? prev : c > count ? count : c;
		cum[b] = prev = c;
	}
}

size_t prom_label_escape(char *out, size_t cap, const char *in)
{
	size_t n = 0;

	for (const char *p = in; *p; p++) {
		const char *rep = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
		size_t len = rep ? 2 : 1;
		for (size_t i = 0; i < len; i++, n++)
			if (n + 1 < cap)
				out[n] = rep ? rep[i] : *p;
	}
	if (cap)
		out[n < cap ? n : cap - 1] = '\0';
	return n;
}

struct writer {
	struct evbuffer *out;
	int failed;
};

static void emit(struct writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(struct writer *w, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (evbuffer_add_vprintf(w->out, fmt, ap) < 0)
		w->failed = 1;
	va_end(ap);
}

/* `route="..",upstream="..",model=".."`, escaped; malloc'd. */
static char *group_labels(const struct stats_group *g)
{
	size_t lr = prom_label_escape(NULL, 0, g->route), lu = prom_label_escape(NULL, 0, g->upstream),
	       lm = prom_label_escape(NULL, 0, g->model);
	size_t cap = lr + lu + lm + sizeof("route=\"\",upstream=\"\",model=\"\"");
	char *s = malloc(cap), *p = s;

	if (!s)
		return NULL;
	p += sprintf(p, "route=\"");
	p += prom_label_escape(p, lr + 1, g->route);
	p += sprintf(p, "\",upstream=\"");
	p += prom_label_escape(p, lu + 1, g->upstream);
	p += sprintf(p, "\",model=\"");
	p += prom_label_escape(p, lm + 1, g->model);
	sprintf(p, "\"");
	return s;
}

static void histogram_family(struct writer *w, const char *pre, const struct stats_groups *gs, char **labels,
			     enum hist_metric m)
{
	const char *name = hist_metric_name(m);

	emit(w, "# HELP %s%s_seconds %s, in seconds (definition: docs/metrics.md).\n", pre, name, hist_help[m]);
	emit(w, "# TYPE %s%s_seconds histogram\n", pre, name);
	for (size_t i = 0; i < gs->n; i++) {
		const struct hist *h = gs->g[i].slice.slot[m];
		uint64_t count = h ? h->count : 0, cum[LE_COUNT];
		prom_classic_counts(h, cum);
		for (size_t b = 0; b < LE_COUNT; b++)
			emit(w, "%s%s_seconds_bucket{%s,le=\"%s\"} %llu\n", pre, name, labels[i], le_bounds[b].label,
			     (unsigned long long)cum[b]);
		emit(w, "%s%s_seconds_bucket{%s,le=\"+Inf\"} %llu\n", pre, name, labels[i], (unsigned long long)count);
		emit(w, "%s%s_seconds_sum{%s} %.6f\n", pre, name, labels[i], count ? (double)h->sum / 1e6 : 0.0);
		emit(w, "%s%s_seconds_count{%s} %llu\n", pre, name, labels[i], (unsigned long long)count);
	}
}

/* Tokens per token event, a small count: le edges on whole tokens (a
 * bucket of its own for each value below 128 in a struct hist, so the
 * cumulative counts are exact), then the streams that reported it (the
 * requests of the per-request row). */
static const unsigned tpe_le[] = { 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 64 };
#define TPE_LE_COUNT (sizeof(tpe_le) / sizeof(tpe_le[0]))

size_t prom_tpe_le_count(void)
{
	return TPE_LE_COUNT;
}

unsigned prom_tpe_le(size_t i)
{
	return tpe_le[i];
}

void prom_tpe_counts(const struct hist *h, uint64_t *cum)
{
	uint64_t c = 0;
	unsigned v = 0;

	for (size_t b = 0; b < TPE_LE_COUNT; b++) {
		for (; h && v <= tpe_le[b]; v++)
			c += h->buckets[hist_index(v)];
		cum[b] = c;
	}
}

static void tokens_per_event_families(struct writer *w, const char *pre, const struct stats_groups *gs, char **labels)
{
	emit(w, "# HELP %stokens_per_event %s (definition: docs/metrics.md).\n", pre, hist_help[HM_TOKENS_PER_EVENT]);
	emit(w, "# TYPE %stokens_per_event histogram\n", pre);
	for (size_t i = 0; i < gs->n; i++) {
		const struct hist *h = gs->g[i].slice.slot[HM_TOKENS_PER_EVENT];
		uint64_t count = h ? h->count : 0, cum[TPE_LE_COUNT];
		prom_tpe_counts(h, cum);
		for (size_t b = 0; b < TPE_LE_COUNT; b++)
			emit(w, "%stokens_per_event_bucket{%s,le=\"%u\"} %llu\n", pre, labels[i], tpe_le[b],
			     (unsigned long long)cum[b]);
		emit(w, "%stokens_per_event_bucket{%s,le=\"+Inf\"} %llu\n", pre, labels[i], (unsigned long long)count);
		emit(w, "%stokens_per_event_sum{%s} %llu\n", pre, labels[i], (unsigned long long)(count ? h->sum : 0));
		emit(w, "%stokens_per_event_count{%s} %llu\n", pre, labels[i], (unsigned long long)count);
	}
	emit(w, "# HELP %stokens_per_event_streams_total %s\n# TYPE %stokens_per_event_streams_total counter\n", pre,
	     PROM_TPE_STREAMS_HELP, pre);
	for (size_t i = 0; i < gs->n; i++) {
		const struct hist *h = gs->g[i].slice.slot[HM_REQUEST_TOKENS_PER_EVENT];
		emit(w, "%stokens_per_event_streams_total{%s} %llu\n", pre, labels[i],
		     (unsigned long long)(h ? h->count : 0));
	}
}

static void counter_families(struct writer *w, const char *pre, const struct stats_groups *gs, char **labels)
{
	const size_t status_prefix = strlen("status_");

	emit(w, "# HELP %srequests_total Requests finished, by status class (none: no status was sent).\n", pre);
	emit(w, "# TYPE %srequests_total counter\n", pre);
	for (size_t i = 0; i < gs->n; i++)
		for (unsigned c = CT_STATUS_NONE; c <= CT_STATUS_5XX; c++)
			emit(w, "%srequests_total{%s,status_class=\"%s\"} %llu\n", pre, labels[i],
			     slice_counter_name(c) + status_prefix, (unsigned long long)gs->g[i].slice.counters[c]);

	emit(w, "# HELP %serrors_total Requests that did not complete normally, by kind.\n", pre);
	emit(w, "# TYPE %serrors_total counter\n", pre);
	for (size_t i = 0; i < gs->n; i++)
		for (unsigned e = REQ_ERR_NONE + 1; e < REQ_ERR__COUNT; e++)
			emit(w, "%serrors_total{%s,kind=\"%s\"} %llu\n", pre, labels[i],
			     req_error_name((enum req_error)e),
			     (unsigned long long)gs->g[i].slice.counters[CT_ERR_BASE + e]);

	for (unsigned c = 0; c < CT_ERR_BASE; c++) {
		const char *help = prom_counter_help(c);
		if (!help)
			continue;
		const char *name = slice_counter_name(c);
		emit(w, "# HELP %s%s_total %s\n", pre, name, help);
		emit(w, "# TYPE %s%s_total counter\n", pre, name);
		for (size_t i = 0; i < gs->n; i++)
			emit(w, "%s%s_total{%s} %llu\n", pre, name, labels[i],
			     (unsigned long long)gs->g[i].slice.counters[c]);
	}
}

int prom_render(struct evbuffer *out, const struct store_result *r)
{
	struct stats_query q = { .window = WIN_ALL, .cold = COLD_INCLUDE };
	struct stats_groups gs;
	struct writer w = { out, 0 };
	char **labels = NULL;

	if (stats_groups_build(r, &q, &gs) == -1)
		return -1;
	labels = calloc(gs.n ? gs.n : 1, sizeof(*labels));
	if (!labels)
		goto fail;
	for (size_t i = 0; i < gs.n; i++)
		if (!(labels[i] = group_labels(&gs.g[i])))
			goto fail;
	for (unsigned m = 0; m < HM__COUNT; m++)
		if (hist_metric_unit((enum hist_metric)m) == UNIT_US)
			histogram_family(&w, "tokentap_", &gs, labels, (enum hist_metric)m);
	tokens_per_event_families(&w, "tokentap_", &gs, labels);
	counter_families(&w, "tokentap_", &gs, labels);
	if (w.failed)
		goto fail;
	for (size_t i = 0; i < gs.n; i++)
		free(labels[i]);
	free(labels);
	stats_groups_free(&gs);
	return 0;
fail:
	if (labels)
		for (size_t i = 0; i < gs.n; i++)
			free(labels[i]);
	free(labels);
	stats_groups_free(&gs);
	return -1;
}

static int gauge_by_name(const void *a, const void *b)
{
	return strcmp(((const struct upstream_gauge *)a)->name, ((const struct upstream_gauge *)b)->name);
}

static int gauge_ptr_by_name(const void *a, const void *b)
{
	return gauge_by_name(*(const struct upstream_gauge *const *)a, *(const struct upstream_gauge *const *)b);
}

enum { EF_RUNNING, EF_WAITING, EF_KV, EF_PREFIX, EF_AGE, EF_SCRAPES };
_Static_assert(EF_SCRAPES + 1 == PROM_ENGINE_FAMILIES, "one row per engine family");

void prom_engine_families_free(struct prom_engine_family f[PROM_ENGINE_FAMILIES])
{
	for (unsigned k = 0; k < PROM_ENGINE_FAMILIES; k++) {
		free(f[k].s);
		f[k].s = NULL;
		f[k].n = 0;
	}
}

static void engine_sample(struct prom_engine_family *f, const char *upstream, const char *label_value, double v)
{
	struct prom_sample *s = &f->s[f->n++];
	s->upstream = upstream;
	s->label_value = label_value;
	s->value = v;
}

int prom_engine_families(const struct upstream_gauge *g, size_t n, uint64_t now_ns,
			 struct prom_engine_family f[PROM_ENGINE_FAMILIES])
{
	static const struct {
		const char *name, *help, *label;
		bool counter;
	} rows[PROM_ENGINE_FAMILIES] = {
		[EF_RUNNING] = { "tokentap_engine_requests_running",
				 "Requests the upstream's engine reports running, as last scraped from its "
				 "metrics_url.",
				 NULL, false },
		[EF_WAITING] = { "tokentap_engine_requests_waiting",
				 "Requests waiting in the upstream's engine queue, as last scraped from its "
				 "metrics_url.",
				 NULL, false },
		[EF_KV] = { "tokentap_engine_kv_cache_usage_ratio",
			    "The upstream's engine KV-cache use (0..1), as last scraped from its metrics_url.", NULL,
			    false },
		[EF_PREFIX] = { "tokentap_engine_prefix_cache_hit_ratio",
				"The upstream's engine prefix-cache hit ratio since it started (0..1), as last "
				"scraped.",
				NULL, false },
		[EF_AGE] = { "tokentap_engine_scrape_age_seconds",
			     "Seconds since the last successful scrape of the upstream's engine metrics.", NULL,
			     false },
		[EF_SCRAPES] = { "tokentap_engine_scrapes_total",
				 "Scrapes of the upstream's engine metrics (metrics_url), by result.", "result", true },
	};
	const struct upstream_gauge **pick = n ? calloc(n, sizeof(*pick)) : NULL;
	size_t np = 0;

	memset(f, 0, PROM_ENGINE_FAMILIES * sizeof(*f));
	if (n && !pick)
		return -1;
	for (unsigned k = 0; k < PROM_ENGINE_FAMILIES; k++) {
		f[k].name = rows[k].name;
		f[k].help = rows[k].help;
		f[k].label = rows[k].label;
		f[k].counter = rows[k].counter;
		if (n && !(f[k].s = calloc(2 * n, sizeof(*f[k].s)))) {
			free(pick);
			prom_engine_families_free(f);
			return -1;
		}
	}
	/* of one name, the entry scraped last */
	for (size_t i = 0; i < n; i++) {
		const struct engine_state *e = &g[i].engine;
		size_t j = 0;
		if (!e->successes && !e->failures)
			continue;
		while (j < np && strcmp(pick[j]->name, g[i].name) != 0)
			j++;
		if (j == np)
			pick[np++] = &g[i];
		else if (e->at_ns > pick[j]->engine.at_ns)
			pick[j] = &g[i];
	}
	if (np)
		qsort(pick, np, sizeof(*pick), gauge_ptr_by_name);
	for (size_t j = 0; j < np; j++) {
		const struct engine_state *e = &pick[j]->engine;
		const char *u = pick[j]->name;
		if (e->scraped) {
			if (e->running >= 0)
				engine_sample(&f[EF_RUNNING], u, NULL, (double)e->running);
			if (e->waiting >= 0)
				engine_sample(&f[EF_WAITING], u, NULL, (double)e->waiting);
			if (e->kv_use == e->kv_use)
				engine_sample(&f[EF_KV], u, NULL, e->kv_use);
			if (e->prefix_hit == e->prefix_hit)
				engine_sample(&f[EF_PREFIX], u, NULL, e->prefix_hit);
			engine_sample(&f[EF_AGE], u, NULL, now_ns > e->at_ns ? (double)(now_ns - e->at_ns) / 1e9 : 0.0);
		}
		engine_sample(&f[EF_SCRAPES], u, "ok", (double)e->successes);
		engine_sample(&f[EF_SCRAPES], u, "failed", (double)e->failures);
	}
	free(pick);
	return 0;
}

static int engine_text(struct writer *w, const struct upstream_gauge *g, size_t n)
{
	struct prom_engine_family f[PROM_ENGINE_FAMILIES];

	if (prom_engine_families(g, n, clock_now_ns(), f) == -1)
		return -1;
	for (unsigned k = 0; k < PROM_ENGINE_FAMILIES; k++) {
		if (!f[k].n)
			continue;
		emit(w, "# HELP %s %s\n# TYPE %s %s\n", f[k].name, f[k].help, f[k].name,
		     f[k].counter ? "counter" : "gauge");
		for (size_t i = 0; i < f[k].n; i++) {
			size_t len = prom_label_escape(NULL, 0, f[k].s[i].upstream);
			char *label = malloc(len + 1);
			if (!label) {
				w->failed = 1;
				break;
			}
			prom_label_escape(label, len + 1, f[k].s[i].upstream);
			if (f[k].label)
				emit(w, "%s{upstream=\"%s\",%s=\"%s\"} %.15g\n", f[k].name, label, f[k].label,
				     f[k].s[i].label_value, f[k].s[i].value);
			else
				emit(w, "%s{upstream=\"%s\"} %.15g\n", f[k].name, label, f[k].s[i].value);
			free(label);
		}
	}
	prom_engine_families_free(f);
	return 0;
}

int prom_render_gauges(struct evbuffer *out, const struct upstream_gauge *g, size_t n)
{
	static const struct {
		const char *name, *help;
	} families[] = {
		{ "in_flight", "Requests admitted to the upstream and running now, all workers." },
		{ "queued", "Requests waiting for an admission slot of the upstream now (max_concurrency)." },
	};
	struct upstream_gauge *sorted = n ? malloc(n * sizeof(*sorted)) : NULL;
	struct writer w = { out, 0 };

	if (n && !sorted)
		return -1;
	if (n)
		memcpy(sorted, g, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), gauge_by_name);
	for (size_t f = 0; f < 2; f++) {
		emit(&w, "# HELP tokentap_%s %s\n", families[f].name, families[f].help);
		emit(&w, "# TYPE tokentap_%s gauge\n", families[f].name);
		for (size_t i = 0; i < n;) {
			unsigned long long v = 0;
			size_t j = i;
			/* one name twice: a reload draining the old url */
			for (; j < n && strcmp(sorted[j].name, sorted[i].name) == 0; j++)
				v += f == 0 ? sorted[j].in_flight : sorted[j].queued;
			size_t len = prom_label_escape(NULL, 0, sorted[i].name);
			char *label = malloc(len + 1);
			if (!label) {
				w.failed = 1;
				break;
			}
			prom_label_escape(label, len + 1, sorted[i].name);
			emit(&w, "tokentap_%s{upstream=\"%s\"} %llu\n", families[f].name, label, v);
			free(label);
			i = j;
		}
	}
	for (unsigned c = 0; c < UPC__COUNT && !w.failed; c++) {
		emit(&w, "# HELP tokentap_upstream_%s_total %s\n", upstream_counter_keys[c], upstream_counter_help[c]);
		emit(&w, "# TYPE tokentap_upstream_%s_total counter\n", upstream_counter_keys[c]);
		for (size_t i = 0; i < n;) {
			unsigned long long v = 0;
			size_t j = i;
			for (; j < n && strcmp(sorted[j].name, sorted[i].name) == 0; j++)
				v += sorted[j].counters[c];
			size_t len = prom_label_escape(NULL, 0, sorted[i].name);
			char *label = malloc(len + 1);
			if (!label) {
				w.failed = 1;
				break;
			}
			prom_label_escape(label, len + 1, sorted[i].name);
			emit(&w, "tokentap_upstream_%s_total{upstream=\"%s\"} %llu\n", upstream_counter_keys[c], label,
			     v);
			free(label);
			i = j;
		}
	}
	free(sorted);
	if (!w.failed && engine_text(&w, g, n) == -1)
		w.failed = 1;
	return w.failed ? -1 : 0;
}

int prom_render_counters(struct evbuffer *out, const struct prom_counter_family *f, size_t nf)
{
	struct writer w = { out, 0 };

	for (size_t i = 0; i < nf; i++) {
		emit(&w, "# HELP %s %s\n# TYPE %s counter\n", f[i].name, f[i].help, f[i].name);
		for (size_t k = 0; k < f[i].n; k++)
			if (f[i].nlabels) {
				emit(&w, "%s{", f[i].name);
				for (unsigned j = 0; j < f[i].nlabels; j++) {
					const char *v = f[i].values[k * f[i].nlabels + j];
					size_t len = prom_label_escape(NULL, 0, v);
					char *esc = malloc(len + 1);
					if (!esc) {
						w.failed = 1;
						break;
					}
					prom_label_escape(esc, len + 1, v);
					emit(&w, "%s%s=\"%s\"", j ? "," : "", f[i].label_names[j], esc);
					free(esc);
				}
				emit(&w, "} %llu\n", (unsigned long long)f[i].counts[k]);
			} else if (f[i].label)
				emit(&w, "%s{%s=\"%s\"} %llu\n", f[i].name, f[i].label, f[i].values[k],
				     (unsigned long long)f[i].counts[k]);
			else
				emit(&w, "%s %llu\n", f[i].name, (unsigned long long)f[i].counts[k]);
	}
	return w.failed ? -1 : 0;
}

/* route="...",tenant="..." of a tenant group: tenant names need no
 * escaping (tenant.h), routes may. */
static char *tenant_labels(const struct stats_group *g)
{
	size_t lr = prom_label_escape(NULL, 0, g->route), lt = prom_label_escape(NULL, 0, g->model);
	size_t cap = lr + lt + sizeof("route=\"\",tenant=\"\"");
	char *s = malloc(cap), *p = s;

	if (!s)
		return NULL;
	p += sprintf(p, "route=\"");
	p += prom_label_escape(p, lr + 1, g->route);
	p += sprintf(p, "\",tenant=\"");
	p += prom_label_escape(p, lt + 1, g->model);
	sprintf(p, "\"");
	return s;
}

int prom_render_tenants(struct evbuffer *out, const struct store_result *r)
{
	struct stats_query q = { .window = WIN_ALL, .cold = COLD_INCLUDE, .by_tenant = true };
	struct stats_groups gs;
	struct writer w = { out, 0 };
	char **labels = NULL;
	int rc = -1;

	if (stats_groups_build(r, &q, &gs) == -1)
		return -1;
	labels = calloc(gs.n ? gs.n : 1, sizeof(*labels));
	if (!labels)
		goto out;
	for (size_t i = 0; i < gs.n; i++)
		if (!(labels[i] = tenant_labels(&gs.g[i])))
			goto out;
	histogram_family(&w, "tokentap_tenant_", &gs, labels, HM_TTFT);
	histogram_family(&w, "tokentap_tenant_", &gs, labels, HM_E2E);
	counter_families(&w, "tokentap_tenant_", &gs, labels);
	rc = w.failed ? -1 : 0;
out:
	if (labels)
		for (size_t i = 0; i < gs.n; i++)
			free(labels[i]);
	free(labels);
	stats_groups_free(&gs);
	return rc;
}
