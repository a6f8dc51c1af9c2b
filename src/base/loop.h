/*
 * loop.h — timers on the libevent loop in milliseconds.
 *
 * Header only. Every timeout in tokentap's configuration is a count of
 * milliseconds; libevent wants a struct timeval. loop_tv converts,
 * loop_timer_arm (re)arms a timer event, replacing any pending timeout.
 */
#pragma once

#include <event2/event.h>
#include <stdint.h>
#include <sys/time.h>

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
