/*
 * test_control.c — the job queue between the admin thread and a worker
 * loop (control.c): a change whose caller timed out before the worker got
 * to it is never applied later, so that the caller's 503 is true; one the
 * worker had started is waited for, so that its answer is true too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "control.h"

struct counter {
	atomic_int runs;
	unsigned sleep_ms; /* how long each run takes */
};

static char *count_job(void *ctx, const char *in, int *status)
{
	struct counter *c = ctx;
	struct timespec ts = { (time_t)(c->sleep_ms / 1000), (long)(c->sleep_ms % 1000) * 1000000L };

	if (c->sleep_ms)
		nanosleep(&ts, NULL);
	atomic_fetch_add(&c->runs, 1);
	*status = 200;
	return strdup("{}");
}

struct call {
	struct control *ctl;
	struct counter *counter;
	uint64_t timeout_ms;
	int rc, status;
	char *out;
};

static void *caller(void *p)
{
	struct call *c = p;
	c->rc = control_call_cancel(c->ctl, count_job, c->counter, NULL, &c->out, &c->status, c->timeout_ms);
	return NULL;
}

/* The worker is busy (its loop does not run) past the caller's deadline:
 * the call fails, and when the loop runs again the job is not run. */
static void test_timed_out_job_is_never_run(void **state)
{
	struct event_base *base = event_base_new();
	struct control *ctl = control_new(base);
	struct counter counter = { 0 };
	struct call call = { ctl, &counter, 50, 0, 0, NULL };
	pthread_t t;

	assert_non_null(ctl);
	assert_int_equal(pthread_create(&t, NULL, caller, &call), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(call.rc, -1);
	assert_null(call.out);
	/* the worker gets to its queue now */
	event_base_loop(base, EVLOOP_NONBLOCK);
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(atomic_load(&counter.runs), 0);
	control_free(ctl);
	event_base_free(base);
}

static void *loop_once(void *p)
{
	event_base_loop(p, EVLOOP_ONCE);
	return NULL;
}

/* A job the worker started before the deadline is waited for: it ran, so
 * the caller must hear that it did. */
static void test_started_job_is_waited_for(void **state)
{
	struct event_base *base = event_base_new();
	struct control *ctl = control_new(base);
	struct counter counter = { 0, 600 };
	struct call call = { ctl, &counter, 200, 0, 0, NULL };
	pthread_t worker, t;

	assert_non_null(ctl);
	assert_int_equal(pthread_create(&worker, NULL, loop_once, base), 0);
	assert_int_equal(pthread_create(&t, NULL, caller, &call), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(pthread_join(worker, NULL), 0);
	assert_int_equal(call.rc, 0);
	assert_int_equal(call.status, 200);
	assert_string_equal(call.out, "{}");
	assert_int_equal(atomic_load(&counter.runs), 1);
	free(call.out);
	control_free(ctl);
	event_base_free(base);
}

/* control_call keeps running a job whose caller gave up (a reload job owns
 * the configuration it carries). */
static void test_plain_call_still_runs_late(void **state)
{
	struct event_base *base = event_base_new();
	struct control *ctl = control_new(base);
	struct counter counter = { 0 };
	char *out = NULL;
	int status = 0;

	assert_non_null(ctl);
	assert_int_equal(control_call(ctl, count_job, &counter, NULL, &out, &status, 20), -1);
	event_base_loop(base, EVLOOP_NONBLOCK);
	assert_int_equal(atomic_load(&counter.runs), 1);
	control_free(ctl);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_timed_out_job_is_never_run),
		cmocka_unit_test(test_started_job_is_waited_for),
		cmocka_unit_test(test_plain_call_still_runs_late),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
