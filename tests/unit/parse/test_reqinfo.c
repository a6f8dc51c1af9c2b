/*
 * test_reqinfo.c — model and stream flag from request bodies, whole and cut
 * short, top-level keys only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reqinfo.h"

/* Parses `body` copied into an exact-size heap block (ASan sees overreads). */
static int parse(const char *body, size_t len, bool complete, struct reqinfo *out)
{
	char *copy = malloc(len ? len : 1);
	assert_non_null(copy);
	memcpy(copy, body, len);
	int r = reqinfo_parse(copy, len, complete, out);
	free(copy);
	return r;
}

static int parse_str(const char *body, bool complete, struct reqinfo *out)
{
	return parse(body, strlen(body), complete, out);
}

static const char chat_body[] =
	"{\"messages\":[{\"role\":\"system\",\"content\":\"You are {\\\"model\\\": \\\"fake\\\"}\"},"
	"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"},{\"type\":\"image_url\",\"image_url\":{"
	"\"url\":\"data:image/png;base64,AAAA\"}}]}],"
	"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
	"\"properties\":{\"model\":{\"type\":\"string\"}}}}}],"
	"\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"temperature\":0.7,\"max_tokens\":-1,\"stop\":null,"
	"\"stream\":true,\"stream_options\":{\"include_usage\":true}}";

static void test_openai_body(void **state)
{
	struct reqinfo ri;
	assert_int_equal(parse_str(chat_body, true, &ri), 0);
	assert_string_equal(ri.model, "meta-llama/Llama-3.1-8B-Instruct");
	assert_int_equal(ri.stream, 1);
}

static void test_simple_bodies(void **state)
{
	struct reqinfo ri;
	assert_int_equal(parse_str("{\"model\":\"llama3.2\",\"prompt\":\"Why?\"}", true, &ri), 0);
	assert_string_equal(ri.model, "llama3.2");
	assert_int_equal(ri.stream, -1); /* Ollama's default is the caller's business */
	assert_int_equal(parse_str(" \r\n{ \"stream\" : false , \"model\" : \"m\" }\n", true, &ri), 0);
	assert_string_equal(ri.model, "m");
	assert_int_equal(ri.stream, 0);
	assert_int_equal(parse_str("{}", true, &ri), 0);
	assert_string_equal(ri.model, "");
	assert_int_equal(ri.stream, -1);
	/* TGI: no model, stream flag comes from the path. */
	assert_int_equal(
		parse_str("{\"inputs\":\"What is Deep Learning?\",\"parameters\":{\"max_new_tokens\":20}}", true, &ri),
		0);
	assert_string_equal(ri.model, "");
	/* Non-boolean stream reads as absent; a later duplicate wins. */
	assert_int_equal(parse_str("{\"stream\":true,\"stream\":null}", true, &ri), 0);
	assert_int_equal(ri.stream, -1);
	assert_int_equal(parse_str("{\"model\":\"a\",\"model\":\"b\"}", true, &ri), 0);
	assert_string_equal(ri.model, "b");
	assert_int_equal(parse_str("{\"model\":\"a\",\"model\":null}", true, &ri), 0);
	assert_string_equal(ri.model, "");
}

/* Only top-level keys: "model" and "stream" nested anywhere do not count. */
static void test_nested_keys_ignored(void **state)
{
	struct reqinfo ri;
	assert_int_equal(
		parse_str("{\"metadata\":{\"model\":\"nested\",\"stream\":true},\"input\":[\"model\",\"stream\"]}",
			  true, &ri),
		0);
	assert_string_equal(ri.model, "");
	assert_int_equal(ri.stream, -1);
	assert_int_equal(
		parse_str("{\"a\":[[{\"model\":\"x\"}],{\"b\":{\"model\":\"y\"}}],\"model\":\"top\"}", true, &ri), 0);
	assert_string_equal(ri.model, "top");
	/* A key-looking string inside a string value. */
	assert_int_equal(parse_str("{\"prompt\":\"\\\",\\\"model\\\":\\\"evil\",\"stream\":false}", true, &ri), 0);
	assert_string_equal(ri.model, "");
	assert_int_equal(ri.stream, 0);
	/* Brackets inside strings do not change the depth. */
	assert_int_equal(parse_str("{\"p\":\"}]}]{\",\"q\":[\"[[[\"],\"model\":\"ok\"}", true, &ri), 0);
	assert_string_equal(ri.model, "ok");
}

static void test_string_escapes(void **state)
{
	struct reqinfo ri;
	assert_int_equal(parse_str("{\"model\":\"a\\\"b\\\\c\\/d\\u00e9\\ud83d\\ude00\"}", true, &ri), 0);
	assert_string_equal(ri.model, "a\"b\\c/d\xc3\xa9\xf0\x9f\x98\x80");
	assert_int_equal(parse_str("{\"model\":\"\\x\"}", true, &ri), -1);
}

#define FFFD "\xef\xbf\xbd"

/* A model name that is not text comes out as text: every byte outside a
 * well-formed UTF-8 sequence and every control character is U+FFFD, and
 * the rest of the body is read as ever. */
static void test_model_not_text(void **state)
{
	static const struct {
		const char *body, *model;
	} cases[] = {
		{ "{\"model\":\"bad\xff\xfemodel\",\"stream\":true}", "bad" FFFD FFFD "model" },
		{ "{\"model\":\"ctl\x01model\",\"stream\":true}", "ctl" FFFD "model" },
		{ "{\"model\":\"del\x7f\",\"stream\":true}", "del" FFFD },
		{ "{\"model\":\"c1\xc2\x85\",\"stream\":true}", "c1" FFFD },
		{ "{\"model\":\"esc\\u0001\\n\\u001b[31m\",\"stream\":true}", "esc" FFFD FFFD FFFD "[31m" },
		{ "{\"model\":\"nul\\u0000cut\",\"stream\":true}", "nul" FFFD "cut" },
		{ "{\"model\":\"over\xc0\xafmodel\",\"stream\":true}", "over" FFFD FFFD "model" },
		{ "{\"model\":\"over3\xe0\x80\xaf\",\"stream\":true}", "over3" FFFD FFFD FFFD },
		{ "{\"model\":\"sur\xed\xa0\x80model\",\"stream\":true}", "sur" FFFD FFFD FFFD "model" },
		{ "{\"model\":\"big\xf4\x90\x80\x80\",\"stream\":true}", "big" FFFD FFFD FFFD FFFD },
		/* cut short by the closing quote, which still closes the string */
		{ "{\"model\":\"trunc\xe2\x82\",\"stream\":true}", "trunc" FFFD FFFD },
		{ "{\"model\":\"trunc4\xf0\x9f\x98\",\"stream\":true}", "trunc4" FFFD FFFD FFFD },
		/* unpaired surrogate escapes, which Python's json accepts */
		{ "{\"model\":\"\\ud83d\",\"stream\":true}", FFFD },
		{ "{\"model\":\"\\ude00x\",\"stream\":true}", FFFD "x" },
		{ "{\"model\":\"\\ud83d\\u0041\",\"stream\":true}", FFFD "A" },
		{ "{\"model\":\"\\ud83d\\n\",\"stream\":true}", FFFD FFFD },
		/* text stays as it was */
		{ "{\"model\":\"caf\xc3\xa9-\xf0\x9f\x98\x80\",\"stream\":true}", "caf\xc3\xa9-\xf0\x9f\x98\x80" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct reqinfo ri;
		if (parse_str(cases[i].body, true, &ri) != 0)
			fail_msg("case %zu: body rejected", i);
		assert_string_equal(ri.model, cases[i].model);
		assert_int_equal(ri.stream, 1);
		/* every prefix: nothing but a prefix of the answer */
		for (size_t len = 1; len < strlen(cases[i].body); len++) {
			assert_int_equal(parse(cases[i].body, len, false, &ri), 0);
			if (ri.model[0] && strcmp(ri.model, cases[i].model) != 0)
				fail_msg("case %zu, prefix %zu: model \"%s\"", i, len, ri.model);
		}
	}
	/* U+FFFD takes three bytes: a long name of bad bytes is cut whole */
	char body[600] = "{\"model\":\"";
	size_t n = strlen(body);
	for (int i = 0; i < 200; i++)
		body[n++] = '\xff';
	strcpy(body + n, "\"}");
	struct reqinfo ri;
	assert_int_equal(parse_str(body, true, &ri), 0);
	assert_int_equal(strlen(ri.model), 126);
}

/* Keys are read as the upstream reads them: escapes decoded, the last of
 * a duplicate key counts. */
static void test_escaped_keys(void **state)
{
	struct reqinfo ri;
	assert_int_equal(parse_str("{\"model\":\"junk-1\",\"mod\\u0065l\":\"real\"}", true, &ri), 0);
	assert_string_equal(ri.model, "real");
	assert_int_equal(parse_str("{\"mod\\u0065l\":\"real\",\"model\":\"junk-1\"}", true, &ri), 0);
	assert_string_equal(ri.model, "junk-1");
	assert_int_equal(parse_str("{\"\\u006d\\u006F\\u0064\\u0065\\u006c\":\"all\"}", true, &ri), 0);
	assert_string_equal(ri.model, "all");
	assert_int_equal(parse_str("{\"model\":\"re\\u0061l\"}", true, &ri), 0);
	assert_string_equal(ri.model, "real");
	assert_int_equal(parse_str("{\"model\":\"a\",\"mod\\u0065l\":null}", true, &ri), 0);
	assert_string_equal(ri.model, "");
	assert_int_equal(parse_str("{\"stream\":false,\"str\\u0065am\":true}", true, &ri), 0);
	assert_int_equal(ri.stream, 1);
	/* not "model": one character more, an escaped quote, another letter */
	assert_int_equal(parse_str("{\"model\":\"m\",\"model\\u0000\":\"x\",\"mode\\\"\":\"y\","
				   "\"mod\\u0066l\":\"z\",\"m\\u00f6del\":\"w\"}",
				   true, &ri),
			 0);
	assert_string_equal(ri.model, "m");
	/* the sticky field too */
	const char *b = "{\"user\":\"decoy\",\"us\\u0065r\":\"alice\"}";
	assert_int_equal(reqinfo_parse_field(b, strlen(b), true, "user", &ri), 0);
	assert_string_equal(ri.field_value, "alice");
	b = "{\"user\":\"alice\",\"user\":7}";
	assert_int_equal(reqinfo_parse_field(b, strlen(b), true, "user", &ri), 0);
	assert_string_equal(ri.field_value, ""); /* the last one counts, even when it is no string */
	/* every prefix: the first name until the second is read whole */
	b = "{\"model\":\"junk\",\"mod\\u0065l\":\"real\"}";
	for (size_t len = 1; len < strlen(b); len++) {
		assert_int_equal(parse(b, len, false, &ri), 0);
		if (len >= strlen(b) - 1)
			assert_string_equal(ri.model, "real");
		else if (ri.model[0])
			assert_string_equal(ri.model, "junk");
	}
}

static void test_long_model_truncated(void **state)
{
	struct reqinfo ri;
	char body[512];
	char name[300];
	memset(name, 'm', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	snprintf(body, sizeof(body), "{\"model\":\"%s\",\"stream\":true}", name);
	assert_int_equal(parse_str(body, true, &ri), 0);
	assert_int_equal(strlen(ri.model), REQINFO_MODEL_MAX - 1);
	assert_int_equal(ri.stream, 1);
	/* Cut at a character boundary, never inside a UTF-8 sequence. */
	char b2[512] = "{\"model\":\"";
	size_t n = strlen(b2);
	for (int i = 0; i < 126; i++)
		b2[n++] = 'x';
	strcpy(b2 + n, "\xc3\xa9\xc3\xa9\"}");
	assert_int_equal(parse_str(b2, true, &ri), 0);
	assert_int_equal(strlen(ri.model), 126);
	char b3[512] = "{\"model\":\"";
	n = strlen(b3);
	for (int i = 0; i < 126; i++)
		b3[n++] = 'x';
	strcpy(b3 + n, "\\u00e9y\"}");
	assert_int_equal(parse_str(b3, true, &ri), 0);
	assert_int_equal(strlen(ri.model), 126);
}

/* Every prefix of a real body: never an error, never a wrong model, and
 * the answer is the full one as soon as the bytes that hold it are in. */
static void test_every_prefix(void **state)
{
	struct reqinfo ri;
	size_t n = sizeof(chat_body) - 1;
	const char *model_end = strstr(chat_body, "Instruct\"") + strlen("Instruct\"");
	const char *stream_end = strstr(chat_body, "\"stream\":true") + strlen("\"stream\":true");
	for (size_t len = 1; len < n; len++) {
		if (parse(chat_body, len, false, &ri) != 0)
			fail_msg("prefix of %zu bytes rejected", len);
		if (chat_body + len >= model_end)
			assert_string_equal(ri.model, "meta-llama/Llama-3.1-8B-Instruct");
		else
			assert_string_equal(ri.model, "");
		if (chat_body + len >= stream_end)
			assert_int_equal(ri.stream, 1);
		else
			assert_int_equal(ri.stream, -1);
		/* The same prefix said to be complete is not JSON. */
		assert_int_equal(parse(chat_body, len, true, &ri), -1);
	}
}

/* Strings are skipped a word at a time to their next quote or backslash:
 * an escape at each offset of a long string, and every prefix of it. */
static void test_long_string_escapes(void **state)
{
	(void)state;
	for (int pad = 0; pad < 24; pad++) {
		char body[256];
		struct reqinfo ri;
		int n = snprintf(body, sizeof(body),
				 "{\"messages\":[{\"content\":\"%.*s\\\"\\\\%.*s\\\"\"}],\"model\":\"m\"}", pad,
				 "abcdefghijklmnopqrstuvwxyz", 23 - pad, "ABCDEFGHIJKLMNOPQRSTUVWXYZ");
		assert_int_equal(parse(body, (size_t)n, true, &ri), 0);
		assert_string_equal(ri.model, "m");
		for (int len = 1; len < n; len++) {
			assert_int_equal(parse(body, (size_t)len, false, &ri), 0);
			assert_string_equal(ri.model, len >= n - 1 ? "m" : "");
		}
	}
}

/* A big messages array first: a prefix that stops inside it finds nothing. */
static void test_truncated_inside_messages(void **state)
{
	struct reqinfo ri;
	size_t cap = 70000;
	char *b = malloc(cap);
	assert_non_null(b);
	size_t n = (size_t)snprintf(b, cap, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
	while (n < 65000)
		b[n++] = 'A';
	n += (size_t)snprintf(b + n, cap - n, "\"}],\"model\":\"gpt-4o\",\"stream\":true}");
	assert_int_equal(parse(b, 32768, false, &ri), 0);
	assert_string_equal(ri.model, "");
	assert_int_equal(ri.stream, -1);
	assert_int_equal(parse(b, n, true, &ri), 0);
	assert_string_equal(ri.model, "gpt-4o");
	assert_int_equal(ri.stream, 1);
	free(b);
}

static void test_not_json(void **state)
{
	struct reqinfo ri;
	assert_int_equal(parse_str("", false, &ri), -1);
	assert_int_equal(parse_str("   ", false, &ri), -1);
	assert_int_equal(parse_str("model=gpt-4o&stream=true", false, &ri), -1);
	assert_int_equal(parse_str("[{\"model\":\"x\"}]", true, &ri), -1);
	assert_int_equal(parse_str("\"model\"", true, &ri), -1);
	assert_int_equal(parse_str("{\"model\":\"x\"} trailing", true, &ri), -1);
	assert_int_equal(parse_str("{\"model\":\"x\",}", true, &ri), -1);
	assert_string_equal(ri.model, ""); /* nothing reported from a rejected body */
	assert_int_equal(parse_str("{\"model\" \"x\"}", true, &ri), -1);
	assert_int_equal(parse_str("{\"a\":[1,2}", true, &ri), -1);
	assert_int_equal(parse_str("{\"a\":{\"b\":1]}", true, &ri), -1);
	assert_int_equal(parse_str("{\"stream\":truth}", true, &ri), -1);
	assert_int_equal(parse_str("{\"stream\":tru", false, &ri), 0);
	assert_int_equal(ri.stream, -1);
	assert_int_equal(parse_str("{\"stream\":true", false, &ri), 0);
	assert_int_equal(ri.stream, 1);
	assert_int_equal(reqinfo_parse(NULL, 0, true, &ri), -1);
}

/* Nesting far beyond any real request is rejected, not recursed into. */
static int64_t inputs_of(const char *body, bool complete, const char *key)
{
	struct reqinfo ri;
	size_t len = strlen(body);
	char *copy = malloc(len ? len : 1);
	assert_non_null(copy);
	memcpy(copy, body, len);
	int r = reqinfo_parse_inputs(copy, len, complete, key, &ri);
	free(copy);
	return r == 0 ? ri.inputs : -2;
}

/* The inputs of a batch: top-level elements of the one field only. */
static void test_inputs(void **state)
{
	assert_int_equal(inputs_of("{\"input\":\"one\"}", true, "input"), 1);
	assert_int_equal(inputs_of("{\"input\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"model\":\"m\"}", true, "input"), 5);
	assert_int_equal(inputs_of("{\"input\":[[1,2],[3],[4,5,6]]}", true, "input"), 3);
	assert_int_equal(inputs_of("{\"input\":[1,2,3,4]}", true, "input"), 1); /* one input as token ids */
	assert_int_equal(inputs_of("{\"input\":[ ]}", true, "input"), 0);
	assert_int_equal(inputs_of("{\"input\":42}", true, "input"), -1);
	assert_int_equal(inputs_of("{\"input\":null}", true, "input"), -1);
	assert_int_equal(inputs_of("{\"input\":{\"input\":[1,2]}}", true, "input"), -1);
	assert_int_equal(inputs_of("{\"documents\":[{\"text\":\"a,b\"},\"c]\"],\"query\":\"q\"}", true, "documents"),
			 2);
	/* nested: never the request's */
	assert_int_equal(inputs_of("{\"x\":{\"input\":[\"a\",\"b\"]}}", true, "input"), -1);
	/* a later duplicate wins, also when it is not countable */
	assert_int_equal(inputs_of("{\"input\":[\"a\",\"b\"],\"input\":\"c\"}", true, "input"), 1);
	assert_int_equal(inputs_of("{\"input\":[\"a\",\"b\"],\"input\":7}", true, "input"), -1);
	/* without a key nothing is counted */
	assert_int_equal(inputs_of("{\"input\":[\"a\"]}", true, NULL), -1);
	/* escaped key */
	assert_int_equal(inputs_of("{\"inp\\u0075t\":[\"a\",\"b\"]}", true, "input"), 2);
	/* not JSON */
	assert_int_equal(inputs_of("{\"input\":[\"a\" \"b\"]}", true, "input"), -2);
}

/* Every prefix of a batch: unknown until the array closes, then exact. */
static void test_inputs_every_prefix(void **state)
{
	static const char body[] = "{\"model\":\"e\",\"input\":[\"a\",[1,2],\"c]\",\"d\"],\"dimensions\":8}";
	const char *end = strstr(body, "\"d\"]") + 4;
	for (size_t len = 1; len < sizeof(body) - 1; len++) {
		char *cut = strndup(body, len);
		assert_non_null(cut);
		int64_t n = inputs_of(cut, false, "input");
		free(cut);
		assert_int_equal(n, body + len >= end ? 4 : -1);
	}
	assert_int_equal(inputs_of(body, true, "input"), 4);
}

/* One pass reading the inputs and a field gives what the two passes give,
 * on every prefix of a body. */
static void test_inputs_and_field_in_one_pass(void **state)
{
	const char *b = "{\"model\":\"e\",\"input\":[\"a\",\"b\",\"c\"],\"meta\":{\"user\":\"x\"},\"user\":\"u-1\"}";
	struct reqinfo one, in, fi;
	(void)state;

	for (size_t n = 0; n <= strlen(b); n++) {
		bool complete = n == strlen(b);
		int r1 = reqinfo_parse_inputs_field(b, n, complete, "input", "user", &one);
		int r2 = reqinfo_parse_inputs(b, n, complete, "input", &in);
		int r3 = reqinfo_parse_field(b, n, complete, "user", &fi);
		assert_int_equal(r1, r2);
		assert_int_equal(r1, r3);
		if (r1 != 0)
			continue;
		assert_int_equal(one.inputs, in.inputs);
		assert_string_equal(one.model, in.model);
		assert_string_equal(one.field_value, fi.field_value);
	}
	assert_int_equal(one.inputs, 3);
	assert_string_equal(one.field_value, "u-1");
}

static void test_deep_nesting(void **state)
{
	struct reqinfo ri;
	size_t depth = 100000;
	char *b = malloc(2 * depth + 64);
	assert_non_null(b);
	size_t n = (size_t)sprintf(b, "{\"model\":\"m\",\"x\":");
	for (size_t i = 0; i < depth; i++)
		b[n++] = '[';
	for (size_t i = 0; i < depth; i++)
		b[n++] = ']';
	b[n++] = '}';
	assert_int_equal(parse(b, n, true, &ri), -1);
	/* 500 levels is fine. */
	n = (size_t)sprintf(b, "{\"x\":");
	for (size_t i = 0; i < 500; i++) {
		if (i % 2)
			b[n++] = '[';
		else
			n += (size_t)sprintf(b + n, "{\"k\":");
	}
	for (size_t i = 500; i-- > 0;)
		b[n++] = i % 2 ? ']' : '}';
	n += (size_t)sprintf(b + n, ",\"model\":\"deep\"}");
	assert_int_equal(parse(b, n, true, &ri), 0);
	assert_string_equal(ri.model, "deep");
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_openai_body),
		cmocka_unit_test(test_simple_bodies),
		cmocka_unit_test(test_nested_keys_ignored),
		cmocka_unit_test(test_string_escapes),
		cmocka_unit_test(test_model_not_text),
		cmocka_unit_test(test_escaped_keys),
		cmocka_unit_test(test_long_model_truncated),
		cmocka_unit_test(test_every_prefix),
		cmocka_unit_test(test_long_string_escapes),
		cmocka_unit_test(test_truncated_inside_messages),
		cmocka_unit_test(test_not_json),
		cmocka_unit_test(test_deep_nesting),
		cmocka_unit_test(test_inputs),
		cmocka_unit_test(test_inputs_every_prefix),
		cmocka_unit_test(test_inputs_and_field_in_one_pass),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
