/*
 * sim_gemini.c — Gemini's API (Google AI and Vertex AI): the paths
 * (/v1beta/models/MODEL:METHOD, Vertex AI's projects/P/locations/L/...) and
 * the bytes of :generateContent and :streamGenerateContent, every event a
 * whole GenerateContentResponse, no [DONE]; with ?alt=sse one `data:` frame
 * each, else the elements of one JSON array, written as the Gemini API
 * writes it ("[{" then ",\r\n{" then "\n]").
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>
#include <string.h>

/* Moves *p past `lit` when it starts there. */
static bool skip_prefix(const char **p, const char *lit)
{
	size_t n = strlen(lit);

	if (strncmp(*p, lit, n) != 0)
		return false;
	*p += n;
	return true;
}

/* Moves *p past a non-empty segment and its '/'. */
static bool skip_seg(const char **p)
{
	size_t n = strcspn(*p, "/:");

	if (n == 0 || (*p)[n] != '/')
		return false;
	*p += n + 1;
	return true;
}

/* Gemini's paths: /v1beta/models/MODEL:METHOD (also /v1/, /v1alpha/) and
 * Vertex AI's /v1/projects/P/locations/L/publishers/google/models/MODEL:
 * METHOD (also /v1beta1/); the model into `model` (cap bytes). */
bool gemini_endpoint(const char *path, enum sim_endpoint *ep, char *model, size_t cap)
{
	const char *p = path, *colon;
	size_t n;

	if (skip_prefix(&p, "/v1/projects/") || skip_prefix(&p, "/v1beta1/projects/")) {
		if (!skip_seg(&p) || !skip_prefix(&p, "locations/") || !skip_seg(&p) ||
		    !skip_prefix(&p, "publishers/google/models/"))
			return false;
	} else if (!skip_prefix(&p, "/v1beta/models/") && !skip_prefix(&p, "/v1/models/") &&
		   !skip_prefix(&p, "/v1alpha/models/")) {
		return false;
	}
	colon = strchr(p, ':');
	n = colon ? (size_t)(colon - p) : 0;
	if (n == 0 || n >= cap || memchr(p, '/', n) != NULL)
		return false;
	if (strcmp(colon, ":generateContent") == 0)
		*ep = EP_GEMINI;
	else if (strcmp(colon, ":streamGenerateContent") == 0)
		*ep = EP_GEMINI_STREAM;
	else
		return false;
	memcpy(model, p, n);
	model[n] = '\0';
	return true;
}

/* The query names alt=sse. */
bool query_alt_sse(const char *q)
{
	for (; q != NULL && *q != '\0'; q += strcspn(q, "&"), q += *q == '&') {
		if (strncmp(q, "alt=sse", 7) == 0 && (q[7] == '\0' || q[7] == '&'))
			return true;
	}
	return false;
}

/* usageMetadata after `reason` thought and `answer` answer tokens: the
 * counts so far, zero ones left out as proto3's JSON does; thoughts are
 * not in candidatesTokenCount. */
static void gemini_usage(struct sim_stream *s, struct evbuffer *b, uint64_t reason, uint64_t answer)
{
	evbuffer_add_printf(b, "\"usageMetadata\": {\"promptTokenCount\": %" PRIu64, s->n_in);
	if (answer)
		evbuffer_add_printf(b, ",\"candidatesTokenCount\": %" PRIu64, answer);
	evbuffer_add_printf(b, ",\"totalTokenCount\": %" PRIu64, s->n_in + reason + answer);
	if (s->cache_report && s->n_cached)
		evbuffer_add_printf(b, ",\"cachedContentTokenCount\": %" PRIu64, s->n_cached);
	if (reason)
		evbuffer_add_printf(b, ",\"thoughtsTokenCount\": %" PRIu64, reason);
	evbuffer_add_printf(b, ",\"promptTokensDetails\": [{\"modality\": \"TEXT\",\"tokenCount\": %" PRIu64 "}]}",
			    s->n_in);
}

/* What goes before a streamed response: "data: ", or the array's "[" or
 * the separator. s->seq counts the responses written. */
static void gemini_frame_open(struct sim_stream *s)
{
	if (s->sse)
		evbuffer_add(s->ev, "data: ", 6);
	else
		evbuffer_add(s->ev, s->seq == 0 ? "[" : ",\r\n", s->seq == 0 ? 1 : 3);
	s->seq++;
}

static void gemini_open(struct evbuffer *b)
{
	evbuffer_add_printf(b, "{\"candidates\": [{\"content\": {\"parts\": [");
}

/* Closes the parts and the response: finishReason on the last one. */
static void gemini_close(struct sim_stream *s, struct evbuffer *b, bool last, uint64_t reason, uint64_t answer)
{
	evbuffer_add_printf(b, "],\"role\": \"model\"}");
	if (last)
		evbuffer_add_printf(b, ",\"finishReason\": \"%s\"", s->hit_limit ? "MAX_TOKENS" : "STOP");
	evbuffer_add_printf(b, ",\"index\": 0}],");
	gemini_usage(s, b, reason, answer);
	evbuffer_add_printf(b, ",\"modelVersion\": %s,\"responseId\": \"%s\"}", s->model_json, s->id);
}

/* A part: text (a thought), or the function call whole. */
static void gemini_part(struct sim_stream *s, struct evbuffer *b, const char *t, size_t tlen, bool thought)
{
	if (s->tool && !thought) {
		size_t alen;
		const char *args = buf_text(s->text, &alen);

		evbuffer_add_printf(b, "{\"functionCall\": {\"name\": %s,\"args\": ", s->tool_json);
		evbuffer_add(b, args, alen);
		evbuffer_add(b, "}}", 2);
		return;
	}
	evbuffer_add(b, "{\"text\": ", 9);
	sim_json_str(b, t, tlen);
	if (thought)
		evbuffer_add(b, ",\"thought\": true", 16);
	evbuffer_add(b, "}", 1);
}

/* One token's response: a thought, a piece of the text, or the function
 * call (whole, at its last token). */
void gemini_token(struct sim_stream *s, uint64_t k, bool reasoning, bool last, const char *p, size_t plen)
{
	/* Gemini sends a function call whole: at its last token */
	if (s->tool && !reasoning && !last)
		return;
	gemini_frame_open(s);
	gemini_open(s->ev);
	gemini_part(s, s->ev, p, plen, reasoning);
	gemini_close(s, s->ev, false, reasoning ? k + 1 : s->n_reason, reasoning ? 0 : k + 1 - s->n_reason);
	if (s->sse)
		evbuffer_add(s->ev, "\r\n\r\n", 4);
}

/* The closing response: an empty text, why it stopped, the final counts;
 * then the array's end. */
void gemini_finish_stream(struct sim_stream *s, struct evbuffer *out)
{
	gemini_frame_open(s);
	gemini_open(s->ev);
	evbuffer_add(s->ev, "{\"text\": \"\"}", 12);
	gemini_close(s, s->ev, true, s->n_reason, s->n_out);
	evbuffer_add(s->ev, s->sse ? "\r\n\r\n" : "\n]", s->sse ? 4 : 2);
	emit_chunk(s, out);
}

/* The whole GenerateContentResponse. */
void gemini_block(struct sim_stream *s, struct evbuffer *b)
{
	size_t tlen, rlen;
	const char *t = buf_text(s->text, &tlen), *r;

	gemini_open(b);
	if (shows_reasoning(s)) {
		r = buf_text(s->reason, &rlen);
		gemini_part(s, b, r, rlen, true);
		evbuffer_add(b, ",", 1);
	}
	t = buf_text(s->text, &tlen);
	gemini_part(s, b, t, tlen, false);
	gemini_close(s, b, true, s->n_reason, s->n_out);
}
