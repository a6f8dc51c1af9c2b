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

/* The first occurrence of q[0 .. qlen) in [p, end), or NULL. qlen >= 3: the
 * search keys on q's second and second-to-last bytes (the first and last
 * letters of a quoted key). */
const char *keyscan_find(const char *p, const char *end, const char *q, size_t qlen);

/* A literal for keyscan_find_any(): q[0 .. qlen), qlen >= 3. */
struct keyscan_key {
	const char *q;
	size_t qlen;
};

#define KEYSCAN_MAX_KEYS 5

/* The first position in [p, end) where any of keys[0 .. n) occurs, or NULL;
 * *which is set to the index of the first of the keys that occurs there.
 * 1 <= n <= KEYSCAN_MAX_KEYS, and all the keys start with the same byte
 * (quoted keys do): NULL otherwise. One pass over the bytes for all the keys:
 * it answers what the earliest of n keyscan_find() calls would, so calling
 * it again from one past a hit visits every occurrence of every key in
 * the order they start. */
const char *keyscan_find_any(const char *p, const char *end, const struct keyscan_key *keys, size_t n, size_t *which);

#endif
