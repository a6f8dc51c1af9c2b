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

/* keyscan_find_any()'s contract: 1 to KEYSCAN_MAX_KEYS keys of at least 3
 * bytes, all starting with the same byte. Their shortest and longest
 * lengths, or -1. */
static int check_keys(const struct keyscan_key *keys, size_t n, size_t *minlen, size_t *maxlen)
{
	*minlen = SIZE_MAX;
	*maxlen = 0;
	if (n == 0 || n > KEYSCAN_MAX_KEYS)
		return -1;
	for (size_t k = 0; k < n; k++) {
		if (keys[k].qlen < 3 || keys[k].q[0] != keys[0].q[0])
			return -1;
		*minlen = keys[k].qlen < *minlen ? keys[k].qlen : *minlen;
		*maxlen = keys[k].qlen > *maxlen ? keys[k].qlen : *maxlen;
	}
	return 0;
}

#if defined(__x86_64__) && defined(__SSE2__)
#include <immintrin.h>

static const char *find_scalar(const char *c, const char *stop, const char *q, size_t qlen)
{
	for (; c <= stop; c++)
		if (c[1] == q[1] && keyscan_same(c, q, qlen))
			return c;
	return NULL;
}

/* Checks the candidate starts set in mask (bit i: start c + i). */
static inline const char *check(const char *c, unsigned mask, const char *q, size_t qlen)
{
	while (mask != 0) {
		unsigned i = (unsigned)__builtin_ctz(mask);
		if (keyscan_same(c + i, q, qlen))
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

/* ---- several literals in one pass ---------------------------------------
 *
 * The same steps with a candidate mask that is the union of each key's
 * pair test, and with the first byte, which all the keys share (the
 * opening quote), tested too: with several keys the pairs alone let
 * through enough look-alikes ("_content\"" in "reasoning_content", for
 * "content") that confirming them cost more than the scan. The first two
 * bytes are loaded once for all keys, the second-to-last once per key.
 * With more than two keys the vector steps cover the starts where the
 * longest key fits, and the few starts after them where only shorter ones
 * do are tested one by one.
 */

/* Up to this many keys, a candidate is the shared first byte followed by
 * one of the keys' second bytes: few enough strings in JSON start so, and
 * the steps then read no further than the byte after a start, so they
 * cover every start and no tail is left to test one by one. With more
 * keys, the second-to-last bytes are tested too. */
#define ANY_FIRST_ONLY 2

/* The first key among keys[0, n) that occurs at c and fits before end. */
static inline const char *any_at(const char *c, const char *end, const struct keyscan_key *keys, size_t n,
				 size_t *which)
{
	for (size_t k = 0; k < n; k++) {
		if (c[1] == keys[k].q[1] && (size_t)(end - c) >= keys[k].qlen &&
		    keyscan_same(c, keys[k].q, keys[k].qlen)) {
			*which = k;
			return c;
		}
	}
	return NULL;
}

static const char *any_scalar(const char *c, const char *stop, const char *end, const struct keyscan_key *keys,
			      size_t n, size_t *which)
{
	for (; c <= stop; c++)
		if (*c == keys[0].q[0] && any_at(c, end, keys, n, which))
			return c;
	return NULL;
}

/* Confirms the candidate starts set in mask (bit i: start c + i). */
static inline const char *any_check(const char *c, const char *end, unsigned mask, const struct keyscan_key *keys,
				    size_t n, size_t *which)
{
	while (mask != 0) {
		unsigned i = (unsigned)__builtin_ctz(mask);
		if (any_at(c + i, end, keys, n, which))
			return c + i;
		mask &= mask - 1;
	}
	return NULL;
}

/* The step loops, inlined with a constant n and written out key by key
 * (a loop over arrays of needles was not unrolled, and kept them on the
 * stack), so that the needles stay in registers (see step_sse2). Keys past
 * n repeat key 0. */
#define ANY_NEEDLES(set1) \
	const vec q0 = set1(keys[0].q[0]); \
	const size_t o0 = keys[0].qlen - 2, o1 = keys[n > 1 ? 1 : 0].qlen - 2, o2 = keys[n > 2 ? 2 : 0].qlen - 2, \
		     o3 = keys[n > 3 ? 3 : 0].qlen - 2, o4 = keys[n > 4 ? 4 : 0].qlen - 2; \
	const vec f0 = set1(keys[0].q[1]), l0 = set1(keys[0].q[o0]); \
	const vec f1 = set1(keys[n > 1 ? 1 : 0].q[1]), l1 = set1(keys[n > 1 ? 1 : 0].q[o1]); \
	const vec f2 = set1(keys[n > 2 ? 2 : 0].q[1]), l2 = set1(keys[n > 2 ? 2 : 0].q[o2]); \
	const vec f3 = set1(keys[n > 3 ? 3 : 0].q[1]), l3 = set1(keys[n > 3 ? 3 : 0].q[o3]); \
	const vec f4 = set1(keys[n > 4 ? 4 : 0].q[1]), l4 = set1(keys[n > 4 ? 4 : 0].q[o4])

#define ANY_MASK(load, cmpeq, vand, vor, movemask) \
	vec head = load((const vec *)(const void *)(c + 1)); \
	vec m; \
	if (n <= ANY_FIRST_ONLY) { \
		m = cmpeq(f0, head); \
		if (n > 1) \
			m = vor(m, cmpeq(f1, head)); \
	} else { \
		m = vand(cmpeq(f0, head), cmpeq(l0, load((const vec *)(const void *)(c + o0)))); \
		if (n > 1) \
			m = vor(m, vand(cmpeq(f1, head), cmpeq(l1, load((const vec *)(const void *)(c + o1))))); \
		if (n > 2) \
			m = vor(m, vand(cmpeq(f2, head), cmpeq(l2, load((const vec *)(const void *)(c + o2))))); \
		if (n > 3) \
			m = vor(m, vand(cmpeq(f3, head), cmpeq(l3, load((const vec *)(const void *)(c + o3))))); \
		if (n > 4) \
			m = vor(m, vand(cmpeq(f4, head), cmpeq(l4, load((const vec *)(const void *)(c + o4))))); \
	} \
	m = vand(m, cmpeq(q0, load((const vec *)(const void *)c))); \
	*mask = (unsigned)movemask(m) >> skip << skip

static inline __attribute__((always_inline)) const char *
any_step_sse2(const char *c, const char *final, const struct keyscan_key *keys, size_t n, unsigned *mask)
{
	typedef __m128i vec;
	ANY_NEEDLES(_mm_set1_epi8);
	for (;;) {
		unsigned skip = 0;
		if (c > final) {
			skip = (unsigned)(c - final);
			c = final;
		}
		ANY_MASK(_mm_loadu_si128, _mm_cmpeq_epi8, _mm_and_si128, _mm_or_si128, _mm_movemask_epi8);
		if (*mask || c == final)
			return c;
		c += 16;
	}
}

__attribute__((target("avx2"))) static inline __attribute__((always_inline)) const char *
any_step_avx2(const char *c, const char *final, const struct keyscan_key *keys, size_t n, unsigned *mask)
{
	typedef __m256i vec;
	ANY_NEEDLES(_mm256_set1_epi8);
	for (;;) {
		unsigned skip = 0;
		if (c > final) {
			skip = (unsigned)(c - final);
			c = final;
		}
		ANY_MASK(_mm256_loadu_si256, _mm256_cmpeq_epi8, _mm256_and_si256, _mm256_or_si256,
			 _mm256_movemask_epi8);
		if (*mask || c == final)
			return c;
		c += 32;
	}
}

#undef ANY_NEEDLES
#undef ANY_MASK

/* One step function per key count, each its own call as step_sse2 is: the
 * confirmation between steps may call memcmp(), and the needles would be
 * spilled around it. */
typedef const char *any_step_fn(const char *c, const char *final, const struct keyscan_key *keys, unsigned *mask);

#define ANY_STEP_FNS(n) \
	static const char *any_step##n##_sse2(const char *c, const char *final, const struct keyscan_key *keys, \
					      unsigned *mask) \
	{ \
		return any_step_sse2(c, final, keys, n, mask); \
	} \
	__attribute__((target("avx2"))) static const char *any_step##n##_avx2( \
		const char *c, const char *final, const struct keyscan_key *keys, unsigned *mask) \
	{ \
		return any_step_avx2(c, final, keys, n, mask); \
	}
ANY_STEP_FNS(2)
ANY_STEP_FNS(3)
ANY_STEP_FNS(4)
ANY_STEP_FNS(5)
#undef ANY_STEP_FNS

/* The search over starts c .. final + width - 1 (see find_steps). */
static inline __attribute__((always_inline)) const char *any_steps(const char *c, const char *final, const char *end,
								   const struct keyscan_key *keys, size_t n,
								   size_t *which, any_step_fn *step, size_t width)
{
	for (;;) {
		unsigned mask;
		c = step(c, final, keys, &mask);
		const char *hit = mask ? any_check(c, end, mask, keys, n, which) : NULL;
		if (hit || c == final)
			return hit;
		c += width;
	}
}

/* Starts c .. stop, where every key fits. */
static const char *any_sse2(const char *c, const char *stop, const char *end, const struct keyscan_key *keys, size_t n,
			    size_t *which)
{
	if (stop - c < 15)
		return any_scalar(c, stop, end, keys, n, which);
	any_step_fn *step = n == 2   ? any_step2_sse2
			    : n == 3 ? any_step3_sse2
			    : n == 4 ? any_step4_sse2
				     : any_step5_sse2;
	return any_steps(c, stop - 15, end, keys, n, which, step, 16);
}

__attribute__((target("avx2"))) static const char *any_avx2(const char *c, const char *stop, const char *end,
							    const struct keyscan_key *keys, size_t n, size_t *which)
{
	if (stop - c < 31)
		return any_sse2(c, stop, end, keys, n, which);
	any_step_fn *step = n == 2   ? any_step2_avx2
			    : n == 3 ? any_step3_avx2
			    : n == 4 ? any_step4_avx2
				     : any_step5_avx2;
	return any_steps(c, stop - 31, end, keys, n, which, step, 32);
}

/* The search of keyscan_find_any(), its keys already checked. */
static const char *find_any_checked(const char *p, const char *end, const struct keyscan_key *keys, size_t n,
				    size_t minlen, size_t maxlen, size_t *which)
{
	if (n == 0 || end - p < (ptrdiff_t)minlen)
		return NULL;
	if (n == 1) {
		*which = 0;
		return keyscan_find(p, end, keys[0].q, keys[0].qlen);
	}
	/* How far past a start the steps read: its second byte with first
	 * bytes only, else the longest key's second-to-last. */
	size_t reach = n <= ANY_FIRST_ONLY ? minlen : maxlen;
	const char *c = p;
	if (end - p >= (ptrdiff_t)reach) {
		const char *stop = end - reach; /* the last start the steps test */
		const char *hit = __builtin_cpu_supports("avx2") ? any_avx2(p, stop, end, keys, n, which)
								 : any_sse2(p, stop, end, keys, n, which);
		if (hit)
			return hit;
		c = stop + 1;
	}
	if (c > end - minlen)
		return NULL; /* no start left: the steps covered them all */
	return any_scalar(c, end - minlen, end, keys, n, which);
}

const char *keyscan_find_any(const char *p, const char *end, const struct keyscan_key *keys, size_t n, size_t *which)
{
	size_t minlen, maxlen;
	if (check_keys(keys, n, &minlen, &maxlen) == -1)
		return NULL; /* outside the contract */
	return find_any_checked(p, end, keys, n, minlen, maxlen, which);
}

const char *keyscan_find_set(const char *p, const char *end, const struct keyscan_set *set, size_t *which)
{
	return find_any_checked(p, end, set->keys, set->n, set->minlen, set->maxlen, which);
}

#else

const char *keyscan_find(const char *p, const char *end, const char *q, size_t qlen)
{
	if (end - p < (ptrdiff_t)qlen)
		return NULL;
	return memmem(p, (size_t)(end - p), q, qlen);
}

const char *keyscan_find_any(const char *p, const char *end, const struct keyscan_key *keys, size_t n, size_t *which)
{
	struct keyscan_set set;
	if (keyscan_set_init(&set, keys, n) == -1)
		return NULL; /* outside the contract, as on x86 */
	return keyscan_find_set(p, end, &set, which);
}

const char *keyscan_find_set(const char *p, const char *end, const struct keyscan_set *set, size_t *which)
{
	const struct keyscan_key *keys = set->keys;
	size_t n = set->n;
	for (const char *c = p; c < end; c++) {
		for (size_t k = 0; k < n; k++) {
			if ((size_t)(end - c) >= keys[k].qlen && memcmp(c, keys[k].q, keys[k].qlen) == 0) {
				*which = k;
				return c;
			}
		}
	}
	return NULL;
}

#endif

int keyscan_set_init(struct keyscan_set *set, const struct keyscan_key *keys, size_t n)
{
	set->n = 0;
	if (check_keys(keys, n, &set->minlen, &set->maxlen) == -1)
		return -1;
	for (size_t k = 0; k < n; k++)
		set->keys[k] = keys[k];
	set->n = n;
	return 0;
}
