/*
 * recent.c — the ring of recently finished requests.
 */
#include "recent.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

struct recent {
	pthread_mutex_t lock;
	size_t cap, next, n;
	struct recent_entry *ring;
};

struct recent *recent_new(size_t capacity)
{
	struct recent *rc = calloc(1, sizeof(*rc));

	if (!rc || !capacity)
		goto fail;
	rc->ring = calloc(capacity, sizeof(*rc->ring));
	if (!rc->ring)
		goto fail;
	rc->cap = capacity;
	pthread_mutex_init(&rc->lock, NULL);
	return rc;
fail:
	free(rc);
	return NULL;
}

void recent_free(struct recent *rc)
{
	if (!rc)
		return;
	pthread_mutex_destroy(&rc->lock);
	free(rc->ring);
	free(rc);
}

void recent_push(struct recent *rc, const struct req_record *r, unsigned load, bool cold)
{
	struct recent_entry e;
	struct timeval tv;

	if (!rc)
		return;
	memcpy(&e.rec, r, sizeof(*r));
	e.rec.itl_ns = NULL;
	e.rec.itl_cap = 0;
	e.itl_mean_ms = r->itl_total ? (double)r->itl_sum / (double)r->itl_total / 1e6 : NAN;
	e.itl_max_ms = r->itl_total ? (double)r->itl_max / 1e6 : NAN;
	gettimeofday(&tv, NULL);
	e.unix_ms = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
	e.load = load;
	e.cold = cold;

	pthread_mutex_lock(&rc->lock);
	rc->ring[rc->next] = e;
	rc->next = (rc->next + 1) % rc->cap;
	if (rc->n < rc->cap)
		rc->n++;
	pthread_mutex_unlock(&rc->lock);
}

size_t recent_capacity(const struct recent *rc)
{
	return rc ? rc->cap : 0; /* set once by recent_new: no lock needed */
}

size_t recent_snapshot(struct recent *rc, struct recent_entry *out, size_t n)
{
	size_t k = 0;

	if (!rc)
		return 0;
	pthread_mutex_lock(&rc->lock);
	for (; k < n && k < rc->n; k++)
		out[k] = rc->ring[(rc->next + rc->cap - 1 - k) % rc->cap];
	pthread_mutex_unlock(&rc->lock);
	return k;
}
