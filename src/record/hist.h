/*
 * hist.h — logarithmic latency histograms that merge by adding buckets.
 *
 * Buckets over unsigned 64-bit values (tokentap records times in
 * microseconds, token counts, rates in milli-units), in three ranges:
 *   - 0..127: a bucket each (exact);
 *   - 128..1023: every power of two [2^m, 2^(m+1)) in 64 equal buckets, a
 *     bucket's width at most 1/64 of its low, its midpoint within 1/128;
 *   - 1024..2^32-1: every power of two in HIST_SUB = 36 buckets of equal
 *     ratio (2^(1/36), 1.94 % wide), the midpoint within 0.99 %.
 * So every reported quantile is within 1 % of a sample's value. Why
 * geometric from 1024: the same 1 % bound with 36 buckets per power of two
 * instead of 64, which makes a stored histogram about 40 % smaller (see
 * docs/storage.md). Why not below: on small integers a bucket of a few
 * values cannot have an integer midpoint within 1 % of both ends (the
 * bucket [178, 181] of a 38-way split is off by 1.1 %); equal widths of
 * 2^(m-6) values keep it within 1/128. From 1024 on a geometric bucket
 * holds enough integers for its midpoint to stay within 0.99 % (checked for
 * every value up to 2^20 by test_hist). The layout is fixed, so histograms
 * from anywhere merge by adding buckets. Values >= 2^32 land in the last
 * bucket (count, sum, min and max stay exact).
 *
 * A geometric index is the power of two plus a table lookup on the 12 bits
 * after the leading one: hist_sub_of[f] is the bucket, within the octave, of
 * mantissa 1 + f/4096. The table's boundaries are those of the exact split
 * rounded to 1/4096 of the octave, which widens a bucket by at most 0.025 %.
 *
 * Invariants of a struct hist, kept by every function here and checked by
 * hist_decode_merge() on input it did not produce:
 *   - count == sum of buckets[];
 *   - count == 0: min == UINT64_MAX, max == 0, every bucket 0;
 *   - count > 0: min <= max, hist_index(min) is the first non-empty bucket
 *     and hist_index(max) the last.
 * sum wraps modulo 2^64 (it would take 2^64 µs, 585 000 years, of latency).
 *
 * A struct hist is a plain value (about 9 KiB) with no pointers: copy it,
 * zero it with hist_init(), keep one per worker and merge on a timer.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HIST_SUB 36 /* buckets per power of two from 1024 on */
#define HIST_MANT_BITS 12
#define HIST_GEO_FIRST 1024				    /* the first value of the geometric range */
#define HIST_GEO_OCTAVE 10				    /* log2(HIST_GEO_FIRST) */
#define HIST_LIN_BUCKETS (128 + (HIST_GEO_OCTAVE - 7) * 64) /* 320: the exact and the equal-width ranges */
#define HIST_BUCKETS \
	(HIST_LIN_BUCKETS + (32 - HIST_GEO_OCTAVE) * HIST_SUB) /* 1112: covers 0 .. 2^32-1 (µs: 71 minutes) */
/* First value that no longer has a bucket of its own precision. */
#define HIST_LIMIT ((uint64_t)1 << 32)

/* The bucket within its octave of each 12-bit mantissa (hist.c): filled
 * before main() runs, read-only from then on. */
extern uint8_t hist_sub_of[1u << HIST_MANT_BITS];

struct hist {
	uint64_t count, sum, min, max; /* min = UINT64_MAX when empty */
	uint64_t buckets[HIST_BUCKETS];
};

/* Makes `h` empty. */
void hist_init(struct hist *h);

/* Makes `h`, which keeps the invariants, empty: only the buckets from
 * min's to max's are written (a histogram of one flush interval's samples
 * spans a few of its 1,112). */
void hist_clear(struct hist *h);

/*
 * Bucket index of `v`.
 * Below 1024: with s = floor(log2(v | 64)) - 6, v >> s lies in [64, 128)
 * for v >= 64 and equals v below, so (s << 6) + (v >> s) is v for v < 128,
 * and for v in [2^m, 2^(m+1)) it is 128 + (m - 7) * 64 + the 6 bits after
 * the leading one. v | 64 is never 0, so __builtin_clzll is defined.
 * From 1024: with m = floor(log2 v) (10..31) and f the 12 bits after the
 * leading one (shifted up when m < 12, so f is the mantissa in 1/4096ths
 * either way), HIST_LIN_BUCKETS + (m - 10) * HIST_SUB + hist_sub_of[f].
 */
static inline unsigned hist_index(uint64_t v)
{
	v = v < HIST_LIMIT ? v : HIST_LIMIT - 1;
	if (v < HIST_GEO_FIRST) {
		unsigned s = 57u - (unsigned)__builtin_clzll(v | 64);
		return (s << 6) + (unsigned)(v >> s);
	}
	unsigned m = 63u - (unsigned)__builtin_clzll(v);
	uint64_t f = m >= HIST_MANT_BITS ? v >> (m - HIST_MANT_BITS) : v << (HIST_MANT_BITS - m);
	return HIST_LIN_BUCKETS + (m - HIST_GEO_OCTAVE) * HIST_SUB + hist_sub_of[f & ((1u << HIST_MANT_BITS) - 1)];
}

/* Adds one sample: a few ns, no allocation. */
static inline void hist_record(struct hist *h, uint64_t v)
{
	h->count++;
	h->sum += v;
	h->min = v < h->min ? v : h->min;
	h->max = v > h->max ? v : h->max;
	h->buckets[hist_index(v)]++;
}

/* Adds `n` samples of value `v`; n == 0 changes nothing. */
void hist_record_n(struct hist *h, uint64_t v, uint64_t n);

/* Exact: adds buckets and combines count, sum, min and max. dst == src is
 * allowed (doubles the histogram). */
void hist_merge(struct hist *dst, const struct hist *src);

/* True when `h` keeps the invariants above (count, min and max against the
 * buckets). Walks every bucket: for tests, fuzzers and assert(). */
bool hist_consistent(const struct hist *h);

/* Smallest value in bucket `idx`. An idx past the end is read as the last
 * bucket. */
uint64_t hist_bucket_low(unsigned idx);

/* Largest value in bucket `idx` (inclusive). The last bucket also holds every
 * value >= 2^32, so its high is UINT64_MAX. */
uint64_t hist_bucket_high(unsigned idx);

/*
 * Value at quantile q in [0,1]: the bucket holding the sample of rank
 * ceil(q*count) (rank >= 1), reported as the bucket midpoint clamped to
 * [min, max]; q=1 returns max exactly, q=0 min. 0 when empty. q outside
 * [0,1] is clamped; NaN reads as 0.
 */
uint64_t hist_quantile(const struct hist *h, double q);

/* sum/count, 0 when empty. */
double hist_mean(const struct hist *h);

/*
 * Cumulative count of samples <= bound (for Prometheus `le` buckets): counts
 * whole buckets whose high <= bound, plus a linear share of the bucket
 * containing bound. The share is taken over the part of that bucket inside
 * [min, max], where samples can be; so bound >= max gives count and
 * bound < min gives 0, exactly.
 */
double hist_count_le(const struct hist *h, uint64_t bound);

bool hist_empty(const struct hist *h);

/*
 * Compact encoding for storage: empty buckets outside the occupied range
 * cost nothing. Format (each number an unsigned LEB128 varint): count, sum,
 * min, max, shape = n << 1 | dense, then
 *   sparse (dense = 0): n non-empty buckets, each as the index delta from
 *     the previous non-empty index (the first from 0) and its count;
 *   dense (dense = 1): the first non-empty index, then the n buckets from
 *     there to the last non-empty one, each as the zigzagged difference
 *     from the previous bucket's count (the first from 0).
 * The encoder picks the shorter. An empty histogram encodes as count 0,
 * sum 0, min UINT64_MAX, max 0, shape 0.
 */

/* A safe bound on hist_encode()'s output for `h`, computed without a scan. */
size_t hist_encoded_max(const struct hist *h);

/* Writes `h` to out. Returns bytes written, or 0 if cap is too small (call
 * hist_encoded_max for a safe bound). */
size_t hist_encode(const struct hist *h, uint8_t *out, size_t cap);

/*
 * Decodes one encoded histogram at `in` and ADDS it into dst (so many slices
 * merge into one). Sets *used (may be NULL) to the bytes consumed; bytes past
 * them are not looked at. Returns 0, or -1 for malformed or truncated input,
 * with dst and *used left unchanged: the whole input is validated before
 * anything is applied. Rejects what hist_encode() cannot produce: a varint
 * over 64 bits, a bucket index past the end or not increasing, a bucket count
 * of 0, bucket counts that do not add up to count, min/max outside the first
 * and last non-empty buckets, a non-canonical empty histogram. Reads at most
 * len bytes whatever the input says.
 */
int hist_decode_merge(struct hist *dst, const uint8_t *in, size_t len, size_t *used)
	__attribute__((warn_unused_result));
