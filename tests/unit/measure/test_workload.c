/*
 * test_workload.c — the workload capture's prefix hash chain over request
 * bodies (shared prefixes, a changed byte, any split of the reads, what is
 * and is not prompt text), the ids in order of first appearance, and the
 * trace lines and rotation written by the capture's thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "timeline.h"
#include "workload.h"

static const uint8_t salt[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };

/* The hashes of `body` fed in pieces of `step` bytes (0: at once). */
/* A capture into a fresh directory: dir (a mkdtemp template) made, path
 * (of size plen, o's path) its w.jsonl, the capture opened with o. */
static void capture_open(char *dir, char *path, size_t plen, const struct workload_options *o)
{
	char err[256];

	assert_non_null(mkdtemp(dir));
	snprintf(path, plen, "%s/w.jsonl", dir);
	assert_int_equal(workload_open(o, err, sizeof(err)), 0);
}

static size_t hashes_of(const char *body, size_t block, size_t step, uint64_t *out, size_t max)
{
	struct wl_req *w = wl_req_new(salt, block);
	const uint64_t *h;
	size_t len = strlen(body), n;

	assert_non_null(w);
	if (!step)
		step = len;
	for (size_t i = 0; i < len; i += step)
		wl_req_feed(w, body + i, len - i < step ? len - i : step);
	n = wl_req_hashes(w, &h);
	assert_true(n <= max);
	if (n)
		memcpy(out, h, n * sizeof(*h));
	workload_req_free(w);
	return n;
}

/* `body` fed in chunks of 1 .. max_step bytes and split in two at every
 * byte gives the n hashes `want` and the max_tokens `tokens` each time. */
static void same_at_every_split(const char *body, size_t block, size_t max_step, const uint64_t *want, size_t n,
				uint64_t tokens)
{
	uint64_t split[64];

	assert_true(n <= 64);
	for (size_t step = 1; step <= max_step; step++) {
		assert_int_equal(hashes_of(body, block, step, split, 64), n);
		assert_memory_equal(want, split, n * sizeof(*want));
	}
	for (size_t cut = 1; cut < strlen(body); cut++) {
		struct wl_req *w = wl_req_new(salt, block);
		const uint64_t *h;
		wl_req_feed(w, body, cut);
		wl_req_feed(w, body + cut, strlen(body) - cut);
		assert_int_equal(wl_req_hashes(w, &h), n);
		assert_memory_equal(want, h, n * sizeof(*h));
		assert_int_equal(wl_req_max_tokens(w), tokens);
		workload_req_free(w);
	}
}

#define SYS "You are a careful assistant who answers in full sentences and cites sources."

static const char *chat(char *buf, size_t len, const char *user)
{
	snprintf(buf, len,
		 "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"" SYS
		 "\"},{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":77}",
		 user);
	return buf;
}

static void test_shared_prefix_shares_first_hashes(void **state)
{
	char a[1024], b[1024];
	uint64_t ha[64], hb[64];
	size_t na, nb, shared = strlen(SYS) / 16; /* whole blocks inside the system prompt */
	(void)state;

	na = hashes_of(chat(a, sizeof(a), "What is the capital of France, and why?"), 16, 0, ha, 64);
	nb = hashes_of(chat(b, sizeof(b), "Tell me a story about a lighthouse keeper."), 16, 0, hb, 64);
	assert_true(shared >= 4);
	assert_true(na > shared && nb > shared);
	for (size_t i = 0; i < shared; i++)
		assert_true(ha[i] == hb[i]);
	/* the block holding the end of the system prompt and the start of the
	 * user's message, and every one after it, differ */
	for (size_t i = shared + 1; i < na && i < nb; i++)
		assert_true(ha[i] != hb[i]);
	/* a prompt of 5 blocks and 3 bytes: 6 hashes, the last a partial block */
	assert_int_equal(hashes_of("{\"prompt\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
				   "0123456789abcdef012\"}",
				   16, 0, ha, 64),
			 6); /* 83 bytes and the separator: 84 */
}

static void test_changed_byte_changes_its_block_and_later(void **state)
{
	char a[1024], b[1024];
	uint64_t ha[64], hb[64];
	size_t na, nb;
	(void)state;

	chat(a, sizeof(a), "What is the capital of France, and why?");
	strcpy(b, a);
	char *p = strstr(b, "careful"); /* byte 15 of the prompt text: block 0 */
	assert_non_null(p);
	p[0] = 'C';
	na = hashes_of(a, 16, 0, ha, 64);
	nb = hashes_of(b, 16, 0, hb, 64);
	assert_int_equal(na, nb);
	for (size_t i = 0; i < na; i++)
		assert_true(ha[i] != hb[i]);
	/* a byte in the third block: the first two stay */
	strcpy(b, a);
	p = strstr(b, "answers");
	p[1] = 'N';
	nb = hashes_of(b, 16, 0, hb, 64);
	size_t at = (size_t)(strstr(SYS, "answers") + 1 - SYS) / 16;
	for (size_t i = 0; i < na; i++)
		assert_true(i < at ? ha[i] == hb[i] : ha[i] != hb[i]);
	/* another salt: no hash in common */
	struct wl_req *w = wl_req_new((const uint8_t *)"another salt 16b", 16);
	const uint64_t *h;
	wl_req_feed(w, a, strlen(a));
	assert_int_equal(wl_req_hashes(w, &h), na);
	for (size_t i = 0; i < na; i++)
		assert_true(h[i] != ha[i]);
	workload_req_free(w);
}

static void test_any_split_same_hashes(void **state)
{
	char a[1024];
	uint64_t whole[64];
	(void)state;

	chat(a, sizeof(a), "Quote \\\"this\\\" and a backslash \\\\ then more text to fill a block or two.");
	size_t n = hashes_of(a, 16, 0, whole, 64);
	assert_true(n > 4);
	same_at_every_split(a, 16, 17, whole, n, 77);
}

/* max_tokens read as a JSON number, split anywhere: an integral value up
 * to WL_MAX_TOKENS_MAX is recorded (256.0 and 1e3 are integral), anything
 * else (a fraction, a negative, past the bound, not a number, a number
 * too long to be one we read) is absent. The last one written counts, as
 * the upstream's parser keeps it. */
static void test_max_tokens_is_a_json_number(void **state)
{
	static const struct {
		const char *v;
		int64_t want;
	} cases[] = {
		{ "256", 256 },
		{ "256.0", 256 },
		{ " 256 ", 256 },
		{ "\n\t1e3\r ", 1000 },
		{ "1e3", 1000 },
		{ "1E+3", 1000 },
		{ "2500e-1", 250 },
		{ "0", 0 },
		{ "-0", 0 },
		{ "0.0e5", 0 },
		{ "1.5", -1 },
		{ "-5", -1 },
		{ "1e-3", -1 },
		{ "9007199254740991", 9007199254740991 },
		{ "9007199254740992", -1 },
		{ "1099511627776123", 1099511627776123 },
		{ "123456789012345678901234567890", -1 },
		{ "1e999999999999", -1 },
		{ "0.00000000000000000000000000000000000000000000000000000000000001e62", -1 },
		{ "1.", -1 },
		{ ".5", -1 },
		{ "01", -1 },
		{ "1e", -1 },
		{ "--1", -1 },
		{ "\"256\"", -1 },
		{ "true", -1 },
		{ "null", -1 },
		{ "[256]", -1 },
		{ "{\"n\":256}", -1 },
	};
	static const char *const keys[] = { "max_tokens", "max_completion_tokens", "max_output_tokens" };
	char body[256];
	(void)state;

	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			int n = snprintf(body, sizeof(body), "{\"model\":\"m\",\"%s\":%s,\"stream\":true}", keys[k],
					 cases[i].v);
			for (int cut = 1; cut < n; cut++) {
				struct wl_req *w = wl_req_new(salt, 16);
				wl_req_feed(w, body, (size_t)cut);
				wl_req_feed(w, body + cut, (size_t)(n - cut));
				if (wl_req_max_tokens(w) != cases[i].want)
					fail_msg("%s cut at %d: %lld, expected %lld", body, cut,
						 (long long)wl_req_max_tokens(w), (long long)cases[i].want);
				workload_req_free(w);
			}
		}
	/* the last one written counts; a nested one is not ours */
	struct wl_req *w = wl_req_new(salt, 16);
	const char *twice = "{\"max_tokens\":7,\"max_tokens\":1.5}";
	wl_req_feed(w, twice, strlen(twice));
	assert_int_equal(wl_req_max_tokens(w), -1);
	workload_req_free(w);
	w = wl_req_new(salt, 16);
	const char *nested = "{\"max_tokens\":7,\"options\":{\"max_tokens\":9}}";
	wl_req_feed(w, nested, strlen(nested));
	assert_int_equal(wl_req_max_tokens(w), 7);
	workload_req_free(w);
}

/* Only prompt text is hashed: the model, roles, sampling fields and key
 * order outside it change nothing; quotes inside a string do not end it. */
static void test_only_prompt_text(void **state)
{
	uint64_t a[16], b[16];
	size_t na, nb;
	(void)state;

	na = hashes_of(
		"{\"model\":\"a\",\"temperature\":0.5,\"messages\":[{\"role\":\"user\",\"content\":\"hello "
		"there, \\\"model\\\": friend\"}],\"max_tokens\":12}",
		8, 0, a, 16);
	nb = hashes_of(
		"{\"messages\":[{\"content\":\"hello there, \\\"model\\\": friend\",\"role\":\"assistant\"}],"
		"\"model\":\"bbbbbb\",\"stream\":true}",
		8, 0, b, 16);
	assert_true(na > 0);
	assert_int_equal(na, nb);
	assert_memory_equal(a, b, na * sizeof(*a));
	/* content parts, Responses input and Anthropic's system: hashed too */
	assert_int_not_equal(hashes_of("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
				       "\"abc\"}]}]}",
				       8, 0, a, 16),
			     0);
	assert_int_not_equal(hashes_of("{\"input\":[{\"role\":\"user\",\"content\":\"abc\"}]}", 8, 0, a, 16), 0);
	assert_int_not_equal(hashes_of("{\"system\":\"abc\",\"messages\":[]}", 8, 0, a, 16), 0);
	assert_int_equal(hashes_of("{\"model\":\"abcdefghijklmnop\",\"messages\":[]}", 8, 0, a, 16), 0);
	/* a very long key matches no key of ours */
	assert_int_equal(hashes_of("{\"contentcontentcontentcontentcontent\":\"abc\"}", 8, 0, a, 16), 0);
}

/* Keys are read as the upstream reads them, escapes decoded, however the
 * body is split: "cont\u0065nt" is prompt text, "max_t\u006fkens" the
 * output budget; a key that decodes to something else is neither. */
static void test_escaped_keys(void **state)
{
	const char *plain =
		"{\"messages\":[{\"role\":\"user\",\"content\":\"hello there, friend of mine\"}],"
		"\"max_tokens\":12}";
	const char *esc =
		"{\"messages\":[{\"role\":\"user\",\"cont\\u0065nt\":\"hello there, friend of mine\"}],"
		"\"max_t\\u006Fkens\":12}";
	uint64_t a[16];
	(void)state;

	size_t na = hashes_of(plain, 8, 0, a, 16);
	assert_true(na > 0);
	same_at_every_split(esc, 8, 7, a, na, 12);
	/* escapes that decode to other keys, or to nothing JSON has */
	assert_int_equal(hashes_of("{\"cont\\u0066nt\":\"abc\",\"content\\n\":\"abc\",\"cont\\u00e9nt\":\"abc\","
				   "\"cont\\u0x65nt\":\"abc\"}",
				   8, 0, a, 16),
			 0);
	assert_int_not_equal(hashes_of("{\"\\u0063\\u006f\\u006e\\u0074\\u0065\\u006e\\u0074\":\"abc\"}", 8, 0, a, 16),
			     0);
	assert_int_equal(hashes_of("{\"te\\/xt\":\"abc\"}", 8, 0, a, 16), 0); /* "te/xt" */
	assert_int_not_equal(hashes_of("{\"\\u0073ystem\":\"abc\"}", 8, 0, a, 16), 0);
}

/* The first-turn key of `body` fed in pieces of `step` bytes (0: at
 * once); false when there is none. */
static bool first_turn_of(const char *body, size_t step, uint64_t *hash, uint64_t *bytes)
{
	struct wl_req *w = wl_req_new(salt, 64);
	size_t len = strlen(body);

	assert_non_null(w);
	for (size_t i = 0; i < len; i += step ? step : len)
		wl_req_feed(w, body + i, !step || len - i < step ? len - i : step);
	bool ok = wl_req_first_turn(w, hash, bytes);
	assert_true(wl_req_first_turn_seen(w) || !ok);
	workload_req_free(w);
	return ok;
}

/* A conversation's key is the chain through its first user message: the
 * same in every later turn, in any split, whatever the order of a
 * message's members; another first message changes it; a body with no
 * user message has none. */
static void test_first_turn_key(void **state)
{
	(void)state;
	const char *t1 =
		"{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
		"{\"role\":\"user\",\"content\":\"first question of conversation one\"}]}";
	const char *t3 =
		"{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
		"{\"content\":\"first question of conversation one\",\"role\":\"user\"},"
		"{\"role\":\"assistant\",\"content\":\"an answer\"},"
		"{\"role\":\"user\",\"content\":\"second question\"},"
		"{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"more\"}]},"
		"{\"role\":\"user\",\"content\":\"third question\"}],\"max_tokens\":8}";
	const char *other =
		"{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
		"{\"role\":\"user\",\"content\":\"first question of conversation two\"}]}";
	uint64_t h1, b1, h, b, hashes[8];

	assert_true(first_turn_of(t1, 0, &h1, &b1));
	assert_int_equal(b1, strlen("You are terse.") + 1 + strlen("first question of conversation one") + 1);
	/* the chain's hash through those bytes: t1's whole prompt */
	size_t n = hashes_of(t1, 64, 0, hashes, 8);
	assert_int_equal(n, 1);
	assert_true(h1 == hashes[0]);
	for (size_t step = 1; step <= 9; step += 4) {
		assert_true(first_turn_of(t3, step, &h, &b));
		assert_true(h == h1);
		assert_int_equal(b, b1);
	}
	assert_true(first_turn_of(other, 3, &h, &b));
	assert_true(h != h1);
	/* a role written with an escape is the role */
	assert_true(
		first_turn_of("{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
			      "{\"role\":\"\\u0075ser\",\"content\":\"first question of conversation one\"}]}",
			      0, &h, &b));
	assert_true(h == h1);
	/* Anthropic: a top-level system, content blocks */
	assert_true(
		first_turn_of("{\"system\":\"You are terse.\",\"messages\":[{\"role\":\"user\",\"content\":"
			      "[{\"type\":\"text\",\"text\":\"first question of conversation one\"}]}]}",
			      0, &h, &b));
	assert_true(h == h1);
	/* Gemini: a system instruction, contents of parts */
	assert_true(
		first_turn_of("{\"systemInstruction\":{\"parts\":[{\"text\":\"You are terse.\"}]},\"contents\":"
			      "[{\"role\":\"user\",\"parts\":[{\"text\":\"first question of conversation one\"}]},"
			      "{\"role\":\"model\",\"parts\":[{\"text\":\"an answer\"}]}]}",
			      0, &h, &b));
	assert_true(h == h1);
	/* a user message with no text yet leaves the key to the next one */
	assert_true(first_turn_of(
		"{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
		"{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]},"
		"{\"role\":\"user\",\"content\":\"first question of conversation one\"}]}",
		0, &h, &b));
	assert_true(h == h1);
	/* no user message: no key; a body cut inside the first user message: none yet */
	assert_false(first_turn_of("{\"prompt\":\"You are terse. first question of conversation one\"}", 0, &h, &b));
	assert_false(first_turn_of("{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"}]}", 0, &h, &b));
	assert_false(first_turn_of("{\"messages\":[{\"role\":\"user\",\"content\":\"first question", 0, &h, &b));
	/* "role" at the top is no message's */
	assert_false(first_turn_of("{\"role\":\"user\",\"prompt\":\"text\"}", 0, &h, &b));
}

static void test_ids_in_order_of_first_appearance(void **state)
{
	struct wl_ids *t = wl_ids_new(0);
	(void)state;

	assert_non_null(t);
	assert_int_equal(wl_ids_get(t, 900), 0);
	assert_int_equal(wl_ids_get(t, 17), 1);
	assert_int_equal(wl_ids_get(t, 900), 0);
	for (uint64_t i = 0; i < 5000; i++) /* past several doublings */
		assert_int_equal(wl_ids_get(t, 100000 + i * 7919), 2 + i);
	assert_int_equal(wl_ids_get(t, 17), 1);
	assert_int_equal(wl_ids_get(t, 100000 + 4999 * 7919), 5001);
	assert_int_equal(wl_ids_count(t), 5002);
	assert_int_equal(wl_ids_forgotten(t), 0);
	wl_ids_free(t);
}

/* At its bound the table remembers no more: a new hash gets a new id each
 * time it is met, counted; the hashes remembered keep theirs. */
static void test_ids_bound(void **state)
{
	struct wl_ids *t = wl_ids_new(1024);
	(void)state;

	assert_non_null(t);
	for (uint64_t i = 0; i < 1024; i++)
		assert_int_equal(wl_ids_get(t, 7 + i * 104729), i);
	assert_int_equal(wl_ids_count(t), 1024);
	assert_int_equal(wl_ids_get(t, 5), 1024);
	assert_int_equal(wl_ids_get(t, 5), 1025);
	assert_int_equal(wl_ids_forgotten(t), 2);
	for (uint64_t i = 0; i < 1024; i++)
		assert_int_equal(wl_ids_get(t, 7 + i * 104729), i);
	assert_int_equal(wl_ids_count(t), 1024);
	assert_int_equal(wl_ids_forgotten(t), 2);
	assert_int_equal(wl_ids_get(t, 6), 1026);
	wl_ids_free(t);
}

static json_t *load_lines(const char *path, size_t *n)
{
	json_t *arr = json_array();
	FILE *f = fopen(path, "r");
	char line[8192];

	*n = 0;
	if (!f)
		return arr;
	while (fgets(line, sizeof(line), f)) {
		json_error_t e;
		json_t *o = json_loads(line, 0, &e);
		assert_non_null(o);
		json_array_append_new(arr, o);
		(*n)++;
	}
	fclose(f);
	return arr;
}

static int record_status = 200; /* the status record_of's records have */

/* One finished request of a given route and model, stream flag, cached
 * tokens (-1: not said) and e2e. */
static void record_of(uint64_t arrive, int64_t in, int64_t out, const char *body, const char *route, const char *model,
		      int stream, int64_t cached, uint64_t e2e_ms)
{
	struct req_record rec;
	struct wl_req *w = NULL;

	memset(&rec, 0, sizeof(rec));
	rec.usage = USAGE_UNKNOWN;
	rec.usage.input_tokens = in;
	rec.usage.output_tokens = out;
	rec.usage.cached_tokens = cached;
	rec.stream = stream;
	rec.status = record_status;
	rec.at[TL_ARRIVE] = arrive;
	rec.at[TL_FIRST_TOKEN] = arrive + 5000000;
	rec.at[TL_RESP_END] = arrive + e2e_ms * 1000000u;
	strcpy(rec.model, model);
	if (body)
		workload_feed(&w, body, strlen(body));
	workload_record(&rec, w, route, "up1");
	workload_req_free(w);
}

static void record(uint64_t arrive, int64_t in, int64_t out, const char *body)
{
	record_of(arrive, in, out, body, "chat", "m1", 1, in >= 0 ? in / 2 : -1, 20);
}

/* The capture's lines: Mooncake's fields and the extras, ids shared in
 * order of first appearance; then rotation keeps max_files files, each
 * under max_size. */
static void test_capture_lines_and_rotation(void **state)
{
	char dir[] = "/tmp/test_workload_XXXXXX", path[256], p1[300], p2[300], body[1024];
	struct workload_options o = { path, 4096, 2, 4, 0, 0 }; /* blocks of 16 bytes */
	char err[256];
	size_t n, n1;
	struct stat st;
	(void)state;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/w.jsonl", dir);
	snprintf(p1, sizeof(p1), "%s.1", path);
	snprintf(p2, sizeof(p2), "%s.2", path);
	assert_int_equal(workload_open(&o, err, sizeof(err)), 0);
	assert_true(workload_active());
	uint64_t t0 = clock_now_ns();
	record(t0 + 1500000000ull, 30, 12, chat(body, sizeof(body), "first question here"));
	record(t0 + 2500000000ull, 31, 7, chat(body, sizeof(body), "second question here"));
	record(t0 + 3000000000ull, -1, 5, "{\"prompt\":\"0123456789\",\"user\":\"alice\",\"max_tokens\":9}");
	record(t0 + 3100000000ull, -1, 5, "{\"prompt\":\"0123456789\",\"user\":\"alice\",\"max_tokens\":9}");
	workload_close();
	assert_false(workload_active());

	json_t *l = load_lines(path, &n);
	assert_int_equal(n, 4);
	json_t *a = json_array_get(l, 0), *b = json_array_get(l, 1), *c = json_array_get(l, 2),
	       *d = json_array_get(l, 3);
	json_int_t ts = json_integer_value(json_object_get(a, "timestamp"));
	/* the capture began before t0, by a thread's start (ms under ASan) */
	assert_true(ts >= 1500 && ts < 1600);
	assert_int_equal(json_integer_value(json_object_get(b, "timestamp")) - ts, 1000);
	assert_int_equal(json_integer_value(json_object_get(a, "input_length")), 30);
	assert_int_equal(json_integer_value(json_object_get(a, "output_length")), 12);
	assert_string_equal(json_string_value(json_object_get(a, "route")), "chat");
	assert_string_equal(json_string_value(json_object_get(a, "upstream")), "up1");
	assert_string_equal(json_string_value(json_object_get(a, "model")), "m1");
	assert_true(json_is_true(json_object_get(a, "stream")));
	assert_int_equal(json_integer_value(json_object_get(a, "max_tokens")), 77);
	assert_int_equal(json_integer_value(json_object_get(a, "cached_tokens")), 15);
	assert_true(json_is_null(json_object_get(a, "session")));
	assert_true(json_real_value(json_object_get(a, "ttft_ms")) == 5.0);
	assert_true(json_real_value(json_object_get(a, "e2e_ms")) == 20.0);
	assert_string_equal(json_string_value(json_object_get(a, "outcome")), "ok");
	/* ids from 0 in order of first appearance; the shared system prompt's */
	json_t *ia = json_object_get(a, "hash_ids"), *ib = json_object_get(b, "hash_ids");
	size_t shared = strlen(SYS) / 16;
	for (size_t i = 0; i < json_array_size(ia); i++)
		assert_int_equal(json_integer_value(json_array_get(ia, i)), i);
	for (size_t i = 0; i < shared; i++)
		assert_int_equal(json_integer_value(json_array_get(ib, i)), i);
	assert_int_equal(json_integer_value(json_array_get(ib, shared + 1)), json_array_size(ia) + 1);
	/* no usage: the length from the prompt's bytes, said so; the session
	 * hash is the same for the same user, and no text of it is written */
	assert_int_equal(json_integer_value(json_object_get(c, "input_length")), 3); /* 11 bytes / 4 */
	assert_true(json_is_true(json_object_get(c, "input_length_estimated")));
	assert_true(json_is_null(json_object_get(c, "cached_tokens")));
	assert_int_equal(json_integer_value(json_object_get(c, "max_tokens")), 9);
	assert_string_equal(json_string_value(json_object_get(c, "session")),
			    json_string_value(json_object_get(d, "session")));
	assert_true(json_equal(json_object_get(c, "hash_ids"), json_object_get(d, "hash_ids")));
	json_decref(l);
	FILE *f = fopen(path, "r");
	char all[8192];
	size_t got = fread(all, 1, sizeof(all) - 1, f);
	all[got] = 0;
	fclose(f);
	assert_null(strstr(all, "question"));
	assert_null(strstr(all, "alice"));
	assert_null(strstr(all, "careful"));

	/* rotation: 4 KiB files, 2 kept */
	assert_int_equal(workload_open(&o, err, sizeof(err)), 0);
	for (int i = 0; i < 200; i++)
		record(clock_now_ns(), 10, 10, chat(body, sizeof(body), "a rotation filler question"));
	workload_close();
	l = load_lines(path, &n);
	json_decref(l);
	l = load_lines(p1, &n1);
	json_decref(l);
	assert_true(n > 0 && n1 > 0);
	assert_int_equal(stat(path, &st), 0);
	assert_true(st.st_size <= 4096);
	assert_int_equal(stat(p1, &st), 0);
	assert_true(st.st_size <= 4096 && st.st_size > 2048);
	assert_int_equal(stat(p2, &st), -1); /* the oldest went */
	unlink(path);
	unlink(p1);
	rmdir(dir);
}

/* An unwritable path: the capture runs, the records are dropped, the
 * caller is never held. */
static void test_unwritable_path_drops(void **state)
{
	struct workload_options o = { "/nonexistent-dir/w.jsonl", 1 << 20, 2, 4, 0, 0 };
	char err[256];
	(void)state;

	assert_int_equal(workload_open(&o, err, sizeof(err)), 0);
	for (int i = 0; i < 10; i++)
		record(clock_now_ns(), 1, 1, "{\"prompt\":\"x\"}");
	workload_close();
	assert_int_equal(access("/nonexistent-dir/w.jsonl", F_OK), -1);
}

/* GET /workload's summary: the arrival rate and the gaps' CV over the
 * window, sorted by arrival though written as requests finish; length
 * quantiles; the share of prefix blocks seen before. */
static void test_summary(void **state)
{
	char dir[] = "/tmp/test_workload_XXXXXX", path[256];
	struct workload_options o = { path, 1 << 20, 2, 4, 0, 0 };
	char *text;
	json_t *s = NULL;
	(void)state;

	text = workload_summary_json(NULL, NULL);
	assert_string_equal(text, "{\n  \"capturing\": false\n}");
	free(text);
	capture_open(dir, path, sizeof(path), &o);
	uint64_t t0 = clock_now_ns();
	/* 11 arrivals 100 ms apart, finishing out of order; every prompt the
	 * same 32 bytes and a separator: 3 blocks, shared from the second on */
	static const int order[] = { 3, 0, 1, 2, 7, 4, 5, 6, 10, 8, 9 };
	for (int i = 0; i < 11; i++)
		record(t0 + (uint64_t)order[i] * 100000000ull, 10 * (order[i] + 1), order[i] + 1,
		       "{\"prompt\":\"0123456789abcdef0123456789abcdef\"}");
	for (int tries = 0; tries < 500; tries++) {
		text = workload_summary_json(NULL, NULL);
		json_decref(s);
		s = json_loads(text, 0, NULL);
		free(text);
		if (json_integer_value(json_object_get(s, "records")) == 11)
			break;
		usleep(2000);
	}
	workload_close();
	assert_int_equal(json_integer_value(json_object_get(s, "records")), 11);
	assert_true(json_is_true(json_object_get(s, "capturing")));
	assert_true(fabs(json_real_value(json_object_get(s, "arrival_rate")) - 10.0) < 0.2);
	assert_true(json_real_value(json_object_get(s, "interarrival_cv")) < 0.05);
	json_t *in = json_object_get(s, "input_length"), *out = json_object_get(s, "output_length");
	assert_int_equal(json_integer_value(json_object_get(in, "p50")), 60);
	assert_int_equal(json_integer_value(json_object_get(in, "max")), 110);
	assert_int_equal(json_integer_value(json_object_get(out, "p90")), 10);
	assert_int_equal(json_integer_value(json_object_get(s, "prefix_blocks")), 33);
	assert_int_equal(json_integer_value(json_object_get(s, "prefix_shared_blocks")), 30);
	json_decref(s);
	unlink(path);
	rmdir(dir);
}

/* The summary of a selection, parsed; waits until `records` are written. */
static json_t *summary_of(const char *route, const char *model)
{
	char *text = workload_summary_json(route, model);
	json_t *s;

	assert_non_null(text);
	s = json_loads(text, 0, NULL);
	free(text);
	assert_non_null(s);
	return s;
}

static void wait_records(json_int_t n)
{
	for (int tries = 0; tries < 1000; tries++) {
		json_t *s = summary_of(NULL, NULL);
		json_int_t got = json_integer_value(json_object_get(s, "records"));
		json_decref(s);
		if (got >= n)
			return;
		usleep(2000);
	}
	fail_msg("the writer did not reach %lld records", (long long)n);
}

static double num(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	assert_true(json_is_number(v));
	return json_number_value(v);
}

/* The count of the histogram bucket whose upper bound is `le` (0: none). */
static json_int_t bucket(json_t *dist, json_int_t le)
{
	json_t *h = json_object_get(dist, "histogram"), *b;
	size_t i;

	assert_true(json_is_array(h));
	json_array_foreach (h, i, b)
		if (json_integer_value(json_object_get(b, "le")) == le)
			return json_integer_value(json_object_get(b, "count"));
	return 0;
}

/* The entry of by_route / by_model named `name`. */
static json_t *entry(json_t *s, const char *list, const char *key, const char *name)
{
	json_t *a = json_object_get(s, list), *e;
	size_t i;

	json_array_foreach (a, i, e)
		if (strcmp(json_string_value(json_object_get(e, key)), name) == 0)
			return e;
	fail_msg("%s has no %s", list, name);
	return NULL;
}

/* Per route and model: three (route, model) pairs with known arrivals,
 * durations, lengths, stream flags and cached counts; the summary of each
 * selection (route=, model=, both, an unknown one), its concurrency at
 * arrival, length histograms, the arrival series from the capture's start,
 * stream and cached-token shares, and the by_route / by_model lists. */
static void test_summary_by_route_and_model(void **state)
{
	char dir[] = "/tmp/test_workload_XXXXXX", path[256];
	struct workload_options o = { path, 1 << 20, 2, 4, 0, 0 };
	json_t *s;
	(void)state;

	capture_open(dir, path, sizeof(path), &o);
	uint64_t t0 = clock_now_ns(), ms = 1000000u;
	/* A: chat/m1, 10 streamed arrivals 100 ms apart, 250 ms each, 100
	 * prompt tokens of which 50 cached: up to three in flight */
	for (int k = 0; k < 10; k++)
		record_of(t0 + (uint64_t)k * 100 * ms, 100, 10, "{\"prompt\":\"a\"}", "chat", "m1", 1, 50, 250);
	/* B: chat/m2, 5 unstreamed arrivals at 50, 250, … 850 ms, 10 ms each,
	 * 1000 prompt tokens, no cached count said */
	for (int k = 0; k < 5; k++)
		record_of(t0 + (uint64_t)(50 + 200 * k) * ms, 1000, 7, "{\"prompt\":\"b\"}", "chat", "m2", 0, -1, 10);
	/* C: batch/m1, one at 2 s */
	record_of(t0 + 2000 * ms, 40, 1, "{\"prompt\":\"c\"}", "batch", "m1", 1, 0, 5);
	wait_records(16);

	/* everything */
	s = summary_of(NULL, NULL);
	assert_int_equal(num(s, "records"), 16);
	assert_int_equal(num(s, "window_records"), 16);
	assert_int_equal(num(entry(s, "by_route", "route", "chat"), "records"), 15);
	assert_int_equal(num(entry(s, "by_route", "route", "batch"), "records"), 1);
	assert_int_equal(num(entry(s, "by_model", "model", "m1"), "records"), 11);
	assert_int_equal(num(entry(s, "by_model", "model", "m2"), "records"), 5);
	/* arrivals per second from the capture's start (a thread's start
	 * before t0): 15 in the first second, C in the third */
	json_t *arr = json_object_get(s, "arrivals");
	assert_int_equal(num(arr, "step_s"), 1);
	json_t *counts = json_object_get(arr, "counts");
	assert_int_equal(json_array_size(counts), 3);
	assert_int_equal(json_integer_value(json_array_get(counts, 0)), 15);
	assert_int_equal(json_integer_value(json_array_get(counts, 1)), 0);
	assert_int_equal(json_integer_value(json_array_get(counts, 2)), 1);
	/* 11 of 16 streamed; cached tokens over the prompts of the records
	 * that said: (10 × 50 + 0) / (10 × 100 + 40) */
	assert_true(fabs(num(s, "stream_share") - 11.0 / 16.0) < 1e-9);
	assert_true(fabs(num(s, "cached_token_share") - 500.0 / 1040.0) < 1e-3);
	/* concurrency at each arrival, counting itself: A 1, 2, then 3 (two
	 * before it still running); B 2, 3, 3, 3, 3 (A's); C 1 */
	json_t *c = json_object_get(s, "concurrency");
	assert_int_equal(num(c, "max"), 3);
	assert_int_equal(num(c, "p50"), 3);
	assert_int_equal(bucket(c, 1), 2);
	assert_int_equal(bucket(c, 2), 2);
	assert_int_equal(bucket(c, 4), 12);
	json_decref(s);

	/* one pair: A alone */
	s = summary_of("chat", "m1");
	assert_int_equal(num(s, "records"), 10);
	assert_true(fabs(num(s, "arrival_rate") - 10.0) < 0.05);
	assert_true(num(s, "interarrival_cv") < 0.05);
	assert_true(fabs(num(s, "stream_share") - 1.0) < 1e-9);
	assert_true(fabs(num(s, "cached_token_share") - 0.5) < 1e-9);
	c = json_object_get(s, "concurrency");
	assert_int_equal(num(c, "max"), 3);
	assert_true(fabs(num(c, "mean") - 2.7) < 1e-9);
	assert_int_equal(bucket(c, 1), 1);
	assert_int_equal(bucket(c, 2), 1);
	assert_int_equal(bucket(c, 4), 8);
	assert_int_equal(bucket(json_object_get(s, "input_length"), 128), 10);
	assert_int_equal(json_array_size(json_object_get(json_object_get(s, "input_length"), "histogram")), 1);
	assert_string_equal(json_string_value(json_object_get(json_object_get(s, "filter"), "route")), "chat");
	assert_int_equal(json_array_size(json_object_get(s, "by_model")), 1);
	json_decref(s);

	/* model=m2: B, unstreamed, no cached count, only its own in flight */
	s = summary_of(NULL, "m2");
	assert_int_equal(num(s, "records"), 5);
	assert_true(fabs(num(s, "stream_share")) < 1e-9);
	assert_true(json_is_null(json_object_get(s, "cached_token_share")));
	assert_int_equal(num(json_object_get(s, "input_length"), "p50"), 1000);
	assert_int_equal(bucket(json_object_get(s, "input_length"), 1024), 5);
	assert_int_equal(num(json_object_get(s, "concurrency"), "max"), 1);
	assert_int_equal(num(entry(s, "by_route", "route", "chat"), "records"), 5);
	json_decref(s);

	/* route=chat: A and B, 15 */
	s = summary_of("chat", NULL);
	assert_int_equal(num(s, "records"), 15);
	assert_int_equal(num(json_object_get(s, "output_length"), "max"), 10);
	assert_int_equal(bucket(json_object_get(s, "output_length"), 8), 5);
	assert_int_equal(bucket(json_object_get(s, "output_length"), 16), 10);
	json_decref(s);

	/* nothing matches: zero records, no distributions */
	s = summary_of("nosuch", NULL);
	assert_int_equal(num(s, "records"), 0);
	assert_true(json_is_null(json_object_get(s, "arrival_rate")));
	assert_true(json_is_null(json_object_get(json_object_get(s, "input_length"), "p50")));
	assert_int_equal(json_array_size(json_object_get(s, "by_route")), 0);
	json_decref(s);

	workload_close();
	unlink(path);
	rmdir(dir);
}

/* The summary's groups are admitted as the stats admit model names: 63
 * junk pairs the upstream refused (404) take no group, so a real model
 * answered 200 after them has its own; a refused record of a grouped pair
 * stays in its group. With group_idle, once the groups are full, a new
 * pair takes the place of the one idle the longest, whose counts (its
 * window records too) move to "(other)": the totals stay whole. */
static void test_summary_groups_admitted_on_success(void **state)
{
	char dir[] = "/tmp/test_workload_XXXXXX", path[256], model[16];
	struct workload_options o = { path, 64 << 20, 2, 4, 1000, 0 }; /* idle after 1 s */
	json_t *s;
	(void)state;

	capture_open(dir, path, sizeof(path), &o);
	uint64_t t0 = clock_now_ns();
	record_status = 404;
	for (int i = 0; i < 63; i++) {
		snprintf(model, sizeof(model), "junk-%d", i);
		record_of(t0 + (uint64_t)i * 1000000u, 10, 5, "{\"prompt\":\"x\"}", "chat", model, 1, -1, 20);
	}
	record_status = 200;
	for (int i = 0; i < 3; i++)
		record_of(t0 + 100000000u, 10, 5, "{\"prompt\":\"x\"}", "chat", "real", 1, -1, 20);
	record_status = 500; /* a failure of a grouped pair stays under it */
	record_of(t0 + 110000000u, 10, 5, "{\"prompt\":\"x\"}", "chat", "real", 1, -1, 20);
	record_status = 200;
	wait_records(67);
	s = summary_of(NULL, "real");
	assert_int_equal(num(s, "records"), 4);
	assert_int_equal(num(s, "window_records"), 4);
	json_decref(s);
	s = summary_of(NULL, NULL);
	assert_int_equal(json_array_size(json_object_get(s, "by_model")), 2);
	assert_int_equal(num(entry(s, "by_model", "model", "(other)"), "records"), 63);
	json_decref(s);

	/* 62 more real pairs fill the groups (63 and "(other)") */
	for (int i = 0; i < 62; i++) {
		snprintf(model, sizeof(model), "m%d", i);
		record_of(t0 + 200000000u + (uint64_t)i * 1000000u, 10, 5, "{\"prompt\":\"x\"}", "chat", model, 1, -1,
			  20);
	}
	/* within the second: a new pair finds no idle group */
	record_of(t0 + 900000000u, 10, 5, "{\"prompt\":\"x\"}", "chat", "late", 1, -1, 20);
	/* m0..m61 stay in use; "real" was last seen at t0 + 0.11 s */
	for (int i = 0; i < 62; i++) {
		snprintf(model, sizeof(model), "m%d", i);
		record_of(t0 + 1000000000u, 10, 5, "{\"prompt\":\"x\"}", "chat", model, 1, -1, 20);
	}
	record_of(t0 + 1200000000u, 10, 5, "{\"prompt\":\"x\"}", "chat", "newer", 1, -1, 20);
	wait_records(67 + 62 + 1 + 62 + 1);
	s = summary_of(NULL, NULL);
	assert_int_equal(num(s, "records"), 67 + 62 + 1 + 62 + 1);
	assert_int_equal(num(s, "window_records"), 67 + 62 + 1 + 62 + 1);
	assert_int_equal(json_array_size(json_object_get(s, "by_model")), WL_GROUPS_MAX);
	assert_int_equal(num(entry(s, "by_model", "model", "newer"), "records"), 1);
	assert_int_equal(num(entry(s, "by_model", "model", "m7"), "records"), 2);
	/* junk, late and real's four */
	json_t *other = entry(s, "by_model", "model", "(other)");
	assert_int_equal(num(other, "records"), 63 + 1 + 4);
	assert_int_equal(num(other, "window_records"), 63 + 1 + 4);
	json_decref(s);
	s = summary_of(NULL, "real");
	assert_int_equal(num(s, "records"), 0);
	json_decref(s);
	workload_close();
	unlink(path);
	rmdir(dir);
}

/* The summary's bounds: 5000 records over 100 (route, model) pairs and 83
 * hours: the window keeps the last 4096, pairs past the 63rd are counted
 * as "(other)", the arrival series' step grows to an hour (240 slots), and
 * the worst-case answer (129 selections of 4096 records) is timed. */
static void test_summary_bounds(void **state)
{
	char dir[] = "/tmp/test_workload_XXXXXX", path[256], route[16], model[16];
	struct workload_options o = { path, 64 << 20, 2, 4, 0, 0 };
	const int n = 5000, pairs = 100;
	(void)state;

	capture_open(dir, path, sizeof(path), &o);
	uint64_t t0 = clock_now_ns();
	for (int i = 0; i < n; i++) {
		snprintf(route, sizeof(route), "r%d", i % pairs);
		snprintf(model, sizeof(model), "m%d", i % pairs);
		record_of(t0 + (uint64_t)i * 60 * 1000000000ull, 10 + i % 50, 5, "{\"prompt\":\"x\"}", route, model, 1,
			  -1, 20);
		if (i % 1000 == 999)
			wait_records(i + 1); /* the queue holds 4096 */
	}
	wait_records(n);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	char *text = workload_summary_json(NULL, NULL);
	clock_gettime(CLOCK_MONOTONIC, &b);
	assert_non_null(text);
	print_message("summary of 5000 records, 64 groups: %.1f ms, %zu bytes\n",
		      (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6, strlen(text));
	json_t *s = json_loads(text, 0, NULL);
	free(text);
	assert_non_null(s);
	assert_int_equal(num(s, "records"), n);
	assert_int_equal(num(s, "window_records"), WL_SUMMARY_WINDOW);
	assert_int_equal(json_array_size(json_object_get(s, "by_route")), WL_GROUPS_MAX);
	assert_int_equal(json_array_size(json_object_get(s, "by_model")), WL_GROUPS_MAX);
	json_t *other = entry(s, "by_route", "route", "(other)");
	assert_int_equal(num(other, "records"), n / pairs * (pairs - (WL_GROUPS_MAX - 1)));
	assert_int_equal(num(entry(s, "by_model", "model", "m62"), "records"), n / pairs);
	/* 83 h of arrivals: hour slots, every record in one */
	json_t *arr = json_object_get(s, "arrivals"), *c;
	size_t i;
	json_int_t sum = 0;
	assert_int_equal(num(arr, "step_s"), 3600);
	assert_true(json_array_size(json_object_get(arr, "counts")) <= WL_SERIES_SLOTS);
	json_array_foreach (json_object_get(arr, "counts"), i, c)
		sum += json_integer_value(c);
	assert_int_equal(sum, n);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(arr, "counts"), 1)), 60);
	/* a filter on a pair past the bound finds nothing of its own */
	json_decref(s);
	s = summary_of("r99", NULL);
	assert_int_equal(num(s, "records"), 0);
	json_decref(s);
	workload_close();
	unlink(path);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shared_prefix_shares_first_hashes),
		cmocka_unit_test(test_changed_byte_changes_its_block_and_later),
		cmocka_unit_test(test_any_split_same_hashes),
		cmocka_unit_test(test_only_prompt_text),
		cmocka_unit_test(test_escaped_keys),
		cmocka_unit_test(test_max_tokens_is_a_json_number),
		cmocka_unit_test(test_first_turn_key),
		cmocka_unit_test(test_ids_in_order_of_first_appearance),
		cmocka_unit_test(test_ids_bound),
		cmocka_unit_test(test_capture_lines_and_rotation),
		cmocka_unit_test(test_unwritable_path_drops),
		cmocka_unit_test(test_summary),
		cmocka_unit_test(test_summary_by_route_and_model),
		cmocka_unit_test(test_summary_bounds),
		cmocka_unit_test(test_summary_groups_admitted_on_success),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
