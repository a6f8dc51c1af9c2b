/*
 * knee.c — the knee of a load curve: the lowest load past which a step up
 * in load no longer raises throughput per unit of latency (see knee.h).
 */
#include "knee.h"

#include <math.h>

static bool qualifies(const struct knee_point *p, uint64_t min_requests)
{
	return p->requests >= min_requests && isfinite(p->throughput) && isfinite(p->latency) && p->throughput > 0 &&
	       p->latency > 0;
}

struct knee knee_find(const struct knee_point *pts, size_t n, uint64_t min_requests)
{
	struct knee k = { -1, false };
	double last = 0; /* the power of k.index, the last qualifying point */

	for (size_t i = 0; i < n; i++) {
		if (!qualifies(&pts[i], min_requests))
			continue;
		double power = pts[i].throughput / pts[i].latency;
		if (k.index != -1 && power <= last) {
			/* this step up did no better: the curve bent at k */
			k.saturated = true;
			break;
		}
		k.index = (int)i;
		last = power;
	}
	return k;
}
