/*
 * main.c — wiring and signals. No logic of its own: cli.c makes the config,
 * the shared modules (access log, store, recent ring) are built, then one
 * worker per event loop (worker.c), each on its own thread. The main
 * thread's loop takes signals (SIGTERM/SIGINT drains every worker, SIGHUP
 * reloads the configuration into a new router generation in each) and,
 * once a minute, hands the heap's free pages back (on_malloc_trim).
 */
#include <event2/event.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "accesslog.h"
#include "admin.h"
#include "cli.h"
#include "config.h"
#include "fdlimit.h"
#include "log.h"
#include "loop.h"
#include "proxy.h"
#include "recent.h"
#include "router.h"
#include "scrape.h"
#include "settings.h"
#include "stats.h"
#include "store.h"
#include "timeline.h"
#include "version.h"
#include "worker.h"
#include "otlp.h"
#include "otlp_metrics.h"
#include "workload.h"

#define RECENT_REQUESTS 1024 /* kept for GET /requests/recent */

/* --check-data: opens the store as a server would (stale readers cleared,
 * layout checked, directory locked) and decodes every record. */
static int check_data(const struct config *cfg)
{
	struct store_options so;
	struct store *st;
	char err[512];
	uint64_t series, slices, bad;
	int rc;

	store_options_defaults(&so);
	so.dir = cfg->data_dir;
	so.map_size_max = cfg->store_max_size;
	so.set_aside_corrupt = false; /* a check reports a corrupt file, it does not move it */
	st = store_open(&so, err, sizeof(err));
	if (!st) {
		fprintf(stderr, "tokentap: %s\n", err);
		return 1;
	}
	rc = store_verify(st, &series, &slices, &bad, err, sizeof(err));
	store_close(st);
	if (rc == -1) {
		fprintf(stderr, "tokentap: %s\n", err);
		return 1;
	}
	printf("%s: %llu series, %llu slices, %llu undecodable\n", cfg->data_dir, (unsigned long long)series,
	       (unsigned long long)slices, (unsigned long long)bad);
	return bad ? 1 : 0;
}

/* What the signal handlers need. */
struct app {
	int argc;
	char **argv;
	struct event_base *base; /* the main thread's loop: signals only */
	struct worker **workers;
	unsigned nworkers;
	const struct config *boot; /* settings that a reload does not change */
	struct admin *admin;	   /* NULL: off; told of each reload's upstream labels */
	struct scrape *scrape;	   /* the engines' /metrics (scrape.h); told of each reload */
	uint64_t generation;
	bool stopping;
	int drained_fd;	   /* eventfd: a worker finished draining */
	unsigned ndrained; /* main thread only */
};

/* On a worker's thread: its last stream is done. */
static void on_worker_drained(struct worker *w, void *arg)
{
	struct app *app = arg;
	uint64_t one = 1;
	(void)w;
	if (write(app->drained_fd, &one, sizeof(one)) == -1) {
		/* the counter cannot overflow with at most WORKERS_MAX adds */
	}
}

static void on_drained_fd(evutil_socket_t fd, short what, void *arg)
{
	struct app *app = arg;
	uint64_t n = 0;

	(void)what;
	if (read(fd, &n, sizeof(n)) != sizeof(n))
		return;
	app->ndrained += (unsigned)n;
	if (app->ndrained >= app->nworkers) {
		log_info("shutdown: all requests done");
		event_base_loopexit(app->base, NULL);
	}
}

static void on_stop(evutil_socket_t sig, short what, void *arg)
{
	struct app *app = arg;

	if (app->stopping) {
		log_warn("received %s again: stopping now", sig == SIGINT ? "SIGINT" : "SIGTERM");
		event_base_loopexit(app->base, NULL);
		return;
	}
	app->stopping = true;
	log_info("received %s: draining", sig == SIGINT ? "SIGINT" : "SIGTERM");
	/* the grace period of the configuration in force, reloads included */
	uint64_t grace_ms = proxy_router(worker_proxy(app->workers[0]))->cfg.shutdown_grace_ms;
	for (unsigned i = 0; i < app->nworkers; i++)
		if (worker_drain(app->workers[i], grace_ms, on_worker_drained, app) == -1) {
			log_error("worker %u did not take the drain; stopping now", i);
			event_base_loopexit(app->base, NULL);
			return;
		}
}

static void on_reload(evutil_socket_t sig, short what, void *arg)
{
	struct app *app = arg;
	struct config next[WORKERS_MAX];
	char errs[8192], err[512];
	unsigned loaded = 0, failed = 0;

	if (!app->boot->path) {
		log_warn("received SIGHUP: nothing to reload (started without -c FILE)");
		return;
	}
	/* one copy per worker (each router takes its own), every one loaded
	 * before any worker switches */
	memset(next, 0, sizeof(next));
	for (; loaded < app->nworkers; loaded++) {
		if (cli_reload(app->argc, app->argv, &next[loaded], errs, sizeof(errs)) == -1) {
			log_error("reload failed; the running configuration stays:\n%s", errs);
			for (unsigned i = 0; i <= loaded; i++)
				config_free(&next[i]);
			return;
		}
	}
	settings_warn_fixed(app->boot, &next[0]); /* settings read once at start-up */
	for (unsigned i = 0; i < app->nworkers; i++)
		(void)fdlimit_fit(&next[i], app->nworkers);
	(void)fdlimit_check(&next[0], app->nworkers);
	/* taken now: a worker that takes the configuration empties next[] */
	struct admin_labels *labels = admin_labels_of(&next[0]);
	struct scrape_list *scrapes = scrape_list_of(&next[0]);
	int log_level = next[0].log_level;
	for (unsigned i = 0; i < app->nworkers; i++) {
		if (worker_reload(app->workers[i], &next[i], app->generation + 1, err, sizeof(err)) == -1) {
			log_error("reload failed in worker %u; it keeps the running configuration: %s", i, err);
			failed++;
		}
		config_free(&next[i]);
	}
	if (failed == app->nworkers) {
		admin_labels_use(NULL, labels);
		scrape_use(NULL, scrapes);
		return;
	}
	admin_labels_use(app->admin, labels);
	scrape_use(app->scrape, scrapes);
	log_set_level((enum log_level)log_level); /* only a generation that took effect */
	app->generation++;
	const struct router *rt = proxy_router(worker_proxy(app->workers[0]));
	log_info("reloaded %s: generation %llu, %u upstream(s), %u route(s)", app->boot->path,
		 (unsigned long long)app->generation, rt->nups, rt->nroutes);
}

/*
 * The store's writer decodes, merges and deflates each second: a few
 * hundred KiB allocated and freed again. With glibc's defaults the freed
 * top of its heap went back to the kernel every time (madvise, a TLB flush
 * sent to every CPU, page faults to get it back a second later), and a
 * busy worker paid for the flushes. Free memory up to the trim threshold
 * now stays for reuse; blocks over the mmap threshold still come and go
 * with the kernel. Fixing the mmap threshold also stops glibc from moving
 * both thresholds on its own.
 */
static void malloc_settle(void)
{
#if defined(M_TRIM_THRESHOLD) && defined(M_MMAP_THRESHOLD)
	mallopt(M_MMAP_THRESHOLD, 1 << 20);
	mallopt(M_TRIM_THRESHOLD, 16 << 20);
#endif
}

/*
 * Once a minute, hands the whole free pages of every arena back to the
 * kernel. The trim threshold above only ever gives back the top of a heap;
 * a free page below a block still in use stays resident for good. The
 * workers allocate and free a few MiB a second (a 9 KiB histogram per
 * metric a slice touches, TLS records) around blocks that live for minutes
 * (the live ring's encoded seconds, the recent ring, the capture), so their
 * heaps fragment and RSS crept up all run long though the memory in use
 * stayed flat: measured in the soak with everything on, the heap in use
 * (heaptrack) flat after the ring filled while the arenas' free memory
 * grew 8.0 -> 12.8 MiB in 340 s, and one malloc_trim(0) at the end took
 * RssAnon from 31.0 to 25.4 MiB (docs/security.md, "Soak with everything
 * on"). A trim walks every arena, each under its lock: 1.3 ms median and
 * 11 ms at most (20 trims, a loaded 2-core machine), so once a minute a
 * worker allocating meanwhile may wait up to its arena's share of that.
 */
#define MALLOC_TRIM_EVERY_MS 60000

static void on_malloc_trim(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
#ifdef __GLIBC__
	uint64_t t0 = clock_now_ns();
	int released = malloc_trim(0);
	log_debug("malloc_trim: %s in %llu us", released ? "pages released" : "nothing to release",
		  (unsigned long long)((clock_now_ns() - t0) / 1000));
#endif
}

int main(int argc, char **argv)
{
	struct config boot, gen;
	struct worker *workers[WORKERS_MAX] = { NULL };
	struct app app = { argc, argv, NULL, workers, 0, &boot, NULL, NULL, 1, false, -1, 0 };
	struct event_base *base = NULL;
	struct accesslog *alog = NULL;
	struct store *store = NULL;
	struct recent *recent = NULL;
	struct store_options so;
	struct worker_env env;
	struct event *sigint = NULL, *sigterm = NULL, *sighup = NULL, *drained = NULL, *trim = NULL;
	struct admin *admin = NULL;
	struct admin_options ao = { .listen = NULL }; /* the rest zero */
	char *admin_token = NULL;
	char err[512], errs[8192];
	unsigned nworkers;
	_Atomic unsigned clients = 0; /* outlives the workers */
	int rc = 1;

	memset(&gen, 0, sizeof(gen));
	switch (cli_config(argc, argv, &boot)) {
	case CLI_RUN: break;
	case CLI_EXIT_OK: config_free(&boot); return 0;
	case CLI_EXIT_USAGE: config_free(&boot); return 2;
	case CLI_EXIT_CONFIG: config_free(&boot); return 1;
	}
	log_set_level((enum log_level)boot.log_level);
	if (boot.check_data) {
		rc = check_data(&boot);
		config_free(&boot);
		return rc;
	}
	if (boot.admin_token_file && admin_token_load(boot.admin_token_file, &admin_token, err, sizeof(err)) == -1) {
		fprintf(stderr, "tokentap: --admin-token-file: %s\n", err);
		config_free(&boot);
		return 2;
	}
	/* the environment's token is used only without a file, and checked alike */
	if (!boot.admin_token_file && boot.admin_listen && admin_token_env(&admin_token, err, sizeof(err)) == -1) {
		fprintf(stderr, "tokentap: %s\n", err);
		config_free(&boot);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	malloc_settle();
	nworkers = config_workers(&boot);
	fdlimit_raise(&boot, nworkers);

	base = event_base_new();
	app.drained_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!base || app.drained_fd == -1) {
		log_error("cannot create the main event loop");
		goto out;
	}
	app.base = base;
	if (boot.access_log) {
		alog = accesslog_open(boot.access_log, err, sizeof(err));
		if (!alog) {
			log_error("%s", err);
			goto out;
		}
	}
	if (boot.workload_path) {
		struct workload_options wo = { .path = boot.workload_path,
					       .max_size = boot.workload_max_size,
					       .max_files = boot.workload_max_files,
					       .block_tokens = boot.workload_block_tokens,
					       .group_idle_ms = boot.model_idle_ms,
					       .max_hash_ids = boot.workload_max_hash_ids };
		if (workload_open(&wo, err, sizeof(err)) == -1) {
			log_error("%s", err);
			goto out;
		}
	}
	{
		struct otlp_options oo;
		int on = otlp_options_resolve(&boot, &oo, err, sizeof(err));
		if (on == -1 || (on == 1 && otlp_open(&oo, err, sizeof(err)) == -1)) {
			log_error("%s", err);
			goto out;
		}
		struct otlp_metrics_options mo;
		on = otlp_metrics_options_resolve(&boot, &mo, err, sizeof(err));
		if (on == -1 || (on == 1 && otlp_metrics_open(&mo, err, sizeof(err)) == -1)) {
			log_error("%s", err);
			goto out;
		}
	}
	store_options_defaults(&so);
	so.dir = boot.data_dir;
	so.minute_retention_s = boot.minute_retention_s;
	so.hour_retention_s = boot.hour_retention_s;
	so.map_size_max = boot.store_max_size;
	store = store_open(&so, err, sizeof(err));
	if (!store) {
		log_error("%s", err);
		goto out;
	}
	recent = recent_new(RECENT_REQUESTS);
	memset(&env, 0, sizeof(env));
	env.alog = alog;
	env.store = store;
	env.recent = recent;
	env.boot = &boot;
	env.reuseport = nworkers > 1;
	env.clients = &clients;
	/* Each worker's router owns a config of its own, so that boot stays
	 * valid for the store and the admin API across reloads. */
	for (unsigned i = 0; i < nworkers; i++) {
		if (cli_reload(argc, argv, &gen, errs, sizeof(errs)) == -1) {
			log_error("%s", errs);
			goto out;
		}
		(void)fdlimit_fit(&gen, nworkers); /* as boot's, logged there */
		workers[i] = worker_new(i, &env, &gen, app.generation, i ? workers[0] : NULL, err, sizeof(err));
		config_free(&gen); /* emptied when a router took it */
		if (!workers[i]) {
			log_error("%s", err);
			rc = 2;
			goto out;
		}
		app.nworkers++;
	}
	for (unsigned i = 0; i < nworkers; i++)
		if (worker_start(workers[i], err, sizeof(err)) == -1) {
			log_error("%s", err);
			goto out;
		}
	/* after the workers: a scrape publishes into the upstreams they hold */
	if (!(app.scrape = scrape_start(&boot, err, sizeof(err)))) {
		log_error("%s", err);
		goto out;
	}
	sigint = evsignal_new(base, SIGINT, on_stop, &app);
	sigterm = evsignal_new(base, SIGTERM, on_stop, &app);
	sighup = evsignal_new(base, SIGHUP, on_reload, &app);
	drained = event_new(base, app.drained_fd, EV_READ | EV_PERSIST, on_drained_fd, &app);
	if (!sigint || !sigterm || !sighup || !drained || evsignal_add(sigint, NULL) == -1 ||
	    evsignal_add(sigterm, NULL) == -1 || evsignal_add(sighup, NULL) == -1 || event_add(drained, NULL) == -1) {
		log_error("cannot set up signal handling");
		goto out;
	}
	trim = event_new(base, -1, EV_PERSIST, on_malloc_trim, NULL);
	if (trim) {
		struct timeval every = loop_tv(MALLOC_TRIM_EVERY_MS);
		event_add(trim, &every);
	}

	{
		const struct router *rt = proxy_router(worker_proxy(workers[0]));
		log_info("tokentap %s listening on %s, %u upstream(s), %u route(s), %u worker(s)", TOKENTAP_VERSION,
			 proxy_listen_addr(worker_proxy(workers[0])), rt->nups, rt->nroutes, nworkers);
	}
	if (boot.admin_listen) {
		ao.listen = boot.admin_listen;
		ao.token = admin_token;
		for (unsigned i = 0; i < nworkers; i++) {
			ao.controls[i] = worker_control(workers[i]);
			ao.proxies[i] = worker_proxy(workers[i]);
		}
		ao.nworkers = nworkers;
		ao.slo = stats_slo(&boot);
		admin = admin_start(&ao, store, &boot, recent, err, sizeof(err));
		app.admin = admin;
		if (!admin && boot.admin_listen_explicit) {
			log_error("%s", err);
			goto out;
		}
		if (!admin)
			log_warn("%s; the admin API is off (choose another with --admin ADDR:PORT)", err);
	}
	event_base_dispatch(base);
	rc = 0;
out:
	admin_stop(admin); /* before the workers it calls and the store it reads */
	scrape_stop(app.scrape);
	free(admin_token);
	if (sigint)
		event_free(sigint);
	if (sigterm)
		event_free(sigterm);
	if (sighup)
		event_free(sighup);
	if (drained)
		event_free(drained);
	if (trim)
		event_free(trim);
	for (unsigned i = 0; i < app.nworkers; i++)
		worker_free(workers[i]); /* each hands its last stats to the store */
	store_close(store);		 /* commits them */
	workload_close();		 /* writes what the workers queued */
	otlp_close();			 /* sends the spans they queued */
	otlp_metrics_close();		 /* and the metrics, a last time */
	recent_free(recent);
	accesslog_close(alog);
	config_free(&gen);
	config_free(&boot);
	if (app.drained_fd != -1)
		close(app.drained_fd);
	if (base)
		event_base_free(base);
	return rc;
}
