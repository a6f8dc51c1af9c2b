/*
 * main.c — wiring and signals. No logic of its own: cli.c makes the config,
 * the modules are built in order, and the loop runs until SIGTERM/SIGINT
 * drains it. SIGHUP reloads the configuration into a new router generation.
 */
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accesslog.h"
#include "admin.h"
#include "cli.h"
#include "config.h"
#include "control.h"
#include "log.h"
#include "proxy.h"
#include "recent.h"
#include "router.h"
#include "stats.h"
#include "store.h"
#include "version.h"

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
	struct event_base *base;
	struct proxy *px;
	const struct config *boot; /* settings that a reload does not change */
	uint64_t generation;
	bool stopping;
};

static void on_drained(void *arg)
{
	struct app *app = arg;
	log_info("shutdown: all requests done");
	event_base_loopexit(app->base, NULL);
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
	proxy_drain(app->px, app->boot->shutdown_grace_ms, on_drained, app);
}

/* Settings read once at start-up: a reload that changes them says so. */
static void warn_fixed(const struct config *boot, const struct config *next)
{
#define SAME(a, b) ((a) == (b) || ((a) && (b) && strcmp((a), (b)) == 0))
	struct listener_conf a[LISTENERS_MAX], b[LISTENERS_MAX];
	unsigned na = config_listeners(boot, a), nb = config_listeners(next, b);
	bool same = na == nb;
	for (unsigned i = 0; same && i < na; i++)
		same = SAME(a[i].address, b[i].address) && !a[i].tls_cert == !b[i].tls_cert;
	if (!same)
		log_warn("reload: listener changes need a restart; certificates of existing TLS listeners are reloaded");
	if (!SAME(boot->data_dir, next->data_dir))
		log_warn("reload: data directory changes need a restart");
	if (!SAME(boot->admin_listen, next->admin_listen))
		log_warn("reload: admin address changes need a restart");
	if (!SAME(boot->access_log, next->access_log))
		log_warn("reload: access log changes need a restart");
#undef SAME
}

static void on_reload(evutil_socket_t sig, short what, void *arg)
{
	struct app *app = arg;
	struct config next;
	struct router *rt;
	char errs[8192], err[512];

	if (!app->boot->path) {
		log_warn("received SIGHUP: nothing to reload (started without -c FILE)");
		return;
	}
	if (cli_reload(app->argc, app->argv, &next, errs, sizeof(errs)) == -1) {
		log_error("reload failed; the running configuration stays:\n%s", errs);
		config_free(&next);
		return;
	}
	warn_fixed(app->boot, &next);
	rt = router_new(app->base, &next, proxy_router(app->px), app->generation + 1, err, sizeof(err));
	if (!rt) {
		log_error("reload failed; the running configuration stays: %s", err);
		config_free(&next);
		return;
	}
	app->generation++;
	proxy_set_router(app->px, rt);
	log_info("reloaded %s: generation %llu, %u upstream(s), %u route(s)", app->boot->path,
		 (unsigned long long)app->generation, rt->nups, rt->nroutes);
}

int main(int argc, char **argv)
{
	struct config boot, gen;
	struct app app = { argc, argv, NULL, NULL, &boot, 1, false };
	struct event_base *base = NULL;
	struct router *rt = NULL;
	struct accesslog *alog = NULL;
	struct proxy *px = NULL;
	struct store *store = NULL;
	struct stats_shard *stats = NULL;
	struct recent *recent = NULL;
	struct store_options so;
	struct slo slo;
	struct event *sigint = NULL, *sigterm = NULL, *sighup = NULL;
	struct admin *admin = NULL;
	struct admin_options ao = { NULL, NULL, NULL, NULL };
	struct control *control = NULL;
	char *admin_token = NULL;
	char err[512], errs[8192];
	int rc = 1;

	memset(&gen, 0, sizeof(gen));
	switch (cli_config(argc, argv, &boot)) {
	case CLI_RUN: break;
	case CLI_EXIT_OK: config_free(&boot); return 0;
	case CLI_EXIT_USAGE: config_free(&boot); return 2;
	case CLI_EXIT_CONFIG: config_free(&boot); return 1;
	}
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
	signal(SIGPIPE, SIG_IGN);

	base = event_base_new();
	if (!base) {
		log_error("cannot create the event loop");
		goto out;
	}
	app.base = base;
	/* The router owns a config of its own, so that boot stays valid for
	 * the store and the admin API across reloads. */
	if (cli_reload(argc, argv, &gen, errs, sizeof(errs)) == -1) {
		log_error("%s", errs);
		goto out;
	}
	rt = router_new(base, &gen, NULL, app.generation, err, sizeof(err));
	if (!rt) {
		log_error("%s", err);
		rc = 2;
		goto out;
	}
	if (boot.access_log) {
		alog = accesslog_open(boot.access_log, err, sizeof(err));
		if (!alog) {
			log_error("%s", err);
			goto out;
		}
	}
	store_options_defaults(&so);
	so.dir = boot.data_dir;
	so.minute_retention_s = boot.minute_retention_s;
	so.hour_retention_s = boot.hour_retention_s;
	store = store_open(&so, err, sizeof(err));
	if (!store) {
		log_error("%s", err);
		goto out;
	}
	slo.ttft_us = boot.slo_ttft_ms * 1000;
	slo.tpot_us = boot.slo_tpot_ms * 1000;
	stats = stats_shard_new(base, store, boot.max_models, &slo, boot.flush_ms);
	if (!stats) {
		log_error("cannot set up stats recording");
		goto out;
	}
	recent = recent_new(RECENT_REQUESTS);
	px = proxy_new(base, rt, alog, stats, recent, err, sizeof(err));
	if (!px) {
		log_error("%s", err);
		goto out;
	}
	rt = NULL; /* the proxy holds it now */
	app.px = px;
	sigint = evsignal_new(base, SIGINT, on_stop, &app);
	sigterm = evsignal_new(base, SIGTERM, on_stop, &app);
	sighup = evsignal_new(base, SIGHUP, on_reload, &app);
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);
	evsignal_add(sighup, NULL);

	log_info("tokentap %s listening on %s, %u upstream(s), %u route(s)", TOKENTAP_VERSION,
		 proxy_listen_addr(px), proxy_router(px)->nups, proxy_router(px)->nroutes);
	if (boot.admin_listen) {
		const char *env = getenv("TOKENTAP_ADMIN_TOKEN");
		ao.listen = boot.admin_listen;
		ao.token = admin_token ? admin_token : env && *env ? env : NULL;
		control = control_new(base);
		ao.control = control;
		ao.proxy = px;
		admin = admin_start(&ao, store, &boot, recent, err, sizeof(err));
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
	admin_stop(admin); /* before the store it reads and the control it calls */
	control_free(control);
	free(admin_token);
	if (sigint)
		event_free(sigint);
	if (sigterm)
		event_free(sigterm);
	if (sighup)
		event_free(sighup);
	proxy_free(px);
	router_unref(rt);
	stats_shard_free(stats); /* hands over what the last interval recorded */
	store_close(store);	 /* commits it */
	recent_free(recent);
	accesslog_close(alog);
	config_free(&gen);
	config_free(&boot);
	if (base)
		event_base_free(base);
	return rc;
}
