/*
 * sim_responses.c — the bytes of OpenAI's Responses API, shaped like the
 * hosted API: the Response object (in progress, or completed with its
 * items and usage: the whole body too), and the events of a stream, each
 * named twice (`event:` and "type") and numbered by sequence_number, no
 * [DONE]: created and in_progress, the reasoning item (raw text, or a
 * summary with `reasoning.summary`), the answer item (a message or a
 * function call), one delta per token, the .done events, completed.
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>

/* ---- OpenAI Responses: events named twice (`event:` and "type"),
 * numbered by sequence_number, no [DONE] ---- */

/* Opens event `type` in the scratch buffer, up to its sequence_number. */
static void resp_event_open(struct sim_stream *s, const char *type)
{
	evbuffer_add_printf(s->ev, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%" PRIu64, type, type,
			    s->seq++);
}

/* Closes the event opened above (its last member written) as one chunk. */
static void resp_event_close(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add(s->ev, "}\n\n", 3);
	emit_chunk(s, out);
}

/* The answer item's id: "msg_" (a message) or "fc_" (a function call) and
 * the response id's hex; the reasoning item's: "rs_" and the same. */
static const char *resp_item_id(const struct sim_stream *s, char *buf, size_t n)
{
	return hex_id(s, s->tool ? "fc_" : "msg_", 32, buf, n);
}

/* The answer item: a message holding the text, or a function call. */
static void resp_item(struct sim_stream *s, struct evbuffer *b, const char *status, bool with_content)
{
	char mid[48], cid[48];
	size_t tlen;
	const char *t = buf_text(s->text, &tlen);

	if (s->tool) {
		evbuffer_add_printf(b, "{\"id\":\"%s\",\"type\":\"function_call\",\"status\":\"%s\",\"arguments\":",
				    resp_item_id(s, mid, sizeof(mid)), status);
		sim_json_str(b, with_content ? t : "", with_content ? tlen : 0);
		evbuffer_add_printf(b, ",\"call_id\":\"%s\",\"name\":%s}", hex_id(s, "call_", 32, cid, sizeof(cid)),
				    s->tool_json);
		return;
	}
	evbuffer_add_printf(
		b, "{\"id\":\"%s\",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[",
		resp_item_id(s, mid, sizeof(mid)), status);
	if (with_content) {
		evbuffer_add(b, "{\"type\":\"output_text\",\"text\":", 29);
		sim_json_str(b, t, tlen);
		evbuffer_add(b, ",\"annotations\":[],\"logprobs\":[]}", 32);
	}
	evbuffer_add(b, "]}", 2);
}

/* The reasoning item: raw reasoning text (as vLLM, SGLang, llama.cpp), or
 * with a `reasoning.summary` request a summary (as the hosted API). */
static void resp_reason_item(struct sim_stream *s, struct evbuffer *b, bool done)
{
	char rid[48];
	size_t rlen;
	const char *r = buf_text(s->reason, &rlen);

	evbuffer_add_printf(b, "{\"id\":\"%s\",\"type\":\"reasoning\",\"status\":\"%s\",\"summary\":[",
			    hex_id(s, "rs_", 32, rid, sizeof(rid)), done ? "completed" : "in_progress");
	if (done && s->summary) {
		evbuffer_add(b, "{\"type\":\"summary_text\",\"text\":", 30);
		sim_json_str(b, r, rlen);
		evbuffer_add(b, "}", 1);
	}
	evbuffer_add(b, "]", 1);
	if (done && !s->summary) {
		evbuffer_add(b, ",\"content\":[{\"type\":\"reasoning_text\",\"text\":", 44);
		sim_json_str(b, r, rlen);
		evbuffer_add(b, "}]", 2);
	}
	evbuffer_add(b, "}", 1);
}

/* The Response object: in progress (no output, usage null) or completed
 * with its items and usage. */

void resp_object(struct sim_stream *s, struct evbuffer *b, bool done)
{
	uint64_t out = s->n_reason + s->n_out;

	evbuffer_add_printf(b,
			    "{\"id\":\"%s\",\"object\":\"response\",\"created_at\":%" PRIu64
			    ",\"status\":\"%s\",\"model\":%s,\"output\":[",
			    s->id, s->created, done ? "completed" : "in_progress", s->model_json);
	if (done && shows_reasoning(s)) {
		resp_reason_item(s, b, true);
		evbuffer_add(b, ",", 1);
	}
	if (done)
		resp_item(s, b, "completed", true);
	evbuffer_add(b, "],\"usage\":", 10);
	if (done)
		evbuffer_add_printf(b,
				    "{\"input_tokens\":%" PRIu64 ",\"input_tokens_details\":{\"cached_tokens\":%" PRIu64
				    "},\"output_tokens\":%" PRIu64
				    ",\"output_tokens_details\":{\"reasoning_tokens\":%" PRIu64
				    "},\"total_tokens\":%" PRIu64 "}",
				    s->n_in, s->n_cached, out, s->n_reason, s->n_in + out);
	else
		evbuffer_add(b, "null", 4);
	/* vLLM reports in the finished Response (llama.cpp's has none) */
	if (done && sim_cfg.server_timing == SIM_TIMING_VLLM)
		openai_timing(s, b);
	evbuffer_add(b, ",\"error\":null,\"incomplete_details\":null}", 40);
}

/* created, in_progress. */
void resp_preamble(struct sim_stream *s, struct evbuffer *out)
{
	resp_event_open(s, "response.created");
	evbuffer_add(s->ev, ",\"response\":", 12);
	resp_object(s, s->ev, false);
	resp_event_close(s, out);
	resp_event_open(s, "response.in_progress");
	evbuffer_add(s->ev, ",\"response\":", 12);
	resp_object(s, s->ev, false);
	resp_event_close(s, out);
}

/* `"item_id":..,"output_index":..,` then the part's own index member. */
static void resp_where(struct sim_stream *s, const char *item_id, int output_index, const char *index_name)
{
	evbuffer_add_printf(s->ev, ",\"item_id\":\"%s\",\"output_index\":%d", item_id, output_index);
	if (index_name != NULL)
		evbuffer_add_printf(s->ev, ",\"%s\":0", index_name);
}

/* The reasoning item added, its (summary) part added. */
void resp_open_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	char rid[48];

	hex_id(s, "rs_", 32, rid, sizeof(rid));
	resp_event_open(s, "response.output_item.added");
	evbuffer_add(s->ev, ",\"output_index\":0,\"item\":", 25);
	resp_reason_item(s, s->ev, false);
	resp_event_close(s, out);
	resp_event_open(s, s->summary ? "response.reasoning_summary_part.added" : "response.content_part.added");
	resp_where(s, rid, 0, s->summary ? "summary_index" : "content_index");
	evbuffer_add_printf(s->ev, ",\"part\":{\"type\":\"%s\",\"text\":\"\"}",
			    s->summary ? "summary_text" : "reasoning_text");
	resp_event_close(s, out);
}

/* The reasoning text's .done events and the item's. */
void resp_close_reasoning(struct sim_stream *s, struct evbuffer *out)
{
	char rid[48];
	size_t rlen;
	const char *r = buf_text(s->reason, &rlen);

	hex_id(s, "rs_", 32, rid, sizeof(rid));
	resp_event_open(s, s->summary ? "response.reasoning_summary_text.done" : "response.reasoning_text.done");
	resp_where(s, rid, 0, s->summary ? "summary_index" : "content_index");
	evbuffer_add(s->ev, ",\"text\":", 8);
	sim_json_str(s->ev, r, rlen);
	resp_event_close(s, out);
	resp_event_open(s, s->summary ? "response.reasoning_summary_part.done" : "response.content_part.done");
	resp_where(s, rid, 0, s->summary ? "summary_index" : "content_index");
	evbuffer_add_printf(s->ev,
			    ",\"part\":{\"type\":\"%s\",\"text\":", s->summary ? "summary_text" : "reasoning_text");
	r = buf_text(s->reason, &rlen);
	sim_json_str(s->ev, r, rlen);
	evbuffer_add(s->ev, "}", 1);
	resp_event_close(s, out);
	resp_event_open(s, "response.output_item.done");
	evbuffer_add(s->ev, ",\"output_index\":0,\"item\":", 25);
	resp_reason_item(s, s->ev, true);
	resp_event_close(s, out);
}

/* The answer item added and, for a message, its text part added. */
void resp_open_answer(struct sim_stream *s, struct evbuffer *out)
{
	char mid[48];

	resp_event_open(s, "response.output_item.added");
	evbuffer_add_printf(s->ev, ",\"output_index\":%d,\"item\":", answer_index(s));
	resp_item(s, s->ev, "in_progress", false);
	resp_event_close(s, out);
	if (s->tool)
		return;
	resp_event_open(s, "response.content_part.added");
	resp_where(s, resp_item_id(s, mid, sizeof(mid)), answer_index(s), "content_index");
	evbuffer_add(s->ev, ",\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[],\"logprobs\":[]}",
		     71);
	resp_event_close(s, out);
}

/* One token's delta event: reasoning, text or function-call arguments. */
void resp_delta(struct sim_stream *s, struct evbuffer *out, bool reasoning, const char *w, size_t wlen)
{
	char id[48];

	if (reasoning) {
		resp_event_open(s,
				s->summary ? "response.reasoning_summary_text.delta" : "response.reasoning_text.delta");
		resp_where(s, hex_id(s, "rs_", 32, id, sizeof(id)), 0, s->summary ? "summary_index" : "content_index");
	} else if (s->tool) {
		resp_event_open(s, "response.function_call_arguments.delta");
		resp_where(s, resp_item_id(s, id, sizeof(id)), answer_index(s), NULL);
	} else {
		resp_event_open(s, "response.output_text.delta");
		resp_where(s, resp_item_id(s, id, sizeof(id)), answer_index(s), "content_index");
	}
	evbuffer_add(s->ev, ",\"delta\":", 9);
	sim_json_str(s->ev, w, wlen);
	if (!reasoning && !s->tool)
		evbuffer_add(s->ev, ",\"logprobs\":[]", 14);
	resp_event_close(s, out);
}

/* The answer's .done events, then completed. */
void resp_finish(struct sim_stream *s, struct evbuffer *out)
{
	size_t tlen;
	const char *t;
	char mid[48];
	int ai = answer_index(s);

	resp_item_id(s, mid, sizeof(mid));
	if (s->tool) {
		resp_event_open(s, "response.function_call_arguments.done");
		resp_where(s, mid, ai, NULL);
		evbuffer_add_printf(s->ev, ",\"name\":%s,\"arguments\":", s->tool_json);
		t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		resp_event_close(s, out);
	} else {
		resp_event_open(s, "response.output_text.done");
		resp_where(s, mid, ai, "content_index");
		evbuffer_add(s->ev, ",\"text\":", 8);
		t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		evbuffer_add(s->ev, ",\"logprobs\":[]", 14);
		resp_event_close(s, out);
		resp_event_open(s, "response.content_part.done");
		resp_where(s, mid, ai, "content_index");
		evbuffer_add(s->ev, ",\"part\":{\"type\":\"output_text\",\"text\":", 37);
		t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		evbuffer_add(s->ev, ",\"annotations\":[],\"logprobs\":[]}", 32);
		resp_event_close(s, out);
	}
	resp_event_open(s, "response.output_item.done");
	evbuffer_add_printf(s->ev, ",\"output_index\":%d,\"item\":", ai);
	resp_item(s, s->ev, "completed", true);
	resp_event_close(s, out);
	resp_event_open(s, "response.completed");
	evbuffer_add(s->ev, ",\"response\":", 12);
	resp_object(s, s->ev, true);
	resp_event_close(s, out);
}
