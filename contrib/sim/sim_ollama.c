/*
 * sim_ollama.c — the bytes of Ollama's /api/chat and /api/generate: one
 * NDJSON line per token (a tool call whole, in one line at its last
 * token), the closing line with the durations, the whole body. created_at
 * and the durations are nominal, from the seed's epoch and the stream's
 * timing, unless the scheduler's account is reported (--server-timing).
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>
#include <time.h>

/* Ollama's created_at: the nominal moment of event k, from the seed's epoch. */
static void ollama_time(struct sim_stream *s, struct evbuffer *b, uint64_t offset_ns)
{
	time_t t = (time_t)(s->created + offset_ns / 1000000000ULL);
	struct tm tm;
	char date[32];

	gmtime_r(&t, &tm);
	strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
	evbuffer_add_printf(b, "\"created_at\":\"%s.%09" PRIu64 "Z\"", date, (uint64_t)(offset_ns % 1000000000ULL));
}

/* Ollama: a tool call, whole (arguments an object, as Ollama sends them). */
static void ollama_tool_calls(struct sim_stream *s, struct evbuffer *b, const char *args, size_t alen)
{
	char cid[48];

	evbuffer_add_printf(b, ",\"tool_calls\":[{\"id\":\"%s\",\"function\":{\"index\":0,\"name\":%s,\"arguments\":",
			    hex_id(s, "call_", 8, cid, sizeof(cid)), s->tool_json);
	evbuffer_add(b, args, alen);
	evbuffer_add(b, "}}]", 3);
}

/* Ollama's closing fields, shared by the last NDJSON line and the block.
 * Nominal durations, unless the scheduler's account is reported: then its
 * queue wait is the load_duration (Ollama's runs from the request to a
 * runner being ready, its own scheduler's wait included). */
static void ollama_tail(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t n = s->n_reason + s->n_out, eval_ns = nominal_ns(s, n) - s->ttft_ns;
	uint64_t load = 0, prompt = s->ttft_ns;

	if (s->timing.known) {
		load = s->timing.queue_ns;
		prompt = s->timing.prefill_ns;
		eval_ns = s->timing.decode_ns;
	}
	evbuffer_add_printf(b,
			    "\"done_reason\":\"%s\",\"done\":true,\"total_duration\":%" PRIu64
			    ",\"load_duration\":%" PRIu64 ",\"prompt_eval_count\":%" PRIu64
			    ",\"prompt_eval_duration\":%" PRIu64 ",\"eval_count\":%" PRIu64
			    ",\"eval_duration\":%" PRIu64 "}",
			    finish_reason(s), load + prompt + eval_ns, load, s->n_in, prompt, n, eval_ns);
}

/* One token's line: thinking, the tool call (whole, at its last token), or
 * the text. */
void ollama_token(struct sim_stream *s, uint64_t k, bool reasoning, bool last, const char *p, size_t plen)
{
	/* Ollama sends a tool call whole, once parsed: one line at its
	 * last token, none before. */
	if (s->tool && !reasoning && !last)
		return;
	evbuffer_add_printf(s->ev, "{\"model\":%s,", s->model_json);
	ollama_time(s, s->ev, nominal_ns(s, k));
	if (s->ep == EP_OLLAMA_CHAT)
		evbuffer_add(s->ev, ",\"message\":{\"role\":\"assistant\",\"content\":", 41);
	else
		evbuffer_add(s->ev, ",\"response\":", 12);
	if (reasoning) {
		evbuffer_add(s->ev, "\"\",\"thinking\":", 14);
		sim_json_str(s->ev, p, plen);
	} else if (s->tool) {
		size_t alen;
		const char *args = buf_text(s->text, &alen);

		evbuffer_add(s->ev, "\"\"", 2);
		ollama_tool_calls(s, s->ev, args, alen);
	} else {
		sim_json_str(s->ev, p, plen);
	}
	evbuffer_add_printf(s->ev, "%s,\"done\":false}\n", s->ep == EP_OLLAMA_CHAT ? "}" : "");
}

/* The closing line: done, why, the counts and the durations. */
void ollama_finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add_printf(s->ev, "{\"model\":%s,", s->model_json);
	ollama_time(s, s->ev, nominal_ns(s, s->n_reason + s->n_out));
	if (s->ep == EP_OLLAMA_CHAT)
		evbuffer_add_printf(s->ev, ",\"message\":{\"role\":\"assistant\",\"content\":\"\"},");
	else
		evbuffer_add_printf(s->ev, ",\"response\":\"\",");
	ollama_tail(s, s->ev);
	evbuffer_add(s->ev, "\n", 1);
	emit_chunk(s, out);
}

/* The whole answer: one object, the closing fields included. */
void ollama_block(struct sim_stream *s, struct evbuffer *b)
{
	size_t tlen, rlen;
	const char *t = buf_text(s->text, &tlen), *r;

	evbuffer_add_printf(b, "{\"model\":%s,", s->model_json);
	ollama_time(s, b, nominal_ns(s, s->n_reason + s->n_out));
	if (s->ep == EP_OLLAMA_CHAT)
		evbuffer_add_printf(b, ",\"message\":{\"role\":\"assistant\",\"content\":");
	else
		evbuffer_add_printf(b, ",\"response\":");
	if (s->tool)
		evbuffer_add(b, "\"\"", 2);
	else
		sim_json_str(b, t, tlen);
	if (shows_reasoning(s)) {
		evbuffer_add(b, ",\"thinking\":", 12);
		r = buf_text(s->reason, &rlen);
		sim_json_str(b, r, rlen);
	}
	if (s->tool) {
		t = buf_text(s->text, &tlen);
		ollama_tool_calls(s, b, t, tlen);
	}
	evbuffer_add_printf(b, "%s,", s->ep == EP_OLLAMA_CHAT ? "}" : "");
	ollama_tail(s, b);
}
