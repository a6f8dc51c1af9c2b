/*
 * respparse.h — the upstream response parser: llhttp set up for responses,
 * plus what tokentap decides while reading one (which header picks the
 * framer, 1xx responses, a refused 101, the head size bound, HEAD answers,
 * the pause at the message end). No sockets, no timers: bytes go in through
 * respparse_feed(), what to forward comes out of respparse_take(), events
 * through hooks. exchange.c drives one per request; tests/fuzz/fuzz_respparse.c
 * drives the same code.
 */
#pragma once

#include <llhttp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "classify.h"
#include "framer.h"

/* A response head is held until it parses whole; this bounds it (1xx
 * responses before it included). */
#define RESP_HEAD_MAX (64u << 10)

struct respparse;

/* What the caller does as a response parses. `arg` is the one given to
 * respparse_init. */
struct respparse_hooks {
	/* The final (non-1xx) response's head has parsed: rp->status, rp->kind
	 * (FRAMER_NONE for a body that is not streamed or is content-encoded). */
	void (*head)(void *arg, const struct respparse *rp);
	/* Body bytes, without the transfer coding's framing. */
	void (*body)(void *arg, const char *at, size_t len);
	/* The final response has ended; the parser pauses. `keep_alive`: the
	 * connection may carry another exchange, as far as the response says. */
	void (*complete)(void *arg, bool keep_alive);
	/* May be NULL: body bytes of several chunks of one feed at once, in
	 * order, instead of a body call for each. */
	void (*body_v)(void *arg, const struct framer_slice *v, size_t n);
};

enum respparse_status {
	RESPPARSE_MORE,		  /* the response goes on in the next bytes */
	RESPPARSE_DONE,		  /* the response has ended; what follows is not its */
	RESPPARSE_INVALID,	  /* llhttp refused the bytes: respparse_error names why */
	RESPPARSE_SWITCHING,	  /* a 101: a protocol switch nobody asked for */
	RESPPARSE_HEAD_TOO_LARGE, /* over head_max bytes held and no final head yet */
};

/* Per request; embedded in it. */
struct respparse {
	llhttp_t parser;
	const struct respparse_hooks *hooks;
	void *arg;
	/* Set by the caller before the response arrives: it answers a HEAD, so
	 * it has no body whatever its headers say. */
	bool head_request;
	/* Set by the caller before the response arrives: the request asked for
	 * a WebSocket (reqhead.websocket), so a 101 is the final head and ends
	 * the response (DONE): what follows it is the tunnel's. */
	bool upgrade_ok;
	bool switched; /* the response was that 101 */
	/* Bytes a head may take, 1xx responses before it included: RESP_HEAD_MAX
	 * (the fuzz target lowers it to reach the bound with small inputs). */
	size_t head_max;
	/* Set by the caller while it wants the response kept from its client
	 * past the head (exchange.c holds a route's answer for its first
	 * token): respparse_take hands out nothing, the bytes stay held. */
	bool hold;
	/* Bytes fed and parsed but not yet taken (respparse_take). */
	size_t held;
	/* The final response, as parsed */
	int status;
	enum framer_kind kind;	     /* from Content-Type; FRAMER_NONE when content-encoded */
	bool content_encoded;	     /* a Content-Encoding other than identity */
	struct server_timing server; /* TGI's x-*-time headers (classify_header) */
	bool head_done, done;
	/* From the end (beside the complete hook): what the hook was told, the
	 * connection may carry another exchange as far as the response says */
	bool keep_alive;
	/* Set by the caller before the response arrives: llhttp reads a
	 * chunked body too (respparse.c, "Chunked bodies"; tests compare the
	 * two paths with it). */
	bool llhttp_chunks;
	/* parse state */
	uint8_t ck;	    /* a chunked body read here: enum chunk_state in respparse.c, 0 when llhttp reads */
	bool ck_mute;	    /* llhttp's body bytes are the prefix chunks_fallback made up: not the body */
	uint64_t ck_len;    /* the chunk size read so far, then the chunk's data still to come */
	bool informational; /* inside a 1xx response */
	int refused;	    /* a status refused in the head: 101, or below 100 */
	bool in_name;
	char name[40],
		val[128]; /* the current header, cut to what is looked for (x-amzn-bedrock-invocation-latency: 33) */
	size_t name_len, val_len;
};

void respparse_init(struct respparse *rp, const struct respparse_hooks *hooks, void *arg);

/*
 * Parses `len` more bytes of the upstream's stream, the ones right after
 * those fed before; *used is how many belong to the response (all of them
 * unless it ended: DONE). The bytes used join rp->held. After DONE the
 * parser is not fed again; after INVALID or SWITCHING neither.
 */
enum respparse_status respparse_feed(struct respparse *rp, const char *buf, size_t len, size_t *used)
	__attribute__((warn_unused_result));

/*
 * Once the bytes at hand are fed: *n of the held bytes are the caller's to
 * forward now, all of them once the final head has parsed (1xx responses
 * and the head go out with it), none before, nor while rp->hold is set. Returns DONE when the response
 * has ended, HEAD_TOO_LARGE when more than rp->head_max bytes are held
 * with no final head (*n is 0), else MORE.
 */
enum respparse_status respparse_take(struct respparse *rp, size_t *n) __attribute__((warn_unused_result));

/* The response is delimited by the connection's close (no length, not
 * chunked): the upstream's EOF ends it. */
bool respparse_needs_eof(const struct respparse *rp);

/* The upstream closed: ends a response that the close delimits. */
void respparse_finish(struct respparse *rp);

/* After INVALID or SWITCHING: llhttp's name for the error. */
const char *respparse_error(const struct respparse *rp);
