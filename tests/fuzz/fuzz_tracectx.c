/*
 * fuzz_tracectx.c — libFuzzer target: the W3C Trace Context parsers.
 *
 * Even first byte: the rest is one traceparent value, copied to an
 * allocation of exactly its size (ASan sees a read past it). A value that
 * parses must write back as a version 00 traceparent that parses to the
 * same ids and sampled flag, with ids that are not all zero.
 * Odd first byte: the rest is tracestate header values split at '\n'; a
 * list that is accepted holds at most TRACESTATE_MAX_MEMBERS members and
 * TRACESTATE_MAX_LEN bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "tracectx.h"

static void one_parent(const uint8_t *data, size_t size)
{
	char *s = malloc(size ? size : 1);
	struct trace_ctx t, back;
	char out[TRACEPARENT_LEN + 1];

	if (!s)
		return;
	memcpy(s, data, size);
	if (tracectx_parse(s, size, &t) == 0) {
		CHECK(size >= TRACEPARENT_LEN);
		tracectx_format(&t, out);
		CHECK(strlen(out) == TRACEPARENT_LEN);
		CHECK(tracectx_parse(out, TRACEPARENT_LEN, &back) == 0);
		CHECK(memcmp(back.trace_id, t.trace_id, 16) == 0 && memcmp(back.span_id, t.span_id, 8) == 0);
		CHECK(back.flags == (t.flags & TRACE_FLAG_SAMPLED));
		CHECK(memcmp(out + 3, s + 3, 50) == 0); /* the ids as given: lower-case hex only */
	}
	free(s);
}

static void one_state(const uint8_t *data, size_t size)
{
	struct tracestate_scan sc;
	size_t i = 0;
	int ok = 0;

	memset(&sc, 0, sizeof(sc));
	char **vals = calloc(size + 1, sizeof(char *));
	size_t nv = 0;
	if (!vals)
		return;
	while (i <= size && ok == 0) {
		size_t end = i;
		while (end < size && data[end] != '\n')
			end++;
		char *v = malloc(end - i ? end - i : 1);
		if (!v)
			break;
		memcpy(v, data + i, end - i);
		vals[nv++] = v; /* the scan points into every value: freed at the end */
		ok = tracestate_add(&sc, v, end - i);
		i = end + 1;
	}
	if (ok == 0) {
		CHECK(sc.members <= TRACESTATE_MAX_MEMBERS);
		CHECK(sc.len <= TRACESTATE_MAX_LEN);
	}
	for (size_t k = 0; k < nv; k++)
		free(vals[k]);
	free(vals);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] & 1)
		one_state(data + 1, size - 1);
	else
		one_parent(data + 1, size - 1);
	return 0;
}
