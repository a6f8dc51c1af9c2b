/*
 * tracectx.h — W3C Trace Context: the `traceparent` and `tracestate` header
 * values parsed and checked, a traceparent written, and the ids' random
 * generator. Parsers only: no I/O, no allocation.
 *
 * A traceparent is `VV-TTTT...(32)-PPPP...(16)-FF`, lower-case hex. Version
 * 00 is exactly 55 bytes; a later version (not ff) is read by these first
 * fields, and whatever follows them must start with '-'. All-zero trace or
 * parent ids are invalid. A tracestate is a list of at most
 * TRACESTATE_MAX_MEMBERS `key=value` members, TRACESTATE_MAX_LEN bytes.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRACEPARENT_LEN 55	  /* version 00, and what tracectx_format writes */
#define TRACESTATE_MAX_MEMBERS 32 /* list members; more: the whole header is dropped */
#define TRACESTATE_MAX_LEN 512	  /* bytes, all tracestate headers joined with ',' */
#define TRACE_FLAG_SAMPLED 0x01

/* One position in a trace: the trace, and the span that is the parent of
 * whoever receives it. */
struct trace_ctx {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t flags; /* TRACE_FLAG_SAMPLED, as received */
};

/* Parses a traceparent value (no surrounding whitespace). 0, or -1 when it
 * is not a valid one (out untouched). */
__attribute__((warn_unused_result)) int tracectx_parse(const char *s, size_t len, struct trace_ctx *out);

/* Writes `t` as a version 00 traceparent: TRACEPARENT_LEN characters and a
 * NUL into out[TRACEPARENT_LEN + 1]. Only the sampled flag is written: the
 * other bits of version 00 are not defined for a vendor to pass on. */
void tracectx_format(const struct trace_ctx *t, char out[TRACEPARENT_LEN + 1]);

/* Lower-case hex of n bytes into out[2n + 1]. */
void tracectx_hex(const uint8_t *b, size_t n, char *out);

/* A tracestate list being checked, one header value at a time. */
struct tracestate_scan {
	unsigned members;
	size_t len; /* of the values joined with ',' */
	struct {
		const char *key;
		size_t len;
	} keys[TRACESTATE_MAX_MEMBERS];
};

/* Adds one tracestate header's value to the scan (zeroed before the first):
 * 0, or -1 when the list so far is invalid (a malformed member, a key twice,
 * more than TRACESTATE_MAX_MEMBERS members or TRACESTATE_MAX_LEN bytes).
 * The keys point into `s`, which must outlive the scan. */
__attribute__((warn_unused_result)) int tracestate_add(struct tracestate_scan *sc, const char *s, size_t len);

/* A fast generator for trace and span ids (splitmix64): one per worker,
 * seeded from getrandom. Unpredictable enough for ids, not for secrets. */
struct trace_rng {
	uint64_t s;
};

uint64_t trace_rng_next(struct trace_rng *r);
/* A uniform draw in [0, 1). */
double trace_rng_unit(struct trace_rng *r);
/* A new trace id (16 bytes) or span id (8 bytes): random, never all zero. */
void trace_rng_id(struct trace_rng *r, uint8_t *out, size_t n);

/* The samplers of OpenTelemetry's OTEL_TRACES_SAMPLER (docs/observability.md). */
enum trace_sampler {
	SAMPLER_PARENT_ON,    /* parentbased_always_on: the parent's flag; a root sampled */
	SAMPLER_PARENT_RATIO, /* parentbased_traceidratio: the parent's flag; a root by its trace id */
	SAMPLER_ON,	      /* always_on */
	SAMPLER_OFF,	      /* always_off */
	SAMPLER_RATIO,	      /* traceidratio: by the trace id, the parent's flag ignored */
	SAMPLER__COUNT
};

/* The sampler of that name; -1 when none is (case matters, as in the SDKs). */
int trace_sampler_parse(const char *name);
const char *trace_sampler_name(enum trace_sampler s);

/* Whether a span of trace `trace_id` is sampled: `parent` is the client's
 * context (NULL: a new root). The ratio decision takes the trace id's last
 * 8 bytes as a big-endian number and samples when it is below ratio * 2^64,
 * so every service deciding on the same trace id and ratio agrees (the
 * W3C random part of a trace id is its right-most 7 bytes). */
bool trace_sample(enum trace_sampler s, double ratio, const uint8_t trace_id[16], const struct trace_ctx *parent);
