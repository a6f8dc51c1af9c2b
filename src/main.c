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
#include "config.h"
#include "log.h"
#include "proxy.h"
#include "upstream.h"
#include "version.h"

#define EXIT_USAGE 2

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
		"      --log-level LEVEL       error, warn, info or debug (default info)\n"
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
};

static int bad_value(const char *flag, const char *value, const char *expect)
{
	fprintf(stderr, "tokentap: invalid value '%s' for %s: expected %s\n", value, flag, expect);
	return -1;
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
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	opterr = 0; /* our own messages name the flag */
	while ((c = getopt_long(argc, argv, ":u:l:hV", opts, NULL)) != -1) {
		const char *flag = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
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
		case OPT_IDLE_TIMEOUT: {
			uint64_t *dst = c == OPT_HEADER_TIMEOUT	   ? &cfg->header_timeout_ms
					: c == OPT_CONNECT_TIMEOUT ? &cfg->connect_timeout_ms
					: c == OPT_FIRST_BYTE_TIMEOUT ? &cfg->first_byte_timeout_ms
								      : &cfg->idle_timeout_ms;
			if (config_parse_duration_ms(optarg, dst) == -1 || *dst == 0)
				return bad_value(flag, optarg, "a positive duration such as 300ms or 5s");
			break;
		}
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
	if (!cfg->upstream) {
		fprintf(stderr, "tokentap: --upstream is required, e.g. --upstream http://127.0.0.1:8000\n");
		return -1;
	}
	return 0;
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
	struct event *sigint = NULL, *sigterm = NULL;
	char err[512];
	int rc = 1;

	config_defaults(&cfg);
	if (parse_args(argc, argv, &cfg) == -1)
		return EXIT_USAGE;
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
	px = proxy_new(base, &cfg, up, alog, err, sizeof(err));
	if (!px) {
		log_error("%s", err);
		goto out;
	}
	sigint = evsignal_new(base, SIGINT, on_signal, base);
	sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);

	log_info("tokentap %s listening on %s, upstream %s", TOKENTAP_VERSION, proxy_listen_addr(px), up->name);
	event_base_dispatch(base);
	rc = 0;
out:
	if (sigint)
		event_free(sigint);
	if (sigterm)
		event_free(sigterm);
	proxy_free(px);
	accesslog_close(alog);
	upstream_free(up);
	if (base)
		event_base_free(base);
	return rc;
}
