/*
 * test_stats.c — the per-route tenant cap of the stats shard: a tenant
 * takes a slot only with a successful answer; past the cap a new one is
 * "other"; the labels that are no client's name (none, invalid, other)
 * take no slot; a tenant idle for tenant.idle gives its slot up; and the
 * model cap is a list of its own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "config.h"
#include "stats.h"
#include "tenant.h"

static struct stats_shard *shard(unsigned cap, uint64_t idle_ms)
{
	struct config c;
	config_defaults(&c);
	c.max_tenants = cap;
	c.tenant_idle_ms = idle_ms;
	struct stats_shard *sh = stats_shard_new(NULL, NULL, &c);
	config_free(&c);
	assert_non_null(sh);
	return sh;
}

static void test_cap_and_other(void **state)
{
	struct stats_shard *sh = shard(2, 0);
	char name[32];
	(void)state;

	struct series *other = stats_tenant_series(sh, "cap", TENANT_OTHER, true);
	assert_non_null(other);
	/* a refused answer takes no slot */
	for (int i = 0; i < 10; i++) {
		snprintf(name, sizeof(name), "bad-%d", i);
		assert_ptr_equal(stats_tenant_series(sh, "cap", name, false), other);
	}
	struct series *a = stats_tenant_series(sh, "cap", "a", true), *b = stats_tenant_series(sh, "cap", "b", true);
	assert_non_null(a);
	assert_non_null(b);
	assert_ptr_not_equal(a, other);
	assert_ptr_not_equal(a, b);
	/* a flood of new names: all other, the two stay */
	for (int i = 0; i < 1000; i++) {
		snprintf(name, sizeof(name), "flood-%d", i);
		assert_ptr_equal(stats_tenant_series(sh, "cap", name, true), other);
	}
	assert_ptr_equal(stats_tenant_series(sh, "cap", "a", true), a);
	assert_ptr_equal(stats_tenant_series(sh, "cap", "b", false), b); /* a failure stays under its name */
	/* fixed labels take no slot, even on a full route */
	struct series *none = stats_tenant_series(sh, "cap", "", true);
	assert_ptr_equal(stats_tenant_series(sh, "cap", TENANT_ABSENT, true), none);
	struct series *inv = stats_tenant_series(sh, "cap", TENANT_INVALID, false);
	assert_non_null(inv);
	assert_ptr_not_equal(inv, other);
	assert_ptr_not_equal(none, other);
	/* another route has its own slots */
	assert_ptr_not_equal(stats_tenant_series(sh, "cap-2", "flood-1", true),
			     stats_tenant_series(sh, "cap-2", TENANT_OTHER, true));
	/* the model cap is not the tenant cap */
	assert_non_null(stats_series(sh, "cap", "up", "m", false, true));
	stats_shard_free(sh);
}

static void test_idle(void **state)
{
	struct stats_shard *sh = shard(1, 50);
	struct timespec ts = { 0, 120 * 1000000L };
	(void)state;

	struct series *old = stats_tenant_series(sh, "idle", "old", true);
	struct series *other = stats_tenant_series(sh, "idle", TENANT_OTHER, true);
	assert_ptr_not_equal(old, other);
	assert_ptr_equal(stats_tenant_series(sh, "idle", "new", true), other);
	nanosleep(&ts, NULL);
	struct series *nw = stats_tenant_series(sh, "idle", "new", true);
	assert_ptr_not_equal(nw, other);
	assert_ptr_not_equal(nw, old);
	assert_ptr_equal(stats_tenant_series(sh, "idle", "old", true), other); /* lost its slot */
	stats_shard_free(sh);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cap_and_other),
		cmocka_unit_test(test_idle),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
