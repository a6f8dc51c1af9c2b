/*
 * fuzz_keyscan.c — libFuzzer target: keyscan_find() and keyscan_find_any()
 * against memmem().
 *
 * Input layout: byte 0 gives the key length (3 + byte % 30) and the key is
 * taken from the input's last bytes, so the fuzzer can make keys that occur
 * in the haystack; the haystack is everything between. The haystack is
 * copied to an allocation of exactly its size, so ASan reports a vector
 * load that reads one byte past it.
 *
 * keyscan_find_any() gets three keys that share the first byte, as quoted
 * keys do: the key, the key less its last byte, and the key with its middle
 * byte changed; it must answer the earliest of their memmem() hits, and at
 * a position where several start, the first of them in the list.
 */
#define _GNU_SOURCE /* memmem */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "keyscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t qlen = 3 + data[0] % 30;
	if (size < 1 + qlen)
		return 0;
	size_t len = size - 1 - qlen;
	const char *q = (const char *)data + 1 + len;
	char *hay = malloc(len ? len : 1);
	if (hay == NULL)
		return 0;
	memcpy(hay, data + 1, len);

	char *alt = malloc(qlen);
	if (alt == NULL) {
		free(hay);
		return 0;
	}
	memcpy(alt, q, qlen);
	alt[qlen / 2] ^= 1;
	const struct keyscan_key keys[3] = { { q, qlen }, { q, qlen - 1 }, { alt, qlen } };
	size_t nkeys = qlen - 1 >= 3 ? 3 : 1;

	/* Every suffix start, so the vector steps meet every alignment. */
	for (size_t from = 0; from <= len && from < 64; from++) {
		const char *want = memmem(hay + from, len - from, q, qlen);
		const char *got = keyscan_find(hay + from, hay + len, q, qlen);
		CHECK(want == got);

		const char *first = NULL;
		size_t first_key = 0, which = SIZE_MAX;
		for (size_t k = 0; k < nkeys; k++) {
			const char *at = memmem(hay + from, len - from, keys[k].q, keys[k].qlen);
			if (at && (!first || at < first)) {
				first = at;
				first_key = k;
			}
		}
		got = keyscan_find_any(hay + from, hay + len, keys, nkeys, &which);
		CHECK(got == first);
		CHECK(!got || which == first_key);
	}
	free(alt);
	free(hay);
	return 0;
}
