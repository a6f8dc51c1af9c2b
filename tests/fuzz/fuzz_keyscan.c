/*
 * fuzz_keyscan.c — libFuzzer target: keyscan_find() against memmem().
 *
 * Input layout: byte 0 gives the key length (3 + byte % 30) and the key is
 * taken from the input's last bytes, so the fuzzer can make keys that occur
 * in the haystack; the haystack is everything between. The haystack is
 * copied to an allocation of exactly its size, so ASan reports a vector
 * load that reads one byte past it.
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

	/* Every suffix start, so the vector steps meet every alignment. */
	for (size_t from = 0; from <= len && from < 64; from++) {
		const char *want = memmem(hay + from, len - from, q, qlen);
		const char *got = keyscan_find(hay + from, hay + len, q, qlen);
		CHECK(want == got);
	}
	free(hay);
	return 0;
}
