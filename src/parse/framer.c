/*
 * framer.c — splits a streamed response body into SSE events, NDJSON lines
 * or the elements of a JSON array.
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

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

/* What the framer does with the bytes of the current line. */
enum line_state {
	LINE_START = 0, /* no byte of this line seen yet (a LF here ends a blank line) */
	LINE_STORE,	/* bytes go to the partial line in buf */
	LINE_DROP,	/* bytes are dropped up to the end of the line */
};

/* Where a JSON array's scan is (f->jstate; "JSON array" below). */
enum json_state {
	J_TOP = 0, /* before a top-level value */
	J_ARRAY,   /* in the top-level array, between elements */
	J_ELEM,	   /* in an element */
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
	f->jstate = J_TOP;
	f->jflags = 0;
	f->jdepth = 0;
	free(f->shape);
	f->shape = NULL;
	f->shape_nholes = 0;
	f->cur = NULL;
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
		.run = 1,
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

/* Hands out an event framed in place whose wire bytes are [p, next): the
 * shape may be armed from it during the callback (framer_shape_arm). */
static void emit_in_place(struct framer *f, const char *p, const char *next, size_t line2, const char *name,
			  size_t name_len, const char *data, size_t data_len)
{
	f->cur = p;
	f->cur_len = (size_t)(next - p);
	f->cur_line2 = line2;
	framer_emit(f, name, name_len, data, data_len);
	f->cur = NULL;
}

/* The value of the field `field` (with its colon) that opens [p, eol), one
 * leading blank dropped, or NULL when the line is another field. */
static const char *field_value(const char *p, const char *eol, const char *field, size_t flen)
{
	if ((size_t)(eol - p) < flen || memcmp(p, field, flen) != 0)
		return NULL;
	const char *v = p + flen;
	if (v < eol && *v == ' ')
		v++;
	return v;
}

/*
 * The common cases, taken without touching buf: nothing is buffered and the
 * slice holds a whole event from p on. For SSE that is one `data:` line and
 * the blank line after it (LF LF or CRLF CRLF), or an `event:` line, one
 * `data:` line and a blank line, all ending in LF; for NDJSON one line. The
 * event is handed out from the slice itself, exactly as the general path
 * would have built it in buf, and the size bound is applied the same way (a
 * line the general path could not store is left to it, to be dropped).
 * `eol` is the line's first CR or LF, `cr` the first CR at or after p (end
 * when none). Returns where framing resumes, or NULL to take the general
 * path.
 */
static const char *frame_in_place(struct framer *f, const char *p, const char *eol, const char *cr, const char *end)
{
	size_t line_len = (size_t)(eol - p);

	if (line_len == 0 || line_len > f->max_event)
		return NULL;
	if (f->kind == FRAMER_NDJSON) {
		ndjson_line(f, p, line_len);
		return eol + 1;
	}
	const char *next;
	const char *v = field_value(p, eol, "data:", 5);
	if (v == NULL) {
		/* `event: NAME` LF `data: DATA` LF LF: the general path would keep
		 * the name, then the data line behind it (both within max_event),
		 * and emit at the blank line */
		const char *name = field_value(p, eol, "event:", 6);
		if (name == NULL || *eol != '\n')
			return NULL;
		const char *l2 = eol + 1;
		const char *e2 = memchr(l2, '\n', (size_t)(end - l2));
		if (e2 == NULL || cr < e2 || end - e2 < 2 || e2[1] != '\n')
			return NULL;
		size_t name_len = (size_t)(eol - name);
		if (name_len + (size_t)(e2 - l2) > f->max_event)
			return NULL;
		const char *d = field_value(l2, e2, "data:", 5);
		if (d == NULL || e2 == l2)
			return NULL;
		emit_in_place(f, p, e2 + 2, (size_t)(l2 - p), name, name_len, d, (size_t)(e2 - d));
		return e2 + 2;
	}
	if (eol[0] == '\n' && end - eol >= 2 && eol[1] == '\n')
		next = eol + 2;
	else if (eol[0] == '\r' && end - eol >= 4 && memcmp(eol, "\r\n\r\n", 4) == 0)
		next = eol + 4;
	else
		return NULL;
	if (next == eol + 2)
		emit_in_place(f, p, next, 0, NULL, 0, v, (size_t)(eol - v));
	else
		framer_emit(f, NULL, 0, v, (size_t)(eol - v));
	return next;
}

/* ---- same-shape events (framer.h) ----------------------------------------
 *
 * The shape is the wire bytes of an event framed in place, LF-terminated:
 * `[event: NAME LF] data: DATA LF LF`. A match compares the bytes between
 * the holes with the shape's and checks each hole's bytes against its
 * kind; the data line then ends at the shape's final LF LF, since no hole
 * holds a CR or LF (an escape of one included) and no other byte differs.
 * So the line-by-line path would frame the same name and data from the
 * same bytes: the same lines (the bound on their lengths is checked as
 * there), the same field names, the same blank line.
 */

/* What a byte is inside a string hole: 0 a key name's, 1 another, 2 not
 * allowed, 4 the '"' that ends it. */
static const unsigned char hole_class[256] = {
	[0 ... 9] = 1,	 ['\n'] = 2,	  [11 ... 12] = 1, ['\r'] = 2, [14 ... 33] = 1, ['"'] = 4, [35 ... 44] = 1,
	[46 ... 47] = 1, [58 ... 64] = 1, [91] = 1,	   ['\\'] = 2, [93 ... 94] = 1, [96] = 1,  [123 ... 255] = 1,
};

/* An escape in a string hole: '\\' and a byte that is not CR or LF
 * ('"' included: the hole then goes on past it, framer.h). */
static inline bool escape_holds(char c)
{
	return c != '\r' && c != '\n';
}

/* The bytes of a string hole after its last escaped '"' (from `from`,
 * `quoted` when there is one), up to its end `e`: none after a '"', or
 * some byte no key name has ('\\' being one), so that no quoted key
 * name starts inside the hole (framer.h). */
static bool tail_holds(const char *from, const char *e, bool quoted)
{
	if (from == e)
		return quoted;
	unsigned c = 0;
	for (const char *b = from; b < e; b++)
		c |= hole_class[(unsigned char)*b];
	return (c & 3) != 0;
}

static bool hole_holds(const struct framer_hole *h, const char *p, size_t n)
{
	if (h->kind == FRAMER_HOLE_DIGITS) {
		for (size_t i = 0; i < n; i++)
			if (p[i] < '0' || p[i] > '9')
				return false;
		return n > 0;
	}
	size_t from = 0;
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '\\') {
			if (i + 1 >= n || !escape_holds(p[i + 1]))
				return false;
			if (p[++i] == '"')
				from = i + 1;
			continue;
		}
		if (hole_class[(unsigned char)p[i]] & 6)
			return false;
	}
	return n > 0 && tail_holds(p + from, p + n, from > 0);
}

bool framer_shape_arm(struct framer *f, const struct framer_hole *holes, size_t n, uint64_t tag)
{
	struct framer_hole hs[FRAMER_SHAPE_HOLES];

	if (f->cur == NULL || f->cur_len > FRAMER_SHAPE_MAX || n == 0 || n > FRAMER_SHAPE_HOLES)
		return false;
	/* the data sits after `data:` and one blank on the data line */
	const char *data = f->cur + f->cur_line2 + 5;
	if (*data == ' ')
		data++;
	size_t data_off = (size_t)(data - f->cur);
	size_t data_len = f->cur_len - data_off - 2;
	uint32_t at = 0;
	for (size_t i = 0; i < n; i++) {
		const struct framer_hole *h = &holes[i];
		if (h->off < at || h->off > data_len || h->len > data_len - h->off ||
		    !hole_holds(h, data + h->off, h->len))
			return false;
		if (h->kind == FRAMER_HOLE_STRING && (h->off + h->len >= data_len || data[h->off + h->len] != '"'))
			return false;
		if (h->kind != FRAMER_HOLE_STRING && h->kind != FRAMER_HOLE_DIGITS)
			return false;
		if (h->kind == FRAMER_HOLE_STRING && i + 1 < n)
			return false; /* a string hole comes last */
		hs[i] = (struct framer_hole){ (uint32_t)(data_off + h->off), h->len, h->kind };
		at = h->off + h->len;
	}
	if (f->shape == NULL && (f->shape = malloc(FRAMER_SHAPE_MAX)) == NULL)
		return false;
	memcpy(f->shape_holes, hs, n * sizeof(hs[0]));
	memcpy(f->shape, f->cur, f->cur_len);
	f->shape_len = (uint32_t)f->cur_len;
	f->shape_line2 = (uint32_t)f->cur_line2;
	f->shape_name_len = f->cur_line2 ? (uint32_t)(f->cur_line2 - 1 - (f->cur[6] == ' ' ? 7 : 6)) : 0;
	f->shape_data_off = (uint32_t)data_off;
	const struct framer_hole *lh = &f->shape_holes[n - 1];
	f->shape_min = f->shape_len - (lh->kind == FRAMER_HOLE_STRING ? lh->len - 1 : 0);
	/* the in-place framing this event passed: name + data line within
	 * max_event, the data line being the wire bytes after shape_line2
	 * but its LF LF */
	f->shape_max = f->max_event + f->shape_line2 + 2 - f->shape_name_len;
	f->shape_nholes = (uint8_t)n;
	f->shape_one_string = n == 1 && lh->kind == FRAMER_HOLE_STRING;
	f->shape_tag = tag;
	return true;
}

void framer_shape_clear(struct framer *f)
{
	f->shape_nholes = 0;
}

/* Eight bytes at a time: the lowest byte of x that is zero is flagged
 * exactly (a flag above it may be false: the borrow), as is the lowest
 * byte below `n` (below 0x80). */
#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
static inline uint64_t zero_bytes(uint64_t x)
{
	return (x - ONES) & ~x & HIGHS;
}

static inline uint64_t bytes_below(uint64_t x, unsigned n)
{
	return (x - ONES * n) & ~x & HIGHS;
}

/* Where the string hole starting at q ends (its '"', before lim), or NULL
 * when its bytes do not hold (hole_holds). Eight bytes at a time while
 * eight can be read before end (the shape's rest lies between lim and
 * end, so a read past lim is still the slice's), else byte by byte, up to
 * the next '"', '\\' or control byte below 14 (CR, LF; the others are
 * turned away too, which only costs a match): a '"' ends the hole, an
 * escape is stepped over, an escaped '"' too, the bytes after the last
 * one being those tail_holds() asks about. Whether a byte is not a key
 * name's is asked of hole_class, of the first byte first (a blank, in
 * most text). */
static const char *string_hole_slow(const char *q, const char *lim, const char *end)
{
	const char *s = q, *from = q;
	for (;;) {
		while (end - q >= 8) {
			uint64_t x;
			memcpy(&x, q, 8);
			uint64_t stop =
				zero_bytes(x ^ (ONES * '"')) | zero_bytes(x ^ (ONES * '\\')) | bytes_below(x, 14);
			if (stop) {
				q += (unsigned)__builtin_ctzll(stop) >> 3;
				goto special;
			}
			q += 8;
		}
		while (q < lim && !(hole_class[(unsigned char)*q] & 6))
			q++;
	special:
		if (q >= lim)
			return NULL;
		if (*q == '"')
			break;
		if (*q != '\\' || lim - q < 2 || !escape_holds(q[1]))
			return NULL;
		q += 2;
		if (q[-1] == '"')
			from = q;
	}
	if (q == s)
		return NULL;
	if (from < q && (hole_class[(unsigned char)*from] == 1 || *from == '\\'))
		return q;
	return tail_holds(from, q, from > s) ? q : NULL;
}

/* string_hole_slow() for the usual hole, a short text that starts with a
 * byte no key name has (a blank): its '"' in the first sixteen bytes, no
 * escape before it. Anything else is asked of string_hole_slow(), which
 * answers the same for these. */
static inline const char *string_hole_end(const char *q, const char *lim, const char *end)
{
#if defined(__x86_64__) && defined(__SSE2__)
	/* the same test of sixteen bytes at once: '"', '\\', or at most 13 */
	if (end - q >= 16 && hole_class[(unsigned char)*q] == 1) {
		__m128i x = _mm_loadu_si128((const __m128i *)(const void *)q);
		__m128i stop = _mm_or_si128(
			_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('"')), _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'))),
			_mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(13)), x));
		unsigned m = (unsigned)_mm_movemask_epi8(stop);
		if (m) {
			const char *e = q + __builtin_ctz(m);
			if (e < lim && *e == '"')
				return e;
		}
	}
#else
	if (end - q >= 16 && hole_class[(unsigned char)*q] == 1) {
		for (const char *w = q; w < q + 16; w += 8) {
			uint64_t x;
			memcpy(&x, w, 8);
			uint64_t stop =
				zero_bytes(x ^ (ONES * '"')) | zero_bytes(x ^ (ONES * '\\')) | bytes_below(x, 14);
			if (stop) {
				const char *e = w + ((unsigned)__builtin_ctzll(stop) >> 3);
				if (e < lim && *e == '"')
					return e;
				break;
			}
		}
	}
#endif
	return string_hole_slow(q, lim, end);
}

/* The n bytes at q (all before end) are ASCII digits: up to eight in one
 * word when eight can be read, as a byte out of '0'..'9' sets its own high
 * bit in (x - '0') | (x + 0x46) | x (a borrow or carry only ever starts at
 * such a byte, and runs upwards). */
static inline bool digits_hold(const char *q, const char *end, uint32_t n)
{
	if (n <= 8 && end - q >= 8) {
		uint64_t x;
		memcpy(&x, q, 8);
		uint64_t bad = ((x - ONES * '0') | (x + ONES * 0x46) | x) & HIGHS;
		return n > 0 && (n == 8 ? bad : bad & ((1ull << (8 * n)) - 1)) == 0;
	}
	for (uint32_t k = 0; k < n; k++)
		if (q[k] < '0' || q[k] > '9')
			return false;
	return n > 0;
}

/* The same-shape event whose wire bytes are [p, q), into *ev. */
static inline void shape_event(const struct framer *f, const char *p, const char *q, struct framer_event *ev)
{
	const char *data = p + f->shape_data_off;
	*ev = (struct framer_event){
		.name = f->shape_name_len ? p + f->shape_line2 - 1 - f->shape_name_len : NULL,
		.name_len = f->shape_name_len,
		.data = data,
		.data_len = (size_t)(q - 2 - data),
		.same_shape = true,
		.run = 1,
	};
}

/* The event at p, when it is the shape's: where framing resumes, NULL
 * when it is not (or is not whole in the slice). shape_match also makes
 * it *ev, not yet handed out. */
static inline const char *shape_end(const struct framer *f, const char *p, const char *end)
{
	const char *t = f->shape;
	const char *q = p;
	uint32_t toff = 0;

	/* the shortest event of the shape (its string hole one byte) fits:
	 * every literal before the string hole and every digits hole does */
	if ((size_t)(end - p) < f->shape_min)
		return NULL;
	size_t last = f->shape_nholes - 1u;
	for (size_t i = 0; i < last; i++) {
		const struct framer_hole *h = &f->shape_holes[i];
		if (memcmp(q, t + toff, h->off - toff) != 0)
			return NULL;
		q += h->off - toff;
		if (!digits_hold(q, end, h->len))
			return NULL;
		q += h->len;
		toff = h->off + h->len;
	}
	const struct framer_hole *h = &f->shape_holes[last];
	if (memcmp(q, t + toff, h->off - toff) != 0)
		return NULL;
	q += h->off - toff;
	size_t rest = f->shape_len - h->off - h->len; /* after the hole: from the '"' on, for a string */
	if (h->kind == FRAMER_HOLE_STRING) {
		/* the string ends at its '"', leaving room for the rest */
		if ((size_t)(end - q) <= rest)
			return NULL;
		q = string_hole_end(q, end - rest + 1, end);
		if (q == NULL)
			return NULL;
	} else {
		if (!digits_hold(q, end, h->len))
			return NULL;
		q += h->len;
	}
	if (memcmp(q, t + h->off + h->len, rest) != 0)
		return NULL;
	q += rest;
	/* the bounds the line-by-line path applies: the data line, and for a
	 * named event the name and the data line together (shape_max) */
	if ((size_t)(q - p) > f->shape_max)
		return NULL;
	return q;
}

static const char *shape_match(struct framer *f, const char *p, const char *end, struct framer_event *ev)
{
	const char *q = shape_end(f, p, end);

	if (q)
		shape_event(f, p, q, ev);
	return q;
}

/* Events of any armed shape from p on, joined to *run (runs only: nothing
 * is handed out meanwhile, so the shape holds). Where they stop. */
static inline const char *run_shape(const struct framer *f, const char *p, const char *end, struct framer_event *run)
{
	const char *q;

	while (p < end && (q = shape_end(f, p, end)) != NULL) {
		if (run->run++ == 0)
			shape_event(f, p, q, run);
		p = q;
	}
	return p;
}

/* The usual shape, one string hole (chat completions, Anthropic's
 * deltas), as run_one_string() reads it: taken once per feed, as the
 * shape holds while runs are matched (nothing is handed out meanwhile). */
struct one_string {
	const char *shape;
	size_t off, tail, rest; /* the hole's offset and end, the bytes after it */
	size_t min, max;	/* shape_min, shape_max */
};

/* o->shape NULL: the armed shape is another (run_shape). */
static inline void one_string_of(const struct framer *f, struct one_string *o)
{
	if (!f->shape_one_string) {
		o->shape = NULL;
		return;
	}
	o->shape = f->shape;
	o->off = f->shape_holes[0].off;
	o->tail = o->off + f->shape_holes[0].len;
	o->rest = f->shape_len - o->tail;
	o->min = f->shape_min;
	o->max = f->shape_max;
}

/* shape_match's steps for the usual shape alone, over the events of the
 * shape from p on, joined to *run. Where they stop. The shortest event of
 * the shape fitting leaves room for the '"' and the rest after the hole. */
static inline __attribute__((always_inline)) const char *run_one_string(const struct framer *f,
									const struct one_string *o, const char *p,
									const char *end, struct framer_event *run)
{
	while ((size_t)(end - p) >= o->min && memcmp(p, o->shape, o->off) == 0) {
		const char *q = string_hole_end(p + o->off, end - o->rest + 1, end);
		if (q == NULL || memcmp(q, o->shape + o->tail, o->rest) != 0)
			break;
		q += o->rest;
		if ((size_t)(q - p) > o->max)
			break;
		if (run->run++ == 0)
			shape_event(f, p, q, run);
		p = q;
	}
	return p;
}

/* Hands out `ev` (ev->run events). */
static void emit_shaped(struct framer *f, struct framer_event *ev)
{
	f->events += ev->run;
	if (f->cb)
		f->cb(f->arg, ev);
}

/* The first `c` in [p, end), or end. */
static const char *scan_to(const char *p, const char *end, char c)
{
	const char *q = memchr(p, c, (size_t)(end - p));
	return q ? q : end;
}

/* ---- JSON array ---------------------------------------------------------
 *
 * Gemini's :streamGenerateContent without ?alt=sse answers one JSON array,
 * written as the model goes: `[{...}` then `,\r\n{...}` per chunk, then
 * `]`. Each element is an event. The scan tracks only what it takes to
 * find where an element ends: whether it is inside a string (and after a
 * backslash there) and how many brackets are open; brackets are counted,
 * not matched, as the framer does not validate. Invariants:
 *
 *  - An element that completes inside one slice, with nothing buffered, is
 *    handed out of the slice (no copy); one that spans slices is kept in buf,
 *    which never grows past max_event: a longer element is dropped (counted
 *    once in `oversized`) and its bytes skipped to its end.
 *  - Outside an element only blanks, ',' and the array's brackets are
 *    consumed (a stray ',' or ']' at the top too: no element starts with
 *    one). A top-level value that is not an array (the JSON error object
 *    a server sends instead of the stream) is one element itself; after the
 *    array closes the scan starts over, so nothing later is lost either.
 *  - A string or number at the top level is an element too: it is framed
 *    the same way, and the classifier turns it away (not an object).
 */

/* The element's flags (f->jflags). */
#define JF_FIRST 1u   /* its first byte is next: it decides what it is */
#define JF_STRING 2u  /* inside a string */
#define JF_ESCAPE 4u  /* right after a backslash in a string */
#define JF_SCALAR 8u  /* a number or literal: ends at a blank, ',' or a bracket */
#define JF_TOPVAL 16u /* a top-level value, not an array's element */
#define JF_DROP 32u   /* over max_event: skipped to its end, not delivered */

/* The backslashes right before q, counted back to `from` at most. */
static size_t backslashes_before(const char *from, const char *q)
{
	size_t n = 0;
	while (q - n > from && q[-(ptrdiff_t)n - 1] == '\\')
		n++;
	return n;
}

/* Where the element ends in [p, end): one past its last byte, or NULL when
 * it goes on past end. A scalar's end is the byte that ends it, which is
 * not its own. Inside a string the next '"' is found with memchr and is the
 * string's end unless an odd run of backslashes precedes it; the run is
 * counted back to where this feed's scan of the string began (a run the
 * last feed ended in is settled by JF_ESCAPE: an odd one escapes p[0]). The
 * state lives in locals while the scan runs. */
static const char *json_elem_scan(struct framer *f, const char *p, const char *end)
{
	unsigned fl = (unsigned)f->jflags;
	uint64_t depth = f->jdepth;
	const char *ret = NULL;

	if (fl & JF_FIRST) {
		char c = *p++;
		fl &= ~JF_FIRST;
		if (c == '{' || c == '[')
			depth = 1;
		else if (c == '"')
			fl |= JF_STRING;
		else
			fl |= JF_SCALAR;
	}
	if ((fl & JF_ESCAPE) && p < end) {
		fl &= ~JF_ESCAPE;
		p++;
	}
	while (p < end) {
		if (fl & JF_STRING) {
			const char *from = p;
			const char *q = memchr(p, '"', (size_t)(end - p));
			while (q != NULL && (backslashes_before(from, q) & 1))
				q = memchr(q + 1, '"', (size_t)(end - q - 1)); /* an escaped quote */
			if (q == NULL) {
				if (backslashes_before(from, end) & 1)
					fl |= JF_ESCAPE;
				p = end;
				break;
			}
			fl &= ~JF_STRING;
			p = q + 1;
			if (depth == 0) {
				ret = p; /* a string element */
				break;
			}
			continue;
		}
		char c = *p;
		if (fl & JF_SCALAR) {
			if (is_json_space(c) || c == ',' || c == ']' || c == '}' || c == '[' || c == '{' || c == '"') {
				ret = p;
				break;
			}
			p++;
			continue;
		}
		p++;
		if (c == '"') {
			fl |= JF_STRING;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if ((c == '}' || c == ']') && --depth == 0) {
			ret = p;
			break;
		}
	}
	f->jflags = (int)fl;
	f->jdepth = depth;
	return ret;
}

/* Keeps bytes of an element that goes on in the next feed. */
static void json_store(struct framer *f, const char *s, size_t n)
{
	if (f->jflags & JF_DROP)
		return;
	if (framer_reserve(f, f->len + n) == -1) {
		f->oversized++;
		f->len = 0;
		f->jflags |= JF_DROP;
		return;
	}
	memcpy(f->buf + f->len, s, n);
	f->len += n;
}

/* The element ended with the bytes [s, s+n) of this feed. */
static void json_elem_done(struct framer *f, const char *s, size_t n)
{
	if (f->len == 0 && !(f->jflags & JF_DROP)) {
		if (n > f->max_event)
			f->oversized++;
		else
			framer_emit(f, NULL, 0, s, n);
	} else {
		json_store(f, s, n);
		if (!(f->jflags & JF_DROP))
			framer_emit(f, NULL, 0, f->buf, f->len);
	}
	f->len = 0;
	f->jstate = (f->jflags & JF_TOPVAL) ? J_TOP : J_ARRAY;
	f->jflags = 0;
	f->jdepth = 0;
}

static void json_feed(struct framer *f, const char *p, const char *end)
{
	while (p < end) {
		if (f->jstate == J_ELEM) {
			const char *e = json_elem_scan(f, p, end);
			if (e == NULL) {
				json_store(f, p, (size_t)(end - p));
				return;
			}
			json_elem_done(f, p, (size_t)(e - p));
			p = e;
			continue;
		}
		char c = *p;
		if (is_json_space(c) || c == ',') {
			p++;
		} else if (c == ']') {
			f->jstate = J_TOP; /* the array's end; at the top, a stray one */
			p++;
		} else if (f->jstate == J_TOP && c == '[') {
			f->jstate = J_ARRAY;
			p++;
		} else {
			f->jflags = JF_FIRST | (f->jstate == J_TOP ? JF_TOPVAL : 0u);
			f->jdepth = 0;
			f->jstate = J_ELEM;
		}
	}
}

/* The body ended: a scalar being read is whole; anything else cut is not
 * an element. */
static void json_finish(struct framer *f)
{
	if (f->jstate == J_ELEM && (f->jflags & JF_SCALAR) && !(f->jflags & JF_DROP) && f->len)
		framer_emit(f, NULL, 0, f->buf, f->len);
	f->len = 0;
	f->jstate = J_TOP;
	f->jflags = 0;
	f->jdepth = 0;
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
		.run = 1,
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

static void feed_lines(struct framer *f, const char *buf, size_t len, struct framer_event *run);

/* Hands out the run of same-shape events matched so far, if any. */
static void run_flush(struct framer *f, struct framer_event *run)
{
	if (run->run) {
		emit_shaped(f, run);
		run->run = 0;
	}
}

/* A same-shape event matched: handed out now, or with `runs` joined to the
 * run, which is handed out before any other event is framed. */
static void run_add(struct framer *f, struct framer_event *run, struct framer_event *ev)
{
	if (!f->runs)
		emit_shaped(f, ev);
	else if (run->run++ == 0)
		*run = *ev; /* run 1 */
}

/* Events of the armed shape are taken first, as long as they come, with
 * nothing buffered (an armed shape means an SSE framer); the line-by-line
 * path takes what is left. With `runs`, the events matched in a row are
 * handed out once the row ends (*run keeps it across slices), before any
 * event framed after them. */
static void feed_slice(struct framer *f, const char *buf, size_t len, struct framer_event *run)
{
	if (f->shape_nholes && f->len == 0 && f->state == LINE_START && !f->has_data && !f->skip && !f->after_cr) {
		const char *end = buf + len;
		const char *next;
		struct framer_event ev;
		if (f->shape_one_string && f->runs) {
			struct one_string o = { .shape = NULL };
			one_string_of(f, &o);
			buf = run_one_string(f, &o, buf, end, run);
		} else if (f->runs) {
			buf = run_shape(f, buf, end, run);
		} else {
			while (buf < end && f->shape_nholes && (next = shape_match(f, buf, end, &ev)) != NULL) {
				buf = next;
				run_add(f, run, &ev);
			}
		}
		len = (size_t)(end - buf);
	}
	if (len)
		feed_lines(f, buf, len, run);
}

/* Nothing buffered, an armed shape, and runs. */
static inline bool usual_run(const struct framer *f)
{
	return f->runs && f->shape_nholes && f->len == 0 && f->state == LINE_START && !f->has_data && !f->skip &&
	       !f->after_cr;
}

void framer_feed(struct framer *f, const char *buf, size_t len)
{
	struct framer_event run = { .run = 0 };

	feed_slice(f, buf, len, &run);
	run_flush(f, &run);
}

void framer_feed_v(struct framer *f, const struct framer_slice *v, size_t n)
{
	struct framer_event run = { .run = 0 };

	/* feed_slice's first loop, for the usual shape, with runs: what it
	 * asks of the framer's state holds until feed_slice runs */
	struct one_string o = { .shape = NULL };
	bool fast = usual_run(f);
	if (fast)
		one_string_of(f, &o);
	for (size_t i = 0; i < n; i++) {
		const char *p = v[i].at, *end = p + v[i].len;
		if (fast && (p = o.shape ? run_one_string(f, &o, p, end, &run) : run_shape(f, p, end, &run)) == end)
			continue;
		feed_slice(f, p, (size_t)(end - p), &run);
		if ((fast = usual_run(f)))
			one_string_of(f, &o);
	}
	run_flush(f, &run);
}

static __attribute__((noinline)) void feed_lines(struct framer *f, const char *buf, size_t len,
						 struct framer_event *run)
{
	if (f->kind == FRAMER_NONE || len == 0)
		return;
	if (f->kind == FRAMER_JSON_ARRAY) {
		json_feed(f, buf, buf + len);
		return;
	}
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
	 * end at LF only. Neither is looked for while events match the shape. */
	const char *lf = NULL;
	const char *cr = f->kind == FRAMER_SSE ? NULL : end;
	while (p < end) {
		bool fresh = f->len == 0 && f->state == LINE_START && !f->has_data && !f->skip;
		if (fresh && f->shape_nholes) {
			struct framer_event ev;
			const char *next = shape_match(f, p, end, &ev);
			if (next) {
				run_add(f, run, &ev);
				p = next;
				continue;
			}
		}
		run_flush(f, run);
		if (lf == NULL || lf < p)
			lf = scan_to(p, end, '\n');
		if (cr == NULL || cr < p)
			cr = scan_to(p, end, '\r');
		const char *eol = cr < lf ? cr : lf;
		if (fresh && eol != end) {
			const char *next = frame_in_place(f, p, eol, cr, end);
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
	if (f->kind == FRAMER_JSON_ARRAY) {
		json_finish(f);
		return;
	}
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
