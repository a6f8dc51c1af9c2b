/*
 * varint.h — LEB128 unsigned varints for the compact storage encodings.
 *
 * varint_get never reads past `end` and rejects encodings longer than ten
 * bytes or overflowing 64 bits, so hostile input fails cleanly.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define VARINT_MAX 10

/* Writes `v` at `p` (room for VARINT_MAX bytes); returns bytes written. */
static inline size_t varint_put(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

/* Bytes varint_put writes for `v`. */
static inline size_t varint_len(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/* Reads one varint from [*p, end); advances *p. Returns 0 or -1. */
static inline int varint_get(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
	uint64_t v = 0;
	unsigned shift = 0;
	const uint8_t *q = *p;

	while (q < end && shift < 64) {
		uint8_t b = *q++;
		if (shift == 63 && (b & 0x7e))
			return -1; /* more than 64 bits */
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*p = q;
			*out = v;
			return 0;
		}
		shift += 7;
	}
	return -1;
}
