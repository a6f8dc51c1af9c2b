/*
 * otlp.c — the span exporter: a ring the workers push into, and a thread
 * that batches, encodes and POSTs (otlp.h says the rules).
 *
 *   meter_finish ─▶ otlp_record ─copy─▶ ring (bounded, allocated once)
 *                                         └─▶ exporter thread: batch ─▶ ExportTraceServiceRequest ─▶ POST, retries
 *
 * The ring is the only shared state, under `mu`; the counters are atomics.
 * The thread's HTTP client is libevent's evhttp on an event base of its own,
 * run only while one POST is in flight (the scraper's approach, scrape.c,
 * made synchronous: the thread has nothing else to do meanwhile). A
 * connection is kept between POSTs and dropped after any failure.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "otlp.h"

#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <math.h>
#include <otlp_trace.pb-c.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "config.h"
#include "log.h"
#include "otlp_json.h"
#include "timeline.h"
#include "tls.h"
#include "version.h"

const char *const otlp_drop_reasons[OTLP_DROP__COUNT] = { "queue_full", "export_failed", "shutdown" };

/* One finished request, as queued: copied, so the request may go. Times
 * are Unix nanoseconds (0: not reached). */
struct span_item {
	uint8_t trace_id[16], span_id[8], parent[8];
	bool has_parent;
	uint8_t flags;
	uint64_t at[TL__COUNT];
	uint64_t end;
	double m[RM__COUNT];
	char id[REQUEST_ID_MAX + 1];
	char method[16];
	char path[256];
	char model[128];
	char tenant[TENANT_MAX + 1];
	char resp_model[128];
	char upstream[128], route[128];
	char up_url[256];
	enum api_kind api;
	int stream, status;
	enum req_error error;
	struct usage usage;
};

struct kv_pair {
	char *key, *value;
};

struct otlp {
	struct otlp_options o;
	/* the url, parsed */
	bool tls;
	char host[256];
	unsigned port;
	char path[768];
	char host_hdr[300];
	struct kv_pair headers[OTLP_HEADERS_MAX];
	size_t nheaders;
	struct kv_pair *res; /* resource attributes, service.* included */
	size_t nres;
	char instance_id[37];

	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* CLOCK_MONOTONIC */
	struct span_item *ring;
	size_t head, n;	  /* under mu */
	bool stopping;	  /* under mu */
	bool stop_failed; /* the thread's: a send failed while stopping, the rest is dropped unsent */

	struct event_base *base;
	struct event *deadline;
	struct evhttp_connection *conn;
	SSL_CTX *tls_ctx;

	_Atomic uint64_t exported, failures, exports;
	_Atomic uint64_t dropped[OTLP_DROP__COUNT];
	uint64_t last_warn_ns; /* the thread's: failures are said at most every 30 s */
};

static struct otlp *g_otlp;

/* ---- options ---- */

static const char *env_first(const char *a, const char *b)
{
	const char *v = a ? getenv(a) : NULL;
	if (v && *v)
		return v;
	v = b ? getenv(b) : NULL;
	return v && *v ? v : NULL;
}

static int env_uint(const char *a, const char *b, uint64_t max, uint64_t *out, char *err, size_t errlen)
{
	const char *v = env_first(a, b);
	char *end;

	if (!v)
		return 0;
	errno = 0;
	unsigned long long u = strtoull(v, &end, 10);
	if (errno || end == v || *end || u > max) {
		snprintf(err, errlen, "%s: expected a whole number up to %llu, got \"%s\"", getenv(a) ? a : b,
			 (unsigned long long)max, v);
		return -1;
	}
	*out = u;
	return 0;
}

int otlp_options_resolve(const struct config *cfg, struct otlp_options *o, char *err, size_t errlen)
{
	const char *v;
	uint64_t u;

	memset(o, 0, sizeof(*o));
	if (otlp_protocol_check(cfg->otlp_protocol, err, errlen) == -1)
		return -1; /* refused even while nothing is exported */
	v = getenv("OTEL_SDK_DISABLED");
	if (!cfg->otlp_endpoint && v && strcasecmp(v, "true") == 0)
		return 0;
	if (cfg->otlp_endpoint || !(v = env_first("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", NULL))) {
		/* a base: the signal's path goes after it */
		const char *base =
			cfg->otlp_endpoint ? cfg->otlp_endpoint : env_first("OTEL_EXPORTER_OTLP_ENDPOINT", NULL);
		if (!base)
			return 0;
		size_t n = strlen(base);
		while (n && base[n - 1] == '/')
			n--;
		if (n + sizeof("/v1/traces") > sizeof(o->url)) {
			snprintf(err, errlen, "the OTLP endpoint is longer than %zu bytes", sizeof(o->url) - 12);
			return -1;
		}
		snprintf(o->url, sizeof(o->url), "%.*s/v1/traces", (int)n, base);
	} else {
		if (strlen(v) >= sizeof(o->url)) {
			snprintf(err, errlen, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is longer than %zu bytes",
				 sizeof(o->url) - 1);
			return -1;
		}
		snprintf(o->url, sizeof(o->url), "%s", v);
	}
	if (otlp_protocol_resolve(cfg->otlp_protocol, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "spans", &o->json, err,
				  errlen) == -1)
		return -1;
	o->headers = cfg->otlp_headers ? cfg->otlp_headers
				       : env_first("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS");
	o->service = cfg->otlp_service ? cfg->otlp_service : env_first("OTEL_SERVICE_NAME", NULL);
	o->resource = cfg->otlp_resource ? cfg->otlp_resource : env_first("OTEL_RESOURCE_ATTRIBUTES", NULL);
	o->ca_file = cfg->otlp_ca_file
			     ? cfg->otlp_ca_file
			     : env_first("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE");

	o->timeout_ms = cfg->otlp_timeout_ms;
	if (!o->timeout_ms) {
		u = OTLP_TIMEOUT_MS_DEFAULT;
		if (env_uint("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT", 3600000, &u, err,
			     errlen) == -1)
			return -1;
		o->timeout_ms = u ? u : OTLP_TIMEOUT_MS_DEFAULT;
	}
	o->delay_ms = cfg->otlp_delay_ms;
	if (!o->delay_ms) {
		u = OTLP_DELAY_MS_DEFAULT;
		if (env_uint("OTEL_BSP_SCHEDULE_DELAY", NULL, 3600000, &u, err, errlen) == -1)
			return -1;
		o->delay_ms = u ? u : 1;
	}
	o->queue_max = cfg->otlp_queue_max;
	if (!o->queue_max) {
		u = OTLP_QUEUE_DEFAULT;
		if (env_uint("OTEL_BSP_MAX_QUEUE_SIZE", NULL, 1048576, &u, err, errlen) == -1)
			return -1;
		o->queue_max = u ? (unsigned)u : OTLP_QUEUE_DEFAULT;
	}
	o->batch_max = cfg->otlp_batch_max;
	if (!o->batch_max) {
		u = OTLP_BATCH_DEFAULT;
		if (env_uint("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", NULL, 65536, &u, err, errlen) == -1)
			return -1;
		o->batch_max = u ? (unsigned)u : OTLP_BATCH_DEFAULT;
	}
	if (o->batch_max > o->queue_max)
		o->batch_max = o->queue_max; /* as the SDKs do: a batch is never bigger than the queue */
	o->attempts = OTLP_ATTEMPTS;
	o->backoff_ms = OTLP_BACKOFF_MS;
	return 1;
}

static bool protocol_known(const char *v)
{
	return strcmp(v, "http/protobuf") == 0 || strcmp(v, "http/json") == 0 || strcmp(v, "grpc") == 0;
}

int otlp_protocol_check(const char *setting, char *err, size_t errlen)
{
	if (!setting || !*setting || protocol_known(setting))
		return 0;
	snprintf(err, errlen, "OTLP protocol \"%s\": expected http/protobuf, http/json or grpc", setting);
	return -1;
}

int otlp_protocol_resolve(const char *setting, const char *env_signal, const char *what, bool *json, char *err,
			  size_t errlen)
{
	bool file = setting && *setting;
	const char *v = file ? setting : env_first(env_signal, "OTEL_EXPORTER_OTLP_PROTOCOL");

	*json = false;
	if (otlp_protocol_check(setting, err, errlen) == -1)
		return -1;
	if (!v || strcmp(v, "http/protobuf") == 0)
		return 0;
	if (strcmp(v, "http/json") == 0) {
		*json = true;
		return 0;
	}
	if (strcmp(v, "grpc") == 0)
		log_warn("OTLP protocol grpc is not supported: %s are sent as http/protobuf", what);
	else
		log_warn("OTLP protocol %s is not known: %s are sent as http/protobuf", v, what);
	return 0;
}

/* http(s)://host[:port][/path]; [v6] hosts. */
static int parse_url(struct otlp *x, const char *url, char *err, size_t errlen)
{
	const char *p;

	if (strncmp(url, "http://", 7) == 0) {
		p = url + 7;
	} else if (strncmp(url, "https://", 8) == 0) {
		p = url + 8;
		x->tls = true;
	} else {
		snprintf(err, errlen, "OTLP endpoint %s: expected http:// or https://", url);
		return -1;
	}
	const char *slash = strchr(p, '/'), *end = slash ? slash : p + strlen(p), *hend, *colon = NULL;
	if (*p == '[') {
		hend = memchr(p, ']', (size_t)(end - p));
		if (!hend)
			goto bad;
		p++;
		colon = hend + 1 < end && hend[1] == ':' ? hend + 1 : NULL;
		if (hend + 1 < end && !colon)
			goto bad;
	} else {
		colon = memchr(p, ':', (size_t)(end - p));
		hend = colon ? colon : end;
	}
	if (hend == p || (size_t)(hend - p) >= sizeof(x->host))
		goto bad;
	memcpy(x->host, p, (size_t)(hend - p));
	x->host[hend - p] = '\0';
	x->port = x->tls ? 443 : 80;
	if (colon) {
		char *e;
		unsigned long port = strtoul(colon + 1, &e, 10);
		if (e != end || colon + 1 == end || port == 0 || port > 65535)
			goto bad;
		x->port = (unsigned)port;
	}
	snprintf(x->path, sizeof(x->path), "%s", slash ? slash : "/");
	snprintf(x->host_hdr, sizeof(x->host_hdr), strchr(x->host, ':') ? "[%s]:%u" : "%s:%u", x->host, x->port);
	return 0;
bad:
	snprintf(err, errlen, "OTLP endpoint %s: expected http(s)://HOST[:PORT][/PATH]", url);
	return -1;
}

static int hexval(int c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

/* A copy of s[0..n) with the spaces around it trimmed and %XX decoded. */
static char *dup_decoded(const char *s, size_t n)
{
	while (n && isspace((unsigned char)*s))
		s++, n--;
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	char *out = malloc(n + 1), *w = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '%' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
			*w++ = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
			i += 2;
		} else {
			*w++ = s[i];
		}
	}
	*w = '\0';
	return out;
}

/* KEY=VALUE,KEY=VALUE (W3C Baggage's shape, as OTEL_EXPORTER_OTLP_HEADERS
 * and OTEL_RESOURCE_ATTRIBUTES have it): appends each member with a key to
 * out (at most max), skipping what has no '='. Returns the members taken,
 * or -1 out of memory. */
static int parse_pairs(const char *s, struct kv_pair *out, size_t max, size_t *n, const char *what)
{
	while (s && *s) {
		const char *comma = strchr(s, ','), *end = comma ? comma : s + strlen(s);
		const char *eq = memchr(s, '=', (size_t)(end - s));
		if (eq) {
			if (*n == max) {
				log_warn("%s: more than %zu members, the rest ignored", what, max);
				return 0;
			}
			char *k = dup_decoded(s, (size_t)(eq - s)), *v = dup_decoded(eq + 1, (size_t)(end - eq - 1));
			if (!k || !v) {
				free(k);
				free(v);
				return -1;
			}
			if (!*k) {
				free(k);
				free(v);
			} else {
				out[(*n)++] = (struct kv_pair){ k, v };
			}
		} else if (end > s) {
			log_warn("%s: member \"%.*s\" has no '=', ignored", what, (int)(end - s), s);
		}
		s = comma ? comma + 1 : end;
	}
	return 0;
}

static void pairs_free(struct kv_pair *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(p[i].key);
		free(p[i].value);
	}
}

/* ---- the worker's side ---- */

void otlp_record(const struct req_record *rec, const char *route)
{
	struct otlp *x = g_otlp;
	struct timespec rt;

	if (!x || !rec->traced || !(rec->trace.flags & TRACE_FLAG_SAMPLED) || rec->mirror)
		return;
	pthread_mutex_lock(&x->mu);
	if (x->n == x->o.queue_max || x->stopping) {
		pthread_mutex_unlock(&x->mu);
		atomic_fetch_add(&x->dropped[OTLP_DROP_QUEUE_FULL], 1);
		return;
	}
	struct span_item *it = &x->ring[(x->head + x->n) % x->o.queue_max];
	x->n++;
	/* filled under the lock: the slot is not the thread's until then */
	uint64_t mono = clock_now_ns();
	clock_gettime(CLOCK_REALTIME, &rt);
	uint64_t real = (uint64_t)rt.tv_sec * 1000000000u + (uint64_t)rt.tv_nsec;
	memcpy(it->trace_id, rec->trace.trace_id, 16);
	memcpy(it->span_id, rec->trace.span_id, 8);
	memcpy(it->parent, rec->parent_span_id, 8);
	it->has_parent = rec->has_parent;
	it->flags = rec->trace.flags;
	for (int e = 0; e < TL__COUNT; e++)
		it->at[e] = rec->at[e] && rec->at[e] <= mono ? real - (mono - rec->at[e]) : 0;
	uint64_t end = rec->at[TL_CLIENT_DONE] ? rec->at[TL_CLIENT_DONE] : mono;
	it->end = end <= mono ? real - (mono - end) : real;
	record_derive(rec, it->m);
	memcpy(it->id, rec->id, sizeof(it->id));
	memcpy(it->method, rec->method, sizeof(it->method));
	memcpy(it->path, rec->path, sizeof(it->path));
	memcpy(it->model, rec->model, sizeof(it->model));
	memcpy(it->tenant, rec->tenant, sizeof(it->tenant));
	memcpy(it->resp_model, rec->resp_model, sizeof(it->resp_model));
	snprintf(it->upstream, sizeof(it->upstream), "%s", rec->upstream ? rec->upstream : "");
	snprintf(it->route, sizeof(it->route), "%s", route ? route : "");
	snprintf(it->up_url, sizeof(it->up_url), "%s", rec->up_url ? rec->up_url : "");
	it->api = rec->api;
	it->stream = rec->stream;
	it->status = rec->status;
	it->error = rec->error;
	it->usage = rec->usage;
	if (x->n >= x->o.batch_max)
		pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->mu);
}

/* ---- encoding ---- */

/* GenAI's gen_ai.operation.name for an API (docs/observability.md). */
const char *otlp_operation_name(enum api_kind api)
{
	switch (api) {
	case API_OPENAI_CHAT:
	case API_ANTHROPIC:
	case API_OLLAMA_CHAT:
	case API_OPENAI_RESPONSES: return "chat";
	case API_OPENAI_COMPLETIONS:
	case API_TGI:
	case API_LLAMACPP:
	case API_OLLAMA_GENERATE: return "text_completion";
	case API_EMBEDDINGS:
	case API_TEI_EMBED: return "embeddings";
	default: return classify_api_name(api);
	}
}

/* gen_ai.provider.name: the API's maker where the conventions name one,
 * else the API's own name (classify_api_name). */
const char *otlp_provider_name(enum api_kind api)
{
	switch (api) {
	case API_OPENAI_CHAT:
	case API_OPENAI_COMPLETIONS:
	case API_OPENAI_RESPONSES:
	case API_EMBEDDINGS: return "openai";
	case API_ANTHROPIC: return "anthropic";
	case API_OLLAMA_CHAT:
	case API_OLLAMA_GENERATE: return "ollama";
	case API_TGI:
	case API_TEI_EMBED: return "huggingface";
	case API_LLAMACPP: return "llama.cpp";
	default: return classify_api_name(api);
	}
}

#define SPAN_ATTRS_MAX (32 + RM__COUNT)
#define SPAN_TEXT 2048

/* One span's messages, built in place: nothing is allocated per attribute. */
struct span_build {
	Tokentap__Otlp__Span span;
	Tokentap__Otlp__Status status;
	Tokentap__Otlp__KeyValue kv[SPAN_ATTRS_MAX];
	Tokentap__Otlp__AnyValue av[SPAN_ATTRS_MAX];
	Tokentap__Otlp__KeyValue *kvp[SPAN_ATTRS_MAX];
	Tokentap__Otlp__Span__Event ev[TL__COUNT];
	Tokentap__Otlp__Span__Event *evp[TL__COUNT];
	char keys[RM__COUNT][48];
	char name[200], address[256], etype[32];
};

static Tokentap__Otlp__AnyValue *attr(struct span_build *b, const char *key)
{
	size_t i = b->span.n_attributes;
	if (i == SPAN_ATTRS_MAX)
		return NULL;
	b->kv[i] = (Tokentap__Otlp__KeyValue)TOKENTAP__OTLP__KEY_VALUE__INIT;
	b->av[i] = (Tokentap__Otlp__AnyValue)TOKENTAP__OTLP__ANY_VALUE__INIT;
	b->kv[i].key = (char *)key;
	b->kv[i].value = &b->av[i];
	b->kvp[i] = &b->kv[i];
	b->span.n_attributes++;
	return &b->av[i];
}

static void attr_str(struct span_build *b, const char *key, const char *v)
{
	Tokentap__Otlp__AnyValue *a = attr(b, key);
	if (!a)
		return;
	a->value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
	a->string_value = (char *)v;
}

static void attr_int(struct span_build *b, const char *key, int64_t v)
{
	Tokentap__Otlp__AnyValue *a = attr(b, key);
	if (!a)
		return;
	a->value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_INT_VALUE;
	a->int_value = v;
}

static void attr_double(struct span_build *b, const char *key, double v)
{
	Tokentap__Otlp__AnyValue *a = attr(b, key);
	if (!a)
		return;
	a->value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_DOUBLE_VALUE;
	a->double_value = v;
}

static void attr_bool(struct span_build *b, const char *key, bool v)
{
	Tokentap__Otlp__AnyValue *a = attr(b, key);
	if (!a)
		return;
	a->value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_BOOL_VALUE;
	a->bool_value = v;
}

/* server.address and server.port of an upstream url (http(s)://host[:port][/]). */
static void up_address(struct span_build *b, const char *url, int64_t *port)
{
	const char *p = strstr(url, "://");
	bool tls = strncmp(url, "https", 5) == 0;

	*port = -1;
	b->address[0] = '\0';
	if (!p)
		return;
	p += 3;
	size_t n = strcspn(p, "/");
	const char *hend = p + n, *colon = NULL;
	if (*p == '[') {
		const char *rb = memchr(p, ']', n);
		if (!rb)
			return;
		snprintf(b->address, sizeof(b->address), "%.*s", (int)(rb - p - 1), p + 1);
		colon = rb + 1 < hend && rb[1] == ':' ? rb + 1 : NULL;
	} else {
		colon = memchr(p, ':', n);
		snprintf(b->address, sizeof(b->address), "%.*s", (int)((colon ? colon : hend) - p), p);
	}
	*port = colon ? strtol(colon + 1, NULL, 10) : tls ? 443 : 80;
}

static void span_fill(struct span_build *b, struct span_item *it)
{
	Tokentap__Otlp__Span *s = &b->span;
	int64_t port;

	*s = (Tokentap__Otlp__Span)TOKENTAP__OTLP__SPAN__INIT;
	s->trace_id = (ProtobufCBinaryData){ 16, it->trace_id };
	s->span_id = (ProtobufCBinaryData){ 8, it->span_id };
	if (it->has_parent)
		s->parent_span_id = (ProtobufCBinaryData){ 8, it->parent };
	/* the W3C flags, and: whether the parent is remote is known (bit 8), and it is (bit 9) */
	s->flags = (uint32_t)it->flags | (it->has_parent ? 0x300u : 0x100u);
	const char *op = otlp_operation_name(it->api);
	if (it->model[0])
		snprintf(b->name, sizeof(b->name), "%s %s", op, it->model);
	else
		snprintf(b->name, sizeof(b->name), "%s", op);
	s->name = b->name;
	s->kind = TOKENTAP__OTLP__SPAN__SPAN_KIND__SPAN_KIND_SERVER;
	s->start_time_unix_nano = it->at[TL_ARRIVE];
	s->end_time_unix_nano = it->end > it->at[TL_ARRIVE] ? it->end : it->at[TL_ARRIVE];
	s->attributes = b->kvp;

	attr_str(b, "gen_ai.operation.name", op);
	attr_str(b, "gen_ai.provider.name", otlp_provider_name(it->api));
	if (it->model[0])
		attr_str(b, "gen_ai.request.model", it->model);
	if (it->resp_model[0])
		attr_str(b, "gen_ai.response.model", it->resp_model);
	if (it->usage.input_tokens >= 0)
		attr_int(b, "gen_ai.usage.input_tokens", it->usage.input_tokens);
	if (it->usage.output_tokens >= 0)
		attr_int(b, "gen_ai.usage.output_tokens", it->usage.output_tokens);
	if (it->usage.cached_tokens >= 0)
		attr_int(b, "gen_ai.usage.cache_read.input_tokens", it->usage.cached_tokens);
	if (it->usage.cache_write_tokens >= 0)
		attr_int(b, "gen_ai.usage.cache_creation.input_tokens", it->usage.cache_write_tokens);
	if (it->usage.reasoning_tokens >= 0)
		attr_int(b, "gen_ai.usage.reasoning.output_tokens", it->usage.reasoning_tokens);
	if (it->stream == 1 && !isnan(it->m[RM_TTFT]))
		attr_double(b, "gen_ai.response.time_to_first_chunk", it->m[RM_TTFT] / 1e3);
	up_address(b, it->up_url, &port);
	if (b->address[0]) {
		attr_str(b, "server.address", b->address);
		attr_int(b, "server.port", port);
	}
	attr_str(b, "http.request.method", it->method);
	attr_str(b, "url.path", it->path);
	if (it->status > 0)
		attr_int(b, "http.response.status_code", it->status);
	bool failed = it->error != REQ_ERR_NONE || it->status >= 500;
	if (it->error != REQ_ERR_NONE) {
		attr_str(b, "error.type", req_error_name(it->error));
	} else if (it->status >= 500) {
		snprintf(b->etype, sizeof(b->etype), "%d", it->status);
		attr_str(b, "error.type", b->etype);
	}
	attr_str(b, "tokentap.request_id", it->id);
	attr_str(b, "tokentap.api", classify_api_name(it->api));
	if (it->route[0])
		attr_str(b, "tokentap.route", it->route);
	if (it->upstream[0])
		attr_str(b, "tokentap.upstream", it->upstream);
	if (it->tenant[0])
		attr_str(b, "tokentap.tenant", it->tenant);
	if (it->stream >= 0)
		attr_bool(b, "tokentap.stream", it->stream == 1);
	for (int i = 0; i < RM__COUNT; i++) {
		if (isnan(it->m[i]))
			continue;
		snprintf(b->keys[i], sizeof(b->keys[i]), "tokentap.%s", req_metric_key((enum req_metric)i));
		attr_double(b, b->keys[i], it->m[i]);
	}

	for (int e = 0; e < TL__COUNT; e++) {
		if (!it->at[e] || it->at[e] < it->at[TL_ARRIVE])
			continue;
		Tokentap__Otlp__Span__Event *ev = &b->ev[s->n_events];
		*ev = (Tokentap__Otlp__Span__Event)TOKENTAP__OTLP__SPAN__EVENT__INIT;
		ev->time_unix_nano = it->at[e];
		ev->name = (char *)timeline_event_name((enum tl_event)e);
		b->evp[s->n_events++] = ev;
	}
	s->events = b->evp;
	b->status = (Tokentap__Otlp__Status)TOKENTAP__OTLP__STATUS__INIT;
	if (failed) {
		b->status.code = TOKENTAP__OTLP__STATUS__STATUS_CODE__STATUS_CODE_ERROR;
		b->status.message = b->etype[0] ? b->etype : (char *)req_error_name(it->error);
	}
	s->status = &b->status;
}

/* The batch as one ExportTraceServiceRequest; malloc'd bytes, or NULL. */
static uint8_t *encode(struct otlp *x, struct span_item *items, size_t n, size_t *len)
{
	struct span_build *b = calloc(n, sizeof(*b));
	Tokentap__Otlp__Span **spans = calloc(n, sizeof(*spans));
	Tokentap__Otlp__KeyValue *rkv = calloc(x->nres, sizeof(*rkv));
	Tokentap__Otlp__AnyValue *rav = calloc(x->nres, sizeof(*rav));
	Tokentap__Otlp__KeyValue **rkvp = calloc(x->nres, sizeof(*rkvp));
	uint8_t *out = NULL;

	if (!b || !spans || (x->nres && (!rkv || !rav || !rkvp)))
		goto done;
	for (size_t i = 0; i < n; i++) {
		span_fill(&b[i], &items[i]);
		spans[i] = &b[i].span;
	}
	for (size_t i = 0; i < x->nres; i++) {
		rkv[i] = (Tokentap__Otlp__KeyValue)TOKENTAP__OTLP__KEY_VALUE__INIT;
		rav[i] = (Tokentap__Otlp__AnyValue)TOKENTAP__OTLP__ANY_VALUE__INIT;
		rav[i].value_case = TOKENTAP__OTLP__ANY_VALUE__VALUE_STRING_VALUE;
		rav[i].string_value = x->res[i].value;
		rkv[i].key = x->res[i].key;
		rkv[i].value = &rav[i];
		rkvp[i] = &rkv[i];
	}
	Tokentap__Otlp__Resource res = TOKENTAP__OTLP__RESOURCE__INIT;
	res.n_attributes = x->nres;
	res.attributes = rkvp;
	Tokentap__Otlp__InstrumentationScope scope = TOKENTAP__OTLP__INSTRUMENTATION_SCOPE__INIT;
	scope.name = "tokentap";
	scope.version = TOKENTAP_VERSION;
	Tokentap__Otlp__ScopeSpans ss = TOKENTAP__OTLP__SCOPE_SPANS__INIT;
	ss.scope = &scope;
	ss.n_spans = n;
	ss.spans = spans;
	Tokentap__Otlp__ScopeSpans *ssp = &ss;
	Tokentap__Otlp__ResourceSpans rs = TOKENTAP__OTLP__RESOURCE_SPANS__INIT;
	rs.resource = &res;
	rs.n_scope_spans = 1;
	rs.scope_spans = &ssp;
	Tokentap__Otlp__ResourceSpans *rsp = &rs;
	Tokentap__Otlp__ExportTraceServiceRequest req = TOKENTAP__OTLP__EXPORT_TRACE_SERVICE_REQUEST__INIT;
	req.n_resource_spans = 1;
	req.resource_spans = &rsp;
	if (x->o.json) {
		out = (uint8_t *)otlp_json_encode(&req.base, len);
	} else {
		*len = tokentap__otlp__export_trace_service_request__get_packed_size(&req);
		if ((out = malloc(*len ? *len : 1)))
			tokentap__otlp__export_trace_service_request__pack(&req, out);
	}
done:
	free(b);
	free(spans);
	free(rkv);
	free(rav);
	free(rkvp);
	return out;
}

/* ---- the exporter's thread ---- */

struct post_state {
	struct otlp *x;
	bool done, timed_out;
	int code; /* the HTTP status; 0: none came */
	enum evhttp_request_error err;
	bool failed;
};

static void on_post_error(enum evhttp_request_error e, void *arg)
{
	struct post_state *st = arg;
	st->failed = true;
	st->err = e;
}

static void on_post_done(struct evhttp_request *req, void *arg)
{
	struct post_state *st = arg;
	st->done = true;
	st->code = req ? evhttp_request_get_response_code(req) : 0;
	event_base_loopbreak(st->x->base);
}

static void on_post_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct post_state *st = arg;
	st->timed_out = true;
	event_base_loopbreak(st->x->base);
}

static void drop_conn(struct otlp *x)
{
	if (x->conn)
		evhttp_connection_free(x->conn);
	x->conn = NULL;
}

/* One POST of `body`: the HTTP status, or 0 with `why` when none came
 * (`timed_out`: none within the timeout). */
static int post_once(struct otlp *x, const uint8_t *body, size_t len, char *why, size_t wlen, bool *timed_out)
{
	struct post_state st = { .x = x };
	struct evhttp_request *req;

	*timed_out = false;
	if (!x->conn) {
		struct bufferevent *bev = NULL;
		if (x->tls && !(bev = tls_bev_connect(x->base, x->tls_ctx, x->host, true))) {
			snprintf(why, wlen, "cannot create a TLS connection");
			return 0;
		}
		if (!(x->conn = evhttp_connection_base_bufferevent_new(x->base, NULL, bev, x->host,
								       (unsigned short)x->port))) {
			if (bev)
				bufferevent_free(bev);
			snprintf(why, wlen, "cannot create a connection");
			return 0;
		}
		struct timeval tv = { (time_t)(x->o.timeout_ms / 1000), (suseconds_t)(x->o.timeout_ms % 1000) * 1000 };
		evhttp_connection_set_timeout_tv(x->conn, &tv);
		evhttp_connection_set_max_body_size(x->conn, 1 << 20);
	}
	if (!(req = evhttp_request_new(on_post_done, &st))) {
		snprintf(why, wlen, "out of memory");
		return 0;
	}
	evhttp_request_set_error_cb(req, on_post_error);
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	evhttp_add_header(h, "Host", x->host_hdr);
	evhttp_add_header(h, "Content-Type", x->o.json ? "application/json" : "application/x-protobuf");
	evhttp_add_header(h, "User-Agent", "tokentap/" TOKENTAP_VERSION);
	for (size_t i = 0; i < x->nheaders; i++)
		evhttp_add_header(h, x->headers[i].key, x->headers[i].value);
	evbuffer_add(evhttp_request_get_output_buffer(req), body, len);
	if (evhttp_make_request(x->conn, req, EVHTTP_REQ_POST, x->path) == -1) {
		/* freed by libevent on failure */
		drop_conn(x);
		snprintf(why, wlen, "cannot send the request");
		return 0;
	}
	evtimer_assign(x->deadline, x->base, on_post_deadline, &st);
	struct timeval dl = { (time_t)(x->o.timeout_ms / 1000), (suseconds_t)(x->o.timeout_ms % 1000) * 1000 };
	evtimer_add(x->deadline, &dl);
	while (!st.done && !st.timed_out)
		if (event_base_dispatch(x->base) != 0)
			break;
	evtimer_del(x->deadline);
	if (!st.done) {
		*timed_out = true;
		evhttp_cancel_request(req); /* no callback follows */
		drop_conn(x);
		snprintf(why, wlen, "no answer within %llu ms", (unsigned long long)x->o.timeout_ms);
		return 0;
	}
	if (st.code == 0) {
		char tls_why[160];
		const char *tls_err = x->tls && x->conn ? tls_bev_error(evhttp_connection_get_bufferevent(x->conn),
									tls_why, sizeof(tls_why))
							: "";
		if (*tls_err)
			snprintf(why, wlen, "TLS: %s", tls_err);
		else
			snprintf(why, wlen, "%s",
				 !st.failed			       ? "cannot connect"
				 : st.err == EVREQ_HTTP_TIMEOUT	       ? "timeout"
				 : st.err == EVREQ_HTTP_EOF	       ? "connection closed"
				 : st.err == EVREQ_HTTP_INVALID_HEADER ? "invalid answer"
								       : "connection failed");
		drop_conn(x);
	}
	return st.code;
}

/* A POST; on a kept connection that the collector closed while idle (the
 * exporter's loop runs only during a POST, so that is noticed only now), once
 * more at once on a new one. */
static int post(struct otlp *x, const uint8_t *body, size_t len, char *why, size_t wlen)
{
	bool kept = x->conn != NULL, timed_out;
	int code = post_once(x, body, len, why, wlen, &timed_out);

	if (code == 0 && kept && !timed_out)
		code = post_once(x, body, len, why, wlen, &timed_out);
	return code;
}

static bool retryable(int code)
{
	return code == 0 || code == 429 || code == 502 || code == 503 || code == 504;
}

/* Waits ms unless the exporter is stopping; false when it is. mu held. */
static bool wait_unless_stopping(struct otlp *x, uint64_t ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t until = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + ms * 1000000u;
	ts.tv_sec = (time_t)(until / 1000000000u);
	ts.tv_nsec = (long)(until % 1000000000u);
	while (!x->stopping)
		if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) == ETIMEDOUT)
			break;
	return !x->stopping;
}

static void warn_failure(struct otlp *x, const char *why, size_t n, bool dropped)
{
	uint64_t now = clock_now_ns();
	if (x->last_warn_ns && now - x->last_warn_ns < 30000000000ull)
		return;
	x->last_warn_ns = now;
	log_warn("OTLP export to %s: %s%s (%zu spans; said at most every 30 s)", x->o.url, why,
		 dropped ? ", spans dropped" : ", retrying", n);
}

/* Sends one batch, retrying; mu not held. */
static void export_batch(struct otlp *x, struct span_item *items, size_t n)
{
	size_t len = 0;
	uint8_t *body = encode(x, items, n, &len);
	char why[256];
	uint64_t backoff = x->o.backoff_ms;

	if (!body) {
		atomic_fetch_add(&x->dropped[OTLP_DROP_EXPORT], n);
		return;
	}
	for (unsigned attempt = 1;; attempt++) {
		why[0] = '\0';
		int code = post(x, body, len, why, sizeof(why));
		if (code >= 200 && code < 300) {
			atomic_fetch_add(&x->exported, n);
			atomic_fetch_add(&x->exports, 1);
			break;
		}
		atomic_fetch_add(&x->failures, 1);
		if (code)
			snprintf(why, sizeof(why), "HTTP %d", code);
		pthread_mutex_lock(&x->mu);
		bool stopping = x->stopping;
		bool again = retryable(code) && attempt < x->o.attempts && !stopping;
		if (again)
			again = wait_unless_stopping(x, backoff);
		stopping = x->stopping;
		pthread_mutex_unlock(&x->mu);
		if (!again) {
			x->stop_failed = stopping;
			atomic_fetch_add(
				&x->dropped[stopping && retryable(code) ? OTLP_DROP_SHUTDOWN : OTLP_DROP_EXPORT], n);
			warn_failure(x, why, n, true);
			break;
		}
		warn_failure(x, why, n, false);
		backoff = backoff * 2 > OTLP_BACKOFF_MAX_MS ? OTLP_BACKOFF_MAX_MS : backoff * 2;
	}
	free(body);
}

static void *exporter_main(void *arg)
{
	struct otlp *x = arg;
	struct span_item *batch = calloc(x->o.batch_max, sizeof(*batch));
	struct timespec ts;

	pthread_setname_np(pthread_self(), "tokentap-otlp");
	pthread_mutex_lock(&x->mu);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t until = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + x->o.delay_ms * 1000000u;
		ts.tv_sec = (time_t)(until / 1000000000u);
		ts.tv_nsec = (long)(until % 1000000000u);
		while (!x->stopping && x->n < x->o.batch_max)
			if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) == ETIMEDOUT)
				break;
		size_t k = x->n < x->o.batch_max ? x->n : x->o.batch_max;
		if (!batch || x->stop_failed) { /* no memory for a batch, or stopping with the collector failing */
			atomic_fetch_add(&x->dropped[batch ? OTLP_DROP_SHUTDOWN : OTLP_DROP_EXPORT], k);
			x->head = (x->head + k) % x->o.queue_max;
			x->n -= k;
			k = 0;
		}
		for (size_t i = 0; i < k; i++)
			batch[i] = x->ring[(x->head + i) % x->o.queue_max];
		x->head = (x->head + k) % x->o.queue_max;
		x->n -= k;
		if (!k && x->stopping)
			break;
		pthread_mutex_unlock(&x->mu);
		if (k)
			export_batch(x, batch, k);
		pthread_mutex_lock(&x->mu);
	}
	pthread_mutex_unlock(&x->mu);
	free(batch);
	return NULL;
}

/* ---- life ---- */

static void otlp_free(struct otlp *x)
{
	drop_conn(x);
	if (x->deadline)
		event_free(x->deadline);
	if (x->base)
		event_base_free(x->base);
	tls_ctx_free(x->tls_ctx);
	pairs_free(x->headers, x->nheaders);
	pairs_free(x->res, x->nres);
	free(x->res);
	free(x->ring);
	free(x);
}

/* The resource: service.name (the option, else OTEL_RESOURCE_ATTRIBUTES',
 * else "tokentap"), service.version, service.instance.id (a random UUID per
 * start), then the other resource attributes. */
static int resource_attrs(struct otlp *x, char *err, size_t errlen)
{
	uint8_t r[16];
	struct kv_pair extra[64];
	size_t nextra = 0;

	/* one id per process: the spans' and the metrics' resource are the same instance */
	static pthread_mutex_t id_mu = PTHREAD_MUTEX_INITIALIZER;
	static char instance_id[37];

	pthread_mutex_lock(&id_mu);
	if (!instance_id[0]) {
		if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
			pthread_mutex_unlock(&id_mu);
			snprintf(err, errlen, "getrandom: %s", strerror(errno));
			return -1;
		}
		r[6] = (uint8_t)((r[6] & 0x0f) | 0x40); /* version 4 */
		r[8] = (uint8_t)((r[8] & 0x3f) | 0x80); /* the RFC 4122 variant */
		snprintf(instance_id, sizeof(instance_id),
			 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3],
			 r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]);
	}
	memcpy(x->instance_id, instance_id, sizeof(x->instance_id));
	pthread_mutex_unlock(&id_mu);
	if (parse_pairs(x->o.resource, extra, 64, &nextra, "OTLP resource attributes") == -1)
		goto oom;
	const char *service = x->o.service;
	for (size_t i = 0; i < nextra && !service; i++)
		if (strcmp(extra[i].key, "service.name") == 0)
			service = extra[i].value;
	x->res = calloc(nextra + 3, sizeof(*x->res));
	if (!x->res)
		goto oom;
	x->res[0] = (struct kv_pair){ strdup("service.name"), strdup(service ? service : "tokentap") };
	x->res[1] = (struct kv_pair){ strdup("service.version"), strdup(TOKENTAP_VERSION) };
	x->res[2] = (struct kv_pair){ strdup("service.instance.id"), strdup(x->instance_id) };
	x->nres = 3;
	for (size_t i = 0; i < 3; i++)
		if (!x->res[i].key || !x->res[i].value)
			goto oom;
	for (size_t i = 0; i < nextra; i++) {
		const char *k = extra[i].key;
		if (strcmp(k, "service.name") == 0 || strcmp(k, "service.version") == 0 ||
		    strcmp(k, "service.instance.id") == 0) {
			free(extra[i].key);
			free(extra[i].value);
			continue;
		}
		x->res[x->nres++] = extra[i];
	}
	return 0;
oom:
	pairs_free(extra, nextra);
	snprintf(err, errlen, "out of memory");
	return -1;
}

int otlp_open(const struct otlp_options *o, char *err, size_t errlen)
{
	struct otlp *x = calloc(1, sizeof(*x));
	pthread_condattr_t ca;

	if (!x) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	x->o = *o;
	if (parse_url(x, o->url, err, errlen) == -1)
		goto fail;
	if (parse_pairs(o->headers, x->headers, OTLP_HEADERS_MAX, &x->nheaders, "OTLP headers") == -1 ||
	    resource_attrs(x, err, errlen) == -1) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	x->ring = calloc(o->queue_max, sizeof(*x->ring));
	x->base = event_base_new();
	x->deadline = x->base ? evtimer_new(x->base, on_post_deadline, NULL) : NULL;
	if (!x->ring || !x->deadline) {
		snprintf(err, errlen, "out of memory for %u queued spans", o->queue_max);
		goto fail;
	}
	if (x->tls && !(x->tls_ctx = tls_client_ctx(true, o->ca_file, err, errlen)))
		goto fail;
	pthread_mutex_init(&x->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&x->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&x->thread, NULL, exporter_main, x) != 0) {
		snprintf(err, errlen, "cannot start the OTLP exporter's thread");
		pthread_mutex_destroy(&x->mu);
		pthread_cond_destroy(&x->cv);
		goto fail;
	}
	g_otlp = x;
	log_info("exporting sampled spans over OTLP/HTTP (%s) to %s (batches of %u, every %llu ms at most)",
		 o->json ? "json" : "protobuf", o->url, o->batch_max, (unsigned long long)o->delay_ms);
	return 0;
fail:
	otlp_free(x);
	return -1;
}

void otlp_close(void)
{
	struct otlp *x = g_otlp;

	if (!x)
		return;
	pthread_mutex_lock(&x->mu);
	x->stopping = true;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->mu);
	pthread_join(x->thread, NULL);
	g_otlp = NULL;
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	otlp_free(x);
}

bool otlp_active(void)
{
	return g_otlp != NULL;
}

bool otlp_counts(struct otlp_counts *c)
{
	struct otlp *x = g_otlp;

	memset(c, 0, sizeof(*c));
	if (!x)
		return false;
	c->exported = atomic_load(&x->exported);
	c->failures = atomic_load(&x->failures);
	c->exports = atomic_load(&x->exports);
	for (int i = 0; i < OTLP_DROP__COUNT; i++)
		c->dropped[i] = atomic_load(&x->dropped[i]);
	return true;
}

/* ---- the transport, for the metrics exporter (otlp.h) ---- */

struct otlp *otlp_transport_open(const struct otlp_options *o, char *err, size_t errlen)
{
	struct otlp *x = calloc(1, sizeof(*x));

	if (!x) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	x->o = *o;
	if (parse_url(x, o->url, err, errlen) == -1)
		goto fail;
	if (parse_pairs(o->headers, x->headers, OTLP_HEADERS_MAX, &x->nheaders, "OTLP headers") == -1 ||
	    resource_attrs(x, err, errlen) == -1) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	x->base = event_base_new();
	x->deadline = x->base ? evtimer_new(x->base, on_post_deadline, NULL) : NULL;
	if (!x->deadline) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (x->tls && !(x->tls_ctx = tls_client_ctx(true, o->ca_file, err, errlen)))
		goto fail;
	return x;
fail:
	otlp_free(x);
	return NULL;
}

int otlp_transport_post(struct otlp *x, const uint8_t *body, size_t len, char *why, size_t wlen)
{
	return post(x, body, len, why, wlen);
}

struct event_base *otlp_transport_base(struct otlp *x)
{
	return x->base;
}

bool otlp_transport_retryable(int code)
{
	return retryable(code);
}

size_t otlp_transport_resource(const struct otlp *x, size_t i, const char **key, const char **value)
{
	if (i < x->nres) {
		*key = x->res[i].key;
		*value = x->res[i].value;
	}
	return x->nres;
}

void otlp_transport_free(struct otlp *x)
{
	if (x)
		otlp_free(x);
}
