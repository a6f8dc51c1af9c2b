/*
 * sim_bedrock.c — the bytes of AWS Bedrock's answers that are not JSON:
 * application/vnd.amazon.eventstream messages (the prelude, the three
 * string headers Bedrock sends, the CRC32s), InvokeModel's base64 chunks,
 * the padding Bedrock puts in every event, and the model read from the
 * path. sim_api.c builds the JSON of each event and frames it here.
 *
 * Invariant: as everywhere in the simulator, the bytes depend only on
 * their inputs; the padding's length comes from the payload's own hash.
 */
#include "sim.h"

#include <event2/buffer.h>
#include <zlib.h>

#include <stdlib.h>
#include <string.h>

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

/* Appends a string header: name length u8, name, type 7, u16 length, value. */
static size_t put_header(unsigned char *h, const char *name, const char *val)
{
	size_t nl = strlen(name), vl = strlen(val), n = 0;

	h[n++] = (unsigned char)nl;
	memcpy(h + n, name, nl);
	n += nl;
	h[n++] = 7;
	h[n++] = (unsigned char)(vl >> 8);
	h[n++] = (unsigned char)vl;
	memcpy(h + n, val, vl);
	return n + vl;
}

/* One message: `kind_name` (":event-type" or ":exception-type") `kind`,
 * application/json, `message_type`; the payload as given. */
static void message(struct evbuffer *out, const char *kind_name, const char *kind, const char *message_type,
		    const char *payload, size_t len)
{
	unsigned char head[12 + 512], crc_be[4];
	size_t hn = 0;

	hn += put_header(head + 12 + hn, kind_name, kind);
	hn += put_header(head + 12 + hn, ":content-type", "application/json");
	hn += put_header(head + 12 + hn, ":message-type", message_type);
	uint32_t total = (uint32_t)(16 + hn + len);
	put32(head, total);
	put32(head + 4, (uint32_t)hn);
	put32(head + 8, (uint32_t)crc32(0, head, 8));
	uLong crc = crc32(0, head, (uInt)(12 + hn));
	crc = crc32(crc, (const unsigned char *)payload, (uInt)len);
	put32(crc_be, (uint32_t)crc);
	evbuffer_add(out, head, 12 + hn);
	evbuffer_add(out, payload, len);
	evbuffer_add(out, crc_be, 4);
}

/* Bedrock's padding member: ,"p":"abcd..." of a length picked by the
 * payload (1 to 40 letters). Added before the closing brace of `json`. */
static void with_padding(struct evbuffer *dst, const char *json, size_t len)
{
	static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	size_t n = 1 + sim_mix(sim_hash(json, len, 0x70616464ULL)) % 40;

	if (len == 0 || json[len - 1] != '}') {
		evbuffer_add(dst, json, len);
		return;
	}
	evbuffer_add(dst, json, len - 1);
	evbuffer_add(dst, len > 2 ? ",\"p\":\"" : "\"p\":\"", len > 2 ? 6 : 5);
	evbuffer_add(dst, letters, n);
	evbuffer_add(dst, "\"}", 2);
}

void sim_es_event(struct evbuffer *out, const char *event_type, const char *json, size_t len)
{
	struct evbuffer *b = evbuffer_new();
	size_t n;

	with_padding(b, json, len);
	n = evbuffer_get_length(b);
	message(out, ":event-type", event_type, "event", (const char *)evbuffer_pullup(b, -1), n);
	evbuffer_free(b);
}

void sim_es_exception(struct evbuffer *out, const char *exception_type, const char *json, size_t len)
{
	message(out, ":exception-type", exception_type, "exception", json, len);
}

void sim_es_chunk(struct evbuffer *out, const char *json, size_t len)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	const unsigned char *u = (const unsigned char *)json;
	struct evbuffer *b = evbuffer_new();
	size_t n;

	evbuffer_add(b, "{\"bytes\":\"", 10);
	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)u[i] << 16 | (i + 1 < len ? (uint32_t)u[i + 1] << 8 : 0) |
			     (i + 2 < len ? (uint32_t)u[i + 2] : 0);
		char q[4] = { t[v >> 18 & 63], t[v >> 12 & 63], i + 1 < len ? t[v >> 6 & 63] : '=',
			      i + 2 < len ? t[v & 63] : '=' };
		evbuffer_add(b, q, 4);
	}
	evbuffer_add(b, "\"}", 2);
	n = evbuffer_get_length(b);
	sim_es_event(out, "chunk", (const char *)evbuffer_pullup(b, -1), n);
	evbuffer_free(b);
}

static int hex(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* /model/MODEL/OP: OP in *op, MODEL percent-decoded (malloc'd) in *model;
 * false for another path. */
bool sim_bedrock_path(const char *path, const char **op, char **model)
{
	static const char *const ops[] = { "/converse-stream", "/converse", "/invoke-with-response-stream", "/invoke" };
	size_t len = strlen(path);

	if (strncmp(path, "/model/", 7) != 0)
		return false;
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		size_t n = strlen(ops[i]);
		if (len <= 7 + n || strcmp(path + len - n, ops[i]) != 0)
			continue;
		size_t mlen = len - 7 - n, k = 0;
		char *m = malloc(mlen + 1);
		if (m == NULL)
			return false;
		for (size_t j = 0; j < mlen; j++) {
			const char *s = path + 7 + j;
			if (s[0] == '%' && j + 2 < mlen && hex(s[1]) >= 0 && hex(s[2]) >= 0) {
				m[k++] = (char)(hex(s[1]) << 4 | hex(s[2]));
				j += 2;
			} else {
				m[k++] = s[0];
			}
		}
		m[k] = '\0';
		*op = ops[i] + 1;
		*model = m;
		return true;
	}
	return false;
}
