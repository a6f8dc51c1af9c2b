/*
 * worker.h — one event loop on its own thread, with its own listeners
 * (sharing the port through SO_REUSEPORT), router generation, upstream
 * pools, stats shard and clients.
 *
 * Workers share nothing on the forwarding path: the kernel spreads new
 * connections over their listening sockets, and a connection stays on the
 * worker that accepted it. What they do share is read-mostly or has its own
 * lock off the hot path: the access log file (one write(2) per line), the
 * recent-requests ring (one short mutex hold per finished request), the
 * store's batch queue (one push per worker per flush interval), and each
 * upstream's admission count (upstream.h).
 *
 * Everything else reaches a worker as a job on its control channel
 * (control.h), run on its own thread between two events: a reload, a
 * drain, the admin API's live views, the end of the loop.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "slice.h"

struct accesslog;
struct control;
struct proxy;
struct recent;
struct store;
struct worker;
struct stats_shard;

/* What every worker records into; owned by the caller, which frees it only
 * after worker_join. */
struct worker_env {
	struct accesslog *alog; /* NULL: no access log */
	struct store *store;
	struct recent *recent;
	unsigned max_models;
	uint64_t model_idle_ms;
	struct slo slo;
	uint64_t flush_ms;
	bool reuseport;		   /* more than one worker shares the listening ports */
	_Atomic unsigned *clients; /* client connections, all workers */
};

/* Builds worker `index` (not running yet) from `cfg`, which it takes over.
 * `first` (NULL for the first worker) is the worker whose bound addresses
 * the others bind too, so that port 0 resolves once. NULL with `err`. */
struct worker *worker_new(unsigned index, const struct worker_env *env, struct config *cfg, uint64_t generation,
			  const struct worker *first, char *err, size_t errlen);

/* Starts the worker's thread. 0, or -1 with `err`. */
int worker_start(struct worker *w, char *err, size_t errlen);

struct proxy *worker_proxy(const struct worker *w);
struct control *worker_control(const struct worker *w);

/* Called on the worker's thread when its drain is complete. */
typedef void (*worker_drained_fn)(struct worker *w, void *arg);

/* Asks the worker to stop accepting and let its streams finish within
 * `grace_ms`; `done(w, arg)` runs on the worker's thread when the last one
 * has. Returns at once. 0, or -1 when the worker did not take the job. */
int worker_drain(struct worker *w, uint64_t grace_ms, worker_drained_fn done, void *arg);

/* Builds the next router generation from `cfg` (taken over) on the
 * worker's thread and switches new requests to it. Waits for the answer:
 * 0, or -1 with `err` (the running generation stays). */
int worker_reload(struct worker *w, struct config *cfg, uint64_t generation, char *err, size_t errlen);

/* Ends the worker's loop (running streams are cut) and joins its thread;
 * then frees it, handing its last stats to the store. NULL ok. */
void worker_free(struct worker *w);
