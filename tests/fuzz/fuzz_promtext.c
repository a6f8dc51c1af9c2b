/*
 * fuzz_promtext.c — libFuzzer target: promtext_parse() over any bytes.
 *
 * The input is copied to an allocation of exactly its size, so ASan reports
 * a read one byte past it. Each sample handed back must hold together: a
 * name of valid characters inside the input, label names inside the input,
 * values NUL-terminated at their length, at most PROMTEXT_LABELS_MAX labels;
 * and the counts must match the callbacks.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "promtext.h"

struct ctx {
	const char *buf;
	size_t len, calls;
};

static bool inside(const struct ctx *c, const char *p, size_t n)
{
	return p >= c->buf && n <= c->len && p + n <= c->buf + c->len;
}

static void on_sample(void *arg, const struct promtext_sample *s)
{
	struct ctx *c = arg;

	c->calls++;
	CHECK(s->name_len > 0 && inside(c, s->name, s->name_len));
	CHECK(memchr(s->name, '\n', s->name_len) == NULL);
	CHECK(s->nlabels <= PROMTEXT_LABELS_MAX);
	for (unsigned i = 0; i < s->nlabels; i++) {
		const struct promtext_label *l = &s->labels[i];
		CHECK(l->name_len > 0 && inside(c, l->name, l->name_len));
		CHECK(strlen(l->value) == l->value_len);
		CHECK(promtext_label(s, "x") == NULL || promtext_label(s, "x")->name_len == 1);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size ? size : 1);
	struct promtext_result r;
	struct ctx c;

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	c.buf = buf;
	c.len = size;
	c.calls = 0;
	promtext_parse(buf, size, on_sample, &c, &r);
	CHECK(r.samples == c.calls);
	CHECK(r.samples + r.skipped <= size);
	free(buf);
	return 0;
}
