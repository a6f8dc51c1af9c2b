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
	/* SSE only: the event matched the shape armed by framer_shape_arm():
	 * its bytes on the wire are that event's, except inside the holes,
	 * whose bytes keep to the holes' rules ("Same-shape events" below) */
	bool same_shape;
	/* how many events this call stands for: 1, but with the framer's
	 * `runs` set, same-shape events in a row of one framer_feed or
	 * framer_feed_v call come in one call, name and data being the
	 * first's (their holes differ; nothing else does) */
	size_t run;
};

/* Bytes to feed, several at once (framer_feed_v). */
struct framer_slice {
	const char *at;
	size_t len;
};

/*
 * Same-shape events. Most events of a stream are the event before with
 * other text in one string (and, in the Responses API, another sequence
 * number). While the callback runs for an event that was framed straight
 * out of the fed slice as `[event: NAME LF] data: DATA LF LF`, the caller
 * may arm that event as a shape, naming its holes in DATA: a later event
 * whose wire bytes are the shape's outside the holes, and inside them
 * bytes of the holes' kinds, is then framed by comparing those bytes
 * alone (no line search) and handed out with `same_shape` set. Framing
 * is the same either way: name and data are what the line-by-line path
 * would produce from the same bytes. What the caller concludes from
 * `same_shape` is its own business (classify_event_shaped).
 */
enum framer_hole_kind {
	/* the body of a JSON string, any length from 1: bytes that are not
	 * '"', '\\', CR or LF, and escapes, a '\\' and a byte that is not CR
	 * or LF ('"' included); it ends at the first '"' no escape takes,
	 * which the shape's next byte must be. After its last escaped '"'
	 * (from its start when it has none) the bytes are none, which needs
	 * a '"' before them, or hold one outside [A-Za-z0-9_-]: so no quoted
	 * key name starts inside the string and ends at its closing '"'
	 * (classify.c, "Same-shape events") */
	FRAMER_HOLE_STRING = 1,
	FRAMER_HOLE_DIGITS, /* as many ASCII digits as the shape's */
};

struct framer_hole {
	uint32_t off, len; /* in the event's data, as armed; in order, apart */
	uint8_t kind;	   /* enum framer_hole_kind */
};

#define FRAMER_SHAPE_HOLES 2
#define FRAMER_SHAPE_MAX 1024u /* a longer event is not armed */

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
	/* SSE only, "Same-shape events": the armed shape's wire bytes (NULL:
	 * none yet), holes in wire offsets, where its data line starts, its
	 * name's length, where its data starts; and, during a callback of an event framed in place,
	 * that event's wire bytes (cur NULL otherwise) */
	char *shape;
	uint32_t shape_len, shape_line2, shape_name_len, shape_data_off;
	uint32_t shape_min;    /* the shortest event of the shape: its string hole one byte */
	size_t shape_max;      /* the longest the line-by-line path takes whole (max_event) */
	uint8_t shape_nholes;  /* 0: not armed */
	bool shape_one_string; /* the usual shape: one hole, a string (framer.c, match_one_string) */
	struct framer_hole shape_holes[FRAMER_SHAPE_HOLES];
	uint64_t shape_tag; /* the caller's, kept with the shape */
	/* Set by the caller: same-shape events in a row come in one callback
	 * (framer_event.run), which must then not change the shape */
	bool runs;
	const char *cur;
	size_t cur_len, cur_line2;
	/* counters, readable by the caller */
	uint64_t events;
	uint64_t oversized;
};

/* Prepares `f`; allocates nothing until the first byte. `max_event` 0 means
 * 1 MiB. Call on a zeroed or freed framer (an old buffer would leak). */
void framer_init(struct framer *f, enum framer_kind kind, size_t max_event, framer_cb cb, void *arg);

/* Consumes `len` bytes; calls `cb` for every event they complete. */
void framer_feed(struct framer *f, const char *buf, size_t len);

/* framer_feed() of each slice in turn, the bytes following each other in
 * the stream; with `runs`, a run of same-shape events goes on across them. */
void framer_feed_v(struct framer *f, const struct framer_slice *v, size_t n);

/* End of body: an NDJSON line without a final newline is delivered; an SSE
 * event without its blank line is dispatched too (servers that close right
 * after the last `data:` line exist). A JSON array's element cut by the end
 * is not an element and is not delivered (a bare number or literal is). */
void framer_finish(struct framer *f);

/* Releases the buffer; safe on a zeroed or already-freed framer. */
void framer_free(struct framer *f);

/* Arms the event being delivered (call from the callback) as the shape,
 * with holes `holes[0..n)` in its data (in order, not overlapping, each
 * holding bytes of its kind, a string hole followed by '"' and last), and `tag`
 * kept beside it (framer_shape_tag). False, and the shape armed before (if
 * any) left as it was, when the
 * event was not framed in place, is longer than FRAMER_SHAPE_MAX, or the
 * holes do not hold. */
bool framer_shape_arm(struct framer *f, const struct framer_hole *holes, size_t n, uint64_t tag);

/* No shape: every event is framed line by line again. */
void framer_shape_clear(struct framer *f);

static inline uint64_t framer_shape_tag(const struct framer *f)
{
	return f->shape_tag;
}

/* Why the stream stopped being framed, NULL while it has not: only an
 * event stream can break so (eventstream.h: a bad CRC or length). */
const char *framer_error(const struct framer *f);

/* Picks the framer for a Content-Type header value (case-insensitive, with or
 * without parameters). */
enum framer_kind framer_kind_for_content_type(const char *ct, size_t len);
