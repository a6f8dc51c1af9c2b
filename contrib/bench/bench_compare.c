/*
 * bench_compare.c — `--replay FILE --compare URL_A URL_B`: one trace against
 * two servers at once, and the per-request differences between them.
 *
 *   thread A: bench_run(trace → URL_A) ─ request log ─┐
 *                                                      ├─ paired by request number ─▶ signrank.c ─▶ table, JSON
 *   thread B: bench_run(trace → URL_B) ─ request log ─┘
 *
 * Each run is the ordinary open-loop replay on a loop of its own; both
 * clocks start at one instant, so request n leaves for A and for B at its
 * recorded arrival, the one of the two that goes first alternating from
 * request to request (BENCH_STAGGER_NS). Both meet the same machine
 * conditions, which running A then B would not give. The statistics are the
 * proxy's own (src/record/signrank.c, the tie rule of src/record/paired.h), so a mirror
 * pair online and a replayed pair offline are judged alike.
 */
#include "bench.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "paired.h"
#include "signrank.h"
#include "timeline.h"

/* Walsh averages grow as n^2: the statistics use the first this many pairs
 * (the sequential rule sees them all). */
#define COMPARE_STATS_MAX 4000

struct side {
	struct bench_opts o;
	char path[sizeof(((struct bench_opts *)0)->base_path) + 64];
	FILE *log;
	struct bench_result res;
	int rc;
};

static void *run_side(void *arg)
{
	struct side *s = arg;
	s->rc = bench_run(&s->o, 0, 0, s->log, &s->res);
	return NULL;
}

/* One request's outcome on one side, from its request-log line. */
struct outcome {
	bool seen, ok;
	double v[PM__COUNT];
};

static double num_or_nan(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

static int read_log(FILE *f, struct outcome *out, size_t n)
{
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;

	rewind(f);
	while ((len = getline(&line, &cap, f)) != -1) {
		json_t *o = json_loadb(line, (size_t)len, 0, NULL);
		json_t *seq = o ? json_object_get(o, "seq") : NULL;
		if (json_is_integer(seq) && json_integer_value(seq) >= 0 && (size_t)json_integer_value(seq) < n) {
			struct outcome *e = &out[json_integer_value(seq)];
			e->seen = true;
			e->ok = json_is_true(json_object_get(o, "ok"));
			e->v[PM_TTFT] = num_or_nan(o, "ttft_ms");
			e->v[PM_ANSWER_TTFT] = NAN; /* not in the request log: the ttft unless a stream reasons */
			e->v[PM_TPOT] = num_or_nan(o, "tpot_ms");
			e->v[PM_E2E] = num_or_nan(o, "e2e_ms");
			e->v[PM_OUTPUT_TOKENS] = num_or_nan(o, "output_tokens");
		}
		json_decref(o);
	}
	free(line);
	return ferror(f) ? -1 : 0;
}

/* The statistics of one metric over the pairs where both sides have it. */
static json_t *metric_report(FILE *f, unsigned m, const struct outcome *a, const struct outcome *b, size_t n)
{
	double *d = malloc((n ? n : 1) * sizeof(*d)), *av = malloc((n ? n : 1) * sizeof(*av));
	struct seqsign seq = { 0 };
	struct signrank sr;
	size_t k = 0;
	json_t *o = NULL;

	if (!d || !av)
		goto out;
	for (size_t i = 0; i < n; i++) {
		if (!a[i].ok || !b[i].ok || isnan(a[i].v[m]) || isnan(b[i].v[m]) || a[i].v[m] < 0 || b[i].v[m] < 0)
			continue;
		seqsign_add(&seq, a[i].v[m], b[i].v[m], SEQSIGN_BAND, paired_floor(m), PAIRED_ALPHA);
		if (k < COMPARE_STATS_MAX) {
			d[k] = b[i].v[m] - a[i].v[m];
			av[k] = a[i].v[m];
			k++;
		}
	}
	if (signrank_test(d, k, 1 - PAIRED_ALPHA, &sr) == -1)
		goto out;
	double a_median = signrank_median(av, k);
	int verdict = paired_verdict(&seq, sr.hl, a_median, m);
	fprintf(f, "%-14s %6zu %10.3f %10.3f %10.3f [%9.3f, %9.3f] %9.2g %-3s %s", paired_metric_name(m), k, a_median,
		sr.median, sr.hl, sr.hl_lo, sr.hl_hi, sr.p, paired_significant(&sr, a_median, m) ? "yes" : "no",
		paired_verdict_name(verdict, m));
	if (verdict)
		fprintf(f, " (after %llu pairs)", (unsigned long long)seq.since);
	fputc('\n', f);
	o = paired_metric_json(&sr, a_median, &seq, m);
out:
	free(d);
	free(av);
	return o;
}

static void side_init(struct side *s, const struct bench_opts *o, const struct bench_opts *target, uint64_t start,
		      unsigned stagger)
{
	s->o = *o;
	memcpy(s->o.host, target->host, sizeof(s->o.host));
	s->o.port = target->port;
	s->o.tls = target->tls;
	s->o.url = target->url;
	memcpy(s->o.base_path, target->base_path, sizeof(s->o.base_path));
	/* the API's path after the base path, as bench.c made it for A */
	snprintf(s->path, sizeof(s->path), "%s%s", target->base_path, o->path + strlen(o->base_path));
	s->o.path = s->path;
	s->o.start_ns = start;
	s->o.stagger = stagger;
	s->o.no_signals = true;
	s->o.progress = 0;
	s->o.requests_log_path = NULL;
}

int bench_compare(FILE *f, const struct bench_opts *o)
{
	struct side *s = calloc(2, sizeof(*s));
	struct outcome *out[2] = { NULL, NULL };
	pthread_t th[2];
	size_t n = o->replay->n;
	int rc = -1, started = 0;
	json_t *root = NULL, *metrics = NULL;

	if (!s)
		goto nomem;
	/* both clocks start a little ahead, once both loops are set up */
	uint64_t start = clock_now_ns() + 200000000ull;
	side_init(&s[0], o, o, start, 1);
	side_init(&s[1], o, o->compare_b, start, 2);
	for (int i = 0; i < 2; i++) {
		if (!(s[i].log = tmpfile())) {
			fprintf(stderr, BENCH_NAME ": --compare: cannot make a temporary file: %s\n", strerror(errno));
			goto out;
		}
		if (!(out[i] = calloc(n, sizeof(*out[i]))))
			goto nomem;
	}
	for (; started < 2; started++)
		if (pthread_create(&th[started], NULL, run_side, &s[started]) != 0) {
			fprintf(stderr, BENCH_NAME ": --compare: cannot start a thread\n");
			break;
		}
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (started < 2 || s[0].rc == -1 || s[1].rc == -1)
		goto out;
	for (int i = 0; i < 2; i++) {
		if (s[i].res.fatal) {
			fprintf(stderr, BENCH_NAME ": %s: %s\n", s[i].o.url, s[i].res.fatal_msg);
			goto out;
		}
		if (read_log(s[i].log, out[i], n) == -1) {
			fprintf(stderr, BENCH_NAME ": --compare: cannot read back the request log\n");
			goto out;
		}
	}
	size_t pairs = 0, err_a = 0, err_b = 0, both = 0;
	for (size_t i = 0; i < n; i++) {
		bool fa = !out[0][i].ok, fb = !out[1][i].ok;
		pairs += !fa && !fb;
		err_a += fa;
		err_b += fb;
		both += fa && fb;
	}
	fprintf(f, "paired comparison of %zu requests: A %s, B %s\n", n, s[0].o.url, s[1].o.url);
	fprintf(f, "pairs %zu, failed on A %zu, on B %zu (both %zu); difference: B - A\n", pairs, err_a, err_b, both);
	for (int i = 0; i < 2; i++)
		fprintf(f, "%s: %llu ok, ttft p50 %.3f ms, e2e p50 %.3f ms\n", i ? "B" : "A",
			(unsigned long long)s[i].res.m.ok, report_quantile_ms(&s[i].res.m.h[BM_TTFT], 0.5),
			report_quantile_ms(&s[i].res.m.h[BM_E2E], 0.5));
	fprintf(f, "%-14s %6s %10s %10s %10s %23s %9s %-3s %s\n", "metric", "n", "A median", "median d", "HL shift",
		"99% interval", "p", "sig", "verdict");
	metrics = json_object();
	for (unsigned m = 0; m < PM__COUNT; m++) {
		if (m == PM_ANSWER_TTFT)
			continue;
		json_t *mj = metric_report(f, m, out[0], out[1], n);
		if (!mj)
			goto nomem;
		json_object_set_new(metrics, paired_metric_name(m), mj);
	}
	rc = 0;
	if (o->json_path) {
		root = json_object();
		json_object_set_new(root, "config", report_config_json(&s[0].o));
		json_object_set_new(root, "compare",
				    json_pack("{s:s,s:s,s:I,s:I,s:{s:I,s:I,s:I},s:o,s:o,s:o}", "a", s[0].o.url, "b",
					      s[1].o.url, "requests", (json_int_t)n, "pairs", (json_int_t)pairs,
					      "errors", "a", (json_int_t)err_a, "b", (json_int_t)err_b, "both",
					      (json_int_t)both, "result_a", report_result_json(&s[0].o, &s[0].res),
					      "result_b", report_result_json(&s[1].o, &s[1].res), "metrics", metrics));
		metrics = NULL;
		if (report_write_json(o->json_path, root) == -1)
			rc = -1;
		root = NULL;
	}
	goto out;
nomem:
	fprintf(stderr, BENCH_NAME ": --compare: out of memory\n");
out:
	json_decref(metrics);
	json_decref(root);
	for (int i = 0; s && i < 2; i++) {
		if (s[i].log)
			fclose(s[i].log);
		free(out[i]);
	}
	free(s);
	return rc;
}
