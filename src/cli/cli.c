/*
 * cli.c — command-line flags and the config file they point to.
 *
 * Two passes over argv: the first finds -c/-t (and --help/--version), the
 * second applies every other flag on top of the defaults and the file. The
 * flags, their parsing and their --help lines come from the settings table
 * (settings.h); only the four actions are declared here.
 */
#include "cli.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "loader.h"
#include "log.h"
#include "settings.h"
#include "version.h"

/* What a flag does that is not a setting: (long flag, short, takes a value,
 * metavar, help). */
#define CLI_ACTIONS(X) \
	X("config", 'c', required_argument, "FILE", "YAML configuration (docs/config.md); flags override it") \
	X("test-config", 't', no_argument, NULL, "check the -c file, print every problem, and exit") \
	X("help", 'h', no_argument, NULL, "this text") \
	X("version", 'V', no_argument, NULL, "print the version")

/* A setting's getopt value: its short flag, or past every character. */
#define SETTING_VAL(s) ((s)->short_flag ? (s)->short_flag : 256 + (int)(s)->id)

#define ACTION_COUNT 4
static struct option opts[ACTION_COUNT + S__COUNT + 1];
static char short_opts[2 + 2 * (ACTION_COUNT + S__COUNT) + 1];

/* opts[] and short_opts from CLI_ACTIONS and the settings table. */
static void opts_init(void)
{
	size_t n = 0, k = 0;

	if (opts[0].name)
		return;
	short_opts[k++] = ':'; /* a missing value returns ':' */
#define ACTION_OPT(name, sh, arg, metavar, help) \
	opts[n++] = (struct option){ name, arg, NULL, sh }; \
	short_opts[k++] = sh; \
	if (arg == required_argument) \
		short_opts[k++] = ':';
	CLI_ACTIONS(ACTION_OPT)
#undef ACTION_OPT
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		if (!s->flag)
			continue;
		opts[n++] = (struct option){ s->flag, s->type == ST_FLAG ? no_argument : required_argument, NULL,
					     SETTING_VAL(s) };
		if (s->short_flag) {
			short_opts[k++] = (char)s->short_flag;
			if (s->type != ST_FLAG)
				short_opts[k++] = ':';
		}
	}
	opts[n] = (struct option){ NULL, 0, NULL, 0 };
	short_opts[k] = '\0';
}

/* The setting a getopt value stands for, or NULL (an action or an error). */
static const struct setting *setting_of(int val)
{
	for (size_t i = 0; i < S__COUNT; i++)
		if (settings[i].flag && SETTING_VAL(&settings[i]) == val)
			return &settings[i];
	return NULL;
}

static void usage(FILE *out)
{
	char left[64];

	fprintf(out,
		"Usage: tokentap --upstream URL [options]\n"
		"       tokentap -c FILE [options]\n"
		"       tokentap -t -c FILE\n"
		"\n"
		"A reverse proxy for LLM inference servers that forwards every response\n"
		"unchanged and measures TTFT, inter-token latency and throughput inline.\n"
		"\n"
		"Options:\n");
	/* -c and -t first, the settings, then -h and -V */
	for (int tail = 0; tail < 2; tail++) {
#define ACTION_USAGE(name, sh, arg, metavar, help) \
	if ((sh == 'h' || sh == 'V') == tail) { \
		snprintf(left, sizeof(left), "  -%c, --%s%s%s", sh, name, metavar ? " " : "", metavar ? metavar : ""); \
		fprintf(out, "%-28s  %s\n", left, help); \
	}
		CLI_ACTIONS(ACTION_USAGE)
#undef ACTION_USAGE
		if (!tail)
			settings_usage(out);
	}
	fprintf(out,
		"\n"
		"SIZE takes k, m or g (1024-based); DUR takes ms, s, m or h (bare numbers are seconds).\n"
		"A streamed response is never cut by a total-duration limit. SIGHUP reloads -c FILE;\n"
		"SIGTERM stops accepting and lets running streams finish.\n");
}

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

/* Pass 2: every flag but -c/-t onto cfg. Values are checked here, as each
 * flag is read, by the table's parsers: nothing has been opened yet. */
static int apply_flags(int argc, char **argv, struct config *cfg, struct out *o)
{
	char flag[64], why[400];
	int c;

	opts_init();
	optind = 0; /* glibc: start over */
	opterr = 0; /* our own messages name the flag */
	while ((c = getopt_long(argc, argv, short_opts, opts, NULL)) != -1) {
		const struct setting *s = setting_of(c);

		option_name(c == ':' || c == '?' ? optopt : c, argc, argv, flag, sizeof(flag));
		if (s) {
			if (settings_apply_flag(s, optarg, cfg, why, sizeof(why)) == -1) {
				if (s->type == ST_URL) /* the parser says what is wrong with it */
					say(o, "invalid value for %s: %s", flag, why);
				else
					say(o, "invalid value '%s' for %s: %s", optarg, flag, why);
				return -1;
			}
			continue;
		}
		switch (c) {
		case 'c':
		case 't':
		case 'h':
		case 'V': break;
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

	opts_init();
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, short_opts, opts, NULL)) != -1) {
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

static int build(int argc, char **argv, struct config *cfg, const char *file, struct out *o, bool *file_bad,
		 bool create_salt)
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
	const char *cert = cfg->tls_cert, *key = cfg->tls_key;
	if (apply_flags(argc, argv, cfg, o) == -1)
		return -1;
	if (cfg->tls_cert != cert || cfg->tls_key != key) { /* a flag named them: checked as the file's are */
		char err[600];
		int bad;
		if (loader_check_tls_files(cfg->tls_cert, cfg->tls_key, &bad, err, sizeof(err)) == -1) {
			if (bad == 2)
				say(o, "--tls-cert and --tls-key: %s", err);
			else
				say(o, "invalid value '%s' for %s: %s", bad ? cfg->tls_key : cfg->tls_cert,
				    bad ? "--tls-key" : "--tls-cert", err);
			return -1;
		}
	}
	{
		char err[600];
		if (config_tenant_salt(cfg, create_salt && !cfg->check_data, err, sizeof(err)) == -1) {
			say(o, "%s", err);
			return -1;
		}
	}
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
	if (build(argc, argv, cfg, file, &o, &file_bad, !test) == -1)
		return file_bad ? CLI_EXIT_CONFIG : CLI_EXIT_USAGE;
	if (test) {
		/* the token the server would start with, checked as it would be */
		char err[512], *tok = NULL;
		int rc = !cfg->admin_listen	 ? 0
			 : cfg->admin_token_file ? admin_token_load(cfg->admin_token_file, &tok, err, sizeof(err))
						 : admin_token_env(&tok, err, sizeof(err));
		if (tok) {
			explicit_bzero(tok, strlen(tok));
			free(tok);
		}
		if (rc == -1) {
			say(&o, "%s", err);
			return CLI_EXIT_CONFIG;
		}
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
	return build(argc, argv, cfg, file, &o, &file_bad, true);
}
