/*
 * test_prom_proto.c — the protobuf exposition of /metrics (prom_proto.c):
 * which Accept headers choose it; native bucket indices at and around the
 * schema's boundaries; the conversion of tokentap histograms to native
 * buckets (counts add up, each count stays inside the native buckets its
 * internal bucket overlaps, buckets never go down as counts grow, empty and
 * huge histograms); and the whole exposition, decoded with libprotobuf-c,
 * carrying the same families, series, counts, sums, classic buckets,
 * counters and gauges as the text format of the same store result.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/buffer.h>
#include <metrics.pb-c.h>

#include "series_key.h"
#include "prom.h"
#include "prom_accept.h"
#include "prom_proto.h"
#include "slice.h"
#include "store.h"
#include "varint.h"

/* --- Accept -------------------------------------------------------------- */

static void test_accept(void **state)
{
	static const struct {
		const char *accept;
		bool proto;
	} cases[] = {
		/* what Prometheus sends with native histograms on (2.42) */
		{ "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,"
		  "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
		  true },
		{ "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited",
		  true },
		{ "Application/Vnd.Google.Protobuf; Proto=\"io.prometheus.client.MetricFamily\"; Encoding=Delimited",
		  true },
		{ "text/plain, "
		  "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
		  true }, /* equal q: ours is the richer answer */
		/* what it sends without: OpenMetrics and text, no protobuf */
		{ "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
		  "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
		  false },
		{ NULL, false },
		{ "", false },
		{ "*/*", false },
		{ "text/plain", false },
		/* not the delimited MetricFamily stream */
		{ "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily", false },
		{ "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text", false },
		{ "application/vnd.google.protobuf;proto=other.Message;encoding=delimited", false },
		{ "application/vnd.google.protobufx;proto=io.prometheus.client.MetricFamily;encoding=delimited",
		  false },
		/* refused, or ranked below the text format */
		{ "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0",
		  false },
		{ "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.2,"
		  "text/plain;q=0.9",
		  false },
		{ "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.2,"
		  "*/*;q=0.5",
		  false },
	};
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (prom_accept_protobuf(cases[i].accept) != cases[i].proto)
			fail_msg("Accept %s: expected %s", cases[i].accept ? cases[i].accept : "(none)",
				 cases[i].proto ? "protobuf" : "text");
	}
}

/* --- native bucket indices ---------------------------------------------- */

static void test_native_index_at_powers_of_two(void **state)
{
	(void)state;
	/* an exact power of two is the upper, inclusive end of its bucket */
	for (int e = -20; e <= 13; e++) {
		double p = ldexp(1.0, e);
		assert_int_equal(prom_native_index(p), e * 128);
		assert_int_equal(prom_native_index(nextafter(p, INFINITY)), e * 128 + 1);
		assert_int_equal(prom_native_index(nextafter(p, 0)), e * 128);
		assert_int_equal(prom_native_index(p * 0.999), e * 128); /* 2^(-1/128) = 0.9946 */
		assert_int_equal(prom_native_index(p * 0.994), e * 128 - 1);
	}
	/* microseconds that are powers of two in seconds: 2^-6 s = 15625 µs */
	assert_int_equal(prom_native_index(15625 / 1e6), -6 * 128);
	assert_int_equal(prom_native_index(15626 / 1e6), -6 * 128 + 1);
	assert_int_equal(prom_native_index(15624 / 1e6), -6 * 128);
	assert_int_equal(prom_native_index(1000000 / 1e6), 0);
	assert_int_equal(prom_native_index(1000001 / 1e6), 1);
	assert_int_equal(prom_native_index(999999 / 1e6), 0);
}

static void test_native_index_inside_octave(void **state)
{
	(void)state;
	/* bucket k of an octave holds (2^((k-1)/128), 2^(k/128)] */
	for (int k = -300; k <= 300; k++) {
		double b = exp2(k / 128.0);
		assert_int_equal(prom_native_index(b * (1 + 1e-9)), k + 1);
		assert_int_equal(prom_native_index(b * (1 - 1e-9)), k);
	}
}

/* --- conversion --------------------------------------------------------- */

static uint64_t counts[PROM_NATIVE_SPAN];

static uint64_t native_total(size_t n)
{
	uint64_t t = 0;
	for (size_t i = 0; i < n; i++)
		t += counts[i];
	return t;
}

static void test_native_empty_and_zero(void **state)
{
	struct hist h;
	int first;
	size_t n;
	uint64_t zero;

	(void)state;
	prom_native_buckets(NULL, &first, &n, counts, &zero);
	assert_int_equal(n, 0);
	assert_int_equal(zero, 0);
	hist_init(&h);
	prom_native_buckets(&h, &first, &n, counts, &zero);
	assert_int_equal(n, 0);
	assert_int_equal(zero, 0);
	/* 0 µs (a reused connection's connect time) is the zero bucket */
	hist_record_n(&h, 0, 7);
	prom_native_buckets(&h, &first, &n, counts, &zero);
	assert_int_equal(n, 0);
	assert_int_equal(zero, 7);
	hist_record_n(&h, 1, 2);
	prom_native_buckets(&h, &first, &n, counts, &zero);
	assert_int_equal(zero, 7);
	assert_int_equal(n, 1);
	assert_int_equal(first, prom_native_index(1e-6));
	assert_int_equal(counts[0], 2);
}

/* Every value of every internal bucket, recorded alone, lands only in the
 * native buckets between those of the internal bucket's ends, and all of
 * it; exact values (below 128 µs) land in their own native bucket. */
static void test_native_stays_inside_its_bucket(void **state)
{
	struct hist h;
	int first;
	size_t n;
	uint64_t zero;

	(void)state;
	for (unsigned b = 1; b < HIST_BUCKETS; b++) {
		uint64_t lo = hist_bucket_low(b), hi = b == HIST_BUCKETS - 1 ? HIST_LIMIT - 1 : hist_bucket_high(b);
		hist_init(&h);
		hist_record_n(&h, lo, 1000);
		prom_native_buckets(&h, &first, &n, counts, &zero);
		assert_int_equal(zero, 0);
		assert_int_equal(native_total(n), 1000);
		assert_true(first >= prom_native_index((double)lo / 1e6));
		assert_true(first + (int)n - 1 <= prom_native_index((double)hi / 1e6));
		assert_true(counts[0] > 0 && counts[n - 1] > 0);
		if (lo == hi)
			assert_int_equal(n, 1);
		/* at most five parts at schema 7 (internal buckets are 1.94 %
		 * wide at most, native ones 0.54 %) */
		assert_true(n <= 5);
	}
}

/* A native bucket never goes down while its histogram grows: Prometheus
 * would take that for a counter reset. */
static void test_native_grows_monotonically(void **state)
{
	static uint64_t prev[PROM_NATIVE_SPAN];
	struct hist h;
	int first, prev_first = 0;
	size_t n, prev_n = 0;
	uint64_t zero;

	(void)state;
	hist_init(&h);
	for (unsigned step = 0; step < 3000; step++) {
		/* a few values spread over several internal buckets, added one by
		 * one in an order that revisits each bucket at varying counts */
		uint64_t v = 200000 + (uint64_t)((step * 7919u) % 40000u);
		hist_record(&h, v);
		prom_native_buckets(&h, &first, &n, counts, &zero);
		assert_int_equal(native_total(n), h.count);
		for (size_t k = 0; k < prev_n; k++) {
			long at = (long)prev_first + (long)k - first;
			assert_true(at >= 0 && (size_t)at < n);
			if (counts[at] < prev[k])
				fail_msg("step %u: native bucket %d went from %llu to %llu", step, prev_first + (int)k,
					 (unsigned long long)prev[k], (unsigned long long)counts[at]);
		}
		memcpy(prev, counts, n * sizeof(*counts));
		prev_first = first;
		prev_n = n;
	}
}

static void test_native_huge(void **state)
{
	struct hist h;
	int first;
	size_t n;
	uint64_t zero, big = (uint64_t)1 << 62;

	(void)state;
	hist_init(&h);
	/* counts near 2^62, values at and past the last bucket */
	hist_record_n(&h, 1500000, big);
	hist_record_n(&h, HIST_LIMIT + 12345, 3);
	hist_record_n(&h, UINT64_MAX / 4, 5);
	prom_native_buckets(&h, &first, &n, counts, &zero);
	assert_int_equal(zero, 0);
	assert_true(native_total(n) == big + 8);
	assert_true(first >= prom_native_index(hist_bucket_low(hist_index(1500000)) / 1e6));
	assert_true(first + (int)n - 1 <= prom_native_index((double)(HIST_LIMIT - 1) / 1e6));

	/* every bucket full */
	hist_init(&h);
	for (unsigned b = 0; b < HIST_BUCKETS; b++)
		hist_record_n(&h, hist_bucket_low(b), (uint64_t)1 << 40);
	prom_native_buckets(&h, &first, &n, counts, &zero);
	assert_true(zero == (uint64_t)1 << 40);
	assert_true(native_total(n) + zero == h.count);
	assert_int_equal(first, prom_native_index(1e-6));
}

/* --- the exposition, decoded ------------------------------------------- */

static void add_series(struct store_result *r, const char *route, const char *up, const char *model, bool cold)
{
	char key[SERIES_KEY_MAX];
	size_t len = series_key_build(key, route, up, model, cold);

	assert_true(len > 0);
	assert_non_null(store_result_series(r, key, len));
}

static void build_result(struct store_result *r)
{
	memset(r, 0, sizeof(*r));
	add_series(r, "default", "up-b", "m\"x\\y\nz", false);
	add_series(r, "default", "up-a", "m1", false);
	add_series(r, "default", "up-a", "m1", true);
	add_series(r, "chat", "up-a", "m2", false);
	struct slice *b = &r->series[0].slice;
	b->counters[CT_REQUESTS] = 3;
	b->counters[CT_STATUS_5XX] = 3;
	b->counters[CT_ERR_BASE + REQ_ERR_TIMEOUT] = 3;
	hist_record_n(slice_hist(b, HM_E2E), 5000, 3);
	for (unsigned s = 1; s < 3; s++) {
		struct slice *a = &r->series[s].slice;
		for (uint64_t i = 0; i < 500; i++) {
			hist_record(slice_hist(a, HM_TTFT), 20000 + i * i * 7 + s * 1000);
			hist_record(slice_hist(a, HM_ITL), 900 + (i * 37) % 30000);
			hist_record(slice_hist(a, HM_E2E), 1000000 + i * 4001);
		}
		hist_record_n(slice_hist(a, HM_CONNECT), 0, 40);
		hist_record_n(slice_hist(a, HM_CONNECT), 1500, 2);
		a->counters[CT_REQUESTS] += 500;
		a->counters[CT_STATUS_2XX] += 499;
		a->counters[CT_STATUS_4XX] += 1;
		a->counters[CT_OUTPUT_TOKENS] += 12345;
		a->counters[CT_SLO_MET] += 400;
	}
	hist_record_n(slice_hist(&r->series[3].slice, HM_QUEUE), 77, 1);
	r->series[3].slice.counters[CT_REQUESTS] = 1;
}

struct sample {
	char key[400];
	double value;
};

struct samples {
	struct sample *s;
	size_t n;
};

static char *drain(struct evbuffer *buf, size_t *len)
{
	*len = evbuffer_get_length(buf);
	char *p = malloc(*len + 1);
	assert_non_null(p);
	evbuffer_remove(buf, p, *len);
	p[*len] = '\0';
	return p;
}

/* The samples of a text exposition, "name{labels}" -> value. */
static void parse_text(char *text, struct samples *out)
{
	out->s = NULL;
	out->n = 0;
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		if (line[0] == '#')
			continue;
		char *sp = strrchr(line, ' ');
		assert_non_null(sp);
		*sp = '\0';
		out->s = realloc(out->s, (out->n + 1) * sizeof(*out->s));
		assert_non_null(out->s);
		assert_true(strlen(line) < sizeof(out->s[0].key));
		strcpy(out->s[out->n].key, line);
		out->s[out->n].value = strtod(sp + 1, NULL);
		out->n++;
	}
}

static size_t take(struct samples *ss, bool *used, const char *key, double *value)
{
	for (size_t i = 0; i < ss->n; i++)
		if (!used[i] && strcmp(ss->s[i].key, key) == 0) {
			used[i] = true;
			*value = ss->s[i].value;
			return 1;
		}
	fail_msg("protobuf series %s is not in the text exposition", key);
	return 0;
}

/* "name{a="x",b="y"...}" as the text format writes it, with an extra label
 * (NULL: none). */
static void key_of(char *out, size_t cap, const char *name, const Io__Prometheus__Client__Metric *m,
		   const char *extra_name, const char *extra_value)
{
	size_t n = (size_t)snprintf(out, cap, "%s{", name);
	for (size_t i = 0; i <= m->n_label; i++) {
		const char *ln = i < m->n_label ? m->label[i]->name : extra_name;
		const char *lv = i < m->n_label ? m->label[i]->value : extra_value;
		char esc[200];
		if (!ln)
			break;
		prom_label_escape(esc, sizeof(esc), lv);
		n += (size_t)snprintf(out + n, cap - n, "%s%s=\"%s\"", i ? "," : "", ln, esc);
	}
	snprintf(out + n, cap - n, "}");
}

/* Both expositions carry the same families and values, the engine's view
 * included: up-b is scraped twice (a reload draining its old url: the
 * newer scrape is exported), up-a's engine reports no KV-cache use and no
 * prefix hits (no sample), up-c failed every scrape (scrapes only). The
 * scrapes are stamped in the future, so that both see the age 0. */
static void test_proto_matches_text(void **state)
{
	struct store_result r;
	const uint64_t later = clock_now_ns() + 3600 * 1000000000ull;
	struct upstream_gauge g[4] = {
		{ .name = "up-b",
		  .in_flight = 1,
		  .engine = { .scraped = true,
			      .running = 9,
			      .waiting = 9,
			      .kv_use = 0.9,
			      .prefix_hit = 0.1,
			      .at_ns = later - 1,
			      .successes = 1 } },
		{ .name = "up-a",
		  .in_flight = 2,
		  .queued = 5,
		  .engine = { .scraped = true,
			      .running = 4,
			      .waiting = 0,
			      .kv_use = NAN,
			      .prefix_hit = NAN,
			      .at_ns = later,
			      .successes = 12,
			      .failures = 2 } },
		{ .name = "up-b",
		  .in_flight = 3,
		  .queued = 1,
		  .engine = { .scraped = true,
			      .running = 2,
			      .waiting = 7,
			      .kv_use = 0.25,
			      .prefix_hit = 0.5,
			      .at_ns = later,
			      .successes = 40,
			      .failures = 1 } },
		{ .name = "up-c", .engine = { .failing = true, .failures = 3 } },
	};
	struct evbuffer *tb = evbuffer_new(), *pb = evbuffer_new();
	struct samples text;
	size_t tlen, plen, families = 0, native_series = 0;

	(void)state;
	build_result(&r);
	assert_int_equal(prom_render(tb, &r), 0);
	assert_int_equal(prom_render_gauges(tb, g, 4), 0);
	assert_int_equal(prom_render_proto(pb, &r, g, 4), 0);
	char *t = drain(tb, &tlen);
	uint8_t *p = (uint8_t *)drain(pb, &plen);
	static const char *const engine_lines[] = {
		"# TYPE tokentap_engine_requests_running gauge\n"
		"tokentap_engine_requests_running{upstream=\"up-a\"} 4\n"
		"tokentap_engine_requests_running{upstream=\"up-b\"} 2\n",
		"tokentap_engine_requests_waiting{upstream=\"up-a\"} 0\n"
		"tokentap_engine_requests_waiting{upstream=\"up-b\"} 7\n",
		"# TYPE tokentap_engine_kv_cache_usage_ratio gauge\n"
		"tokentap_engine_kv_cache_usage_ratio{upstream=\"up-b\"} 0.25\n# HELP",
		"tokentap_engine_prefix_cache_hit_ratio{upstream=\"up-b\"} 0.5\n# HELP",
		"tokentap_engine_scrape_age_seconds{upstream=\"up-a\"} 0\n"
		"tokentap_engine_scrape_age_seconds{upstream=\"up-b\"} 0\n# HELP",
		"# TYPE tokentap_engine_scrapes_total counter\n"
		"tokentap_engine_scrapes_total{upstream=\"up-a\",result=\"ok\"} 12\n"
		"tokentap_engine_scrapes_total{upstream=\"up-a\",result=\"failed\"} 2\n"
		"tokentap_engine_scrapes_total{upstream=\"up-b\",result=\"ok\"} 40\n"
		"tokentap_engine_scrapes_total{upstream=\"up-b\",result=\"failed\"} 1\n"
		"tokentap_engine_scrapes_total{upstream=\"up-c\",result=\"ok\"} 0\n"
		"tokentap_engine_scrapes_total{upstream=\"up-c\",result=\"failed\"} 3\n",
	};
	for (size_t i = 0; i < sizeof(engine_lines) / sizeof(engine_lines[0]); i++)
		if (!strstr(t, engine_lines[i]))
			fail_msg("not in the text exposition:\n%s\n---\n%s", engine_lines[i], t);
	/* never scraped: no gauge; the older scrape of up-b not at all */
	assert_null(strstr(t, "tokentap_engine_requests_waiting{upstream=\"up-c\""));
	assert_null(strstr(t, "tokentap_engine_scrape_age_seconds{upstream=\"up-c\""));
	assert_null(strstr(t, "} 0.9\n"));
	/* every family of the text has one # TYPE line */
	size_t text_families = 0;
	for (char *q = t; (q = strstr(q, "# TYPE ")); q++)
		text_families++;
	parse_text(t, &text);
	bool *used = calloc(text.n, sizeof(*used));
	assert_non_null(used);

	const uint8_t *at = p, *end = p + plen;
	while (at < end) {
		uint64_t len = 0;
		char key[400];
		double v;
		assert_int_equal(varint_get(&at, end, &len), 0);
		assert_true(len <= (uint64_t)(end - at));
		Io__Prometheus__Client__MetricFamily *f =
			io__prometheus__client__metric_family__unpack(NULL, (size_t)len, at);
		assert_non_null(f);
		at += len;
		families++;
		assert_true(f->help && f->help[0]);
		if (strncmp(f->name, "tokentap_", 9) != 0)
			fail_msg("family %s", f->name);
		char type_line[160];
		snprintf(type_line, sizeof(type_line), "%s %s", f->name,
			 f->type == IO__PROMETHEUS__CLIENT__METRIC_TYPE__HISTOGRAM ? "histogram"
			 : f->type == IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER ? "counter"
										   : "gauge");
		for (size_t i = 0; i < f->n_metric; i++) {
			const Io__Prometheus__Client__Metric *m = f->metric[i];
			if (f->type == IO__PROMETHEUS__CLIENT__METRIC_TYPE__HISTOGRAM) {
				const Io__Prometheus__Client__Histogram *h = m->histogram;
				char name[200];
				assert_non_null(h);
				snprintf(name, sizeof(name), "%s_count", f->name);
				key_of(key, sizeof(key), name, m, NULL, NULL);
				take(&text, used, key, &v);
				assert_true(v == (double)h->sample_count);
				snprintf(name, sizeof(name), "%s_sum", f->name);
				key_of(key, sizeof(key), name, m, NULL, NULL);
				take(&text, used, key, &v);
				assert_true(fabs(v - h->sample_sum) < 1e-6);
				snprintf(name, sizeof(name), "%s_bucket", f->name);
				if (strcmp(f->name, "tokentap_tokens_per_event") == 0) {
					/* whole-token edges, no native buckets: a count, not a time */
					char le[16];
					assert_int_equal(h->n_bucket, prom_tpe_le_count() + 1);
					for (size_t b = 0; b < h->n_bucket; b++) {
						bool inf = b == prom_tpe_le_count();
						if (inf)
							snprintf(le, sizeof(le), "+Inf");
						else
							snprintf(le, sizeof(le), "%u", prom_tpe_le(b));
						key_of(key, sizeof(key), name, m, "le", le);
						take(&text, used, key, &v);
						assert_true(v == (double)h->bucket[b]->cumulative_count);
						assert_true(inf ? isinf(h->bucket[b]->upper_bound)
								: h->bucket[b]->upper_bound == prom_tpe_le(b));
					}
					assert_int_equal(h->n_positive_span, 0);
					continue;
				}
				assert_int_equal(h->n_bucket, prom_le_count() + 1);
				for (size_t b = 0; b < h->n_bucket; b++) {
					key_of(key, sizeof(key), name, m, "le", prom_le_label(b));
					take(&text, used, key, &v);
					assert_true(v == (double)h->bucket[b]->cumulative_count);
					assert_true(b == prom_le_count() ? isinf(h->bucket[b]->upper_bound)
									 : h->bucket[b]->upper_bound ==
										   strtod(prom_le_label(b), NULL));
				}
				/* native: the spans and deltas add up to the count */
				assert_int_equal(h->schema, PROM_NATIVE_SCHEMA);
				assert_true(h->zero_threshold > 0 && h->zero_threshold < 1e-6);
				assert_true(h->n_positive_span >= 1);
				assert_int_equal(h->n_negative_span, 0);
				int64_t c = 0;
				uint64_t total = h->zero_count;
				size_t nb = 0;
				for (size_t s = 0; s < h->n_positive_span; s++)
					nb += h->positive_span[s]->length;
				assert_int_equal(nb, h->n_positive_delta);
				for (size_t d = 0; d < h->n_positive_delta; d++) {
					c += h->positive_delta[d];
					assert_true(c >= 0);
					total += (uint64_t)c;
				}
				assert_true(total == h->sample_count);
				native_series += h->sample_count > 0;
			} else if (f->type == IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER) {
				assert_non_null(m->counter);
				key_of(key, sizeof(key), f->name, m, NULL, NULL);
				take(&text, used, key, &v);
				assert_true(v == m->counter->value);
			} else {
				assert_int_equal(f->type, IO__PROMETHEUS__CLIENT__METRIC_TYPE__GAUGE);
				assert_non_null(m->gauge);
				key_of(key, sizeof(key), f->name, m, NULL, NULL);
				take(&text, used, key, &v);
				assert_true(v == m->gauge->value);
			}
		}
		io__prometheus__client__metric_family__free_unpacked(f, NULL);
	}
	assert_int_equal(families, text_families);
	for (size_t i = 0; i < text.n; i++)
		if (!used[i])
			fail_msg("text series %s is not in the protobuf exposition", text.s[i].key);
	assert_true(native_series >= 6);
	free(used);
	free(text.s);
	free(t);
	free(p);
	evbuffer_free(tb);
	evbuffer_free(pb);
	store_result_free(&r);
}

/* The exposition of `r` rendered into pb and its first family unpacked;
 * *p holds the bytes (the caller frees them after the family). */
static Io__Prometheus__Client__MetricFamily *first_family(struct evbuffer *pb, struct store_result *r, uint8_t **p)
{
	size_t plen;
	uint64_t len = 0;

	assert_int_equal(prom_render_proto(pb, r, NULL, 0), 0);
	*p = (uint8_t *)drain(pb, &plen);
	const uint8_t *at = *p;
	assert_int_equal(varint_get(&at, *p + plen, &len), 0);
	Io__Prometheus__Client__MetricFamily *f = io__prometheus__client__metric_family__unpack(NULL, (size_t)len, at);
	assert_non_null(f);
	return f;
}

/* A family's spans and deltas give back the native buckets exactly,
 * including a gap long enough to need a second span. */
static void test_proto_spans(void **state)
{
	struct store_result r;
	struct evbuffer *pb = evbuffer_new();
	int first;
	size_t n;
	uint64_t zero;

	(void)state;
	memset(&r, 0, sizeof(r));
	add_series(&r, "default", "u", "m", false);
	struct hist *h = slice_hist(&r.series[0].slice, HM_TTFT);
	hist_record_n(h, 10000, 5);
	hist_record_n(h, 10300, 2);
	hist_record_n(h, 900000, 9);
	uint8_t *p;
	Io__Prometheus__Client__MetricFamily *f = first_family(pb, &r, &p);
	assert_string_equal(f->name, "tokentap_ttft_seconds");
	assert_int_equal(f->n_metric, 1);
	const Io__Prometheus__Client__Histogram *ph = f->metric[0]->histogram;
	prom_native_buckets(h, &first, &n, counts, &zero);
	assert_true(ph->n_positive_span >= 2);
	int idx = 0;
	int64_t c = 0;
	size_t d = 0;
	for (size_t s = 0; s < ph->n_positive_span; s++) {
		idx += ph->positive_span[s]->offset;
		for (uint32_t k = 0; k < ph->positive_span[s]->length; k++, idx++) {
			c += ph->positive_delta[d++];
			assert_true(idx >= first && idx < first + (int)n);
			assert_true((uint64_t)c == counts[idx - first]);
		}
	}
	assert_int_equal(idx, first + (int)n);
	io__prometheus__client__metric_family__free_unpacked(f, NULL);
	free(p);
	evbuffer_free(pb);
	store_result_free(&r);
}

/* An empty histogram (a series with other traffic) is still native: a span
 * of nothing. */
static void test_proto_empty_histogram(void **state)
{
	struct store_result r;
	struct evbuffer *pb = evbuffer_new();

	(void)state;
	memset(&r, 0, sizeof(r));
	add_series(&r, "default", "u", "m", false);
	r.series[0].slice.counters[CT_REQUESTS] = 1;
	uint8_t *p;
	Io__Prometheus__Client__MetricFamily *f = first_family(pb, &r, &p);
	const Io__Prometheus__Client__Histogram *ph = f->metric[0]->histogram;
	assert_int_equal(ph->sample_count, 0);
	assert_int_equal(ph->n_positive_span, 1);
	assert_int_equal(ph->positive_span[0]->length, 0);
	assert_int_equal(ph->n_positive_delta, 0);
	assert_int_equal(ph->n_bucket, prom_le_count() + 1);
	io__prometheus__client__metric_family__free_unpacked(f, NULL);
	free(p);
	evbuffer_free(pb);
	store_result_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_accept),
		cmocka_unit_test(test_native_index_at_powers_of_two),
		cmocka_unit_test(test_native_index_inside_octave),
		cmocka_unit_test(test_native_empty_and_zero),
		cmocka_unit_test(test_native_stays_inside_its_bucket),
		cmocka_unit_test(test_native_grows_monotonically),
		cmocka_unit_test(test_native_huge),
		cmocka_unit_test(test_proto_matches_text),
		cmocka_unit_test(test_proto_spans),
		cmocka_unit_test(test_proto_empty_histogram),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
