/*
 * admin_stats.h — from a store query to the admin API's answers: series
 * grouped by (route, upstream, model), and their JSON renderings for
 * /stats, /stats/prompt and /stats/curve.
 *
 * The store keeps warm and cold requests of a (route, upstream, model) as two
 * series; a group merges them as the `cold` filter asks. Groups borrow their
 * labels from the store result, which must outlive them. Nothing here does
 * I/O or takes a lock, so it runs on the admin thread and in unit tests alike.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "slice.h"
#include "store.h"

enum cold_filter { COLD_INCLUDE, COLD_EXCLUDE, COLD_ONLY, COLD__COUNT };

/* What a stats request selects. NULL or "" labels match every value. */
struct stats_query {
	enum store_window window;
	const char *route, *upstream, *model;
	enum cold_filter cold;
	/* upstream name -> its configured labels (a JSON object), repeated in
	 * every series of the answer; NULL: none known */
	struct json_t *labels;
	/* the goodput thresholds in force, named in each series' goodput;
	 * NULL: not named */
	const struct slo *slo;
	/* /stats/prompt keyed on the prompt as reported (by=prompt), not on
	 * the tokens the server had to prefill */
	bool prompt_raw;
	/* /stats by tenant (by=tenant): the tenant series (series_key.h) by
	 * (route, tenant), the busiest first in each route; `tenant` filters */
	bool by_tenant;
	const char *tenant;
	/* /stats/curve keyed on the engine's queue at dispatch (by=engine_queue),
	 * not on tokentap's requests in flight */
	bool engine_queue;
};

struct stats_group {
	const char *route, *upstream, *model;  /* borrowed from the store result; by tenant: model is the tenant */
	struct slice slice;		       /* merged as the cold filter asks */
	uint64_t warm_requests, cold_requests; /* whatever the filter */
	bool matched;			       /* some series passed the cold filter */
};

struct stats_groups {
	size_t n, cap;
	struct stats_group *g; /* sorted by route, upstream, model */
};

int cold_filter_parse(const char *s, enum cold_filter *out);
const char *cold_filter_name(enum cold_filter c);

/* Groups the series of `r` that match `q`. 0, or -1 when out of memory
 * (out is then empty). */
int stats_groups_build(const struct store_result *r, const struct stats_query *q, struct stats_groups *out)
	__attribute__((warn_unused_result));
void stats_groups_free(struct stats_groups *g);

enum stats_view { VIEW_SUMMARY, VIEW_PROMPT, VIEW_CURVE };

/* count, mean, p50 ... max and max of `h` in the unit's display form (keys
 * carry the unit: p50_ms ...); values null when empty or absent. */
struct json_t;
struct json_t *stats_hist_json(const struct hist *h, enum metric_unit unit);

/* Seconds a window's rates are taken over: end - max(start, since) + 1. */
uint64_t stats_elapsed(const struct store_result *r, uint64_t since_sec);

/*
 * The JSON answer for one view, malloc'd and NUL-terminated; NULL when out of
 * memory. `since_sec` is when collection began (see docs/admin-api.md): rates
 * are taken over end - max(window start, since_sec) + 1 seconds.
 */
char *admin_stats_render(const struct store_result *r, const struct stats_query *q, enum stats_view view,
			 uint64_t since_sec);

/*
 * /stats/history, built a point at a time from the per-second ring, queried
 * in chunks of `step` seconds: _trim drops a chunk's load-curve and
 * prompt-length histograms (a point is a summary); _point appends to
 * `points` (a JSON array) the /stats answer (window 1m) of the minute
 * ending at second `t`, from the `n` chunks that make it up, with "t";
 * 0, or -1 when out of memory. _render wraps `points` (taken) into the
 * answer, malloc'd, NULL when out of memory.
 */
void admin_stats_history_trim(struct store_result *chunk);
int admin_stats_history_point(struct json_t *points, const struct store_result *chunks, size_t n, uint64_t t,
			      const struct stats_query *q, uint64_t since_sec) __attribute__((warn_unused_result));
char *admin_stats_history_render(struct json_t *points, unsigned step_s);
