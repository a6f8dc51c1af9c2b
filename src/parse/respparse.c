/*
 * respparse.c — the upstream response parser: llhttp for responses plus the
 * decisions tokentap makes while reading one.
 *
 *   bytes ─▶ llhttp ─▶ on_header_*:         Content-Type (the framer),
 *                                           Content-Encoding
 *                      on_headers_complete: 101 refused unless asked
 *                                           for (upgrade_ok); < 100 refused; 1xx
 *                                           passed over;
 *                                           the final head: hooks->head;
 *                                           no body after a HEAD, nor
 *                                           in a 204 or 304
 *                      on_body:             hooks->body
 *                      on_message_complete: 1xx passed over; the final
 *                                           one: hooks->complete, a pause
 *
 * A chunked body is read here, not by llhttp ("Chunked bodies" below):
 * each event of a stream usually comes in a chunk of its own, and llhttp's
 * state machine costs more per chunk than the rest of the event's path.
 *
 * Invariants: every byte fed is either part of the response (*used, then
 * rp->held until taken) or left to the caller after the response's end;
 * nothing past the end is parsed, since the parser pauses there. Held bytes
 * go to the caller only once the final head has parsed, so a head is
 * forwarded whole or not at all, and one still incomplete past head_max
 * (RESP_HEAD_MAX) bytes is refused. Only the first bytes of a header's
 * name and value are kept: the names looked for are short, and a value cut
 * short only picks no framer.
 */
#include "respparse.h"

#include <string.h>

#include "strutil.h"

/* Where the chunked body's reader is (rp->ck; "Chunked bodies" below). */
enum chunk_state {
	CK_OFF = 0, /* llhttp reads the body, if there is one */
	CK_START,   /* before a chunk's size: a hex digit comes */
	CK_SIZE,    /* in the size's digits (ck_len so far) */
	CK_SIZE_LF, /* after the size's CR */
	CK_DATA,    /* ck_len bytes of the chunk's data to come */
	CK_DATA_CR, /* after the data: its CR */
	CK_DATA_LF, /* its LF */
};

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
	struct respparse *rp = p->data;

	if (!rp->in_name) {
		rp->in_name = true;
		rp->name_len = rp->val_len = 0;
	}
	size_t room = sizeof(rp->name) - rp->name_len;
	if (len > room)
		len = room; /* a long name is not one we look for */
	memcpy(rp->name + rp->name_len, at, len);
	rp->name_len += len;
	return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
	struct respparse *rp = p->data;

	rp->in_name = false;
	return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
	struct respparse *rp = p->data;
	size_t room = sizeof(rp->val) - rp->val_len;

	if (len > room)
		len = room;
	memcpy(rp->val + rp->val_len, at, len);
	rp->val_len += len;
	return 0;
}

/* The header fields of a 1xx response count too: a server has no reason to
 * send these there, and the final response's own fields come later. */
static int on_header_value_complete(llhttp_t *p)
{
	struct respparse *rp = p->data;

	if (name_eq(rp->name, rp->name_len, "content-type"))
		rp->kind = framer_kind_for_content_type(rp->val, rp->val_len);
	else if (name_eq(rp->name, rp->name_len, "content-encoding"))
		rp->content_encoded = !name_eq(rp->val, rp->val_len, "identity");
	else
		classify_header(rp->name, rp->name_len, rp->val, rp->val_len, &rp->server);
	rp->name_len = rp->val_len = 0;
	return 0;
}

static int on_headers_complete(llhttp_t *p)
{
	struct respparse *rp = p->data;
	int status = p->status_code;

	if (status < 200) {
		/* 101 would switch protocols, which was never asked for. llhttp
		 * takes any three digits; below 100 is no status at all (taken
		 * for a 1xx, its body would be held with the head). */
		if (status == 101 && rp->upgrade_ok) {
			rp->informational = false;
			rp->head_done = true;
			rp->switched = true;
			rp->status = status;
			rp->kind = FRAMER_NONE;
			rp->hooks->head(rp->arg, rp);
			return 2; /* no body; llhttp pauses after it (HPE_PAUSED_UPGRADE) */
		}
		if (status == 101 || status < 100) {
			rp->refused = status;
			return -1;
		}
		rp->informational = true; /* 1xx: forwarded, then the real one */
		return 1;		  /* a 1xx ends at its head, whatever its framing headers say */
	}
	rp->informational = false;
	rp->head_done = true;
	rp->status = status;
	/* Compressed bodies are forwarded, not framed. */
	if (rp->content_encoded)
		rp->kind = FRAMER_NONE;
	rp->hooks->head(rp->arg, rp);
	/* 1: no body follows. llhttp 8.1 knows that of 204 and 304 only when
	 * they carry no framing: a 304's Content-Length describes the
	 * representation (RFC 9110 8.6), and neither may have a body whatever
	 * their headers say, so they end here as a HEAD's answer does. */
	if (rp->head_request || status == 204 || status == 304)
		return 1;
	if ((p->flags & F_CHUNKED) && !rp->llhttp_chunks) {
		rp->ck = CK_START;
		return HPE_PAUSED; /* the chunks are read here, from where llhttp stopped */
	}
	return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct respparse *rp = p->data;

	if (!rp->ck_mute)
		rp->hooks->body(rp->arg, at, len);
	return 0;
}

static int on_message_complete(llhttp_t *p)
{
	struct respparse *rp = p->data;

	if (rp->informational) {
		rp->informational = false;
		return 0;
	}
	rp->done = true;
	rp->keep_alive = llhttp_should_keep_alive(p);
	rp->hooks->complete(rp->arg, rp->keep_alive);
	return HPE_PAUSED; /* whatever follows is not this response's */
}

static const llhttp_settings_t respparse_settings = {
	.on_header_field = on_header_field,
	.on_header_field_complete = on_header_field_complete,
	.on_header_value = on_header_value,
	.on_header_value_complete = on_header_value_complete,
	.on_headers_complete = on_headers_complete,
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

void respparse_init(struct respparse *rp, const struct respparse_hooks *hooks, void *arg)
{
	memset(rp, 0, sizeof(*rp));
	rp->hooks = hooks;
	rp->arg = arg;
	rp->head_max = RESP_HEAD_MAX;
	rp->server = SERVER_TIMING_UNKNOWN;
	llhttp_init(&rp->parser, HTTP_RESPONSE, &respparse_settings);
	rp->parser.data = rp;
}

static enum respparse_status chunks_feed(struct respparse *rp, const char *buf, size_t len, size_t *used);

/* llhttp parses [buf, buf+len); *used as respparse_feed says, but nothing
 * joins rp->held. A chunked body's head pauses it where the body begins:
 * the chunks are read on from there. */
static enum respparse_status llhttp_feed(struct respparse *rp, const char *buf, size_t len, size_t *used)
{
	enum llhttp_errno e = llhttp_execute(&rp->parser, buf, len);

	if (e == HPE_OK) {
		*used = len;
		return RESPPARSE_MORE;
	}
	if (e == HPE_PAUSED && rp->ck) {
		size_t at = (size_t)(llhttp_get_error_pos(&rp->parser) - buf), u;
		enum respparse_status st = chunks_feed(rp, buf + at, len - at, &u);
		*used = st == RESPPARSE_INVALID ? 0 : at + u;
		return st;
	}
	if (e == HPE_PAUSED || (e == HPE_PAUSED_UPGRADE && rp->switched && rp->done)) {
		*used = (size_t)(llhttp_get_error_pos(&rp->parser) - buf);
		return RESPPARSE_DONE;
	}
	*used = 0;
	return rp->refused == 101 ? RESPPARSE_SWITCHING : RESPPARSE_INVALID;
}

/*
 * Chunked bodies. After a chunked response's head llhttp is left paused
 * (on_headers_complete), and the chunks are read here: hex digits, CR LF,
 * the data straight to the body hook, CR LF, as many as come, resumable
 * anywhere. Anything else, and the last chunk (size 0, its trailers and
 * the message's end), goes back to llhttp, which decides on it as if it
 * had read the whole body itself: it is resumed and first fed a made-up
 * prefix that brings it to the state this reader was in (the size read so
 * far as hex digits, and its CR; after a chunk's data, a one-byte chunk
 * whose byte is not handed to the hook), then the rest of the real bytes.
 * So what is accepted, what is refused and with what error, where the
 * response ends and what the hooks see are llhttp's, byte for byte, only
 * without its state machine per chunk. The size's digits are taken as
 * llhttp's own limit allows (a size past 64 bits is its refusal).
 */
static size_t hex_put(char *out, uint64_t v)
{
	char tmp[16];
	size_t n = 0;

	do {
		tmp[n++] = "0123456789abcdef"[v & 15];
		v >>= 4;
	} while (v);
	for (size_t i = 0; i < n; i++)
		out[i] = tmp[n - 1 - i];
	return n;
}

/* llhttp takes the body over at [q, q+n) (ends included), from the
 * reader's state. */
static enum respparse_status chunks_fallback(struct respparse *rp, const char *q, size_t n, size_t *used)
{
	char pre[24];
	size_t k = 0;

	switch (rp->ck) {
	case CK_SIZE:
	case CK_SIZE_LF:
		k = hex_put(pre, rp->ck_len);
		if (rp->ck == CK_SIZE_LF)
			pre[k++] = '\r';
		break;
	case CK_DATA:
		k = hex_put(pre, rp->ck_len);
		pre[k++] = '\r';
		pre[k++] = '\n';
		break;
	case CK_DATA_CR:
	case CK_DATA_LF:
		memcpy(pre, "1\r\n-\r", 5);
		k = rp->ck == CK_DATA_LF ? 5 : 4;
		break;
	default: break;
	}
	rp->ck = CK_OFF;
	llhttp_resume(&rp->parser);
	if (k) {
		rp->ck_mute = true;
		enum llhttp_errno e = llhttp_execute(&rp->parser, pre, k);
		rp->ck_mute = false;
		if (e != HPE_OK) { /* the prefix only says what was read: llhttp took it before */
			*used = 0;
			return RESPPARSE_INVALID;
		}
	}
	return llhttp_feed(rp, q, n, used);
}

/* A hex digit's value plus one, 0 for any other byte. */
static const uint8_t hex_digit1[256] = {
	['0'] = 1,  ['1'] = 2,	['2'] = 3,  ['3'] = 4,	['4'] = 5,  ['5'] = 6,	['6'] = 7,  ['7'] = 8,
	['8'] = 9,  ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
	['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
};

#define CHUNKS_V 32 /* whole chunks handed to body_v at once */

/* Whole chunks at p, as long as they come: `size CR LF data CR LF`, the
 * size's digits at most 15 (so no overflow) and not 0. Where the whole
 * chunks end; the state machine takes the rest. Their data goes to the
 * body hook before this returns, CHUNKS_V at a time through body_v. */
static inline bool is_crlf(const char *q)
{
	uint16_t w;
	memcpy(&w, q, 2);
	return w == (uint16_t)('\r' | '\n' << 8) || (q[0] == '\r' && q[1] == '\n');
}

static const char *whole_chunks(struct respparse *rp, const char *p, const char *end)
{
	void (*body_v)(void *, const struct framer_slice *, size_t) = rp->hooks->body_v;
	struct framer_slice v[CHUNKS_V];
	size_t nv = 0;

	while (end - p >= 6) {
		const unsigned char *u = (const unsigned char *)p;
		unsigned d = hex_digit1[u[0]], d1 = hex_digit1[u[1]];
		if (d == 0)
			break;
		uint64_t n = d - 1;
		size_t k = 1;
		if (d1 != 0 && u[2] == '\r') { /* two digits, an event's usual size */
			n = n << 4 | (d1 - 1);
			k = 2;
		} else {
			size_t lim = end - p < 15 ? (size_t)(end - p) : 15;
			while (k < lim && (d = hex_digit1[u[k]]) != 0) {
				n = n << 4 | (d - 1);
				k++;
			}
		}
		const char *q = p + k;
		if (n == 0 || end - q < 4 || !is_crlf(q) || (uint64_t)(end - q - 4) < n || !is_crlf(q + 2 + n))
			break;
		q += 2;
		if (body_v == NULL) {
			rp->hooks->body(rp->arg, q, (size_t)n);
		} else {
			v[nv++] = (struct framer_slice){ q, (size_t)n };
			if (nv == CHUNKS_V) {
				body_v(rp->arg, v, nv);
				nv = 0;
			}
		}
		p = q + n + 2;
	}
	if (nv)
		body_v(rp->arg, v, nv);
	return p;
}

static enum respparse_status chunks_feed(struct respparse *rp, const char *buf, size_t len, size_t *used)
{
	const char *p = buf, *end = buf + len;

	if (rp->ck == CK_START)
		p = whole_chunks(rp, p, end);
	while (p < end) {
		switch (rp->ck) {
		case CK_START:
		case CK_SIZE: {
			int d = hex_digit1[(unsigned char)*p] - 1;
			if (d < 0) {
				if (rp->ck == CK_SIZE && *p == '\r') {
					rp->ck = CK_SIZE_LF;
					p++;
					continue;
				}
				goto fallback;
			}
			if (rp->ck_len > UINT64_MAX / 16)
				goto fallback; /* llhttp's overflow */
			rp->ck_len = rp->ck_len << 4 | (uint64_t)d;
			rp->ck = CK_SIZE;
			p++;
			continue;
		}
		case CK_SIZE_LF:
			if (*p != '\n' || rp->ck_len == 0)
				goto fallback; /* the last chunk too: its trailers are llhttp's */
			rp->ck = CK_DATA;
			p++;
			continue;
		case CK_DATA: {
			size_t n = (size_t)(end - p);
			if (n > rp->ck_len)
				n = (size_t)rp->ck_len;
			rp->hooks->body(rp->arg, p, n);
			p += n;
			rp->ck_len -= n;
			if (rp->ck_len == 0)
				rp->ck = CK_DATA_CR;
			continue;
		}
		case CK_DATA_CR:
			if (*p != '\r')
				goto fallback;
			rp->ck = CK_DATA_LF;
			p++;
			continue;
		case CK_DATA_LF:
			if (*p != '\n')
				goto fallback;
			rp->ck = CK_START;
			rp->ck_len = 0;
			p = whole_chunks(rp, p + 1, end);
			continue;
		default: goto fallback;
		}
	}
	*used = len;
	return RESPPARSE_MORE;
fallback:;
	size_t u;
	enum respparse_status st = chunks_fallback(rp, p, (size_t)(end - p), &u);
	*used = st == RESPPARSE_INVALID ? 0 : (size_t)(p - buf) + u;
	return st;
}

enum respparse_status respparse_feed(struct respparse *rp, const char *buf, size_t len, size_t *used)
{
	enum respparse_status st = rp->ck ? chunks_feed(rp, buf, len, used) : llhttp_feed(rp, buf, len, used);

	rp->held += *used;
	return st;
}

enum respparse_status respparse_take(struct respparse *rp, size_t *n)
{
	*n = 0;
	if (!rp->head_done && rp->held > rp->head_max)
		return RESPPARSE_HEAD_TOO_LARGE;
	if (rp->head_done && !rp->hold) {
		*n = rp->held;
		rp->held = 0;
	}
	return rp->done ? RESPPARSE_DONE : RESPPARSE_MORE;
}

bool respparse_needs_eof(const struct respparse *rp)
{
	return llhttp_message_needs_eof(&rp->parser);
}

void respparse_finish(struct respparse *rp)
{
	(void)llhttp_finish(&rp->parser);
}

const char *respparse_error(const struct respparse *rp)
{
	if (rp->refused && rp->refused < 100)
		return llhttp_errno_name(HPE_INVALID_STATUS);
	return llhttp_errno_name(llhttp_get_errno(&rp->parser));
}
