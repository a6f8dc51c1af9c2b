/*
 * scrape.h — the engines' own /metrics, scraped per upstream (metrics_url),
 * off the forwarding path.
 *
 * One thread with its own event loop sends one GET per upstream per
 * metrics_interval through libevent's HTTP client: a bounded body
 * (SCRAPE_BODY_MAX), a deadline of 9/10 of an interval, a fresh connection after
 * any failure. Each answer is read with promtext and boiled down to the
 * engine's running and waiting requests, KV-cache use and prefix-cache hit
 * ratio (scrape_read), then published where every worker's copy of the
 * upstream reads it without a lock (upstream_engine_publish). A failure is
 * published too (shown in /upstreams) and logged once per streak of
 * failures. A reload hands the scraper the new list of upstreams; shutdown
 * stops it and joins the thread. Why a thread of its own rather than the
 * admin API's: scraping runs when the admin API is off, and a slow or huge
 * answer never delays an admin query (or the reverse).
 */
#pragma once

#include <stddef.h>

#include "config.h"
#include "upstream.h"

#define SCRAPE_BODY_MAX ((size_t)4 << 20)

struct scrape;

/* Starts the thread, scraping the upstreams of `cfg` that have a
 * metrics_url. NULL with `err` when the thread or its loop cannot start. */
struct scrape *scrape_start(const struct config *cfg, char *err, size_t errlen);

/* A reload, in two steps as the admin API's labels take it: the list of
 * upstreams to scrape, copied from `cfg` before the workers take it (NULL:
 * out of memory, logged), then handed to the scraper once the reload took
 * effect. An upstream whose name, url and metrics_url stay keeps its
 * connection and its failure streak; others stop. scrape_use(NULL, l)
 * frees `l`; a NULL `l` changes nothing. */
struct scrape_list;
struct scrape_list *scrape_list_of(const struct config *cfg);
void scrape_use(struct scrape *s, struct scrape_list *l);

/* Stops scraping, cancels what is in flight and joins the thread. NULL ok. */
void scrape_stop(struct scrape *s);

/*
 * Reads one /metrics answer into `out` (its values; the caller stamps times
 * and errors): in the names of `want`, or with ENGINE_AUTO of the first of
 * vLLM, SGLang, llama.cpp whose queue gauges appear. Samples of several
 * models or engines (labels) are summed for the request counts; the
 * KV-cache use is the largest (the fullest engine limits admission); the
 * prefix hit ratio is hits over queries since the engine started (vLLM's
 * counters) or the engine's own gauge (SGLang). 0, or -1 with `err` when
 * none of the engine's gauges is there.
 */
int scrape_read(const char *body, size_t len, enum engine_kind want, struct engine_state *out, char *err,
		size_t errlen);

/* "vllm", "sglang", "llamacpp", "auto". */
const char *scrape_engine_name(enum engine_kind e);
