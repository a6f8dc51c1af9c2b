/*
 * bench_report.c — what a run measured, for people (a table whose every
 * number says what load produced it) and for machines (JSON with the same
 * keys as tokentap's /stats: count, mean_ms, p50_ms ... p99_9_ms, max_ms).
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "version.h"

static const double quantiles[] = { 0.5, 0.9, 0.95, 0.99, 0.999 };
static const char *const quantile_keys[] = { "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms" };
#define NQ (sizeof(quantiles) / sizeof(quantiles[0]))

double report_quantile_ms(const struct hist *h, double q)
{
	if (h->count == 0)
		return NAN;
	return (double)hist_quantile(h, q) / 1000.0;
}

static double per_s(uint64_t n, double s)
{
	return s > 0 ? (double)n / s : 0.0;
}

static const char *mode_desc(const struct bench_result *r, char *buf, size_t len, const struct bench_opts *o)
{
	if (r->concurrency)
		snprintf(buf, len, "closed loop, concurrency %u", r->concurrency);
	else if (o->replay)
		snprintf(buf, len, "open loop, a trace's arrivals replayed (mean %g requests/s)", r->rate);
	else if (o->arrivals == ARRIVALS_GAMMA)
		snprintf(buf, len, "open loop, %g requests/s, gamma arrivals (burstiness %g)", r->rate, o->burstiness);
	else
		snprintf(buf, len, "open loop, %g requests/s, poisson arrivals", r->rate);
	return buf;
}

static void put_num(FILE *f, double v)
{
	if (isnan(v))
		fprintf(f, " %9s", "-");
	else
		fprintf(f, " %9.3f", v);
}

void report_table(FILE *f, const struct bench_opts *o, const struct bench_result *r)
{
	char mode[160];
	const struct bench_stats *m = &r->m;

	fprintf(f, "\n%s %s — %s, %s, model %s\n", BENCH_NAME, TOKENTAP_VERSION, o->api_name,
		o->stream ? "streaming" : "not streaming", o->model ? o->model : "(server default)");
	fprintf(f, "target:   %s://%s:%u%s\n", o->tls ? "https" : "http", o->host, o->port, o->path);
	if (o->tls)
		fprintf(f, "tls:      %s %s; %llu handshakes, %llu of them resumed; certificate %s\n",
			r->tls_protocol[0] ? r->tls_protocol : "(no handshake)", r->tls_cipher,
			(unsigned long long)r->tls_handshakes, (unsigned long long)r->tls_resumed,
			o->tls_insecure ? "not checked (--insecure)" : "checked");
	fprintf(f, "load:     %s\n", mode_desc(r, mode, sizeof(mode), o));
	if (o->replay)
		fprintf(f,
			"lengths:  input and output from the trace, prompts from its hash ids (%u tokens each; output "
			"sent as max_tokens%s)\n",
			o->replay->block_tokens, o->sim_headers ? " and x-sim-tokens" : "");
	else
		fprintf(f, "lengths:  input %s tokens, output %s tokens (sent as max_tokens%s)\n", o->input_len.desc,
			o->output_len.desc, o->sim_headers ? " and x-sim-tokens" : "");
	fprintf(f, "run:      %llu requests measured", (unsigned long long)m->started);
	if (o->warmup)
		fprintf(f, ", %llu warm-up requests excluded", (unsigned long long)r->w.started);
	fprintf(f, "; measured window %.3f s, wall %.3f s; %llu connections opened\n", r->elapsed_s, r->wall_s,
		(unsigned long long)r->connections);
	if (r->interrupted)
		fprintf(f, "          INTERRUPTED: the numbers cover what finished before the signal\n");
	if (r->fatal)
		fprintf(f, "          STOPPED EARLY: %s\n", r->fatal_msg);
	fprintf(f, "\nrequests:   %llu ok, %llu failed, %llu cancelled\n", (unsigned long long)m->ok,
		(unsigned long long)m->failed, (unsigned long long)m->cancelled);
	if (m->failed) {
		fprintf(f, "errors:    ");
		for (int i = 0; i < BERR__COUNT; i++)
			if (m->errors[i])
				fprintf(f, " %s %llu", bench_error_name((enum bench_error)i),
					(unsigned long long)m->errors[i]);
		fputc('\n', f);
	}
	fprintf(f, "throughput: %.3f requests/s, %.1f input tokens/s, %.1f output tokens/s\n",
		per_s(m->ok, r->elapsed_s), per_s(m->input_tokens, r->elapsed_s),
		per_s(m->output_tokens, r->elapsed_s));
	fprintf(f,
		"tokens:     %llu input (%llu of %llu requests from usage, the rest as sent), %llu output (%llu from "
		"usage, the rest counted as token events)\n",
		(unsigned long long)m->input_tokens, (unsigned long long)m->input_from_usage, (unsigned long long)m->ok,
		(unsigned long long)m->output_tokens, (unsigned long long)m->output_from_usage);
	if (!r->concurrency) {
		fprintf(f, "arrivals:   %llu waited for a slot under --max-inflight %u", (unsigned long long)r->delayed,
			o->max_inflight);
		if (r->delayed)
			fprintf(f, " (longest %.1f ms)", (double)r->max_lag_us / 1000.0);
		fprintf(f, "; arrival timer late by up to %.1f ms\n", (double)r->max_timer_late_us / 1000.0);
	}

	fprintf(f, "\n%-11s %9s %9s %9s %9s %9s %9s %9s %9s\n", "ms", "count", "mean", "p50", "p90", "p95", "p99",
		"p99.9", "max");
	for (int i = 0; i < BM__COUNT; i++) {
		const struct hist *h = &m->h[i];
		if (i == BM_ANSWER_TTFT && !h->count)
			continue; /* no stream reasoned: it would be the ttft */
		fprintf(f, "%-11s %9llu", bench_metric_key((enum bench_metric)i), (unsigned long long)h->count);
		put_num(f, h->count ? hist_mean(h) / 1000.0 : NAN);
		for (size_t k = 0; k < NQ; k++)
			put_num(f, report_quantile_ms(h, quantiles[k]));
		put_num(f, h->count ? (double)h->max / 1000.0 : NAN);
		fputc('\n', f);
	}
	fprintf(f,
		"(ttft: first request byte written → first token event; itl: each gap between token events; "
		"tpot: (last − first token) / (output tokens − 1); e2e: first byte written → response end; "
		"answer_ttft, of the streams that reasoned: first byte written → first token that is not "
		"reasoning; see docs/metrics.md)\n");
	if (o->warmup) {
		const struct bench_stats *w = &r->w;
		fprintf(f, "warm-up (excluded above): %llu requests, %llu ok, %llu failed; ttft p50 ",
			(unsigned long long)w->started, (unsigned long long)w->ok, (unsigned long long)w->failed);
		if (w->h[BM_TTFT].count)
			fprintf(f, "%.3f ms", report_quantile_ms(&w->h[BM_TTFT], 0.5));
		else
			fputs("-", f);
		fputs(", e2e p50 ", f);
		if (w->h[BM_E2E].count)
			fprintf(f, "%.3f ms\n", report_quantile_ms(&w->h[BM_E2E], 0.5));
		else
			fputs("-\n", f);
	}
}

static json_t *num_or_null(double v)
{
	return isnan(v) ? json_null() : json_real(v);
}

static json_t *hist_json(const struct hist *h)
{
	json_t *o = json_object();
	json_object_set_new(o, "count", json_integer((json_int_t)h->count));
	json_object_set_new(o, "mean_ms", num_or_null(h->count ? hist_mean(h) / 1000.0 : NAN));
	for (size_t k = 0; k < NQ; k++)
		json_object_set_new(o, quantile_keys[k], num_or_null(report_quantile_ms(h, quantiles[k])));
	json_object_set_new(o, "max_ms", num_or_null(h->count ? (double)h->max / 1000.0 : NAN));
	return o;
}

static json_t *stats_json(const struct bench_stats *s, double elapsed_s, bool rates)
{
	json_t *o = json_object(), *req = json_object(), *err = json_object(), *met = json_object();

	json_object_set_new(req, "started", json_integer((json_int_t)s->started));
	json_object_set_new(req, "ok", json_integer((json_int_t)s->ok));
	json_object_set_new(req, "failed", json_integer((json_int_t)s->failed));
	json_object_set_new(req, "cancelled", json_integer((json_int_t)s->cancelled));
	json_object_set_new(o, "requests", req);
	for (int i = 0; i < BERR__COUNT; i++)
		json_object_set_new(err, bench_error_name((enum bench_error)i), json_integer((json_int_t)s->errors[i]));
	json_object_set_new(o, "errors", err);
	json_object_set_new(o, "input_tokens", json_integer((json_int_t)s->input_tokens));
	json_object_set_new(o, "output_tokens", json_integer((json_int_t)s->output_tokens));
	json_object_set_new(o, "input_tokens_from_usage", json_integer((json_int_t)s->input_from_usage));
	json_object_set_new(o, "output_tokens_from_usage", json_integer((json_int_t)s->output_from_usage));
	if (rates) {
		json_t *t = json_object();
		json_object_set_new(t, "requests_per_s", json_real(per_s(s->ok, elapsed_s)));
		json_object_set_new(t, "input_tokens_per_s", json_real(per_s(s->input_tokens, elapsed_s)));
		json_object_set_new(t, "output_tokens_per_s", json_real(per_s(s->output_tokens, elapsed_s)));
		json_object_set_new(t, "elapsed_s", json_real(elapsed_s));
		json_object_set_new(o, "throughput", t);
	}
	for (int i = 0; i < BM__COUNT; i++)
		json_object_set_new(met, bench_metric_key((enum bench_metric)i), hist_json(&s->h[i]));
	json_object_set_new(o, "metrics", met);
	return o;
}

void *report_result_json(const struct bench_opts *o, const struct bench_result *r)
{
	json_t *j = stats_json(&r->m, r->elapsed_s, true);

	json_object_set_new(j, "mode", json_string(r->concurrency ? "closed" : "open"));
	json_object_set_new(j, "concurrency", r->concurrency ? json_integer(r->concurrency) : json_null());
	json_object_set_new(j, "rate", r->concurrency ? json_null() : json_real(r->rate));
	json_object_set_new(j, "wall_s", json_real(r->wall_s));
	json_object_set_new(j, "connections", json_integer((json_int_t)r->connections));
	json_object_set_new(j, "interrupted", json_boolean(r->interrupted));
	json_object_set_new(j, "reads", json_integer((json_int_t)r->reads));
	json_object_set_new(j, "reads_kernel_stamped", json_integer((json_int_t)r->kernel_stamped));
	json_object_set_new(j, "stopped_early", r->fatal ? json_string(r->fatal_msg) : json_null());
	if (o->tls) {
		json_t *t = json_object();
		json_object_set_new(t, "protocol", r->tls_protocol[0] ? json_string(r->tls_protocol) : json_null());
		json_object_set_new(t, "cipher", r->tls_cipher[0] ? json_string(r->tls_cipher) : json_null());
		json_object_set_new(t, "handshakes", json_integer((json_int_t)r->tls_handshakes));
		json_object_set_new(t, "resumed", json_integer((json_int_t)r->tls_resumed));
		json_object_set_new(t, "verified", json_boolean(!o->tls_insecure));
		json_object_set_new(j, "tls", t);
	} else {
		json_object_set_new(j, "tls", json_null());
	}
	if (!r->concurrency) {
		json_object_set_new(j, "delayed_arrivals", json_integer((json_int_t)r->delayed));
		json_object_set_new(j, "max_arrival_lag_ms", json_real((double)r->max_lag_us / 1000.0));
		json_object_set_new(j, "max_arrival_timer_late_ms", json_real((double)r->max_timer_late_us / 1000.0));
	}
	json_object_set_new(j, "warmup", stats_json(&r->w, 0, false));
	return j;
}

void *report_config_json(const struct bench_opts *o)
{
	json_t *c = json_object();
	json_object_set_new(c, "url", json_string(o->url));
	json_object_set_new(c, "tls", json_boolean(o->tls));
	json_object_set_new(c, "path", json_string(o->path));
	json_object_set_new(c, "api", json_string(o->api_name));
	json_object_set_new(c, "stream", json_boolean(o->stream));
	json_object_set_new(c, "model", o->model ? json_string(o->model) : json_null());
	json_object_set_new(c, "concurrency", o->concurrency ? json_integer(o->concurrency) : json_null());
	json_object_set_new(c, "rate", o->rate > 0 ? json_real(o->rate) : json_null());
	json_object_set_new(c, "arrivals", json_string(o->arrivals == ARRIVALS_GAMMA ? "gamma" : "poisson"));
	json_object_set_new(c, "burstiness", json_real(o->burstiness));
	json_object_set_new(c, "duration_s", o->duration_ms ? json_real((double)o->duration_ms / 1000.0) : json_null());
	json_object_set_new(c, "requests", o->requests ? json_integer((json_int_t)o->requests) : json_null());
	json_object_set_new(c, "warmup", json_integer((json_int_t)o->warmup));
	json_object_set_new(c, "input_len", json_string(o->input_len.desc));
	json_object_set_new(c, "output_len", json_string(o->output_len.desc));
	json_object_set_new(c, "sim_headers", json_boolean(o->sim_headers));
	json_object_set_new(c, "ignore_eos", json_boolean(o->ignore_eos));
	json_object_set_new(c, "continuous_usage", json_boolean(o->continuous_usage));
	json_object_set_new(c, "timeout_s", json_real((double)o->timeout_ms / 1000.0));
	json_object_set_new(c, "seed", json_integer((json_int_t)o->seed));
	json_object_set_new(c, "run_id", json_string(o->run_id));
	if (o->sessions) {
		json_t *ss = json_object();
		json_object_set_new(ss, "sessions", json_integer((json_int_t)o->sessions));
		json_object_set_new(ss, "turns", json_integer(o->turns));
		json_object_set_new(ss, "system_prompts", json_integer(o->system_prompts));
		json_object_set_new(ss, "system_len", json_string(o->system_len.desc));
		json_object_set_new(ss, "header", json_string(o->session_header));
		json_object_set_new(c, "sessions", ss);
	}
	if (o->nsweep) {
		json_t *a = json_array();
		for (unsigned i = 0; i < o->nsweep; i++)
			json_array_append_new(a, json_integer(o->sweep[i]));
		json_object_set_new(c, "sweep", a);
	}
	return c;
}

int report_write_json(const char *path, void *root)
{
	json_t *j = root;
	json_object_set_new(j, "tool", json_string(BENCH_NAME));
	json_object_set_new(j, "version", json_string(TOKENTAP_VERSION));
	int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
	if (rc == -1)
		fprintf(stderr, BENCH_NAME ": cannot write %s: %s\n", path, strerror(errno));
	json_decref(j);
	return rc;
}

void report_progress(FILE *f, bool tty, const struct bench_result *r, double t_s, unsigned inflight)
{
	const struct bench_stats *m = &r->m;
	double el = m->first_send_ns && m->last_end_ns > m->first_send_ns
			    ? (double)(m->last_end_ns - m->first_send_ns) / 1e9
			    : 0;
	fprintf(f, "%s[%6.1fs] %llu ok, %llu failed, %u in flight", tty ? "\r\033[K" : "", t_s,
		(unsigned long long)(m->ok + r->w.ok), (unsigned long long)(m->failed + r->w.failed), inflight);
	if (m->ok)
		fprintf(f, " | %.1f requests/s, %.1f output tokens/s", per_s(m->ok, el), per_s(m->output_tokens, el));
	if (m->h[BM_TTFT].count)
		fprintf(f, " | ttft p50 %.1f ms p99 %.1f ms", report_quantile_ms(&m->h[BM_TTFT], 0.5),
			report_quantile_ms(&m->h[BM_TTFT], 0.99));
	if (r->w.started && !m->started)
		fputs(" (warm-up)", f);
	if (!tty)
		fputc('\n', f);
	fflush(f);
}
