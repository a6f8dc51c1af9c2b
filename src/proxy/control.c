/*
 * control.c — the job queue between other threads and the worker loop,
 * woken through an eventfd.
 *
 * A job is taken (`started`) under the lock before it runs. A caller whose
 * deadline passes abandons a job not yet started; a cancellable one
 * (control_call_cancel) is then dropped unrun, and one already started is
 * waited for, so that the caller's answer says what happened.
 */
#include "control.h"

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

struct job {
	control_fn fn;
	void *ctx;
	char *in, *out;
	int status;
	bool cancellable, started, done, abandoned;
	struct job *next;
};

struct control {
	int efd;
	struct event *ev;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *head, *tail;
	bool closed;
};

static void job_free(struct job *j)
{
	free(j->in);
	free(j->out);
	free(j);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct control *c = arg;
	uint64_t n;
	struct job *list;

	if (read(c->efd, &n, sizeof(n)) == -1 && errno != EAGAIN)
		return;
	pthread_mutex_lock(&c->lock);
	list = c->head;
	c->head = c->tail = NULL;
	pthread_mutex_unlock(&c->lock);
	for (struct job *j = list, *next; j; j = next) {
		next = j->next;
		int status = 500;
		pthread_mutex_lock(&c->lock);
		if (j->abandoned && j->cancellable) { /* its caller was told it failed */
			pthread_mutex_unlock(&c->lock);
			job_free(j);
			continue;
		}
		j->started = true;
		pthread_mutex_unlock(&c->lock);
		char *out = j->fn(j->ctx, j->in, &status);
		pthread_mutex_lock(&c->lock);
		if (j->abandoned) {
			pthread_mutex_unlock(&c->lock);
			free(out);
			job_free(j);
			continue;
		}
		j->out = out;
		j->status = status;
		j->done = true;
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->lock);
	}
}

struct control *control_new(struct event_base *base)
{
	struct control *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->efd == -1) {
		free(c);
		return NULL;
	}
	c->ev = event_new(base, c->efd, EV_READ | EV_PERSIST, on_wake, c);
	if (!c->ev || event_add(c->ev, NULL) == -1) {
		if (c->ev)
			event_free(c->ev);
		close(c->efd);
		free(c);
		return NULL;
	}
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	return c;
}

void control_free(struct control *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->closed = true;
	for (struct job *j = c->head, *next; j; j = next) {
		next = j->next;
		if (j->abandoned) {
			job_free(j);
		} else {
			j->status = 503;
			j->done = true;
		}
	}
	c->head = c->tail = NULL;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	event_free(c->ev);
	close(c->efd);
	/* a caller still waiting holds the lock's memory: the admin API is
	 * stopped before the control is freed, so none is */
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static int call(struct control *c, control_fn fn, void *ctx, const char *in, char **out, int *status,
		uint64_t timeout_ms, bool cancellable)
{
	struct job *j = calloc(1, sizeof(*j));
	struct timespec deadline;
	uint64_t one = 1;
	int rc = -1;

	if (!j)
		return -1;
	j->fn = fn;
	j->ctx = ctx;
	j->in = in ? strdup(in) : NULL;
	j->cancellable = cancellable;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += (time_t)(timeout_ms / 1000);
	deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->lock);
	if (c->closed) {
		pthread_mutex_unlock(&c->lock);
		job_free(j);
		return -1;
	}
	if (c->tail)
		c->tail->next = j;
	else
		c->head = j;
	c->tail = j;
	if (write(c->efd, &one, sizeof(one)) == -1 && errno != EAGAIN) {
		/* the counter is saturated: the worker is awake anyway */
	}
	while (!j->done) {
		if (pthread_cond_timedwait(&c->cond, &c->lock, &deadline) == ETIMEDOUT)
			break;
	}
	/* running now: a cancellable job's caller waits for its end (jobs are
	 * short; the worker is past whatever held it up) */
	while (!j->done && cancellable && j->started)
		pthread_cond_wait(&c->cond, &c->lock);
	if (j->done) {
		*out = j->out;
		*status = j->status;
		j->out = NULL;
		rc = 0;
		pthread_mutex_unlock(&c->lock);
		job_free(j);
	} else {
		j->abandoned = true; /* the worker frees it when it gets there */
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

int control_call(struct control *c, control_fn fn, void *ctx, const char *in, char **out, int *status,
		 uint64_t timeout_ms)
{
	return call(c, fn, ctx, in, out, status, timeout_ms, false);
}

int control_call_cancel(struct control *c, control_fn fn, void *ctx, const char *in, char **out, int *status,
			uint64_t timeout_ms)
{
	return call(c, fn, ctx, in, out, status, timeout_ms, true);
}
