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
	assert_int_equal(parse_str("{\"model\":\"\\ud83d\"}", true, &ri), -1); /* lone surrogate */
	assert_int_equal(parse_str("{\"model\":\"\\x\"}", true, &ri), -1);
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
		cmocka_unit_test(test_long_model_truncated),
		cmocka_unit_test(test_every_prefix),
		cmocka_unit_test(test_truncated_inside_messages),
		cmocka_unit_test(test_not_json),
		cmocka_unit_test(test_deep_nesting),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
