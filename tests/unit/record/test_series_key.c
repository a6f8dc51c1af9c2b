/*
 * test_series_key.c — a series key built from its labels splits back into
 * the same labels; a key that would pass SERIES_KEY_MAX is refused, one
 * that fills it exactly is not; malformed keys (missing separators, a cold
 * flag other than '0' or '1', trailing bytes) are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "series_key.h"

static void test_round_trip(void **state)
{
	char key[SERIES_KEY_MAX];
	const char *route, *upstream, *model;
	bool cold = true;
	size_t len;

	(void)state;
	len = series_key_build(key, "chat", "gpu-a", "llama", false);
	assert_int_equal(len, strlen("chat") + strlen("gpu-a") + strlen("llama") + 4);
	assert_memory_equal(key,
			    "chat\0gpu-a\0llama\0"
			    "0",
			    len);
	assert_int_equal(series_key_parse(key, len, &route, &upstream, &model, &cold), 0);
	assert_string_equal(route, "chat");
	assert_string_equal(upstream, "gpu-a");
	assert_string_equal(model, "llama");
	assert_false(cold);

	len = series_key_build(key, "", "", SERIES_MODEL_UNKNOWN, true);
	assert_int_equal(len, strlen(SERIES_MODEL_UNKNOWN) + 4);
	assert_int_equal(series_key_parse(key, len, &route, &upstream, &model, &cold), 0);
	assert_string_equal(route, "");
	assert_string_equal(upstream, "");
	assert_string_equal(model, SERIES_MODEL_UNKNOWN);
	assert_true(cold);
}

static void test_bound(void **state)
{
	char key[SERIES_KEY_MAX];
	char model[SERIES_KEY_MAX];
	const char *r, *u, *m;
	bool cold;
	size_t len;

	(void)state;
	/* "r\0u\0" + model + "\0" + flag: 6 bytes besides the model */
	memset(model, 'x', sizeof(model));
	model[SERIES_KEY_MAX - 6] = '\0';
	len = series_key_build(key, "r", "u", model, false);
	assert_int_equal(len, SERIES_KEY_MAX);
	assert_int_equal(series_key_parse(key, len, &r, &u, &m, &cold), 0);
	assert_int_equal(strlen(m), SERIES_KEY_MAX - 6);

	model[SERIES_KEY_MAX - 6] = 'x';
	model[SERIES_KEY_MAX - 5] = '\0';
	assert_int_equal(series_key_build(key, "r", "u", model, false), 0);
}

/* A key from an older store whose model is not text: the name comes out
 * as U+FFFD, so that no output built from the store is refused. */
static void test_name_not_text(void **state)
{
	char key[SERIES_KEY_MAX];
	const char *r, *u, *m;
	bool cold;
	size_t len;

	(void)state;
	len = series_key_build(key, "chat", "gpu-a", "bad\xff\xfemodel", false);
	assert_int_equal(series_key_parse(key, len, &r, &u, &m, &cold), 0);
	assert_string_equal(r, "chat");
	assert_string_equal(u, "gpu-a");
	assert_string_equal(m, SERIES_NAME_NOT_TEXT);
	len = series_key_build(key, "chat", "gpu\x1b[2J", "caf\xc3\xa9", true);
	assert_int_equal(series_key_parse(key, len, &r, &u, &m, &cold), 0);
	assert_string_equal(u, SERIES_NAME_NOT_TEXT);
	assert_string_equal(m, "caf\xc3\xa9");
	assert_true(cold);
}

static void test_malformed(void **state)
{
	const char *r, *u, *m;
	bool cold;

	(void)state;
	assert_int_equal(series_key_parse("", 0, &r, &u, &m, &cold), -1);
	assert_int_equal(series_key_parse("a\0b\0c", 5, &r, &u, &m, &cold), -1);   /* no flag */
	assert_int_equal(series_key_parse("a\0b\0c\0", 6, &r, &u, &m, &cold), -1); /* no flag */
	assert_int_equal(series_key_parse("a\0b\0c\0"
					  "2",
					  7, &r, &u, &m, &cold),
			 -1); /* bad flag */
	assert_int_equal(series_key_parse("a\0b\0c\0"
					  "01",
					  8, &r, &u, &m, &cold),
			 -1);							/* trailing */
	assert_int_equal(series_key_parse("a\0bc1", 5, &r, &u, &m, &cold), -1); /* two parts */
	assert_int_equal(series_key_parse("a\0b\0c\0"
					  "1",
					  7, &r, &u, &m, &cold),
			 0);
	assert_true(cold);
}

/* A tenant series' key reads back as one, and only as one: every reader
 * of the model series passes over it. */
static void test_tenant_key(void **state)
{
	char key[SERIES_KEY_MAX];
	const char *route, *upstream, *model, *tenant;
	bool cold;
	(void)state;

	size_t n = series_key_build_tenant(key, "main", "acme");
	assert_true(n > 0);
	assert_true(series_key_is_tenant(key, n));
	assert_int_equal(series_key_parse(key, n, &route, &upstream, &model, &cold), -1);
	assert_int_equal(series_key_parse_tenant(key, n, &route, &tenant), 0);
	assert_string_equal(route, "main");
	assert_string_equal(tenant, "acme");
	n = series_key_build(key, "main", "up", "m", false);
	assert_false(series_key_is_tenant(key, n));
	assert_int_equal(series_key_parse_tenant(key, n, &route, &tenant), -1);
	/* a stored name that is no tenant name reads as U+FFFD */
	n = series_key_build_tenant(key, "main", "a b");
	assert_int_equal(series_key_parse_tenant(key, n, &route, &tenant), 0);
	assert_string_equal(tenant, SERIES_NAME_NOT_TEXT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_bound),
		cmocka_unit_test(test_name_not_text), cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_tenant_key),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
