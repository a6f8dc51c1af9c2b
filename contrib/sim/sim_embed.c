/*
 * sim_embed.c — the bodies of tokentap-sim's one-answer APIs: OpenAI
 * embeddings (shaped like vLLM's, floats or base64) and rerank (shaped
 * like vLLM's /v1/rerank).
 *
 * Pure functions of the request: each vector is drawn from a hash of its
 * input's bytes and the seed, so the same input always embeds the same,
 * and usage counts one token per 4 bytes of text (at least 1) or the
 * length of a token array. sim_api.c decides when the answer is sent.
 */
#include "sim.h"

#include <event2/buffer.h>
#include <jansson.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMBED_DIM_DEFAULT 8
#define EMBED_DIM_MAX 4096

/* Tokens of one input: text at 4 bytes a token, or a token array's length. */
static int input_tokens(const json_t *v, uint64_t *n)
{
	if (json_is_string(v)) {
		size_t len = json_string_length(v);
		*n = len ? (len + 3) / 4 : 1;
		return 0;
	}
	if (json_is_array(v)) {
		size_t i;
		json_t *t;
		json_array_foreach (v, i, t)
			if (!json_is_integer(t))
				return -1;
		*n = json_array_size(v) ? json_array_size(v) : 1;
		return 0;
	}
	return -1;
}

/* The bytes an input is hashed by: its text, or its token array's dump. */
static uint64_t input_hash(const json_t *v, uint64_t salt)
{
	if (json_is_string(v))
		return sim_mix(sim_hash(json_string_value(v), json_string_length(v), salt));
	char *d = json_dumps(v, JSON_COMPACT);
	uint64_t h = sim_mix(sim_hash(d ? d : "", d ? strlen(d) : 0, salt));
	free(d);
	return h;
}

static void base64_put(struct evbuffer *b, const unsigned char *p, size_t n)
{
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v =
			(uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
		char q[4] = { tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=',
			      i + 2 < n ? tab[v & 63] : '=' };
		evbuffer_add(b, q, 4);
	}
}

/* One embedding: dim floats in [-1, 1), drawn from h; as a JSON array or,
 * with b64, the base64 of their little-endian float32 bytes. */
static void put_vector(struct evbuffer *b, uint64_t h, unsigned dim, bool b64)
{
	unsigned char raw[4 * EMBED_DIM_MAX];
	if (!b64)
		evbuffer_add(b, "[", 1);
	for (unsigned i = 0; i < dim; i++) {
		h = sim_mix(h + i + 1);
		float f = (float)((double)(h >> 11) / 4503599627370496.0 - 1.0); /* 2^52: [0,2) - 1 */
		if (b64) {
			uint32_t u;
			memcpy(&u, &f, 4);
			for (int k = 0; k < 4; k++)
				raw[4 * i + (unsigned)k] = (unsigned char)(u >> (8 * k));
		} else {
			evbuffer_add_printf(b, "%s%.6f", i ? "," : "", (double)f);
		}
	}
	if (b64) {
		evbuffer_add(b, "\"", 1);
		base64_put(b, raw, 4 * (size_t)dim);
		evbuffer_add(b, "\"", 1);
	} else {
		evbuffer_add(b, "]", 1);
	}
}

/* `input` as a list of inputs: a string or a token array is one. */
static int input_list(const json_t *in, json_t **list)
{
	if (json_is_string(in) ||
	    (json_is_array(in) && json_array_size(in) > 0 && json_is_integer(json_array_get(in, 0)))) {
		*list = json_pack("[O]", in);
		return *list ? 0 : -1;
	}
	if (!json_is_array(in) || json_array_size(in) == 0)
		return -1;
	*list = json_incref((json_t *)in);
	return 0;
}

int sim_embed_body(const json_t *req, const char *model_json, struct evbuffer *body, uint64_t *inputs, char *err,
		   size_t errlen)
{
	json_t *list = NULL, *v;
	uint64_t tokens = 0, n;
	size_t i;
	const json_t *dim = json_object_get(req, "dimensions");
	const json_t *fmt = json_object_get(req, "encoding_format");
	bool b64 = json_is_string(fmt) && strcmp(json_string_value(fmt), "base64") == 0;
	unsigned d = EMBED_DIM_DEFAULT;

	if (input_list(json_object_get(req, "input"), &list) == -1) {
		snprintf(err, errlen, "input must be a string, a token array, or a non-empty array of them");
		return -1;
	}
	if (dim != NULL &&
	    (!json_is_integer(dim) || json_integer_value(dim) < 1 || json_integer_value(dim) > EMBED_DIM_MAX)) {
		snprintf(err, errlen, "dimensions must be an integer from 1 to %d", EMBED_DIM_MAX);
		json_decref(list);
		return -1;
	}
	if (dim != NULL)
		d = (unsigned)json_integer_value(dim);
	json_array_foreach (list, i, v) {
		if (input_tokens(v, &n) == -1) {
			snprintf(err, errlen, "input %zu is neither a string nor an array of token ids", i);
			json_decref(list);
			return -1;
		}
		tokens += n;
	}
	evbuffer_add(body, "{\"object\":\"list\",\"data\":[", 25);
	json_array_foreach (list, i, v) {
		evbuffer_add_printf(body, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
		put_vector(body, input_hash(v, sim_cfg.seed), d, b64);
		evbuffer_add(body, "}", 1);
	}
	evbuffer_add_printf(body,
			    "],\"model\":%s,\"usage\":{\"prompt_tokens\":%" PRIu64 ",\"total_tokens\":%" PRIu64 "}}",
			    model_json, tokens, tokens);
	*inputs = json_array_size(list);
	json_decref(list);
	return 0;
}

/* A document's text: a string, or an object's "text". */
static const json_t *doc_text(const json_t *doc)
{
	return json_is_object(doc) ? json_object_get(doc, "text") : doc;
}

int sim_rerank_body(const json_t *req, const char *model_json, struct evbuffer *body, uint64_t *inputs, char *err,
		    size_t errlen)
{
	const json_t *query = json_object_get(req, "query"), *docs = json_object_get(req, "documents");
	const json_t *top = json_object_get(req, "top_n"), *d;
	uint64_t tokens = 0, n, qh;
	size_t i, count, shown;

	if (!json_is_string(query) || !json_is_array(docs) || json_array_size(docs) == 0) {
		snprintf(err, errlen, "rerank takes a string query and a non-empty array of documents");
		return -1;
	}
	count = json_array_size(docs);
	json_array_foreach (docs, i, d)
		if (!json_is_string(doc_text(d))) {
			snprintf(err, errlen, "document %zu is neither a string nor an object with a text", i);
			return -1;
		}
	double *score = malloc(count * sizeof(*score));
	size_t *order = malloc(count * sizeof(*order));
	if (score == NULL || order == NULL) {
		free(score);
		free(order);
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	qh = input_hash(query, sim_cfg.seed);
	json_array_foreach (docs, i, d) {
		/* vLLM scores each (query, document) pair as one sequence. */
		input_tokens(query, &n);
		tokens += n;
		input_tokens(doc_text(d), &n);
		tokens += n;
		score[i] = (double)(input_hash(doc_text(d), qh) >> 11) / 9007199254740992.0; /* 2^53: [0,1) */
		order[i] = i;
	}
	for (size_t a = 1; a < count; a++) /* by score, highest first; ties by index */
		for (size_t b = a; b > 0 && score[order[b]] > score[order[b - 1]]; b--) {
			size_t t = order[b];
			order[b] = order[b - 1];
			order[b - 1] = t;
		}
	shown = json_is_integer(top) && json_integer_value(top) > 0 && (size_t)json_integer_value(top) < count
			? (size_t)json_integer_value(top)
			: count;
	evbuffer_add_printf(body,
			    "{\"id\":\"rerank-%016" PRIx64 "\",\"model\":%s,\"usage\":{\"total_tokens\":%" PRIu64
			    "},\"results\":[",
			    qh, model_json, tokens);
	for (i = 0; i < shown; i++) {
		const json_t *t = doc_text(json_array_get(docs, order[i]));
		evbuffer_add_printf(body, "%s{\"index\":%zu,\"document\":{\"text\":", i ? "," : "", order[i]);
		sim_json_str(body, json_string_value(t), json_string_length(t));
		evbuffer_add_printf(body, "},\"relevance_score\":%.6f}", score[order[i]]);
	}
	evbuffer_add(body, "]}", 2);
	free(score);
	free(order);
	*inputs = count;
	return 0;
}
