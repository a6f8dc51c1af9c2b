/*
 * reqparse.h — the client request parser: llhttp set up for requests, plus
 * every check tokentap makes on a request head and body before anything is
 * forwarded (limits, smuggling shapes, Expect, CONNECT and Upgrade: only
 * `Upgrade: websocket` passes, as a WebSocket handshake to tunnel). No
 * sockets, no timers: bytes go in through reqparse_feed(), outcomes come out
 * through hooks and its return value. client.c drives one per client
 * connection; tests/fuzz/fuzz_reqparse.c drives the same code.
 */
#pragma once

#include <llhttp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHUNK_EXT_MAX 4096 /* extension bytes on one chunk line */

/* The limits one request is parsed under, fixed when its first byte
 * arrives (a reload applies to the next request). */
struct reqparse_limits {
	size_t max_header_size; /* URL, header names and values together */
	unsigned max_headers;	/* header fields */
	uint64_t max_body_size;
};

/* The header names tokentap itself reads or drops, known once a field's
 * name has parsed (hdr.kind): one comparison then, instead of one by each
 * reader of the head. */
enum hdr_kind {
	HDR_OTHER,
	HDR_HOST,
	HDR_CONNECTION,
	HDR_TRANSFER_ENCODING,
	HDR_UPGRADE,
	HDR_EXPECT,
	HDR_KEEP_ALIVE,
	HDR_TE,
	HDR_TRAILER,
	HDR_HTTP2_SETTINGS,
	HDR_PROXY_CONNECTION,
	HDR_X_REQUEST_ID,
	HDR_TRACEPARENT,
	HDR_TRACESTATE,
};

/* One header field: offsets into its head's buffer, and what its name is. */
struct hdr {
	uint32_t name_off, name_len, val_off, val_len;
	uint32_t kind; /* enum hdr_kind */
};

/* One request's head as parsed. Owned by whoever owns the request (request.h:
 * embedded in struct request); reqparse writes into it from the request's
 * first byte until its message ends. */
struct reqhead {
	struct reqparse_limits lim;
	char *buf; /* URL, header names and values, back to back */
	size_t len, cap;
	struct hdr *hdrs; /* hdr_cap of them, grown up to lim.max_headers */
	unsigned hdr_cap;
	unsigned nhdr;
	/* the Connection headers: how many, the first one's index; whether
	 * they list nothing but close and keep-alive (known once parsed) */
	unsigned nconn, conn_first;
	bool conn_plain;
	size_t url_off, url_len;
	/* set once the head has parsed (before tokentap's own checks) */
	bool parsed;
	enum llhttp_method method;
	uint8_t http_major, http_minor;
	/* set once the head has passed every check */
	bool http10;
	bool chunked;		 /* the body comes chunked (HTTP/1.1 only) */
	uint64_t content_length; /* as declared; 0 when none */
	bool keep_alive;	 /* the connection may carry another request */
	bool send_continue;	 /* Expect: 100-continue from an HTTP/1.1 client */
	bool websocket;		 /* a WebSocket opening handshake (RFC 6455 4.1): tunnelled after a 101 */
	uint64_t body_bytes;
	/* parse state */
	bool in_url, in_name;
	size_t chunk_ext;		  /* extension bytes of the current chunk line */
	size_t trailer_len, trailer_name; /* trailer bytes seen; of the current name */
};

/* What the caller does with a request as it parses. `arg` is the one given
 * to reqparse_init. A hook that returns -1 stops the parse: reqparse_feed
 * then returns REQPARSE_STOPPED (the caller has answered or closed). */
struct reqparse_hooks {
	/* A request's first byte: where its head goes; NULL (out of memory)
	 * refuses the request. */
	struct reqhead *(*begin)(void *arg);
	/* The head has parsed and passed every check: dispatch it. */
	int (*head)(void *arg, struct reqhead *h);
	/* A chunk line of a chunked body has parsed (the last one included). */
	int (*chunk)(void *arg);
	/* Body bytes, de-chunked, within the body limit. */
	void (*body)(void *arg, const char *at, size_t len);
	/* The message has ended; the parser pauses until reqparse_resume. */
	void (*complete)(void *arg);
};

enum reqparse_status {
	REQPARSE_MORE,	  /* all bytes taken; the request goes on in the next ones */
	REQPARSE_PAUSED,  /* a message ended: *used bytes taken, the rest is the next request */
	REQPARSE_REFUSED, /* the request is refused: reqparse_refusal says how */
	REQPARSE_STOPPED, /* a hook returned -1 */
};

/* Per connection; embedded in whatever owns the connection. */
struct reqparse {
	llhttp_t parser;
	const struct reqparse_hooks *hooks;
	void *arg;
	struct reqhead *head; /* the current request's, from hooks->begin */
	int reject_status;    /* a refusal of tokentap's own, not llhttp's */
	const char *reject_msg;
	bool stopped;
	/* head_scan's state over the current request's head, then over its
	 * trailer section (after the last chunk) */
	char scan_prev;
	unsigned scan_line, scan_lines;
	bool scan_done;
	bool last_chunk; /* llhttp paused at the last chunk's line: the trailers follow */
};

/* Allocates the head's header array for `lim` (its first fields; it grows
 * as more come); -1 when out of memory. The head is otherwise zeroed. */
int reqhead_init(struct reqhead *h, const struct reqparse_limits *lim) __attribute__((warn_unused_result));
/* The head made ready for another request, as reqhead_init leaves it but
 * keeping its buffer and header array as they grew: nothing of the last
 * request is read again, since only nhdr fields and len bytes count. -1
 * when out of memory (reqhead_free still frees what it holds). */
int reqhead_reset(struct reqhead *h, const struct reqparse_limits *lim) __attribute__((warn_unused_result));
/* Frees what the head holds. Safe on a zeroed head and twice. */
void reqhead_free(struct reqhead *h);

/* The first header named `name` (case-insensitive), or NULL. */
const struct hdr *reqhead_header(const struct reqhead *h, const char *name);
/* The first header of kind `k`, or NULL. */
const struct hdr *reqhead_kind(const struct reqhead *h, enum hdr_kind k);
/* What `name` is among the header names tokentap reads (HDR_OTHER: none). */
enum hdr_kind reqhead_kind_of(const char *name, size_t len);
/* True for a hop-by-hop header: the fixed list, or a name the Connection
 * header lists. Such headers are not forwarded. */
bool reqhead_hop_by_hop(const struct reqhead *h, const char *name, size_t len);
/* The same of the head's field i, its kind known. */
bool reqhead_field_hop_by_hop(const struct reqhead *h, unsigned i);

void reqparse_init(struct reqparse *rp, const struct reqparse_hooks *hooks, void *arg);
/* Parses `buf`; *used is how much of it was taken. After REFUSED or
 * STOPPED the parser is not fed again. */
enum reqparse_status reqparse_feed(struct reqparse *rp, const char *buf, size_t len, size_t *used)
	__attribute__((warn_unused_result));
/* The next request may parse (after REQPARSE_PAUSED). */
void reqparse_resume(struct reqparse *rp);
/* After REQPARSE_REFUSED: the status to answer with (400, 413, 414, 417,
 * 431 or 501), and the reason for the client in `msg`. */
int reqparse_refusal(const struct reqparse *rp, char *msg, size_t msglen);
