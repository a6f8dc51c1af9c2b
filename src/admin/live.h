/*
 * live.h — the proxy's live state as JSON, and the runtime weight change:
 * the functions the admin API runs on the worker thread through the control
 * channel (control.h). Each has the control_fn shape; `ctx` is the proxy.
 */
#pragma once

/* GET /routes: every route of the current generation, its matchers and
 * targets with their weights. */
char *live_routes(void *proxy, const char *in, int *status);

/* GET /upstreams: every upstream with its labels, limits and live state:
 * in flight, queued, pool, errors by kind. */
char *live_upstreams(void *proxy, const char *in, int *status);

/* POST /routes/weights: `in` is {"route": NAME, "weights": {UPSTREAM: N}};
 * answers the route as /routes shows it, or 400/404 with a message. The
 * change lasts until the next reload. */
char *live_set_weights(void *proxy, const char *in, int *status);

/* One /upstreams answer from every worker's (JSON texts, the first one's
 * shape): counters that are per worker (requests, rejected, errors, the
 * pool's) are added up, `in_flight` and `queued` (already counted across
 * workers) and the configuration are the first answer's, `last_error` is
 * the latest and `reachable` holds only when every worker says so. A
 * malloc'd JSON text, NULL when out of memory or an answer does not parse. */
char *live_upstreams_merge(const char *const *texts, unsigned n);
