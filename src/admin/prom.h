/*
 * prom.h — the Prometheus text exposition (format 0.0.4) of /metrics.
 *
 * Time histograms use one fixed, sorted set of `le` bounds on every instance
 * (the union of vLLM's TTFT and inter-token-latency buckets), so that
 * histogram_quantile(sum by (le) (...)) can add up a fleet of tokentaps.
 * Cumulative bucket counts come from hist_count_le() (interpolated inside
 * the internal 1 % bucket an edge cuts), rounded to integers and forced
 * monotonic, ending in +Inf == _count.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "hist.h"
#include "store.h"
#include "upstream.h"

struct evbuffer;

/*
 * Escapes a label value as the exposition format requires (backslash,
 * double quote and line feed become \\, \" and \n). Writes at most cap bytes
 * including the NUL (cap 0 writes nothing) and returns the length of the
 * whole escaped value, like snprintf: truncated when that is >= cap.
 */
size_t prom_label_escape(char *out, size_t cap, const char *in);

/* Appends the exposition of `r` (store_query_lifetime: counts since the
 * process started, which never go down) to `out`.
 * 0, or -1 when out of memory. */
int prom_render(struct evbuffer *out, const struct store_result *r) __attribute__((warn_unused_result));

/* With tenant.metrics_label: the tenant series (series_key.h) as families
 * of their own, tokentap_tenant_<name> with labels route and tenant (the
 * ttft and e2e histograms and every counter family), so that the model
 * families' sums stay whole. 0, or -1 when out of memory. */
int prom_render_tenants(struct evbuffer *out, const struct store_result *r) __attribute__((warn_unused_result));

/* tokentap_tokens_per_event's `le` edges (whole tokens, 1 to 64) and the
 * cumulative counts of `h` (NULL: empty) at each, exact: cum must hold
 * prom_tpe_le_count() entries. */
size_t prom_tpe_le_count(void);
unsigned prom_tpe_le(size_t i);
void prom_tpe_counts(const struct hist *h, uint64_t *cum);
#define PROM_TPE_STREAMS_HELP "Streams whose server counted its output on every event (tokens per event measured)."

/* Appends the gauges tokentap_in_flight and tokentap_queued, labelled by
 * upstream, from `g` (upstream_gauges: entries of one name are added up,
 * names sorted), then the engine families (prom_engine_families). 0, or -1
 * when out of memory. */
int prom_render_gauges(struct evbuffer *out, const struct upstream_gauge *g, size_t n)
	__attribute__((warn_unused_result));

/*
 * The engine's own view per scraped upstream (scrape.h), from `g`
 * (upstream_gauges): its running and waiting requests, KV-cache use and
 * prefix-cache hit ratio as last scraped, the scrape's age, and scrapes by
 * result. One upstream name is one engine: of entries of one name (a
 * reload draining an old url) the one scraped last. A value the engine
 * does not report, and an upstream never scraped yet, have no sample; a
 * family with no sample is left out of both expositions. `label` is NULL,
 * or the name of the label that `label_value` gives (scrapes: "result").
 */
#define PROM_ENGINE_FAMILIES 6
struct prom_sample {
	const char *upstream; /* borrowed from `g` */
	const char *label_value;
	double value;
};
struct prom_engine_family {
	const char *name, *help, *label;
	bool counter;
	size_t n;
	struct prom_sample *s; /* malloc'd */
};
int prom_engine_families(const struct upstream_gauge *g, size_t n, uint64_t now_ns,
			 struct prom_engine_family f[PROM_ENGINE_FAMILIES]) __attribute__((warn_unused_result));
void prom_engine_families_free(struct prom_engine_family f[PROM_ENGINE_FAMILIES]);

/* A counter family from outside the store (the workload capture's): one
 * metric per value of `label`, or one without labels when `label` is NULL
 * (n = 1). Label values are plain names: they are not escaped. */
struct prom_counter_family {
	const char *name, *help, *label;
	size_t n;
	const char *const *values; /* n, or NULL without a label */
	const uint64_t *counts;	   /* n */
	/* several labels instead of `label`: nlabels names, and `values`
	 * holds n * nlabels, each count's in a row */
	unsigned nlabels;
	const char *const *label_names;
};

/* Appends `nf` such families in the text format. 0, or -1 when out of memory. */
int prom_render_counters(struct evbuffer *out, const struct prom_counter_family *f, size_t nf)
	__attribute__((warn_unused_result));

/* Number of finite `le` bounds and bound i, in seconds as printed, and in
 * µs (UINT64_MAX past the last). */
size_t prom_le_count(void);
const char *prom_le_label(size_t i);
uint64_t prom_le_us(size_t i);

/* The cumulative count of `h` (NULL: empty) at each of the prom_le_count()
 * bounds into cum[], as both expositions export them. */
void prom_classic_counts(const struct hist *h, uint64_t *cum);

/* The # HELP of counter `c` (< CT_ERR_BASE) when SLICE_COUNTERS exports it
 * as a family of its own, tokentap_<name>_total; NULL when it does not. */
const char *prom_counter_help(unsigned c);
