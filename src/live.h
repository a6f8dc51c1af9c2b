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
