/*
 * sim.c — tokentap-sim's main: reads the command line, binds the listener,
 * hands each accepted socket to sim_conn, and leaves cleanly on SIGINT or
 * SIGTERM.
 *
 * Contract with the tests: once the socket listens, exactly one line goes
 * to stderr, "tokentap-sim listening on ADDR:PORT" with the real port (so
 * --listen 127.0.0.1:0 works), and nothing else is printed while serving.
 * A bad command line exits 2 with a sentence naming the flag.
 */
#include "sim.h"
#include "version.h"

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

struct sim_config sim_cfg = {
	.ttft_ms = 50,
	.itl_ms = 20,
	.events_per_write = 1,
	.tokens = 64,
	.seed = 0,
	.model = "sim-model",
	.reasoning_tokens = 0,
	.think_ms = 0,
	.cached_tokens = -1,
	.cache_write_tokens = 0,
	.tool_calls = false,
	.prefix_cache = false,
	.cache_tokens = 65536,
	.batching = false,
	.max_batch = 32,
	.kv_tokens = 65536,
	.prefill_tps = 8000.0,
	.chunked_prefill = 0,
	.step_base_ms = 8.0,
	.step_per_seq_ms = 0.25,
	.cold_start_ms = 0,
	.idle_ms = 30000,
	.backlog_tokens = 4096,
	.spec_tokens = 1,
};

struct sim_stats sim_stats;

void *sim_tls_ctx;

/* The listener's TLS context from --tls-cert/--tls-key, or NULL with the
 * reason printed. */
static SSL_CTX *tls_ctx_new(void)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	char why[256] = "unknown error";

	if (ctx == NULL)
		goto fail;
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
	if (SSL_CTX_use_certificate_chain_file(ctx, sim_cfg.tls_cert) != 1 ||
	    SSL_CTX_use_PrivateKey_file(ctx, sim_cfg.tls_key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_check_private_key(ctx) != 1)
		goto fail;
	if (sim_cfg.tls_ciphersuites != NULL && SSL_CTX_set_ciphersuites(ctx, sim_cfg.tls_ciphersuites) != 1)
		goto fail;
	return ctx;
fail:
	ERR_error_string_n(ERR_get_error(), why, sizeof(why));
	fprintf(stderr, "tokentap-sim: TLS (--tls-cert %s, --tls-key %s%s%s): %s\n", sim_cfg.tls_cert, sim_cfg.tls_key,
		sim_cfg.tls_ciphersuites ? ", --tls-ciphersuites " : "",
		sim_cfg.tls_ciphersuites ? sim_cfg.tls_ciphersuites : "", why);
	SSL_CTX_free(ctx);
	return NULL;
}

uint64_t sim_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tokentap-sim [options]\n"
		"A simulated LLM inference server for tokentap's demo and tests.\n"
		"\n"
		"  --listen ADDR:PORT  where to listen (default 127.0.0.1:8000; port 0 picks one)\n"
		"  --ttft-ms N         request received -> first token (default 50)\n"
		"  --itl-ms N          gap between tokens; 0 = as fast as the client reads (default 20)\n"
		"  --events-per-write N  token events gathered into one write: held until N are\n"
		"                      due (or the stream ends), then written together; with\n"
		"                      --itl-ms 0, one group per loop turn (default 1)\n"
		"  --tokens N          output tokens when the request sets no max_tokens (default 64)\n"
		"  --seed N            seed of ids, timestamps and token text (default 0)\n"
		"  --model NAME        model name when the request names none (default sim-model)\n"
		"\n"
		"Reasoning, prompt cache, tool calls (see docs/simulator.md):\n"
		"  --reasoning-tokens N reasoning tokens before every answer (default 0; a request\n"
		"                      asking for reasoning gets 32 when this is 0)\n"
		"  --think-ms N        extra pause before the first answer token (default 0)\n"
		"  --reasoning-hidden  reasoning tokens take their time and count in usage but are\n"
		"                      not sent (as OpenAI's hosted models)\n"
		"  --cached-tokens N   prompt tokens reported as read from the prefix cache\n"
		"                      (default: no cache details in usage)\n"
		"  --cache-write-tokens N  Anthropic: prompt tokens reported as written to the cache\n"
		"  --prefix-cache      a prefix cache that remembers prompts in 16-token blocks and\n"
		"                      reports the shared prefix as cached (see docs/simulator.md)\n"
		"  --prefix-cache-tokens N  the prefix cache's size in tokens; the least recently\n"
		"                      used blocks are evicted beyond it (default 65536)\n"
		"  --tool-calls        answer every chat/Responses/Messages request with a tool call\n"
		"  --spec-tokens N     chat/completions streams: each event carries 1 to N tokens\n"
		"                      (speculative decoding), drawn from the seed (default 1)\n"
		"\n"
		"Continuous-batching model (off by default; see docs/simulator.md):\n"
		"  --batching          same as --model-mode batch\n"
		"  --model-mode MODE   fixed (--ttft-ms/--itl-ms per request, default) or batch\n"
		"  --max-batch N       sequences in the running batch (default 32)\n"
		"  --kv-tokens N       KV-cache budget in tokens, prompt + output (default 65536)\n"
		"  --prefill-tps X     prompt tokens prefilled per second (default 8000)\n"
		"  --chunked-prefill N prefill tokens per step; 0 = whole prompts (default 0)\n"
		"  --step-base-ms X    fixed cost of a decode step (default 8)\n"
		"  --step-per-seq-ms X added per sequence in the step (default 0.25)\n"
		"  --cold-start-ms N   delay of the first request after idle (default 0, off)\n"
		"  --idle-ms N         no traffic this long makes the server cold (default 30000)\n"
		"  --backlog-tokens N  unsent tokens of a stalled reader before it is dropped;\n"
		"                      0 = never (default 4096)\n"
		"  --server-timing E   batched responses report their real queue, prefill and\n"
		"                      decode as engine E would: vllm (\"metrics\") or llamacpp\n"
		"                      (\"timings\"); Ollama's routes as Ollama (default off)\n"
		"  --metrics-style S   GET /metrics in the names of S: vllm (default), sglang,\n"
		"                      llamacpp, or all three\n"
		"  --tls-cert FILE     speak TLS (1.2 at least) with this certificate chain (PEM)\n"
		"  --tls-key FILE      and this private key (PEM); default plain HTTP\n"
		"  --tls-ciphersuites L  TLS 1.3 suites offered, e.g. TLS_AES_128_GCM_SHA256\n"
		"  --help              this text\n"
		"  --version           print the version\n"
		"\n"
		"Endpoints: POST /v1/chat/completions /v1/completions /v1/messages /api/chat\n"
		"/api/generate /v1/responses; GET /v1/models /health /metrics /sim/stats.\n"
		"Per-request headers x-sim-ttft-ms, x-sim-itl-ms, x-sim-tokens, x-sim-reasoning-tokens,\n"
		"x-sim-events-per-write, x-sim-think-ms, x-sim-cached-tokens, x-sim-cache-write-tokens,\n"
		"x-sim-tool-call and x-sim-reasoning-hidden (0 or 1) override the flags.\n"
		"See docs/simulator.md.\n");
}

/* Exits 2: the one way a command line mistake ends the program. */
static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "tokentap-sim: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " Run tokentap-sim --help for usage.\n");
	exit(2);
}

/* A non-negative decimal number such as 0.25; no exponent, no sign. */
static double parse_num(const char *flag, const char *v)
{
	char *end;
	double d;

	errno = 0;
	if (v[0] < '0' || v[0] > '9' || strpbrk(v, "eExXnN") != NULL)
		die_usage("%s needs a non-negative number, got '%s'.", flag, v);
	d = strtod(v, &end);
	if (errno != 0 || *end != '\0' || !(d >= 0.0) || d > 86400000.0)
		die_usage("%s needs a non-negative number up to 86400000, got '%s'.", flag, v);
	return d;
}

static uint64_t parse_u64(const char *flag, const char *v)
{
	char *end;
	unsigned long long n;

	errno = 0;
	if (v[0] < '0' || v[0] > '9')
		die_usage("%s needs a non-negative integer, got '%s'.", flag, v);
	n = strtoull(v, &end, 10);
	if (errno != 0 || *end != '\0')
		die_usage("%s needs a non-negative integer, got '%s'.", flag, v);
	return (uint64_t)n;
}

/*
 * Accepts "ADDR:PORT", "[V6ADDR]:PORT", "localhost:PORT" and a bare
 * "PORT" (loopback); port 0 lets the kernel pick. Names other than
 * localhost are not resolved: the simulator is a test fixture, not a
 * service to expose. (evutil_parse_sockaddr_port would refuse port 0.)
 */
static void parse_listen(const char *v, struct sockaddr_storage *ss, int *sslen)
{
	const char *arg = v;
	const char *colon = strrchr(v, ':');
	char host[INET6_ADDRSTRLEN + 2];
	size_t hlen;
	unsigned long port;
	char *end;

	memset(ss, 0, sizeof(*ss));
	if (colon == NULL) {
		colon = v - 1; /* bare port */
		snprintf(host, sizeof(host), "127.0.0.1");
	} else {
		hlen = (size_t)(colon - v);
		if (hlen >= 2 && v[0] == '[' && v[hlen - 1] == ']') {
			v++;
			hlen -= 2;
		}
		if (hlen == 0 || hlen >= sizeof(host))
			goto bad;
		memcpy(host, v, hlen);
		host[hlen] = '\0';
		if (strcmp(host, "localhost") == 0)
			snprintf(host, sizeof(host), "127.0.0.1");
	}
	errno = 0;
	if (colon[1] < '0' || colon[1] > '9')
		goto bad;
	port = strtoul(colon + 1, &end, 10);
	if (errno != 0 || *end != '\0' || port > 65535)
		goto bad;

	if (strchr(host, ':') != NULL) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		if (evutil_inet_pton(AF_INET6, host, &s6->sin6_addr) != 1)
			goto bad;
		*sslen = (int)sizeof(*s6);
	} else {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		if (evutil_inet_pton(AF_INET, host, &s4->sin_addr) != 1)
			goto bad;
		*sslen = (int)sizeof(*s4);
	}
	return;
bad:
	die_usage("--listen needs ADDR:PORT with a numeric address (e.g. 127.0.0.1:8000), got '%s'.", arg);
}

static bool known_flag(const char *flag)
{
	static const char *const flags[] = {
		"--listen",
		"--spec-tokens",
		"--ttft-ms",
		"--itl-ms",
		"--events-per-write",
		"--tokens",
		"--seed",
		"--model",
		"--model-mode",
		"--max-batch",
		"--kv-tokens",
		"--prefill-tps",
		"--chunked-prefill",
		"--step-base-ms",
		"--step-per-seq-ms",
		"--cold-start-ms",
		"--idle-ms",
		"--backlog-tokens",
		"--reasoning-tokens",
		"--think-ms",
		"--cached-tokens",
		"--cache-write-tokens",
		"--prefix-cache-tokens",
		"--server-timing",
		"--metrics-style",
		"--tls-cert",
		"--tls-key",
		"--tls-ciphersuites",
	};

	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
		if (strcmp(flag, flags[i]) == 0)
			return true;
	}
	return false;
}

static void parse_args(int argc, char **argv, struct sockaddr_storage *ss, int *sslen)
{
	bool have_listen = false;

	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		const char *val = NULL;
		const char *eq = strchr(arg, '=');
		char flag[64];

		if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
			usage(stdout);
			exit(0);
		}
		if (strcmp(arg, "--version") == 0) {
			printf("tokentap-sim %s\n", TOKENTAP_VERSION);
			exit(0);
		}
		if (strncmp(arg, "--", 2) != 0)
			die_usage("unexpected argument '%s'; options start with --.", arg);
		snprintf(flag, sizeof(flag), "%.*s", (int)(eq ? (size_t)(eq - arg) : strlen(arg)), arg);
		if (strcmp(flag, "--batching") == 0) {
			if (eq != NULL)
				die_usage("--batching takes no value.");
			sim_cfg.batching = true;
			continue;
		}
		if (strcmp(flag, "--tool-calls") == 0 || strcmp(flag, "--prefix-cache") == 0 ||
		    strcmp(flag, "--reasoning-hidden") == 0) {
			if (eq != NULL)
				die_usage("%s takes no value.", flag);
			if (flag[2] == 't')
				sim_cfg.tool_calls = true;
			else if (flag[2] == 'p')
				sim_cfg.prefix_cache = true;
			else
				sim_cfg.reasoning_hidden = true;
			continue;
		}
		if (!known_flag(flag))
			die_usage("unknown option '%s'.", flag);
		if (eq != NULL)
			val = eq + 1;
		else if (i + 1 < argc)
			val = argv[++i];
		else
			die_usage("%s needs a value.", flag);

		if (strcmp(flag, "--listen") == 0) {
			parse_listen(val, ss, sslen);
			have_listen = true;
		} else if (strcmp(flag, "--ttft-ms") == 0) {
			sim_cfg.ttft_ms = parse_u64(flag, val);
		} else if (strcmp(flag, "--itl-ms") == 0) {
			sim_cfg.itl_ms = parse_u64(flag, val);
		} else if (strcmp(flag, "--events-per-write") == 0) {
			sim_cfg.events_per_write = parse_u64(flag, val);
		} else if (strcmp(flag, "--tokens") == 0) {
			sim_cfg.tokens = parse_u64(flag, val);
		} else if (strcmp(flag, "--spec-tokens") == 0) {
			sim_cfg.spec_tokens = parse_u64(flag, val);
			if (sim_cfg.spec_tokens < 1 || sim_cfg.spec_tokens > SIM_MAX_SPEC_TOKENS)
				die_usage("--spec-tokens is 1 to %d, got '%s'.", SIM_MAX_SPEC_TOKENS, val);
		} else if (strcmp(flag, "--seed") == 0) {
			sim_cfg.seed = parse_u64(flag, val);
		} else if (strcmp(flag, "--model-mode") == 0) {
			if (strcmp(val, "batch") == 0)
				sim_cfg.batching = true;
			else if (strcmp(val, "fixed") == 0)
				sim_cfg.batching = false;
			else
				die_usage("--model-mode is 'fixed' or 'batch', got '%s'.", val);
		} else if (strcmp(flag, "--tls-cert") == 0) {
			sim_cfg.tls_cert = val;
		} else if (strcmp(flag, "--tls-key") == 0) {
			sim_cfg.tls_key = val;
		} else if (strcmp(flag, "--tls-ciphersuites") == 0) {
			sim_cfg.tls_ciphersuites = val;
		} else if (strcmp(flag, "--server-timing") == 0) {
			if (strcmp(val, "vllm") == 0)
				sim_cfg.server_timing = SIM_TIMING_VLLM;
			else if (strcmp(val, "llamacpp") == 0)
				sim_cfg.server_timing = SIM_TIMING_LLAMACPP;
			else if (strcmp(val, "off") == 0)
				sim_cfg.server_timing = SIM_TIMING_OFF;
			else
				die_usage("--server-timing is 'vllm', 'llamacpp' or 'off', got '%s'.", val);
		} else if (strcmp(flag, "--metrics-style") == 0) {
			if (strcmp(val, "vllm") == 0)
				sim_cfg.metrics_style = SIM_METRICS_VLLM;
			else if (strcmp(val, "sglang") == 0)
				sim_cfg.metrics_style = SIM_METRICS_SGLANG;
			else if (strcmp(val, "llamacpp") == 0)
				sim_cfg.metrics_style = SIM_METRICS_LLAMACPP;
			else if (strcmp(val, "all") == 0)
				sim_cfg.metrics_style = SIM_METRICS_ALL;
			else
				die_usage("--metrics-style is 'vllm', 'sglang', 'llamacpp' or 'all', got '%s'.", val);
		} else if (strcmp(flag, "--max-batch") == 0) {
			sim_cfg.max_batch = parse_u64(flag, val);
		} else if (strcmp(flag, "--kv-tokens") == 0) {
			sim_cfg.kv_tokens = parse_u64(flag, val);
		} else if (strcmp(flag, "--prefill-tps") == 0) {
			sim_cfg.prefill_tps = parse_num(flag, val);
		} else if (strcmp(flag, "--chunked-prefill") == 0) {
			sim_cfg.chunked_prefill = parse_u64(flag, val);
		} else if (strcmp(flag, "--step-base-ms") == 0) {
			sim_cfg.step_base_ms = parse_num(flag, val);
		} else if (strcmp(flag, "--step-per-seq-ms") == 0) {
			sim_cfg.step_per_seq_ms = parse_num(flag, val);
		} else if (strcmp(flag, "--cold-start-ms") == 0) {
			sim_cfg.cold_start_ms = parse_u64(flag, val);
		} else if (strcmp(flag, "--idle-ms") == 0) {
			sim_cfg.idle_ms = parse_u64(flag, val);
		} else if (strcmp(flag, "--backlog-tokens") == 0) {
			sim_cfg.backlog_tokens = parse_u64(flag, val);
		} else if (strcmp(flag, "--reasoning-tokens") == 0) {
			sim_cfg.reasoning_tokens = parse_u64(flag, val);
		} else if (strcmp(flag, "--think-ms") == 0) {
			sim_cfg.think_ms = parse_u64(flag, val);
		} else if (strcmp(flag, "--cached-tokens") == 0) {
			sim_cfg.cached_tokens = (int64_t)parse_u64(flag, val);
		} else if (strcmp(flag, "--cache-write-tokens") == 0) {
			sim_cfg.cache_write_tokens = parse_u64(flag, val);
		} else if (strcmp(flag, "--prefix-cache-tokens") == 0) {
			sim_cfg.cache_tokens = parse_u64(flag, val);
		} else {
			if (val[0] == '\0')
				die_usage("--model needs a non-empty name.");
			sim_cfg.model = val;
		}
	}
	if (!have_listen)
		parse_listen("127.0.0.1:8000", ss, sslen);
	if ((sim_cfg.tls_cert == NULL) != (sim_cfg.tls_key == NULL))
		die_usage("--tls-cert and --tls-key go together.");
	if (sim_cfg.tls_ciphersuites != NULL && sim_cfg.tls_cert == NULL)
		die_usage("--tls-ciphersuites needs --tls-cert and --tls-key.");
	/* Keep the nanosecond arithmetic of pacing far from overflow. */
	if (sim_cfg.ttft_ms > 86400000ULL || sim_cfg.itl_ms > 86400000ULL || sim_cfg.think_ms > 86400000ULL)
		die_usage("--ttft-ms, --itl-ms and --think-ms must be at most one day (86400000).");
	if (sim_cfg.reasoning_tokens > (1ULL << 40) || sim_cfg.cached_tokens > (1LL << 40) ||
	    sim_cfg.cache_write_tokens > (1ULL << 40))
		die_usage("--reasoning-tokens, --cached-tokens and --cache-write-tokens must be at most 2^40.");
	if (sim_cfg.events_per_write < 1 || sim_cfg.events_per_write > SIM_MAX_EVENTS_PER_WRITE)
		die_usage("--events-per-write must be from 1 to %d.", SIM_MAX_EVENTS_PER_WRITE);
	if (sim_cfg.max_batch < 1 || sim_cfg.max_batch > 1000000)
		die_usage("--max-batch must be from 1 to 1000000.");
	if (sim_cfg.kv_tokens < 1 || sim_cfg.kv_tokens > (1ULL << 40))
		die_usage("--kv-tokens must be from 1 to 2^40.");
	if (sim_cfg.prefill_tps < 1.0)
		die_usage("--prefill-tps must be at least 1.");
	/* 2^26 tokens: 4M blocks, about 100 MB of table */
	if (sim_cfg.cache_tokens < 16 || sim_cfg.cache_tokens > (1ULL << 26))
		die_usage("--prefix-cache-tokens must be from 16 (one block) to 2^26 (67108864).");
	if (sim_cfg.cold_start_ms > 86400000ULL || sim_cfg.idle_ms > 86400000ULL)
		die_usage("--cold-start-ms and --idle-ms must be at most one day (86400000).");
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	sim_conn_accept(evconnlistener_get_base(l), fd);
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
	/* EMFILE and the like: keep listening, the next accept may work. */
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	event_base_loopexit(arg, NULL);
}

int main(int argc, char **argv)
{
	struct sockaddr_storage ss, bound;
	socklen_t blen = sizeof(bound);
	int sslen;
	struct event_config *cfg = NULL;
	struct event_base *base = NULL;
	struct evconnlistener *listener = NULL;
	struct event *sigint = NULL, *sigterm = NULL;
	char host[INET6_ADDRSTRLEN];
	const void *addr;
	int port, rc = 1;

	parse_args(argc, argv, &ss, &sslen);
	signal(SIGPIPE, SIG_IGN);
	if (sim_cfg.tls_cert != NULL && (sim_tls_ctx = tls_ctx_new()) == NULL)
		goto out;

	/* Precise timers: without this flag libevent uses the coarse
	 * monotonic clock (4 ms ticks) and token gaps would jitter by that. */
	cfg = event_config_new();
	if (cfg == NULL)
		goto out;
	event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
	event_config_set_flag(cfg, EVENT_BASE_FLAG_NO_CACHE_TIME);
	base = event_base_new_with_config(cfg);
	if (base == NULL) {
		fprintf(stderr, "tokentap-sim: cannot create the event loop\n");
		goto out;
	}
	listener = evconnlistener_new_bind(base, on_accept, NULL,
					   LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 1024,
					   (struct sockaddr *)&ss, sslen);
	if (listener == NULL) {
		fprintf(stderr, "tokentap-sim: cannot listen: %s\n", strerror(errno));
		goto out;
	}
	evconnlistener_set_error_cb(listener, on_accept_error);
	if (getsockname(evconnlistener_get_fd(listener), (struct sockaddr *)&bound, &blen) == -1) {
		fprintf(stderr, "tokentap-sim: getsockname: %s\n", strerror(errno));
		goto out;
	}
	if (sim_batch_init(base) == -1) {
		fprintf(stderr, "tokentap-sim: cannot create the batch scheduler\n");
		goto out;
	}
	if (sim_cfg.prefix_cache && sim_cache_init(sim_cfg.cache_tokens) == -1) {
		fprintf(stderr, "tokentap-sim: out of memory for --prefix-cache-tokens %llu\n",
			(unsigned long long)sim_cfg.cache_tokens);
		goto out;
	}
	sigint = evsignal_new(base, SIGINT, on_signal, base);
	sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	if (sigint == NULL || sigterm == NULL || evsignal_add(sigint, NULL) == -1 ||
	    evsignal_add(sigterm, NULL) == -1) {
		fprintf(stderr, "tokentap-sim: cannot install signal handlers\n");
		goto out;
	}

	if (bound.ss_family == AF_INET6) {
		addr = &((struct sockaddr_in6 *)&bound)->sin6_addr;
		port = ntohs(((struct sockaddr_in6 *)&bound)->sin6_port);
	} else {
		addr = &((struct sockaddr_in *)&bound)->sin_addr;
		port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
	}
	evutil_inet_ntop(bound.ss_family, addr, host, sizeof(host));
	fprintf(stderr,
		bound.ss_family == AF_INET6 ? "tokentap-sim listening on [%s]:%d\n"
					    : "tokentap-sim listening on %s:%d\n",
		host, port);
	fflush(stderr);

	event_base_dispatch(base);
	rc = 0;
out:
	/* Open connections are not drained: the process is ending and the
	 * kernel closes their sockets. */
	if (sigint != NULL)
		event_free(sigint);
	if (sigterm != NULL)
		event_free(sigterm);
	if (listener != NULL)
		evconnlistener_free(listener);
	sim_batch_shutdown();
	sim_cache_shutdown();
	if (base != NULL)
		event_base_free(base);
	if (cfg != NULL)
		event_config_free(cfg);
	free(sim_stats.last_request_id);
	SSL_CTX_free(sim_tls_ctx);
	return rc;
}
