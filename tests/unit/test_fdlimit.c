/*
 * test_fdlimit.c — the descriptor estimate (fdlimit_need) that the start-up
 * warning compares the limit with: the formula docs/security.md
 * ("Descriptors") states, term by term.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "config.h"
#include "fdlimit.h"
#include "upstream.h"

/* 32 fixed + the admin API's 64 */
#define FIXED (32 + ADMIN_MAX_CONNECTIONS)

static void test_defaults_one_upstream(void **state)
{
	struct config c;
	struct upstream_conf up = { .name = "a", .url = "http://127.0.0.1:1" };

	(void)state;
	config_defaults(&c);
	c.upstreams = &up;
	c.nupstreams = 1;
	/* one listener; per worker: 4 + 1 listener + 256 pooled */
	assert_int_equal(POOL_MAX_IDLE, 256);
	assert_int_equal(fdlimit_need(&c, 1), FIXED + 2 * 10000 + 261);
	assert_int_equal(fdlimit_need(&c, 2), FIXED + 2 * 10000 + 2 * 261);
	c.max_connections = 100;
	assert_int_equal(fdlimit_need(&c, 1), FIXED + 200 + 261);
	config_free(&c);
}

static void test_mirrors_and_upstreams_count_per_worker(void **state)
{
	struct config c;
	struct upstream_conf ups[3] = { { .name = "a" }, { .name = "b" }, { .name = "c" } };
	struct route_conf routes[2] = { { .name = "m", .mirror_upstream = "c", .mirror_max_in_flight = 10 },
					{ .name = "plain" } };

	(void)state;
	config_defaults(&c);
	c.upstreams = ups;
	c.nupstreams = 3;
	c.routes = routes;
	c.nroutes = 2;
	c.max_connections = 50;
	/* per worker: 4 + 1 listener + 3 × 256 pooled + 10 mirrored */
	assert_int_equal(fdlimit_need(&c, 3), FIXED + 100 + 3 * (5 + 3 * 256 + 10));
	config_free(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_one_upstream),
		cmocka_unit_test(test_mirrors_and_upstreams_count_per_worker),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
