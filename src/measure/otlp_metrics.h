/*
 * otlp_metrics.h — the OpenTelemetry GenAI client metrics, aggregated from
 * every finished primary request and exported over OTLP/HTTP as
 * exponential histograms, and shown in /metrics under their Prometheus
 * names on request (docs/observability.md, "GenAI metrics").
 *
 * Opt-in: the aggregator runs when metrics.otlp.endpoint (or the
 * environment's OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, or
 * OTEL_METRICS_EXPORTER=otlp with OTEL_EXPORTER_OTLP_ENDPOINT) is set, or
 * metrics.genai_prometheus is on. Prometheus' own families are unchanged.
 *
 * Off the forwarding path: otlp_metrics_record copies what the metrics need
 * of the record (a few numbers, the attributes, the first OTLPM_GAPS gaps)
 * into a bounded ring under one short lock and returns; a full ring drops
 * the request's points, counted. The exporter's own thread (tokentap-otlpm)
 * drains the ring every OTLPM_DRAIN_MS into cumulative tokentap histograms
 * (hist.h), one set per attribute set, at most max_series sets (the rest
 * under one set marked otel.metric.overflow=true, as the SDKs do), and every
 * interval POSTs them all (cumulative temporality: a failed export loses
 * that export only, the next carries the totals). The ring is drained
 * during a POST too, so a slow collector fills nothing.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "otlp.h"

struct config;
struct evbuffer;
struct req_record;

#define OTLPM_INTERVAL_MS_DEFAULT 60000 /* OTEL_METRIC_EXPORT_INTERVAL's default */
#define OTLPM_QUEUE 4096		/* requests waiting to be aggregated */
#define OTLPM_GAPS 128			/* gaps of a request taken one by one; the rest at their mean */
#define OTLPM_DRAIN_MS 100		/* the ring is aggregated this often */
#define OTLPM_SCALE 7			/* the exponential histograms' scale (docs/observability.md) */
#define OTLPM_ATTEMPTS 2		/* POSTs of one export at most */
#define OTLPM_SLOW_MS 1000		/* an export slower than this: none more at stop */

struct otlp_metrics_options {
	struct otlp_options http; /* url: the metrics URL, as POSTed to; "" when only /metrics shows them */
	uint64_t interval_ms;
	unsigned max_series;
	bool prometheus; /* metrics.genai_prometheus */
};

/* The options from the configuration, the environment where it says
 * nothing (the file wins), and the defaults. Returns 1 when the aggregator
 * is to run (an endpoint, or metrics.genai_prometheus), 0 when not, -1 with
 * `err` when a value is unusable. */
int otlp_metrics_options_resolve(const struct config *cfg, struct otlp_metrics_options *o, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/* Starts the aggregator and, with a url, its exporting thread. */
int otlp_metrics_open(const struct otlp_metrics_options *o, char *err, size_t errlen)
	__attribute__((warn_unused_result));

/* Aggregates what is queued, sends one last export (one attempt), stops. */
void otlp_metrics_close(void);

bool otlp_metrics_active(void);

/* A finished request (a shadow's is ignored). Any worker thread. */
void otlp_metrics_record(const struct req_record *rec);

enum otlpm_drop {
	OTLPM_DROP_QUEUE_FULL, /* a request's points: the ring had no room */
	OTLPM_DROP_EXPORT,     /* an export's data points: every attempt failed */
	OTLPM_DROP__COUNT
};
extern const char *const otlpm_drop_reasons[OTLPM_DROP__COUNT]; /* "queue_full", "export_failed" */

/* For /metrics: tokentap_otlp_metric_points_exported_total,
 * tokentap_otlp_metric_drops_total{reason}, tokentap_otlp_metric_export_failures_total,
 * tokentap_otlp_metric_overflow_total. */
struct otlp_metrics_counts {
	uint64_t points;		     /* data points a collector accepted */
	uint64_t dropped[OTLPM_DROP__COUNT]; /* queue_full: requests; export_failed: data points */
	uint64_t failures;		     /* POSTs that failed */
	uint64_t exports;		     /* POSTs answered 2xx */
	uint64_t overflow;		     /* requests counted under the overflow set */
};
bool otlp_metrics_counts(struct otlp_metrics_counts *c);

/* With metrics.genai_prometheus: the GenAI families in the Prometheus text
 * format (gen_ai_client_operation_duration_seconds, ...), as of the last
 * drain. 0, or -1 out of memory. Nothing without the setting. */
int otlp_metrics_prom(struct evbuffer *out);
