/*
 * main.c — command line, wiring, signals. No logic of its own: it fills a
 * config, builds the modules in order and runs the loop.
 */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accesslog.h"
#include "admin.h"
#include "config.h"
#include "log.h"
#include "proxy.h"
#include "recent.h"
#include "stats.h"
#include "store.h"
#include "upstream.h"
#include "version.h"

#define EXIT_USAGE 2
#define RECENT_REQUESTS 1024 /* kept for GET /requests/recent */

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: tokentap --upstream URL [options]\n"
		"\n"
		"A reverse proxy for LLM inference servers that forwards every response\n"
		"unchanged and measures TTFT, inter-token latency and throughput inline.\n"
		"\n"
		"Options:\n"
		"  -u, --upstream URL          inference server, e.g. http://127.0.0.1:8000 (required)\n"
		"  -l, --listen ADDR:PORT      where clients connect (default 127.0.0.1:8080)\n"
		"      --access-log PATH|-     one JSON line per request; '-' for stdout\n"
		"      --max-body-size SIZE    largest request body (default 32m)\n"
		"      --max-header-size SIZE  largest request head (default 32k)\n"
		"      --header-timeout DUR    whole request head must arrive within (default 30s)\n"
		"      --connect-timeout DUR   upstream connect (default 5s)\n"
		"      --first-byte-timeout DUR  request sent to response headers (default 300s)\n"
		"      --idle-timeout DUR      silence on a running exchange (default 300s)\n"
		"      --data-dir DIR|off      where percentile state persists (default ./tokentap-data)\n"
		"      --flush-interval DUR    how often stats reach the store (default 1s)\n"
		"      --slo-ttft DUR          goodput: time to first token at most (default 2s)\n"
		"      --slo-tpot DUR          goodput: time per output token at most (default 100ms)\n"
		"      --log-level LEVEL       error, warn, info or debug (default info)\n"
		"      --check-data            read every record in --data-dir, report, and exit\n"
		"      --admin ADDR:PORT|off   admin API: stats, /metrics, reset (default 127.0.0.1:9901)\n"
		"      --admin-token-file PATH bearer token for admin writes (or env TOKENTAP_ADMIN_TOKEN)\n"
		"  -h, --help                  this text\n"
		"  -V, --version               print the version\n"
		"\n"
		"SIZE takes k, m or g (1024-based); DUR takes ms, s, m or h (bare numbers are seconds).\n"
		"A streamed response is never cut by a total-duration limit.\n");
}

enum {
	OPT_ACCESS_LOG = 256,
	OPT_MAX_BODY,
	OPT_MAX_HEADER,
	OPT_HEADER_TIMEOUT,
	OPT_CONNECT_TIMEOUT,
	OPT_FIRST_BYTE_TIMEOUT,
	OPT_IDLE_TIMEOUT,
	OPT_LOG_LEVEL,
	OPT_DATA_DIR,
	OPT_FLUSH_INTERVAL,
	OPT_SLO_TTFT,
	OPT_SLO_TPOT,
	OPT_CHECK_DATA,
	OPT_ADMIN,
	OPT_ADMIN_TOKEN_FILE,
};

/* Admin API settings: main.c's alone, so they live here rather than in
 * struct config. An explicit --admin that cannot bind is fatal; the default
 * one only warns, so a second tokentap on the same machine still runs. */
static const char *admin_listen = "127.0.0.1:9901";
static bool admin_listen_explicit;
static const char *admin_token_file;

static int bad_value(const char *flag, const char *value, const char *expect)
{
	fprintf(stderr, "tokentap: invalid value '%s' for %s: expected %s\n", value, flag, expect);
	return -1;
}

/* The flag as the user typed its long form, for error messages. */
static void option_name(const struct option *opts, int val, int argc, char **argv, char *out, size_t len)
{
	for (const struct option *o = opts; o->name; o++) {
		if (o->val == val && val != 0) {
			snprintf(out, len, "--%s", o->name);
			return;
		}
	}
	/* an unknown long option: getopt has just stepped past it */
	snprintf(out, len, "%s", optind > 0 && optind <= argc ? argv[optind - 1] : "?");
}

static int parse_args(int argc, char **argv, struct config *cfg)
{
	static const struct option opts[] = {
		{ "upstream", required_argument, NULL, 'u' },
		{ "listen", required_argument, NULL, 'l' },
		{ "access-log", required_argument, NULL, OPT_ACCESS_LOG },
		{ "max-body-size", required_argument, NULL, OPT_MAX_BODY },
		{ "max-header-size", required_argument, NULL, OPT_MAX_HEADER },
		{ "header-timeout", required_argument, NULL, OPT_HEADER_TIMEOUT },
		{ "connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT },
		{ "first-byte-timeout", required_argument, NULL, OPT_FIRST_BYTE_TIMEOUT },
		{ "idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT },
		{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
		{ "data-dir", required_argument, NULL, OPT_DATA_DIR },
		{ "flush-interval", required_argument, NULL, OPT_FLUSH_INTERVAL },
		{ "slo-ttft", required_argument, NULL, OPT_SLO_TTFT },
		{ "slo-tpot", required_argument, NULL, OPT_SLO_TPOT },
		{ "check-data", no_argument, NULL, OPT_CHECK_DATA },
		{ "admin", required_argument, NULL, OPT_ADMIN },
		{ "admin-token-file", required_argument, NULL, OPT_ADMIN_TOKEN_FILE },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int c;
	char flag[64];

	opterr = 0; /* our own messages name the flag */
	while ((c = getopt_long(argc, argv, ":u:l:hV", opts, NULL)) != -1) {
		option_name(opts, c == ':' || c == '?' ? optopt : c, argc, argv, flag, sizeof(flag));
		switch (c) {
		case 'u': cfg->upstream = optarg; break;
		case 'l': cfg->listen = optarg; break;
		case OPT_ACCESS_LOG: cfg->access_log = optarg; break;
		case OPT_MAX_BODY:
			if (config_parse_size(optarg, &cfg->max_body_size) == -1)
				return bad_value("--max-body-size", optarg, "a size such as 32m");
			break;
		case OPT_MAX_HEADER:
			if (config_parse_size(optarg, &cfg->max_header_size) == -1 || cfg->max_header_size < 256 ||
			    cfg->max_header_size > (1u << 30))
				return bad_value("--max-header-size", optarg, "a size from 256 to 1g, such as 32k");
			break;
		case OPT_HEADER_TIMEOUT:
		case OPT_CONNECT_TIMEOUT:
		case OPT_FIRST_BYTE_TIMEOUT:
		case OPT_IDLE_TIMEOUT:
		case OPT_FLUSH_INTERVAL:
		case OPT_SLO_TTFT:
		case OPT_SLO_TPOT: {
			uint64_t *dst = c == OPT_HEADER_TIMEOUT	      ? &cfg->header_timeout_ms
					: c == OPT_CONNECT_TIMEOUT    ? &cfg->connect_timeout_ms
					: c == OPT_FIRST_BYTE_TIMEOUT ? &cfg->first_byte_timeout_ms
					: c == OPT_IDLE_TIMEOUT	      ? &cfg->idle_timeout_ms
					: c == OPT_FLUSH_INTERVAL     ? &cfg->flush_ms
					: c == OPT_SLO_TTFT	      ? &cfg->slo_ttft_ms
								      : &cfg->slo_tpot_ms;
			if (config_parse_duration_ms(optarg, dst) == -1 || *dst == 0)
				return bad_value(flag, optarg, "a positive duration such as 300ms or 5s");
			break;
		}
		case OPT_CHECK_DATA:
			cfg->check_data = true;
			break;
		case OPT_ADMIN:
			admin_listen = strcmp(optarg, "off") == 0 ? NULL : optarg;
			admin_listen_explicit = true;
			break;
		case OPT_ADMIN_TOKEN_FILE: admin_token_file = optarg; break;
		case OPT_DATA_DIR:
			cfg->data_dir = strcmp(optarg, "off") == 0 ? NULL : optarg;
			break;
		case OPT_LOG_LEVEL:
			if (log_set_level_name(optarg) == -1)
				return bad_value("--log-level", optarg, "error, warn, info or debug");
			break;
		case 'h': usage(stdout); exit(0);
		case 'V': printf("tokentap %s\n", TOKENTAP_VERSION); exit(0);
		case ':':
			fprintf(stderr, "tokentap: %s needs a value; see tokentap --help\n", flag);
			return -1;
		default:
			fprintf(stderr, "tokentap: unknown option %s; see tokentap --help\n", flag);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "tokentap: unexpected argument '%s'; see tokentap --help\n", argv[optind]);
		return -1;
	}
	if (cfg->check_data) {
		if (!cfg->data_dir) {
			fprintf(stderr, "tokentap: --check-data needs a --data-dir\n");
			return -1;
		}
		return 0;
	}
	if (!cfg->upstream) {
		fprintf(stderr, "tokentap: --upstream is required, e.g. --upstream http://127.0.0.1:8000\n");
		return -1;
	}
	return 0;
}

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

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct event_base *base = arg;
	log_info("received %s, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
	event_base_loopexit(base, NULL);
}

int main(int argc, char **argv)
{
	struct config cfg;
	struct event_base *base = NULL;
	struct upstream *up = NULL;
	struct accesslog *alog = NULL;
	struct proxy *px = NULL;
	struct store *store = NULL;
	struct stats_shard *stats = NULL;
	struct recent *recent = NULL;
	struct store_options so;
	struct slo slo;
	struct event *sigint = NULL, *sigterm = NULL;
	struct admin *admin = NULL;
	struct admin_options ao = { NULL, NULL };
	char *admin_token = NULL;
	char err[512];
	int rc = 1;

	config_defaults(&cfg);
	if (parse_args(argc, argv, &cfg) == -1)
		return EXIT_USAGE;
	if (cfg.check_data)
		return check_data(&cfg);
	if (admin_token_file && admin_token_load(admin_token_file, &admin_token, err, sizeof(err)) == -1) {
		fprintf(stderr, "tokentap: --admin-token-file: %s\n", err);
		return EXIT_USAGE;
	}
	signal(SIGPIPE, SIG_IGN);

	base = event_base_new();
	if (!base) {
		log_error("cannot create the event loop");
		goto out;
	}
	up = upstream_new(base, &cfg, cfg.upstream, err, sizeof(err));
	if (!up) {
		log_error("%s", err);
		rc = EXIT_USAGE;
		goto out;
	}
	if (cfg.access_log) {
		alog = accesslog_open(cfg.access_log, err, sizeof(err));
		if (!alog) {
			log_error("%s", err);
			goto out;
		}
	}
	store_options_defaults(&so);
	so.dir = cfg.data_dir;
	so.minute_retention_s = cfg.minute_retention_s;
	so.hour_retention_s = cfg.hour_retention_s;
	store = store_open(&so, err, sizeof(err));
	if (!store) {
		log_error("%s", err);
		goto out;
	}
	slo.ttft_us = cfg.slo_ttft_ms * 1000;
	slo.tpot_us = cfg.slo_tpot_ms * 1000;
	stats = stats_shard_new(base, store, cfg.max_models, &slo, cfg.flush_ms);
	if (!stats) {
		log_error("cannot set up stats recording");
		goto out;
	}
	recent = recent_new(RECENT_REQUESTS);
	px = proxy_new(base, &cfg, up, alog, stats, recent, err, sizeof(err));
	if (!px) {
		log_error("%s", err);
		goto out;
	}
	sigint = evsignal_new(base, SIGINT, on_signal, base);
	sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);

	log_info("tokentap %s listening on %s, upstream %s", TOKENTAP_VERSION, proxy_listen_addr(px), up->name);
	if (admin_listen) {
		const char *env = getenv("TOKENTAP_ADMIN_TOKEN");
		ao.listen = admin_listen;
		ao.token = admin_token ? admin_token : env && *env ? env : NULL;
		admin = admin_start(&ao, store, &cfg, err, sizeof(err));
		if (!admin && admin_listen_explicit) {
			log_error("%s", err);
			goto out;
		}
		if (!admin)
			log_warn("%s; the admin API is off (choose another with --admin ADDR:PORT)", err);
	}
	event_base_dispatch(base);
	rc = 0;
out:
	admin_stop(admin); /* before the store it reads */
	free(admin_token);
	if (sigint)
		event_free(sigint);
	if (sigterm)
		event_free(sigterm);
	proxy_free(px);
	stats_shard_free(stats); /* hands over what the last interval recorded */
	store_close(store);	 /* commits it */
	recent_free(recent);
	accesslog_close(alog);
	upstream_free(up);
	if (base)
		event_base_free(base);
	return rc;
}
