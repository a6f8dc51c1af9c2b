/*
 * test_exchange_fsm.c — the two state machines of a client connection:
 * the exchange's (exchange.c, EXCHANGE_STATES) and the client's (client.c,
 * CLIENT_STATES). Each legal transition (the diagrams at the top of
 * client.c and exchange.c) is accepted and every other pair refused, each
 * state runs the timer EXCHANGE_STATES names for it, exchange_set_state sets and clears x->timer by that
 * rule (the idle clock left alone between STREAMING and PAUSED, nothing
 * armed while an upstream's close is pending), and an illegal transition
 * aborts the process (CHECK) instead of carrying on.
 *
 * The expected tables are written out here, apart from the code's, so that
 * a wrong bit in either shows.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>
#include <fcntl.h>

#include "client.h"
#include "exchange.h"

#define B(s) (1u << XS_##s)
#define ALL_BUT_DONE \
	(B(NEW) | B(AWAIT_BODY) | B(AWAIT_CHUNK) | B(ROUTING) | B(QUEUED) | B(CONNECTING) | B(SENDING) | \
	 B(AWAIT_HEAD) | B(STREAMING) | B(PAUSED) | B(TUNNEL))

/* For each target state, the states it may be entered from: the other way
 * round from the code's table (from a state, where it may go), so that the
 * two are written independently and a wrong bit in either shows. */
static const unsigned entered_from[XS__COUNT] = {
	[XS_NEW] = 0,
	[XS_AWAIT_BODY] = B(NEW),
	[XS_AWAIT_CHUNK] = B(NEW),
	/* back from CONNECTING on a refused connection, from SENDING,
	 * AWAIT_HEAD or STREAMING (the head held) on a missed ttft_deadline */
	[XS_ROUTING] =
		B(NEW) | B(AWAIT_BODY) | B(AWAIT_CHUNK) | B(CONNECTING) | B(SENDING) | B(AWAIT_HEAD) | B(STREAMING),
	[XS_QUEUED] = B(ROUTING),
	[XS_CONNECTING] = B(ROUTING) | B(QUEUED) | B(SENDING) | B(AWAIT_HEAD),
	[XS_SENDING] = B(CONNECTING),
	[XS_AWAIT_HEAD] = B(SENDING),
	[XS_STREAMING] = B(SENDING) | B(AWAIT_HEAD) | B(PAUSED),
	[XS_PAUSED] = B(STREAMING),
	[XS_TUNNEL] = B(STREAMING), /* a WebSocket's 101 parsed */
	[XS_DONE] = ALL_BUT_DONE,
};

static const enum xtimer want_timer[XS__COUNT] = {
	[XS_NEW] = XT_NONE,	[XS_AWAIT_BODY] = XT_NONE,	 [XS_AWAIT_CHUNK] = XT_NONE,
	[XS_ROUTING] = XT_NONE, [XS_QUEUED] = XT_QUEUE,		 [XS_CONNECTING] = XT_CONNECT,
	[XS_SENDING] = XT_NONE, [XS_AWAIT_HEAD] = XT_FIRST_BYTE, [XS_STREAMING] = XT_IDLE,
	[XS_PAUSED] = XT_IDLE,	[XS_TUNNEL] = XT_NONE, /* the tunnel times itself */
	[XS_DONE] = XT_NONE,
};

static bool want_legal(enum xstate from, enum xstate to)
{
	return (entered_from[to] >> from) & 1u;
}

static void test_exchange_transitions(void **state)
{
	unsigned legal = 0;

	(void)state;
	for (int from = 0; from < XS__COUNT; from++) {
		for (int to = 0; to < XS__COUNT; to++) {
			bool got = exchange_transition_legal((enum xstate)from, (enum xstate)to);
			if (got != want_legal((enum xstate)from, (enum xstate)to))
				fail_msg("%s -> %s: %s, expected %s", exchange_state_name((enum xstate)from),
					 exchange_state_name((enum xstate)to), got ? "legal" : "refused",
					 got ? "refused" : "legal");
			legal += got;
		}
	}
	assert_int_equal(legal, 32); /* the 32 pairs of the table above */
	/* out of range is refused, never read past the table */
	assert_false(exchange_transition_legal((enum xstate)XS__COUNT, XS_DONE));
	assert_false(exchange_transition_legal(XS_NEW, (enum xstate)XS__COUNT));
}

static void test_exchange_timers(void **state)
{
	(void)state;
	for (int s = 0; s < XS__COUNT; s++)
		if (exchange_state_timer((enum xstate)s) != want_timer[s])
			fail_msg("%s runs timer %d, expected %d", exchange_state_name((enum xstate)s),
				 exchange_state_timer((enum xstate)s), want_timer[s]);
	assert_string_equal(exchange_state_name(XS_NEW), "NEW");
	assert_string_equal(exchange_state_name(XS_AWAIT_HEAD), "AWAIT_HEAD");
	assert_string_equal(exchange_state_name(XS_DONE), "DONE");
}

/* An exchange with what exchange_set_state touches: its log id, its
 * upstream (the timeouts) and its timer. */
struct fixture {
	struct event_base *base;
	struct upstream up;
	struct exchange x;
};

#define QUEUE_MS 100000u
#define CONNECT_MS 200000u
#define FIRST_BYTE_MS 300000u
#define IDLE_MS 400000u

static void noop_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd, (void)what, (void)arg;
}

static void fixture_init(struct fixture *f)
{
	memset(f, 0, sizeof(*f));
	f->base = event_base_new();
	assert_non_null(f->base);
	f->x.log_id = 1;
	f->up.name = "up";
	f->up.conf.queue_timeout_ms = QUEUE_MS;
	f->up.connect_timeout_ms = CONNECT_MS;
	f->up.first_byte_timeout_ms = FIRST_BYTE_MS;
	f->up.idle_timeout_ms = IDLE_MS;
	f->x.up = &f->up;
	f->x.timer.ev = evtimer_new(f->base, noop_timer, NULL);
	assert_non_null(f->x.timer.ev);
}

static void fixture_free(struct fixture *f)
{
	event_free(f->x.timer.ev);
	event_base_free(f->base);
}

/* When the timer acts (its deadline, loop.h: the event itself may be armed
 * to fire earlier and find it not due), in µs; 0 when nothing is due. An
 * armed deadline always has its event armed, to fire no later than it. */
static uint64_t expiry_us(struct fixture *f)
{
	struct timeval tv;

	if (!f->x.timer.due_ns)
		return 0;
	assert_true(evtimer_pending(f->x.timer.ev, &tv));
	return f->x.timer.due_ns / 1000u;
}

/* The timer is due about `ms` from now: within 5 s either way (the test's
 * own steps take far less). The durations differ by 100 s, so the margin
 * still tells them apart. */
static void assert_armed_for(struct fixture *f, uint64_t ms)
{
	uint64_t at = expiry_us(f);

	assert_int_not_equal(at, 0);
	uint64_t now_us = loop_mono_ns() / 1000u;
	assert_true(at > now_us);
	uint64_t left_ms = (at - now_us) / 1000u;
	if (left_ms > ms + 5000 || left_ms + 5000 < ms)
		fail_msg("timer armed for %llu ms, expected %llu", (unsigned long long)left_ms, (unsigned long long)ms);
}

static void test_setter_follows_timer_rule(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f);
	assert_int_equal(f.x.xstate, XS_NEW); /* a zeroed request is NEW */
	exchange_set_state(&f.x, XS_AWAIT_BODY);
	assert_int_equal(expiry_us(&f), 0);
	exchange_set_state(&f.x, XS_ROUTING);
	assert_int_equal(expiry_us(&f), 0);
	exchange_set_state(&f.x, XS_QUEUED);
	assert_armed_for(&f, QUEUE_MS);
	exchange_set_state(&f.x, XS_CONNECTING);
	assert_armed_for(&f, CONNECT_MS);
	exchange_set_state(&f.x, XS_SENDING);
	assert_int_equal(expiry_us(&f), 0);
	exchange_set_state(&f.x, XS_AWAIT_HEAD);
	assert_armed_for(&f, FIRST_BYTE_MS);
	exchange_set_state(&f.x, XS_STREAMING);
	assert_armed_for(&f, IDLE_MS);

	/* STREAMING <-> PAUSED: the idle clock runs on, not re-armed */
	uint64_t idle_at = expiry_us(&f);
	usleep(2000);
	exchange_set_state(&f.x, XS_PAUSED);
	assert_int_equal(expiry_us(&f), idle_at);
	exchange_set_state(&f.x, XS_STREAMING);
	assert_int_equal(expiry_us(&f), idle_at);
	exchange_set_state(&f.x, XS_STREAMING); /* the same state: a no-op */
	assert_int_equal(f.x.xstate, XS_STREAMING);
	assert_int_equal(expiry_us(&f), idle_at);

	exchange_set_state(&f.x, XS_DONE);
	assert_int_equal(f.x.xstate, XS_DONE);
	assert_int_equal(expiry_us(&f), 0);
	exchange_set_state(&f.x, XS_DONE); /* DONE again: a no-op, no abort */
	assert_int_equal(f.x.xstate, XS_DONE);
	fixture_free(&f);
}

/* A failover goes back to ROUTING (timer off) and a replay back to
 * CONNECTING (its timer armed again). */
static void test_setter_failover_and_replay(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f);
	exchange_set_state(&f.x, XS_ROUTING);
	exchange_set_state(&f.x, XS_CONNECTING);
	assert_armed_for(&f, CONNECT_MS);
	exchange_set_state(&f.x, XS_ROUTING);
	assert_int_equal(expiry_us(&f), 0);
	exchange_set_state(&f.x, XS_QUEUED);
	assert_armed_for(&f, QUEUE_MS);
	exchange_set_state(&f.x, XS_CONNECTING);
	exchange_set_state(&f.x, XS_SENDING);
	exchange_set_state(&f.x, XS_AWAIT_HEAD);
	exchange_set_state(&f.x, XS_CONNECTING);
	assert_armed_for(&f, CONNECT_MS);
	/* a missed ttft_deadline, the head held: back to ROUTING, the idle
	 * timer off */
	exchange_set_state(&f.x, XS_SENDING);
	exchange_set_state(&f.x, XS_STREAMING);
	exchange_set_state(&f.x, XS_ROUTING);
	assert_int_equal(expiry_us(&f), 0);
	fixture_free(&f);
}

/* While a TLS upstream's close waits for the next loop turn it holds the
 * timer (0 ms): state changes leave it; DONE cancels it. */
static void test_pending_close_holds_the_timer(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f);
	f.x.xstate = XS_SENDING;
	f.x.up_closed = 0x11; /* BEV_EVENT_READING | BEV_EVENT_EOF */
	loop_deadline_set(&f.x.timer, 0);
	uint64_t at = expiry_us(&f);
	assert_int_not_equal(at, 0);
	exchange_set_state(&f.x, XS_AWAIT_HEAD);
	assert_int_equal(expiry_us(&f), at);
	exchange_set_state(&f.x, XS_STREAMING);
	assert_int_equal(expiry_us(&f), at);
	exchange_set_state(&f.x, XS_DONE);
	assert_int_equal(expiry_us(&f), 0);
	assert_int_equal(f.x.up_closed, 0);
	fixture_free(&f);

	/* from a state without a timer of its own too (SENDING and DONE both
	 * run none, yet the close's 0 ms goes) */
	fixture_init(&f);
	f.x.xstate = XS_SENDING;
	f.x.up_closed = 0x11;
	loop_deadline_set(&f.x.timer, 0);
	exchange_set_state(&f.x, XS_DONE);
	assert_int_equal(expiry_us(&f), 0);
	assert_int_equal(f.x.up_closed, 0);
	fixture_free(&f);
}

/* Runs exchange_set_state(from -> to) in a child: its exit status. */
static int set_in_child(enum xstate from, enum xstate to)
{
	pid_t pid = fork();
	int status = 0;

	assert_true(pid >= 0);
	if (pid == 0) {
		struct fixture f;
		int devnull = open("/dev/null", O_WRONLY);
		if (devnull >= 0)
			dup2(devnull, STDERR_FILENO); /* the CHECK's log line */
		fixture_init(&f);
		f.x.xstate = from;
		exchange_set_state(&f.x, to);
		_exit(f.x.xstate == to ? 0 : 3);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return status;
}

static void test_illegal_transition_aborts(void **state)
{
	(void)state;
	for (int from = 0; from < XS__COUNT; from++) {
		for (int to = 0; to < XS__COUNT; to++) {
			if (from == to)
				continue; /* a no-op in the setter */
			int st = set_in_child((enum xstate)from, (enum xstate)to);
			bool aborted = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
			bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
			if (want_legal((enum xstate)from, (enum xstate)to) ? !ok : !aborted)
				fail_msg("%s -> %s: child status %#x", exchange_state_name((enum xstate)from),
					 exchange_state_name((enum xstate)to), (unsigned)st);
		}
	}
}

#define C(s) (1u << CL_##s)

static const unsigned client_entered_from[CLIENT_STATE_COUNT] = {
	[CL_IDLE] = C(WAIT),
	[CL_HEAD] = C(IDLE),
	[CL_BODY] = C(HEAD),
	[CL_WAIT] = C(BODY),
	[CL_TUNNEL] = C(WAIT),
	[CL_LINGER] = C(IDLE) | C(HEAD) | C(BODY) | C(WAIT),
	[CL_CLOSED] = C(IDLE) | C(HEAD) | C(BODY) | C(WAIT) | C(TUNNEL) | C(LINGER),
};

static void test_client_transitions(void **state)
{
	(void)state;
	for (int from = 0; from < CLIENT_STATE_COUNT; from++)
		for (int to = 0; to < CLIENT_STATE_COUNT; to++) {
			bool want = (client_entered_from[to] >> from) & 1u;
			if (client_transition_legal((enum client_state)from, (enum client_state)to) != want)
				fail_msg("client %d -> %d: expected %s", from, to, want ? "legal" : "refused");
		}
	assert_false(client_transition_legal(CL_LINGER, CL_WAIT)); /* an error answer never goes back */
	assert_false(client_transition_legal(CL_CLOSED, CL_CLOSED));
	assert_false(client_transition_legal((enum client_state)CLIENT_STATE_COUNT, CL_CLOSED));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exchange_transitions),
		cmocka_unit_test(test_exchange_timers),
		cmocka_unit_test(test_setter_follows_timer_rule),
		cmocka_unit_test(test_setter_failover_and_replay),
		cmocka_unit_test(test_pending_close_holds_the_timer),
		cmocka_unit_test(test_illegal_transition_aborts),
		cmocka_unit_test(test_client_transitions),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
