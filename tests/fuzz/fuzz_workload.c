/*
 * fuzz_workload.c — libFuzzer target: the workload capture's scan of a
 * request body for its prompt text and the hash chain over it (workload.c).
 *
 * The input is a body. It is fed whole, at a cut derived from its first
 * byte, and one byte at a time. Checked: the three give the same hashes and
 * max_tokens (a read's boundaries never matter); the hash count stays within
 * the prompt bytes seen and WL_HASHES_MAX; max_tokens is -1 or not negative.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "workload.h"

static const uint8_t salt[16] = "fuzz-salt-16byte";

static size_t run(const uint8_t *data, size_t size, size_t step, uint64_t *out, size_t cap, int64_t *max_tokens)
{
	struct wl_req *w = wl_req_new(salt, 8);
	const uint64_t *h;
	size_t n;

	CHECK(w != NULL);
	for (size_t i = 0; i < size; i += step) {
		size_t len = size - i < step ? size - i : step;
		char *copy = malloc(len); /* exact size: ASan sees a read past the end */
		CHECK(copy != NULL);
		memcpy(copy, data + i, len);
		wl_req_feed(w, copy, len);
		free(copy);
	}
	n = wl_req_hashes(w, &h);
	CHECK(n <= WL_HASHES_MAX + 1);
	CHECK(n <= (wl_req_prompt_bytes(w) + 7) / 8);
	CHECK(n <= cap);
	if (n)
		memcpy(out, h, n * sizeof(*h));
	*max_tokens = wl_req_max_tokens(w);
	CHECK(*max_tokens >= -1 && *max_tokens <= WL_MAX_TOKENS_MAX);
	workload_req_free(w);
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint64_t a[WL_HASHES_MAX + 1], b[WL_HASHES_MAX + 1];
	int64_t ma, mb;
	size_t na, nb;

	if (size == 0)
		return 0;
	na = run(data, size, size, a, WL_HASHES_MAX + 1, &ma);
	nb = run(data, size, size > 1 ? 1 + (size_t)data[0] * (size - 1) / 256 : 1, b, WL_HASHES_MAX + 1, &mb);
	CHECK(na == nb && ma == mb);
	CHECK(na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
	if (size <= 4096) {
		nb = run(data, size, 1, b, WL_HASHES_MAX + 1, &mb);
		CHECK(na == nb && ma == mb);
		CHECK(na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
	}
	return 0;
}
