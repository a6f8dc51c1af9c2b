/*
 * request.h — one request: its head as parsed, its id, what its body tells
 * the router (model, stream flag, sticky field), the body framed for the
 * upstream (and its shadow), and the outcome, recorded once. Its exchange
 * with the upstream (exchange.h) is embedded; the request's owner (the
 * client connection, client.c) gives the exchange its hooks.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "exchange.h"
#include "mirror.h"
#include "reqparse.h"
#include "timeline.h"
#include "tunnel.h"

struct router;

/* Request ids: a random seed and a counter (request_id_generate). */
struct request_ids {
	uint64_t seed, counter;
};

/* What the requests of one proxy share. */
struct request_env {
	struct router *router;	    /* the current generation; one reference held (by the proxy) */
	struct exchange_env x;	    /* x.current points at `router` */
	struct mirror_list mirrors; /* shadow exchanges in flight */
	struct request_ids ids;
	struct trace_rng trace_rng; /* trace and span ids (tracectx.h) */
	struct request *spares;	    /* finished requests kept for the next ones (request_retire) */
	unsigned nspares;
	char *prefix_spare; /* a body prefix's buffer (BODY_INSPECT_MAX), kept for the next request */
};

/* The most finished requests a worker keeps for its next ones: each some 8
 * KiB and the body prefix's pages a request touched. */
#define REQUEST_SPARES 64

/* One request and its exchange with the upstream. Owned by its client. */
/* The request body's first bytes kept to learn the model, the stream flag
 * and the sticky field (reqinfo.c reads a prefix cut anywhere). */
#define BODY_INSPECT_MAX (64u << 10)

#define REQUEST_MAGIC 0x52455155u /* "REQU" */
struct request {
	OBJ_MAGIC_FIELD
	struct request_env *env;
	uint64_t seq; /* its number on its client connection (client.c, client_runs) */
	struct req_record rec;

	struct reqhead head; /* as parsed: URL, headers, framing (reqparse.h) */
	char *body_prefix;   /* the first BODY_INSPECT_MAX bytes, for the model */
	size_t body_prefix_len;
	bool reqinfo_done;
	uint64_t *chain;    /* latency: its prompt blocks' chain hashes (x.pick.chain), malloc'd; NULL: none */
	bool model_in_path; /* the path named the model (Bedrock): the body's is not read */
	struct mirror
		*mirror;   /* its shadow copy, while the body still flows; cleared by the mirror when it ends first */
	struct exchange x; /* x.body_done: the whole body has been read */
	struct tunnel tunnel;	    /* a WebSocket's, once x is in TUNNEL (tunnel.running) */
	struct request *next_spare; /* in env->spares, once retired */
};

/* A request arriving at `arrive_ns`, whose exchange reaches `owner` through
 * `hooks`; `log_id` names its connection in the log. Made in a spare of the
 * worker's when there is one (request_retire), else allocated. NULL: out of
 * memory. */
struct request *request_new(struct request_env *env, const struct exchange_hooks *hooks, void *owner,
			    uint64_t arrive_ns, uint64_t log_id);
/* Ends its exchange (unrecorded), detaches its shadow, frees it. NULL is
 * fine. */
void request_free(struct request *req);
/* Ends it as request_free does, but keeps its memory and buffers among
 * env's spares for a next request (request_new), while there are fewer
 * than REQUEST_SPARES; else frees it. NULL is fine. */
void request_retire(struct request *req);
/* The buffer the body prefix goes in (BODY_INSPECT_MAX bytes; the worker's
 * kept one when there is one); NULL: out of memory. */
char *request_prefix_buf(struct request *req);
/* Frees the spares (before the loop that their timers are on). */
void request_env_spares_free(struct request_env *env);
/* The outcome is known: logged and counted, once (meter_finish). */
void request_record(struct request *req);
void request_id_generate(struct request_ids *ids, char *out, size_t len);
/* What the record takes from a parsed head: method, path, API, id and the
 * default stream flag. Once per request. */
void request_note_head(struct request *req);
/* Reads the model, stream flag and sticky field from the body prefix;
 * routes when routing waited for them. */
void request_learn_body(struct request *req, bool complete);
/* Body bytes for the upstream and the shadow, re-framed when chunked. -1:
 * out of memory, the upstream's copy lost bytes (the request must fail). */
__attribute__((warn_unused_result)) int request_body_bytes(struct request *req, const char *at, size_t len);
/* The body is complete: its last chunk, the shadow told, the prefix read
 * (which may route it). -1: out of memory for the last chunk. */
__attribute__((warn_unused_result)) int request_body_end(struct request *req);
/* The shadow's request so far, onto `out`: its head for `shadow`, then a
 * copy of the body bytes read (the request's own are left). -1: out of
 * memory (`out` holds part of it: no shadow). */
__attribute__((warn_unused_result)) int request_mirror_copy(const struct request *req, const struct upstream *shadow,
							    struct evbuffer *out);
/* Picks the route and the upstream, starts the shadow when the route
 * mirrors this one, asks for an admission slot. */
void request_route(struct request *req);
