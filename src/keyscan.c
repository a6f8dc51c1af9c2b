/*
 * keyscan.c — the first occurrence of a quoted literal, 16 or 32 positions
 * at a time.
 *
 * A position is a candidate when the literal's second byte and its
 * second-to-last byte both sit where they should (for "content": a 'c' and,
 * six bytes on, a 't'). In JSON event text that pair is rare enough that
 * the full comparison behind it seldom runs, so the search costs about one vector
 * compare pair per 16 (SSE2) or 32 (AVX2) bytes, against roughly a byte per
 * cycle for memmem() plus its per-call table set-up. AVX2 is chosen at run
 * time; builds for other architectures use memmem().
 *
 * Each step tests the starts c .. c+W-1 and reads up to c + qlen - 2 + W-1.
 * The last step is moved back so that it ends exactly at the last start,
 * with the starts an earlier step already tested masked off: no byte past
 * `end` is ever read, and no scalar tail loop is needed once the range holds
 * W starts.
 */
#define _GNU_SOURCE /* memmem */
#include "keyscan.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <immintrin.h>

/* a[0, n) equals b[0, n). Keys are short: two overlapping word loads per
 * side compare them without a call to memcmp(), which every event's hit
 * would otherwise pay. */
static inline int same(const char *a, const char *b, size_t n)
{
	if (n >= 8 && n <= 16) {
		uint64_t a0, a1, b0, b1;
		memcpy(&a0, a, 8);
		memcpy(&a1, a + n - 8, 8);
		memcpy(&b0, b, 8);
		memcpy(&b1, b + n - 8, 8);
		return a0 == b0 && a1 == b1;
	}
	if (n >= 4 && n < 8) {
		uint32_t a0, a1, b0, b1;
		memcpy(&a0, a, 4);
		memcpy(&a1, a + n - 4, 4);
		memcpy(&b0, b, 4);
		memcpy(&b1, b + n - 4, 4);
		return a0 == b0 && a1 == b1;
	}
	return memcmp(a, b, n) == 0;
}

static const char *find_scalar(const char *c, const char *stop, const char *q, size_t qlen)
{
	for (; c <= stop; c++)
		if (c[1] == q[1] && same(c, q, qlen))
			return c;
	return NULL;
}

/* Checks the candidate starts set in mask (bit i: start c + i). */
static inline const char *check(const char *c, unsigned mask, const char *q, size_t qlen)
{
	while (mask != 0) {
		unsigned i = (unsigned)__builtin_ctz(mask);
		if (same(c + i, q, qlen))
			return c + i;
		mask &= mask - 1;
	}
	return NULL;
}

/*
 * The vector loops only find the next step with a candidate: they return
 * its start and leave the candidates in *mask (0 when there is none up to
 * `final`). They call nothing, so the two broadcast needles stay in
 * registers; the confirmation, which may call memcmp(), runs in the caller.
 * Without this split the needles were spilled to the stack and reloaded on
 * every step.
 */
static const char *step_sse2(const char *c, const char *final, const char *q, size_t qlen, unsigned *mask)
{
	const __m128i first = _mm_set1_epi8(q[1]);
	const __m128i last = _mm_set1_epi8(q[qlen - 2]);
	for (;;) {
		unsigned skip = 0;
		if (c > final) {
			skip = (unsigned)(c - final);
			c = final;
		}
		__m128i a = _mm_cmpeq_epi8(first, _mm_loadu_si128((const __m128i *)(const void *)(c + 1)));
		__m128i b = _mm_cmpeq_epi8(last, _mm_loadu_si128((const __m128i *)(const void *)(c + qlen - 2)));
		*mask = (unsigned)_mm_movemask_epi8(_mm_and_si128(a, b)) >> skip << skip;
		if (*mask || c == final)
			return c;
		c += 16;
	}
}

typedef const char *step_fn(const char *c, const char *final, const char *q, size_t qlen, unsigned *mask);

/* The search over starts c .. final + width - 1, `width` per step: the
 * step finds candidates, check() confirms them. Inlined into each
 * caller with its own step. */
static inline __attribute__((always_inline)) const char *find_steps(const char *c, const char *final, const char *q,
								    size_t qlen, step_fn *step, size_t width)
{
	for (;;) {
		unsigned mask;
		c = step(c, final, q, qlen, &mask);
		const char *hit = mask ? check(c, mask, q, qlen) : NULL;
		if (hit || c == final)
			return hit;
		c += width;
	}
}

static const char *find_sse2(const char *c, const char *stop, const char *q, size_t qlen)
{
	if (stop - c < 15)
		return find_scalar(c, stop, q, qlen);
	return find_steps(c, stop - 15, q, qlen, step_sse2, 16);
}

__attribute__((target("avx2"))) static const char *step_avx2(const char *c, const char *final, const char *q,
							     size_t qlen, unsigned *mask)
{
	const __m256i first = _mm256_set1_epi8(q[1]);
	const __m256i last = _mm256_set1_epi8(q[qlen - 2]);
	for (;;) {
		unsigned skip = 0;
		if (c > final) {
			skip = (unsigned)(c - final);
			c = final;
		}
		__m256i a = _mm256_cmpeq_epi8(first, _mm256_loadu_si256((const __m256i *)(const void *)(c + 1)));
		__m256i b = _mm256_cmpeq_epi8(last, _mm256_loadu_si256((const __m256i *)(const void *)(c + qlen - 2)));
		*mask = (unsigned)_mm256_movemask_epi8(_mm256_and_si256(a, b)) >> skip << skip;
		if (*mask || c == final)
			return c;
		c += 32;
	}
}

__attribute__((target("avx2"))) static const char *find_avx2(const char *c, const char *stop, const char *q,
							     size_t qlen)
{
	if (stop - c < 31)
		return find_sse2(c, stop, q, qlen);
	return find_steps(c, stop - 31, q, qlen, step_avx2, 32);
}

const char *keyscan_find(const char *p, const char *end, const char *q, size_t qlen)
{
	if (end - p < (ptrdiff_t)qlen)
		return NULL;
	if (qlen < 3)
		return memmem(p, (size_t)(end - p), q, qlen);
	const char *stop = end - qlen; /* the last start that fits */
	if (__builtin_cpu_supports("avx2"))
		return find_avx2(p, stop, q, qlen);
	return find_sse2(p, stop, q, qlen);
}

#else

const char *keyscan_find(const char *p, const char *end, const char *q, size_t qlen)
{
	if (end - p < (ptrdiff_t)qlen)
		return NULL;
	return memmem(p, (size_t)(end - p), q, qlen);
}

#endif
