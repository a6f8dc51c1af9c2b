/*
 * sim_http.c — the HTTP/1.1 bytes around every answer of tokentap-sim: the
 * response head, a whole body with its Content-Length, one event as one
 * chunk of a chunked body, and the error bodies, each family in its own
 * shape (OpenAI, Anthropic, Ollama, google.rpc.Status).
 */
#include "sim_api.h"

#include <event2/buffer.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *status_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	default: return "Internal Server Error";
	}
}

/* content_length < 0 selects chunked transfer encoding; `extra`: more
 * header lines, each ending in CRLF, or NULL. */
void write_head_with(struct evbuffer *out, int status, const char *ctype, int64_t content_length,
		     const char *request_id, bool keep_alive, const char *extra)
{
	evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nserver: tokentap-sim\r\n", status, status_reason(status));
	if (ctype != NULL)
		evbuffer_add_printf(out, "content-type: %s\r\n", ctype);
	if (content_length < 0)
		evbuffer_add_printf(out, "transfer-encoding: chunked\r\n");
	else
		evbuffer_add_printf(out, "content-length: %" PRId64 "\r\n", content_length);
	if (request_id != NULL)
		evbuffer_add_printf(out, "x-request-id: %s\r\n", request_id);
	if (!keep_alive)
		evbuffer_add_printf(out, "connection: close\r\n");
	if (extra != NULL)
		evbuffer_add(out, extra, strlen(extra));
	evbuffer_add(out, "\r\n", 2);
}

void write_head(struct evbuffer *out, int status, const char *ctype, int64_t content_length, const char *request_id,
		bool keep_alive)
{
	write_head_with(out, status, ctype, content_length, request_id, keep_alive, NULL);
}

/* A complete response whose body is the contents of body (drained). */
void write_whole_with(struct evbuffer *out, int status, const char *ctype, struct evbuffer *body,
		      const char *request_id, bool keep_alive, const char *extra)
{
	write_head_with(out, status, ctype, (int64_t)evbuffer_get_length(body), request_id, keep_alive, extra);
	evbuffer_add_buffer(out, body);
}

void write_whole(struct evbuffer *out, int status, const char *ctype, struct evbuffer *body, const char *request_id,
		 bool keep_alive)
{
	write_whole_with(out, status, ctype, body, request_id, keep_alive, NULL);
}

/* Moves the scratch event into out as exactly one HTTP chunk. */
void emit_chunk(struct sim_stream *s, struct evbuffer *out)
{
	size_t n = evbuffer_get_length(s->ev);

	if (n == 0)
		return;
	evbuffer_add_printf(out, "%zx\r\n", n);
	evbuffer_add_buffer(out, s->ev);
	evbuffer_add(out, "\r\n", 2);
}

/* ---- errors ---- */

void write_error(struct evbuffer *out, enum sim_family fam, int status, const char *message,
		 const struct sim_api_request *rq)
{
	struct evbuffer *b = evbuffer_new();
	const char *type = status == 404   ? "not_found_error"
			   : status == 405 ? "method_not_allowed"
					   : "invalid_request_error";

	switch (fam) {
	case FAM_ANTHROPIC:
		evbuffer_add_printf(b, "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":", type);
		sim_json_str(b, message, strlen(message));
		evbuffer_add(b, "}}", 2);
		break;
	case FAM_OLLAMA:
		evbuffer_add(b, "{\"error\":", 9);
		sim_json_str(b, message, strlen(message));
		evbuffer_add(b, "}", 1);
		break;
	case FAM_GOOGLE: /* a google.rpc.Status */
		evbuffer_add_printf(b, "{\"error\":{\"code\":%d,\"message\":", status);
		sim_json_str(b, message, strlen(message));
		evbuffer_add_printf(b, ",\"status\":\"%s\"}}",
				    status == 404   ? "NOT_FOUND"
				    : status == 400 ? "INVALID_ARGUMENT"
				    : status == 405 ? "UNIMPLEMENTED"
						    : "INTERNAL");
		break;
	case FAM_OPENAI:
		evbuffer_add(b, "{\"error\":{\"message\":", 20);
		sim_json_str(b, message, strlen(message));
		evbuffer_add_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":%d}}", type, status);
		break;
	}
	write_whole(out, status, "application/json", b, rq->request_id, rq->keep_alive);
	evbuffer_free(b);
}
