/*
 * otlp_metrics.c — the GenAI metrics: a ring the workers push into, a
 * thread that aggregates it into tokentap histograms by attribute set and
 * exports them (otlp_metrics.h says the rules).
 *
 *   meter_finish ─▶ otlp_metrics_record ─copy─▶ ring (bounded, allocated once)
 *                      thread: every OTLPM_DRAIN_MS ring ─▶ series (struct hist each, cumulative)
 *                              every interval series ─▶ ExportMetricsServiceRequest ─▶ POST
 *
 * The ring is under `mu`; the series table is the thread's, and under
 * `series_mu` only so that /metrics (the admin thread) can read it.
 *
 * The mapping of a tokentap histogram to an OTLP exponential histogram
 * (docs/observability.md, "Buckets"): each non-empty tokentap bucket's
 * count goes to the exponential bucket holding the bucket's midpoint, in
 * the metric's unit (seconds for times, tokens for usage); tokentap bucket
 * 0 (the value 0) is the zero bucket. At scale OTLPM_SCALE (7: 128 buckets
 * per power of two, each 0.54 % wide) no two tokentap midpoints share an
 * exponential bucket (the closest two are 0.79 % apart), so every bucket
 * keeps its own count; count, sum, min and max are exact.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "otlp_metrics.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <math.h>
#include <otlp_metrics.pb-c.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "config.h"
#include "hist.h"
#include "log.h"
#include "otlp_json.h"
#include "timeline.h"
#include "version.h"

const char *const otlpm_drop_reasons[OTLPM_DROP__COUNT] = { "queue_full", "export_failed" };

/* The attribute set of a series: what the conventions name, as known. */
struct gm_attrs {
	const char *op, *provider; /* static text */
	char model[128];	   /* gen_ai.request.model; "" unknown */
	char resp_model[128];	   /* gen_ai.response.model; "" unknown */
	char address[256];	   /* server.address; "" unknown */
	int port;		   /* server.port; -1 unknown */
	char etype[32];		   /* error.type; "" none */
	bool overflow;		   /* otel.metric.overflow */
};

/* One finished request, as queued. Times in µs; -1: not measured. */
struct gm_item {
	struct gm_attrs a;
	int64_t e2e_us, ttfc_us;
	int64_t in_tokens, out_tokens;
	unsigned ngaps;
	uint64_t rest_n, rest_sum_us; /* the gaps past OTLPM_GAPS */
	uint32_t gaps_us[OTLPM_GAPS];
};

enum gm_hist { GM_DURATION, GM_TTFC, GM_TPOC, GM_TOKENS_IN, GM_TOKENS_OUT, GM__COUNT };

struct gm_series {
	struct gm_attrs a;
	uint64_t hash;
	struct hist *h[GM__COUNT]; /* allocated on first use */
};

struct otlpm {
	struct otlp_metrics_options o;
	struct otlp *http; /* NULL: /metrics only */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* CLOCK_MONOTONIC */
	struct gm_item *ring;
	size_t head, n; /* under mu */
	bool stopping;	/* under mu */

	pthread_mutex_t series_mu;
	struct gm_series *series; /* max_series + 1 (the overflow set last) */
	size_t nseries;		  /* the thread's writes under series_mu */
	struct gm_series *overflow;
	uint64_t start_unix_ns;

	struct event *drain_ev; /* on the transport's base: drains during a POST */

	_Atomic uint64_t points, failures, exports, overflowed;
	_Atomic uint64_t dropped[OTLPM_DROP__COUNT];
	uint64_t last_warn_ns;
	bool last_bad; /* the thread's: the last export failed or took over OTLPM_SLOW_MS */
};

static struct otlpm *g_m;

/* ---- options ---- */

static const char *env_of(const char *a, const char *b)
{
	const char *v = a ? getenv(a) : NULL;
	if (v && *v)
		return v;
	v = b ? getenv(b) : NULL;
	return v && *v ? v : NULL;
}

static int env_ms(const char *a, const char *b, uint64_t *out, char *err, size_t errlen)
{
	const char *v = env_of(a, b);
	char *end;

	if (!v)
		return 0;
	errno = 0;
	unsigned long long u = strtoull(v, &end, 10);
	if (errno || end == v || *end || u > 3600000) {
		snprintf(err, errlen, "%s: expected milliseconds up to 3600000, got \"%s\"", getenv(a) ? a : b, v);
		return -1;
	}
	*out = u;
	return 0;
}

int otlp_metrics_options_resolve(const struct config *cfg, struct otlp_metrics_options *o, char *err, size_t errlen)
{
	const char *v, *base = NULL;
	uint64_t u;

	memset(o, 0, sizeof(*o));
	if (otlp_protocol_check(cfg->otlp_metrics_protocol, err, errlen) == -1)
		return -1; /* refused even while nothing is exported */
	o->prometheus = cfg->genai_prometheus;
	o->max_series = cfg->otlp_metrics_series ? cfg->otlp_metrics_series : 256;
	v = getenv("OTEL_SDK_DISABLED");
	bool disabled = !cfg->otlp_metrics_endpoint && v && strcasecmp(v, "true") == 0;
	if (cfg->otlp_metrics_endpoint) {
		base = cfg->otlp_metrics_endpoint;
	} else if (!disabled && (v = env_of("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", NULL))) {
		if (strlen(v) >= sizeof(o->http.url)) {
			snprintf(err, errlen, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is longer than %zu bytes",
				 sizeof(o->http.url) - 1);
			return -1;
		}
		snprintf(o->http.url, sizeof(o->http.url), "%s", v);
	} else if (!disabled && (v = env_of("OTEL_METRICS_EXPORTER", NULL)) && strcmp(v, "otlp") == 0) {
		base = env_of("OTEL_EXPORTER_OTLP_ENDPOINT", NULL);
	}
	if (base) {
		size_t n = strlen(base);
		while (n && base[n - 1] == '/')
			n--;
		if (n + sizeof("/v1/metrics") > sizeof(o->http.url)) {
			snprintf(err, errlen, "the OTLP metrics endpoint is longer than %zu bytes",
				 sizeof(o->http.url) - 12);
			return -1;
		}
		snprintf(o->http.url, sizeof(o->http.url), "%.*s/v1/metrics", (int)n, base);
	}
	if (!o->http.url[0] && !o->prometheus)
		return 0;
	if (o->http.url[0] && otlp_protocol_resolve(cfg->otlp_metrics_protocol, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
						    "metrics", &o->http.json, err, errlen) == -1)
		return -1;
	v = env_of("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", NULL);
	if (o->http.url[0] && v && strcasecmp(v, "cumulative") != 0)
		log_warn("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=%s: tokentap sends cumulative only", v);
	o->http.headers = cfg->otlp_headers
				  ? cfg->otlp_headers
				  : env_of("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS");
	o->http.service = cfg->otlp_service ? cfg->otlp_service : env_of("OTEL_SERVICE_NAME", NULL);
	o->http.resource = cfg->otlp_resource ? cfg->otlp_resource : env_of("OTEL_RESOURCE_ATTRIBUTES", NULL);
	o->http.ca_file = cfg->otlp_ca_file
				  ? cfg->otlp_ca_file
				  : env_of("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE");
	o->http.timeout_ms = cfg->otlp_timeout_ms;
	if (!o->http.timeout_ms) {
		u = OTLP_TIMEOUT_MS_DEFAULT;
		if (env_ms("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT", &u, err, errlen) == -1)
			return -1;
		o->http.timeout_ms = u ? u : OTLP_TIMEOUT_MS_DEFAULT;
	}
	o->interval_ms = cfg->otlp_metrics_interval_ms;
	if (!o->interval_ms) {
		u = OTLPM_INTERVAL_MS_DEFAULT;
		if (env_ms("OTEL_METRIC_EXPORT_INTERVAL", NULL, &u, err, errlen) == -1)
			return -1;
		o->interval_ms = u ? u : OTLPM_INTERVAL_MS_DEFAULT;
	}
	o->http.attempts = OTLPM_ATTEMPTS;
	o->http.backoff_ms = OTLP_BACKOFF_MS;
	return 1;
}

/* ---- the worker's side ---- */

/* server.address and server.port of an upstream url. */
static void url_address(struct gm_attrs *a, const char *url)
{
	const char *p = url ? strstr(url, "://") : NULL;
	bool tls = url && strncmp(url, "https", 5) == 0;

	a->port = -1;
	a->address[0] = '\0';
	if (!p)
		return;
	p += 3;
	size_t n = strcspn(p, "/");
	const char *hend = p + n, *colon = NULL;
	if (*p == '[') {
		const char *rb = memchr(p, ']', n);
		if (!rb)
			return;
		snprintf(a->address, sizeof(a->address), "%.*s", (int)(rb - p - 1), p + 1);
		colon = rb + 1 < hend && rb[1] == ':' ? rb + 1 : NULL;
	} else {
		colon = memchr(p, ':', n);
		snprintf(a->address, sizeof(a->address), "%.*s", (int)((colon ? colon : hend) - p), p);
	}
	a->port = colon ? (int)strtol(colon + 1, NULL, 10) : tls ? 443 : 80;
}

static int64_t us_of_ms(double ms)
{
	return isnan(ms) || ms < 0 ? -1 : (int64_t)llround(ms * 1e3);
}

void otlp_metrics_record(const struct req_record *rec)
{
	struct otlpm *x = g_m;
	double m[RM__COUNT];

	if (!x || rec->mirror)
		return;
	record_derive(rec, m);
	pthread_mutex_lock(&x->mu);
	if (x->n == OTLPM_QUEUE || x->stopping) {
		pthread_mutex_unlock(&x->mu);
		atomic_fetch_add(&x->dropped[OTLPM_DROP_QUEUE_FULL], 1);
		return;
	}
	struct gm_item *it = &x->ring[(x->head + x->n) % OTLPM_QUEUE];
	x->n++;
	/* filled under the lock: the slot is not the thread's until then */
	it->a.op = otlp_operation_name(rec->api);
	it->a.provider = otlp_provider_name(rec->api);
	memcpy(it->a.model, rec->model, sizeof(it->a.model));
	memcpy(it->a.resp_model, rec->resp_model, sizeof(it->a.resp_model));
	url_address(&it->a, rec->up_url);
	it->a.etype[0] = '\0';
	if (rec->error != REQ_ERR_NONE)
		snprintf(it->a.etype, sizeof(it->a.etype), "%s", req_error_name(rec->error));
	else if (rec->status >= 500)
		snprintf(it->a.etype, sizeof(it->a.etype), "%d", rec->status);
	it->a.overflow = false;
	it->e2e_us = us_of_ms(m[RM_E2E]);
	it->ttfc_us = rec->stream == 1 ? us_of_ms(m[RM_TTFT]) : -1;
	it->in_tokens = rec->usage.input_tokens;
	it->out_tokens = rec->usage.output_tokens >= 0 ? rec->usage.output_tokens
			 : rec->stream == 1	       ? (int64_t)rec->token_events
						       : -1;
	it->ngaps = 0;
	it->rest_n = it->rest_sum_us = 0;
	if (rec->stream == 1) {
		uint64_t kept_sum = 0;
		size_t k = rec->itl_n < OTLPM_GAPS ? rec->itl_n : OTLPM_GAPS;
		for (size_t i = 0; i < k; i++) {
			uint64_t us = (rec->itl_ns[i] + 500) / 1000;
			it->gaps_us[i] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
			kept_sum += rec->itl_ns[i];
		}
		it->ngaps = (unsigned)k;
		if (rec->itl_total > k) {
			it->rest_n = rec->itl_total - k;
			it->rest_sum_us = (rec->itl_sum > kept_sum ? rec->itl_sum - kept_sum : 0) / 1000;
		}
	}
	pthread_mutex_unlock(&x->mu);
}

/* ---- aggregation (the thread's) ---- */

static uint64_t attrs_hash(const struct gm_attrs *a)
{
	uint64_t h = 1469598103934665603ull;
	const char *parts[6] = { a->op, a->provider, a->model, a->resp_model, a->address, a->etype };
	for (int i = 0; i < 6; i++) {
		for (const char *p = parts[i]; *p; p++)
			h = (h ^ (uint8_t)*p) * 1099511628211ull;
		h = (h ^ 0xff) * 1099511628211ull;
	}
	return (h ^ (uint64_t)(a->port + 1)) * 1099511628211ull;
}

static bool attrs_eq(const struct gm_attrs *a, const struct gm_attrs *b)
{
	return a->port == b->port && strcmp(a->op, b->op) == 0 && strcmp(a->provider, b->provider) == 0 &&
	       strcmp(a->model, b->model) == 0 && strcmp(a->resp_model, b->resp_model) == 0 &&
	       strcmp(a->address, b->address) == 0 && strcmp(a->etype, b->etype) == 0;
}

/* The series of these attributes; past max_series, the overflow set. A
 * linear search over at most max_series hashes: the thread's, once per
 * request, off the forwarding path. */
static struct gm_series *series_of(struct otlpm *x, const struct gm_attrs *a)
{
	uint64_t h = attrs_hash(a);
	for (size_t i = 0; i < x->nseries; i++)
		if (x->series[i].hash == h && attrs_eq(&x->series[i].a, a))
			return &x->series[i];
	if (x->nseries == x->o.max_series) {
		atomic_fetch_add(&x->overflowed, 1);
		return x->overflow;
	}
	pthread_mutex_lock(&x->series_mu);
	struct gm_series *s = &x->series[x->nseries++];
	memset(s, 0, sizeof(*s));
	s->a = *a;
	s->hash = h;
	pthread_mutex_unlock(&x->series_mu);
	return s;
}

static struct hist *hist_of(struct gm_series *s, enum gm_hist k)
{
	if (!s->h[k] && (s->h[k] = malloc(sizeof(struct hist))))
		hist_init(s->h[k]);
	return s->h[k];
}

static void aggregate(struct otlpm *x, const struct gm_item *it)
{
	struct gm_series *s = series_of(x, &it->a);
	struct hist *h;

	pthread_mutex_lock(&x->series_mu);
	if (it->e2e_us >= 0 && (h = hist_of(s, GM_DURATION)))
		hist_record(h, (uint64_t)it->e2e_us);
	if (it->ttfc_us >= 0 && (h = hist_of(s, GM_TTFC)))
		hist_record(h, (uint64_t)it->ttfc_us);
	if ((it->ngaps || it->rest_n) && (h = hist_of(s, GM_TPOC))) {
		for (unsigned i = 0; i < it->ngaps; i++)
			hist_record(h, it->gaps_us[i]);
		if (it->rest_n)
			hist_record_n(h, it->rest_sum_us / it->rest_n, it->rest_n);
	}
	if (it->in_tokens >= 0 && (h = hist_of(s, GM_TOKENS_IN)))
		hist_record(h, (uint64_t)it->in_tokens);
	if (it->out_tokens >= 0 && (h = hist_of(s, GM_TOKENS_OUT)))
		hist_record(h, (uint64_t)it->out_tokens);
	pthread_mutex_unlock(&x->series_mu);
}

/* Aggregates what is queued, in chunks, never holding mu while aggregating. */
static void drain(struct otlpm *x)
{
	static struct gm_item batch[64];
	for (;;) {
		pthread_mutex_lock(&x->mu);
		size_t k = x->n < 64 ? x->n : 64;
		for (size_t i = 0; i < k; i++)
			batch[i] = x->ring[(x->head + i) % OTLPM_QUEUE];
		x->head = (x->head + k) % OTLPM_QUEUE;
		x->n -= k;
		pthread_mutex_unlock(&x->mu);
		if (!k)
			return;
		for (size_t i = 0; i < k; i++)
			aggregate(x, &batch[i]);
	}
}

static void on_drain(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	drain(arg);
}

/* ---- encoding ---- */

static const struct {
	const char *name, *desc, *unit, *prom;
	double scale; /* the metric's unit per stored unit */
} gm_meta[GM__COUNT] = {
	[GM_DURATION] = { "gen_ai.client.operation.duration", "GenAI operation duration.", "s",
			  "gen_ai_client_operation_duration_seconds", 1e-6 },
	[GM_TTFC] = { "gen_ai.client.operation.time_to_first_chunk",
		      "Time to receive the first chunk of a streamed response, from the request's arrival.", "s",
		      "gen_ai_client_operation_time_to_first_chunk_seconds", 1e-6 },
	[GM_TPOC] = { "gen_ai.client.operation.time_per_output_chunk",
		      "Time between two chunks of a streamed response, one sample per chunk after the first.", "s",
		      "gen_ai_client_operation_time_per_output_chunk_seconds", 1e-6 },
	[GM_TOKENS_IN] = { "gen_ai.client.token.usage", "Number of input and output tokens used.", "{token}",
			   "gen_ai_client_token_usage", 1 },
	[GM_TOKENS_OUT] = { "gen_ai.client.token.usage", "Number of input and output tokens used.", "{token}",
			    "gen_ai_client_token_usage", 1 },
};

/* The exponential bucket index of v > 0 at OTLPM_SCALE: values in
 * (base^i, base^(i+1)], base = 2^(2^-scale). */
static int32_t exp_index(double v)
{
	int e;
	double f = frexp(v, &e); /* v = f * 2^e, f in [0.5, 1) */
	if (f == 0.5)		 /* an exact power of two is its bucket's upper bound */
		return (e - 1) * (1 << OTLPM_SCALE) - 1;
	return (int32_t)ceil(log2(v) * (double)(1 << OTLPM_SCALE)) - 1;
}

#define GM_ATTRS_MAX 10

/* One data point, built in place. */
struct point_build {
	Tokentap__Otlp__ExponentialHistogramDataPoint dp;
	Tokentap__Otlp__ExponentialHistogramDataPoint__Buckets pos;
	Tokentap__Otlp__KeyValue kv[GM_ATTRS_MAX];
	Tokentap__Otlp__AnyValue av[GM_ATTRS_MAX];
	Tokentap__Otlp__KeyValue *kvp[GM_ATTRS_MAX];
	uint64_t *counts;
};

static Tokentap__Otlp__AnyValue *pattr(struct point_build *b, const char *key)
{
	size_t i = b->dp.n_attributes++;
	b->kv[i] = (Tokentap__Otlp__KeyValue)TOKENTAP__OTLP__KEY_VALUE__INIT;
	b->av[i] = (Tokentap__Otlp__AnyValue)TOKENTAP__OTLP__ANY_VALUE__INIT;
	b->kv[i].key = (char *)key;
	b->kv[i].value = &b->av[i];
	b->kvp[i] = &b->kv[i];
	return &b->av[i];
}

static void pattr_str(struct point_build *b, const char *key, const char *v)
{
	Tokentap__Otlp__AnyValue *a = pattr(b, key);
	a->value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
	a->string_value = (char *)v;
}

/* The point of one series' histogram; -1 out of memory. */
static int point_fill(struct point_build *b, const struct gm_series *s, const struct hist *h, enum gm_hist k,
		      uint64_t start, uint64_t now)
{
	double sc = gm_meta[k].scale;
	Tokentap__Otlp__ExponentialHistogramDataPoint *dp = &b->dp;

	*dp = (Tokentap__Otlp__ExponentialHistogramDataPoint)TOKENTAP__OTLP__EXPONENTIAL_HISTOGRAM_DATA_POINT__INIT;
	b->pos = (Tokentap__Otlp__ExponentialHistogramDataPoint__Buckets)
		TOKENTAP__OTLP__EXPONENTIAL_HISTOGRAM_DATA_POINT__BUCKETS__INIT;
	dp->attributes = b->kvp;
	if (s->a.overflow) {
		Tokentap__Otlp__AnyValue *a = pattr(b, "otel.metric.overflow");
		a->value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_BOOL_VALUE;
		a->bool_value = true;
	} else {
		pattr_str(b, "gen_ai.operation.name", s->a.op);
		pattr_str(b, "gen_ai.provider.name", s->a.provider);
		if (s->a.model[0])
			pattr_str(b, "gen_ai.request.model", s->a.model);
		if (s->a.resp_model[0])
			pattr_str(b, "gen_ai.response.model", s->a.resp_model);
		if (s->a.address[0]) {
			pattr_str(b, "server.address", s->a.address);
			Tokentap__Otlp__AnyValue *a = pattr(b, "server.port");
			a->value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_INT_VALUE;
			a->int_value = s->a.port;
		}
		if (s->a.etype[0])
			pattr_str(b, "error.type", s->a.etype);
	}
	if (k == GM_TOKENS_IN || k == GM_TOKENS_OUT)
		pattr_str(b, "gen_ai.token.type", k == GM_TOKENS_IN ? "input" : "output");
	dp->has_start_time_unix_nano = dp->has_time_unix_nano = true;
	dp->start_time_unix_nano = start;
	dp->time_unix_nano = now;
	dp->has_count = dp->has_sum = dp->has_scale = dp->has_zero_count = true;
	dp->count = h->count;
	dp->sum = (double)h->sum * sc;
	dp->scale = OTLPM_SCALE;
	dp->zero_count = h->buckets[0];
	if (h->count) {
		dp->has_min = dp->has_max = true;
		dp->min = (double)h->min * sc;
		dp->max = (double)h->max * sc;
	}
	/* the first and last non-empty bucket past the zero bucket */
	unsigned first = 0, last = 0;
	for (unsigned i = 1; i < HIST_BUCKETS; i++)
		if (h->buckets[i]) {
			first = first ? first : i;
			last = i;
		}
	if (!first)
		return 0;
	int32_t lo = exp_index(((double)hist_bucket_low(first) + (double)hist_bucket_high(first)) / 2 * sc);
	uint64_t top = hist_bucket_high(last) == UINT64_MAX ? HIST_LIMIT - 1 : hist_bucket_high(last);
	int32_t hi = exp_index(((double)hist_bucket_low(last) + (double)top) / 2 * sc);
	b->counts = calloc((size_t)(hi - lo + 1), sizeof(*b->counts));
	if (!b->counts)
		return -1;
	for (unsigned i = first; i <= last; i++) {
		if (!h->buckets[i])
			continue;
		uint64_t high = hist_bucket_high(i) == UINT64_MAX ? HIST_LIMIT - 1 : hist_bucket_high(i);
		int32_t e = exp_index(((double)hist_bucket_low(i) + (double)high) / 2 * sc);
		e = e < lo ? lo : e > hi ? hi : e;
		b->counts[e - lo] += h->buckets[i];
	}
	b->pos.has_offset = true;
	b->pos.offset = lo;
	b->pos.n_bucket_counts = (size_t)(hi - lo + 1);
	b->pos.bucket_counts = b->counts;
	dp->positive = &b->pos;
	return 0;
}

static uint64_t unix_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Every series as one ExportMetricsServiceRequest (series_mu held); *npoints
 * the data points in it. malloc'd bytes, NULL with *len 0 when there is
 * nothing to send, NULL out of memory. */
static uint8_t *encode(struct otlpm *x, size_t *len, size_t *npoints)
{
	size_t ns = x->nseries + 1, maxp = ns * GM__COUNT;
	struct point_build *pb = calloc(maxp, sizeof(*pb));
	Tokentap__Otlp__ExponentialHistogramDataPoint **dps = calloc(maxp, sizeof(*dps));
	size_t nres = otlp_transport_resource(x->http, 0, &(const char *){ NULL }, &(const char *){ NULL });
	Tokentap__Otlp__KeyValue *rkv = calloc(nres + 1, sizeof(*rkv));
	Tokentap__Otlp__AnyValue *rav = calloc(nres + 1, sizeof(*rav));
	Tokentap__Otlp__KeyValue **rkvp = calloc(nres + 1, sizeof(*rkvp));
	uint8_t *out = NULL;
	uint64_t now = unix_now_ns();
	Tokentap__Otlp__ExponentialHistogram eh[4];
	Tokentap__Otlp__Metric mt[4], *mtp[4];
	size_t nm = 0, np = 0;

	*len = 0;
	*npoints = 0;
	if (!pb || !dps || !rkv || !rav || !rkvp)
		goto done;
	/* the metrics in order; token usage's input and output points are one metric's */
	static const enum gm_hist groups[4][2] = {
		{ GM_DURATION, GM__COUNT },
		{ GM_TTFC, GM__COUNT },
		{ GM_TPOC, GM__COUNT },
		{ GM_TOKENS_IN, GM_TOKENS_OUT },
	};
	for (int g = 0; g < 4; g++) {
		size_t first = np;
		for (int j = 0; j < 2 && groups[g][j] != GM__COUNT; j++) {
			enum gm_hist k = groups[g][j];
			for (size_t i = 0; i < ns; i++) {
				const struct gm_series *s = i < x->nseries ? &x->series[i] : x->overflow;
				if (!s->h[k] || !s->h[k]->count)
					continue;
				if (point_fill(&pb[np], s, s->h[k], k, x->start_unix_ns, now) == -1)
					goto done;
				dps[np] = &pb[np].dp;
				np++;
			}
		}
		if (np == first)
			continue;
		eh[nm] = (Tokentap__Otlp__ExponentialHistogram)TOKENTAP__OTLP__EXPONENTIAL_HISTOGRAM__INIT;
		eh[nm].n_data_points = np - first;
		eh[nm].data_points = &dps[first];
		eh[nm].has_aggregation_temporality = true;
		eh[nm].aggregation_temporality =
			TOKENTAP__OTLP__AGGREGATION_TEMPORALITY__AGGREGATION_TEMPORALITY_CUMULATIVE;
		mt[nm] = (Tokentap__Otlp__Metric)TOKENTAP__OTLP__METRIC__INIT;
		mt[nm].name = (char *)gm_meta[groups[g][0]].name;
		mt[nm].description = (char *)gm_meta[groups[g][0]].desc;
		mt[nm].unit = (char *)gm_meta[groups[g][0]].unit;
		mt[nm].data_case = TOKENTAP__OTLP__METRIC__DATA_EXPONENTIAL_HISTOGRAM;
		mt[nm].exponential_histogram = &eh[nm];
		mtp[nm] = &mt[nm];
		nm++;
	}
	if (!np)
		goto done;
	for (size_t i = 0; i < nres; i++) {
		const char *k, *v;
		otlp_transport_resource(x->http, i, &k, &v);
		rkv[i] = (Tokentap__Otlp__KeyValue)TOKENTAP__OTLP__KEY_VALUE__INIT;
		rav[i] = (Tokentap__Otlp__AnyValue)TOKENTAP__OTLP__ANY_VALUE__INIT;
		rav[i].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
		rav[i].string_value = (char *)v;
		rkv[i].key = (char *)k;
		rkv[i].value = &rav[i];
		rkvp[i] = &rkv[i];
	}
	Tokentap__Otlp__Resource res = TOKENTAP__OTLP__RESOURCE__INIT;
	res.n_attributes = nres;
	res.attributes = rkvp;
	Tokentap__Otlp__InstrumentationScope scope = TOKENTAP__OTLP__INSTRUMENTATION_SCOPE__INIT;
	scope.name = "tokentap";
	scope.version = TOKENTAP_VERSION;
	Tokentap__Otlp__ScopeMetrics sm = TOKENTAP__OTLP__SCOPE_METRICS__INIT;
	sm.scope = &scope;
	sm.n_metrics = nm;
	sm.metrics = mtp;
	Tokentap__Otlp__ScopeMetrics *smp = &sm;
	Tokentap__Otlp__ResourceMetrics rm = TOKENTAP__OTLP__RESOURCE_METRICS__INIT;
	rm.resource = &res;
	rm.n_scope_metrics = 1;
	rm.scope_metrics = &smp;
	Tokentap__Otlp__ResourceMetrics *rmp = &rm;
	Tokentap__Otlp__ExportMetricsServiceRequest req = TOKENTAP__OTLP__EXPORT_METRICS_SERVICE_REQUEST__INIT;
	req.n_resource_metrics = 1;
	req.resource_metrics = &rmp;
	if (x->o.http.json) {
		out = (uint8_t *)otlp_json_encode(&req.base, len);
	} else {
		*len = tokentap__otlp__export_metrics_service_request__get_packed_size(&req);
		if ((out = malloc(*len ? *len : 1)))
			tokentap__otlp__export_metrics_service_request__pack(&req, out);
	}
	*npoints = np;
done:
	for (size_t i = 0; pb && i < np; i++)
		free(pb[i].counts);
	if (pb && np < maxp)
		free(pb[np].counts); /* a point that failed half way */
	free(pb);
	free(dps);
	free(rkv);
	free(rav);
	free(rkvp);
	return out;
}

/* ---- the thread ---- */

static void warn_failure(struct otlpm *x, const char *why)
{
	uint64_t now = clock_now_ns();
	if (x->last_warn_ns && now - x->last_warn_ns < 30000000000ull)
		return;
	x->last_warn_ns = now;
	log_warn("OTLP metrics export to %s: %s (said at most every 30 s)", x->o.http.url, why);
}

/* Waits ms (draining meanwhile) unless stopping; false when stopping. */
static bool wait_draining(struct otlpm *x, uint64_t ms)
{
	uint64_t until = clock_now_ns() + ms * 1000000u;
	for (;;) {
		drain(x);
		pthread_mutex_lock(&x->mu);
		uint64_t now = clock_now_ns();
		if (x->stopping || now >= until) {
			bool stopping = x->stopping;
			pthread_mutex_unlock(&x->mu);
			return !stopping;
		}
		uint64_t step = until - now < OTLPM_DRAIN_MS * 1000000ull ? until - now : OTLPM_DRAIN_MS * 1000000ull;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + step;
		ts.tv_sec = (time_t)(t / 1000000000u);
		ts.tv_nsec = (long)(t % 1000000000u);
		pthread_cond_timedwait(&x->cv, &x->mu, &ts);
		pthread_mutex_unlock(&x->mu);
	}
}

/* One export of every series; `last`: at stop, one attempt, and none at
 * all after an export that failed or was slow (the points are counted as
 * export_failed), so that a failing collector does not hold the stop for
 * another timeout. */
static void export_all(struct otlpm *x, bool last)
{
	size_t len, np;
	char why[256];
	uint64_t t0 = clock_now_ns();

	pthread_mutex_lock(&x->series_mu);
	uint8_t *body = encode(x, &len, &np);
	pthread_mutex_unlock(&x->series_mu);
	if (!body || (last && x->last_bad)) {
		atomic_fetch_add(&x->dropped[OTLPM_DROP_EXPORT], np);
		free(body);
		return;
	}
	x->last_bad = true; /* until it succeeds in time */
	struct timeval tv = { 0, OTLPM_DRAIN_MS * 1000 };
	event_add(x->drain_ev, &tv);
	uint64_t backoff = x->o.http.backoff_ms;
	for (unsigned attempt = 1;; attempt++) {
		why[0] = '\0';
		int code = otlp_transport_post(x->http, body, len, why, sizeof(why));
		if (code >= 200 && code < 300) {
			atomic_fetch_add(&x->points, np);
			atomic_fetch_add(&x->exports, 1);
			x->last_bad = clock_now_ns() - t0 > OTLPM_SLOW_MS * 1000000ull;
			break;
		}
		atomic_fetch_add(&x->failures, 1);
		if (code)
			snprintf(why, sizeof(why), "HTTP %d", code);
		warn_failure(x, why);
		if (last || !otlp_transport_retryable(code) || attempt >= x->o.http.attempts ||
		    !wait_draining(x, backoff)) {
			atomic_fetch_add(&x->dropped[OTLPM_DROP_EXPORT], np);
			break;
		}
		backoff *= 2;
	}
	event_del(x->drain_ev);
	free(body);
}

static void *metrics_main(void *arg)
{
	struct otlpm *x = arg;

	pthread_setname_np(pthread_self(), "tokentap-otlpm");
	for (;;) {
		bool go_on = wait_draining(x, x->http ? x->o.interval_ms : 3600000);
		if (x->http)
			export_all(x, !go_on);
		if (!go_on)
			break;
	}
	drain(x);
	return NULL;
}

/* ---- life ---- */

static void series_free(struct gm_series *s)
{
	for (int k = 0; k < GM__COUNT; k++)
		free(s->h[k]);
}

static void otlpm_free(struct otlpm *x)
{
	if (x->series) {
		for (size_t i = 0; i <= x->o.max_series; i++)
			series_free(&x->series[i]);
		free(x->series);
	}
	if (x->drain_ev)
		event_free(x->drain_ev);
	otlp_transport_free(x->http);
	free(x->ring);
	free(x);
}

int otlp_metrics_open(const struct otlp_metrics_options *o, char *err, size_t errlen)
{
	struct otlpm *x = calloc(1, sizeof(*x));
	pthread_condattr_t ca;

	if (!x) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	x->o = *o;
	x->ring = calloc(OTLPM_QUEUE, sizeof(*x->ring));
	x->series = calloc((size_t)o->max_series + 1, sizeof(*x->series));
	if (!x->ring || !x->series) {
		snprintf(err, errlen, "out of memory for the GenAI metrics");
		goto fail;
	}
	x->overflow = &x->series[o->max_series];
	x->overflow->a.op = x->overflow->a.provider = "";
	x->overflow->a.overflow = true;
	if (o->http.url[0]) {
		if (!(x->http = otlp_transport_open(&o->http, err, errlen)))
			goto fail;
		if (!(x->drain_ev = event_new(otlp_transport_base(x->http), -1, EV_PERSIST, on_drain, x))) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
	}
	x->start_unix_ns = unix_now_ns();
	pthread_mutex_init(&x->mu, NULL);
	pthread_mutex_init(&x->series_mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&x->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&x->thread, NULL, metrics_main, x) != 0) {
		snprintf(err, errlen, "cannot start the OTLP metrics thread");
		pthread_mutex_destroy(&x->mu);
		pthread_mutex_destroy(&x->series_mu);
		pthread_cond_destroy(&x->cv);
		goto fail;
	}
	g_m = x;
	if (x->http)
		log_info("exporting the GenAI metrics over OTLP/HTTP to %s every %llu ms", o->http.url,
			 (unsigned long long)o->interval_ms);
	return 0;
fail:
	otlpm_free(x);
	return -1;
}

void otlp_metrics_close(void)
{
	struct otlpm *x = g_m;

	if (!x)
		return;
	pthread_mutex_lock(&x->mu);
	x->stopping = true;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->mu);
	pthread_join(x->thread, NULL);
	g_m = NULL;
	pthread_mutex_destroy(&x->mu);
	pthread_mutex_destroy(&x->series_mu);
	pthread_cond_destroy(&x->cv);
	otlpm_free(x);
}

bool otlp_metrics_active(void)
{
	return g_m != NULL;
}

bool otlp_metrics_counts(struct otlp_metrics_counts *c)
{
	struct otlpm *x = g_m;

	memset(c, 0, sizeof(*c));
	if (!x || !x->http)
		return false;
	c->points = atomic_load(&x->points);
	c->failures = atomic_load(&x->failures);
	c->exports = atomic_load(&x->exports);
	c->overflow = atomic_load(&x->overflowed);
	for (int i = 0; i < OTLPM_DROP__COUNT; i++)
		c->dropped[i] = atomic_load(&x->dropped[i]);
	return true;
}

/* ---- /metrics ---- */

/* The conventions' advice for explicit buckets: seconds (time metrics) and
 * tokens (usage), as the Prometheus families' `le`. */
static const double le_seconds[] = { 0.01, 0.02, 0.04, 0.08,  0.16,  0.32,  0.64,
				     1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92 };
static const double le_tokens[] = { 1,	   4,	  16,	  64,	   256,	    1024,     4096,
				    16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864 };

static void esc(struct evbuffer *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			evbuffer_add_printf(out, "\\%c", *s);
		else if (*s == '\n')
			evbuffer_add(out, "\\n", 2);
		else
			evbuffer_add(out, s, 1);
	}
}

static void prom_labels(struct evbuffer *out, const struct gm_series *s, enum gm_hist k)
{
	if (s->a.overflow) {
		evbuffer_add_printf(out, "otel_metric_overflow=\"true\"");
	} else {
		evbuffer_add_printf(out, "gen_ai_operation_name=\"%s\",gen_ai_provider_name=\"", s->a.op);
		esc(out, s->a.provider);
		evbuffer_add_printf(out, "\",gen_ai_request_model=\"");
		esc(out, s->a.model);
		evbuffer_add_printf(out, "\",gen_ai_response_model=\"");
		esc(out, s->a.resp_model);
		evbuffer_add_printf(out, "\",server_address=\"");
		esc(out, s->a.address);
		evbuffer_add_printf(out, "\",server_port=\"%d\",error_type=\"", s->a.port > 0 ? s->a.port : 0);
		esc(out, s->a.etype);
		evbuffer_add(out, "\"", 1);
	}
	if (k == GM_TOKENS_IN || k == GM_TOKENS_OUT)
		evbuffer_add_printf(out, ",gen_ai_token_type=\"%s\"", k == GM_TOKENS_IN ? "input" : "output");
}

int otlp_metrics_prom(struct evbuffer *out)
{
	struct otlpm *x = g_m;

	if (!x || !x->o.prometheus)
		return 0;
	static const enum gm_hist order[4][2] = {
		{ GM_DURATION, GM__COUNT },
		{ GM_TTFC, GM__COUNT },
		{ GM_TPOC, GM__COUNT },
		{ GM_TOKENS_IN, GM_TOKENS_OUT },
	};
	pthread_mutex_lock(&x->series_mu);
	size_t ns = x->nseries + 1;
	for (int g = 0; g < 4; g++) {
		enum gm_hist k0 = order[g][0];
		const double *le = k0 == GM_TOKENS_IN ? le_tokens : le_seconds;
		size_t nle = k0 == GM_TOKENS_IN ? sizeof(le_tokens) / sizeof(le_tokens[0])
						: sizeof(le_seconds) / sizeof(le_seconds[0]);
		evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", gm_meta[k0].prom, gm_meta[k0].desc,
				    gm_meta[k0].prom);
		for (int j = 0; j < 2 && order[g][j] != GM__COUNT; j++) {
			enum gm_hist k = order[g][j];
			for (size_t i = 0; i < ns; i++) {
				const struct gm_series *s = i < x->nseries ? &x->series[i] : x->overflow;
				const struct hist *h = s->h[k];
				if (!h || !h->count)
					continue;
				for (size_t b = 0; b < nle; b++) {
					evbuffer_add_printf(out, "%s_bucket{", gm_meta[k].prom);
					prom_labels(out, s, k);
					double bound = le[b] / gm_meta[k].scale;
					evbuffer_add_printf(out, ",le=\"%g\"} %.0f\n", le[b],
							    hist_count_le(h, (uint64_t)bound));
				}
				evbuffer_add_printf(out, "%s_bucket{", gm_meta[k].prom);
				prom_labels(out, s, k);
				evbuffer_add_printf(out, ",le=\"+Inf\"} %llu\n%s_sum{", (unsigned long long)h->count,
						    gm_meta[k].prom);
				prom_labels(out, s, k);
				evbuffer_add_printf(out, "} %.17g\n%s_count{", (double)h->sum * gm_meta[k].scale,
						    gm_meta[k].prom);
				prom_labels(out, s, k);
				evbuffer_add_printf(out, "} %llu\n", (unsigned long long)h->count);
			}
		}
	}
	pthread_mutex_unlock(&x->series_mu);
	return 0;
}
