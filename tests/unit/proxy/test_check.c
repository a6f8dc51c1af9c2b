/*
 * test_check.c — magic numbers on the main objects (src/base/check.h): a
 * callback on a freed object aborts with the object named, rather than
 * reading freed memory and carrying on.
 *
 * In a build without NDEBUG (the sanitizer, fuzz and Debug builds):
 * - CHECK_OBJ on an object whose magic was cleared (freed) aborts, on a
 *   live one it does nothing;
 * - request_record, the entry the client calls once per request, aborts on
 *   a request that request_new did not make (no magic), before reading it;
 * - each of client, request, exchange and upconn carries the field.
 * In a build with NDEBUG the field is absent and CHECK_OBJ does nothing.
 * Each case that may abort runs in a child process; the parent waits for
 * SIGABRT (or a clean exit).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "check.h"
#include "client.h"
#include "exchange.h"
#include "log.h"
#include "request.h"
#include "upstream.h"

#define THING_MAGIC 0x54484e47u

struct thing {
	OBJ_MAGIC_FIELD
	int value;
};

/* Runs fn(arg) in a child; returns the signal that ended it, or 0 when it
 * returned (its exit status 0). */
static int run_child(void (*fn)(void *), void *arg)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid != -1);
	if (pid == 0) {
		fn(arg);
		_exit(0);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (WIFSIGNALED(st))
		return WTERMSIG(st);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	return 0;
}

static void check_thing(void *arg)
{
	struct thing *t = arg;

	CHECK_OBJ(t, THING_MAGIC);
	t->value++;
}

static void test_check_obj(void **state)
{
	struct thing t = { .value = 0 };

	(void)state;
	OBJ_MAGIC_SET(&t, THING_MAGIC);
	assert_int_equal(run_child(check_thing, &t), 0); /* live */
	OBJ_MAGIC_CLEAR(&t);
#ifndef NDEBUG
	assert_int_equal(run_child(check_thing, &t), SIGABRT); /* freed */
	assert_int_equal(run_child(check_thing, NULL), SIGABRT);
#else
	assert_int_equal(run_child(check_thing, &t), 0); /* compiled out */
	assert_int_equal(sizeof(struct thing), sizeof(int));
#endif
}

#ifndef NDEBUG
static void record_foreign(void *arg)
{
	request_record(arg);
}
#endif

static void test_request_record_checks(void **state)
{
	(void)state;
#ifndef NDEBUG
	/* not made by request_new: zeroed, as freed memory reused would be */
	struct request *req = calloc(1, sizeof(*req));
	assert_non_null(req);
	assert_int_equal(run_child(record_foreign, req), SIGABRT);
	free(req);
	/* the field comes first in each main object */
	assert_int_equal(offsetof(struct client, magic), 0);
	assert_int_equal(offsetof(struct request, magic), 0);
	assert_int_equal(offsetof(struct exchange, magic), 0);
	assert_int_equal(offsetof(struct upconn, magic), 0);
#else
	skip();
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_check_obj),
		cmocka_unit_test(test_request_record_checks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
