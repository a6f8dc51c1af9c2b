/*
 * wsframe.c — the WebSocket frame parser (wsframe.h says what it checks).
 *
 *   bytes ─▶ header (2..14 bytes, held across calls) ─▶ checks ─▶ hooks->frame
 *         ─▶ payload (unmasked in WSF_CHUNK pieces) ─▶ hooks->payload
 *         ─▶ its end ─▶ hooks->frame_end; a data frame with FIN ends its message
 *
 * The header is checked whole (at most 14 bytes), so a violation is known
 * before any of its frame's payload is taken, and the caller can forward
 * exactly the frames before it.
 */
#include "wsframe.h"

#include <string.h>

void wsf_init(struct wsf_parser *p, bool from_client, const struct wsf_limits *lim, const struct wsf_hooks *hooks,
	      void *arg)
{
	memset(p, 0, sizeof(*p));
	p->from_client = from_client;
	if (lim)
		p->lim = *lim;
	p->hooks = hooks;
	p->arg = arg;
}

bool wsf_at_boundary(const struct wsf_parser *p)
{
	return !p->in_payload && p->hdr_len == 0;
}

/* Header bytes this header needs, from what is held of it. */
static unsigned header_need(const struct wsf_parser *p)
{
	if (p->hdr_len < 2)
		return 2;
	unsigned len7 = p->hdr[1] & 0x7f;
	return 2u + (len7 == 126 ? 2u : len7 == 127 ? 8u : 0u) + ((p->hdr[1] & 0x80) ? 4u : 0u);
}

static bool is_control(uint8_t op)
{
	return (op & 0x8) != 0;
}

/* The held header is whole: checks it and makes it the current frame. */
static enum wsf_error header_parse(struct wsf_parser *p)
{
	struct wsf_frame *f = &p->f;
	const uint8_t *h = p->hdr;
	unsigned len7 = h[1] & 0x7f, off = 2;

	memset(f, 0, sizeof(*f));
	f->fin = (h[0] & 0x80) != 0;
	f->rsv1 = (h[0] & 0x40) != 0;
	f->opcode = h[0] & 0x0f;
	f->masked = (h[1] & 0x80) != 0;
	switch (f->opcode) {
	case WSF_OP_CONT:
	case WSF_OP_TEXT:
	case WSF_OP_BINARY:
	case WSF_OP_CLOSE:
	case WSF_OP_PING:
	case WSF_OP_PONG: break;
	default: return WSF_ERR_OPCODE;
	}
	if (f->masked != p->from_client)
		return WSF_ERR_MASK;
	if (len7 == 126) {
		f->len = (uint64_t)h[2] << 8 | h[3];
		off = 4;
	} else if (len7 == 127) {
		if (h[2] & 0x80)
			return WSF_ERR_LENGTH;
		for (unsigned i = 0; i < 8; i++)
			f->len = f->len << 8 | h[2 + i];
		off = 10;
	} else {
		f->len = len7;
	}
	if (f->masked)
		memcpy(f->mask, h + off, 4);
	if (is_control(f->opcode)) {
		if (!f->fin)
			return WSF_ERR_CONTROL_FRAGMENT;
		if (f->len > WSF_CONTROL_MAX)
			return WSF_ERR_CONTROL_LENGTH;
		f->msg_opcode = f->opcode;
		f->msg_first = true;
		return WSF_OK;
	}
	if (p->lim.max_frame && f->len > p->lim.max_frame)
		return WSF_ERR_FRAME_TOO_BIG;
	if (f->opcode == WSF_OP_CONT) {
		if (!p->in_message)
			return WSF_ERR_CONTINUATION;
	} else {
		if (p->in_message)
			return WSF_ERR_INTERLEAVED;
		p->in_message = true;
		p->msg_opcode = f->opcode;
		p->msg_compressed = f->rsv1;
		p->msg_bytes = 0;
		f->msg_first = true;
	}
	if (p->lim.max_message && f->len > p->lim.max_message - p->msg_bytes)
		return WSF_ERR_MESSAGE_TOO_BIG;
	p->msg_bytes += f->len;
	f->msg_opcode = p->msg_opcode;
	f->msg_compressed = p->msg_compressed;
	return WSF_OK;
}

static void frame_end(struct wsf_parser *p)
{
	const struct wsf_frame *f = &p->f;

	p->in_payload = false;
	p->hdr_len = 0;
	p->frames++;
	if (is_control(f->opcode)) {
		p->control_frames++;
	} else if (f->fin) {
		p->messages++;
		p->in_message = false;
	}
	if (p->hooks && p->hooks->frame_end)
		p->hooks->frame_end(p->arg, f);
}

/* `n` payload bytes of the current frame: unmasked for the hook. */
static void payload(struct wsf_parser *p, const uint8_t *b, size_t n)
{
	if (p->hooks && p->hooks->payload) {
		uint8_t tmp[WSF_CHUNK];
		while (n) {
			size_t k = n < sizeof(tmp) ? n : sizeof(tmp);
			if (p->f.masked) {
				for (size_t i = 0; i < k; i++)
					tmp[i] = b[i] ^ p->f.mask[(p->at + i) & 3];
			} else {
				memcpy(tmp, b, k);
			}
			p->hooks->payload(p->arg, &p->f, tmp, k);
			p->at += k;
			b += k;
			n -= k;
		}
		return;
	}
	p->at += n;
}

size_t wsf_feed(struct wsf_parser *p, const uint8_t *buf, size_t len, size_t *boundary)
{
	size_t i = 0, bnd = 0, fstart = 0;

	if (p->err) {
		if (boundary)
			*boundary = 0;
		return 0;
	}
	while (i < len) {
		bool split = false;
		if (!p->in_payload) {
			if (p->hdr_len == 0)
				fstart = i;
			else
				split = true;
			unsigned need = header_need(p);
			while (p->hdr_len < need && i < len) {
				p->hdr[p->hdr_len++] = buf[i++];
				need = header_need(p);
			}
			if (p->hdr_len < need)
				break;
			enum wsf_error e = header_parse(p);
			if (e) {
				p->err = e;
				p->err_split = split;
				if (boundary)
					*boundary = bnd;
				return fstart;
			}
			p->in_payload = true;
			p->left = p->f.len;
			p->at = 0;
			if (p->hooks && p->hooks->frame)
				p->hooks->frame(p->arg, &p->f);
		}
		size_t take = len - i < p->left ? len - i : (size_t)p->left;
		payload(p, buf + i, take);
		i += take;
		p->left -= take;
		if (p->left == 0) {
			frame_end(p);
			bnd = i;
		}
	}
	if (boundary)
		*boundary = bnd;
	return i;
}

const char *wsf_error_name(enum wsf_error e)
{
	switch (e) {
	case WSF_OK: return "ok";
	case WSF_ERR_OPCODE: return "reserved opcode";
	case WSF_ERR_MASK: return "frame masking wrong for its direction";
	case WSF_ERR_CONTROL_LENGTH: return "control frame over 125 bytes";
	case WSF_ERR_CONTROL_FRAGMENT: return "fragmented control frame";
	case WSF_ERR_CONTINUATION: return "continuation frame without a message";
	case WSF_ERR_INTERLEAVED: return "new message inside a fragmented one";
	case WSF_ERR_LENGTH: return "64-bit frame length with its top bit set";
	case WSF_ERR_FRAME_TOO_BIG: return "frame over the frame size limit";
	case WSF_ERR_MESSAGE_TOO_BIG: return "message over the message size limit";
	}
	return "unknown";
}

uint16_t wsf_error_close_code(enum wsf_error e)
{
	return e == WSF_ERR_FRAME_TOO_BIG || e == WSF_ERR_MESSAGE_TOO_BIG ? 1009 : 1002;
}

size_t wsf_close_frame(uint8_t *out, uint16_t code, const char *reason, const uint8_t *mask)
{
	size_t rlen = reason ? strlen(reason) : 0;
	size_t off = 2;

	if (rlen > WSF_CONTROL_MAX - 2)
		rlen = WSF_CONTROL_MAX - 2;
	out[0] = 0x80 | WSF_OP_CLOSE;
	out[1] = (uint8_t)(2 + rlen) | (mask ? 0x80 : 0);
	if (mask) {
		memcpy(out + 2, mask, 4);
		off = 6;
	}
	out[off] = (uint8_t)(code >> 8);
	out[off + 1] = (uint8_t)code;
	if (rlen)
		memcpy(out + off + 2, reason, rlen);
	if (mask)
		for (size_t i = 0; i < 2 + rlen; i++)
			out[off + i] ^= mask[i & 3];
	return off + 2 + rlen;
}
