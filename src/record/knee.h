/*
 * knee.h — where a latency-versus-load curve stops paying off.
 *
 * The load curve gives, per in-flight bucket, an estimate of the throughput
 * the upstream delivers at that load and the latency it costs. The knee is
 * the lowest load at which added throughput stops paying for added latency:
 * walking up the loads, the last point before the first step that does not
 * raise "power" (Kleinrock's throughput / latency). A step raises power
 * exactly when its relative throughput gain beats its relative latency
 * increase. The first bend, not the highest power overall: a curve that
 * dips and climbs again past its knee is already paying for load it does
 * not earn back at the dip. A pure function, so it is tested on
 * constructed curves.
 *
 * Invariants: points are read only; a point with too few requests, or a
 * throughput or latency that is not positive and finite, never becomes the
 * knee and never hides one.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Requests per in-flight bucket before that bucket counts towards the knee:
 * the min_requests of /stats/curve and of tokentap-bench --sweep. */
#define KNEE_MIN_REQUESTS 5

struct knee_point {
	double load;	   /* requests in flight this point stands for */
	double throughput; /* requests/s delivered at that load */
	double latency;	   /* the latency it costs, any positive unit */
	uint64_t requests; /* samples behind the point */
};

struct knee {
	int index;	/* into the points, -1 when no point qualifies */
	bool saturated; /* the next qualifying point has no higher power */
};

/*
 * Finds the knee of pts[0..n), ordered by increasing load. Points with fewer
 * than `min_requests` requests are skipped, so a sparse, noisy point can
 * neither end the climb early nor be the knee. The knee is the first
 * qualifying point whose next qualifying point has no higher
 * throughput/latency (equal counts as no higher); `saturated` is then true.
 * When power rises all the way, the knee is the highest qualifying load and
 * `saturated` is false: the curve has not bent yet within the load
 * observed, so the true knee may lie beyond it.
 */
struct knee knee_find(const struct knee_point *pts, size_t n, uint64_t min_requests);
