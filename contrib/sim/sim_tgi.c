/*
 * sim_tgi.c — the bytes of Hugging Face TGI's /generate (never streamed:
 * the body and its x-* timing headers) and /generate_stream (always
 * streamed: one `data:` event per token, the whole text and the details on
 * the last).
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>
#include <stdio.h>

/* TGI's details: why it stopped, the tokens, the prompt's length on the
 * stream (input_length), the seed. */
static void tgi_details(struct sim_stream *s, struct evbuffer *b, bool stream)
{
	evbuffer_add_printf(b, "{\"finish_reason\":\"%s\",\"generated_tokens\":%" PRIu64 ",\"seed\":null",
			    s->hit_limit ? "length" : "eos_token", s->n_out);
	if (stream)
		evbuffer_add_printf(b, ",\"input_length\":%" PRIu64, s->n_in);
	evbuffer_add(b, "}", 1);
}

/* One /generate_stream event: the token, and on the last one the whole
 * text and the details (TGI sends them with its last token). */
void tgi_token(struct sim_stream *s, uint64_t k, const char *p, size_t plen, bool last)
{
	evbuffer_add_printf(s->ev, "data:{\"index\":%" PRIu64 ",\"token\":{\"id\":%" PRIu64 ",\"text\":", k + 1,
			    1000 + (k * 7919) % 30000);
	sim_json_str(s->ev, p, plen);
	evbuffer_add_printf(s->ev, ",\"logprob\":-0.25,\"special\":false},\"generated_text\":");
	if (last) {
		size_t tlen;
		const char *t = buf_text(s->text, &tlen);
		sim_json_str(s->ev, t, tlen);
		evbuffer_add_printf(s->ev, ",\"details\":");
		tgi_details(s, s->ev, true);
	} else {
		evbuffer_add_printf(s->ev, "null,\"details\":null");
	}
	evbuffer_add_printf(s->ev, "}\n\n");
}

/* TGI's x-* headers on /generate, integer ms truncated as TGI's
 * as_millis(): the scheduler's queue and its prefill + decode as the
 * inference when reported, else none queued and the nominal times; no
 * validation is simulated (0). */
void tgi_headers(struct sim_stream *s, char *buf, size_t size)
{
	uint64_t queue_ns = 0, infer_ns = nominal_ns(s, s->n_out);

	if (s->timing.known) {
		queue_ns = s->timing.queue_ns;
		infer_ns = s->timing.prefill_ns + s->timing.decode_ns;
	}
	uint64_t q = queue_ns / 1000000, inf = infer_ns / 1000000;
	snprintf(buf, size,
		 "x-compute-type: gpu+optimized\r\nx-total-time: %" PRIu64
		 "\r\nx-validation-time: 0\r\n"
		 "x-queue-time: %" PRIu64 "\r\nx-inference-time: %" PRIu64 "\r\nx-time-per-token: %" PRIu64
		 "\r\nx-prompt-tokens: %" PRIu64 "\r\nx-generated-tokens: %" PRIu64 "\r\n",
		 (queue_ns + infer_ns) / 1000000, q, inf, s->n_out ? inf / s->n_out : 0, s->n_in, s->n_out);
}

/* A stream without tokens: the closing event alone (with tokens, the last
 * token's event closed it). */
void tgi_finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	if (s->emitted == 0) { /* no token: the closing event alone */
		evbuffer_add_printf(s->ev,
				    "data:{\"index\":1,\"token\":{\"id\":0,\"text\":\"\",\"logprob\":0.0,"
				    "\"special\":true},\"generated_text\":\"\",\"details\":");
		tgi_details(s, s->ev, true);
		evbuffer_add_printf(s->ev, "}\n\n");
		emit_chunk(s, out);
	}
}

/* /generate's body: the text, and the details when asked for. */
void tgi_block(struct sim_stream *s, struct evbuffer *b)
{
	size_t tlen;
	const char *t = buf_text(s->text, &tlen);

	evbuffer_add_printf(b, "{\"generated_text\":");
	sim_json_str(b, t, tlen);
	if (s->details) {
		evbuffer_add_printf(b, ",\"details\":");
		tgi_details(s, b, false);
	}
	evbuffer_add_printf(b, "}");
}
