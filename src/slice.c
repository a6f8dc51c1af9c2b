/*
 * slice.c — recording into, merging and encoding series slices.
 *
 * Encoded form (version 2): byte 2; varint number of counters, then each
 * counter; varint number of histograms, then for each: varint slot, varint
 * byte length, and the histogram's own sparse encoding (hist_encode). Counts
 * of counters and slots are written, so a reader with fewer of either
 * rejects nothing it understands and a newer layout bumps the version byte.
 *
 * Version 1 (before #15) had 11 counters before the error kinds and 12
 * histogram metrics before the load curves, and one prompt curve keyed on
 * the prompt as reported. It is still read: its counters and slots are
 * moved to today's positions, and its prompt curve, kept before any
 * caching was reported, fills both of today's (by prefill and raw).
 */
#include "slice.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"

#define SLICE_ENCODING_VERSION 2

/* Version 1's layout, frozen. */
#define V1_COUNTERS 11 /* REQUESTS .. SLO_MISSED; the error kinds follow */
#define V1_METRICS 12  /* TTFT .. INFLIGHT; the curves follow */
#define V1_SLOTS (V1_METRICS + CURVE__COUNT * INFLIGHT_BUCKETS + PROMPT_BUCKETS)
_Static_assert(CT_SLO_MISSED + 1 == V1_COUNTERS && HM_INFLIGHT + 1 == V1_METRICS,
	       "version 1's counters and metrics keep their positions");

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

	for (unsigned i = 0; i < HM__COUNT; i++)
		if (metric_sources[i] != RM_NONE)
			record_milli(s, i, m[metric_sources[i]]);
	if (load) {
		record_milli(s, SLOT_CURVE(CURVE_TTFT, ib), m[RM_TTFT]);
		record_milli(s, SLOT_CURVE(CURVE_E2E, ib), m[RM_E2E]);
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
			hist_init(s->slot[i]);
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
	size_t cap = 1 + VARINT_MAX * (CT__COUNT + 2), n = 0, nh = 0;
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

/* Where slot i of a version-1 slice is today (its prompt curve: the one by
 * prefill; the raw one is filled from it once decoded). */
static uint64_t v1_slot(uint64_t i)
{
	return i < V1_METRICS ? i : i - V1_METRICS + HM__COUNT;
}

int slice_decode_merge(struct slice *dst, const uint8_t *in, size_t len)
{
	const uint8_t *p = in, *end = in + len;
	struct slice tmp;
	uint64_t nc, nh, v;
	int rc = -1;

	memset(&tmp, 0, sizeof(tmp));
	if (len < 1 || (*p != SLICE_ENCODING_VERSION && *p != 1))
		return -1;
	const bool v1 = *p++ == 1;
	const uint64_t slots = v1 ? V1_SLOTS : SLICE_SLOTS;
	if (varint_get(&p, end, &nc) == -1 || nc > 4096)
		return -1;
	for (uint64_t i = 0; i < nc; i++) {
		if (varint_get(&p, end, &v) == -1)
			goto out;
		uint64_t at = v1 ? v1_counter(i) : i;
		if (at < CT__COUNT)
			tmp.counters[at] = v; /* counters a newer writer added are skipped */
	}
	if (varint_get(&p, end, &nh) == -1 || nh > slots)
		goto out;
	for (uint64_t i = 0; i < nh; i++) {
		uint64_t slot, hlen;
		size_t used;
		struct hist *h;
		if (varint_get(&p, end, &slot) == -1 || slot >= slots || varint_get(&p, end, &hlen) == -1 ||
		    hlen > (uint64_t)(end - p))
			goto out;
		if (v1)
			slot = v1_slot(slot);
		if (!(h = slice_hist(&tmp, (unsigned)slot)))
			goto out;
		if (hist_decode_merge(h, p, (size_t)hlen, &used) == -1 || used != hlen)
			goto out;
		p += hlen;
	}
	if (p != end)
		goto out;
	for (unsigned b = 0; v1 && b < PROMPT_BUCKETS; b++) {
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
