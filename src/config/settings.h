/*
 * settings.h — every scalar setting of `struct config`, declared once.
 *
 * One row of SETTINGS(X) says where a setting is written (its YAML path, its
 * command-line flag), what it holds (a type with one parser and one
 * "expected ..." text), its default as the user would write it, its range,
 * whether a reload applies it, and its line of --help. struct config's
 * member, the defaults (config_defaults), the getopt table, flag application, --help and
 * docs/config.md's settings reference are made from it;
 * tests/unit/test_settings.c checks that every default parses and lies in
 * its range, and that the docs say what the table says.
 *
 * Columns: (ID, YAML path, long flag, short flag, TYPE, field, default, min,
 * max, RELOAD, metavar, help). `field` names the member of struct config
 * that the row declares (config.h), of its TYPE's C type (SETTING_CTYPE_*). A NULL YAML path: command line only; a NULL
 * flag: file only (both NULL: a fixed value kept in the config until it moves
 * beside its user). The default is text parsed by TYPE's parser; NULL is zero
 * / off. min and max are in TYPE's unit (bytes, ms, a count), 0 = unbounded;
 * DURATION_S (a duration stored in seconds) checks them on the milliseconds
 * before they are divided (so its rows say 1000: at least 1s). A row states
 * the range the code enforces, quirks included: the table came in without
 * changing which values are accepted, and a range that should change does
 * so in a commit of its own, with its test.
 *
 * Lists (`listeners:`, `upstreams:`, `routes:`) are not rows.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct config;

#define SIZE_1G ((uint64_t)1 << 30)

/* clang-format off */
#define SETTINGS(X) \
	X(UPSTREAM, NULL, "upstream", 'u', URL, upstream, NULL, 0, 0, NONE, "URL", \
	  "inference server, e.g. http://127.0.0.1:8000") \
	X(LISTEN, "listen", "listen", 'l', LISTEN, listen, "127.0.0.1:8080", 0, 0, RESTART_LISTENER, "ADDR:PORT", \
	  "where clients connect") \
	X(TLS_CERT, "tls.cert", "tls-cert", 0, FILE, tls_cert, NULL, 0, 0, RESTART_LISTENER, "FILE", \
	  "the listener's certificate (PEM); with --tls-key it speaks TLS") \
	X(TLS_KEY, "tls.key", "tls-key", 0, FILE, tls_key, NULL, 0, 0, RESTART_LISTENER, "FILE", \
	  "the listener's private key (PEM)") \
	X(ACCESS_LOG, "access_log", "access-log", 0, STRING_OFF, access_log, NULL, 0, 0, RESTART, "PATH|-|off", \
	  "one JSON line per request; '-' for stdout") \
	X(WORKLOAD, "workload.path", "workload", 0, STRING_OFF, workload_path, NULL, 0, 0, RESTART, "PATH", \
	  "capture each finished request as a trace line (docs/workload.md)") \
	X(WORKLOAD_MAX_SIZE, "workload.max_size", NULL, 0, SIZE, workload_max_size, "256m", 4096, 0, RESTART, NULL, \
	  "workload file size before it is rotated") \
	X(WORKLOAD_MAX_FILES, "workload.max_files", NULL, 0, UINT, workload_max_files, "4", 1, 1000, RESTART, NULL, \
	  "workload files kept, the one written included") \
	X(WORKLOAD_BLOCK_TOKENS, "workload.block_tokens", "workload-block-tokens", 0, UINT, workload_block_tokens, "512", \
	  1, 65536, RESTART, "N", "prefix hash block, in tokens of ~4 bytes of prompt text") \
	X(WORKLOAD_MAX_HASH_IDS, "workload.max_hash_ids", NULL, 0, UINT, workload_max_hash_ids, "1048576", 1024, \
	  16777216, RESTART, NULL, "block hashes remembered for their ids (~34 bytes each); past it, new ones are not") \
	X(WORKERS, "workers", "workers", 0, WORKERS, workers, "auto", 0, 0, RESTART, "N|auto", \
	  "event loops, one thread each; auto: one per core") \
	X(MAX_BODY_SIZE, "limits.max_body_size", "max-body-size", 0, SIZE, max_body_size, "32m", 0, 0, LIVE, "SIZE", \
	  "largest request body") \
	X(MAX_HEADER_SIZE, "limits.max_header_size", "max-header-size", 0, SIZE, max_header_size, "32k", 256, SIZE_1G, \
	  LIVE, "SIZE", "largest request head") \
	X(MAX_HEADERS, "limits.max_headers", NULL, 0, UINT, max_headers, "100", 1, 0, LIVE, NULL, \
	  "header lines in one request") \
	X(MAX_CONNECTIONS, "limits.max_connections", NULL, 0, UINT, max_connections, "10000", 1, 0, LIVE, NULL, \
	  "client connections at once; past it, 503; when not set, at most what the descriptor limit holds") \
	X(MAX_EVENT_SIZE, "limits.max_event_size", NULL, 0, SIZE, max_event_size, "1m", 1, 0, LIVE, NULL, \
	  "largest SSE event or NDJSON line measured") \
	X(WS_MAX_FRAME_SIZE, "limits.ws_max_frame_size", NULL, 0, SIZE, ws_max_frame_size, "16m", 1, 0, LIVE, NULL, \
	  "largest WebSocket frame payload tunnelled; past it, close 1009") \
	X(WS_MAX_MESSAGE_SIZE, "limits.ws_max_message_size", NULL, 0, SIZE, ws_max_message_size, "64m", 1, 0, LIVE, \
	  NULL, "largest WebSocket message, its fragments together; past it, close 1009") \
	X(HEADER_TIMEOUT, "timeouts.header", "header-timeout", 0, DURATION, header_timeout_ms, "30s", 1, 0, LIVE, "DUR", \
	  "whole request head must arrive within") \
	X(BODY_TIMEOUT, "timeouts.body", "body-timeout", 0, DURATION, body_timeout_ms, "60s", 1, 0, LIVE, "DUR", \
	  "whole request body must arrive within, from the head") \
	X(KEEPALIVE_TIMEOUT, "timeouts.keepalive", NULL, 0, DURATION, keepalive_timeout_ms, "75s", 1, 0, LIVE, NULL, \
	  "idle client connection between requests") \
	X(CONNECT_TIMEOUT, "timeouts.connect", "connect-timeout", 0, DURATION, connect_timeout_ms, "5s", 1, 0, LIVE, \
	  "DUR", "upstream connect") \
	X(FIRST_BYTE_TIMEOUT, "timeouts.first_byte", "first-byte-timeout", 0, DURATION, first_byte_timeout_ms, "300s", 1, \
	  0, LIVE, "DUR", "request sent to response headers") \
	X(IDLE_TIMEOUT, "timeouts.idle", "idle-timeout", 0, DURATION, idle_timeout_ms, "300s", 1, 0, LIVE, "DUR", \
	  "silence on a running exchange") \
	X(WS_IDLE_TIMEOUT, "timeouts.ws_idle", NULL, 0, DURATION, ws_idle_timeout_ms, "300s", 1, 0, LIVE, NULL, \
	  "no byte either way on a WebSocket tunnel; then close 1008") \
	X(WS_SESSION_TIMEOUT, "timeouts.ws_session", NULL, 0, DURATION, ws_session_timeout_ms, "1h", 1, 0, LIVE, NULL, \
	  "a WebSocket tunnel's whole life; then close 1008") \
	X(POOL_IDLE_TIMEOUT, "timeouts.pool_idle", NULL, 0, DURATION, pool_idle_timeout_ms, "60s", 1, 0, LIVE, NULL, \
	  "idle pooled upstream connection") \
	X(SHUTDOWN_GRACE, "timeouts.shutdown_grace", NULL, 0, DURATION, shutdown_grace_ms, "30s", 1, 0, LIVE, NULL, \
	  "SIGTERM: running streams get this long") \
	X(DATA_DIR, "store.dir", "data-dir", 0, STRING_OFF, data_dir, "tokentap-data", 0, 0, RESTART, "DIR|off", \
	  "where percentile state persists") \
	X(FLUSH_INTERVAL, "store.flush_interval", "flush-interval", 0, DURATION, flush_ms, "1s", 1, 0, RESTART, "DUR", \
	  "how often stats reach the store") \
	X(MINUTE_RETENTION, "store.minute_retention", NULL, 0, DURATION_S, minute_retention_s, "24h", 1000, 0, RESTART, \
	  NULL, "how long per-minute slices are kept") \
	X(HOUR_RETENTION, "store.hour_retention", NULL, 0, DURATION_S, hour_retention_s, "720h", 1000, 0, RESTART, NULL, \
	  "how long per-hour slices are kept") \
	X(STORE_MAX_SIZE, "store.max_size", NULL, 0, SIZE, store_max_size, "64g", STORE_MAX_SIZE_MIN, \
	  STORE_MAX_SIZE_MAX, RESTART, NULL, "the LMDB map grows up to this") \
	X(MAX_MODELS, "store.max_models", NULL, 0, UINT, max_models, "32", 1, 0, RESTART, NULL, \
	  "distinct models per route and upstream") \
	X(MODEL_IDLE, "store.model_idle", NULL, 0, DURATION, model_idle_ms, "24h", 1, 0, RESTART, NULL, \
	  "a model unused this long may lose its slot") \
	X(MAX_TENANTS, "tenant.max_per_route", NULL, 0, UINT, max_tenants, "32", 1, 0, RESTART, NULL, \
	  "distinct tenants per route kept in the stats; the rest count as other") \
	X(TENANT_IDLE, "tenant.idle", NULL, 0, DURATION, tenant_idle_ms, "24h", 1, 0, RESTART, NULL, \
	  "a tenant unseen this long may lose its slot") \
	X(TENANT_SALT, "tenant.salt", NULL, 0, STRING, tenant_salt, NULL, 0, 0, LIVE, NULL, \
	  "salt of the api_key tenants' hash (else one generated in store.dir/tenant-salt)") \
	X(TENANT_METRICS, "tenant.metrics_label", NULL, 0, BOOL, tenant_metrics, NULL, 0, 0, RESTART, NULL, \
	  "/metrics also exports per-tenant families with a tenant label") \
	X(COLD_IDLE, "store.cold_after_idle", NULL, 0, DURATION, cold_idle_ms, "60s", 1, 0, LIVE, NULL, \
	  "an upstream idle this long serves cold") \
	X(SLO_TTFT, "slo.ttft", "slo-ttft", 0, DURATION, slo_ttft_ms, "2s", 1, 0, RESTART, "DUR", \
	  "goodput: time to first token at most") \
	X(SLO_TPOT, "slo.tpot", "slo-tpot", 0, DURATION, slo_tpot_ms, "100ms", 1, 0, RESTART, "DUR", \
	  "goodput: time per output token at most") \
	X(SLO_ITL, "slo.itl", "slo-itl", 0, DURATION_OFF, slo_itl_ms, NULL, 1, 0, RESTART, "DUR|off", \
	  "goodput: longest gap between tokens at most (not checked unless given)") \
	X(LOG_LEVEL, "log_level", "log-level", 0, LOGLEVEL, log_level, "info", 0, 0, LIVE, "LEVEL", \
	  "error, warn, info or debug") \
	X(CHECK_DATA, NULL, "check-data", 0, FLAG, check_data, NULL, 0, 0, NONE, NULL, \
	  "read every record in --data-dir, report, and exit") \
	X(ADMIN_LISTEN, "admin.listen", "admin", 0, ADMIN_LISTEN, admin_listen, "127.0.0.1:9901", 0, 0, RESTART, \
	  "ADDR:PORT|off", "admin API: stats, /metrics, reset") \
	X(ADMIN_TOKEN_FILE, "admin.token_file", "admin-token-file", 0, STRING, admin_token_file, NULL, 0, 0, RESTART, \
	  "PATH", "bearer token for admin writes (or env TOKENTAP_ADMIN_TOKEN)") \
	X(OVERRIDE_HEADER, "override_header", NULL, 0, STRING_OFF, override_header, NULL, 0, 0, LIVE, NULL, \
	  "a request header that pins a request to a named upstream") \
	X(OVERRIDE_ANY_UPSTREAM, "override_any_upstream", NULL, 0, BOOL, override_any_upstream, NULL, 0, 0, LIVE, \
	  NULL, "the override header may name an upstream outside the matched route") \
	X(TRACE_NEW, "tracing.new_traces", NULL, 0, BOOL, trace_new, NULL, 0, 0, LIVE, NULL, \
	  "a request without a valid traceparent starts a new trace (off: none is sent upstream)") \
	X(TRACE_RATIO, "tracing.sample_ratio", NULL, 0, RATIO, trace_ratio, "1", 0, 0, LIVE, NULL, \
	  "the share of new traces marked sampled; a client's traceparent keeps its own flag") \
	X(TRACE_SAMPLER, "tracing.sampler", NULL, 0, STRING, trace_sampler, NULL, 0, 0, LIVE, NULL, \
	  "parentbased_traceidratio (sample_ratio), always_on, ...; unset: env OTEL_TRACES_SAMPLER(_ARG)") \
	X(OTLP_ENDPOINT, "tracing.otlp.endpoint", NULL, 0, STRING, otlp_endpoint, NULL, 0, 0, RESTART, NULL, \
	  "OTLP/HTTP collector: sampled spans are POSTed to its /v1/traces (else env OTEL_EXPORTER_OTLP_ENDPOINT)") \
	X(OTLP_HEADERS, "tracing.otlp.headers", NULL, 0, STRING, otlp_headers, NULL, 0, 0, RESTART, NULL, \
	  "KEY=VALUE,... headers of each export (else env OTEL_EXPORTER_OTLP_HEADERS)") \
	X(OTLP_TIMEOUT, "tracing.otlp.timeout", NULL, 0, DURATION, otlp_timeout_ms, NULL, 0, 0, RESTART, NULL, \
	  "one export's time limit; 0: env OTEL_EXPORTER_OTLP_TIMEOUT (ms) or 10s") \
	X(OTLP_DELAY, "tracing.otlp.schedule_delay", NULL, 0, DURATION, otlp_delay_ms, NULL, 0, 0, RESTART, NULL, \
	  "the longest a span waits for its batch; 0: env OTEL_BSP_SCHEDULE_DELAY (ms) or 5s") \
	X(OTLP_QUEUE, "tracing.otlp.max_queue_size", NULL, 0, UINT, otlp_queue_max, NULL, 0, 1048576, RESTART, NULL, \
	  "spans waiting to be sent, past it dropped; 0: env OTEL_BSP_MAX_QUEUE_SIZE or 2048") \
	X(OTLP_BATCH, "tracing.otlp.max_export_batch_size", NULL, 0, UINT, otlp_batch_max, NULL, 0, 65536, RESTART, \
	  NULL, "spans per export at most; 0: env OTEL_BSP_MAX_EXPORT_BATCH_SIZE or 512") \
	X(OTLP_SERVICE, "tracing.otlp.service_name", NULL, 0, STRING, otlp_service, NULL, 0, 0, RESTART, NULL, \
	  "the resource's service.name (else env OTEL_SERVICE_NAME, else tokentap)") \
	X(OTLP_RESOURCE, "tracing.otlp.resource_attributes", NULL, 0, STRING, otlp_resource, NULL, 0, 0, RESTART, \
	  NULL, "KEY=VALUE,... more resource attributes (else env OTEL_RESOURCE_ATTRIBUTES)") \
	X(OTLP_PROTOCOL, "tracing.otlp.protocol", NULL, 0, STRING, otlp_protocol, NULL, 0, 0, RESTART, NULL, \
	  "http/protobuf or http/json (grpc: not supported); unset: env OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, else http/protobuf") \
	X(OTLP_CA_FILE, "tracing.otlp.certificate", NULL, 0, FILE, otlp_ca_file, NULL, 0, 0, RESTART, NULL, \
	  "PEM CAs verifying an https endpoint (else env OTEL_EXPORTER_OTLP_CERTIFICATE; else the system's)") \
	X(OTLP_METRICS_ENDPOINT, "metrics.otlp.endpoint", NULL, 0, STRING, otlp_metrics_endpoint, NULL, 0, 0, RESTART, \
	  NULL, "OTLP/HTTP collector: GenAI metrics POSTed to its /v1/metrics (else env OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)") \
	X(OTLP_METRICS_PROTOCOL, "metrics.otlp.protocol", NULL, 0, STRING, otlp_metrics_protocol, NULL, 0, 0, RESTART, \
	  NULL, "http/protobuf or http/json (grpc: not supported); unset: env OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL, else http/protobuf") \
	X(OTLP_METRICS_INTERVAL, "metrics.otlp.interval", NULL, 0, DURATION, otlp_metrics_interval_ms, NULL, 0, 0, \
	  RESTART, NULL, "time between two exports; 0: env OTEL_METRIC_EXPORT_INTERVAL (ms) or 60s") \
	X(OTLP_METRICS_SERIES, "metrics.otlp.max_series", NULL, 0, UINT, otlp_metrics_series, NULL, 0, 65536, \
	  RESTART, NULL, "GenAI attribute sets kept, past it counted under otel.metric.overflow; 0: 256") \
	X(GENAI_PROM, "metrics.genai_prometheus", NULL, 0, BOOL, genai_prometheus, NULL, 0, 0, RESTART, NULL, \
	  "/metrics also shows the GenAI metrics under their Prometheus names (gen_ai_client_...)")
/* clang-format on */

/* The C type of each TYPE's field in struct config. */
#define SETTING_CTYPE_SIZE uint64_t
#define SETTING_CTYPE_DURATION uint64_t
#define SETTING_CTYPE_DURATION_S uint64_t
#define SETTING_CTYPE_DURATION_OFF uint64_t
#define SETTING_CTYPE_UINT unsigned
#define SETTING_CTYPE_BOOL bool
#define SETTING_CTYPE_STRING const char *
#define SETTING_CTYPE_STRING_OFF const char *
#define SETTING_CTYPE_FILE const char *
#define SETTING_CTYPE_LISTEN const char *
#define SETTING_CTYPE_ADMIN_LISTEN const char *
#define SETTING_CTYPE_URL const char *
#define SETTING_CTYPE_LOGLEVEL int
#define SETTING_CTYPE_WORKERS unsigned
#define SETTING_CTYPE_FLAG bool
#define SETTING_CTYPE_RATIO double

/* struct config's member for one row (config.h expands it). */
#define SETTING_FIELD(ID, yaml, flag, sh, TYPE, field, def, min, max, reload, metavar, help) SETTING_CTYPE_##TYPE field;

enum setting_id {
#define SETTING_ENUM(ID, ...) S_##ID,
	SETTINGS(SETTING_ENUM)
#undef SETTING_ENUM
		S__COUNT
};

/* What a value is and how it is written. Each has one parser. */
enum setting_type {
	ST_SIZE,	 /* "32m", "4096": bytes, uint64_t (size_t fields are the same type) */
	ST_DURATION,	 /* "300ms", "5s", bare seconds: uint64_t milliseconds */
	ST_DURATION_S,	 /* a duration stored in whole seconds (uint64_t) */
	ST_DURATION_OFF, /* a duration, or "off" for 0 (not checked) */
	ST_UINT,	 /* a whole number up to 1e9: unsigned */
	ST_BOOL,	 /* true/yes/on, false/no/off */
	ST_STRING,	 /* kept as given */
	ST_STRING_OFF,	 /* "off" means none (NULL) */
	ST_FILE,	 /* a path; checked as a readable file by the loader, and by cli.c for a flag */
	ST_LISTEN,	 /* a numeric ADDR:PORT (config_parse_listen) */
	ST_ADMIN_LISTEN, /* ADDR:PORT or localhost:PORT (config_parse_admin_listen), or "off" */
	ST_URL,		 /* an upstream URL (config_parse_url) */
	ST_LOGLEVEL,	 /* error, warn, info, debug: int */
	ST_WORKERS,	 /* auto or 1..WORKERS_MAX: unsigned */
	ST_FLAG,	 /* no value: present means true */
	ST_RATIO,	 /* a number from 0 to 1: double (min and max unused) */
};

/* When a changed value takes effect on SIGHUP. */
enum setting_reload {
	SR_LIVE,	     /* the next requests use it */
	SR_RESTART,	     /* read at start-up only; a reload warns */
	SR_RESTART_LISTENER, /* part of the listener set, compared as a whole */
	SR_NONE,	     /* command line only: a reload cannot change it */
};

struct setting {
	enum setting_id id;
	const char *name; /* the ID as text: "MAX_HEADER_SIZE" */
	const char *yaml; /* dotted path; NULL: no file key */
	const char *flag; /* long flag without "--"; NULL: no flag */
	int short_flag;	  /* 0: none */
	enum setting_type type;
	size_t offset;	   /* of the field in struct config */
	const char *def;   /* default as text; NULL: zero / off */
	uint64_t min, max; /* 0: unbounded */
	enum setting_reload reload;
	const char *metavar; /* the flag's value in --help */
	const char *help;
};

extern const struct setting settings[S__COUNT];

/* The row of a long flag, or NULL. */
const struct setting *settings_by_flag(const char *flag);

/* The row of a YAML path ("limits.max_body_size"), or NULL. */
const struct setting *settings_by_yaml(const char *path);

/* Parses `text` as row `s` says, range included, and stores it in `c`.
 * Strings are stored as the pointer given (the caller keeps them alive).
 * 0, or -1 with `why` saying what was expected ("expected a size from 256
 * to 1g, such as 32k") or, for a URL, what is wrong with it; `c` is then
 * unchanged. */
int setting_parse(const struct setting *s, const char *text, struct config *c, char *why, size_t whylen);

/* "expected ..." text for row `s`, without the word "expected". */
void setting_expected(const struct setting *s, char *out, size_t len);

/* A flag's value from the command line: setting_parse plus what a flag does
 * besides (--listen replaces the file's `listeners:`, --admin marks the
 * address as chosen). A --tls-* file is not opened here: cli.c checks the
 * pair once every flag is read. 0 or -1 with `why`. */
int settings_apply_flag(const struct setting *s, const char *value, struct config *c, char *why, size_t whylen);

/* One --help line per flag row, in table order. */
void settings_usage(FILE *out);

/* docs/config.md's settings reference: a Markdown table with one line per
 * row that has a YAML key or a flag (key, flag, type, default, range,
 * reload, help), between SETTINGS_DOC_BEGIN and SETTINGS_DOC_END. */
#define SETTINGS_DOC_BEGIN \
	"<!-- settings reference: made from SETTINGS(X) in src/config/settings.h; do not edit by hand -->\n"
#define SETTINGS_DOC_END "<!-- end of settings reference -->\n"
void settings_doc_table(FILE *out);

/* A size as the table writes it: 1g, 64k, 256. */
void settings_size_text(uint64_t v, char *out, size_t len);

/* A reload from `boot` to `next`: logs one warning for each RESTART row that
 * changed (naming its YAML key) and one for a changed listener set. Returns
 * how many it logged. */
unsigned settings_warn_fixed(const struct config *boot, const struct config *next);
