/*
 * sim_metrics.c — GET /metrics: the simulator's load as an engine's
 * Prometheus endpoint would show it, in vLLM's, SGLang's or llama.cpp's
 * names (--metrics-style; docs/simulator.md), so that tokentap's scraper
 * (src/upstream/scrape.c) can be tested against what the simulator really does.
 *
 * With --batching the figures are the scheduler's own: running = sequences
 * in the batch, waiting = received requests not yet admitted, KV use = the
 * batch's KV tokens over --kv-tokens. Without it every request is served at
 * once: running = requests being answered, nothing waits, no KV model (0).
 * The prefix-cache counters come from --prefix-cache (0 without it). The
 * names and shapes were checked against each engine's documentation and
 * source: vLLM's gauges carry model_name (and engine in V1), SGLang's
 * model_name, llama.cpp's no label at all.
 */
#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sim.h"

struct load {
	uint64_t running, waiting, kv_used;
	double kv_frac;
	uint64_t prompt_tokens, cached_tokens;
};

static void load_now(struct load *l)
{
	memset(l, 0, sizeof(*l));
	if (sim_cfg.batching) {
		sim_batch_gauges(&l->running, &l->waiting, &l->kv_used);
		l->kv_frac = sim_cfg.kv_tokens ? (double)l->kv_used / (double)sim_cfg.kv_tokens : 0;
	} else {
		/* counted requests still being received or answered (this
		 * GET /metrics is not counted: sim_conn.c) */
		l->running = sim_stats.requests - sim_stats.completed - sim_stats.aborted;
	}
	if (sim_cfg.prefix_cache) {
		const struct sim_cache_stats *cs = sim_cache_stats();
		l->prompt_tokens = cs->prompt_tokens;
		l->cached_tokens = cs->cached_tokens;
	}
}

static void gauge(struct evbuffer *b, const char *name, const char *help, const char *labels, double v)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s%s %.17g\n", name, help, name, name, labels, v);
}

static void counter(struct evbuffer *b, const char *name, const char *help, const char *labels, double v)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s_total%s %.17g\n", name, help, name, name, labels,
			    v);
}

static void write_vllm(struct evbuffer *b, const struct load *l, const char *labels)
{
	gauge(b, "vllm:num_requests_running", "Number of requests in model execution batches.", labels,
	      (double)l->running);
	gauge(b, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels,
	      (double)l->waiting);
	gauge(b, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, l->kv_frac);
	counter(b, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", labels,
		(double)l->prompt_tokens);
	counter(b, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels,
		(double)l->cached_tokens);
}

static void write_sglang(struct evbuffer *b, const struct load *l, const char *labels)
{
	gauge(b, "sglang:num_running_reqs", "The number of running requests.", labels, (double)l->running);
	gauge(b, "sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels, (double)l->waiting);
	gauge(b, "sglang:token_usage", "The token usage.", labels, l->kv_frac);
	gauge(b, "sglang:cache_hit_rate", "The prefix cache hit rate.", labels,
	      l->prompt_tokens ? (double)l->cached_tokens / (double)l->prompt_tokens : 0);
}

static void write_llamacpp(struct evbuffer *b, const struct load *l)
{
	gauge(b, "llamacpp:requests_processing", "Number of requests processing.", "", (double)l->running);
	gauge(b, "llamacpp:requests_deferred", "Number of requests deferred.", "", (double)l->waiting);
	gauge(b, "llamacpp:kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.", "", l->kv_frac);
	gauge(b, "llamacpp:kv_cache_tokens", "KV-cache tokens.", "", (double)l->kv_used);
}

void sim_metrics_write(struct evbuffer *b)
{
	struct load l;
	char labels[512];

	load_now(&l);
	/* the model name as a label value: quotes and backslashes escaped */
	snprintf(labels, sizeof(labels), "{model_name=\"");
	for (const char *p = sim_cfg.model; *p && strlen(labels) < sizeof(labels) - 8; p++) {
		size_t n = strlen(labels);
		if (*p == '"' || *p == '\\' || *p == '\n')
			labels[n++] = '\\';
		labels[n++] = *p == '\n' ? 'n' : *p;
		labels[n] = '\0';
	}
	strcat(labels, "\"}");
	if (sim_cfg.metrics_style == SIM_METRICS_VLLM || sim_cfg.metrics_style == SIM_METRICS_ALL)
		write_vllm(b, &l, labels);
	if (sim_cfg.metrics_style == SIM_METRICS_SGLANG || sim_cfg.metrics_style == SIM_METRICS_ALL)
		write_sglang(b, &l, labels);
	if (sim_cfg.metrics_style == SIM_METRICS_LLAMACPP || sim_cfg.metrics_style == SIM_METRICS_ALL)
		write_llamacpp(b, &l);
}
