/*
 * knee.h — where a latency-versus-load curve stops paying off.
 *
 * The load curve gives, per in-flight bucket, an estimate of the throughput
 * the upstream delivers at that load and the latency it costs. The knee is
 * the point of highest "power" (Kleinrock): throughput / latency. Below it,
 * adding load raises throughput proportionally more than latency; past it,
 * every extra request in flight buys relatively less throughput than the
 * latency it adds. A pure function, so it is tested on constructed curves.
 *
 * Invariants: points are read only; a point with too few requests, or a
 * throughput or latency that is not positive and finite, never becomes the
 * knee and never hides one.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct knee_point {
	double load;	   /* requests in flight this point stands for */
	double throughput; /* requests/s delivered at that load */
	double latency;	   /* the latency it costs, any positive unit */
	uint64_t requests; /* samples behind the point */
};

struct knee {
	int index;	/* into the points, -1 when no point qualifies */
	bool saturated; /* a qualifying point at higher load has lower power */
};

/*
 * Finds the knee of pts[0..n), ordered by increasing load. Points with fewer
 * than `min_requests` requests are skipped. The knee is the qualifying point
 * of highest throughput/latency, the lowest load on ties. `saturated` is
 * false when that is the highest qualifying load: the curve has not bent yet
 * within the load observed, so the true knee may lie beyond it.
 */
struct knee knee_find(const struct knee_point *pts, size_t n, uint64_t min_requests);
