/*
 * keyscan.h — finding a quoted literal such as "usage" in JSON bytes.
 *
 * classify.c runs this over every streamed event, usually to the event's
 * end (most events hold no "usage"), so it is the one scan on the per-event
 * path worth vector code. It answers exactly what memmem() would, for one
 * literal or (keyscan_find_any) the earliest of a few.
 */
#ifndef TOKENTAP_KEYSCAN_H
#define TOKENTAP_KEYSCAN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The first occurrence of q[0 .. qlen) in [p, end), or NULL. qlen >= 3: the
 * search keys on q's second and second-to-last bytes (the first and last
 * letters of a quoted key). */
const char *keyscan_find(const char *p, const char *end, const char *q, size_t qlen);

/* A literal for keyscan_find_any(): q[0 .. qlen), qlen >= 3. */
struct keyscan_key {
	const char *q;
	size_t qlen;
};

/* a[0, n) equals b[0, n). Keys are short: two (four past 16 bytes)
 * overlapping word loads per side compare them without a call to
 * memcmp(), which every event's hit (and classify.c's probe of the key a
 * stream's last event held) would otherwise pay. */
static inline int keyscan_same(const char *a, const char *b, size_t n)
{
	if (n > 16 && n <= 32) {
		uint64_t a0, a1, a2, a3, b0, b1, b2, b3;
		memcpy(&a0, a, 8);
		memcpy(&a1, a + 8, 8);
		memcpy(&a2, a + n - 16, 8);
		memcpy(&a3, a + n - 8, 8);
		memcpy(&b0, b, 8);
		memcpy(&b1, b + 8, 8);
		memcpy(&b2, b + n - 16, 8);
		memcpy(&b3, b + n - 8, 8);
		return ((a0 ^ b0) | (a1 ^ b1) | (a2 ^ b2) | (a3 ^ b3)) == 0;
	}
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

#define KEYSCAN_MAX_KEYS 5

/* The first position in [p, end) where any of keys[0 .. n) occurs, or NULL;
 * *which is set to the index of the first of the keys that occurs there.
 * 1 <= n <= KEYSCAN_MAX_KEYS, and all the keys start with the same byte
 * (quoted keys do): NULL otherwise. One pass over the bytes for all the keys:
 * it answers what the earliest of n keyscan_find() calls would, so calling
 * it again from one past a hit visits every occurrence of every key in
 * the order they start. */
const char *keyscan_find_any(const char *p, const char *end, const struct keyscan_key *keys, size_t n, size_t *which);

/* Keys checked once for keyscan_find_set(), which then skips the checks
 * keyscan_find_any() makes on every call: for a search repeated on every
 * event. Made by keyscan_set_init(), or as a constant by KEYSCAN_SET2() for
 * two keys within the contract above (quoted keys, as classify.c's KEY()
 * makes: KEYSCAN_SET2(KEY("usage"), KEY("timings"))). */
struct keyscan_set {
	struct keyscan_key keys[KEYSCAN_MAX_KEYS];
	size_t n;	       /* 0: outside the contract, finds nothing */
	size_t minlen, maxlen; /* of the keys' lengths */
};

#define KEYSCAN_SET2(a, b) KEYSCAN_SET2_(a, b)
#define KEYSCAN_SET2_(q0, l0, q1, l1) \
	{ \
		.keys = { { q0, l0 }, { q1, l1 } }, .n = 2, .minlen = (l0) < (l1) ? (l0) : (l1), \
		.maxlen = (l0) > (l1) ? (l0) : (l1), \
	}

/* Fills `set` with keys[0 .. n); returns 0, or -1 (and a set that finds
 * nothing) when keyscan_find_any() would refuse them. */
int keyscan_set_init(struct keyscan_set *set, const struct keyscan_key *keys, size_t n);

/* keyscan_find_any(p, end, set->keys, set->n, which), without its checks. */
const char *keyscan_find_set(const char *p, const char *end, const struct keyscan_set *set, size_t *which);

#endif
