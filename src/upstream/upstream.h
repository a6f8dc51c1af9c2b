/*
 * upstream.h — an upstream server: its admission queue and its pool of idle
 * connections.
 *
 * Admission: with max_concurrency set, at most that many requests run on
 * the upstream at once; the next ones wait in a FIFO queue (bounded, with
 * a timeout the caller enforces) and are admitted one by one as running
 * requests leave. The time spent waiting is the request's `queue` metric.
 *
 * Each worker has its own upstream objects (pools, queues, timers); the
 * copies of one upstream (same name and url) in every worker and
 * generation share a struct up_share: the count of admitted requests and of
 * waiting ones across all of them, kept with atomics, so max_concurrency,
 * queue_max and the in-flight count of the load curve are the server's,
 * not one worker's. A slot freed in one worker goes to that worker's
 * oldest waiter; when it has none and others wait elsewhere, those workers
 * are woken (an eventfd each) to take it, so the queue is FIFO within a
 * worker and close to it across workers.
 *
 * An upstream is resolved once when its configuration loads. Connections to it are handed
 * out by upstream_acquire (a pooled idle one when there is one, else a fresh
 * connect) and come back through upstream_release, which pools them only
 * when the exchange ended cleanly. While idle, a pooled connection is watched:
 * a byte or a close from the server drops it, so a stale connection is
 * rarely handed out.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "balance.h"
#include "check.h"
#include "config.h"
#include "timeline.h"
#include "tls.h"

struct event_base;
struct bufferevent;
struct config;
struct upstream_conf;
struct ssl_ctx_st;

/* A request waiting for an admission slot. Owned by the request. */
struct up_waiter {
	TAILQ_ENTRY(up_waiter) link;
	void (*ready)(struct up_waiter *w); /* called when admitted from the queue */
	bool queued;
};

enum admit { ADMIT_NOW, ADMIT_QUEUED, ADMIT_FULL };

/* Idle connections an upstream's pool keeps, per worker; one more
 * released is closed. fdlimit_need counts them. */
#define POOL_MAX_IDLE 256u

/* One connection to an upstream. Owned by the request using it, or by the
 * pool while idle. */
#define UPCONN_MAGIC 0x5550434eu /* "UPCN" */
struct upconn {
	OBJ_MAGIC_FIELD
	struct upstream *up;
	struct bufferevent *bev;
	struct event *rev; /* the read event (upconn_reading); over TLS from the handshake's end */
	SSL *ssl;	   /* TLS, once rev reads it (tls_recv); NULL before and for plain TCP */
	bool reading;
	/* While a request streams a body from it: see upconn_set_direct */
	const struct upconn_direct *direct;
	void *direct_arg;
	TAILQ_ENTRY(upconn) link;
	uint64_t id;
	unsigned served; /* requests completed on this connection */
	bool connected;
	/* TLS reads: wake-ups that brought bytes, the bytes, and the records
	 * (SSL_read calls) they came in; reads that stopped holding part of a
	 * record (its rest in a later segment: the socket says when it comes);
	 * logged at debug level at the close */
	uint64_t tls_wakeups, tls_bytes, tls_records, tls_partial;
};

struct up_share;

struct upstream {
	unsigned refs;		/* one per router generation that lists it */
	struct up_share *share; /* admission across workers; see above */
	int kick_fd;		/* eventfd: another worker freed a slot */
	struct event *kick_ev;
	char *url;
	char host[256]; /* from the URL: SNI and the verified name by default */
	bool tls;	/* https:// */
	struct ssl_ctx_st *tls_ctx;
	struct tls_resume tls_resume; /* the session its next connection offers */
	uint64_t tls_resumed;	      /* handshakes that resumed one */
	char *name;		      /* the configured name (host:port from the command line); labels its stats */
	/* Its own copy of its settings: generations come and go around it. */
	struct upstream_conf conf;
	uint64_t pool_idle_timeout_ms, cold_idle_ms;
	uint64_t connect_timeout_ms, first_byte_timeout_ms, idle_timeout_ms;
	unsigned active;	      /* admitted requests of this worker not yet done */
	unsigned queued;	      /* waiting in this worker */
	_Atomic unsigned queued_hint; /* `queued`, for other workers deciding whom to wake */
	TAILQ_HEAD(, up_waiter) waiting;
	uint64_t rejected; /* turned away: queue full or queue timeout */
	uint64_t requests; /* finished requests routed here */
	uint64_t errors[REQ_ERR__COUNT];
	uint64_t last_error_unix; /* wall clock of the latest error, 0 none */
	enum req_error last_error;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct event_base *base;
	TAILQ_HEAD(, upconn) idle;
	unsigned n_idle;
	unsigned conns_out; /* connections handed out and not yet released */
	uint64_t opened, reused;
	bool failing; /* this worker's last connect attempt failed (cold labels use the share's) */
};

/* Parses the url (http://host[:port][/]) and resolves it. NULL with a
 * message in `err` when the URL is unusable. `uc` and `cfg` must outlive the
 * upstream. */
struct upstream *upstream_new(struct event_base *base, const struct config *cfg, const struct upstream_conf *uc,
			      char *err, size_t errlen);

/* Asks for a slot: ADMIT_NOW (taken), ADMIT_QUEUED (w->ready is called when
 * one frees up), or ADMIT_FULL (the queue is full: answer 503). */
enum admit upstream_admit(struct upstream *up, struct up_waiter *w);
/* Takes a slot only when one is free now and nobody waits for one (a shadow
 * never queues). */
bool upstream_try_admit(struct upstream *up);

/* A request admitted earlier is done with the upstream: its slot goes to the
 * first waiter, if any. */
void upstream_leave(struct upstream *up);

/* Requests admitted to this server across all workers (the in-flight count
 * of the load curve), and those waiting. */
unsigned upstream_inflight(const struct upstream *up);
unsigned upstream_waiting(const struct upstream *up);

/* What the scraper (scrape.c) last learned of an upstream's engine from its
 * /metrics. Kept in what the workers' copies share, so one scrape serves
 * every worker. */
#define ENGINE_COUNT_MAX 1000000000 /* running, waiting: a larger count scraped reads as this */

struct engine_state {
	bool scraped;		    /* a scrape has succeeded: the values below are its */
	enum engine_kind engine;    /* whose names were read */
	int64_t running, waiting;   /* -1: not reported; else 0 to ENGINE_COUNT_MAX */
	double kv_use, prefix_hit;  /* 0..1; NaN: not reported */
	uint64_t at_unix_ms, at_ns; /* when (wall clock, CLOCK_MONOTONIC) */
	unsigned in_flight_at;	    /* tokentap's in flight to it then */
	bool failing;		    /* the latest attempt failed */
	uint64_t failures;	    /* attempts that failed, since start */
	uint64_t successes;	    /* attempts that succeeded, since start */
	char error[160];	    /* the latest failure, "" none */
};

/*
 * Counters of an upstream that every worker's copies add to (struct
 * up_share, so one number per name and url since it was configured), as
 * (ENUM, key, help): /upstreams shows each under its key, /metrics as
 * tokentap_upstream_<key>_total{upstream} with `help` as its # HELP.
 */
#define UPSTREAM_COUNTERS(X) \
	X(DEADLINE_MISSED, deadline_missed, \
	  "Requests that had no token from the upstream within their route's ttft_deadline of their dispatch to it.")

enum upstream_counter {
#define X(e, key, help) UPC_##e,
	UPSTREAM_COUNTERS(X)
#undef X
		UPC__COUNT
};
extern const char *const upstream_counter_keys[UPC__COUNT];
extern const char *const upstream_counter_help[UPC__COUNT];

/* Adds one to `c` of `up`'s server (all workers). */
void upstream_count(struct upstream *up, enum upstream_counter c);
/* Its value now, every worker's together. */
uint64_t upstream_counter(const struct upstream *up, enum upstream_counter c);

/* What the balancing choice reads of an upstream, the same in every
 * worker (struct up_share's atomics). */
enum up_eject { UP_IN, UP_EJECTED, UP_PROBE_DUE };
struct up_balance {
	uint64_t prefill_tokens; /* prompt tokens in flight not yet at their first token */
	unsigned prefill_reqs;	 /* requests likewise */
	struct ttft_fit fit;	 /* dispatch to first token against tokens ahead */
	double tok_mean;	 /* mean prompt tokens of the samples */
	uint64_t fit_age_ns;	 /* since the last sample; UINT64_MAX: none yet */
	double pred_now_ms;	 /* a request of the mean size dispatched now; NaN: no sample */
	double pred_err_ms;	/* the latency choice's predictions against what came: mean |error| (EWMA); NaN: none */
	double pred_bias_ms;	/* and mean (measured - predicted): above 0, predictions too low */
	uint64_t predictions;	/* those compared */
	enum up_eject eject;	/* out (ejected), or its backoff over and a probe due */
	uint64_t eject_left_ms; /* of the backoff */
	bool probing;		/* one request probes it now */
	unsigned fails_in_row;	/* 5xx or failed connects since its last good answer */
	uint64_t ejections;	/* since start */
};
void upstream_balance(const struct upstream *up, struct up_balance *out, uint64_t now_ns);
/* The same without the figures only /upstreams shows (pred_now_ms and the
 * prediction error: NaN, predictions 0), for each pick. */
void upstream_balance_pick(const struct upstream *up, struct up_balance *out, uint64_t now_ns);

/* Only what every pick reads of every candidate (eject, eject_left_ms,
 * probing, fit_age_ns; the rest of *out is left as it was): the cheap part
 * of upstream_balance_pick, whose full read route_pick makes only for the
 * candidates the latency choice drew. */
void upstream_balance_gate(const struct upstream *up, struct up_balance *out, uint64_t now_ns);

/* A request routed to `up` holds `tokens` prompt tokens there until its
 * first token (or its end without one): add once, sub once. */
void upstream_prefill_add(struct upstream *up, uint64_t tokens);
void upstream_prefill_sub(struct upstream *up, uint64_t tokens);
/* What an upstream is expected to hold in its prefix cache: the chain
 * hashes (workload.h's, unsalted; request.c) of the prompt blocks
 * tokentap sent it, in a lossy table of UP_HELD_SLOTS blocks per upstream
 * (a newer block takes an older one's slot), shared by every worker and
 * kept across reloads; and, process-wide, which upstream got each block
 * last. Approximate by design: it is a guess for the latency choice,
 * docs/routing.md. `chain[i]` covers the prompt's blocks 0..i. */
#define UP_HELD_SLOTS 4096u
void upstream_held_note(struct upstream *up, const uint64_t *chain, unsigned n);
/* The leading blocks of `chain` (n of them) `up` is expected to hold. */
unsigned upstream_held_blocks(const struct upstream *up, const uint64_t *chain, unsigned n);
/* The upstream (upstream_held_id) that got the longest leading run of
 * `chain` last, with that run's blocks in *blocks; 0 (*blocks 0) when no
 * block is known. */
unsigned upstream_held_owner(const uint64_t *chain, unsigned n, unsigned *blocks);
/* The server's id in upstream_held_owner's answers: above 0, the same
 * in every worker's copy. */
unsigned upstream_held_id(const struct upstream *up);

/* A first token came `ms` after dispatch with `tokens_ahead` prompt tokens
 * in flight (the request's `own_tokens` included); `predicted_ms` (below 0:
 * none) is what the latency choice predicted for it. */
void upstream_ttft_note(struct upstream *up, double tokens_ahead, double own_tokens, double predicted_ms, double ms,
			uint64_t now_ns);

/* Outlier ejection (upstream_conf eject_*): how an exchange ended for the
 * upstream: `ok` an answer below 500, else a 5xx or a failed connect. */
void upstream_outlier_note(struct upstream *up, bool ok, uint64_t now_ns);
/* The one probe of an upstream due one (its backoff over, or, for the
 * latency policy, no recent sample): true for the request that gets it;
 * it ends with upstream_probe_done. */
bool upstream_probe_claim(struct upstream *up);
void upstream_probe_done(struct upstream *up);

/* In flight and queued per upstream, read on any thread without asking a
 * worker: the counts every worker's copies share (struct up_share), one
 * entry per (name, url) that some worker holds, so a name twice while a
 * reload drains an old url; with the engine's view where it is scraped. */
struct upstream_gauge {
	char *name; /* malloc'd */
	unsigned in_flight, queued;
	uint64_t counters[UPC__COUNT]; /* UPSTREAM_COUNTERS */
	struct engine_state engine;    /* its scrape (scrape.h); all zero when not scraped */
	struct up_balance bal;
};

/* A malloc'd array in *out and its length in *n (0 and NULL when there is
 * none); free it with upstream_gauges_free. 0, or -1 when out of memory. */
int upstream_gauges(struct upstream_gauge **out, size_t *n) __attribute__((warn_unused_result));
void upstream_gauges_free(struct upstream_gauge *g, size_t n);

/* From the scraper's thread: the state of upstream (name, url) now; a
 * failure (st->failing) keeps the last good values. Nothing happens when
 * no worker holds that upstream. */
void upstream_engine_publish(const char *name, const char *url, const struct engine_state *st);

/* On the forwarding path: the last good values, without a lock (a
 * seqlock over atomics). */
void upstream_engine_note(const struct upstream *up, struct engine_seen *out, uint64_t now_ns);

/* The whole state, under the lock the upstream objects' creation takes:
 * for /upstreams. */
void upstream_engine_state(const struct upstream *up, struct engine_state *out);

/* A queued request gives up (timeout, client gone). */
void upstream_cancel(struct upstream *up, struct up_waiter *w);

/* One request to `up` (NULL: never routed, nothing counted) has its
 * outcome recorded: its request count and, on an error, the error's count
 * and the latest error with its wall clock (GET /upstreams). */
void upstream_count_outcome(struct upstream *up, const struct req_record *rec);

/* Drops one reference; the last closes idle connections and frees `up`.
 * Connections still handed out must have been released first. NULL ok. */
void upstream_free(struct upstream *up);

/* A reload keeps an upstream whose name and url did not change: the same
 * object (admission count, queue, pool) with the new generation's settings.
 * Taking them is two steps, so that a generation that fails at a later
 * upstream leaves every kept one as it was: upstream_prepare() makes
 * everything that can fail (a copy of the settings, the TLS context) and
 * changes nothing; upstream_adopt() then cannot fail. */
struct upstream_prep {
	struct upstream_conf conf;  /* a deep copy */
	struct ssl_ctx_st *tls_ctx; /* for an https upstream */
};

/* -1 with `err` (the TLS context's reason, or out of memory). */
int upstream_prepare(const struct upstream *up, const struct upstream_conf *uc, struct upstream_prep *p, char *err,
		     size_t errlen) __attribute__((warn_unused_result));

/* Frees what a prepare made and was not adopted; a zeroed `p` is fine. */
void upstream_prep_discard(struct upstream_prep *p);

/* `up` takes the prepared settings (p is emptied) and a reference. */
struct upstream *upstream_adopt(struct upstream *up, const struct config *cfg, struct upstream_prep *p);

/* Another holder of `up` (a mirror outliving its request's generation);
 * dropped with upstream_free. */
void upstream_ref(struct upstream *up);

/* Whether `up` is the one `uc` describes (same name and url). */
bool upstream_same(const struct upstream *up, const struct upstream_conf *uc);

/* A connection for one exchange. `*reused` tells whether it came from the
 * pool (already connected) or is connecting now (the caller sees
 * BEV_EVENT_CONNECTED or an error on its own callbacks). NULL when no socket
 * could even be created. The caller sets the bufferevent's callbacks. */
struct upconn *upstream_acquire(struct upstream *up, bool *reused);

/* Like upstream_acquire, but always a new connection (a retry after a
 * pooled one failed). */
struct upconn *upstream_connect_new(struct upstream *up);

/* Gives a connection back: pooled when `reusable`, else closed at once. */
void upstream_release(struct upconn *c, bool reusable);

/* Where a connection's reads stand in its worker's loop (worker.c sets the
 * loop up with LOOP_PRIO__COUNT priorities; libevent runs every ready event
 * of a more urgent priority first). Everything starts at LOOP_PRIO_NORMAL:
 * client reads, accepts, timers, and an upstream connection until its
 * response's first token. A stream that has had its first token reads at
 * LOOP_PRIO_STREAM, and a burst of those is cut into slices between which
 * the loop polls again, so a request or a first token that arrives while
 * hundreds of streams have tokens to forward waits one slice, not the whole
 * burst (docs/dev/perf-log.md, "Loop priorities": scenario b). */
enum loop_prio { LOOP_PRIO_NORMAL = 1, LOOP_PRIO_STREAM = 2, LOOP_PRIO__COUNT = 3 };
/* libevent gives a new event the middle priority, count / 2: three levels
 * make NORMAL the default of every event without touching each one (level
 * 0, more urgent still, is unused). */
_Static_assert(LOOP_PRIO_NORMAL == LOOP_PRIO__COUNT / 2, "new events must start at LOOP_PRIO_NORMAL");

/* Stream events run per slice before the loop polls again. */
#define LOOP_STREAM_SLICE 16

/* Lets the connection's bufferevent write what gets queued on its output.
 * Enabling EV_WRITE arms the write event even with nothing queued (an
 * epoll_ctl, a wake-up to find nothing to write, another epoll_ctl), so it is
 * enabled only when it is not already: a connection keeps it from its
 * connect through the pool, and most requests go out in one direct write. */
void upconn_writing(struct upconn *c);

/* Sets the priority of the connection's reads (over TLS from its
 * handshake's end; before, LOOP_PRIO_NORMAL). */
void upconn_priority(struct upconn *c, enum loop_prio prio);

/*
 * Turns reading of `c` on or off. Over plain TCP tokentap reads the socket
 * itself: one recv() of up to 64 KiB per wake-up into the bufferevent's
 * input, then the bufferevent's read callback (whichever is set: an
 * exchange's, a mirror's, the pool's), and EOF or an error to its event
 * callback. libevent's own read asks ioctl(FIONREAD) first and takes at
 * most 4 KiB: two system calls where one does, and a busy stream cut in
 * 4 KiB pieces. Over TLS the bufferevent does the handshake; from the
 * first call after it (c->connected) tokentap reads the same way, with
 * tls_recv: each read() of up to 16.5 KiB fills a memory BIO that OpenSSL
 * decrypts the records from (tls_read_own), all into one buffer, where the bufferevent took
 * two read()s per record and a pass through its input buffer. Use this,
 * never bufferevent_enable/disable(EV_READ), on an upstream connection.
 * `timeout_ms` (0: none) reports BEV_EVENT_TIMEOUT | BEV_EVENT_READING
 * after that long without a byte.
 */
void upconn_reading(struct upconn *c, bool on, uint64_t timeout_ms);

/*
 * Bytes that skip the input buffer. Once a response's head has parsed, a
 * streamed body needs no buffer of its own: it is parsed and passed on in
 * the same call. While `ready` says so (and nothing waits in the input
 * buffer), a plain connection's reads go into a per-thread scratch buffer
 * and straight to `data`, which must be done with them when it returns
 * (written to the client, or copied). This spares each read the input
 * buffer's chain: an allocation, its bookkeeping, and its free once the
 * bytes are written. EOF, errors and timeouts still go to the bufferevent's
 * event callback; with `d` NULL, everything goes through the input buffer
 * as before. Over TLS the same, once the handshake is done (tls_recv). upstream_release clears it. (exchange.c reads
 * both through one function, exchange_read: only the bytes' place differs.)
 */
struct upconn_direct {
	bool (*ready)(void *arg);
	void (*data)(void *arg, const char *buf, size_t len); /* may release `c` */
};
void upconn_set_direct(struct upconn *c, const struct upconn_direct *d, void *arg);

/* Whether a request dispatched now runs cold: on a freshly opened
 * connection while the upstream has served nothing yet in this process,
 * has been idle for cfg->cold_idle_ms, or was failing. The state is the
 * server's, shared by every worker's copy of the upstream (struct up_share,
 * atomics): a worker's first request to a server others have kept busy is
 * warm. */
bool upstream_dispatch_cold(const struct upstream *up, bool reused, uint64_t now_ns);

/* Notes how an exchange ended, for upstream_dispatch_cold. */
void upstream_note_result(struct upstream *up, bool responded, uint64_t now_ns);
