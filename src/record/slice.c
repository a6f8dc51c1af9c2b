/*
 * slice.c — recording into, merging and encoding series slices.
 *
 * Encoded form (version 3): byte 3; varint number of counters, then each
 * counter; the writer's layout of histograms, a count per kind: varint
 * number of kinds, then the number of metrics (HIST_METRICS rows), of load
 * curves (INFLIGHT_BUCKETS slots each) and of prompt curves
 * (PROMPT_BUCKETS slots each); varint number of histograms, then for each:
 * varint slot in that layout, varint byte length, and the histogram's own
 * sparse encoding (hist_encode). Counters and rows are appended, never
 * moved: a reader maps each slot through the writer's layout, reads rows it
 * lacks as empty and skips rows it does not know, so a new counter, metric
 * or curve needs no new version.
 *
 * Version 2 (written from when answer TTFT, reasoning and the cache and
 * reasoning token counts were added) wrote no layout: its slots were
 * today's positions with 14 metrics, 3 load curves and 2 prompt curves.
 * Version 1 (before those) had 11
 * counters before the error kinds and 12 histogram metrics before the load
 * curves, and one prompt curve keyed on the prompt as reported. Both are
 * still read: their slots go through their frozen layout like a version-3
 * one's, and version 1's prompt curve, kept before any caching was
 * reported, fills both of today's (by prefill and raw).
 */
#include "slice.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"

#define SLICE_ENCODING_VERSION 3

/* A histogram layout: how many of each kind of row, in slot order. */
enum layout_kind { LK_METRICS, LK_CURVES, LK_PROMPTS, LK__COUNT };
static const unsigned kind_width[LK__COUNT] = { 1, INFLIGHT_BUCKETS, PROMPT_BUCKETS };
/* A layout's rows, at most (a bound on the input, far above any writer). */
#define LAYOUT_ROWS_MAX 1024

/* Today's layout, and the frozen ones of versions 1 and 2. */
static const uint64_t layout_now[LK__COUNT] = { HM__COUNT, CURVE__COUNT, PROMPT_CURVES };
static const uint64_t layout_v2[LK__COUNT] = { 14, 3, 2 };
static const uint64_t layout_v1[LK__COUNT] = { 12, 3, 1 };
#define V1_COUNTERS 11 /* REQUESTS .. SLO_MISSED; the error kinds follow */
_Static_assert(CT_SLO_MISSED + 1 == V1_COUNTERS && HM_INFLIGHT + 1 == 12 && HM_REASONING + 1 == 14 &&
		       CURVE_E2E + 1 == 3 && PROMPT_CURVES == 2,
	       "the rows of versions 1 and 2 keep their positions");
_Static_assert(ENGINE_QUEUE_BUCKETS == INFLIGHT_BUCKETS, "the engine-queue rows are load-curve rows");

static const char *const metric_names[] = {
#define X(e, n, u, src, help) #n,
	HIST_METRICS(X)
#undef X
};

static const enum metric_unit metric_units[] = {
#define X(e, n, u, src, help) u,
	HIST_METRICS(X)
#undef X
};

static const enum req_metric metric_sources[] = {
#define X(e, n, u, src, help) src,
	HIST_METRICS(X)
#undef X
};

static const char *const counter_names[CT__COUNT] = {
#define X(e, n, exported, help) #n,
	SLICE_COUNTERS(X)
#undef X
#define X(e, n) "errors_" n,
		REQUEST_ERRORS(X)
#undef X
};

const char *hist_metric_name(enum hist_metric m)
{
	return metric_names[m];
}

enum metric_unit hist_metric_unit(enum hist_metric m)
{
	return metric_units[m];
}

const char *slice_counter_name(unsigned c)
{
	return c < CT__COUNT ? counter_names[c] : "unknown";
}

unsigned log2_bucket(uint64_t v, unsigned n)
{
	unsigned b = v <= 1 ? 0 : 64u - (unsigned)__builtin_clzll(v - 1);
	return b < n ? b : n - 1;
}

uint64_t log2_bucket_low(unsigned b)
{
	return b == 0 ? 0 : ((uint64_t)1 << (b - 1)) + 1;
}

uint64_t log2_bucket_high(unsigned b, unsigned n)
{
	return b + 1 >= n ? UINT64_MAX : (uint64_t)1 << b;
}

unsigned engine_queue_bucket(uint64_t waiting)
{
	return log2_bucket(waiting < UINT64_MAX ? waiting + 1 : waiting, ENGINE_QUEUE_BUCKETS);
}

uint64_t engine_queue_low(unsigned b)
{
	return b == 0 ? 0 : log2_bucket_low(b) - 1;
}

uint64_t engine_queue_high(unsigned b)
{
	uint64_t hi = log2_bucket_high(b, ENGINE_QUEUE_BUCKETS);
	return hi == UINT64_MAX ? hi : hi - 1;
}

struct hist *slice_hist(struct slice *s, unsigned slot)
{
	if (!s->slot[slot]) {
		s->slot[slot] = malloc(sizeof(struct hist));
		if (s->slot[slot])
			hist_init(s->slot[slot]);
	}
	return s->slot[slot];
}

/* Records `v`, a value in its shown unit (ms, tokens/s), in thousandths of
 * it (µs, milli-tokens/s), as the slot stores it; NaN or negative: not
 * recorded. */
static void record_milli(struct slice *s, unsigned slot, double v)
{
	struct hist *h;
	if (isnan(v) || v < 0 || !(h = slice_hist(s, slot)))
		return;
	hist_record(h, (uint64_t)llround(v * 1000.0));
}

void slice_record_request(struct slice *s, const struct req_record *r, unsigned load, const struct slo *slo)
{
	double m[RM__COUNT];
	unsigned ib = log2_bucket(load, INFLIGHT_BUCKETS);
	struct hist *h;

	record_derive(r, m);
	s->counters[CT_REQUESTS]++;
	s->counters[r->status >= 100 && r->status < 600 ? CT_STATUS_1XX + (unsigned)(r->status / 100 - 1)
							: CT_STATUS_NONE]++;
	if (r->error != REQ_ERR_NONE)
		s->counters[CT_ERR_BASE + r->error]++;
	if (r->usage.input_tokens >= 0) {
		s->counters[CT_INPUT_TOKENS] += (uint64_t)r->usage.input_tokens;
		if ((h = slice_hist(s, HM_INPUT_TOKENS)))
			hist_record(h, (uint64_t)r->usage.input_tokens);
	}
	if (r->usage.output_tokens >= 0 || r->token_events) {
		uint64_t out = (uint64_t)record_output_tokens(r);
		s->counters[CT_OUTPUT_TOKENS] += out;
		if ((h = slice_hist(s, HM_OUTPUT_TOKENS)))
			hist_record(h, out);
	}
	if (load && (h = slice_hist(s, HM_INFLIGHT)))
		hist_record(h, load);

	/* What neither side accounts for comes out a little below 0 when the
	 * clocks disagree: kept as 0, so that every request whose server
	 * reported timings counts. */
	if (m[RM_UNATTRIBUTED] < 0)
		m[RM_UNATTRIBUTED] = 0;
	for (unsigned i = 0; i < HM__COUNT; i++)
		if (metric_sources[i] != RM_NONE)
			record_milli(s, i, m[metric_sources[i]]);
	if (load) {
		record_milli(s, SLOT_CURVE(CURVE_TTFT, ib), m[RM_TTFT]);
		record_milli(s, SLOT_CURVE(CURVE_E2E, ib), m[RM_E2E]);
	}
	if (r->engine.known && r->engine.fresh && r->engine.waiting >= 0) {
		unsigned qb = engine_queue_bucket((uint64_t)r->engine.waiting);
		record_milli(s, SLOT_CURVE(CURVE_QUEUE_TTFT, qb), m[RM_TTFT]);
		record_milli(s, SLOT_CURVE(CURVE_QUEUE_E2E, qb), m[RM_E2E]);
	}
	/* Cached tokens count only with the input they are part of, so that
	 * the hit ratio (cached / cache_reported_input) stays within 1. */
	if (r->usage.cached_tokens >= 0 && r->usage.input_tokens >= 0)
		s->counters[CT_CACHED_TOKENS] += (uint64_t)r->usage.cached_tokens;
	if (r->usage.cache_write_tokens >= 0)
		s->counters[CT_CACHE_WRITE_TOKENS] += (uint64_t)r->usage.cache_write_tokens;
	if (r->usage.reasoning_tokens >= 0)
		s->counters[CT_REASONING_TOKENS] += (uint64_t)r->usage.reasoning_tokens;
	if (r->usage.input_tokens >= 0) {
		uint64_t in = (uint64_t)r->usage.input_tokens, prefill = in;
		if (r->usage.cached_tokens >= 0) {
			s->counters[CT_CACHE_REPORTED_INPUT_TOKENS] += in;
			prefill = (uint64_t)r->usage.cached_tokens < in ? in - (uint64_t)r->usage.cached_tokens : 0;
		}
		record_milli(s, SLOT_PROMPT(log2_bucket(prefill, PROMPT_BUCKETS)), m[RM_TTFT]);
		record_milli(s, SLOT_PROMPT_RAW(log2_bucket(in, PROMPT_BUCKETS)), m[RM_TTFT]);
	}

	/* Goodput: a streamed request with tokens meets the SLO when its ttft,
	 * its mean inter-token time and (when set) its longest inter-token gap
	 * are all within bounds; a failed one misses it; non-streamed successes
	 * are judged by none. */
	if (r->error != REQ_ERR_NONE || r->status >= 500) {
		s->counters[CT_SLO_MISSED]++;
	} else if (!isnan(m[RM_TTFT])) {
		bool ok = m[RM_TTFT] * 1000.0 <= (double)slo->ttft_us &&
			  (isnan(m[RM_TPOT]) || m[RM_TPOT] * 1000.0 <= (double)slo->tpot_us) &&
			  (!slo->itl_us || r->itl_total == 0 || r->itl_max <= slo->itl_us * 1000);
		s->counters[ok ? CT_SLO_MET : CT_SLO_MISSED]++;
	}
}

bool slice_empty(const struct slice *s)
{
	for (unsigned i = 0; i < CT__COUNT; i++)
		if (s->counters[i])
			return false;
	for (unsigned i = 0; i < SLICE_SLOTS; i++)
		if (s->slot[i] && s->slot[i]->count)
			return false;
	return true;
}

void slice_merge(struct slice *dst, const struct slice *src)
{
	for (unsigned i = 0; i < CT__COUNT; i++)
		dst->counters[i] += src->counters[i];
	for (unsigned i = 0; i < SLICE_SLOTS; i++) {
		struct hist *h;
		if (src->slot[i] && src->slot[i]->count && (h = slice_hist(dst, i)))
			hist_merge(h, src->slot[i]);
	}
}

void slice_clear(struct slice *s)
{
	memset(s->counters, 0, sizeof(s->counters));
	for (unsigned i = 0; i < SLICE_SLOTS; i++)
		if (s->slot[i] && s->slot[i]->count)
			hist_clear(s->slot[i]);
}

void slice_release(struct slice *s)
{
	for (unsigned i = 0; i < SLICE_SLOTS; i++) {
		free(s->slot[i]);
		s->slot[i] = NULL;
	}
	memset(s->counters, 0, sizeof(s->counters));
}

void slice_drop_curves(struct slice *s)
{
	for (unsigned i = HM__COUNT; i < SLICE_SLOTS; i++) {
		free(s->slot[i]);
		s->slot[i] = NULL;
	}
}

size_t slice_encode(const struct slice *s, uint8_t **out)
{
	size_t cap = 1 + VARINT_MAX * (CT__COUNT + LK__COUNT + 3), n = 0, nh = 0;
	uint8_t *buf;

	for (unsigned i = 0; i < SLICE_SLOTS; i++) {
		if (s->slot[i] && s->slot[i]->count) {
			cap += 2 * VARINT_MAX + hist_encoded_max(s->slot[i]);
			nh++;
		}
	}
	buf = malloc(cap);
	if (!buf)
		return 0;
	buf[n++] = SLICE_ENCODING_VERSION;
	n += varint_put(buf + n, CT__COUNT);
	for (unsigned i = 0; i < CT__COUNT; i++)
		n += varint_put(buf + n, s->counters[i]);
	n += varint_put(buf + n, LK__COUNT);
	for (unsigned k = 0; k < LK__COUNT; k++)
		n += varint_put(buf + n, layout_now[k]);
	n += varint_put(buf + n, nh);
	for (unsigned i = 0; i < SLICE_SLOTS; i++) {
		if (!s->slot[i] || !s->slot[i]->count)
			continue;
		uint8_t tmp[VARINT_MAX];
		n += varint_put(buf + n, i);
		/* length first: encode after a gap sized for the length varint */
		size_t len = hist_encode(s->slot[i], buf + n + VARINT_MAX, cap - n - VARINT_MAX);
		if (!len) {
			free(buf);
			return 0;
		}
		size_t ll = varint_put(tmp, len);
		memcpy(buf + n, tmp, ll);
		memmove(buf + n + ll, buf + n + VARINT_MAX, len);
		n += ll + len;
	}
	/* The buffer was sized for the worst case, often a hundred times the
	 * encoding; the store keeps each one for the whole live ring (six
	 * minutes, one per series per worker per second), so it is given back
	 * its exact size. */
	uint8_t *exact = realloc(buf, n);
	*out = exact ? exact : buf;
	return n;
}

/* Where counter i of a version-1 slice is today. */
static uint64_t v1_counter(uint64_t i)
{
	return i < V1_COUNTERS ? i : i - V1_COUNTERS + CT_ERR_BASE;
}

/* The writer's slots in all, under its layout. */
static uint64_t layout_slots(const uint64_t layout[LK__COUNT])
{
	uint64_t n = 0;
	for (unsigned k = 0; k < LK__COUNT; k++)
		n += layout[k] * kind_width[k];
	return n;
}

/* Where slot `slot` of the writer's layout is today: SLICE_SLOTS for a row
 * this reader does not have (skipped), -1 past the layout (malformed). */
static int64_t layout_map(const uint64_t layout[LK__COUNT], uint64_t slot)
{
	uint64_t base = 0;
	for (unsigned k = 0; k < LK__COUNT; k++) {
		uint64_t n = layout[k] * kind_width[k];
		if (slot < n) {
			uint64_t row = slot / kind_width[k], b = slot % kind_width[k];
			if (row >= layout_now[k])
				return SLICE_SLOTS;
			return (int64_t)(base + row * kind_width[k] + b);
		}
		slot -= n;
		base += layout_now[k] * kind_width[k];
	}
	return -1;
}

int slice_decode_merge(struct slice *dst, const uint8_t *in, size_t len)
{
	const uint8_t *p = in, *end = in + len;
	struct slice tmp;
	uint64_t nc, nh, v, layout[LK__COUNT];
	bool more_kinds = false;
	int rc = -1;

	memset(&tmp, 0, sizeof(tmp));
	if (len < 1 || *p < 1 || *p > SLICE_ENCODING_VERSION)
		return -1;
	const unsigned version = *p++;
	if (varint_get(&p, end, &nc) == -1 || nc > 4096)
		return -1;
	for (uint64_t i = 0; i < nc; i++) {
		if (varint_get(&p, end, &v) == -1)
			goto out;
		uint64_t at = version == 1 ? v1_counter(i) : i;
		if (at < CT__COUNT)
			tmp.counters[at] = v; /* counters a newer writer added are skipped */
	}
	if (version >= 3) {
		uint64_t nk;
		if (varint_get(&p, end, &nk) == -1 || nk < LK__COUNT || nk > 64)
			goto out;
		for (uint64_t k = 0; k < nk; k++) {
			if (varint_get(&p, end, &v) == -1 || v > LAYOUT_ROWS_MAX)
				goto out;
			/* kinds a newer writer added after ours: their slots
			 * follow all of ours and are skipped */
			if (k < LK__COUNT)
				layout[k] = v;
			else if (v)
				more_kinds = true;
		}
	} else {
		memcpy(layout, version == 1 ? layout_v1 : layout_v2, sizeof(layout));
	}
	const uint64_t slots = layout_slots(layout);
	if (varint_get(&p, end, &nh) == -1 || nh > (more_kinds ? (uint64_t)(end - p) : slots))
		goto out;
	for (uint64_t i = 0; i < nh; i++) {
		uint64_t slot, hlen;
		int64_t at;
		size_t used;
		struct hist *h;
		if (varint_get(&p, end, &slot) == -1 || varint_get(&p, end, &hlen) == -1 || hlen > (uint64_t)(end - p))
			goto out;
		if ((at = layout_map(layout, slot)) < 0) {
			if (!more_kinds)
				goto out;
			at = SLICE_SLOTS;
		}
		if (at < SLICE_SLOTS) {
			if (!(h = slice_hist(&tmp, (unsigned)at)))
				goto out;
			if (hist_decode_merge(h, p, (size_t)hlen, &used) == -1 || used != hlen)
				goto out;
		}
		p += hlen;
	}
	if (p != end)
		goto out;
	for (unsigned b = 0; version == 1 && b < PROMPT_BUCKETS; b++) {
		const struct hist *h = tmp.slot[SLOT_PROMPT(b)];
		struct hist *raw;
		if (h && h->count) {
			if (!(raw = slice_hist(&tmp, SLOT_PROMPT_RAW(b))))
				goto out;
			hist_merge(raw, h);
		}
	}
	slice_merge(dst, &tmp);
	rc = 0;
out:
	slice_release(&tmp);
	return rc;
}
