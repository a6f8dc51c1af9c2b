/*
 * tunnel.h — a WebSocket connection tunnelled between a client and an
 * upstream after the upstream's 101. The bytes go both ways unchanged; each
 * direction runs through a frame parser (wsframe.h) that enforces the
 * frame and message limits and the format's rules, and the tunnel enforces
 * an idle and a total deadline. On a violation or a deadline tokentap ends
 * both sides with a close frame (status 1002, 1009 or 1008 and a reason
 * starting "tokentap:") where each side's stream is at a frame boundary,
 * and closes the connections. The exchange (exchange.h) keeps its admission
 * slot and its upstream connection for as long as the tunnel runs (state
 * TUNNEL); the tunnel gives both back when it ends (exchange_release).
 *
 * On a realtime path (/v1/realtime: OpenAI Realtime, vLLM) the text
 * messages are classified too (realtime.h), and each response is recorded
 * as a request of its own, API "realtime", method WS, id SESSION-ID/N:
 * from where the user's turn ended or the response was asked for (its
 * ttft_from: the client's input_audio_buffer.commit or response.create,
 * or with server-side turn detection the server's
 * input_audio_buffer.speech_stopped, whichever came first, the last turn's
 * end when several turns ended before it; the server's
 * input_audio_buffer.committed or response.created when nothing earlier
 * was seen) to the server's response.done, each text, audio or transcript
 * delta a token event, the usage from response.done. The session has its
 * own line besides (status 101).
 *
 * The tunnel reaches its owner (the client connection, client.c) only
 * through the hooks below.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "realtime.h"
#include "timeline.h"
#include "wsframe.h"

struct event;
struct event_base;
struct evbuffer;
struct exchange;

struct tunnel_hooks {
	/* The first n bytes of `src` go to the client (moved from `src`). */
	void (*to_client)(void *owner, struct evbuffer *src, size_t n);
	/* Bytes waiting to be written to the client. */
	size_t (*client_backlog)(void *owner);
	/* Reading the client on or off (backpressure). */
	void (*client_reading)(void *owner, bool on);
	/* The owner calls tunnel_client_drained() once its output is at most
	 * `low` (0: the default again). */
	void (*client_want_drain)(void *owner, size_t low);
	/* The tunnel has ended (the upstream side released): the owner writes
	 * out what is queued for the client and closes. Terminal. */
	void (*end)(void *owner, const char *why);
};

struct tunnel_conf {
	uint64_t max_frame, max_message; /* payload bytes; 0: none */
	uint64_t idle_ms;		 /* no byte either way for this long ends it; 0: none */
	uint64_t session_ms;		 /* the tunnel's whole life; 0: none */
};

/* One text message of a realtime session being collected (its first
 * RT_MSG_MAX bytes), per direction. */
struct tunnel_msg {
	char *buf;
	size_t len, cap;
	bool text; /* a text message, not compressed: classified at its end */
	bool cut;  /* longer than RT_MSG_MAX */
};

struct tunnel_resp;

#define TUNNEL_MAGIC 0x54554e4eu /* "TUNN" */
struct tunnel {
	OBJ_MAGIC_FIELD
	const struct tunnel_hooks *hooks;
	void *owner;
	struct exchange *x;	    /* its exchange: the upstream connection, the record */
	struct evbuffer *client_in; /* the owner's input buffer: client bytes not yet moved */
	struct event *timer;
	struct tunnel_conf conf;
	struct wsf_parser c2s, s2c;
	uint64_t started_ns, last_ns;
	bool up_paused;	    /* upstream reads off: the client is behind */
	bool client_paused; /* client reads off: the upstream is behind */
	bool running, ended;
	uint32_t mask_seed; /* masks of the close frames tokentap sends upstream */
	/* A realtime session (the path's API is API_REALTIME): its messages
	 * classified (realtime.h), each response a record of its own */
	bool realtime;
	uint64_t now;		  /* the clock at the read being parsed */
	struct tunnel_msg msg[2]; /* [0] the client's, [1] the upstream's */
	struct tunnel_resp *resp; /* the response open: requested, no response.done yet */
	/* A start (realtime.h: RT_CREATE .. RT_COMMITTED) read while the open
	 * response ran, for the next one; RT_OTHER: none */
	enum rt_event pend;
	uint64_t pend_ns;
	unsigned nresp; /* responses begun */
};

/* Starts the tunnel on x's upstream connection (the exchange is in state
 * TUNNEL); the bytes already read on either side go first. -1: out of
 * memory (nothing started; the owner closes). Any call here may end the
 * tunnel, and the end hook may free it with its request: the caller
 * touches neither after, only its own client (whose memory outlives the
 * call). */
int tunnel_start(struct tunnel *t, struct event_base *base, const struct tunnel_conf *conf,
		 const struct tunnel_hooks *hooks, void *owner, struct exchange *x, struct evbuffer *client_in)
	__attribute__((warn_unused_result));
/* New client bytes are in `client_in`. */
void tunnel_client_input(struct tunnel *t);
/* The client's output is down to the level asked for (client_want_drain). */
void tunnel_client_drained(struct tunnel *t);
/* The client closed its side (EOF or an error). Ends the tunnel. */
void tunnel_client_closed(struct tunnel *t, bool error);
/* Frees what tunnel_start made. Accepts a zeroed tunnel; safe twice. */
void tunnel_free(struct tunnel *t);
