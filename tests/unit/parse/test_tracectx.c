/*
 * test_tracectx.c — the W3C Trace Context parser: every field of a
 * traceparent read back, every invalid form refused, the written form, the
 * tracestate list's syntax and bounds, and the id generator.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tracectx.h"

#define GOOD "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static int parse(const char *s, struct trace_ctx *t)
{
	return tracectx_parse(s, strlen(s), t);
}

static void test_fields(void **state)
{
	struct trace_ctx t;
	char hex[33];
	(void)state;

	assert_int_equal(parse(GOOD, &t), 0);
	tracectx_hex(t.trace_id, 16, hex);
	assert_string_equal(hex, "4bf92f3577b34da6a3ce929d0e0e4736");
	tracectx_hex(t.span_id, 8, hex);
	assert_string_equal(hex, "00f067aa0ba902b7");
	assert_int_equal(t.flags, 1);
	assert_int_equal(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", &t), 0);
	assert_int_equal(t.flags, 0);
	/* unknown flag bits are read (and not written back: test_format) */
	assert_int_equal(parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", &t), 0);
	assert_int_equal(t.flags, 0xff);
}

static void test_invalid(void **state)
{
	static const char *const bad[] = {
		"",
		"00",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",   /* short flags */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011", /* 00 is exactly 55 */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", /* 00 has no more fields */
		"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",  /* dash moved */
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* separator */
		"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  /* upper case trace id */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",  /* upper case parent id */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",  /* upper case flags */
		"0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* upper case version */
		"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  /* non-hex trace id */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",  /* non-hex parent id */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",  /* non-hex flags */
		"x0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* non-hex version */
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  /* zero trace id */
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  /* zero parent id */
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  /* version ff */
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", /* later version: '-' after */
		" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* whitespace is the caller's */
	};
	struct trace_ctx t;
	(void)state;

	memset(&t, 0x5a, sizeof(t));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (parse(bad[i], &t) != -1)
			fail_msg("accepted: '%s'", bad[i]);
		assert_int_equal(t.flags, 0x5a); /* untouched */
	}
}

/* A later version is read by its first fields: what follows them must
 * start with '-', and is ignored. */
static void test_future_version(void **state)
{
	struct trace_ctx t;
	char hex[17];
	(void)state;

	assert_int_equal(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &t), 0);
	assert_int_equal(parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-ever", &t), 0);
	tracectx_hex(t.span_id, 8, hex);
	assert_string_equal(hex, "00f067aa0ba902b7");
	assert_int_equal(t.flags, 0);
}

static void test_format(void **state)
{
	struct trace_ctx t;
	char out[TRACEPARENT_LEN + 1];
	(void)state;

	assert_int_equal(parse(GOOD, &t), 0);
	tracectx_format(&t, out);
	assert_string_equal(out, GOOD);
	t.flags = 0xfe; /* only the sampled bit is passed on */
	tracectx_format(&t, out);
	assert_string_equal(out, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
	assert_int_equal(parse(out, &t), 0);
}

static int state_of(const char *const *vals, size_t n)
{
	struct tracestate_scan sc;

	memset(&sc, 0, sizeof(sc));
	for (size_t i = 0; i < n; i++)
		if (tracestate_add(&sc, vals[i], strlen(vals[i])) == -1)
			return -1;
	return (int)sc.members;
}

static int state1(const char *v)
{
	return state_of(&v, 1);
}

static void test_tracestate(void **state)
{
	char big[600];
	(void)state;

	assert_int_equal(state1("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"), 2);
	assert_int_equal(state1(" rojo=1 ,\tcongo=2\t"), 2);
	assert_int_equal(state1("rojo=1,,congo=2"), 2); /* empty members are allowed */
	assert_int_equal(state1(""), 0);
	assert_int_equal(state1("a-b_c*d/e=x y"), 1);
	assert_int_equal(state1("tenant1@sys=v"), 1);
	assert_int_equal(state1("1tenant@sys=v"), 1);
	const char *two[] = { "rojo=1", "congo=2" };
	assert_int_equal(state_of(two, 2), 2);

	assert_int_equal(state1("rojo"), -1);		     /* no '=' */
	assert_int_equal(state1("Rojo=1"), -1);		     /* upper case key */
	assert_int_equal(state1("1rojo=1"), -1);	     /* a simple key starts with a letter */
	assert_int_equal(state1("rojo="), -1);		     /* empty value */
	assert_int_equal(state1("rojo=a=b"), -1);	     /* '=' in the value */
	assert_int_equal(state1("rojo=a\x01"), -1);	     /* control character */
	assert_int_equal(state1("rojo=1,rojo=2"), -1);	     /* a key twice */
	assert_int_equal(state1("t@Sys=1"), -1);	     /* system id starts lower case */
	assert_int_equal(state1("t@sys@x=1"), -1);	     /* one '@' */
	assert_int_equal(state1("t@abcdefghijklmno=1"), -1); /* system id of 15 */
	const char *dup[] = { "rojo=1", "rojo=2" };
	assert_int_equal(state_of(dup, 2), -1); /* across headers too */

	/* at most 32 members */
	size_t n = 0;
	for (int i = 0; i < 32; i++)
		n += (size_t)snprintf(big + n, sizeof(big) - n, "%sk%d=v", i ? "," : "", i);
	assert_int_equal(state1(big), 32);
	snprintf(big + n, sizeof(big) - n, ",k32=v");
	assert_int_equal(state1(big), -1);

	/* at most 512 bytes, joined with ',' across headers */
	memset(big, 'v', sizeof(big));
	memcpy(big, "k=", 2);
	big[512] = '\0';
	assert_int_equal(state1(big), -1); /* value of 510: over 256 */
	char a[300], b[300];
	memset(a, 'v', sizeof(a));
	memcpy(a, "ka=", 3);
	a[258] = '\0'; /* 258 bytes, a value of 255 */
	memset(b, 'v', sizeof(b));
	memcpy(b, "kb=", 3);
	b[253] = '\0'; /* 258 + 1 + 253 = 512 */
	const char *fits[] = { a, b };
	assert_int_equal(state_of(fits, 2), 2);
	b[253] = 'v';
	b[254] = '\0'; /* 513 */
	assert_int_equal(state_of(fits, 2), -1);
}

static void test_rng(void **state)
{
	struct trace_rng r = { 12345 };
	uint8_t a[16], b[16];
	unsigned ones = 0;
	(void)state;

	trace_rng_id(&r, a, 16);
	trace_rng_id(&r, b, 16);
	assert_memory_not_equal(a, b, 16);
	for (int i = 0; i < 10000; i++) {
		double u = trace_rng_unit(&r);
		assert_true(u >= 0 && u < 1);
		ones += u < 0.5;
	}
	/* binomial(10000, 0.5): sd 50; 5 sd either side */
	assert_in_range(ones, 4750, 5250);
	struct trace_rng z = { 0 };
	uint8_t s[8];
	trace_rng_id(&z, s, 8);
	assert_memory_not_equal(s, (uint8_t[8]){ 0 }, 8);
}

/* The samplers: names both ways, the parent's flag, and the ratio on the
 * trace id's last 8 bytes (big-endian) against ratio * 2^64. */
static void test_samplers(void **state)
{
	(void)state;
	for (int i = 0; i < SAMPLER__COUNT; i++)
		assert_int_equal(trace_sampler_parse(trace_sampler_name((enum trace_sampler)i)), i);
	assert_int_equal(trace_sampler_parse("AlwaysOn"), -1);
	assert_int_equal(trace_sampler_parse(""), -1);
	assert_int_equal(trace_sampler_parse(NULL), -1);

	uint8_t low[16] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
			    0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	uint8_t high[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0 };
	struct trace_ctx on = { .flags = TRACE_FLAG_SAMPLED }, off = { .flags = 0 };
	/* 0x7fff... is below 2^63, 0x8000... is not: the boundary of 0.5 */
	assert_true(trace_sample(SAMPLER_RATIO, 0.5, low, &off));
	assert_false(trace_sample(SAMPLER_RATIO, 0.5, high, &on));
	assert_false(trace_sample(SAMPLER_RATIO, 0, low, NULL));
	assert_true(trace_sample(SAMPLER_RATIO, 1, high, NULL));
	assert_true(trace_sample(SAMPLER_PARENT_RATIO, 0, low, &on));
	assert_false(trace_sample(SAMPLER_PARENT_RATIO, 1, low, &off));
	assert_true(trace_sample(SAMPLER_PARENT_RATIO, 0.5, low, NULL));
	assert_false(trace_sample(SAMPLER_PARENT_RATIO, 0.5, high, NULL));
	assert_true(trace_sample(SAMPLER_PARENT_ON, 0, high, NULL));
	assert_false(trace_sample(SAMPLER_PARENT_ON, 1, high, &off));
	assert_true(trace_sample(SAMPLER_PARENT_ON, 0, high, &on));
	assert_true(trace_sample(SAMPLER_ON, 0, high, &off));
	assert_false(trace_sample(SAMPLER_OFF, 1, low, &on));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fields),	       cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_future_version), cmocka_unit_test(test_format),
		cmocka_unit_test(test_tracestate),     cmocka_unit_test(test_rng),
		cmocka_unit_test(test_samplers),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
