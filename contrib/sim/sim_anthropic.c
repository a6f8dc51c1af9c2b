/*
 * sim_anthropic.c — the bytes of Anthropic's messages API: the events of a
 * stream (message_start, the thinking block with its signature, the text
 * or tool_use block with a ping, one content_block_delta per token,
 * message_delta with the usage, message_stop), the whole body, and the
 * usage object, which Bedrock's InvokeModel sends too (sim_bedrock.c).
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>

static void anthropic_event(struct sim_stream *s, struct evbuffer *out, const char *name, const char *fmt_json)
{
	evbuffer_add_printf(s->ev, "event: %s\ndata: %s\n\n", name, fmt_json);
	emit_chunk(s, out);
}

/*
 * Anthropic's usage: input_tokens excludes what was read from or written
 * to the cache (the total prompt is the sum of the three). message_start
 * says output_tokens 1, as the real API; message_delta repeats the input
 * counts only when the cache is reported.
 */
void anthropic_usage(struct sim_stream *s, struct evbuffer *b, enum anthropic_usage_at at)
{
	uint64_t fresh = s->n_in - s->n_cached - s->n_cache_write;

	evbuffer_add(b, "{", 1);
	if (at != AU_DELTA || s->cache_report)
		evbuffer_add_printf(b, "\"input_tokens\":%" PRIu64 ",", fresh);
	if (s->cache_report)
		evbuffer_add_printf(
			b, "\"cache_creation_input_tokens\":%" PRIu64 ",\"cache_read_input_tokens\":%" PRIu64 ",",
			s->n_cache_write, s->n_cached);
	evbuffer_add_printf(b, "\"output_tokens\":%" PRIu64, at == AU_START ? 1 : s->n_reason + s->n_out);
	if (at != AU_START && s->n_reason > 0)
		evbuffer_add_printf(b, ",\"output_tokens_details\":{\"thinking_tokens\":%" PRIu64 "}", s->n_reason);
	evbuffer_add(b, "}", 1);
}

/* The thinking block's signature: opaque to clients, fixed per stream. */
static void anthropic_signature(const struct sim_stream *s, struct evbuffer *b)
{
	evbuffer_add_printf(b, "\"EqoBCkgIARAB%s%s\"", s->hex, s->id + 6);
}

/* message_start: sent with the first token, as Anthropic's API does. */
void anthropic_preamble(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add_printf(s->ev,
			    "event: message_start\ndata: {\"type\":\"message_start\","
			    "\"message\":{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\","
			    "\"model\":%s,\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
			    "\"usage\":",
			    s->id, s->model_json);
	anthropic_usage(s, s->ev, AU_START);
	evbuffer_add(s->ev, "}}\n\n", 4);
	emit_chunk(s, out);
}

/* The thinking block opens, with a ping. */
void anthropic_open_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	anthropic_event(s, out, "content_block_start",
			"{\"type\":\"content_block_start\",\"index\":0,"
			"\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}");
	anthropic_event(s, out, "ping", "{\"type\": \"ping\"}");
}

/* After the last thinking token: the signature and the block's end. */
void anthropic_close_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add(s->ev,
		     "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
		     "\"delta\":{\"type\":\"signature_delta\",\"signature\":",
		     119);
	anthropic_signature(s, s->ev);
	evbuffer_add(s->ev, "}}\n\n", 4);
	emit_chunk(s, out);
	anthropic_event(s, out, "content_block_stop", "{\"type\":\"content_block_stop\",\"index\":0}");
}

/* The answer block opens: text or tool_use (a ping first when no thinking
 * block came before it). */
void anthropic_open_answer(struct sim_stream *s, struct evbuffer *out)
{
	char tid[48];

	evbuffer_add_printf(s->ev, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":%d,",
			    answer_index(s));
	if (s->tool)
		evbuffer_add_printf(
			s->ev, "\"content_block\":{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":%s,\"input\":{}}}\n\n",
			hex_id(s, "toolu_01", 24, tid, sizeof(tid)), s->tool_json);
	else
		evbuffer_add(s->ev, "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n", 44);
	emit_chunk(s, out);
	if (!shows_reasoning(s))
		anthropic_event(s, out, "ping", "{\"type\": \"ping\"}");
}

/* One token: thinking, a piece of the tool's input JSON, or text. */
void anthropic_token(struct sim_stream *s, bool reasoning, const char *p, size_t plen)
{
	evbuffer_add_printf(s->ev,
			    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
			    "\"index\":%d,\"delta\":{\"type\":\"%s\",\"%s\":",
			    reasoning ? 0 : answer_index(s),
			    reasoning ? "thinking_delta"
			    : s->tool ? "input_json_delta"
				      : "text_delta",
			    reasoning ? "thinking"
			    : s->tool ? "partial_json"
				      : "text");
	sim_json_str(s->ev, p, plen);
	evbuffer_add(s->ev, "}}\n\n", 4);
}

/* The answer block's stop, message_delta with the usage, message_stop. */
void anthropic_finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add_printf(s->ev,
			    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":%d}\n\n",
			    answer_index(s));
	emit_chunk(s, out);
	evbuffer_add_printf(s->ev,
			    "event: message_delta\ndata: {\"type\":\"message_delta\","
			    "\"delta\":{\"stop_reason\":\"%s\",\"stop_sequence\":null},\"usage\":",
			    finish_reason(s));
	anthropic_usage(s, s->ev, AU_DELTA);
	evbuffer_add(s->ev, "}\n\n", 3);
	emit_chunk(s, out);
	anthropic_event(s, out, "message_stop", "{\"type\":\"message_stop\"}");
}

/* The whole message. */
void anthropic_block(struct sim_stream *s, struct evbuffer *b)
{
	size_t tlen, rlen;
	const char *t = buf_text(s->text, &tlen), *r;

	evbuffer_add_printf(b,
			    "{\"id\":\"%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%s,"
			    "\"content\":[",
			    s->id, s->model_json);
	if (shows_reasoning(s)) {
		evbuffer_add(b, "{\"type\":\"thinking\",\"thinking\":", 30);
		r = buf_text(s->reason, &rlen);
		sim_json_str(b, r, rlen);
		evbuffer_add(b, ",\"signature\":", 13);
		anthropic_signature(s, b);
		evbuffer_add(b, "},", 2);
	}
	if (s->tool) {
		char tid[48];

		evbuffer_add_printf(b, "{\"type\":\"tool_use\",\"id\":\"%s\",\"name\":%s,\"input\":",
				    hex_id(s, "toolu_01", 24, tid, sizeof(tid)), s->tool_json);
		t = buf_text(s->text, &tlen);
		evbuffer_add(b, t, tlen);
	} else {
		evbuffer_add(b, "{\"type\":\"text\",\"text\":", 22);
		t = buf_text(s->text, &tlen);
		sim_json_str(b, t, tlen);
	}
	evbuffer_add_printf(b, "}],\"stop_reason\":\"%s\",\"stop_sequence\":null,\"usage\":", finish_reason(s));
	anthropic_usage(s, b, AU_BLOCK);
	evbuffer_add(b, "}", 1);
}
