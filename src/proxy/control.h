/*
 * control.h — running a function on the worker's event loop on behalf of
 * another thread (the admin API), and waiting for its answer.
 *
 * The proxy's state (routes, upstreams, their live counters) belongs to the
 * worker thread and is never locked. A reader on another thread hands in a
 * job; the worker runs it between two events, where that state is
 * consistent, and the caller gets the answer back. A job whose caller timed
 * out is still run (or dropped) safely: jobs own their input and output.
 * A change whose caller must be able to say "not applied" on a timeout uses
 * control_call_cancel: a job the worker has not started by the deadline is
 * never run.
 */
#pragma once

#include <stdint.h>

struct event_base;
struct control;

/* Runs on the worker thread: reads `in` (may be NULL), returns a malloc'd
 * answer (JSON text) and sets *status (an HTTP status). */
typedef char *(*control_fn)(void *ctx, const char *in, int *status);

struct control *control_new(struct event_base *base);
/* Fails every pending call. NULL ok. */
void control_free(struct control *c);

/* Runs fn(ctx, in) on the worker and waits at most timeout_ms. 0 with
 * *out (malloc'd) and *status, or -1 when the worker did not answer in time.
 * `ctx` must outlive the control. */
int control_call(struct control *c, control_fn fn, void *ctx, const char *in, char **out, int *status,
		 uint64_t timeout_ms);
/* As control_call, but -1 means fn did not run and never will: a job not
 * started by the deadline is dropped; one started is waited for to its end
 * (then 0, however long it took). */
int control_call_cancel(struct control *c, control_fn fn, void *ctx, const char *in, char **out, int *status,
			uint64_t timeout_ms);
