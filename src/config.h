/*
 * config.h — the settings tokentap runs with, and the parsers for the value
 * syntaxes users type (sizes like 32m, durations like 300ms).
 *
 * One struct holds every setting with its default; main.c fills it from the
 * command line. Setup errors are reported as text the user can act on.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct config {
	const char *listen;	/* ADDR:PORT */
	const char *upstream;	/* http://host:port */
	const char *access_log; /* path, "-" for stdout, NULL for none */
	uint64_t max_body_size;
	uint64_t max_header_size;
	unsigned max_headers;
	uint64_t header_timeout_ms;	/* whole request head, from its first byte */
	uint64_t keepalive_timeout_ms;	/* idle client connection between requests */
	uint64_t connect_timeout_ms;	/* upstream TCP connect */
	uint64_t first_byte_timeout_ms; /* request sent → response headers */
	uint64_t idle_timeout_ms;	/* no byte either way on a running exchange */
	uint64_t pool_idle_timeout_ms;	/* idle pooled upstream connection */
	unsigned pool_max_idle;		/* idle connections kept per upstream */
	size_t stream_buffer;		/* per-direction high watermark */
	size_t max_event_size;		/* framer bound on one SSE event / NDJSON line */
	size_t body_inspect_max;	/* request body prefix kept to learn the model */

	const char *data_dir;	       /* LMDB stats directory; NULL: memory only */
	uint64_t flush_ms;	       /* worker deltas to the store */
	unsigned max_models;	       /* distinct models per route and upstream */
	uint64_t slo_ttft_ms;	       /* goodput thresholds */
	uint64_t slo_tpot_ms;
	uint64_t cold_idle_ms;	       /* an upstream idle this long serves cold */
	uint64_t minute_retention_s;
	uint64_t hour_retention_s;
	bool check_data; /* verify the store and exit */
};

/* Fills `c` with the defaults. */
void config_defaults(struct config *c);

/* "32m", "16k", "1g", "4096" (1024-based). Returns 0 or -1. */
int config_parse_size(const char *s, uint64_t *out);

/* "300ms", "5s", "2m", bare numbers are seconds. Returns 0 or -1. */
int config_parse_duration_ms(const char *s, uint64_t *out);

struct sockaddr_storage;
/* A numeric listen address: "127.0.0.1:8080", "[::1]:8080"; port 0 asks
 * the kernel for a free one. Returns 0 or -1. */
int config_parse_listen(const char *s, struct sockaddr_storage *ss, unsigned *len);
