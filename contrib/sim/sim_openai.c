/*
 * sim_openai.c — the bytes of OpenAI's chat completions and completions,
 * shaped like vLLM's: the chunks of a stream (a role chunk first, one per
 * token, the finish chunk, the usage chunk with stream_options.include_usage,
 * [DONE]), the whole body, and the scheduler's report (--server-timing) in
 * vLLM's "metrics" or llama.cpp's "timings".
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>

/* `{"id":..,"object":..,"created":..,"model":..,"choices":[` */
static void openai_prefix(struct sim_stream *s, struct evbuffer *b, const char *object)
{
	evbuffer_add_printf(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%" PRIu64 ",\"model\":%s,\"choices\":[",
			    s->id, object, s->created, s->model_json);
}

/* Usage; the details only where there is something to say, as vLLM. */
static void openai_usage(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t out = s->n_reason + s->n_out;

	evbuffer_add_printf(b,
			    "\"usage\":{\"prompt_tokens\":%" PRIu64 ",\"completion_tokens\":%" PRIu64
			    ",\"total_tokens\":%" PRIu64,
			    s->n_in, out, s->n_in + out);
	if (s->cache_report)
		evbuffer_add_printf(b, ",\"prompt_tokens_details\":{\"cached_tokens\":%" PRIu64 "}", s->n_cached);
	if (s->n_reason > 0)
		evbuffer_add_printf(b, ",\"completion_tokens_details\":{\"reasoning_tokens\":%" PRIu64 "}",
				    s->n_reason);
	evbuffer_add(b, "}", 1);
}

/* The end of a chunk, `]}` and the blank line; with continuous usage the
 * usage of the chunks so far in between, as vLLM's continuous_usage_stats
 * puts it on every chunk. */
static void openai_chunk_end(struct sim_stream *s)
{
	evbuffer_add(s->ev, "]", 1);
	if (s->continuous_usage)
		evbuffer_add_printf(s->ev,
				    ",\"usage\":{\"prompt_tokens\":%" PRIu64 ",\"completion_tokens\":%" PRIu64
				    ",\"total_tokens\":%" PRIu64 "}",
				    s->n_in, s->counted, s->n_in + s->counted);
	evbuffer_add(s->ev, "}\n\n", 3);
}

static const char *openai_object(const struct sim_stream *s, bool chunk)
{
	if (s->ep == EP_COMPLETIONS)
		return "text_completion";
	return chunk ? "chat.completion.chunk" : "chat.completion";
}

/* A chat tool call, whole: `{"id":..,"type":"function","function":{..}}`. */
static void chat_tool_call(struct sim_stream *s, struct evbuffer *b, const char *args, size_t alen, bool with_index)
{
	char cid[48];

	evbuffer_add_printf(b, "{%s\"id\":\"%s\",\"type\":\"function\",\"function\":{\"name\":%s,\"arguments\":",
			    with_index ? "\"index\":0," : "", hex_id(s, "call_", 24, cid, sizeof(cid)), s->tool_json);
	sim_json_str(b, args, alen);
	evbuffer_add(b, "}}", 2);
}

/* The role chunk: sent with the first token, as vLLM does. */
void openai_preamble(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add(s->ev, "data: ", 6);
	openai_prefix(s, s->ev, "chat.completion.chunk");
	evbuffer_add_printf(s->ev,
			    "{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
			    "\"logprobs\":null,\"finish_reason\":null}");
	openai_chunk_end(s);
	emit_chunk(s, out);
}

/* One chat token: reasoning_content, a tool call's piece, or content. */
void openai_chat_token(struct sim_stream *s, uint64_t k, bool reasoning, const char *p, size_t plen)
{
	evbuffer_add(s->ev, "data: ", 6);
	openai_prefix(s, s->ev, "chat.completion.chunk");
	if (reasoning) {
		evbuffer_add(s->ev, "{\"index\":0,\"delta\":{\"reasoning_content\":", 40);
		sim_json_str(s->ev, p, plen);
	} else if (s->tool && k == s->n_reason) {
		evbuffer_add(s->ev, "{\"index\":0,\"delta\":{\"tool_calls\":[", 34);
		chat_tool_call(s, s->ev, p, plen, true);
		evbuffer_add(s->ev, "]", 1);
	} else if (s->tool) {
		evbuffer_add(s->ev,
			     "{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":", 69);
		sim_json_str(s->ev, p, plen);
		evbuffer_add(s->ev, "}}]", 3);
	} else {
		evbuffer_add(s->ev, "{\"index\":0,\"delta\":{\"content\":", 30);
		sim_json_str(s->ev, p, plen);
	}
	evbuffer_add_printf(s->ev, "},\"logprobs\":null,\"finish_reason\":null}");
	openai_chunk_end(s);
}

/* One completions token. */
void openai_completion_token(struct sim_stream *s, const char *p, size_t plen)
{
	evbuffer_add(s->ev, "data: ", 6);
	openai_prefix(s, s->ev, "text_completion");
	evbuffer_add(s->ev, "{\"index\":0,\"text\":", 18);
	sim_json_str(s->ev, p, plen);
	evbuffer_add_printf(s->ev, ",\"logprobs\":null,\"finish_reason\":null}");
	openai_chunk_end(s);
}

/* The finish chunk, the usage chunk when asked for, [DONE]. */
void openai_finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add(s->ev, "data: ", 6);
	openai_prefix(s, s->ev, openai_object(s, true));
	evbuffer_add_printf(s->ev, "{\"index\":0,%s,\"logprobs\":null,\"finish_reason\":\"%s\"}]",
			    s->ep == EP_CHAT ? "\"delta\":{}" : "\"text\":\"\"", finish_reason(s));
	if (s->continuous_usage) {
		evbuffer_add(s->ev, ",", 1);
		openai_usage(s, s->ev);
	}
	/* llama.cpp: timings on the burst's last chunk; vLLM: only
	 * on the usage chunk */
	if (!s->include_usage && sim_cfg.server_timing == SIM_TIMING_LLAMACPP)
		openai_timing(s, s->ev);
	evbuffer_add(s->ev, "}\n\n", 3);
	emit_chunk(s, out);
	if (s->include_usage) {
		evbuffer_add(s->ev, "data: ", 6);
		openai_prefix(s, s->ev, openai_object(s, true));
		evbuffer_add(s->ev, "],", 2);
		openai_usage(s, s->ev);
		openai_timing(s, s->ev);
		evbuffer_add(s->ev, "}\n\n", 3);
		emit_chunk(s, out);
	}
	evbuffer_add(s->ev, "data: [DONE]\n\n", 14);
	emit_chunk(s, out);
}

/* The whole chat.completion or text_completion body. */
void openai_block(struct sim_stream *s, struct evbuffer *b)
{
	size_t tlen, rlen;
	const char *t = buf_text(s->text, &tlen), *r;

	openai_prefix(s, b, openai_object(s, false));
	if (s->ep == EP_CHAT) {
		evbuffer_add_printf(b, "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
		if (s->tool)
			evbuffer_add(b, "null", 4);
		else
			sim_json_str(b, t, tlen);
		if (shows_reasoning(s)) {
			evbuffer_add(b, ",\"reasoning_content\":", 21);
			r = buf_text(s->reason, &rlen);
			sim_json_str(b, r, rlen);
		}
		if (s->tool) {
			evbuffer_add(b, ",\"tool_calls\":[", 15);
			t = buf_text(s->text, &tlen);
			chat_tool_call(s, b, t, tlen, false);
			evbuffer_add(b, "]", 1);
		}
		evbuffer_add(b, "}", 1);
	} else {
		evbuffer_add_printf(b, "{\"index\":0,\"text\":");
		sim_json_str(b, t, tlen);
	}
	evbuffer_add_printf(b, ",\"logprobs\":null,\"finish_reason\":\"%s\"}],", finish_reason(s));
	openai_usage(s, b);
	openai_timing(s, b);
	evbuffer_add(b, "}", 1);
}

/* The OpenAI routes' report, with a leading comma: vLLM's "metrics" (on the
 * usage chunk or body) or llama.cpp's "timings" (on the stream's last
 * chunk or the body). Nothing when the account is not reported. */
void openai_timing(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t out = s->n_reason + s->n_out;

	if (!s->timing.known)
		return;
	if (sim_cfg.server_timing == SIM_TIMING_VLLM) {
		evbuffer_add(b, ",\"metrics\":{", 12);
		add_ms(b, "time_to_first_token_ms", s->timing.prefill_ns);
		evbuffer_add(b, ",", 1);
		add_ms(b, "generation_time_ms", s->timing.decode_ns);
		evbuffer_add(b, ",", 1);
		add_ms(b, "queue_time_ms", s->timing.queue_ns);
		if (out > 1) {
			evbuffer_add(b, ",", 1);
			add_ms(b, "mean_itl_ms", s->timing.decode_ns / (out - 1));
		} else {
			evbuffer_add(b, ",\"mean_itl_ms\":null", 19);
		}
		evbuffer_add(b, "}", 1);
	} else if (sim_cfg.server_timing == SIM_TIMING_LLAMACPP) {
		uint64_t prompt_n = s->n_in > s->n_cached ? s->n_in - s->n_cached : 0;
		evbuffer_add_printf(b, ",\"timings\":{\"cache_n\":%" PRIu64 ",\"prompt_n\":%" PRIu64 ",", s->n_cached,
				    prompt_n);
		add_ms(b, "prompt_ms", s->timing.prefill_ns);
		evbuffer_add_printf(b, ",\"predicted_n\":%" PRIu64 ",", out);
		add_ms(b, "predicted_ms", s->timing.decode_ns);
		evbuffer_add(b, "}", 1);
	}
}
