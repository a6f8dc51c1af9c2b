/*
 * bench.c — tokentap-bench's command line, and the order of things: parse,
 * run one phase (or one closed-loop phase per sweep step), print the table,
 * write JSON / SVG, compare with tokentap's admin API.
 *
 * A bad command line exits 2 with one sentence naming the flag; a server
 * that cannot be reached exits 1; SIGINT/SIGTERM end the run, print what was
 * measured and exit 130. Everything the user can ask for is bounded (see
 * the BENCH_MAX_* limits in bench.h).
 */
#include "bench.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <ctype.h>
#include <jansson.h>

#include "config.h"
#include "version.h"

static const struct {
	const char *name, *path;
	enum bench_api api;
} apis[] = {
	{ "openai-chat", "/v1/chat/completions", BAPI_OPENAI_CHAT },
	{ "openai-completions", "/v1/completions", BAPI_OPENAI_COMPLETIONS },
	{ "anthropic", "/v1/messages", BAPI_ANTHROPIC },
	{ "ollama-chat", "/api/chat", BAPI_OLLAMA_CHAT },
	{ "ollama-generate", "/api/generate", BAPI_OLLAMA_GENERATE },
	{ "openai-responses", "/v1/responses", BAPI_OPENAI_RESPONSES },
	{ "gemini", NULL, BAPI_GEMINI }, /* the path names the model: gemini_path() */
	{ "gemini-array", NULL, BAPI_GEMINI_ARRAY },
	{ "bedrock-converse", "converse", BAPI_BEDROCK_CONVERSE },
	{ "bedrock-invoke", "invoke", BAPI_BEDROCK_INVOKE },
	{ "realtime", "/v1/realtime", BAPI_REALTIME },
};

/* Gemini's path: the model (--model, else sim-model) and the method; with
 * gemini, SSE (?alt=sse, as the SDKs ask), with gemini-array the JSON
 * array. */
static void gemini_path(char *buf, size_t n, const struct bench_opts *o)
{
	snprintf(buf, n, "%s/v1beta/models/%s:%s", o->base_path, o->model ? o->model : "sim-model",
		 !o->stream		       ? "generateContent"
		 : o->api == BAPI_GEMINI_ARRAY ? "streamGenerateContent"
					       : "streamGenerateContent?alt=sse");
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: " BENCH_NAME
		" [options]\n"
		"\n"
		"Load generator for LLM inference servers: closed loop (--concurrency) or open\n"
		"loop (--rate), streaming or not; measures ttft, itl, tpot, e2e and throughput\n"
		"with tokentap's own event framer and token classifier (docs/bench.md).\n"
		"\n"
		"Target:\n"
		"  --url http://HOST:PORT     server or tokentap (default http://127.0.0.1:8080);\n"
		"                             the path comes from --api; https://HOST:PORT speaks\n"
		"                             TLS (SNI and certificate check from HOST)\n"
		"  --ca FILE                  https: check the server's certificate against FILE\n"
		"                             (default: the system store)\n"
		"  --insecure                 https: do not check the server's certificate\n"
		"  --tls-ciphersuites LIST    https: the TLS 1.3 suites offered (OpenSSL's syntax,\n"
		"                             e.g. TLS_AES_128_GCM_SHA256; default OpenSSL's)\n"
		"  --api NAME                 openai-chat (default), openai-completions, anthropic,\n"
		"                             ollama-chat, ollama-generate, openai-responses,\n"
		"                             gemini (SSE), gemini-array (the JSON-array stream)\n"
		"                             bedrock-converse, bedrock-invoke (the model in the path),\n"
		"                             realtime (WebSocket sessions on /v1/realtime, closed loop)\n"
		"  --stream, --no-stream      stream the response (default: stream)\n"
		"  --model NAME               model field of the request (default: not sent)\n"
		"  -H, --header 'NAME: VALUE' extra request header (repeatable, at most %d)\n"
		"  --sim-headers              also send x-sim-tokens, so tokentap-sim obeys exactly\n"
		"  --ignore-eos               OpenAI chat and completions: ask the server to ignore\n"
		"                             EOS (vLLM)\n"
		"  --continuous-usage         OpenAI chat and completions streams: ask for usage on\n"
		"                             every chunk (vLLM continuous_usage_stats), so a proxy\n"
		"                             can count tokens per event\n"
		"  --timeout DUR              a request fails when no byte comes for DUR (default 60s)\n"
		"  --timestamps kernel|read   when response bytes arrived: the kernel's receive time\n"
		"                             (default) or the clock in the read callback (https:\n"
		"                             always read)\n"
		"  --new-connection           each request on a new connection, sent with\n"
		"                             Connection: close (default: keep-alive)\n"
		"\n"
		"Load:\n"
		"  --concurrency N            closed loop: N requests always in flight (default 1)\n"
		"  --rate R                   open loop: R requests/s\n"
		"  --arrivals poisson|gamma   open-loop arrival process (default poisson)\n"
		"  --burstiness B             gamma shape: 1 = poisson, < 1 burstier (default 1)\n"
		"  --max-inflight N           open loop: requests in flight at most (default 1024)\n"
		"  --duration DUR             stop sending after DUR of measured load\n"
		"  --requests N               stop after N measured requests (default 100 when\n"
		"                             --duration is not given)\n"
		"  --warmup N                 first N requests excluded, reported separately\n"
		"  --input-len DIST           prompt tokens (default fixed:128)\n"
		"  --output-len DIST          output tokens, sent as max_tokens (default fixed:128)\n"
		"                             DIST: fixed:N, uniform:A:B, normal:MEAN:SD, file:PATH\n"
		"  --seed N                   lengths, prompt text and arrivals (default 0)\n"
		"  --sweep C1,C2,...          one closed-loop step per concurrency level\n"
		"  --replay FILE              open loop from a trace (tokentap's workload capture or\n"
		"                             Mooncake JSONL): its arrivals, lengths and shared\n"
		"                             prefixes (docs/workload.md)\n"
		"  --speed X                  with --replay: arrivals X times as fast (default 1)\n"
		"  --limit N                  with --replay: the first N requests only\n"
		"  --block-tokens N           with --replay: tokens per hash id (default 512)\n"
		"  --sessions N               multi-turn chat: N conversations, each turn resending\n"
		"                             the history; --input-len is a user turn, --output-len\n"
		"                             an answer (docs/bench.md, \"Sessions\")\n"
		"  --turns N                  with --sessions: turns per session (default 4)\n"
		"  --system-prompts K         with --sessions: system prompts shared by the\n"
		"                             sessions, each opening with one drawn (default 4)\n"
		"  --system-len DIST          with --sessions: system prompt tokens (default fixed:1024)\n"
		"  --session-header NAME      with --sessions: the header naming the session\n"
		"                             (default x-session-id)\n"
		"  --compare URL_A URL_B      with --replay: the trace against both at once, each\n"
		"                             request sent to A and B at its arrival (which goes\n"
		"                             first alternates); prints the paired differences\n"
		"                             (Wilcoxon signed-rank, Hodges-Lehmann, sequential\n"
		"                             verdict: docs/workload.md); replaces --url\n"
		"\n"
		"Output:\n"
		"  --json PATH                results (or the sweep curve) as JSON\n"
		"  --requests-log PATH        one JSON line per request ('-' for stdout)\n"
		"  --svg PATH                 with --sweep: the curve as an SVG chart\n"
		"  --compare-admin URL        after the run, tokentap's /stats beside the client's\n"
		"  --progress, --no-progress  a progress line on stderr once a second\n"
		"                             (default: when stderr is a terminal)\n"
		"  --run-id ID                request ids are bench-ID-N (default: random)\n"
		"  -h, --help                 this text\n"
		"  -V, --version              print the version\n"
		"\n"
		"DUR takes ms, s, m or h (bare numbers are seconds).\n",
		BENCH_MAX_HEADERS);
}

static void bad(const char *flag, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void bad(const char *flag, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, BENCH_NAME ": %s: ", flag);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see --help)\n");
	exit(2);
}

static uint64_t parse_uint(const char *flag, const char *s, uint64_t min, uint64_t max)
{
	char *e;
	errno = 0;
	unsigned long long v = strtoull(s, &e, 10);
	if (!*s || *e || errno || s[0] == '-' || s[0] == '+' || v < min || v > max)
		bad(flag, "expected a whole number from %llu to %llu, got '%s'", (unsigned long long)min,
		    (unsigned long long)max, s);
	return v;
}

static double parse_pos(const char *flag, const char *s, double max)
{
	char *e;
	errno = 0;
	double v = strtod(s, &e);
	if (!*s || *e || errno || !isfinite(v) || v <= 0 || v > max)
		bad(flag, "expected a number above 0 and at most %g, got '%s'", max, s);
	return v;
}

static void parse_url(struct bench_opts *o, const char *url)
{
	const char *p = url, *end, *colon;
	char *e;

	o->url = url;
	o->tls = !strncmp(p, "https://", 8);
	if (!o->tls && strncmp(p, "http://", 7))
		bad("--url", "expected http://HOST:PORT or https://HOST:PORT, got '%s'", url);
	p += o->tls ? 8 : 7;
	end = p + strcspn(p, "/?#");
	if (*p == '[') {
		const char *rb = memchr(p, ']', (size_t)(end - p));
		if (!rb || rb - p - 1 <= 0 || (size_t)(rb - p - 1) >= sizeof(o->host))
			bad("--url", "bad IPv6 host in '%s'", url);
		memcpy(o->host, p + 1, (size_t)(rb - p - 1));
		o->host[rb - p - 1] = '\0';
		colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
		if (rb + 1 < end && !colon)
			bad("--url", "bad host in '%s'", url);
	} else {
		colon = memchr(p, ':', (size_t)(end - p));
		size_t hl = (size_t)((colon ? colon : end) - p);
		if (hl == 0 || hl >= sizeof(o->host))
			bad("--url", "no host in '%s'", url);
		memcpy(o->host, p, hl);
		o->host[hl] = '\0';
	}
	o->port = o->tls ? 443 : 80;
	if (colon) {
		errno = 0;
		unsigned long v = strtoul(colon + 1, &e, 10);
		if (e != end || colon + 1 == end || errno || v == 0 || v > 65535)
			bad("--url", "bad port in '%s'", url);
		o->port = (unsigned)v;
	}
	if (*end == '?' || *end == '#')
		bad("--url", "give the base URL without a query: '%s'", url);
	size_t pl = strlen(end);
	while (pl && end[pl - 1] == '/')
		pl--;
	if (pl >= sizeof(o->base_path))
		bad("--url", "path too long");
	memcpy(o->base_path, end, pl);
	o->base_path[pl] = '\0';
	for (const char *c = o->base_path; *c; c++)
		if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f)
			bad("--url", "the path may not contain spaces or control characters");
}

static void parse_header(struct bench_opts *o, const char *h)
{
	const char *colon = strchr(h, ':');
	static const char *const reserved[] = { "host", "content-length", "transfer-encoding", "x-request-id",
						"connection" };

	if (o->nheaders == BENCH_MAX_HEADERS)
		bad("--header", "at most %d headers", BENCH_MAX_HEADERS);
	if (!colon || colon == h)
		bad("--header", "expected 'NAME: VALUE', got '%s'", h);
	for (const char *c = h; *c; c++)
		if (*c == '\r' || *c == '\n')
			bad("--header", "a header may not contain a line break");
	for (const char *c = h; c < colon; c++)
		if (*c <= 0x20 || *c >= 0x7f)
			bad("--header", "bad header name in '%s'", h);
	for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
		if ((size_t)(colon - h) == strlen(reserved[i]) && !strncasecmp(h, reserved[i], strlen(reserved[i])))
			bad("--header", "%s is set by " BENCH_NAME " itself", reserved[i]);
	o->headers[o->nheaders++] = h;
}

static void parse_sweep(struct bench_opts *o, const char *s)
{
	const char *p = s;
	char num[32];

	o->nsweep = 0;
	while (*p) {
		size_t n = strcspn(p, ",");
		if (n == 0 || n >= sizeof(num))
			bad("--sweep", "expected concurrency levels like 1,2,4,8, got '%s'", s);
		if (o->nsweep == BENCH_MAX_SWEEP)
			bad("--sweep", "at most %d steps", BENCH_MAX_SWEEP);
		memcpy(num, p, n);
		num[n] = '\0';
		unsigned v = (unsigned)parse_uint("--sweep", num, 1, BENCH_MAX_CONCURRENCY);
		if (o->nsweep && v <= o->sweep[o->nsweep - 1])
			bad("--sweep", "levels must increase, got '%s'", s);
		o->sweep[o->nsweep++] = v;
		p += n;
		if (*p == ',') {
			p++;
			if (!*p)
				bad("--sweep", "trailing comma in '%s'", s);
		}
	}
	if (o->nsweep == 0)
		bad("--sweep", "no levels given");
}

static void check_fd_limit(const char *flag, unsigned need)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == -1)
		return;
	rlim_t want = (rlim_t)need + 32;
	if (rl.rlim_cur >= want)
		return;
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want) {
		rl.rlim_cur = want;
		if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
			return;
	}
	bad(flag, "%u connections need %llu file descriptors; ulimit -n allows %llu", need, (unsigned long long)want,
	    (unsigned long long)rl.rlim_cur);
}

enum {
	OPT_URL = 1000,
	OPT_API,
	OPT_STREAM,
	OPT_NO_STREAM,
	OPT_MODEL,
	OPT_CONCURRENCY,
	OPT_RATE,
	OPT_ARRIVALS,
	OPT_BURSTINESS,
	OPT_MAX_INFLIGHT,
	OPT_DURATION,
	OPT_REQUESTS,
	OPT_WARMUP,
	OPT_TIMEOUT,
	OPT_INPUT_LEN,
	OPT_OUTPUT_LEN,
	OPT_SIM_HEADERS,
	OPT_IGNORE_EOS,
	OPT_CONTINUOUS_USAGE,
	OPT_JSON,
	OPT_REQUESTS_LOG,
	OPT_SVG,
	OPT_COMPARE_ADMIN,
	OPT_PROGRESS,
	OPT_NO_PROGRESS,
	OPT_SWEEP,
	OPT_SEED,
	OPT_RUN_ID,
	OPT_TIMESTAMPS,
	OPT_NEW_CONNECTION,
	OPT_REPLAY,
	OPT_SPEED,
	OPT_LIMIT,
	OPT_BLOCK_TOKENS,
	OPT_PAIRED,
	OPT_CA,
	OPT_INSECURE,
	OPT_TLS_CIPHERSUITES,
	OPT_SESSIONS,
	OPT_TURNS,
	OPT_SYSTEM_PROMPTS,
	OPT_SYSTEM_LEN,
	OPT_SESSION_HEADER,
};

static void parse_args(int argc, char **argv, struct bench_opts *o)
{
	static const struct option longopts[] = {
		{ "url", required_argument, NULL, OPT_URL },
		{ "compare", required_argument, NULL, OPT_PAIRED },
		{ "api", required_argument, NULL, OPT_API },
		{ "stream", no_argument, NULL, OPT_STREAM },
		{ "no-stream", no_argument, NULL, OPT_NO_STREAM },
		{ "model", required_argument, NULL, OPT_MODEL },
		{ "header", required_argument, NULL, 'H' },
		{ "concurrency", required_argument, NULL, OPT_CONCURRENCY },
		{ "rate", required_argument, NULL, OPT_RATE },
		{ "arrivals", required_argument, NULL, OPT_ARRIVALS },
		{ "burstiness", required_argument, NULL, OPT_BURSTINESS },
		{ "max-inflight", required_argument, NULL, OPT_MAX_INFLIGHT },
		{ "duration", required_argument, NULL, OPT_DURATION },
		{ "requests", required_argument, NULL, OPT_REQUESTS },
		{ "warmup", required_argument, NULL, OPT_WARMUP },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "input-len", required_argument, NULL, OPT_INPUT_LEN },
		{ "output-len", required_argument, NULL, OPT_OUTPUT_LEN },
		{ "sim-headers", no_argument, NULL, OPT_SIM_HEADERS },
		{ "ignore-eos", no_argument, NULL, OPT_IGNORE_EOS },
		{ "continuous-usage", no_argument, NULL, OPT_CONTINUOUS_USAGE },
		{ "json", required_argument, NULL, OPT_JSON },
		{ "requests-log", required_argument, NULL, OPT_REQUESTS_LOG },
		{ "svg", required_argument, NULL, OPT_SVG },
		{ "compare-admin", required_argument, NULL, OPT_COMPARE_ADMIN },
		{ "progress", no_argument, NULL, OPT_PROGRESS },
		{ "no-progress", no_argument, NULL, OPT_NO_PROGRESS },
		{ "sweep", required_argument, NULL, OPT_SWEEP },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "run-id", required_argument, NULL, OPT_RUN_ID },
		{ "timestamps", required_argument, NULL, OPT_TIMESTAMPS },
		{ "new-connection", no_argument, NULL, OPT_NEW_CONNECTION },
		{ "replay", required_argument, NULL, OPT_REPLAY },
		{ "speed", required_argument, NULL, OPT_SPEED },
		{ "limit", required_argument, NULL, OPT_LIMIT },
		{ "block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS },
		{ "ca", required_argument, NULL, OPT_CA },
		{ "insecure", no_argument, NULL, OPT_INSECURE },
		{ "tls-ciphersuites", required_argument, NULL, OPT_TLS_CIPHERSUITES },
		{ "sessions", required_argument, NULL, OPT_SESSIONS },
		{ "turns", required_argument, NULL, OPT_TURNS },
		{ "system-prompts", required_argument, NULL, OPT_SYSTEM_PROMPTS },
		{ "system-len", required_argument, NULL, OPT_SYSTEM_LEN },
		{ "session-header", required_argument, NULL, OPT_SESSION_HEADER },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *input_len = "fixed:128", *output_len = "fixed:128", *url = "http://127.0.0.1:8080";
	bool url_given = false;
	const char *arrivals = NULL;
	bool burst_given = false, conc_given = false, lens_given = false, kernel_ts_given = false;
	const char *replay_path = NULL;
	const char *system_len = NULL;
	bool session_flag = false;
	double speed = 1.0;
	uint64_t limit = 0, block_tokens = 512;
	static struct replay replay;
	char err[512];
	int c;

	memset(o, 0, sizeof(*o));
	o->api = BAPI_OPENAI_CHAT;
	o->api_name = apis[0].name;
	o->stream = true;
	o->burstiness = 1.0;
	o->max_inflight = 1024;
	o->timeout_ms = 60000;
	o->progress = -1;
	o->concurrency = 1;
	o->kernel_ts = true;
	snprintf(o->run_id, sizeof(o->run_id), "%08llx",
		 (unsigned long long)((clock_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL)) &
				      0xffffffffull));

	opterr = 0;
	while ((c = getopt_long(argc, argv, ":hVH:", longopts, NULL)) != -1) {
		switch (c) {
		case 'h': usage(stdout); exit(0);
		case 'V': printf(BENCH_NAME " %s\n", TOKENTAP_VERSION); exit(0);
		case 'H': parse_header(o, optarg); break;
		case OPT_URL:
			url = optarg;
			url_given = true;
			break;
		case OPT_PAIRED:
			/* two values: URL_A here, URL_B the next argument */
			if (optind >= argc || argv[optind][0] == '-')
				bad("--compare", "expected two URLs: --compare URL_A URL_B");
			o->compare_url[0] = optarg;
			o->compare_url[1] = argv[optind++];
			break;
		case OPT_API: {
			size_t i;
			for (i = 0; i < sizeof(apis) / sizeof(apis[0]); i++)
				if (!strcmp(optarg, apis[i].name))
					break;
			if (i == sizeof(apis) / sizeof(apis[0]))
				bad("--api",
				    "unknown API '%s': one of openai-chat, openai-completions, anthropic, "
				    "ollama-chat, ollama-generate, openai-responses, gemini, gemini-array",
				    optarg);
			o->api = apis[i].api;
			o->api_name = apis[i].name;
			break;
		}
		case OPT_STREAM: o->stream = true; break;
		case OPT_NO_STREAM: o->stream = false; break;
		case OPT_MODEL:
			if (!*optarg || strlen(optarg) > 256)
				bad("--model", "expected a name of 1 to 256 bytes");
			o->model = optarg;
			break;
		case OPT_CONCURRENCY:
			o->concurrency = (unsigned)parse_uint("--concurrency", optarg, 1, BENCH_MAX_CONCURRENCY);
			conc_given = true;
			break;
		case OPT_RATE: o->rate = parse_pos("--rate", optarg, BENCH_MAX_RATE); break;
		case OPT_ARRIVALS:
			if (strcmp(optarg, "poisson") && strcmp(optarg, "gamma"))
				bad("--arrivals", "expected poisson or gamma, got '%s'", optarg);
			arrivals = optarg;
			o->arrivals = strcmp(optarg, "gamma") ? ARRIVALS_POISSON : ARRIVALS_GAMMA;
			break;
		case OPT_BURSTINESS:
			o->burstiness = parse_pos("--burstiness", optarg, 1000);
			if (o->burstiness < 0.01)
				bad("--burstiness", "expected at least 0.01, got '%s'", optarg);
			burst_given = true;
			break;
		case OPT_MAX_INFLIGHT:
			o->max_inflight = (unsigned)parse_uint("--max-inflight", optarg, 1, BENCH_MAX_CONCURRENCY);
			break;
		case OPT_DURATION:
			if (config_parse_duration_ms(optarg, &o->duration_ms) == -1 || o->duration_ms == 0 ||
			    o->duration_ms > 7ull * 24 * 3600 * 1000)
				bad("--duration",
				    "expected a duration such as 30s, 500ms or 5m (at most 7 days), got '%s'", optarg);
			break;
		case OPT_REQUESTS: o->requests = parse_uint("--requests", optarg, 1, 100000000); break;
		case OPT_WARMUP: o->warmup = parse_uint("--warmup", optarg, 0, 1000000); break;
		case OPT_TIMEOUT:
			if (config_parse_duration_ms(optarg, &o->timeout_ms) == -1 || o->timeout_ms == 0 ||
			    o->timeout_ms > 24ull * 3600 * 1000)
				bad("--timeout", "expected a duration such as 60s (at most 24h), got '%s'", optarg);
			break;
		case OPT_INPUT_LEN: input_len = optarg, lens_given = true; break;
		case OPT_OUTPUT_LEN: output_len = optarg, lens_given = true; break;
		case OPT_SIM_HEADERS: o->sim_headers = true; break;
		case OPT_IGNORE_EOS: o->ignore_eos = true; break;
		case OPT_CONTINUOUS_USAGE: o->continuous_usage = true; break;
		case OPT_JSON: o->json_path = optarg; break;
		case OPT_REQUESTS_LOG: o->requests_log_path = optarg; break;
		case OPT_SVG: o->svg_path = optarg; break;
		case OPT_COMPARE_ADMIN: o->compare_admin = optarg; break;
		case OPT_PROGRESS: o->progress = 1; break;
		case OPT_NO_PROGRESS: o->progress = 0; break;
		case OPT_SWEEP: parse_sweep(o, optarg); break;
		case OPT_SEED: o->seed = parse_uint("--seed", optarg, 0, UINT64_MAX); break;
		case OPT_TIMESTAMPS:
			if (strcmp(optarg, "kernel") && strcmp(optarg, "read"))
				bad("--timestamps", "expected kernel or read, got '%s'", optarg);
			o->kernel_ts = !strcmp(optarg, "kernel");
			kernel_ts_given = o->kernel_ts;
			break;
		case OPT_NEW_CONNECTION: o->new_conn = true; break;
		case OPT_CA: o->tls_ca = optarg; break;
		case OPT_INSECURE: o->tls_insecure = true; break;
		case OPT_TLS_CIPHERSUITES: o->tls_ciphersuites = optarg; break;
		case OPT_REPLAY: replay_path = optarg; break;
		case OPT_SESSIONS: o->sessions = parse_uint("--sessions", optarg, 1, 1000000); break;
		case OPT_TURNS:
			o->turns = (unsigned)parse_uint("--turns", optarg, 1, BENCH_MAX_TURNS);
			session_flag = true;
			break;
		case OPT_SYSTEM_PROMPTS:
			o->system_prompts = (unsigned)parse_uint("--system-prompts", optarg, 1, 100000);
			session_flag = true;
			break;
		case OPT_SYSTEM_LEN: system_len = optarg, session_flag = true; break;
		case OPT_SESSION_HEADER: {
			size_t n = strlen(optarg);
			/* an HTTP token, and not one of the tool's own headers */
			if (n == 0 || n > 64 ||
			    strspn(optarg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != n ||
			    !strcasecmp(optarg, "host") || !strcasecmp(optarg, "content-length") ||
			    !strcasecmp(optarg, "content-type") || !strcasecmp(optarg, "x-request-id") ||
			    !strcasecmp(optarg, "connection") || !strcasecmp(optarg, "transfer-encoding"))
				bad("--session-header",
				    "expected a header name of 1 to 64 letters, digits, '-' or '_' that is not "
				    "one of the tool's own, got '%s'",
				    optarg);
			o->session_header = optarg;
			session_flag = true;
			break;
		}
		case OPT_SPEED: speed = parse_pos("--speed", optarg, 1e6); break;
		case OPT_LIMIT: limit = parse_uint("--limit", optarg, 1, UINT64_MAX); break;
		case OPT_BLOCK_TOKENS: block_tokens = parse_uint("--block-tokens", optarg, 1, 65536); break;
		case OPT_RUN_ID: {
			size_t n = strlen(optarg);
			if (n == 0 || n >= sizeof(o->run_id) ||
			    strspn(optarg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") != n)
				bad("--run-id", "expected 1 to %zu letters, digits, '_' or '.', got '%s'",
				    sizeof(o->run_id) - 1, optarg);
			memcpy(o->run_id, optarg, n + 1);
			break;
		}
		case ':': bad(argv[optind - 1], "needs a value");
		default:
			if (optopt && optopt != '?')
				bad("command line", "unknown flag '-%c'", optopt);
			bad("command line", "unknown flag '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		bad("command line", "unexpected argument '%s'", argv[optind]);

	if (o->compare_url[0]) {
		if (url_given)
			bad("--compare", "names both targets: drop --url");
		if (!replay_path)
			bad("--compare", "replays one trace against both: give --replay FILE");
		if (o->nsweep || o->compare_admin || o->svg_path)
			bad("--compare", "does not combine with --sweep, --compare-admin or --svg");
		if (!strncmp(o->compare_url[0], "https://", 8) != !strncmp(o->compare_url[1], "https://", 8))
			bad("--compare", "both URLs http:// or both https://");
		url = o->compare_url[0];
		static struct bench_opts b;
		parse_url(&b, o->compare_url[1]);
		o->compare_b = &b;
	}
	parse_url(o, url);
	if (!o->tls && (o->tls_ca || o->tls_insecure || o->tls_ciphersuites))
		bad(o->tls_ca	      ? "--ca"
		    : o->tls_insecure ? "--insecure"
				      : "--tls-ciphersuites",
		    "applies to an https:// --url only");
	if (o->tls_ca && o->tls_insecure)
		bad("--insecure", "--ca names the CA to check the certificate against; --insecure checks none");
	if (o->tls && kernel_ts_given)
		bad("--timestamps",
		    "kernel receive times name TCP segments, not the TLS records in them: use read "
		    "with https");
	if (o->tls)
		o->kernel_ts = false;
	for (size_t i = 0; i < sizeof(apis) / sizeof(apis[0]); i++)
		if (apis[i].api == o->api) {
			static char path[sizeof(o->base_path) + 3 * 256 + 64];
			if (o->api == BAPI_BEDROCK_CONVERSE || o->api == BAPI_BEDROCK_INVOKE) {
				/* /model/MODEL/OP: the model percent-encoded as the AWS SDKs do */
				const char *m = o->model ? o->model : "sim-model";
				size_t n = (size_t)snprintf(path, sizeof(path), "%s/model/", o->base_path);
				if (strlen(m) > 256)
					bad("--model", "a Bedrock model id is at most 256 bytes");
				for (const unsigned char *mc = (const unsigned char *)m; *mc; mc++)
					n += (size_t)snprintf(path + n, sizeof(path) - n,
							      isalnum(*mc) || strchr("-._~", *mc) ? "%c" : "%%%02X",
							      *mc);
				snprintf(path + n, sizeof(path) - n, "/%s%s", apis[i].path,
					 !o->stream			 ? ""
					 : o->api == BAPI_BEDROCK_INVOKE ? "-with-response-stream"
									 : "-stream");
			} else if (apis[i].path) {
				snprintf(path, sizeof(path), "%s%s", o->base_path, apis[i].path);
			} else {
				gemini_path(path, sizeof(path), o);
			}
			o->path = path;
		}
	if (dist_parse(&o->input_len, input_len, 1, err, sizeof(err)) == -1)
		bad("--input-len", "%s", err);
	if (dist_parse(&o->output_len, output_len, 1, err, sizeof(err)) == -1)
		bad("--output-len", "%s", err);
	if (o->rate > 0 && conc_given)
		bad("--rate", "--concurrency (closed loop) and --rate (open loop) exclude each other");
	if (o->rate > 0 && o->nsweep)
		bad("--sweep", "a sweep steps closed-loop concurrency; it does not combine with --rate");
	if (o->nsweep && conc_given)
		bad("--sweep", "--sweep sets the concurrency of each step; drop --concurrency");
	if (!o->rate && (arrivals || burst_given))
		bad(arrivals ? "--arrivals" : "--burstiness", "arrivals apply to the open loop: give --rate too");
	if (burst_given && o->arrivals != ARRIVALS_GAMMA && o->burstiness != 1.0)
		bad("--burstiness", "needs --arrivals gamma (poisson has burstiness 1)");
	if (o->svg_path && !o->nsweep)
		bad("--svg", "the chart is drawn from a --sweep");
	if (o->compare_admin && o->nsweep)
		bad("--compare-admin", "compares one run; it does not combine with --sweep");
	if (o->compare_admin && strncmp(o->compare_admin, "http://", 7))
		bad("--compare-admin", "expected http://HOST:PORT of tokentap's admin API, got '%s'", o->compare_admin);
	if (replay_path) {
		if (o->rate > 0 || conc_given || o->nsweep || lens_given || o->duration_ms || o->requests || o->warmup)
			bad("--replay",
			    "the trace sets arrivals, lengths and the request count: it does not combine "
			    "with --rate, --concurrency, --sweep, --input-len, --output-len, --duration, "
			    "--requests or --warmup (--limit N replays the first N)");
		if (replay_load(&replay, replay_path, speed, limit, err, sizeof(err)) == -1)
			bad("--replay", "%s", err);
		replay.block_tokens = (unsigned)block_tokens;
		o->replay = &replay;
		o->requests = replay.n;
		/* the open loop at the trace's mean rate: what reports and messages say */
		double span_s = (double)replay.e[replay.n - 1].t_ns / 1e9;
		o->rate = span_s > 0 ? (double)(replay.n - 1) / span_s : (double)replay.n;
		if (o->rate > BENCH_MAX_RATE)
			o->rate = BENCH_MAX_RATE;
	} else if (speed != 1.0 || limit || block_tokens != 512) {
		bad(speed != 1.0 ? "--speed" : limit ? "--limit" : "--block-tokens", "applies to --replay only");
	}
	if (o->sessions && (o->api == BAPI_GEMINI || o->api == BAPI_GEMINI_ARRAY))
		bad("--sessions", "builds chat messages: not for --api gemini");
	if (o->sessions) {
		if (o->api == BAPI_BEDROCK_CONVERSE || o->api == BAPI_BEDROCK_INVOKE)
			bad("--sessions", "the Bedrock APIs are driven with single-turn prompts only");
		if (replay_path)
			bad("--sessions", "a trace brings its own prompts: it does not combine with --replay");
		if (!o->turns)
			o->turns = 4;
		if (!o->system_prompts)
			o->system_prompts = 4;
		if (!o->session_header)
			o->session_header = "x-session-id";
		if (dist_parse(&o->system_len, system_len ? system_len : "fixed:1024", 1, err, sizeof(err)) == -1)
			bad("--system-len", "%s", err);
		/* one round over every session's every turn */
		if (!o->duration_ms && !o->requests)
			o->requests = o->sessions * o->turns;
	} else if (session_flag) {
		bad(system_len		? "--system-len"
		    : o->turns		? "--turns"
		    : o->system_prompts ? "--system-prompts"
					: "--session-header",
		    "applies to --sessions only");
	}
	if (o->api == BAPI_REALTIME) {
		const char *flag = o->tls		  ? "--url"
				   : o->rate > 0	  ? "--rate"
				   : replay_path	  ? "--replay"
				   : o->sessions	  ? "--sessions"
				   : o->compare_url[0]	  ? "--compare"
				   : o->requests_log_path ? "--requests-log"
				   : o->compare_admin	  ? "--compare-admin"
							  : NULL;
		if (flag != NULL)
			bad(flag,
			    "--api realtime drives plain ws:// sessions in a closed loop (--concurrency, "
			    "--sweep): no https, --rate, --replay, --sessions, --compare, --requests-log "
			    "or --compare-admin");
	}
	if (!o->duration_ms && !o->requests)
		o->requests = 100;
	if (o->rate > 0)
		o->concurrency = 0;
	if (o->nsweep)
		check_fd_limit("--sweep", o->sweep[o->nsweep - 1]);
	else if (o->rate > 0)
		check_fd_limit("--max-inflight", o->max_inflight);
	else
		check_fd_limit("--concurrency", o->concurrency);
}

static void print_step_line(const struct bench_result *s)
{
	fprintf(stderr, BENCH_NAME ": concurrency %u: %llu ok, %llu failed, %.3f requests/s, ttft p50 %.3f ms\n",
		s->concurrency, (unsigned long long)s->m.ok, (unsigned long long)s->m.failed,
		s->elapsed_s > 0 ? (double)s->m.ok / s->elapsed_s : 0.0, report_quantile_ms(&s->m.h[BM_TTFT], 0.5));
}

int main(int argc, char **argv)
{
	struct bench_opts o;
	struct bench_result *res = NULL;
	FILE *reqlog = NULL;
	int rc = 1;
	unsigned nres = 0;

	parse_args(argc, argv, &o);
	signal(SIGPIPE, SIG_IGN);
	if (o.tls) {
		char err[512];
		if (bench_tls_setup(&o, err, sizeof(err)) == -1) {
			fprintf(stderr, BENCH_NAME ": --url %s: %s\n", o.url, err);
			goto out;
		}
	}
	if (o.requests_log_path) {
		reqlog = strcmp(o.requests_log_path, "-") ? fopen(o.requests_log_path, "w") : stdout;
		if (!reqlog) {
			fprintf(stderr, BENCH_NAME ": --requests-log: cannot open %s: %s\n", o.requests_log_path,
				strerror(errno));
			goto out;
		}
	}
	/* Table on stdout; if the per-request log shares it, the table goes to stderr. */
	FILE *tab = reqlog == stdout ? stderr : stdout;

	res = calloc(o.nsweep ? o.nsweep : 1, sizeof(*res));
	if (!res) {
		fprintf(stderr, BENCH_NAME ": out of memory\n");
		goto out;
	}
	if (o.compare_url[0]) {
		rc = bench_compare(tab, &o) == -1 ? 1 : 0;
		goto out;
	}
	if (o.nsweep) {
		uint64_t id_base = 0;
		for (unsigned i = 0; i < o.nsweep; i++) {
			if (bench_run(&o, o.sweep[i], id_base, reqlog, &res[i]) == -1)
				goto out;
			nres = i + 1;
			id_base += res[i].m.started + res[i].w.started;
			print_step_line(&res[i]);
			if (res[i].interrupted || res[i].fatal)
				break;
		}
		sweep_table(tab, &o, res, nres);
		rc = sweep_write(&o, res, nres) == -1 ? 1 : 0;
	} else {
		if (bench_run(&o, o.concurrency, 0, reqlog, &res[0]) == -1)
			goto out;
		nres = 1;
		report_table(tab, &o, &res[0]);
		json_t *root = NULL;
		if (o.json_path) {
			root = json_object();
			json_object_set_new(root, "config", report_config_json(&o));
			json_object_set_new(root, "result", report_result_json(&o, &res[0]));
		}
		rc = 0;
		if (o.compare_admin && !res[0].fatal && admin_compare(tab, &o, &res[0], root) == -1)
			rc = 1;
		if (root && report_write_json(o.json_path, root) == -1)
			rc = 1;
	}
	if (nres && res[nres - 1].fatal) {
		fprintf(stderr, BENCH_NAME ": %s\n", res[nres - 1].fatal_msg);
		rc = 1;
	}
	if (nres && res[nres - 1].interrupted)
		rc = 130;
out:
	if (reqlog && reqlog != stdout && fclose(reqlog) != 0) {
		fprintf(stderr, BENCH_NAME ": --requests-log: cannot write %s\n", o.requests_log_path);
		rc = rc ? rc : 1;
	}
	fflush(stdout);
	free(res);
	bench_tls_free(&o);
	dist_free(&o.input_len);
	dist_free(&o.output_len);
	replay_free(o.replay);
	return rc;
}
