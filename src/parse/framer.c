/*
 * framer.c — splits a streamed response body into SSE events or NDJSON lines.
 *
 * The framer sees the body as the socket delivered it, cut anywhere: inside
 * a line, between the CR and the LF of a CRLF, inside a UTF-8 sequence. It
 * keeps exactly one buffer per stream, laid out as
 *
 *	buf: [ event name | joined data | partial line ]
 *	       name_len     data_len      len - name_len - data_len
 *
 * so that an event is handed to the callback straight out of buf, with no
 * allocation per event. The usual event (one `data:` line and its blank
 * line, or one NDJSON line, whole in the slice being fed while nothing is
 * buffered) skips buf altogether and is handed out of the slice: see
 * frame_in_place(). Invariants:
 *
 *  - len <= cap <= max_event: the buffer never outgrows one event. Adding a
 *    byte that would break this drops the event (counted in `oversized`);
 *    an SSE framer then ignores lines up to the next blank line, an NDJSON
 *    framer up to the next LF.
 *  - SSE follows the WHATWG event-stream rules: a line ends at CRLF, LF or
 *    CR; `after_cr` remembers a CR that ended the previous feed so that a LF
 *    opening the next feed is not read as a second, blank line.
 *  - Comment lines (SSE, leading ':') are never buffered, so keep-alive or
 *    padding comments of any length cost nothing and are never oversized.
 *  - NDJSON lines end at LF only; one trailing CR is stripped; lines of
 *    JSON whitespace only are not events.
 *  - An event stream is framed by eventstream.c; buf then only ever holds
 *    the decoded bytes of one InvokeModel chunk (chunk_data), so it stays
 *    within max_event too.
 */
#include "framer.h"

#include <stdlib.h>
#include <string.h>

/* What the framer does with the bytes of the current line. */
enum line_state {
	LINE_START = 0, /* no byte of this line seen yet (a LF here ends a blank line) */
	LINE_STORE,	/* bytes go to the partial line in buf */
	LINE_DROP,	/* bytes are dropped up to the end of the line */
};

#define FRAMER_DEFAULT_MAX (1u << 20)
#define FRAMER_FIRST_CAP 512u

static void on_evs_message(void *arg, const struct evs_message *m);

void framer_init(struct framer *f, enum framer_kind kind, size_t max_event, framer_cb cb, void *arg)
{
	memset(f, 0, sizeof(*f));
	f->kind = kind;
	f->cb = cb;
	f->arg = arg;
	f->max_event = max_event ? max_event : FRAMER_DEFAULT_MAX;
	f->state = LINE_START;
	if (kind == FRAMER_EVENTSTREAM)
		evs_init(&f->evs, f->max_event, on_evs_message, f);
}

void framer_free(struct framer *f)
{
	evs_free(&f->evs);
	free(f->buf);
	f->buf = NULL;
	f->len = f->cap = 0;
	f->name_len = f->data_len = 0;
	f->has_data = 0;
}

/* Makes room for `need` bytes in buf. Fails, without touching buf, when
 * `need` is over max_event or memory is short: both are treated as an
 * oversized event by the caller. Growth doubles, so a stream reaches its
 * largest event size in a handful of reallocs and then never again. */
static int framer_reserve(struct framer *f, size_t need)
{
	if (need <= f->cap)
		return 0;
	if (need > f->max_event)
		return -1;
	size_t cap = f->cap ? f->cap : FRAMER_FIRST_CAP;
	while (cap < need)
		cap = cap > f->max_event / 2 ? f->max_event : cap * 2;
	if (cap > f->max_event)
		cap = f->max_event;
	char *nb = realloc(f->buf, cap);
	if (nb == NULL)
		return -1;
	f->buf = nb;
	f->cap = cap;
	return 0;
}

static void framer_reset_event(struct framer *f)
{
	f->len = f->name_len = f->data_len = 0;
	f->has_data = 0;
}

/* The event in progress does not fit: forget it and drop bytes until the
 * next boundary. Counted once per dropped event. */
static void framer_drop_event(struct framer *f)
{
	f->oversized++;
	framer_reset_event(f);
	f->state = LINE_DROP;
	if (f->kind == FRAMER_SSE)
		f->skip = 1;
}

static void framer_emit(struct framer *f, const char *name, size_t name_len, const char *data, size_t data_len)
{
	struct framer_event ev = {
		.name = name_len ? name : NULL,
		.name_len = name_len,
		.data = data ? data : "",
		.data_len = data_len,
	};
	f->events++;
	if (f->cb)
		f->cb(f->arg, &ev);
}

/* Appends bytes of the current line (no line end among them). */
static void framer_line_append(struct framer *f, const char *s, size_t n)
{
	switch (f->state) {
	case LINE_DROP: return;
	case LINE_START:
		/* SSE comments and the lines of a dropped event are never stored:
		 * only whether the line is blank matters for them. */
		if (f->kind == FRAMER_SSE && (f->skip || s[0] == ':')) {
			f->state = LINE_DROP;
			return;
		}
		f->state = LINE_STORE;
		/* fall through */
	case LINE_STORE:
		if (framer_reserve(f, f->len + n) == -1) {
			framer_drop_event(f);
			return;
		}
		memcpy(f->buf + f->len, s, n);
		f->len += n;
		return;
	}
}

static void reverse_bytes(char *p, size_t n)
{
	for (size_t i = 0, j = n; i + 1 < j; i++, j--) {
		char c = p[i];
		p[i] = p[j - 1];
		p[j - 1] = c;
	}
}

/* Interprets the complete SSE line stored after the data. Only `data` and
 * `event` matter to tokentap; `id`, `retry` and unknown fields are read and
 * forgotten, as the spec's dispatch does not depend on them. */
static void framer_sse_field(struct framer *f)
{
	size_t off = f->name_len + f->data_len;
	char *line = f->buf + off;
	size_t line_len = f->len - off;
	const char *colon = memchr(line, ':', line_len);
	size_t field_len = colon ? (size_t)(colon - line) : line_len;
	size_t voff = colon ? field_len + 1 : line_len;
	if (voff < line_len && line[voff] == ' ')
		voff++;
	size_t vlen = line_len - voff;

	if (field_len == 4 && memcmp(line, "data", 4) == 0) {
		/* The value moves left over its own field name: "data:" is at
		 * least 5 bytes, the '\n' separator needs 1, so it always fits. */
		if (f->has_data) {
			line[0] = '\n';
			memmove(line + 1, line + voff, vlen);
			f->data_len += 1 + vlen;
		} else {
			memmove(line, line + voff, vlen);
			f->data_len += vlen;
		}
		f->has_data = 1;
	} else if (field_len == 5 && memcmp(line, "event", 5) == 0) {
		/* Goal: [new name][data]. Usually `event:` precedes the data, so
		 * data_len is 0 and this is one memmove; otherwise rotate. */
		memmove(f->buf + off, line + voff, vlen);
		memmove(f->buf, f->buf + f->name_len, f->data_len + vlen);
		if (f->data_len) {
			reverse_bytes(f->buf, f->data_len);
			reverse_bytes(f->buf + f->data_len, vlen);
			reverse_bytes(f->buf, f->data_len + vlen);
		}
		f->name_len = vlen;
	}
	f->len = f->name_len + f->data_len;
}

static int is_json_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* An NDJSON line without its LF: an event without a trailing CR, unless it
 * is blank. */
static void ndjson_line(struct framer *f, const char *line, size_t n)
{
	if (n && line[n - 1] == '\r')
		n--;
	for (size_t i = 0; i < n; i++) {
		if (!is_json_space(line[i])) {
			framer_emit(f, NULL, 0, line, n);
			return;
		}
	}
}

/* A line end was reached (the terminator itself is not in buf). */
static void framer_line_end(struct framer *f)
{
	int state = f->state;
	f->state = LINE_START;

	if (f->kind == FRAMER_NDJSON) {
		if (state == LINE_STORE)
			ndjson_line(f, f->buf, f->len);
		f->len = 0;
		return;
	}

	if (state == LINE_START) {
		/* Blank line: the event boundary. */
		if (f->skip)
			f->skip = 0;
		else if (f->has_data)
			framer_emit(f, f->buf, f->name_len, f->buf ? f->buf + f->name_len : NULL, f->data_len);
		framer_reset_event(f);
	} else if (state == LINE_STORE) {
		framer_sse_field(f);
	}
}

/*
 * The common case, taken without touching buf: nothing is buffered and the
 * slice holds a whole event from p on. For SSE that is one `data:` line and
 * the blank line after it (LF LF or CRLF CRLF); for NDJSON one line. The
 * event is handed out from the slice itself, exactly as the general path
 * would have built it in buf, and the size bound is applied the same way (a
 * line the general path could not store is left to it, to be dropped).
 * `eol` is the line's first CR or LF. Returns where framing resumes, or NULL
 * to take the general path.
 */
static const char *frame_in_place(struct framer *f, const char *p, const char *eol, const char *end)
{
	size_t line_len = (size_t)(eol - p);

	if (line_len == 0 || line_len > f->max_event)
		return NULL;
	if (f->kind == FRAMER_NDJSON) {
		ndjson_line(f, p, line_len);
		return eol + 1;
	}
	const char *next;
	if (eol[0] == '\n' && end - eol >= 2 && eol[1] == '\n')
		next = eol + 2;
	else if (eol[0] == '\r' && end - eol >= 4 && memcmp(eol, "\r\n\r\n", 4) == 0)
		next = eol + 4;
	else
		return NULL;
	if (line_len < 5 || memcmp(p, "data:", 5) != 0)
		return NULL;
	const char *v = p + 5;
	if (v < eol && *v == ' ')
		v++;
	framer_emit(f, NULL, 0, v, (size_t)(eol - v));
	return next;
}

/* The first `c` in [p, end), or end. */
static const char *scan_to(const char *p, const char *end, char c)
{
	const char *q = memchr(p, c, (size_t)(end - p));
	return q ? q : end;
}

/* ---- the event stream (eventstream.h) ---------------------------------- */

static int b64_value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/*
 * The model's own JSON inside an InvokeModel `chunk`: the payload is
 * {"bytes":"<base64>"} (with, from Bedrock, a "p" member of padding), so the
 * string value of the first "bytes" key, base64-decoded into buf. A JSON
 * escape there can only be "\/" (base64 has no other character JSON
 * escapes); '=' ends the data. NULL when the payload holds no such string,
 * it is not base64, or its decoding does not fit max_event (counted as
 * oversized): the event then carries the payload as it came.
 */
static const char *chunk_data(struct framer *f, const char *p, size_t n, size_t *out_len)
{
	static const char key[] = "\"bytes\"";
	const size_t klen = sizeof(key) - 1;
	const char *end = p + n, *v = NULL;

	for (const char *q = p; (size_t)(end - q) >= klen; q++) {
		q = memchr(q, '"', (size_t)(end - q) - klen + 1);
		if (q == NULL)
			break;
		if (memcmp(q, key, klen) != 0)
			continue;
		v = q + klen;
		while (v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r'))
			v++;
		if (v < end && *v == ':') {
			v++;
			while (v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r'))
				v++;
			break;
		}
		v = NULL;
	}
	if (v == NULL || v >= end || *v != '"')
		return NULL;
	v++;
	/* decoded size: at most 3 bytes per 4 characters */
	const char *close = memchr(v, '"', (size_t)(end - v));
	if (close == NULL)
		return NULL;
	size_t need = ((size_t)(close - v) / 4 + 1) * 3;
	if (framer_reserve(f, need) == -1) {
		f->oversized++;
		return NULL;
	}
	uint32_t acc = 0;
	int bits = 0;
	size_t len = 0;
	bool pad = false;
	for (const char *q = v; q < close; q++) {
		unsigned char c = (unsigned char)*q;
		if (c == '\\' && q + 1 < close && q[1] == '/')
			c = *++q;
		if (c == '=') {
			pad = true;
			continue;
		}
		int d = b64_value(c);
		if (d < 0 || pad)
			return NULL;
		acc = acc << 6 | (uint32_t)d;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			f->buf[len++] = (char)(acc >> bits);
			acc &= (1u << bits) - 1;
		}
	}
	*out_len = len;
	return f->buf;
}

/* A checked message as an event: named by its event type, an exception's
 * by its exception type (an unmodelled error's by its code); a chunk's data
 * is the model's JSON when it decodes. Messages of no known type name
 * themselves by their event type as well. */
static void on_evs_message(void *arg, const struct evs_message *m)
{
	struct framer *f = arg;
	struct evs_str name = m->event_type;
	const char *data = m->payload;
	size_t len = m->payload_len;
	bool exception = false;

	if (m->type == EVS_MSG_EXCEPTION) {
		name = m->exception_type;
		exception = true;
	} else if (m->type == EVS_MSG_ERROR) {
		name = m->error_code;
		exception = true;
	} else if (m->type == EVS_MSG_EVENT && evs_str_is(m->event_type, "chunk")) {
		size_t n;
		const char *inner = chunk_data(f, m->payload, m->payload_len, &n);
		if (inner) {
			data = inner;
			len = n;
		}
	}
	struct framer_event ev = {
		.name = name.n ? name.p : NULL,
		.name_len = name.n,
		.data = data ? data : "",
		.data_len = len,
		.exception = exception,
	};
	f->events++;
	if (f->cb)
		f->cb(f->arg, &ev);
}

const char *framer_error(const struct framer *f)
{
	if (f->kind != FRAMER_EVENTSTREAM || f->evs.error == EVS_OK)
		return NULL;
	return evs_error_name(f->evs.error);
}

void framer_feed(struct framer *f, const char *buf, size_t len)
{
	if (f->kind == FRAMER_NONE || len == 0)
		return;
	if (f->kind == FRAMER_EVENTSTREAM) {
		uint64_t skipped = f->evs.oversized;
		evs_feed(&f->evs, buf, len);
		f->oversized += f->evs.oversized - skipped;
		return;
	}
	const char *p = buf;
	const char *end = buf + len;
	if (f->after_cr) {
		f->after_cr = 0;
		if (*p == '\n')
			p++;
	}
	/* Next LF and next CR, cached: a slice that only uses one terminator
	 * is still scanned once for the other, not once per line. NDJSON lines
	 * end at LF only. */
	const char *lf = scan_to(p, end, '\n');
	const char *cr = f->kind == FRAMER_SSE ? scan_to(p, end, '\r') : end;
	while (p < end) {
		if (lf < p)
			lf = scan_to(p, end, '\n');
		if (cr < p)
			cr = scan_to(p, end, '\r');
		const char *eol = cr < lf ? cr : lf;
		if (f->len == 0 && f->state == LINE_START && !f->has_data && !f->skip && eol != end) {
			const char *next = frame_in_place(f, p, eol, end);
			if (next) {
				p = next;
				continue;
			}
		}
		if (eol > p)
			framer_line_append(f, p, (size_t)(eol - p));
		if (eol == end)
			return;
		char term = *eol;
		p = eol + 1;
		framer_line_end(f);
		if (term == '\r') {
			if (p == end)
				f->after_cr = 1;
			else if (*p == '\n')
				p++;
		}
	}
}

void framer_finish(struct framer *f)
{
	if (f->kind == FRAMER_NONE)
		return;
	if (f->kind == FRAMER_EVENTSTREAM) {
		evs_finish(&f->evs);
		return;
	}
	f->after_cr = 0;
	if (f->kind == FRAMER_NDJSON) {
		framer_line_end(f);
	} else {
		if (f->state == LINE_STORE)
			framer_sse_field(f);
		if (!f->skip && f->has_data)
			framer_emit(f, f->buf, f->name_len, f->buf ? f->buf + f->name_len : NULL, f->data_len);
	}
	framer_reset_event(f);
	f->state = LINE_START;
	f->skip = 0;
}

/* Compares the media type of `ct` (before any ';' parameters, surrounding
 * blanks ignored) with a lowercase literal, case-insensitively. */
static int media_type_is(const char *ct, size_t len, const char *want)
{
	size_t i = 0;
	while (i < len && (ct[i] == ' ' || ct[i] == '\t'))
		i++;
	size_t j = i;
	while (j < len && ct[j] != ';')
		j++;
	while (j > i && (ct[j - 1] == ' ' || ct[j - 1] == '\t'))
		j--;
	size_t wl = strlen(want);
	if (j - i != wl)
		return 0;
	for (size_t k = 0; k < wl; k++) {
		char c = ct[i + k];
		if (c >= 'A' && c <= 'Z')
			c = (char)(c - 'A' + 'a');
		if (c != want[k])
			return 0;
	}
	return 1;
}

enum framer_kind framer_kind_for_content_type(const char *ct, size_t len)
{
	if (ct == NULL)
		return FRAMER_NONE;
	if (media_type_is(ct, len, "text/event-stream"))
		return FRAMER_SSE;
	if (media_type_is(ct, len, "application/x-ndjson") || media_type_is(ct, len, "application/jsonl"))
		return FRAMER_NDJSON;
	if (media_type_is(ct, len, "application/vnd.amazon.eventstream"))
		return FRAMER_EVENTSTREAM;
	return FRAMER_NONE;
}
