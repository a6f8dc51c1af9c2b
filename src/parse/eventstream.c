/*
 * eventstream.c — the application/vnd.amazon.eventstream framer.
 *
 *   message: [ total u32 | headers_len u32 | prelude CRC u32 ]  prelude, 12 bytes
 *            [ headers: name_len u8, name, type u8, value ]*    headers_len bytes
 *            [ payload ]                                        total - headers_len - 16 bytes
 *            [ message CRC u32 ]                                CRC32 of all the bytes before it
 *
 * Two paths, the same checks. A message whole in the slice being fed while
 * nothing is held is checked and handed out of the slice (evs_parse). Any
 * other is gathered: the prelude into `prelude`, checked as soon as it is
 * whole, so that a bad length is refused before a byte of the message is
 * kept; then the rest into `buf` (the message CRC into `tail`), the CRC
 * running over the bytes as they come, so a message too long to keep
 * (`skip`) is still checked. Invariants:
 *
 *  - cap <= max_message: the buffer never outgrows the bound.
 *  - Once `error` is set nothing else changes: no callback, no buffering.
 *  - A message reaches the callback only after both CRCs and every header
 *    checked out.
 */
#include "eventstream.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define EVS_DEFAULT_MAX (1u << 20)
#define EVS_FIRST_CAP 512u

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint32_t crc_of(uint32_t crc, const void *p, size_t n)
{
	/* zlib takes a uInt length: fed in pieces the bound makes small */
	const unsigned char *b = p;
	while (n > 0) {
		uInt take = n > (1u << 30) ? (1u << 30) : (uInt)n;
		crc = (uint32_t)crc32(crc, b, take);
		b += take;
		n -= take;
	}
	return crc;
}

const char *evs_error_name(enum evs_error e)
{
	switch (e) {
	case EVS_OK: return "ok";
	case EVS_ERR_SHORT: return "length_below_minimum";
	case EVS_ERR_LONG: return "length_past_bound";
	case EVS_ERR_HEADERS_LENGTH: return "headers_length";
	case EVS_ERR_PRELUDE_CRC: return "prelude_crc";
	case EVS_ERR_MESSAGE_CRC: return "message_crc";
	case EVS_ERR_HEADER_OVERRUN: return "header_overrun";
	case EVS_ERR_HEADER_TYPE: return "header_type";
	case EVS_ERR_HEADER_NAME: return "header_name";
	case EVS_ERR_HEADER_COUNT: return "header_count";
	case EVS_ERR_TRUNCATED: return "truncated";
	}
	return "unknown";
}

bool evs_str_is(struct evs_str s, const char *lit)
{
	size_t n = strlen(lit);
	return s.p != NULL && s.n == n && memcmp(s.p, lit, n) == 0;
}

/* The prelude's lengths and CRC, judged before any other byte is read. */
static enum evs_error check_prelude(const unsigned char *p, uint32_t *total, uint32_t *hlen)
{
	*total = be32(p);
	*hlen = be32(p + 4);
	if (crc_of(0, p, 8) != be32(p + 8))
		return EVS_ERR_PRELUDE_CRC;
	if (*total < EVS_MIN_MESSAGE)
		return EVS_ERR_SHORT;
	if (*total > EVS_MAX_MESSAGE)
		return EVS_ERR_LONG;
	if (*hlen > EVS_MAX_HEADERS || *hlen > *total - EVS_MIN_MESSAGE ||
	    *total - EVS_MIN_MESSAGE - *hlen > EVS_MAX_PAYLOAD)
		return EVS_ERR_HEADERS_LENGTH;
	return EVS_OK;
}

/* Bytes a value of `type` takes after its type byte; -1: no such type,
 * -2: a variable length to read (types 6 and 7: a u16 and that many). */
static int value_len(unsigned type)
{
	switch (type) {
	case 0:		   /* bool true */
	case 1: return 0;  /* bool false */
	case 2: return 1;  /* byte */
	case 3: return 2;  /* short */
	case 4: return 4;  /* int */
	case 5: return 8;  /* long */
	case 6:		   /* byte array */
	case 7: return -2; /* string */
	case 8: return 8;  /* timestamp, ms */
	case 9: return 16; /* uuid */
	default: break;
	}
	return -1;
}

/* Reads the headers section [h, h + hlen) into m; every header is checked
 * whole, the ones tokentap reads are noted when they are strings. */
static enum evs_error read_headers(const unsigned char *h, size_t hlen, struct evs_message *m)
{
	size_t off = 0;

	while (off < hlen) {
		if (m->headers == EVS_MAX_HEADER_COUNT)
			return EVS_ERR_HEADER_COUNT;
		m->headers++;
		size_t nlen = h[off++];
		if (nlen == 0)
			return EVS_ERR_HEADER_NAME;
		if (nlen + 1 > hlen - off)
			return EVS_ERR_HEADER_OVERRUN; /* the name and the type byte */
		struct evs_str name = { (const char *)h + off, nlen };
		off += nlen;
		unsigned type = h[off++];
		int vl = value_len(type);
		if (vl == -1)
			return EVS_ERR_HEADER_TYPE;
		size_t vlen = (size_t)vl, voff = off;
		if (vl == -2) {
			if (hlen - off < 2)
				return EVS_ERR_HEADER_OVERRUN;
			vlen = (size_t)h[off] << 8 | h[off + 1];
			voff = off + 2;
		}
		if (vlen > hlen - voff)
			return EVS_ERR_HEADER_OVERRUN;
		off = voff + vlen;
		if (type != 7 || name.p[0] != ':')
			continue;
		struct evs_str val = { (const char *)h + voff, vlen };
		if (evs_str_is(name, ":message-type"))
			m->type = evs_str_is(val, "event")	 ? EVS_MSG_EVENT
				  : evs_str_is(val, "exception") ? EVS_MSG_EXCEPTION
				  : evs_str_is(val, "error")	 ? EVS_MSG_ERROR
								 : EVS_MSG_OTHER;
		else if (evs_str_is(name, ":event-type"))
			m->event_type = val;
		else if (evs_str_is(name, ":exception-type"))
			m->exception_type = val;
		else if (evs_str_is(name, ":error-code"))
			m->error_code = val;
		else if (evs_str_is(name, ":content-type"))
			m->content_type = val;
	}
	return EVS_OK;
}

/* The message after its prelude, at body (total - 12 bytes, CRCs already
 * checked): headers and payload into m. */
static enum evs_error read_message(const unsigned char *body, uint32_t total, uint32_t hlen, struct evs_message *m)
{
	memset(m, 0, sizeof(*m));
	enum evs_error e = read_headers(body, hlen, m);
	if (e != EVS_OK)
		return e;
	m->payload = (const char *)body + hlen;
	m->payload_len = total - EVS_MIN_MESSAGE - hlen;
	return EVS_OK;
}

enum evs_error evs_parse(const char *p, size_t len, struct evs_message *m)
{
	const unsigned char *u = (const unsigned char *)p;
	uint32_t total, hlen;

	memset(m, 0, sizeof(*m));
	if (len < EVS_PRELUDE_LEN)
		return EVS_ERR_TRUNCATED;
	enum evs_error e = check_prelude(u, &total, &hlen);
	if (e != EVS_OK)
		return e;
	if (total != len)
		return EVS_ERR_TRUNCATED;
	if (crc_of(0, u, total - 4) != be32(u + total - 4))
		return EVS_ERR_MESSAGE_CRC;
	return read_message(u + EVS_PRELUDE_LEN, total, hlen, m);
}

void evs_init(struct evs_framer *f, size_t max_message, evs_cb cb, void *arg)
{
	memset(f, 0, sizeof(*f));
	f->cb = cb;
	f->arg = arg;
	f->max_message = max_message ? max_message : EVS_DEFAULT_MAX;
	if (f->max_message > EVS_MAX_MESSAGE)
		f->max_message = EVS_MAX_MESSAGE;
}

void evs_free(struct evs_framer *f)
{
	free(f->buf);
	f->buf = NULL;
	f->cap = 0;
}

static void deliver(struct evs_framer *f, const struct evs_message *m)
{
	f->messages++;
	if (f->cb)
		f->cb(f->arg, m);
}

static void fail(struct evs_framer *f, enum evs_error e)
{
	f->error = e;
}

/* Room for the message after its prelude; -1 when memory is short (the
 * message is then skipped as if it were too long: checked, not kept). */
static int reserve(struct evs_framer *f, size_t need)
{
	if (need <= f->cap)
		return 0;
	size_t cap = f->cap ? f->cap : EVS_FIRST_CAP;
	while (cap < need)
		cap = cap > f->max_message / 2 ? f->max_message : cap * 2;
	if (cap > f->max_message)
		cap = f->max_message; /* need never is: the message fits the bound */
	char *nb = realloc(f->buf, cap);
	if (nb == NULL)
		return -1;
	f->buf = nb;
	f->cap = cap;
	return 0;
}

/* The prelude is whole: checks it and sets up the message's gathering. */
static void begin_message(struct evs_framer *f)
{
	enum evs_error e = check_prelude(f->prelude, &f->total, &f->headers_len);
	if (e != EVS_OK) {
		fail(f, e);
		return;
	}
	f->have = 0;
	f->crc = crc_of(0, f->prelude, EVS_PRELUDE_LEN);
	f->skip = f->total > f->max_message || reserve(f, f->total - EVS_PRELUDE_LEN) == -1;
}

/* The message's last byte arrived: its CRC, then the callback. */
static void end_message(struct evs_framer *f)
{
	struct evs_message m;
	uint32_t total = f->total;

	f->prelude_have = 0;
	if (f->crc != be32(f->tail)) {
		fail(f, EVS_ERR_MESSAGE_CRC);
		return;
	}
	if (f->skip) {
		f->oversized++;
	} else {
		enum evs_error e = read_message((const unsigned char *)f->buf, total, f->headers_len, &m);
		if (e != EVS_OK) {
			fail(f, e);
			return;
		}
		deliver(f, &m);
	}
	f->offset += total;
}

/* Bytes of the message after its prelude, [p, p + n), all within it. */
static void take_body(struct evs_framer *f, const char *p, size_t n)
{
	size_t body = f->total - EVS_PRELUDE_LEN; /* the bytes after the prelude */
	size_t crc_from = body - 4;		  /* where the message CRC starts */

	if (!f->skip)
		memcpy(f->buf + f->have, p, n);
	if (f->have < crc_from) {
		size_t c = crc_from - f->have < n ? crc_from - f->have : n;
		f->crc = crc_of(f->crc, p, c);
	}
	for (size_t i = 0; i < n; i++)
		if (f->have + i >= crc_from)
			f->tail[f->have + i - crc_from] = (unsigned char)p[i];
	f->have += n;
	if (f->have == body)
		end_message(f);
}

void evs_feed(struct evs_framer *f, const char *buf, size_t len)
{
	const char *p = buf, *end = buf + len;

	while (p < end && f->error == EVS_OK) {
		size_t left = (size_t)(end - p);
		if (f->prelude_have == 0 && left >= EVS_PRELUDE_LEN) {
			/* Nothing held: a message whole in the slice is checked
			 * and handed out in place. */
			uint32_t total = be32((const unsigned char *)p);
			if (total <= left && total <= f->max_message && total >= EVS_MIN_MESSAGE) {
				struct evs_message m;
				enum evs_error e = evs_parse(p, total, &m);
				if (e != EVS_OK) {
					fail(f, e);
					return;
				}
				deliver(f, &m);
				f->offset += total;
				p += total;
				continue;
			}
		}
		if (f->prelude_have < EVS_PRELUDE_LEN) {
			size_t take = EVS_PRELUDE_LEN - f->prelude_have;
			if (take > left)
				take = left;
			memcpy(f->prelude + f->prelude_have, p, take);
			f->prelude_have += take;
			p += take;
			if (f->prelude_have == EVS_PRELUDE_LEN)
				begin_message(f);
			continue;
		}
		size_t want = f->total - EVS_PRELUDE_LEN - f->have;
		size_t take = want < left ? want : left;
		take_body(f, p, take);
		p += take;
	}
}

void evs_finish(struct evs_framer *f)
{
	if (f->error == EVS_OK && f->prelude_have > 0)
		fail(f, EVS_ERR_TRUNCATED);
}
