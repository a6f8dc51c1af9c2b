/*
 * test_fdlimit.c — the descriptor estimate (fdlimit_need) that the start-up
 * warning compares the limit with: the formula docs/security.md
 * ("Descriptors") states, term by term; and fdlimit_fit, which lowers a
 * limits.max_connections the user did not set to what the limit holds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>

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

/* fdlimit_fit lowers a cap the user did not set to what the soft limit
 * holds beside the rest of the estimate, and leaves one the user set. */
static void test_fit_lowers_only_a_default_cap(void **state)
{
	struct config c;
	struct upstream_conf up = { .name = "a", .url = "http://127.0.0.1:1" };
	struct rlimit was, rl;

	(void)state;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &was), 0);
	if (was.rlim_max != RLIM_INFINITY && was.rlim_max < 400)
		skip();
	rl = was;
	rl.rlim_cur = 400;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	config_defaults(&c);
	c.upstreams = &up;
	c.nupstreams = 1;
	/* 357 beside the clients on one worker (FIXED + 4 + 1 + 256): 21 fit */
	assert_int_equal(fdlimit_fit(&c, 1), 21);
	assert_int_equal(c.max_connections, 21);
	assert_true(fdlimit_need(&c, 1) <= 400);
	assert_int_equal(fdlimit_fit(&c, 1), 0); /* already fits */
	/* two workers: 618 beside the clients, above the limit: the least, 1 */
	c.max_connections = 10000;
	assert_int_equal(fdlimit_fit(&c, 2), 1);
	/* set by the user: kept */
	c.max_connections = 10000;
	c.max_connections_explicit = true;
	assert_int_equal(fdlimit_fit(&c, 1), 0);
	assert_int_equal(c.max_connections, 10000);
	config_free(&c);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &was), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults_one_upstream),
		cmocka_unit_test(test_mirrors_and_upstreams_count_per_worker),
		cmocka_unit_test(test_fit_lowers_only_a_default_cap),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
