/*
 * prom_proto.h — the protobuf exposition of /metrics, with native
 * (exponential) histograms, for a scraper that asks for it.
 *
 * The same families as the text format (prom.h), as length-delimited
 * io.prometheus.client.MetricFamily messages (proto/metrics.proto, encoded
 * by libprotobuf-c). Each time histogram carries both its classic `le`
 * buckets, the text format's, and native buckets of schema
 * PROM_NATIVE_SCHEMA, converted from tokentap's own histogram (hist.h):
 * every internal bucket's count is split over the native buckets its values
 * fall in, in proportion to how many integer microseconds of it each one
 * holds (docs/fleet.md measures what that costs in quantile error). The
 * split depends only on the count of that bucket, and never lowers a native
 * bucket when the count grows, so the exported buckets only ever grow with
 * the lifetime histogram and Prometheus sees no false counter reset.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hist.h"
#include "store.h"
#include "upstream.h"

struct evbuffer;

/* Native buckets per power of two: 2^7, each 2^(1/128) (0.54 %) wide. */
#define PROM_NATIVE_SCHEMA 7
/* Values at or below it (in seconds) are in the zero bucket: tokentap's
 * resolution is 1 µs, so that is exactly the value 0. A power of two, so it
 * is a bucket boundary at every schema. */
#define PROM_NATIVE_ZERO_THRESHOLD (1.0 / (1 << 20))

#define PROM_PROTO_CONTENT_TYPE \
	"application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"

/* The native bucket (schema PROM_NATIVE_SCHEMA) of a value v > 0 in seconds:
 * the i with 2^((i-1)/128) < v <= 2^(i/128). */
int prom_native_index(double v);

/*
 * Native buckets of `h` (µs), in seconds: counts[k] is the count of native
 * bucket first + k, for k < n; *zero the count of the zero bucket. Counts add
 * up to h->count. `counts` must hold PROM_NATIVE_SPAN entries; n is 0 for an
 * empty histogram.
 */
#define PROM_NATIVE_SPAN 4224 /* indices from 1 µs to 2^32 µs, with room */
void prom_native_buckets(const struct hist *h, int *first, size_t *n, uint64_t *counts, uint64_t *zero);

/*
 * Appends the protobuf exposition of `r` (store_query_lifetime) and of the
 * gauges `g` (upstream_gauges) to `out`: the families of prom_render and
 * prom_render_gauges, in that order. 0, or -1 when out of memory.
 */
int prom_render_proto(struct evbuffer *out, const struct store_result *r, const struct upstream_gauge *g, size_t n)
	__attribute__((warn_unused_result));

/* prom_render_tenants in the protobuf exposition: the same families, with
 * native histograms beside the classic buckets as prom_render_proto's. */
int prom_render_proto_tenants(struct evbuffer *out, const struct store_result *r) __attribute__((warn_unused_result));

/* prom_render_counters in the protobuf exposition. */
struct prom_counter_family;
int prom_render_proto_counters(struct evbuffer *out, const struct prom_counter_family *f, size_t nf)
	__attribute__((warn_unused_result));
