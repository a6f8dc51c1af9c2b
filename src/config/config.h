/*
 * config.h — the settings tokentap runs with, and the parsers for the value
 * syntaxes users type (sizes like 32m, durations like 300ms).
 *
 * One struct holds every setting with its default. main.c fills it from
 * the command line, or loader.c from a YAML file (docs/config.md). The
 * struct owns every string it points to that it allocated (config_own);
 * config_free releases them. Setup errors are text the user can act on.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "settings.h"

#define LABELS_MAX 16
#define LISTENERS_MAX 16
#define WORKERS_MAX 64
/* Upstream and route names, in bytes: a series is stored under route,
 * upstream and model as one key, and every key must fit LMDB's (series_key.h). */
#define CONFIG_NAME_MAX 128
/* Upstreams one route may split over: the bits of the uint64_t in which a
 * pick marks the targets already tried. */
#define ROUTE_TARGETS_MAX 64
#define MIRROR_MAX_IN_FLIGHT 64			/* mirror.max_in_flight's default */
#define STORE_MAX_SIZE_MIN ((uint64_t)64 << 10) /* store.max_size: an empty store and a few series */
#define STORE_MAX_SIZE_MAX ((uint64_t)64 << 30) /* and its default */

/* One listening address, optionally TLS. */
struct listener_conf {
	const char *address;
	const char *tls_cert, *tls_key;
	int line;
};

struct label {
	const char *key, *value;
};

/* Whose names an upstream's /metrics uses (scrape.h); AUTO: told by the
 * names it finds. */
enum engine_kind { ENGINE_AUTO, ENGINE_VLLM, ENGINE_SGLANG, ENGINE_LLAMACPP };

/* metrics_interval's bounds and default, in ms */
#define METRICS_INTERVAL_MIN 100
#define METRICS_INTERVAL_MAX 300000
#define METRICS_INTERVAL_DEFAULT 5000

/* One upstream server as configured. */
struct upstream_conf {
	const char *name; /* unique; the `upstream` label of its stats */
	const char *url;
	unsigned max_concurrency;					     /* requests at once; 0 = no limit */
	unsigned queue_max;						     /* requests waiting for a slot */
	uint64_t queue_timeout_ms;					     /* waiting longer answers 503 */
	uint64_t connect_timeout_ms, first_byte_timeout_ms, idle_timeout_ms; /* 0: the global ones */
	struct label labels[LABELS_MAX]; /* free-form: runtime, hardware, precision... */
	unsigned nlabels;
	int line, name_line; /* where the entry and its name are, for messages */
	/* https upstreams */
	bool tls_verify;	     /* default on: never bypassed silently */
	const char *tls_ca_file;     /* NULL: the system CA store */
	const char *tls_server_name; /* SNI and the name checked; default the URL's host */
	int tls_line;		     /* of its `tls:` settings; 0: none given */
	/* the engine's own Prometheus endpoint, scraped off the forwarding path */
	const char *metrics_url; /* http[s]://HOST[:PORT]/PATH; NULL: off */
	uint64_t metrics_interval_ms;
	enum engine_kind engine;
	int metrics_line;	 /* of metrics_interval or engine, for "needs metrics_url" */
	const char *metrics_key; /* which of the two; static text */
	/* outlier ejection: after this many 5xx or failed connects in a row
	 * (0: never), out of every choice for a backoff doubling from
	 * eject_backoff_ms up to eject_max_ms */
	unsigned eject_after;
	uint64_t eject_backoff_ms, eject_max_ms;
};

struct route_target {
	const char *upstream;
	unsigned weight;
	int line; /* of the upstream name, for messages */
};

enum sticky_kind { STICKY_NONE, STICKY_HEADER, STICKY_JSON_FIELD };

/* How a route chooses among its split (docs/routing.md). */
enum balance_policy { BALANCE_WEIGHTED, BALANCE_LEAST_REQUEST, BALANCE_LATENCY, BALANCE_PREFIX };

/* A policy's name as the configuration spells it ("?" for none). */
const char *balance_policy_name(enum balance_policy b);

/* prefix policy: the block size (an engine's KV block: vLLM's default), the
 * leading blocks hashed by default, and the bound on the affine upstream's
 * load, as a multiple of its share */
#define PREFIX_BLOCK_TOKENS 16
#define PREFIX_BLOCKS_DEFAULT 256
#define PREFIX_BLOCKS_MAX 1024
#define LOAD_FACTOR_DEFAULT 1.25
#define PREFIX_LOAD_SLACK_DEFAULT 4
#define PREFIX_LOAD_SLACK_MAX 4096

/* outlier ejection defaults: failures in a row, first and longest backoff */
#define EJECT_AFTER_DEFAULT 5
#define EJECT_BACKOFF_MS_DEFAULT 1000
#define EJECT_MAX_BACKOFF_MS_DEFAULT 30000

/* Where a request's tenant comes from (docs/config.md, "Tenants"). */
enum tenant_source { TENANT_NONE, TENANT_HEADER, TENANT_JSON_FIELD, TENANT_API_KEY };

/* tenant.keys: an API key's SHA-256 (64 lowercase hex digits) and the
 * tenant it stands for. */
struct tenant_key {
	char sha256[65];
	const char *name;
};

struct tenant_conf {
	enum tenant_source source;
	const char *name; /* the header (lowercase) or the JSON field */
	int line;	  /* of `tenant:`; 0: not given */
};

/* One route: what it matches and where it sends. */
struct route_conf {
	const char *name;
	const char *path_prefix;	   /* "/" when not given */
	const char *method, *host, *model; /* NULL: any */
	struct route_target *targets;
	unsigned ntargets;
	enum sticky_kind sticky;
	const char *sticky_key; /* header name or top-level JSON field */
	bool failover;		/* a refused connection tries another target */
	/* 0: none. Else the response head is held until the first token, and
	 * an upstream with none this long after its dispatch is left for
	 * another target (exchange.c, on_deadline) */
	uint64_t ttft_deadline_ms;
	enum balance_policy balance;
	unsigned prefix_blocks; /* prefix: leading blocks of the prompt that key the choice */
	double load_factor;	/* prefix: the affine upstream's bound, times its share of the load */
	unsigned load_slack;	/* prefix: requests the bound allows past that */
	bool split;		/* targets came from `split:` (else `upstream:`) */
	int line, split_line;
	const char *mirror_upstream;   /* shadow copies go here; NULL: none */
	unsigned mirror_percent;       /* of the route's requests, 0..100 */
	unsigned mirror_max_in_flight; /* a copy is skipped while the shadow runs this many */
	int mirror_line;
	struct tenant_conf tenant; /* source NONE: the top level's */
};

/* The settings tokentap runs with. Each scalar setting is one member made
 * from its SETTINGS(X) row (settings.h: its meaning is the row's help);
 * below them, what the loader and flags note beside the values, and the
 * lists. */
struct config {
	SETTINGS(SETTING_FIELD)

	const char *path; /* the YAML file, NULL when from flags */
	int listen_line;  /* where the file sets `listen`; 0: not from the file */
	/* `listeners:` from the file; empty: the one `listen` (+ `tls`) */
	struct listener_conf *listeners;
	unsigned nlisteners;
	bool max_connections_explicit; /* set by the user: never lowered to fit the descriptor limit */
	bool admin_listen_explicit;    /* a busy default port only warns */

	struct upstream_conf *upstreams;
	unsigned nupstreams;
	struct route_conf *routes;
	unsigned nroutes;
	struct tenant_conf tenant;	/* `tenant:` at the top level; every route without its own */
	bool tenant_any;		/* some `tenant:` (top level or route) names a source */
	struct tenant_key *tenant_keys; /* tenant.keys, sorted by sha256 */
	unsigned ntenant_keys;

	char **owned; /* strings and arrays this config allocated */
	size_t nowned, capowned;
};

/* Fills `c` with the defaults. */
void config_defaults(struct config *c);

/* An `upstreams:` entry's defaults, for the file and for --upstream: TLS
 * verified, a 30s queue wait (used only with a queue). */
void config_upstream_defaults(struct upstream_conf *u);

/* A route's defaults, for the file's routes, the implicit one and
 * --upstream's: every path ("/"), failover on. */
void config_route_defaults(struct route_conf *r);

/* Frees what the config owns; `c` is zeroed. */
void config_free(struct config *c);

/* The listeners in force: `listeners:` when given, else `listen` with the
 * top-level `tls`. Fills out[] and returns how many. */
unsigned config_listeners(const struct config *c, struct listener_conf out[LISTENERS_MAX]);

/* Hands `p` (malloc'd) to the config, which frees it in config_free.
 * Returns `p`, or NULL (and frees p) when out of memory. */
void *config_own(struct config *c, void *p);
char *config_strdup(struct config *c, const char *s);

/* Command-line mode: one upstream from `upstream` (named by its host:port)
 * and one route "default" for every path. 0, or -1 with `err`. */
int config_single_upstream(struct config *c, char *err, size_t errlen);

/* Checks references and values across the config: every route names known
 * upstreams, weights add up to more than zero, names are unique, and so
 * on. Appends one "FILE:LINE: message" line per problem to `errs` (when
 * c->path is set; "message" alone otherwise) and returns the count. */
unsigned config_validate(const struct config *c, char *errs, size_t errlen);

/* Some `tenant:` (top level or route) takes the API key. */
bool config_tenant_keyed(const struct config *c);

/* With an API-key tenant and no tenant.salt: the salt kept in
 * store.dir/tenant-salt, made there first when `create` (the server; -t
 * makes none). 0, or -1 with `err`. */
int config_tenant_salt(struct config *c, bool create, char *err, size_t errlen);

/* "auto" (0: one per CPU core) or 1..WORKERS_MAX. Returns 0 or -1. */
int config_parse_workers(const char *s, unsigned *out);

/* The number of workers to run: `workers`, or the CPU cores when 0. */
unsigned config_workers(const struct config *c);

/* "32m", "16k", "1g", "4096" (1024-based). Returns 0 or -1. */
int config_parse_size(const char *s, uint64_t *out);

/* The longest duration any setting takes: 10 years, so that every
 * duration still fits 64 bits once made nanoseconds. */
#define DURATION_MAX_MS (87600ull * 3600000)
#define DURATION_MAX_TEXT "87600h"

/* "300ms", "5s", "2m", bare numbers are seconds, at most DURATION_MAX_MS.
 * Returns 0 or -1. */
int config_parse_duration_ms(const char *s, uint64_t *out);

/* An upstream URL: http[s]://HOST[:PORT][/], nothing more. */
struct url_parts {
	char host[256];
	char port[8]; /* the default for the scheme when not given */
	bool tls;     /* https:// */
};

/* A metrics URL: http[s]://HOST[:PORT][/PATH[?QUERY]], the path "/metrics"
 * when none is given, the port 80 or 443. */
struct metrics_url_parts {
	char host[256];
	unsigned port;
	char path[1024]; /* with its query */
	bool tls;	 /* https:// */
};

/* 0, or -1 with `err` saying what is wrong. */
int config_parse_metrics_url(const char *url, struct metrics_url_parts *out, char *err, size_t errlen);

/* Parses an upstream URL the one way the server does, for the server and
 * for checking a file (tokentap -t). 0, or -1 with `err` saying what is
 * wrong (without naming the upstream). */
int config_parse_url(const char *url, struct url_parts *out, char *err, size_t errlen);

struct sockaddr_storage;
/* A numeric listen address: "127.0.0.1:8080", "[::1]:8080"; port 0 asks
 * the kernel for a free one. Returns 0 or -1. */
int config_parse_listen(const char *s, struct sockaddr_storage *ss, unsigned *len);

/* The admin API's address: "HOST:PORT" with an IP address ("[v6]:PORT") or
 * "localhost" (read as 127.0.0.1); port 0 asks for a free one. Fills `host`
 * with the literal to bind, `port` and `family` (AF_INET or AF_INET6).
 * Returns 0 or -1. The loader checks admin.listen with it, and admin_start
 * binds what it gives. */
int config_parse_admin_listen(const char *spec, char *host, size_t hostcap, int *port, int *family);
