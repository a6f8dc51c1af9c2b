/*
 * cli.c — command-line flags and the config file they point to.
 *
 * Two passes over argv: the first finds -c/-t (and --help/--version), the
 * second applies every other flag on top of the defaults and the file.
 */
#include "cli.h"

#include <getopt.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "log.h"
#include "version.h"

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: tokentap --upstream URL [options]\n"
		"       tokentap -c FILE [options]\n"
		"       tokentap -t -c FILE\n"
		"\n"
		"A reverse proxy for LLM inference servers that forwards every response\n"
		"unchanged and measures TTFT, inter-token latency and throughput inline.\n"
		"\n"
		"Options:\n"
		"  -u, --upstream URL          inference server, e.g. http://127.0.0.1:8000\n"
		"  -c, --config FILE           YAML configuration: upstreams, routes, splits (docs/config.md)\n"
		"  -t, --test-config           check the -c file, print every problem, and exit\n"
		"  -l, --listen ADDR:PORT      where clients connect (default 127.0.0.1:8080)\n"
		"      --tls-cert FILE, --tls-key FILE  the listener speaks TLS (PEM files)\n"
		"      --access-log PATH|-     one JSON line per request; '-' for stdout\n"
		"      --workers N|auto        event loops, one thread each (default auto: one per core)\n"
		"      --max-body-size SIZE    largest request body (default 32m)\n"
		"      --max-header-size SIZE  largest request head (default 32k)\n"
		"      --header-timeout DUR    whole request head must arrive within (default 30s)\n"
		"      --body-timeout DUR      whole request body must arrive within, from the head (default 60s)\n"
		"      --connect-timeout DUR   upstream connect (default 5s)\n"
		"      --first-byte-timeout DUR  request sent to response headers (default 300s)\n"
		"      --idle-timeout DUR      silence on a running exchange (default 300s)\n"
		"      --data-dir DIR|off      where percentile state persists (default ./tokentap-data)\n"
		"      --flush-interval DUR    how often stats reach the store (default 1s)\n"
		"      --slo-ttft DUR          goodput: time to first token at most (default 2s)\n"
		"      --slo-tpot DUR          goodput: time per output token at most (default 100ms)\n"
		"      --slo-itl DUR           goodput: longest gap between tokens at most (default: not checked)\n"
		"      --log-level LEVEL       error, warn, info or debug (default info)\n"
		"      --check-data            read every record in --data-dir, report, and exit\n"
		"      --admin ADDR:PORT|off   admin API: stats, /metrics, reset (default 127.0.0.1:9901)\n"
		"      --admin-token-file PATH bearer token for admin writes (or env TOKENTAP_ADMIN_TOKEN)\n"
		"  -h, --help                  this text\n"
		"  -V, --version               print the version\n"
		"\n"
		"SIZE takes k, m or g (1024-based); DUR takes ms, s, m or h (bare numbers are seconds).\n"
		"A streamed response is never cut by a total-duration limit. SIGHUP reloads -c FILE;\n"
		"SIGTERM stops accepting and lets running streams finish.\n");
}

enum {
	OPT_ACCESS_LOG = 256,
	OPT_MAX_BODY,
	OPT_MAX_HEADER,
	OPT_HEADER_TIMEOUT,
	OPT_BODY_TIMEOUT,
	OPT_CONNECT_TIMEOUT,
	OPT_FIRST_BYTE_TIMEOUT,
	OPT_IDLE_TIMEOUT,
	OPT_LOG_LEVEL,
	OPT_DATA_DIR,
	OPT_FLUSH_INTERVAL,
	OPT_SLO_TTFT,
	OPT_SLO_TPOT,
	OPT_SLO_ITL,
	OPT_CHECK_DATA,
	OPT_ADMIN,
	OPT_ADMIN_TOKEN_FILE,
	OPT_TLS_CERT,
	OPT_TLS_KEY,
	OPT_WORKERS,
};

static const struct option opts[] = {
	{ "upstream", required_argument, NULL, 'u' },
	{ "config", required_argument, NULL, 'c' },
	{ "test-config", no_argument, NULL, 't' },
	{ "listen", required_argument, NULL, 'l' },
	{ "access-log", required_argument, NULL, OPT_ACCESS_LOG },
	{ "max-body-size", required_argument, NULL, OPT_MAX_BODY },
	{ "max-header-size", required_argument, NULL, OPT_MAX_HEADER },
	{ "header-timeout", required_argument, NULL, OPT_HEADER_TIMEOUT },
	{ "body-timeout", required_argument, NULL, OPT_BODY_TIMEOUT },
	{ "connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT },
	{ "first-byte-timeout", required_argument, NULL, OPT_FIRST_BYTE_TIMEOUT },
	{ "idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT },
	{ "log-level", required_argument, NULL, OPT_LOG_LEVEL },
	{ "data-dir", required_argument, NULL, OPT_DATA_DIR },
	{ "flush-interval", required_argument, NULL, OPT_FLUSH_INTERVAL },
	{ "slo-ttft", required_argument, NULL, OPT_SLO_TTFT },
	{ "slo-tpot", required_argument, NULL, OPT_SLO_TPOT },
	{ "slo-itl", required_argument, NULL, OPT_SLO_ITL },
	{ "check-data", no_argument, NULL, OPT_CHECK_DATA },
	{ "admin", required_argument, NULL, OPT_ADMIN },
	{ "admin-token-file", required_argument, NULL, OPT_ADMIN_TOKEN_FILE },
	{ "tls-cert", required_argument, NULL, OPT_TLS_CERT },
	{ "tls-key", required_argument, NULL, OPT_TLS_KEY },
	{ "workers", required_argument, NULL, OPT_WORKERS },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

#define SHORT_OPTS ":u:c:tl:hV"

/* Where messages go: stderr at start-up, a buffer on reload. */
struct out {
	char *buf;
	size_t len, n;
};

static void say(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(struct out *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (!o->buf) {
		fputs("tokentap: ", stderr);
		vfprintf(stderr, fmt, ap);
		fputc('\n', stderr);
	} else if (o->n < o->len) {
		o->n += (size_t)vsnprintf(o->buf + o->n, o->len - o->n, fmt, ap);
		if (o->n < o->len)
			o->buf[o->n++] = '\n';
	}
	va_end(ap);
}

static int bad_value(struct out *o, const char *flag, const char *value, const char *expect)
{
	say(o, "invalid value '%s' for %s: expected %s", value, flag, expect);
	return -1;
}

/* The flag as the user typed its long form, for error messages. */
static void option_name(int val, int argc, char **argv, char *out, size_t len)
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

/* --upstream's URL has the form upstream_new() will need, checked here so
 * that a typo is reported, naming the flag, before anything is opened or
 * created. Resolving the host is left to upstream_new(). */
static int check_upstream(struct out *o, const char *url)
{
	struct url_parts parts;
	char why[400];

	if (config_parse_url(url, &parts, why, sizeof(why)) == -1) {
		say(o, "invalid value for --upstream: %s", why);
		return -1;
	}
	return 0;
}

/* Pass 2: every flag but -c/-t onto cfg. Values are checked here, as each
 * flag is read: nothing has been opened yet. */
static int apply_flags(int argc, char **argv, struct config *cfg, struct out *o)
{
	struct sockaddr_storage ss;
	unsigned sslen;
	char flag[64];
	int c;

	optind = 0; /* glibc: start over */
	opterr = 0; /* our own messages name the flag */
	while ((c = getopt_long(argc, argv, SHORT_OPTS, opts, NULL)) != -1) {
		option_name(c == ':' || c == '?' ? optopt : c, argc, argv, flag, sizeof(flag));
		switch (c) {
		case 'c':
		case 't':
		case 'h':
		case 'V': break;
		case 'u':
			if (check_upstream(o, optarg) == -1)
				return -1;
			cfg->upstream = optarg;
			break;
		case 'l':
			if (config_parse_listen(optarg, &ss, &sslen) == -1)
				return bad_value(o, "--listen", optarg,
						 "a numeric ADDR:PORT such as 127.0.0.1:8080 or [::1]:8080");
			cfg->listen = optarg;
			cfg->nlisteners = 0; /* the flag replaces the file's list */
			break;
		case OPT_ACCESS_LOG: cfg->access_log = optarg; break;
		case OPT_MAX_BODY:
			if (config_parse_size(optarg, &cfg->max_body_size) == -1)
				return bad_value(o, "--max-body-size", optarg, "a size such as 32m");
			break;
		case OPT_MAX_HEADER:
			if (config_parse_size(optarg, &cfg->max_header_size) == -1 || cfg->max_header_size < 256 ||
			    cfg->max_header_size > (1u << 30))
				return bad_value(o, "--max-header-size", optarg, "a size from 256 to 1g, such as 32k");
			break;
		case OPT_HEADER_TIMEOUT:
		case OPT_BODY_TIMEOUT:
		case OPT_CONNECT_TIMEOUT:
		case OPT_FIRST_BYTE_TIMEOUT:
		case OPT_IDLE_TIMEOUT:
		case OPT_FLUSH_INTERVAL:
		case OPT_SLO_TTFT:
		case OPT_SLO_TPOT:
		case OPT_SLO_ITL: {
			uint64_t *dst = c == OPT_HEADER_TIMEOUT	      ? &cfg->header_timeout_ms
					: c == OPT_BODY_TIMEOUT	      ? &cfg->body_timeout_ms
					: c == OPT_CONNECT_TIMEOUT    ? &cfg->connect_timeout_ms
					: c == OPT_FIRST_BYTE_TIMEOUT ? &cfg->first_byte_timeout_ms
					: c == OPT_IDLE_TIMEOUT	      ? &cfg->idle_timeout_ms
					: c == OPT_FLUSH_INTERVAL     ? &cfg->flush_ms
					: c == OPT_SLO_TTFT	      ? &cfg->slo_ttft_ms
					: c == OPT_SLO_TPOT	      ? &cfg->slo_tpot_ms
								      : &cfg->slo_itl_ms;
			if (config_parse_duration_ms(optarg, dst) == -1 || *dst == 0)
				return bad_value(o, flag, optarg, "a positive duration such as 300ms or 5s");
			break;
		}
		case OPT_CHECK_DATA: cfg->check_data = true; break;
		case OPT_ADMIN:
			cfg->admin_listen = strcmp(optarg, "off") == 0 ? NULL : optarg;
			cfg->admin_listen_explicit = true;
			break;
		case OPT_ADMIN_TOKEN_FILE: cfg->admin_token_file = optarg; break;
		case OPT_TLS_CERT: cfg->tls_cert = optarg; break;
		case OPT_TLS_KEY: cfg->tls_key = optarg; break;
		case OPT_WORKERS:
			if (config_parse_workers(optarg, &cfg->workers) == -1)
				return bad_value(o, "--workers", optarg, "auto or a number of threads from 1 to 64");
			break;
		case OPT_DATA_DIR: cfg->data_dir = strcmp(optarg, "off") == 0 ? NULL : optarg; break;
		case OPT_LOG_LEVEL: {
			enum log_level level;
			if (log_level_parse(optarg, &level) == -1)
				return bad_value(o, "--log-level", optarg, "error, warn, info or debug");
			cfg->log_level = (int)level;
			break;
		}
		case ':': say(o, "%s needs a value; see tokentap --help", flag); return -1;
		default: say(o, "unknown option %s; see tokentap --help", flag); return -1;
		}
	}
	if (optind < argc) {
		say(o, "unexpected argument '%s'; see tokentap --help", argv[optind]);
		return -1;
	}
	return 0;
}

/* Pass 1: the file, -t, --help, --version. Returns the file or NULL. */
static const char *find_file(int argc, char **argv, bool *test, bool *help, bool *version)
{
	const char *file = NULL;
	int c;

	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, SHORT_OPTS, opts, NULL)) != -1) {
		if (c == 'c')
			file = optarg;
		else if (c == 't')
			*test = true;
		else if (c == 'h')
			*help = true;
		else if (c == 'V')
			*version = true;
	}
	return file;
}

static int build(int argc, char **argv, struct config *cfg, const char *file, struct out *o, bool *file_bad)
{
	char errs[8192] = "";

	config_defaults(cfg);
	*file_bad = false;
	if (file && config_load_file(file, cfg, errs, sizeof(errs))) {
		*file_bad = true;
		if (o->buf)
			say(o, "%s", errs);
		else
			fputs(errs, stderr);
		return -1;
	}
	if (apply_flags(argc, argv, cfg, o) == -1)
		return -1;
	if (cfg->check_data) {
		if (!cfg->data_dir) {
			say(o, "--check-data needs a --data-dir");
			return -1;
		}
		return 0;
	}
	if (cfg->upstream && file) {
		say(o, "--upstream and -c both name upstreams; put the upstream in the file");
		return -1;
	}
	if (!file) {
		char err[256];
		if (!cfg->upstream) {
			say(o, "--upstream is required, e.g. --upstream http://127.0.0.1:8000 (or -c FILE)");
			return -1;
		}
		if (config_single_upstream(cfg, err, sizeof(err)) == -1) {
			say(o, "%s", err);
			return -1;
		}
		errs[0] = '\0';
		if (config_validate(cfg, errs, sizeof(errs))) {
			say(o, "%.*s", (int)strcspn(errs, "\n"), errs);
			return -1;
		}
	}
	return 0;
}

enum cli_result cli_config(int argc, char **argv, struct config *cfg)
{
	bool test = false, help = false, version = false, file_bad;
	const char *file = find_file(argc, argv, &test, &help, &version);
	struct out o = { NULL, 0, 0 };

	if (help) {
		usage(stdout);
		return CLI_EXIT_OK;
	}
	if (version) {
		printf("tokentap %s\n", TOKENTAP_VERSION);
		return CLI_EXIT_OK;
	}
	if (test && !file) {
		say(&o, "-t checks a configuration file: give it with -c FILE");
		return CLI_EXIT_USAGE;
	}
	if (build(argc, argv, cfg, file, &o, &file_bad) == -1)
		return file_bad ? CLI_EXIT_CONFIG : CLI_EXIT_USAGE;
	if (test) {
		printf("%s: configuration ok (%u upstream(s), %u route(s))\n", file, cfg->nupstreams, cfg->nroutes);
		return CLI_EXIT_OK;
	}
	return CLI_RUN;
}

int cli_reload(int argc, char **argv, struct config *cfg, char *errs, size_t errlen)
{
	bool test = false, help = false, version = false, file_bad;
	const char *file = find_file(argc, argv, &test, &help, &version);
	struct out o = { errs, errlen, 0 };

	errs[0] = '\0';
	return build(argc, argv, cfg, file, &o, &file_bad);
}
