/*
 * test_tenant.c — tenant names from header values and JSON fields (kept,
 * trimmed, refused as "invalid"), the bearer token's extraction, and the API
 * key's SHA-256 and salted label against values computed with Python's
 * hashlib and hmac.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "tenant.h"

static int take(const char *s, char *out)
{
	return tenant_take(s, strlen(s), out);
}

static void test_take(void **state)
{
	char out[TENANT_MAX + 1], big[TENANT_MAX + 2];
	(void)state;

	assert_int_equal(take("acme", out), 1);
	assert_string_equal(out, "acme");
	assert_int_equal(take(" \tteam-1/a.b:c@d+e=f~g_h \t", out), 1);
	assert_string_equal(out, "team-1/a.b:c@d+e=f~g_h");
	assert_int_equal(take("", out), 0);
	assert_string_equal(out, "");
	assert_int_equal(take("   ", out), 0);
	static const char *const bad[] = { "a b",      "a\"b",	"a\\b",	    "a,b", "{x}", "caf\xc3\xa9",
					   "\x80\xff", "a\x01", "<script>", "a;b", "a'b", "a\nb" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(take(bad[i], out), -1);
		assert_string_equal(out, TENANT_INVALID);
	}
	/* a NUL inside: refused, not cut there */
	assert_int_equal(tenant_take("ab\0cd", 5, out), -1);
	memset(big, 'x', sizeof(big));
	assert_int_equal(tenant_take(big, TENANT_MAX, out), 1);
	assert_int_equal(strlen(out), TENANT_MAX);
	assert_int_equal(tenant_take(big, TENANT_MAX + 1, out), -1);
	assert_string_equal(out, TENANT_INVALID);
}

static void test_bearer(void **state)
{
	const char *tok;
	size_t n;
	(void)state;

	assert_true(tenant_bearer("Bearer sk-1", 11, &tok, &n));
	assert_int_equal(n, 4);
	assert_memory_equal(tok, "sk-1", 4);
	assert_true(tenant_bearer("  bEaReR \t sk-2  ", 17, &tok, &n));
	assert_int_equal(n, 4);
	assert_memory_equal(tok, "sk-2", 4);
	assert_false(tenant_bearer("Bearer", 6, &tok, &n));
	assert_false(tenant_bearer("Bearer   ", 9, &tok, &n));
	assert_false(tenant_bearer("Basic abc", 9, &tok, &n));
	assert_false(tenant_bearer("Bearerabc", 9, &tok, &n));
}

static void test_hashes(void **state)
{
	char hex[65], label[TENANT_MAX + 1];
	(void)state;

	tenant_key_sha256("abc", 3, hex);
	assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	/* hmac.new(b"0123456789abcdef", b"sk-test", sha256).hexdigest()[:16] */
	tenant_key_label("0123456789abcdef", 16, "sk-test", 7, label);
	assert_string_equal(label, "key-fa9e1d36d8db0969");
	assert_true(tenant_name_ok(label, strlen(label)));
	char other[TENANT_MAX + 1];
	tenant_key_label("0123456789abcdeF", 16, "sk-test", 7, other);
	assert_string_not_equal(label, other); /* the salt changes it */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_take),
		cmocka_unit_test(test_bearer),
		cmocka_unit_test(test_hashes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
