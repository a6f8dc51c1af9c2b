/*
 * fuzz_reqinfo.c — libFuzzer target: model and stream flag from a request
 * body, whole or cut short (the proxy keeps only a prefix of large bodies).
 *
 * The input is the body. It is parsed as a complete body and as a prefix,
 * and a prefix of it (cut at a length derived from its first byte) as a
 * prefix, each from an exact-size heap copy so that ASan sees any read past
 * the end. Checked: the return value is 0 or -1; the model is NUL-terminated
 * inside its array; stream is -1, 0 or 1; parsing is deterministic.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "reqinfo.h"

static int parse_copy(const uint8_t *data, size_t len, bool complete, struct reqinfo *out)
{
	char *copy = malloc(len ? len : 1);
	CHECK(copy != NULL);
	if (len)
		memcpy(copy, data, len);
	memset(out, 0xa5, sizeof(*out)); /* garbage in: reqinfo must fill every field */
	int rc = reqinfo_parse(copy, len, complete, out);
	free(copy);
	CHECK(rc == 0 || rc == -1);
	if (rc == 0) {
		CHECK(memchr(out->model, '\0', sizeof(out->model)) != NULL);
		CHECK(out->stream >= -1 && out->stream <= 1);
	}
	return rc;
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
			CHECK(a.stream == b.stream);
		}
	}
	if (size > 1) {
		size_t cut = (size_t)data[0] * size / 256;
		parse_copy(data, cut, false, &a);
	}
	return 0;
}
