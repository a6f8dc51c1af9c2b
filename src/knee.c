/*
 * knee.c — the knee of a load curve: the point of highest throughput per
 * unit of latency (see knee.h for why that point).
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
	double best = 0;

	for (size_t i = 0; i < n; i++) {
		if (!qualifies(&pts[i], min_requests))
			continue;
		double power = pts[i].throughput / pts[i].latency;
		if (k.index == -1 || power > best) {
			k.index = (int)i;
			best = power;
			k.saturated = false;
		} else {
			/* a point past the best one did no better: the curve bent */
			k.saturated = true;
		}
	}
	return k;
}
