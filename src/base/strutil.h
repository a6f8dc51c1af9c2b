/*
 * strutil.h — small string helpers shared by the parsers and the proxy.
 *
 * Header only, no state. No helper reads past the lengths it is given;
 * copy_trunc always leaves dst terminated.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Case-insensitive comparison of (a, alen) with the string `lit`: an HTTP
 * header name, or a token of a header value. The first bytes are compared
 * inline first (equal with bit 0x20 set, which any two bytes strncasecmp
 * finds equal are), so most names of the same length cost no call. */
static inline bool name_eq(const char *a, size_t alen, const char *lit)
{
	size_t n = strlen(lit);
	return alen == n && (n == 0 || ((unsigned char)a[0] | 0x20) == ((unsigned char)lit[0] | 0x20)) &&
	       strncasecmp(a, lit, n) == 0;
}

/* Copies (src, len) into dst[dstlen] (dstlen > 0), cut to dstlen - 1 bytes,
 * and terminates it. */
static inline void copy_trunc(char *dst, size_t dstlen, const char *src, size_t len)
{
	if (len >= dstlen)
		len = dstlen - 1;
	memcpy(dst, src, len);
	dst[len] = '\0';
}

/* ---- text a client sends (docs/security.md, "Names that are not text") ----
 *
 * A string a client chooses (the model name) ends up in Prometheus label
 * values, which must be UTF-8, and in JSON, which jansson refuses to write
 * unless it is UTF-8. So such a string is kept as text: every byte that
 * does not belong to a well-formed UTF-8 sequence, and every control
 * character, becomes U+FFFD. */

#define UTF8_REPLACEMENT 0xFFFDu

/* The code point of the well-formed UTF-8 sequence at p (p < end) and its
 * length in *len. A byte that does not start one gives -1 with *len = 1:
 * overlong forms, surrogates, code points past U+10FFFF, stray continuation
 * bytes, and a sequence broken off by a byte that does not continue it. A
 * sequence that is well formed so far but cut off by `end` gives -2 (more
 * bytes may follow). */
static inline int32_t utf8_decode(const char *p, const char *end, size_t *len)
{
	const unsigned char *s = (const unsigned char *)p;
	size_t have = (size_t)(end - p), k;
	unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
	uint32_t cp;

	*len = 1;
	if (s[0] < 0x80)
		return s[0];
	if (s[0] >= 0xC2 && s[0] <= 0xDF) {
		k = 2;
		cp = s[0] & 0x1Fu;
	} else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
		k = 3;
		cp = s[0] & 0x0Fu;
		lo = s[0] == 0xE0 ? 0xA0 : 0x80; /* overlong below U+0800 */
		hi = s[0] == 0xED ? 0x9F : 0xBF; /* surrogates D800-DFFF */
	} else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
		k = 4;
		cp = s[0] & 0x07u;
		lo = s[0] == 0xF0 ? 0x90 : 0x80; /* overlong below U+10000 */
		hi = s[0] == 0xF4 ? 0x8F : 0xBF; /* past U+10FFFF */
	} else {
		return -1; /* C0, C1, F5-FF, or a continuation byte */
	}
	for (size_t i = 1; i < k; i++) {
		if (i >= have)
			return -2;
		if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF))
			return -1;
		cp = cp << 6 | (s[i] & 0x3Fu);
	}
	*len = k;
	return (int32_t)cp;
}

/* A control character (C0, DEL, C1): kept out of names, as it would let a
 * client write line breaks and terminal escapes into whatever shows them. */
static inline bool utf8_is_control(uint32_t cp)
{
	return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
}

/* Appends code point cp (< 0x110000, no surrogate) to dst[*n ..] as UTF-8
 * when it fits whole before dst[cap - 1]; returns whether it did. */
static inline bool utf8_put(char *dst, size_t cap, size_t *n, uint32_t cp)
{
	char tmp[4];
	size_t k;

	if (cp < 0x80) {
		tmp[0] = (char)cp;
		k = 1;
	} else if (cp < 0x800) {
		tmp[0] = (char)(0xC0 | cp >> 6);
		tmp[1] = (char)(0x80 | (cp & 0x3F));
		k = 2;
	} else if (cp < 0x10000) {
		tmp[0] = (char)(0xE0 | cp >> 12);
		tmp[1] = (char)(0x80 | (cp >> 6 & 0x3F));
		tmp[2] = (char)(0x80 | (cp & 0x3F));
		k = 3;
	} else {
		tmp[0] = (char)(0xF0 | cp >> 18);
		tmp[1] = (char)(0x80 | (cp >> 12 & 0x3F));
		tmp[2] = (char)(0x80 | (cp >> 6 & 0x3F));
		tmp[3] = (char)(0x80 | (cp & 0x3F));
		k = 4;
	}
	if (*n + k >= cap)
		return false;
	memcpy(dst + *n, tmp, k);
	*n += k;
	return true;
}

/* Whether s[0 .. len) is UTF-8 text as the rule above keeps it: well
 * formed, no control character. */
static inline bool utf8_is_clean(const char *s, size_t len)
{
	const char *p = s, *end = s + len;

	while (p < end) {
		size_t k;
		int32_t cp = utf8_decode(p, end, &k);
		if (cp < 0 || utf8_is_control((uint32_t)cp))
			return false;
		p += k;
	}
	return true;
}

/* A tenant name as tokentap keeps one (parse/tenant.h, the configuration's
 * tenant.keys): 1..64 bytes of [A-Za-z0-9._:@/+=~-], safe without escaping
 * in JSON, a Prometheus label, YAML and a shell word. */
#define TENANT_NAME_MAX 64
static inline bool tenant_name_ok(const char *s, size_t len)
{
	if (len == 0 || len > TENANT_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      strchr("._:@/+=~-", c)) ||
		    c == 0)
			return false;
	}
	return true;
}

#if defined(__x86_64__)
/* find_either's AVX2 steps, 32 bytes each while 32 remain: the first byte
 * that is `a` or `b`, or where fewer than 32 bytes remain, none before it
 * being either. */
__attribute__((target("avx2"))) static inline const char *find_either_avx2(const char *p, const char *end, char a,
									   char b)
{
	const __m256i va = _mm256_set1_epi8(a), vb = _mm256_set1_epi8(b);

	while (end - p >= 32) {
		__m256i w = _mm256_loadu_si256((const __m256i *)(const void *)p);
		unsigned m = (unsigned)_mm256_movemask_epi8(
			_mm256_or_si256(_mm256_cmpeq_epi8(w, va), _mm256_cmpeq_epi8(w, vb)));
		if (m)
			return p + __builtin_ctz(m);
		p += 32;
	}
	return p;
}
#endif

/* The first byte of [p, end) that is `a` or `b`, or end: 32 bytes a step
 * where AVX2 runs, then eight where loads of them are cheap
 * (little-endian), one otherwise. Each step reads the exact bytes of its
 * span, none past end. */
static inline const char *find_either(const char *p, const char *end, char a, char b)
{
#if defined(__x86_64__)
	if (end - p >= 32 && __builtin_cpu_supports("avx2")) {
		p = find_either_avx2(p, end, a, b);
		if (end - p >= 32)
			return p; /* a match: the steps stop short of the tail only there */
	}
#endif
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
	const uint64_t wa = ones * (uint8_t)a, wb = ones * (uint8_t)b;
	while (end - p >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		uint64_t x = w ^ wa, y = w ^ wb;
		/* a byte of x or y that is zero sets its high bit here; only bits
		 * above the lowest true one can be false (a borrow), so the lowest
		 * set bit is the first match */
		uint64_t m = (((x - ones) & ~x) | ((y - ones) & ~y)) & highs;
		if (m)
			return p + (__builtin_ctzll(m) >> 3);
		p += 8;
	}
#endif
	while (p < end && *p != a && *p != b)
		p++;
	return p;
}
