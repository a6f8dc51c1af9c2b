/*
 * otlp.h — tokentap's spans, exported over OTLP/HTTP (docs/observability.md).
 *
 * Off unless an endpoint is configured (`tracing.otlp.endpoint`, or the
 * environment's OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _ENDPOINT). Each
 * finished primary request whose trace is sampled becomes one SERVER span:
 * the trace and parent from the client's traceparent (or the trace tokentap
 * started), tokentap's own span id (the one the upstream got as its
 * parent), arrival to finish, the OpenTelemetry GenAI attributes and the
 * timeline as span events.
 *
 * Exporting is off the forwarding path: otlp_record copies the record into
 * a bounded ring (allocated once, at otlp_open) under one short lock and
 * returns; a full ring drops the span, counted. The exporter's own thread
 * batches the ring (a batch when max_export_batch_size spans wait, or
 * schedule_delay after the last one), encodes an ExportTraceServiceRequest
 * (protoc-c, proto/otlp_trace.proto; as protobuf, or as OTLP/JSON with
 * `protocol: http/json`, otlp_json.h) and POSTs it, retrying 429, 502, 503,
 * 504 and failed connections with a doubling backoff a bounded number of
 * times; then the batch is dropped, counted. A worker never waits on it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "classify.h" /* enum api_kind */

struct req_record;
struct config;

/* Defaults, as an OpenTelemetry SDK has them (docs/observability.md). */
#define OTLP_TIMEOUT_MS_DEFAULT 10000
#define OTLP_DELAY_MS_DEFAULT 5000
#define OTLP_QUEUE_DEFAULT 2048
#define OTLP_BATCH_DEFAULT 512
#define OTLP_ATTEMPTS 5		 /* POSTs of one batch at most, the first included */
#define OTLP_BACKOFF_MS 500	 /* before the first retry; doubling */
#define OTLP_BACKOFF_MAX_MS 8000 /* the longest wait between two */
#define OTLP_HEADERS_MAX 16	 /* headers of OTLP_HEADERS taken; more are ignored, with a warning */

struct otlp_options {
	char url[1024];	      /* the traces URL, as POSTed to */
	const char *headers;  /* KEY=VALUE,... (values percent-decoded), or NULL */
	const char *service;  /* service.name */
	const char *resource; /* KEY=VALUE,... more resource attributes, or NULL */
	const char *ca_file;  /* PEM CAs verifying an https endpoint; NULL: the system's store */
	uint64_t timeout_ms;  /* one POST */
	uint64_t delay_ms;    /* the schedule delay */
	unsigned queue_max;   /* spans waiting */
	unsigned batch_max;   /* spans per POST */
	unsigned attempts;    /* POSTs of one batch at most (OTLP_ATTEMPTS) */
	uint64_t backoff_ms;  /* the first retry's wait (OTLP_BACKOFF_MS) */
	bool json;	      /* http/json (otlp_json.h): application/json; else http/protobuf */
};

/* The protocol of one signal: `setting` (the file's, "" or NULL unset),
 * else the environment's `env_signal`, else OTEL_EXPORTER_OTLP_PROTOCOL,
 * else http/protobuf. http/json sets *json; grpc is not supported (warned
 * about, http/protobuf is sent); another value is an error in the file (-1
 * with `err`) and warned about in the environment. `what`: "spans" or
 * "metrics", for the messages. */
int otlp_protocol_resolve(const char *setting, const char *env_signal, const char *what, bool *json, char *err,
			  size_t errlen) __attribute__((warn_unused_result));
/* -1 with `err` when the file's `setting` is none of the three; else 0. */
int otlp_protocol_check(const char *setting, char *err, size_t errlen) __attribute__((warn_unused_result));

/* The options from the configuration, the environment where it says
 * nothing (the file wins), and the defaults. Returns 1 when spans are to be
 * exported, 0 when no endpoint is set (or OTEL_SDK_DISABLED=true), -1 with
 * `err` when a value is unusable. Strings point into cfg or the
 * environment. */
int otlp_options_resolve(const struct config *cfg, struct otlp_options *o, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/* Starts the exporter (the process has one) and its thread. -1 with `err`
 * when the url cannot be used or the thread cannot start. */
int otlp_open(const struct otlp_options *o, char *err, size_t errlen) __attribute__((warn_unused_result));

/* Sends what is queued (one attempt per batch, each within the timeout),
 * stops the thread; safe without an exporter. */
void otlp_close(void);

bool otlp_active(void);

/* A finished primary request: queued as a span when its trace is sampled
 * and an exporter runs; else nothing. Any worker thread. */
void otlp_record(const struct req_record *rec, const char *route);

/* gen_ai.operation.name and gen_ai.provider.name of an API (static text),
 * the spans' and the metrics' (docs/observability.md). */
const char *otlp_operation_name(enum api_kind api);
const char *otlp_provider_name(enum api_kind api);

/* Why a span was lost. */
enum otlp_drop {
	OTLP_DROP_QUEUE_FULL, /* the ring had no room */
	OTLP_DROP_EXPORT,     /* its batch failed every attempt, or was refused */
	OTLP_DROP_SHUTDOWN,   /* still queued or failing when tokentap stopped */
	OTLP_DROP__COUNT
};
extern const char *const otlp_drop_reasons[OTLP_DROP__COUNT]; /* "queue_full", "export_failed", "shutdown" */

/* The exporter's counters for /metrics (tokentap_otlp_spans_exported_total,
 * tokentap_otlp_spans_dropped_total, tokentap_otlp_export_failures_total,
 * tokentap_otlp_exports_total); false without an exporter. */
struct otlp_counts {
	uint64_t exported; /* spans a collector accepted (2xx) */
	uint64_t dropped[OTLP_DROP__COUNT];
	uint64_t failures; /* POSTs that failed: no answer, a timeout, or not 2xx */
	uint64_t exports;  /* POSTs answered 2xx */
};
bool otlp_counts(struct otlp_counts *c);

/* The exporter's HTTP side alone, for the metrics exporter (otlp_metrics.h):
 * the url, the headers, the resource (service.instance.id is the process's,
 * the same as the spans'), TLS, one connection kept between POSTs. Used by
 * one thread at a time. */
struct otlp;
struct otlp *otlp_transport_open(const struct otlp_options *o, char *err, size_t errlen);
/* One POST of `body` (again at once on a new connection when a kept one had
 * closed): the HTTP status, or 0 with `why` when none came in time. */
int otlp_transport_post(struct otlp *x, const uint8_t *body, size_t len, char *why, size_t wlen);
/* The event base a POST runs: an event added there runs during POSTs. */
struct event_base *otlp_transport_base(struct otlp *x);
/* Whether a POST answered `code` (0: none) is worth another try. */
bool otlp_transport_retryable(int code);
/* The resource's attribute i (when i < the count) and the count. */
size_t otlp_transport_resource(const struct otlp *x, size_t i, const char **key, const char **value);
void otlp_transport_free(struct otlp *x);
