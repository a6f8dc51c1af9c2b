/*
 * sim_bedrock.c — AWS Bedrock's Converse and InvokeModel: the model read
 * from the path, the JSON of each event and of the whole body (Converse's
 * own shapes; InvokeModel's are Anthropic's, with its usage from
 * sim_anthropic.c), and the bytes around them that are not JSON:
 * application/vnd.amazon.eventstream messages (the prelude, the three
 * string headers Bedrock sends, the CRC32s), InvokeModel's base64 chunks,
 * the padding Bedrock puts in every event.
 *
 * Invariant: as everywhere in the simulator, the bytes depend only on
 * their inputs; the padding's length comes from the payload's own hash.
 */
#include "sim_api.h"

#include <event2/buffer.h>
#include <zlib.h>

#include <inttypes.h>
#include <stdio.h>
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

/* ---- the JSON of each event, framed above ---- */

/* Frames the JSON in s->ev as one event-stream message (a Converse event
 * of `type`, or an InvokeModel chunk) into one HTTP chunk. */
static void bedrock_emit(struct sim_stream *s, struct evbuffer *out, const char *type)
{
	struct evbuffer *frame = evbuffer_new();
	size_t n = evbuffer_get_length(s->ev);
	const char *json = (const char *)evbuffer_pullup(s->ev, -1);

	if (s->ep == EP_BEDROCK_INVOKE)
		sim_es_chunk(frame, json, n);
	else
		sim_es_event(frame, type, json, n);
	evbuffer_drain(s->ev, n);
	evbuffer_add_buffer(s->ev, frame);
	evbuffer_free(frame);
	emit_chunk(s, out);
}

static void bedrock_event(struct sim_stream *s, struct evbuffer *out, const char *type, const char *json)
{
	evbuffer_add(s->ev, json, strlen(json));
	bedrock_emit(s, out, type);
}

/* Bedrock's nominal timings, whole ms: the first byte at the ttft, the
 * call at the last token. */
static uint64_t bedrock_first_byte_ms(const struct sim_stream *s)
{
	return s->ttft_ns / 1000000;
}

static uint64_t bedrock_latency_ms(const struct sim_stream *s)
{
	return nominal_ns(s, s->n_reason + s->n_out) / 1000000;
}

/* Converse's usage and metrics: inputTokens without the cache's part. */
static void converse_usage(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t out = s->n_reason + s->n_out, fresh = s->n_in - s->n_cached - s->n_cache_write;

	evbuffer_add_printf(b, "\"metrics\":{\"latencyMs\":%" PRIu64 "},\"usage\":{", bedrock_latency_ms(s));
	if (s->cache_report)
		evbuffer_add_printf(b, "\"cacheReadInputTokens\":%" PRIu64 ",\"cacheWriteInputTokens\":%" PRIu64 ",",
				    s->n_cached, s->n_cache_write);
	evbuffer_add_printf(b, "\"inputTokens\":%" PRIu64 ",\"outputTokens\":%" PRIu64 ",\"totalTokens\":%" PRIu64 "}",
			    fresh, out, s->n_in + out);
}

void bedrock_preamble(struct sim_stream *s, struct evbuffer *out)
{
	if (s->ep == EP_BEDROCK_CONVERSE) {
		bedrock_event(s, out, "messageStart", "{\"role\":\"assistant\"}");
		return;
	}
	evbuffer_add_printf(s->ev,
			    "{\"type\":\"message_start\",\"message\":{\"id\":\"%s\",\"type\":\"message\","
			    "\"role\":\"assistant\",\"model\":%s,\"content\":[],\"stop_reason\":null,"
			    "\"stop_sequence\":null,\"usage\":",
			    s->id, s->model_json);
	anthropic_usage(s, s->ev, AU_START);
	evbuffer_add(s->ev, "}}", 2);
	bedrock_emit(s, out, "chunk");
}

/* A block opens (InvokeModel's Anthropic events; Converse sends no start
 * for a text or reasoning block). */
void bedrock_open_block(struct sim_stream *s, struct evbuffer *out, int index, bool thinking)
{
	if (s->ep != EP_BEDROCK_INVOKE)
		return;
	evbuffer_add_printf(s->ev, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":%s}", index,
			    thinking ? "{\"type\":\"thinking\",\"thinking\":\"\"}"
				     : "{\"type\":\"text\",\"text\":\"\"}");
	bedrock_emit(s, out, "chunk");
}

void bedrock_close_block(struct sim_stream *s, struct evbuffer *out, int index)
{
	if (s->ep == EP_BEDROCK_CONVERSE)
		evbuffer_add_printf(s->ev, "{\"contentBlockIndex\":%d}", index);
	else
		evbuffer_add_printf(s->ev, "{\"type\":\"content_block_stop\",\"index\":%d}", index);
	bedrock_emit(s, out, "contentBlockStop");
}

void bedrock_token(struct sim_stream *s, struct evbuffer *out, bool reasoning, const char *p, size_t plen)
{
	int index = reasoning ? 0 : answer_index(s);

	if (s->ep == EP_BEDROCK_CONVERSE) {
		evbuffer_add_printf(s->ev, "{\"contentBlockIndex\":%d,\"delta\":{%s", index,
				    reasoning ? "\"reasoningContent\":{\"text\":" : "\"text\":");
		sim_json_str(s->ev, p, plen);
		evbuffer_add(s->ev, reasoning ? "}}}" : "}}", reasoning ? 3 : 2);
	} else {
		evbuffer_add_printf(
			s->ev,
			"{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":", index,
			reasoning ? "thinking_delta" : "text_delta", reasoning ? "thinking" : "text");
		sim_json_str(s->ev, p, plen);
		evbuffer_add(s->ev, "}}", 2);
	}
	bedrock_emit(s, out, "contentBlockDelta");
}

/* The end: the answer block's stop, then either the exception asked for
 * (Bedrock ends a stream with it) or the stop and the usage. */
void bedrock_finish(struct sim_stream *s, struct evbuffer *out)
{
	bedrock_close_block(s, out, answer_index(s));
	if (s->exception != NULL) {
		struct evbuffer *frame = evbuffer_new();
		static const char msg[] = "{\"message\":\"Too many requests, please wait before trying again.\"}";
		sim_es_exception(frame, s->exception, msg, sizeof(msg) - 1);
		evbuffer_add_buffer(s->ev, frame);
		evbuffer_free(frame);
		emit_chunk(s, out);
		return;
	}
	if (s->ep == EP_BEDROCK_CONVERSE) {
		evbuffer_add_printf(s->ev, "{\"stopReason\":\"%s\"}", finish_reason(s));
		bedrock_emit(s, out, "messageStop");
		evbuffer_add(s->ev, "{", 1);
		converse_usage(s, s->ev);
		evbuffer_add(s->ev, "}", 1);
		bedrock_emit(s, out, "metadata");
		return;
	}
	evbuffer_add_printf(s->ev,
			    "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":null},"
			    "\"usage\":",
			    finish_reason(s));
	anthropic_usage(s, s->ev, AU_DELTA);
	evbuffer_add(s->ev, "}", 1);
	bedrock_emit(s, out, "chunk");
	evbuffer_add_printf(
		s->ev,
		"{\"type\":\"message_stop\",\"amazon-bedrock-invocationMetrics\":{\"inputTokenCount\":%" PRIu64
		",\"outputTokenCount\":%" PRIu64 ",\"invocationLatency\":%" PRIu64 ",\"firstByteLatency\":%" PRIu64
		"}}",
		s->n_in - s->n_cached - s->n_cache_write, s->n_reason + s->n_out, bedrock_latency_ms(s),
		bedrock_first_byte_ms(s));
	bedrock_emit(s, out, "chunk");
}

/* The whole answer: Converse's output message, or InvokeModel's Anthropic
 * message. */
void bedrock_block(struct sim_stream *s, struct evbuffer *b)
{
	size_t tlen, rlen;
	const char *t = buf_text(s->text, &tlen), *r;

	if (s->ep == EP_BEDROCK_CONVERSE) {
		evbuffer_add(b, "{", 1);
		converse_usage(s, b);
		evbuffer_add(b, ",\"output\":{\"message\":{\"content\":[", 33);
		if (shows_reasoning(s)) {
			evbuffer_add(b, "{\"reasoningContent\":{\"reasoningText\":{\"text\":", 45);
			r = buf_text(s->reason, &rlen);
			sim_json_str(b, r, rlen);
			evbuffer_add(b, "}}},", 4);
		}
		evbuffer_add(b, "{\"text\":", 8);
		sim_json_str(b, t, tlen);
		evbuffer_add_printf(b, "}],\"role\":\"assistant\"}},\"stopReason\":\"%s\"}", finish_reason(s));
		return;
	}
	evbuffer_add_printf(b,
			    "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%s,"
			    "\"content\":[{\"type\":\"text\",\"text\":",
			    s->id, s->model_json);
	sim_json_str(b, t, tlen);
	evbuffer_add_printf(b, "}],\"stop_reason\":\"%s\",\"stop_sequence\":null,\"usage\":", finish_reason(s));
	anthropic_usage(s, b, AU_BLOCK);
	evbuffer_add(b, "}", 1);
}

void bedrock_invoke_headers(struct sim_stream *s, char *buf, size_t size)
{
	snprintf(buf, size,
		 "x-amzn-bedrock-invocation-latency: %" PRIu64 "\r\nx-amzn-bedrock-input-token-count: %" PRIu64
		 "\r\nx-amzn-bedrock-output-token-count: %" PRIu64 "\r\n",
		 bedrock_latency_ms(s), s->n_in - s->n_cached - s->n_cache_write, s->n_reason + s->n_out);
}
