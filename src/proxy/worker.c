/*
 * worker.c — an event loop on its own thread: its proxy (listeners,
 * clients, router generation, upstream pools), stats shard and control
 * channel. See worker.h for what workers share.
 *
 * A worker is built on the main thread and handed to its thread by
 * pthread_create; from then on only that thread touches its loop, and the
 * main thread and the admin API reach it through jobs (control.h). Its
 * thread blocks the signals tokentap handles, so they reach the main
 * thread's loop.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "worker.h"

#include <event2/event.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control.h"
#include "log.h"
#include "proxy.h"
#include "upstream.h"
#include "router.h"
#include "stats.h"

#define JOB_TIMEOUT_MS 10000	/* drain and exit jobs: answered between two events */
#define RELOAD_TIMEOUT_MS 60000 /* a reload resolves upstream names and reads certificates */

struct worker {
	unsigned index;
	struct event_base *base;
	struct stats_shard *stats;
	struct proxy *px;
	struct control *control;
	pthread_t thread;
	bool started;
	/* the drain job's arguments, written before the job is queued */
	uint64_t grace_ms;
	worker_drained_fn drained;
	void *drained_arg;
};

/* A reload's input and output. Owned by the caller, except when the call
 * times out: the job may still run, so it is then left to the worker (a
 * leak of one config in a case that already logged an error). */
struct reload_job {
	struct worker *w;
	struct config cfg;
	uint64_t generation;
	char err[512];
};

/* The worker's loop: LOOP_PRIO__COUNT priorities, and events at
 * LOOP_PRIO_STREAM run at most LOOP_STREAM_SLICE at a time before the loop
 * polls again (upstream.h says why). */
static struct event_base *worker_base_new(void)
{
	struct event_config *cfg = event_config_new();
	struct event_base *base = NULL;

	if (!cfg)
		return NULL;
	if (event_config_set_max_dispatch_interval(cfg, NULL, LOOP_STREAM_SLICE, LOOP_PRIO_STREAM) == 0)
		base = event_base_new_with_config(cfg);
	event_config_free(cfg);
	if (base && event_base_priority_init(base, LOOP_PRIO__COUNT) == -1) {
		event_base_free(base);
		base = NULL;
	}
	return base;
}

struct worker *worker_new(unsigned index, const struct worker_env *env, struct config *cfg, uint64_t generation,
			  const struct worker *first, char *err, size_t errlen)
{
	struct worker *w = calloc(1, sizeof(*w));
	struct router *rt;

	if (!w) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	w->index = index;
	w->base = worker_base_new();
	if (!w->base) {
		snprintf(err, errlen, "worker %u: cannot create an event loop", index);
		goto fail;
	}
	w->stats = stats_shard_new(w->base, env->store, env->max_models, env->model_idle_ms, &env->slo, env->flush_ms);
	if (!w->stats) {
		snprintf(err, errlen, "worker %u: cannot set up stats recording", index);
		goto fail;
	}
	rt = router_new(w->base, cfg, NULL, generation, err, errlen);
	if (!rt)
		goto fail;
	struct proxy_env pe = {
		env->alog, w->stats, env->recent, first ? first->px : NULL, env->reuseport, env->clients
	};
	w->px = proxy_new(w->base, rt, &pe, err, errlen);
	if (!w->px) {
		router_unref(rt);
		goto fail;
	}
	w->control = control_new(w->base);
	if (!w->control) {
		snprintf(err, errlen, "worker %u: cannot set up its control channel", index);
		goto fail;
	}
	return w;
fail:
	worker_free(w);
	return NULL;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char name[16];

	/* shown by top -H and ps -L, and read by the tests */
	snprintf(name, sizeof(name), "tt-worker-%u", w->index);
	pthread_setname_np(pthread_self(), name);
	event_base_dispatch(w->base);
	return NULL;
}

int worker_start(struct worker *w, char *err, size_t errlen)
{
	sigset_t all, old;
	int e;

	/* the thread inherits the mask: tokentap's signals go to the main loop */
	sigemptyset(&all);
	sigaddset(&all, SIGINT);
	sigaddset(&all, SIGTERM);
	sigaddset(&all, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	e = pthread_create(&w->thread, NULL, worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e) {
		snprintf(err, errlen, "worker %u: cannot start its thread: %s", w->index, strerror(e));
		return -1;
	}
	w->started = true;
	return 0;
}

struct proxy *worker_proxy(const struct worker *w)
{
	return w->px;
}

struct control *worker_control(const struct worker *w)
{
	return w->control;
}

/* ---- jobs, run on the worker's thread ---- */

static void on_proxy_drained(void *arg)
{
	struct worker *w = arg;
	w->drained(w, w->drained_arg);
}

static char *job_drain(void *ctx, const char *in, int *status)
{
	struct worker *w = ctx;
	(void)in;
	proxy_drain(w->px, w->grace_ms, on_proxy_drained, w);
	*status = 200;
	return strdup("{}");
}

static char *job_reload(void *ctx, const char *in, int *status)
{
	struct reload_job *j = ctx;
	struct router *rt =
		router_new(j->w->base, &j->cfg, proxy_router(j->w->px), j->generation, j->err, sizeof(j->err));
	(void)in;
	*status = rt ? 200 : 500;
	if (rt)
		proxy_set_router(j->w->px, rt);
	return strdup("{}");
}

static char *job_exit(void *ctx, const char *in, int *status)
{
	struct worker *w = ctx;
	(void)in;
	event_base_loopexit(w->base, NULL);
	*status = 200;
	return strdup("{}");
}

/* Runs `fn` on the worker and waits; 0 when it answered with 200. */
static int run_job(struct worker *w, control_fn fn, void *ctx, uint64_t timeout_ms)
{
	char *out = NULL;
	int status = 0;

	if (control_call(w->control, fn, ctx, NULL, &out, &status, timeout_ms) == -1)
		return -1;
	free(out);
	return status == 200 ? 0 : -1;
}

int worker_drain(struct worker *w, uint64_t grace_ms, worker_drained_fn done, void *arg)
{
	w->grace_ms = grace_ms;
	w->drained = done;
	w->drained_arg = arg;
	return run_job(w, job_drain, w, JOB_TIMEOUT_MS);
}

int worker_reload(struct worker *w, struct config *cfg, uint64_t generation, char *err, size_t errlen)
{
	struct reload_job *j = calloc(1, sizeof(*j));
	char *out = NULL;
	int status = 0;

	if (!j) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	j->w = w;
	j->cfg = *cfg; /* taken over */
	memset(cfg, 0, sizeof(*cfg));
	j->generation = generation;
	if (control_call(w->control, job_reload, j, NULL, &out, &status, RELOAD_TIMEOUT_MS) == -1) {
		snprintf(err, errlen, "worker %u did not answer within %d ms", w->index, RELOAD_TIMEOUT_MS);
		return -1; /* j stays with the job */
	}
	free(out);
	if (status != 200)
		snprintf(err, errlen, "%s", j->err);
	config_free(&j->cfg); /* emptied when the router took it */
	free(j);
	return status == 200 ? 0 : -1;
}

void worker_free(struct worker *w)
{
	if (!w)
		return;
	if (w->started) {
		if (run_job(w, job_exit, w, JOB_TIMEOUT_MS) == -1)
			log_error("worker %u did not stop within %d ms; waiting for it", w->index, JOB_TIMEOUT_MS);
		pthread_join(w->thread, NULL);
	}
	control_free(w->control);
	proxy_free(w->px);
	stats_shard_free(w->stats); /* hands over what the last interval recorded */
	if (w->base)
		event_base_free(w->base);
	free(w);
}
