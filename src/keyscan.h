/*
 * keyscan.h — finding a quoted literal such as "usage" in JSON bytes.
 *
 * classify.c runs this over every streamed event, usually to the event's
 * end (most events hold no "usage"), so it is the one scan on the per-event
 * path worth vector code. It answers exactly what memmem() would.
 */
#ifndef TOKENTAP_KEYSCAN_H
#define TOKENTAP_KEYSCAN_H

#include <stddef.h>

/* The first occurrence of q[0 .. qlen) in [p, end), or NULL. qlen >= 3: the
 * search keys on q's second and second-to-last bytes (the first and last
 * letters of a quoted key). */
const char *keyscan_find(const char *p, const char *end, const char *q, size_t qlen);

#endif
