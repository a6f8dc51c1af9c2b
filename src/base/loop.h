/*
 * loop.h — timers on the libevent loop in milliseconds.
 *
 * Header only. Every timeout in tokentap's configuration is a count of
 * milliseconds; libevent wants a struct timeval. loop_tv converts,
 * loop_timer_arm (re)arms a timer event, replacing any pending timeout.
 *
 * A loop_deadline is a timer whose deadline moves at every step of a
 * connection (the client's header, body and keep-alive timeouts, an
 * exchange's per-state timeouts), where re-arming the event at each step
 * (libevent's heap: a removal and an insertion) would cost more than the
 * step. Its event is armed only when the deadline moves earlier than the
 * event fires; moved later or cleared, the event is left to fire, and its
 * callback (loop_deadline_due, first) arms it again for what is left, or
 * leaves it unarmed when nothing is due. The deadline acts when it is due,
 * never earlier; the cost is one extra wake-up per early firing, at most
 * one per shortest timeout a connection ran.
 */
#pragma once

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/time.h>
#include <time.h>

/* `ms` milliseconds as a struct timeval. */
static inline struct timeval loop_tv(uint64_t ms)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000) };
	return tv;
}

/* Arms the timer `ev` to fire in `ms` milliseconds (0: at the next loop
 * iteration), replacing a pending timeout. */
static inline void loop_timer_arm(struct event *ev, uint64_t ms)
{
	struct timeval tv = loop_tv(ms);
	evtimer_add(ev, &tv);
}

/* A deadline on the timer event `ev` (made by its owner, whose callback
 * begins with loop_deadline_due). Zeroed: none due, the event unarmed. */
struct loop_deadline {
	struct event *ev;
	uint64_t due_ns;   /* CLOCK_MONOTONIC; 0: nothing due */
	uint64_t fires_ns; /* when ev is armed to fire at the latest; 0: unarmed */
};

static inline uint64_t loop_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Due `ms` milliseconds from now (0: at the next loop iteration), in place
 * of any deadline before. */
static inline void loop_deadline_set(struct loop_deadline *d, uint64_t ms)
{
	uint64_t due = loop_mono_ns() + ms * 1000000u;

	d->due_ns = due;
	if (d->fires_ns && d->fires_ns <= due)
		return; /* it fires first and arms itself again for the rest */
	loop_timer_arm(d->ev, ms);
	d->fires_ns = due;
}

/* Nothing due; the event, if armed, fires and finds nothing. */
static inline void loop_deadline_clear(struct loop_deadline *d)
{
	d->due_ns = 0;
}

/* Nothing due and the event deleted (before its memory or its callback's
 * argument goes). */
static inline void loop_deadline_stop(struct loop_deadline *d)
{
	d->due_ns = 0;
	d->fires_ns = 0;
	if (d->ev)
		evtimer_del(d->ev);
}

/* Whether the deadline is due: asked first in the event's callback. Not
 * due, the event is armed again for what is left (or left unarmed when
 * nothing is due) and the callback returns at once. */
static inline bool loop_deadline_due(struct loop_deadline *d)
{
	d->fires_ns = 0;
	if (!d->due_ns)
		return false;
	uint64_t now = loop_mono_ns();
	if (now >= d->due_ns) {
		d->due_ns = 0;
		return true;
	}
	uint64_t left_us = (d->due_ns - now + 999u) / 1000u;
	struct timeval tv = { (time_t)(left_us / 1000000u), (suseconds_t)(left_us % 1000000u) };
	evtimer_add(d->ev, &tv);
	d->fires_ns = d->due_ns;
	return false;
}
