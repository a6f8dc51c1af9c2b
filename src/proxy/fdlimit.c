/*
 * fdlimit.c — file descriptors as a resource (fdlimit.h).
 *
 * Running out of descriptors is a state that lasts, not an event: accept()
 * keeps failing for as long as the connections that hold them stay open,
 * and a level-triggered listener reports the same error on every pass of
 * its loop. So the listeners pause (ACCEPT_PAUSE_MS) and the failure is
 * logged at most once a second for the whole process, with a count of what
 * was not logged; the estimate at start-up says beforehand when the limit
 * cannot cover limits.max_connections. A limits.max_connections the user did
 * not set is lowered to what the limit holds, so that the defaults fit
 * whatever limit the machine gives and a warning only ever names something
 * the user chose.
 *
 * Invariant: the rate limit is lock-free (two atomics) and safe from any
 * thread; nothing here allocates.
 */
#include "fdlimit.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "config.h"
#include "log.h"
#include "timeline.h"
#include "upstream.h"

/* stdin/out/err, the main loop (epoll, signals, the drain eventfd), the
 * admin thread's loop, wake-up pipe and listener, the store's lock file,
 * data and lock files, the access log, and slack for name lookups and
 * certificate files read on a reload */
#define FDS_FIXED 32
/* per worker: its loop's epoll, its control channel's eventfd, slack */
#define FDS_PER_WORKER 4
#define LOG_EVERY_NS 1000000000ull

static _Atomic uint64_t next_log_ns;
static _Atomic uint64_t unlogged;

uint64_t fdlimit_need(const struct config *c, unsigned nworkers)
{
	struct listener_conf ls[LISTENERS_MAX];
	uint64_t per_worker = FDS_PER_WORKER + config_listeners(c, ls);

	per_worker += (uint64_t)c->nupstreams * POOL_MAX_IDLE;
	for (unsigned i = 0; i < c->nroutes; i++)
		if (c->routes[i].mirror_upstream)
			per_worker += c->routes[i].mirror_max_in_flight;
	return FDS_FIXED + ADMIN_MAX_CONNECTIONS + 2 * (uint64_t)c->max_connections + nworkers * per_worker;
}

/* The most a process may open: /proc/sys/fs/nr_open (setrlimit refuses
 * more, RLIM_INFINITY included); 0 when it cannot be read. */
static uint64_t nr_open(void)
{
	FILE *f = fopen("/proc/sys/fs/nr_open", "re");
	unsigned long long n = 0;

	if (f) {
		if (fscanf(f, "%llu", &n) != 1)
			n = 0;
		fclose(f);
	}
	return n;
}

unsigned fdlimit_fit(struct config *c, unsigned nworkers)
{
	struct rlimit rl;
	uint64_t rest, n;

	if (c->max_connections_explicit || getrlimit(RLIMIT_NOFILE, &rl) == -1 || rl.rlim_cur == RLIM_INFINITY)
		return 0;
	rest = fdlimit_need(c, nworkers) - 2 * (uint64_t)c->max_connections;
	n = rl.rlim_cur > rest ? (rl.rlim_cur - rest) / 2 : 0;
	if (n >= c->max_connections)
		return 0;
	c->max_connections = n ? (unsigned)n : 1; /* the setting's least */
	return c->max_connections;
}

uint64_t fdlimit_check(const struct config *c, unsigned nworkers)
{
	struct rlimit rl;
	uint64_t need = fdlimit_need(c, nworkers);

	if (getrlimit(RLIMIT_NOFILE, &rl) == -1)
		return 0;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need && c->max_connections_explicit)
		log_warn(
			"descriptor limit %llu is below the %llu that limits.max_connections %u may need (2 per client "
			"connection, plus upstream pools, mirrors, the admin API, the store and logs); past it new "
			"connections wait in the backlog: raise the limit (ulimit -n, systemd LimitNOFILE=) or lower "
			"limits.max_connections",
			(unsigned long long)rl.rlim_cur, (unsigned long long)need, c->max_connections);
	else if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
		/* limits.max_connections is already down to one: what is left
		 * is the upstreams' pools and the mirrors of every worker */
		log_warn(
			"descriptor limit %llu is below the %llu that %u worker(s) may need for the idle pools of %u "
			"upstream(s) (%u connections each, per worker), the mirrors' max_in_flight and one client "
			"connection; past it new connections wait in the backlog: raise the limit (ulimit -n, "
			"systemd LimitNOFILE=), or configure fewer workers, upstreams or mirrored requests",
			(unsigned long long)rl.rlim_cur, (unsigned long long)need, nworkers, c->nupstreams,
			POOL_MAX_IDLE);
	return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
}

void fdlimit_raise(struct config *c, unsigned nworkers)
{
	struct rlimit rl;
	unsigned cap = c->max_connections;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur, most = (rlim_t)nr_open();

		rl.rlim_cur = rl.rlim_max;
		if (most && (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > most))
			rl.rlim_cur = most;
		if (rl.rlim_cur > was && setrlimit(RLIMIT_NOFILE, &rl) == 0)
			log_info("descriptor limit raised from %llu to %llu (the hard limit)", (unsigned long long)was,
				 (unsigned long long)rl.rlim_cur);
	}
	if (fdlimit_fit(c, nworkers))
		log_info(
			"limits.max_connections %u: what the descriptor limit holds beside the upstream pools and "
			"the rest (not set; the default %u would need %llu descriptors)",
			c->max_connections, cap,
			(unsigned long long)(fdlimit_need(c, nworkers) + 2ull * (cap - c->max_connections)));
	(void)fdlimit_check(c, nworkers);
}

void fdlimit_accept_failed(const char *who, int err)
{
	uint64_t now = clock_now_ns();
	uint64_t next = atomic_load(&next_log_ns);

	if (now < next || !atomic_compare_exchange_strong(&next_log_ns, &next, now + LOG_EVERY_NS)) {
		atomic_fetch_add(&unlogged, 1);
		return;
	}
	uint64_t more = atomic_exchange(&unlogged, 0);
	if (more)
		log_error("%s: accept failed: %s; new connections wait %u ms (%llu more failures since the last line)",
			  who, strerror(err), ACCEPT_PAUSE_MS, (unsigned long long)more);
	else
		log_error("%s: accept failed: %s; new connections wait %u ms", who, strerror(err), ACCEPT_PAUSE_MS);
}
