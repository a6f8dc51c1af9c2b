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
	return rp->head_request || status == 204 || status == 304 ? 1 : 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
	struct respparse *rp = p->data;

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

enum respparse_status respparse_feed(struct respparse *rp, const char *buf, size_t len, size_t *used)
{
	enum llhttp_errno e = llhttp_execute(&rp->parser, buf, len);

	if (e == HPE_OK) {
		*used = len;
		rp->held += len;
		return RESPPARSE_MORE;
	}
	if (e == HPE_PAUSED || (e == HPE_PAUSED_UPGRADE && rp->switched && rp->done)) {
		*used = (size_t)(llhttp_get_error_pos(&rp->parser) - buf);
		rp->held += *used;
		return RESPPARSE_DONE;
	}
	*used = 0;
	return rp->refused == 101 ? RESPPARSE_SWITCHING : RESPPARSE_INVALID;
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
