/*
 * fuzz_reqinfo.c — libFuzzer target: model and stream flag from a request
 * body, whole or cut short (the proxy keeps only a prefix of large bodies).
 *
 * The input is the body. It is parsed as a complete body and as a prefix,
 * and a prefix of it (cut at a length derived from its first byte) as a
 * prefix, each from an exact-size heap copy so that ASan sees any read past
 * the end. Checked: the return value is 0 or -1; the model is NUL-terminated
 * inside its array; stream is -1, 0 or 1; parsing is deterministic.
 *
 * What comes out is text (strutil.h): the model and the sticky field are
 * valid UTF-8 without control characters, and jansson writes them. When
 * jansson parses the body as an object, reqinfo reads what an upstream's
 * parser reads: the value of the last "model" key once escapes are decoded
 * (jansson keeps the last duplicate, as Python's json does), control
 * characters as U+FFFD, cut to fit at a character boundary; the same for
 * "stream" and the field "user"; and the inputs of "input" counted as
 * reqinfo.h says (a string 1, an array of numbers 1, an empty array 0,
 * another array its size, anything else -1). And utf8_decode() agrees with a decoder
 * written the other way round: a sequence is well formed when it is the
 * shortest encoding of a code point that is not a surrogate.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "reqinfo.h"
#include "strutil.h"

#define DEPTH_MAX 512 /* reqinfo.c's REQINFO_DEPTH_MAX */

static int parse_copy(const uint8_t *data, size_t len, bool complete, struct reqinfo *out)
{
	char *copy = malloc(len ? len : 1);
	CHECK(copy != NULL);
	if (len)
		memcpy(copy, data, len);
	memset(out, 0xa5, sizeof(*out)); /* garbage in: reqinfo must fill every field */
	int rc = reqinfo_parse_field(copy, len, complete, "user", out);
	free(copy);
	CHECK(rc == 0 || rc == -1);
	if (rc == 0) {
		CHECK(memchr(out->model, '\0', sizeof(out->model)) != NULL);
		CHECK(memchr(out->field_value, '\0', sizeof(out->field_value)) != NULL);
		CHECK(out->stream >= -1 && out->stream <= 1);
		CHECK(utf8_is_clean(out->model, strlen(out->model)));
		CHECK(utf8_is_clean(out->field_value, strlen(out->field_value)));
		json_t *s = json_string(out->model);
		CHECK(s != NULL);
		json_decref(s);
		s = json_string(out->field_value);
		CHECK(s != NULL);
		json_decref(s);
	}
	return rc;
}

/* The reference decoder: the bytes p[0 .. k) are well formed when they are
 * the shortest encoding of a code point that is not a surrogate. */
static bool reference_wellformed(const unsigned char *p, size_t k)
{
	static const unsigned char lead_mask[5] = { 0, 0x7F, 0x1F, 0x0F, 0x07 };
	static const unsigned char lead_bits[5] = { 0, 0x00, 0xC0, 0xE0, 0xF0 };
	if (k < 1 || k > 4 || (p[0] & ~lead_mask[k]) != lead_bits[k])
		return false;
	uint32_t cp = p[0] & lead_mask[k];
	for (size_t i = 1; i < k; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return false;
		cp = cp << 6 | (p[i] & 0x3Fu);
	}
	static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	return cp >= min[k] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
}

static void check_utf8_decode(const uint8_t *data, size_t size)
{
	for (size_t off = 0; off < size && off < 64; off++) {
		const char *p = (const char *)data + off, *end = (const char *)data + size;
		size_t len;
		int32_t cp = utf8_decode(p, end, &len);
		size_t have = size - off;
		bool any = false; /* some length fits and is well formed */
		for (size_t k = 1; k <= 4 && k <= have; k++)
			if (reference_wellformed(data + off, k)) {
				CHECK(cp >= 0 && len == k);
				any = true;
			}
		if (!any)
			CHECK(cp < 0 && len == 1);
		if (cp >= 0) {
			char buf[8];
			size_t n = 0;
			CHECK(utf8_put(buf, sizeof(buf), &n, (uint32_t)cp));
			CHECK(n == len && memcmp(buf, p, n) == 0);
		}
	}
}

/* What reqinfo must hold for the JSON string `s`: control characters as
 * U+FFFD, cut before the first character that does not fit. */
static void expected_text(const char *s, size_t len, char *out, size_t cap)
{
	size_t n = 0;
	for (const char *p = s, *end = s + len; p < end;) {
		size_t k;
		int32_t cp = utf8_decode(p, end, &k);
		CHECK(cp >= 0); /* jansson hands out UTF-8 only */
		if (utf8_is_control((uint32_t)cp))
			cp = (int32_t)UTF8_REPLACEMENT;
		if (!utf8_put(out, cap, &n, (uint32_t)cp))
			break;
		p += k;
	}
	out[n] = '\0';
}

static int depth_of(const json_t *v)
{
	int d = 0;
	if (json_is_object(v)) {
		const char *k;
		json_t *m;
		json_object_foreach ((json_t *)v, k, m) {
			int x = depth_of(m);
			d = x > d ? x : d;
		}
		return d + 1;
	}
	if (json_is_array(v)) {
		size_t i;
		json_t *m;
		json_array_foreach (v, i, m) {
			int x = depth_of(m);
			d = x > d ? x : d;
		}
		return d + 1;
	}
	return 0;
}

static void check_against_jansson(const uint8_t *data, size_t size)
{
	json_error_t err;
	/* A raw NUL byte is never JSON (RFC 8259: not whitespace, and a control
	 * character inside a string); jansson takes one right after a number as
	 * the number's end, so it is no oracle for such input */
	if (memchr(data, '\0', size))
		return;
	/* JSON_ALLOW_NUL: "\u0000" is JSON, and reqinfo reads it as U+FFFD */
	json_t *doc = json_loadb((const char *)data, size, JSON_ALLOW_NUL, &err);
	if (!doc)
		return;
	if (!json_is_object(doc) || depth_of(doc) > DEPTH_MAX) {
		json_decref(doc);
		return;
	}
	struct reqinfo ri;
	CHECK(parse_copy(data, size, true, &ri) == 0);
	char want[REQINFO_MODEL_MAX];
	const json_t *m = json_object_get(doc, "model");
	if (json_is_string(m))
		expected_text(json_string_value(m), json_string_length(m), want, sizeof(want));
	else
		want[0] = '\0';
	CHECK(strcmp(ri.model, want) == 0);
	const json_t *u = json_object_get(doc, "user");
	if (json_is_string(u))
		expected_text(json_string_value(u), json_string_length(u), want, sizeof(want));
	else
		want[0] = '\0';
	CHECK(strcmp(ri.field_value, want) == 0);
	const json_t *st = json_object_get(doc, "stream");
	CHECK(ri.stream == (json_is_true(st) ? 1 : json_is_false(st) ? 0 : -1));

	const json_t *in = json_object_get(doc, "input");
	int64_t inputs = -1;
	if (json_is_string(in)) {
		inputs = 1;
	} else if (json_is_array(in)) {
		size_t i;
		json_t *e;
		bool numbers = true;
		json_array_foreach ((json_t *)in, i, e)
			numbers &= json_is_number(e);
		inputs = json_array_size(in) == 0 ? 0 : numbers ? 1 : (int64_t)json_array_size(in);
	}
	struct reqinfo rn;
	char *copy = malloc(size ? size : 1);
	CHECK(copy != NULL);
	if (size)
		memcpy(copy, data, size);
	CHECK(reqinfo_parse_inputs(copy, size, true, "input", &rn) == 0);
	free(copy);
	CHECK(rn.inputs == inputs);
	CHECK(strcmp(rn.model, ri.model) == 0);
	CHECK(rn.stream == ri.stream);
	json_decref(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct reqinfo a, b;
	int ra, rb;

	for (int complete = 0; complete <= 1; complete++) {
		ra = parse_copy(data, size, complete, &a);
		rb = parse_copy(data, size, complete, &b);
		CHECK(ra == rb);
		if (ra == 0) {
			CHECK(strcmp(a.model, b.model) == 0);
			CHECK(strcmp(a.field_value, b.field_value) == 0);
			CHECK(a.stream == b.stream);
		}
	}
	if (size > 1) {
		size_t cut = (size_t)data[0] * size / 256;
		parse_copy(data, cut, false, &a);
	}
	check_utf8_decode(data, size);
	check_against_jansson(data, size);
	return 0;
}
