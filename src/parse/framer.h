/*
 * framer.h — incremental event framer for streamed LLM responses.
 *
 * Splits a response body into events as bytes arrive: Server-Sent Events
 * (text/event-stream: `data:` lines, multi-line data, `event:` names,
 * comments, CRLF / LF / CR line ends) or NDJSON (application/x-ndjson, one
 * JSON value per line, as Ollama streams). The framer only parses: it is fed
 * whatever slices the socket produced, keeps the partial line between calls,
 * and calls back once per complete event. It never allocates per event: one
 * buffer per stream, grown at most to `max_event` bytes. An event larger than
 * that is dropped (counted in `oversized`) and framing resumes at the next
 * event boundary; the bytes themselves are forwarded by the caller untouched.
 *
 * A third framing, FRAMER_JSON_ARRAY, cuts a streamed JSON array (Gemini's
 * :streamGenerateContent without ?alt=sse) into its elements as they
 * complete; it is never picked from a Content-Type alone (the caller knows
 * the API), and it too is bounded by `max_event`.
 * AWS's binary event stream (application/vnd.amazon.eventstream) is framed
 * by eventstream.h behind the same interface: each message is an event
 * named by its `:event-type` (an exception's by its `:exception-type`), its
 * payload the data; a Bedrock InvokeModel `chunk` is handed out as the
 * model's own JSON, decoded from the base64 of its "bytes" member.
 */
#pragma once

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "eventstream.h"

enum framer_kind {
	FRAMER_NONE = 0, /* not a streamed body: feed is a no-op */
	FRAMER_SSE,
	FRAMER_NDJSON,
	FRAMER_JSON_ARRAY,  /* a top-level JSON array, one event per element (Gemini) */
	FRAMER_EVENTSTREAM, /* application/vnd.amazon.eventstream (eventstream.h) */
};

/* One complete event. Pointers are valid only during the callback; data is
 * not NUL-terminated (use data_len). */
struct framer_event {
	const char *name; /* SSE `event:` field, NULL when absent; NULL for NDJSON */
	size_t name_len;
	const char *data; /* SSE: data lines joined by '\n'; NDJSON: the line without its end;
			   * JSON array: the element's bytes */
	size_t data_len;
	/* event stream only: an exception or error message (`:message-type`
	 * exception or error), `name` being its type or code */
	bool exception;
};

typedef void (*framer_cb)(void *arg, const struct framer_event *ev);

struct framer {
	enum framer_kind kind;
	framer_cb cb;
	void *arg;
	size_t max_event;
	/* private: parse state. buf holds [event name][joined data][partial line]. */
	char *buf;
	size_t len, cap; /* len: bytes used in buf, all three parts together */
	size_t name_len; /* `event:` value, stored at buf[0] */
	size_t data_len; /* joined data, stored at buf[name_len] */
	int has_data;	 /* a `data` field was seen (its value may be empty) */
	int state;	 /* what the current line is doing: enum line_state in framer.c */
	int after_cr;	 /* SSE: the last feed ended in CR; a leading LF ends nothing */
	int skip;	 /* SSE: discarding the rest of an oversized event */
	/* FRAMER_JSON_ARRAY only (framer.c, "JSON array"): where the scan is */
	int jstate;	       /* enum json_state in framer.c */
	int jflags;	       /* the element's: JF_* in framer.c */
	uint64_t jdepth;       /* brackets open in the element */
	struct evs_framer evs; /* FRAMER_EVENTSTREAM: the message framer; buf then holds a decoded chunk */
	/* counters, readable by the caller */
	uint64_t events;
	uint64_t oversized;
};

/* Prepares `f`; allocates nothing until the first byte. `max_event` 0 means
 * 1 MiB. Call on a zeroed or freed framer (an old buffer would leak). */
void framer_init(struct framer *f, enum framer_kind kind, size_t max_event, framer_cb cb, void *arg);

/* Consumes `len` bytes; calls `cb` for every event they complete. */
void framer_feed(struct framer *f, const char *buf, size_t len);

/* End of body: an NDJSON line without a final newline is delivered; an SSE
 * event without its blank line is dispatched too (servers that close right
 * after the last `data:` line exist). A JSON array's element cut by the end
 * is not an element and is not delivered (a bare number or literal is). */
void framer_finish(struct framer *f);

/* Releases the buffer; safe on a zeroed or already-freed framer. */
void framer_free(struct framer *f);

/* Why the stream stopped being framed, NULL while it has not: only an
 * event stream can break so (eventstream.h: a bad CRC or length). */
const char *framer_error(const struct framer *f);

/* Picks the framer for a Content-Type header value (case-insensitive, with or
 * without parameters). */
enum framer_kind framer_kind_for_content_type(const char *ct, size_t len);
