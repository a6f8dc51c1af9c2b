/*
 * sim_llamacpp.c — the bytes of llama.cpp's native /completion: one `data:`
 * object per token, the closing object with llama.cpp's counts, stop type
 * and timings (always sent: the scheduler's account when reported, else the
 * nominal times), the whole body.
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>

/* llama.cpp's closing fields of /completion (the streamed last object and
 * the body), after its "content": its counts, why it stopped and its
 * timings, always sent: the scheduler's account when reported, else the
 * nominal times. */
static void llamacpp_tail(struct sim_stream *s, struct evbuffer *b)
{
	uint64_t n = s->n_out, prompt_n = s->n_in > s->n_cached ? s->n_in - s->n_cached : 0;
	uint64_t prompt_ns = s->ttft_ns, decode_ns = nominal_ns(s, n) - s->ttft_ns;

	if (s->timing.known) {
		prompt_ns = s->timing.prefill_ns;
		decode_ns = s->timing.decode_ns;
	}
	evbuffer_add_printf(b,
			    ",\"tokens\":[],\"id_slot\":0,\"stop\":true,\"model\":%s,\"tokens_predicted\":%" PRIu64
			    ",\"tokens_evaluated\":%" PRIu64
			    ",\"prompt\":\"\",\"has_new_line\":false,\"truncated\":false,"
			    "\"stop_type\":\"%s\",\"stopping_word\":\"\",\"tokens_cached\":%" PRIu64 ",\"timings\":{",
			    s->model_json, n, s->n_in, s->hit_limit ? "limit" : "eos", s->n_in + n);
	evbuffer_add_printf(b, "\"cache_n\":%" PRIu64 ",\"prompt_n\":%" PRIu64 ",", s->n_cached, prompt_n);
	add_ms(b, "prompt_ms", prompt_ns);
	evbuffer_add_printf(b, ",\"predicted_n\":%" PRIu64 ",", n);
	add_ms(b, "predicted_ms", decode_ns);
	evbuffer_add_printf(b, "}}");
}

/* One token's object. */
void llamacpp_token(struct sim_stream *s, uint64_t k, const char *p, size_t plen)
{
	evbuffer_add_printf(s->ev, "data: {\"index\":0,\"content\":");
	sim_json_str(s->ev, p, plen);
	evbuffer_add_printf(s->ev,
			    ",\"tokens\":[],\"stop\":false,\"id_slot\":0,\"tokens_predicted\":%" PRIu64
			    ",\"tokens_evaluated\":%" PRIu64 "}\n\n",
			    k + 1, s->n_in);
}

/* The closing object: an empty content and the closing fields. */
void llamacpp_finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	evbuffer_add_printf(s->ev, "data: {\"index\":0,\"content\":\"\"");
	llamacpp_tail(s, s->ev);
	evbuffer_add_printf(s->ev, "\n\n");
	emit_chunk(s, out);
}

/* The whole answer. */
void llamacpp_block(struct sim_stream *s, struct evbuffer *b)
{
	size_t tlen;
	const char *t = buf_text(s->text, &tlen);

	evbuffer_add_printf(b, "{\"index\":0,\"content\":");
	sim_json_str(b, t, tlen);
	llamacpp_tail(s, b);
}
