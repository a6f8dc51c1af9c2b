/*
 * prom_proto.c — /metrics as length-delimited protobuf MetricFamily messages,
 * each time histogram with native buckets beside its classic ones.
 *
 * The messages are built as libprotobuf-c structs (proto/metrics.proto,
 * compiled by protoc-c at build time) and packed by the library; nothing
 * here writes protobuf by hand. Everything one family allocates is tracked
 * by an arena and freed once the family is packed, so a large exposition
 * holds one family's structs at a time.
 *
 * Native buckets come from tokentap's histogram (hist.h), not from a second
 * one recorded beside it (docs/fleet.md has the measurements behind that
 * choice). Internal bucket b holds the integer µs [lo, hi]; native bucket j
 * of schema 7 holds (2^((j-1)/128), 2^(j/128)] s. A table made once lists,
 * per internal bucket, the native buckets it overlaps and how many of its
 * integers each holds (its weights). Exporting splits the bucket's count c
 * over them by halving: the left half of the parts gets round(c * w_left / w)
 * and the right half the rest, down to single parts. Each side is a
 * non-decreasing function of c, so a native bucket never goes down while
 * the lifetime histogram grows (Prometheus would read a drop as a counter
 * reset), and each native count is within one or two of c's exact share.
 */
#include "prom_proto.h"

#include <event2/buffer.h>
#include <math.h>
#include <metrics.pb-c.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_stats.h"
#include "prom.h"
#include "slice.h"
#include "timeline.h"
#include "varint.h"

typedef Io__Prometheus__Client__MetricFamily pb_family;
typedef Io__Prometheus__Client__Metric pb_metric;
typedef Io__Prometheus__Client__LabelPair pb_label;
typedef Io__Prometheus__Client__Histogram pb_hist;
typedef Io__Prometheus__Client__Bucket pb_bucket;
typedef Io__Prometheus__Client__BucketSpan pb_span;
typedef Io__Prometheus__Client__Counter pb_counter;
typedef Io__Prometheus__Client__Gauge pb_gauge;

#define NATIVE_PER_OCTAVE (1 << PROM_NATIVE_SCHEMA)
/* The index of the zero threshold 2^-20 s: every value >= 1 µs is above it,
 * and 2^32 µs is below 2^13 s, index 13 * 128: the span in between. */
#define NATIVE_LO (-20 * NATIVE_PER_OCTAVE + 1)
#define MAX_PARTS 8

/* bounds[k] = 2^(k/128 - 1): the upper end, as a mantissa in [0.5, 1), of
 * the k-th native bucket of an octave. */
static double bounds[NATIVE_PER_OCTAVE];

static struct {
	int first; /* native index of part 0 */
	unsigned n;
	uint32_t w[MAX_PARTS]; /* integers of the internal bucket in each part */
} parts[HIST_BUCKETS];

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables(void);

/* prom_native_index once the tables are there. */
static int native_index(double v)
{
	int e;
	double frac = frexp(v, &e); /* v = frac * 2^e, frac in [0.5, 1) */
	unsigned lo = 0, hi = NATIVE_PER_OCTAVE;

	/* the first k with bounds[k] >= frac; NATIVE_PER_OCTAVE when none */
	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;
		if (bounds[mid] >= frac)
			hi = mid;
		else
			lo = mid + 1;
	}
	return (int)lo + (e - 1) * NATIVE_PER_OCTAVE;
}

int prom_native_index(double v)
{
	tables();
	return native_index(v);
}

static int index_us(uint64_t us)
{
	return native_index((double)us / 1e6);
}

/* The largest integer µs whose native index is <= j (j >= index_us(1)). */
static uint64_t last_us_of(int j)
{
	uint64_t g = (uint64_t)floor(1e6 * exp2((double)j / NATIVE_PER_OCTAVE));

	while (index_us(g + 1) <= j)
		g++;
	while (g > 0 && index_us(g) > j)
		g--;
	return g;
}

static void make_tables(void)
{
	for (unsigned k = 0; k < NATIVE_PER_OCTAVE; k++)
		bounds[k] = exp2((double)k / NATIVE_PER_OCTAVE - 1.0);
	/* bucket 0 holds the value 0: the zero bucket, no parts */
	for (unsigned b = 1; b < HIST_BUCKETS; b++) {
		uint64_t lo = hist_bucket_low(b), hi = b == HIST_BUCKETS - 1 ? HIST_LIMIT - 1 : hist_bucket_high(b);
		int a = index_us(lo), z = index_us(hi);
		uint64_t prev = lo - 1;
		/* a few parts, far below MAX_PARTS: test_prom_proto checks them */
		if (z - a + 1 > MAX_PARTS)
			abort();
		parts[b].first = a;
		parts[b].n = (unsigned)(z - a + 1);
		for (int j = a; j <= z; j++) {
			uint64_t last = j == z ? hi : last_us_of(j);
			last = last > hi ? hi : last < prev ? prev : last;
			parts[b].w[j - a] = (uint32_t)(last - prev);
			prev = last;
		}
	}
}

static void tables(void)
{
	pthread_once(&tables_once, make_tables);
}

/* Splits c over w[0..n) (n >= 1, weights not all 0) into out[], by halving. */
static void split(uint64_t c, const uint32_t *w, unsigned n, uint64_t *out)
{
	if (n == 1) {
		out[0] += c;
		return;
	}
	unsigned half = n / 2;
	uint64_t wl = 0, wt = 0;
	for (unsigned k = 0; k < n; k++) {
		wt += w[k];
		if (k < half)
			wl += w[k];
	}
	/* round(c * wl / wt) without overflow: c < 2^64, wt < 2^40 */
	uint64_t left = (uint64_t)(((unsigned __int128)c * wl * 2 + wt) / ((unsigned __int128)wt * 2));
	if (wl)
		split(left, w, half, out);
	if (wt - wl)
		split(c - left, w + half, n - half, out + half);
}

void prom_native_buckets(const struct hist *h, int *first, size_t *n, uint64_t *counts, uint64_t *zero)
{
	int lo = PROM_NATIVE_SPAN, hi = -1;

	tables();
	*first = 0;
	*n = 0;
	*zero = h && h->count ? h->buckets[0] : 0;
	if (!h || h->count == *zero)
		return;
	/* clear only the native indices the occupied buckets reach */
	unsigned bmin = hist_index(h->min > 0 ? h->min : 1), bmax = hist_index(h->max);
	int from = parts[bmin].first - NATIVE_LO, to = parts[bmax].first + (int)parts[bmax].n - NATIVE_LO;
	memset(counts + from, 0, (size_t)(to - from) * sizeof(*counts));
	for (unsigned b = bmin; b <= bmax; b++) {
		if (!h->buckets[b])
			continue;
		int at = parts[b].first - NATIVE_LO;
		split(h->buckets[b], parts[b].w, parts[b].n, counts + at);
		lo = at < lo ? at : lo;
		hi = at + (int)parts[b].n - 1 > hi ? at + (int)parts[b].n - 1 : hi;
	}
	/* trim parts that got nothing */
	while (lo < hi && !counts[lo])
		lo++;
	while (hi > lo && !counts[hi])
		hi--;
	if (lo)
		memmove(counts, counts + lo, (size_t)(hi - lo + 1) * sizeof(*counts));
	*first = lo + NATIVE_LO;
	*n = (size_t)(hi - lo + 1);
}

/* --- rendering ----------------------------------------------------------- */

/* Every allocation of the family being built, freed together. */
struct arena {
	void **p;
	size_t n, cap;
	bool failed;
};

static void *arena_alloc(struct arena *a, size_t n, size_t size)
{
	void *m;

	if (a->failed)
		return NULL;
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		void **p = realloc(a->p, cap * sizeof(*p));
		if (!p) {
			a->failed = true;
			return NULL;
		}
		a->p = p;
		a->cap = cap;
	}
	if (!(m = calloc(n ? n : 1, size))) {
		a->failed = true;
		return NULL;
	}
	a->p[a->n++] = m;
	return m;
}

static void arena_clear(struct arena *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->p[i]);
	a->n = 0;
}

struct render {
	struct evbuffer *out;
	struct arena arena;
	const struct stats_groups *gs;
	const char *pre;  /* "tokentap_", or "tokentap_tenant_" */
	bool tenant;	  /* the groups are tenants: route and tenant labels */
	uint64_t *native; /* PROM_NATIVE_SPAN counts, reused */
	bool failed;
};

static char *arena_strdup(struct arena *a, const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = arena_alloc(a, n, 1);
	if (d)
		memcpy(d, s, n);
	return d;
}

/* A metric with the group's labels (route, upstream, model; or route and
 * tenant) and `extra` more slots. */
static pb_metric *group_metric(struct render *r, size_t gi, size_t extra)
{
	pb_metric *m = arena_alloc(&r->arena, 1, sizeof(*m));
	pb_label *l = arena_alloc(&r->arena, 3 + extra, sizeof(*l));
	pb_label **lp = arena_alloc(&r->arena, 3 + extra, sizeof(*lp));
	const struct stats_group *g = &r->gs->g[gi];

	if (!m || !l || !lp)
		return NULL;
	io__prometheus__client__metric__init(m);
	for (size_t i = 0; i < 3 + extra; i++) {
		io__prometheus__client__label_pair__init(&l[i]);
		lp[i] = &l[i];
	}
	m->label = lp;
	/* protobuf strings need no escaping */
	l[0].name = "route";
	l[0].value = (char *)g->route;
	if (r->tenant) { /* a tenant group keeps its tenant in model */
		m->n_label = 2;
		l[1].name = "tenant";
		l[1].value = (char *)g->model;
		return m;
	}
	m->n_label = 3;
	l[1].name = "upstream";
	l[1].value = (char *)g->upstream;
	l[2].name = "model";
	l[2].value = (char *)g->model;
	return m;
}

static void label_add(pb_metric *m, const char *name, const char *value)
{
	m->label[m->n_label]->name = (char *)name;
	m->label[m->n_label]->value = (char *)value;
	m->n_label++;
}

/* Packs `f` to the output, preceded by its length, and frees the arena. */
static void family_flush(struct render *r, pb_family *f)
{
	if (!r->arena.failed && !r->failed) {
		size_t len = io__prometheus__client__metric_family__get_packed_size(f);
		uint8_t *buf = malloc(len + VARINT_MAX);
		if (!buf) {
			r->failed = true;
		} else {
			size_t n = varint_put(buf, len);
			n += io__prometheus__client__metric_family__pack(f, buf + n);
			if (evbuffer_add(r->out, buf, n) == -1)
				r->failed = true;
			free(buf);
		}
	}
	if (r->arena.failed)
		r->failed = true;
	arena_clear(&r->arena);
}

/* A family built (NULL: out of memory making it) packed to the output. */
static void family_done(struct render *r, pb_family *f)
{
	if (!f)
		r->arena.failed = true;
	family_flush(r, f);
}

static pb_family *family_new(struct render *r, const char *name, const char *help,
			     Io__Prometheus__Client__MetricType type, size_t n)
{
	pb_family *f = arena_alloc(&r->arena, 1, sizeof(*f));
	pb_metric **m = arena_alloc(&r->arena, n, sizeof(*m));

	if (!f || !m)
		return NULL;
	io__prometheus__client__metric_family__init(f);
	f->name = arena_strdup(&r->arena, name);
	f->help = arena_strdup(&r->arena, help);
	f->has_type = true;
	f->type = type;
	f->metric = m;
	return f->name && f->help ? f : NULL;
}

/* The end of the run of buckets that starts at i (c[i] != 0): a gap of up
 * to two empty buckets costs less as deltas than as a new span. */
static size_t run_end(const uint64_t *c, size_t n, size_t i)
{
	size_t end = i + 1;

	for (;;) {
		while (end < n && c[end])
			end++;
		size_t gap = end;
		while (gap < n && !c[gap])
			gap++;
		if (gap == n || gap - end > 2)
			return end;
		end = gap;
	}
}

/* The start of the next run at or after i (n when none). */
static size_t next_run(const uint64_t *c, size_t n, size_t i)
{
	while (i < n && !c[i])
		i++;
	return i;
}

/* Native and classic buckets of `h` (NULL: empty) into `ph`. */
static bool fill_histogram(struct render *r, pb_hist *ph, const struct hist *h)
{
	size_t le_n = prom_le_count(), n;
	uint64_t cum[64], zero;
	int first;
	pb_bucket *b = arena_alloc(&r->arena, le_n + 1, sizeof(*b));
	pb_bucket **bp = arena_alloc(&r->arena, le_n + 1, sizeof(*bp));

	if (!b || !bp || le_n > sizeof(cum) / sizeof(cum[0]))
		return false;
	ph->has_sample_count = ph->has_sample_sum = true;
	ph->sample_count = h ? h->count : 0;
	ph->sample_sum = h && h->count ? (double)h->sum / 1e6 : 0.0;
	prom_classic_counts(h, cum);
	for (size_t i = 0; i <= le_n; i++) {
		io__prometheus__client__bucket__init(&b[i]);
		b[i].has_cumulative_count = b[i].has_upper_bound = true;
		b[i].cumulative_count = i < le_n ? cum[i] : ph->sample_count;
		b[i].upper_bound = i < le_n ? (double)prom_le_us(i) / 1e6 : INFINITY;
		bp[i] = &b[i];
	}
	ph->bucket = bp;
	ph->n_bucket = le_n + 1;

	ph->has_schema = ph->has_zero_threshold = ph->has_zero_count = true;
	ph->schema = PROM_NATIVE_SCHEMA;
	ph->zero_threshold = PROM_NATIVE_ZERO_THRESHOLD;
	prom_native_buckets(h, &first, &n, r->native, &zero);
	ph->zero_count = zero;

	size_t spans = 0, deltas = 0;
	for (size_t i = 0; i < n; i = next_run(r->native, n, run_end(r->native, n, i))) {
		spans++;
		deltas += run_end(r->native, n, i) - i;
	}
	pb_span *s = arena_alloc(&r->arena, spans ? spans : 1, sizeof(*s));
	pb_span **sp = arena_alloc(&r->arena, spans ? spans : 1, sizeof(*sp));
	int64_t *d = arena_alloc(&r->arena, deltas, sizeof(*d));
	if (!s || !sp || !d)
		return false;
	if (n == 0) {
		/* no observation above the zero bucket: a span of nothing says
		 * the histogram is native all the same */
		io__prometheus__client__bucket_span__init(&s[0]);
		s[0].has_offset = s[0].has_length = true;
		sp[0] = &s[0];
		spans = 1;
	}
	size_t si = 0, di = 0, prev_end = 0;
	int64_t prev_count = 0;
	for (size_t i = 0; i < n;) {
		size_t end = run_end(r->native, n, i);
		io__prometheus__client__bucket_span__init(&s[si]);
		s[si].has_offset = s[si].has_length = true;
		/* the first span starts at its index, the others after a gap */
		s[si].offset = si == 0 ? first : (int32_t)(i - prev_end);
		s[si].length = (uint32_t)(end - i);
		sp[si] = &s[si];
		si++;
		for (size_t k = i; k < end; k++) {
			d[di++] = (int64_t)r->native[k] - prev_count;
			prev_count = (int64_t)r->native[k];
		}
		prev_end = end;
		i = next_run(r->native, n, end);
	}
	ph->positive_span = sp;
	ph->n_positive_span = spans;
	ph->positive_delta = d;
	ph->n_positive_delta = deltas;
	return true;
}

static const char *const hist_help[HM__COUNT] = {
#define X(e, nm, u, src, help) help,
	HIST_METRICS(X)
#undef X
};

static void histogram_family(struct render *r, enum hist_metric hm, const char *help)
{
	const struct stats_groups *gs = r->gs;
	char name[96], text[320];

	snprintf(name, sizeof(name), "%s%s_seconds", r->pre, hist_metric_name(hm));
	snprintf(text, sizeof(text), "%s, in seconds (definition: docs/metrics.md).", help);
	pb_family *f = family_new(r, name, text, IO__PROMETHEUS__CLIENT__METRIC_TYPE__HISTOGRAM, gs->n);
	for (size_t i = 0; f && i < gs->n; i++) {
		pb_metric *m = group_metric(r, i, 0);
		pb_hist *ph = arena_alloc(&r->arena, 1, sizeof(*ph));
		if (!m || !ph)
			break;
		io__prometheus__client__histogram__init(ph);
		if (!fill_histogram(r, ph, gs->g[i].slice.slot[hm]))
			break;
		m->histogram = ph;
		f->metric[f->n_metric++] = m;
	}
	family_done(r, f);
}

static pb_metric *counter_metric(struct render *r, size_t gi, size_t extra, uint64_t v)
{
	pb_metric *m = group_metric(r, gi, extra);
	pb_counter *c = arena_alloc(&r->arena, 1, sizeof(*c));

	if (!m || !c)
		return NULL;
	io__prometheus__client__counter__init(c);
	c->has_value = true;
	c->value = (double)v;
	m->counter = c;
	return m;
}

/* tokentap_tokens_per_event (classic buckets on whole tokens, no native
 * ones: a small exact count, not a time) and its streams counter, as
 * prom_render writes them. */
static void tokens_per_event_families(struct render *r)
{
	const struct stats_groups *gs = r->gs;
	size_t le_n = prom_tpe_le_count();
	char name[96], text[320];

	snprintf(name, sizeof(name), "%stokens_per_event", r->pre);
	snprintf(text, sizeof(text), "%s (definition: docs/metrics.md).", hist_help[HM_TOKENS_PER_EVENT]);
	pb_family *f = family_new(r, name, text, IO__PROMETHEUS__CLIENT__METRIC_TYPE__HISTOGRAM, gs->n);
	for (size_t i = 0; f && i < gs->n; i++) {
		const struct hist *h = gs->g[i].slice.slot[HM_TOKENS_PER_EVENT];
		pb_metric *m = group_metric(r, i, 0);
		pb_hist *ph = arena_alloc(&r->arena, 1, sizeof(*ph));
		pb_bucket *b = arena_alloc(&r->arena, le_n + 1, sizeof(*b));
		pb_bucket **bp = arena_alloc(&r->arena, le_n + 1, sizeof(*bp));
		uint64_t *cum = arena_alloc(&r->arena, le_n, sizeof(*cum));
		if (!m || !ph || !b || !bp || !cum)
			break;
		io__prometheus__client__histogram__init(ph);
		ph->has_sample_count = ph->has_sample_sum = true;
		ph->sample_count = h ? h->count : 0;
		ph->sample_sum = h && h->count ? (double)h->sum : 0.0;
		prom_tpe_counts(h, cum);
		for (size_t k = 0; k <= le_n; k++) {
			io__prometheus__client__bucket__init(&b[k]);
			b[k].has_cumulative_count = b[k].has_upper_bound = true;
			b[k].cumulative_count = k < le_n ? cum[k] : ph->sample_count;
			b[k].upper_bound = k < le_n ? (double)prom_tpe_le(k) : INFINITY;
			bp[k] = &b[k];
		}
		ph->bucket = bp;
		ph->n_bucket = le_n + 1;
		m->histogram = ph;
		f->metric[f->n_metric++] = m;
	}
	family_done(r, f);

	snprintf(name, sizeof(name), "%stokens_per_event_streams_total", r->pre);
	f = family_new(r, name, PROM_TPE_STREAMS_HELP, IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER, gs->n);
	for (size_t i = 0; f && i < gs->n; i++) {
		const struct hist *h = gs->g[i].slice.slot[HM_REQUEST_TOKENS_PER_EVENT];
		pb_metric *m = counter_metric(r, i, 0, h ? h->count : 0);
		if (!m)
			break;
		f->metric[f->n_metric++] = m;
	}
	family_done(r, f);
}

static void counter_families(struct render *r)
{
	const struct stats_groups *gs = r->gs;
	const unsigned classes = CT_STATUS_5XX - CT_STATUS_NONE + 1, kinds = REQ_ERR__COUNT - 1;
	char name[96];
	pb_family *f;

	snprintf(name, sizeof(name), "%srequests_total", r->pre);
	f = family_new(r, name, "Requests finished, by status class (none: no status was sent).",
		       IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER, gs->n * classes);
	for (size_t i = 0; f && i < gs->n; i++)
		for (unsigned c = CT_STATUS_NONE; c <= CT_STATUS_5XX; c++) {
			pb_metric *m = counter_metric(r, i, 1, gs->g[i].slice.counters[c]);
			if (!m)
				break;
			label_add(m, "status_class", slice_counter_name(c) + strlen("status_"));
			f->metric[f->n_metric++] = m;
		}
	family_done(r, f);

	snprintf(name, sizeof(name), "%serrors_total", r->pre);
	f = family_new(r, name, "Requests that did not complete normally, by kind.",
		       IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER, gs->n * kinds);
	for (size_t i = 0; f && i < gs->n; i++)
		for (unsigned e = REQ_ERR_NONE + 1; e < REQ_ERR__COUNT; e++) {
			pb_metric *m = counter_metric(r, i, 1, gs->g[i].slice.counters[CT_ERR_BASE + e]);
			if (!m)
				break;
			label_add(m, "kind", req_error_name((enum req_error)e));
			f->metric[f->n_metric++] = m;
		}
	family_done(r, f);

	for (unsigned c = 0; c < CT_ERR_BASE; c++) {
		const char *help = prom_counter_help(c);
		if (!help)
			continue;
		snprintf(name, sizeof(name), "%s%s_total", r->pre, slice_counter_name(c));
		f = family_new(r, name, help, IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER, gs->n);
		for (size_t i = 0; f && i < gs->n; i++) {
			pb_metric *m = counter_metric(r, i, 0, gs->g[i].slice.counters[c]);
			if (!m)
				break;
			f->metric[f->n_metric++] = m;
		}
		family_done(r, f);
	}
}

static int gauge_by_name(const void *a, const void *b)
{
	return strcmp(((const struct upstream_gauge *)a)->name, ((const struct upstream_gauge *)b)->name);
}

/* The engine's view per scraped upstream (prom_engine_families), as the
 * text exposition writes it. */
static void engine_families(struct render *r, const struct upstream_gauge *g, size_t n)
{
	struct prom_engine_family ef[PROM_ENGINE_FAMILIES];

	if (prom_engine_families(g, n, clock_now_ns(), ef) == -1) {
		r->failed = true;
		return;
	}
	for (unsigned k = 0; !r->failed && k < PROM_ENGINE_FAMILIES; k++) {
		if (!ef[k].n)
			continue;
		pb_family *f = family_new(r, ef[k].name, ef[k].help,
					  ef[k].counter ? IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER
							: IO__PROMETHEUS__CLIENT__METRIC_TYPE__GAUGE,
					  ef[k].n);
		for (size_t i = 0; f && i < ef[k].n; i++) {
			pb_metric *m = arena_alloc(&r->arena, 1, sizeof(*m));
			pb_label *l = arena_alloc(&r->arena, 2, sizeof(*l));
			pb_label **lp = arena_alloc(&r->arena, 2, sizeof(*lp));
			pb_gauge *ga = arena_alloc(&r->arena, 1, sizeof(*ga));
			pb_counter *c = arena_alloc(&r->arena, 1, sizeof(*c));
			if (!m || !l || !lp || !ga || !c) {
				r->arena.failed = true;
				break;
			}
			io__prometheus__client__metric__init(m);
			for (unsigned j = 0; j < 2; j++) {
				io__prometheus__client__label_pair__init(&l[j]);
				lp[j] = &l[j];
			}
			l[0].name = "upstream";
			l[0].value = (char *)ef[k].s[i].upstream;
			l[1].name = (char *)ef[k].label;
			l[1].value = (char *)ef[k].s[i].label_value;
			m->label = lp;
			m->n_label = ef[k].label ? 2 : 1;
			if (ef[k].counter) {
				io__prometheus__client__counter__init(c);
				c->has_value = true;
				c->value = ef[k].s[i].value;
				m->counter = c;
			} else {
				io__prometheus__client__gauge__init(ga);
				ga->has_value = true;
				ga->value = ef[k].s[i].value;
				m->gauge = ga;
			}
			f->metric[f->n_metric++] = m;
		}
		family_done(r, f);
	}
	prom_engine_families_free(ef);
}

/* tokentap_in_flight and tokentap_queued by upstream, as prom_render_gauges
 * writes them: entries of one name added up, names sorted. */
static void gauge_families(struct render *r, const struct upstream_gauge *g, size_t n)
{
	static const struct {
		const char *name, *help;
	} families[] = {
		{ "tokentap_in_flight", "Requests admitted to the upstream and running now, all workers." },
		{ "tokentap_queued", "Requests waiting for an admission slot of the upstream now (max_concurrency)." },
	};
	struct upstream_gauge *sorted = n ? malloc(n * sizeof(*sorted)) : NULL;

	if (n && !sorted) {
		r->failed = true;
		return;
	}
	if (n) {
		memcpy(sorted, g, n * sizeof(*sorted));
		qsort(sorted, n, sizeof(*sorted), gauge_by_name);
	}
	for (size_t fi = 0; fi < 2; fi++) {
		pb_family *f = family_new(r, families[fi].name, families[fi].help,
					  IO__PROMETHEUS__CLIENT__METRIC_TYPE__GAUGE, n);
		for (size_t i = 0; f && i < n;) {
			double v = 0;
			size_t j = i;
			for (; j < n && strcmp(sorted[j].name, sorted[i].name) == 0; j++)
				v += fi == 0 ? sorted[j].in_flight : sorted[j].queued;
			pb_metric *m = arena_alloc(&r->arena, 1, sizeof(*m));
			pb_label *l = arena_alloc(&r->arena, 1, sizeof(*l));
			pb_label **lp = arena_alloc(&r->arena, 1, sizeof(*lp));
			pb_gauge *ga = arena_alloc(&r->arena, 1, sizeof(*ga));
			if (!m || !l || !lp || !ga)
				break;
			io__prometheus__client__metric__init(m);
			io__prometheus__client__label_pair__init(l);
			io__prometheus__client__gauge__init(ga);
			l->name = "upstream";
			l->value = sorted[i].name;
			lp[0] = l;
			m->label = lp;
			m->n_label = 1;
			ga->has_value = true;
			ga->value = v;
			m->gauge = ga;
			f->metric[f->n_metric++] = m;
			i = j;
		}
		family_done(r, f);
	}
	/* the upstreams' own counters (UPSTREAM_COUNTERS), as prom.c names them */
	for (unsigned c = 0; c < UPC__COUNT; c++) {
		char name[96];
		snprintf(name, sizeof(name), "tokentap_upstream_%s_total", upstream_counter_keys[c]);
		pb_family *f =
			family_new(r, name, upstream_counter_help[c], IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER, n);
		for (size_t i = 0; f && i < n;) {
			uint64_t v = 0;
			size_t j = i;
			for (; j < n && strcmp(sorted[j].name, sorted[i].name) == 0; j++)
				v += sorted[j].counters[c];
			pb_metric *m = arena_alloc(&r->arena, 1, sizeof(*m));
			pb_label *l = arena_alloc(&r->arena, 1, sizeof(*l));
			pb_label **lp = arena_alloc(&r->arena, 1, sizeof(*lp));
			pb_counter *co = arena_alloc(&r->arena, 1, sizeof(*co));
			if (!m || !l || !lp || !co)
				break;
			io__prometheus__client__metric__init(m);
			io__prometheus__client__label_pair__init(l);
			io__prometheus__client__counter__init(co);
			l->name = "upstream";
			l->value = sorted[i].name;
			lp[0] = l;
			m->label = lp;
			m->n_label = 1;
			co->has_value = true;
			co->value = (double)v;
			m->counter = co;
			f->metric[f->n_metric++] = m;
			i = j;
		}
		family_done(r, f);
	}
	free(sorted);
	engine_families(r, g, n);
}

int prom_render_proto(struct evbuffer *out, const struct store_result *res, const struct upstream_gauge *g, size_t n)
{
	struct stats_query q = { .window = WIN_ALL, .cold = COLD_INCLUDE };
	struct stats_groups gs;
	struct render r = { .out = out, .gs = &gs, .pre = "tokentap_" };

	tables();
	if (stats_groups_build(res, &q, &gs) == -1)
		return -1;
	r.native = malloc(PROM_NATIVE_SPAN * sizeof(*r.native));
	if (!r.native)
		r.failed = true;
	for (unsigned m = 0; !r.failed && m < HM__COUNT; m++)
		if (hist_metric_unit((enum hist_metric)m) == UNIT_US)
			histogram_family(&r, (enum hist_metric)m, hist_help[m]);
	if (!r.failed)
		tokens_per_event_families(&r);
	if (!r.failed)
		counter_families(&r);
	if (!r.failed)
		gauge_families(&r, g, n);
	arena_clear(&r.arena);
	free(r.arena.p);
	free(r.native);
	stats_groups_free(&gs);
	return r.failed ? -1 : 0;
}

int prom_render_proto_tenants(struct evbuffer *out, const struct store_result *res)
{
	struct stats_query q = { .window = WIN_ALL, .cold = COLD_INCLUDE, .by_tenant = true };
	struct stats_groups gs;
	struct render r = { .out = out, .gs = &gs, .pre = "tokentap_tenant_", .tenant = true };

	tables();
	if (stats_groups_build(res, &q, &gs) == -1)
		return -1;
	r.native = malloc(PROM_NATIVE_SPAN * sizeof(*r.native));
	if (!r.native)
		r.failed = true;
	/* the text format's tenant families: TTFT, end to end, the counters */
	if (!r.failed)
		histogram_family(&r, HM_TTFT, hist_help[HM_TTFT]);
	if (!r.failed)
		histogram_family(&r, HM_E2E, hist_help[HM_E2E]);
	if (!r.failed)
		counter_families(&r);
	arena_clear(&r.arena);
	free(r.arena.p);
	free(r.native);
	stats_groups_free(&gs);
	return r.failed ? -1 : 0;
}

int prom_render_proto_counters(struct evbuffer *out, const struct prom_counter_family *fams, size_t nf)
{
	struct render r = { .out = out };

	for (size_t i = 0; !r.failed && i < nf; i++) {
		const struct prom_counter_family *cf = &fams[i];
		pb_family *f = family_new(&r, cf->name, cf->help, IO__PROMETHEUS__CLIENT__METRIC_TYPE__COUNTER, cf->n);
		for (size_t k = 0; f && k < cf->n; k++) {
			pb_metric *m = arena_alloc(&r.arena, 1, sizeof(*m));
			pb_counter *c = arena_alloc(&r.arena, 1, sizeof(*c));
			size_t nl = cf->nlabels ? cf->nlabels : 1;
			pb_label *l = arena_alloc(&r.arena, nl, sizeof(*l));
			pb_label **lp = arena_alloc(&r.arena, nl, sizeof(*lp));
			if (!m || !c || !l || !lp)
				break;
			io__prometheus__client__metric__init(m);
			io__prometheus__client__counter__init(c);
			c->has_value = true;
			c->value = (double)cf->counts[k];
			m->counter = c;
			if (cf->nlabels) {
				for (size_t j = 0; j < nl; j++) {
					io__prometheus__client__label_pair__init(&l[j]);
					l[j].name = (char *)cf->label_names[j];
					l[j].value = (char *)cf->values[k * nl + j];
					lp[j] = &l[j];
				}
				m->label = lp;
				m->n_label = nl;
			} else if (cf->label) {
				io__prometheus__client__label_pair__init(l);
				l->name = (char *)cf->label;
				l->value = (char *)cf->values[k];
				lp[0] = l;
				m->label = lp;
				m->n_label = 1;
			}
			f->metric[f->n_metric++] = m;
		}
		if (!f)
			r.arena.failed = true;
		family_flush(&r, f);
	}
	arena_clear(&r.arena);
	free(r.arena.p);
	return r.failed ? -1 : 0;
}
