/*
 * hist.c — bucket geometry, quantiles and the storage encoding of struct hist.
 *
 * Recording lives in hist.h (inline, on the hot path); everything here runs
 * on a timer or a query, over at most HIST_BUCKETS buckets.
 *
 * Bucket geometry, the inverse of hist_index(): idx < 128 holds the value
 * idx. Up to HIST_LIN_BUCKETS, idx = (s << 6) + q with q in [64, 128) holds
 * [q << s, ((q + 1) << s) - 1]. Above, idx = HIST_LIN_BUCKETS +
 * (m - 10) * HIST_SUB + k holds the values of octave m whose 12-bit mantissa
 * f has hist_sub_of[f] == k, that is f in [sub_low[k], sub_low[k + 1]):
 * from 2^m + ceil(sub_low[k] * 2^m / 4096) up to the next bucket's low - 1. The
 * last bucket is stretched to UINT64_MAX because hist_index() clamps into
 * it.
 *
 * The table is fixed data: sub_low[k] = ceil(4096 * 2^(k/36)) - 4096, the
 * first mantissa of bucket k. 2^(k/36) is irrational for 0 < k < 36, never
 * within rounding of a multiple of 1/4096, so every libm computes the same
 * table; test_hist checks the geometry it implies value by value.
 *
 * The decoder treats its input as hostile (it reads LMDB pages and, later,
 * fuzzer output): every read is bounds-checked, every count is checked
 * against the invariants in hist.h, and it runs twice over the input — once
 * to validate, once to apply — so that a bad slice never half-merges.
 */
#include "hist.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "varint.h"

/* sub_low[k]: the first 12-bit mantissa of bucket k of an octave; one past
 * the last for k == HIST_SUB. Filled with hist_sub_of before main(). */
static uint16_t sub_low[HIST_SUB + 1];
uint8_t hist_sub_of[1u << HIST_MANT_BITS];

__attribute__((constructor)) static void hist_tables(void)
{
	uint8_t *of = hist_sub_of;
	const unsigned n = 1u << HIST_MANT_BITS;

	for (unsigned k = 0; k <= HIST_SUB; k++)
		sub_low[k] = (uint16_t)(k == HIST_SUB ? n : (unsigned)ceill(n * exp2l((long double)k / HIST_SUB)) - n);
	for (unsigned k = 0; k < HIST_SUB; k++)
		for (unsigned f = sub_low[k]; f < sub_low[k + 1]; f++)
			of[f] = (uint8_t)k;
}

void hist_init(struct hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

void hist_clear(struct hist *h)
{
	if (h->count) {
		unsigned lo = hist_index(h->min), hi = hist_index(h->max);
		memset(h->buckets + lo, 0, (hi - lo + 1) * sizeof(h->buckets[0]));
	}
	h->count = h->sum = h->max = 0;
	h->min = UINT64_MAX;
}

void hist_record_n(struct hist *h, uint64_t v, uint64_t n)
{
	/* n == 0 must not touch min/max: an empty histogram keeps its
	 * canonical min = UINT64_MAX, max = 0. */
	if (n == 0)
		return;
	h->count += n;
	h->sum += v * n;
	if (v < h->min)
		h->min = v;
	if (v > h->max)
		h->max = v;
	h->buckets[hist_index(v)] += n;
}

void hist_merge(struct hist *dst, const struct hist *src)
{
	if (src->count == 0)
		return;
	dst->count += src->count;
	dst->sum += src->sum;
	if (src->min < dst->min)
		dst->min = src->min;
	if (src->max > dst->max)
		dst->max = src->max;
	for (unsigned i = 0; i < HIST_BUCKETS; i++)
		dst->buckets[i] += src->buckets[i];
	assert(hist_consistent(dst));
}

bool hist_consistent(const struct hist *h)
{
	uint64_t total = 0;
	int first = -1, last = -1;
	for (unsigned i = 0; i < HIST_BUCKETS; i++) {
		total += h->buckets[i];
		if (h->buckets[i]) {
			if (first < 0)
				first = (int)i;
			last = (int)i;
		}
	}
	if (total != h->count)
		return false;
	if (h->count == 0)
		return h->min == UINT64_MAX && h->max == 0;
	return h->min <= h->max && (int)hist_index(h->min) == first && (int)hist_index(h->max) == last;
}

uint64_t hist_bucket_low(unsigned idx)
{
	if (idx >= HIST_BUCKETS)
		idx = HIST_BUCKETS - 1;
	if (idx < 128)
		return idx;
	if (idx < HIST_LIN_BUCKETS) {
		unsigned s = (idx >> 6) - 1;
		uint64_t q = (idx & 63) + 64;
		return q << s;
	}
	unsigned m = HIST_GEO_OCTAVE + (idx - HIST_LIN_BUCKETS) / HIST_SUB, k = (idx - HIST_LIN_BUCKETS) % HIST_SUB;
	uint64_t scaled = (uint64_t)sub_low[k] << m; /* < 2^44 */
	return ((uint64_t)1 << m) + ((scaled + (1u << HIST_MANT_BITS) - 1) >> HIST_MANT_BITS);
}

uint64_t hist_bucket_high(unsigned idx)
{
	if (idx >= HIST_BUCKETS - 1)
		return UINT64_MAX;
	return hist_bucket_low(idx + 1) - 1;
}

/* The bucket's values as far as samples can be: for the last bucket that is
 * up to HIST_LIMIT - 1, not UINT64_MAX, so that its midpoint stays near the
 * values it was built for; the callers clamp to [min, max] anyway. */
static uint64_t bucket_high_nominal(unsigned idx)
{
	return idx >= HIST_BUCKETS - 1 ? HIST_LIMIT - 1 : hist_bucket_high(idx);
}

uint64_t hist_quantile(const struct hist *h, double q)
{
	if (h->count == 0)
		return 0;
	if (!(q > 0.0)) /* also NaN */
		return h->min;
	if (q >= 1.0)
		return h->max;

	/* rank = ceil(q * count), kept within [1, count] even where the double
	 * product rounds (counts beyond 2^53). */
	double r = ceil(q * (double)h->count);
	uint64_t rank = r >= (double)h->count ? h->count : (uint64_t)r;
	if (rank < 1)
		rank = 1;

	uint64_t cum = 0;
	unsigned i;
	for (i = 0; i < HIST_BUCKETS - 1; i++) {
		cum += h->buckets[i];
		if (cum >= rank)
			break;
	}
	uint64_t lo = hist_bucket_low(i), hi = bucket_high_nominal(i);
	uint64_t mid = lo + (hi - lo) / 2;
	if (mid < h->min)
		mid = h->min;
	if (mid > h->max)
		mid = h->max;
	return mid;
}

double hist_mean(const struct hist *h)
{
	return h->count ? (double)h->sum / (double)h->count : 0.0;
}

double hist_count_le(const struct hist *h, uint64_t bound)
{
	if (h->count == 0 || bound < h->min)
		return 0.0;
	if (bound >= h->max)
		return (double)h->count;

	/* Here min <= bound < max. */
	unsigned b = hist_index(bound);
	uint64_t below = 0;
	for (unsigned i = 0; i < b; i++)
		below += h->buckets[i];

	/* Samples in bucket b lie in [lo, hi], and so does bound. When bound
	 * is the bucket's high, hi == bound (max is above it): the whole
	 * bucket counts, exactly, with no division to round. */
	uint64_t lo = hist_bucket_low(b), hi = hist_bucket_high(b);
	if (lo < h->min)
		lo = h->min;
	if (hi > h->max)
		hi = h->max;
	double share = bound == hi ? 1.0 : ((double)(bound - lo) + 1.0) / ((double)(hi - lo) + 1.0);
	return (double)below + (double)h->buckets[b] * share;
}

bool hist_empty(const struct hist *h)
{
	return h->count == 0;
}

size_t hist_encoded_max(const struct hist *h)
{
	/* Six header numbers, then at most HIST_BUCKETS buckets, each at worst
	 * an index delta below HIST_BUCKETS (2 bytes) and a count <= count, or
	 * a zigzagged count difference (one bit wider than a count). */
	return 6 * VARINT_MAX + (size_t)(h->count ? HIST_BUCKETS : 0) * (3 + varint_len(h->count));
}

/* Appends v at out[*pos]; false, with nothing written past cap, if it does
 * not fit. */
static bool put(uint8_t *out, size_t cap, size_t *pos, uint64_t v)
{
	size_t n = varint_len(v);
	if (cap - *pos < n)
		return false;
	*pos += varint_put(out + *pos, v);
	return true;
}

/* Signed differences as unsigned varints: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ... */
static uint64_t zigzag(uint64_t cur, uint64_t prev)
{
	return cur >= prev ? (cur - prev) << 1 : ((prev - cur) << 1) - 1;
}

size_t hist_encode(const struct hist *h, uint8_t *out, size_t cap)
{
	uint64_t nnz = 0;
	unsigned first = 0, last = 0;
	size_t sparse = 0, dense = 0;

	/* Two shapes, whichever is shorter: sparse (index delta, count) pairs
	 * for scattered samples; dense count differences over [first, last]
	 * for the smooth, contiguous histograms that long windows produce, where
	 * neighbouring counts are close and the index costs nothing. */
	/* only [min's bucket, max's] can hold samples (the invariants) */
	unsigned lo = h->count ? hist_index(h->min) : 0, hi = h->count ? hist_index(h->max) + 1 : 0;
	for (unsigned i = lo, prev = 0; i < hi; i++) {
		if (h->buckets[i] == 0)
			continue;
		if (nnz++ == 0)
			first = i;
		sparse += varint_len(i - prev) + varint_len(h->buckets[i]);
		prev = last = i;
	}
	for (unsigned i = first; nnz && i <= last; i++)
		dense += varint_len(zigzag(h->buckets[i], i > first ? h->buckets[i - 1] : 0));
	bool use_dense = nnz && dense + varint_len(first) < sparse;

	size_t pos = 0;
	uint64_t shape = use_dense ? ((uint64_t)(last - first + 1) << 1) | 1 : nnz << 1;
	if (!put(out, cap, &pos, h->count) || !put(out, cap, &pos, h->sum) || !put(out, cap, &pos, h->min) ||
	    !put(out, cap, &pos, h->max) || !put(out, cap, &pos, shape))
		return 0;
	if (use_dense) {
		if (!put(out, cap, &pos, first))
			return 0;
		for (unsigned i = first; i <= last; i++)
			if (!put(out, cap, &pos, zigzag(h->buckets[i], i > first ? h->buckets[i - 1] : 0)))
				return 0;
		return pos;
	}
	unsigned prev = 0;
	for (unsigned i = first; nnz && i <= last; i++) {
		if (h->buckets[i] == 0)
			continue;
		if (!put(out, cap, &pos, i - prev) || !put(out, cap, &pos, h->buckets[i]))
			return 0;
		prev = i;
	}
	return pos;
}

/* Reads a varint at in[*pos]; false if it runs past len or over 64 bits. */
static bool get(const uint8_t *in, size_t len, size_t *pos, uint64_t *v)
{
	const uint8_t *p = in + *pos;
	if (varint_get(&p, in + len, v) == -1)
		return false;
	*pos = (size_t)(p - in);
	return true;
}

/*
 * One pass over an encoded histogram. With dst NULL it only validates;
 * with dst set it adds, and must only be called on input that validated
 * (it then cannot fail half-way). Returns bytes consumed, or 0 if invalid
 * (a valid encoding is at least 5 bytes).
 */
static size_t decode_pass(struct hist *dst, const uint8_t *in, size_t len)
{
	size_t pos = 0;
	uint64_t count, sum, min, max, shape;
	if (!get(in, len, &pos, &count) || !get(in, len, &pos, &sum) || !get(in, len, &pos, &min) ||
	    !get(in, len, &pos, &max) || !get(in, len, &pos, &shape))
		return 0;

	if (count == 0) {
		if (sum != 0 || min != UINT64_MAX || max != 0 || shape != 0)
			return 0;
		return pos;
	}
	uint64_t n = shape >> 1;
	if (n == 0 || n > HIST_BUCKETS || min > max)
		return 0;

	uint64_t idx = 0, total = 0;
	unsigned first = 0;
	if (shape & 1) {
		/* dense: first index, then n count differences */
		uint64_t prev = 0;
		if (!get(in, len, &pos, &idx) || idx >= HIST_BUCKETS || n > HIST_BUCKETS - idx)
			return 0;
		first = (unsigned)idx;
		for (uint64_t k = 0; k < n; k++, idx++) {
			uint64_t z, c;
			if (!get(in, len, &pos, &z))
				return 0;
			if (z & 1) {
				uint64_t down = (z >> 1) + 1;
				if (down > prev)
					return 0;
				c = prev - down;
			} else {
				if ((z >> 1) > count - prev) /* prev <= count: no wrap */
					return 0;
				c = prev + (z >> 1);
			}
			if (c > count - total)
				return 0;
			/* the ends are non-empty: the shape is canonical */
			if (c == 0 && (k == 0 || k == n - 1))
				return 0;
			total += c;
			if (dst)
				dst->buckets[idx] += c;
			prev = c;
		}
		idx--;
	} else {
		if (n > count)
			return 0;
		for (uint64_t k = 0; k < n; k++) {
			uint64_t delta, c;
			if (!get(in, len, &pos, &delta) || !get(in, len, &pos, &c))
				return 0;
			/* Indices strictly increase (only the first may be at delta
			 * 0) and stay inside the array; check before adding so that
			 * a huge delta cannot wrap idx. */
			if ((k > 0 && delta == 0) || delta >= HIST_BUCKETS - idx)
				return 0;
			idx += delta;
			if (c == 0 || c > count - total)
				return 0;
			total += c;
			if (k == 0)
				first = (unsigned)idx;
			if (dst)
				dst->buckets[idx] += c;
		}
	}
	if (total != count || hist_index(min) != first || hist_index(max) != idx)
		return 0;

	if (dst) {
		dst->count += count;
		dst->sum += sum;
		if (min < dst->min)
			dst->min = min;
		if (max > dst->max)
			dst->max = max;
	}
	return pos;
}

int hist_decode_merge(struct hist *dst, const uint8_t *in, size_t len, size_t *used)
{
	size_t n = decode_pass(NULL, in, len);
	if (n == 0)
		return -1;
	decode_pass(dst, in, len);
	assert(hist_consistent(dst));
	if (used)
		*used = n;
	return 0;
}
