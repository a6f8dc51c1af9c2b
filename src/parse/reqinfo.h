/*
 * reqinfo.h — what tokentap learns from a request body: model, stream flag
 * and, for the batch APIs, how many inputs the batch holds.
 *
 * Fed a bounded prefix of the body (the proxy keeps at most a few tens of
 * KiB). Works on a complete JSON body and on a truncated prefix (large
 * prompts with images): only top-level keys count, never a "model" nested in
 * messages. Never allocates per call beyond what the JSON library needs.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REQINFO_MODEL_MAX 128

struct reqinfo {
	char model[REQINFO_MODEL_MAX];	     /* "" when absent; truncated to fit, NUL-terminated; text (strutil.h) */
	int stream;			     /* 1 true, 0 false, -1 absent */
	char field_value[REQINFO_MODEL_MAX]; /* reqinfo_parse_field: "" when absent or not a string */
	int64_t inputs;			     /* reqinfo_parse_inputs: -1 when absent, not a string or array, or cut */
};

/* Fills `out` from `body[0..len)`. `complete` says whether that is the whole
 * body. Returns 0 when the body was JSON (or a JSON prefix), -1 otherwise. */
int reqinfo_parse(const char *body, size_t len, bool complete, struct reqinfo *out);

/* The same, also reading the top-level string field `field` (sticky
 * routing on, say, "user") into out->field_value. */
int reqinfo_parse_field(const char *body, size_t len, bool complete, const char *field, struct reqinfo *out);

/* The same, also counting the inputs of a batch in the top-level field
 * `key` ("input" of an embeddings request): a string is 1, an array of
 * numbers (one input as token ids) is 1, any other array is its number of
 * top-level elements (strings, token arrays, documents), an empty one 0.
 * Anything else, and an array that does not end within the prefix, leaves
 * out->inputs at -1. */
int reqinfo_parse_inputs(const char *body, size_t len, bool complete, const char *key, struct reqinfo *out);

/* reqinfo_parse_inputs and reqinfo_parse_field in one pass (`field` NULL:
 * none): the inputs of `key`, and the top-level string field `field` into
 * out->field_value. */
int reqinfo_parse_inputs_field(const char *body, size_t len, bool complete, const char *key, const char *field,
			       struct reqinfo *out);

/* A model named in the request path (Bedrock's /model/MODEL/...), from its
 * segment as sent: percent-decoded (an ARN's ':' and '/' arrive as %3A and
 * %2F), then kept as text (strutil.h), cut at a character boundary to fit
 * `cap` bytes and NUL-terminated. A '%' not followed by two hex digits is
 * kept as it is. */
void reqinfo_path_model(const char *seg, size_t len, char *out, size_t cap);
