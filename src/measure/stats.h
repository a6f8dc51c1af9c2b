/*
 * stats.h — per-worker recording of series slices.
 *
 * Each worker owns a shard: its own series table and, per series, the slice
 * being filled during the current flush interval. Recording touches only the
 * shard — no lock, no allocation once a series' histograms exist. A timer on
 * the worker's loop encodes every dirty slice, hands the batch to the store
 * (one lock hand-off per interval) and clears the slices in place.
 *
 * The number of models per route is capped for the whole process (every
 * upstream and worker): a name is admitted only with a successful answer,
 * and past the cap a request is recorded under the model "other", so
 * clients cannot grow memory by inventing model names nor crowd out real
 * ones. A name unused for model_idle yields its slot to a new one.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "series_key.h"
#include "slice.h"

struct config;
struct event_base;
struct store;
struct stats_shard;
struct series;

/* A shard recording by the start-up settings in `boot` (store.max_models,
 * store.model_idle, slo.*, store.flush_interval; read here, so a setting
 * the shard needs is read where it is used). */
struct stats_shard *stats_shard_new(struct event_base *base, struct store *store, const struct config *boot);

/* The goodput thresholds of `boot`'s slo.* settings, in µs. */
struct slo stats_slo(const struct config *boot);
/* Flushes what is pending, then frees. Accepts NULL. */
void stats_shard_free(struct stats_shard *sh);

/* The series for these labels, created on first use (NULL if out of
 * memory). `ok`: the upstream answered 2xx; only then may a model name the
 * route does not track yet be admitted — a failed request naming a tracked
 * model stays under it, one naming another model counts as "other". */
struct series *stats_series(struct stats_shard *sh, const char *route, const char *upstream, const char *model,
			    bool cold, bool ok);

/* The tenant series of (route, tenant) (series_key.h), under the route's
 * tenant cap (tenant.max_per_route, tenant.idle) as models are under
 * theirs: a new name only with `ok`, past the cap TENANT_OTHER. "" is
 * TENANT_ABSENT; TENANT_ABSENT, TENANT_INVALID and TENANT_OTHER take no
 * slot. Only stats_record_request goes into it. */
struct series *stats_tenant_series(struct stats_shard *sh, const char *route, const char *tenant, bool ok);

/* `load`: requests on or queued for the upstream when the request was
 * routed, itself included (slice.h). */
void stats_record_itl(struct series *se, uint64_t gap_ns, unsigned load);
/* `n` gaps of the same length, as one record. */
void stats_record_itl_n(struct series *se, uint64_t gap_ns, unsigned load, uint64_t n);

/* What `se` has recorded since the last flush (read-only; for tests). */
const struct slice *stats_series_slice(const struct series *se);
/* One token event that carried `n` tokens (timeline.h, record_event_tokens). */
void stats_record_event_tokens(struct series *se, uint64_t n);
void stats_record_request(struct series *se, const struct req_record *r, unsigned load);

/* Hands the pending deltas to the store now (the timer calls this). */
void stats_shard_flush(struct stats_shard *sh);
