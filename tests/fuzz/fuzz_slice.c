/*
 * fuzz_slice.c — libFuzzer target: slice_decode_merge() on bytes read
 * back from the store (a slice: counters and histograms of one series over
 * one period).
 *
 * Checked: decoding never crashes nor reads past its input; a failed decode
 * leaves the destination as it was; a successful one re-encodes, and that
 * encoding decodes to the same slice (a histogram that is absent and one
 * that is empty count as the same) and encodes again to the same bytes.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "slice.h"

static bool hist_same(const struct hist *a, const struct hist *b)
{
	bool ae = !a || a->count == 0, be = !b || b->count == 0;
	if (ae || be)
		return ae && be;
	return memcmp(a, b, sizeof(*a)) == 0;
}

static bool slice_same(const struct slice *a, const struct slice *b)
{
	if (memcmp(a->counters, b->counters, sizeof(a->counters)) != 0)
		return false;
	for (unsigned i = 0; i < SLICE_SLOTS; i++)
		if (!hist_same(a->slot[i], b->slot[i]))
			return false;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct slice s, t, pre;
	uint8_t *enc = NULL, *enc2 = NULL;

	memset(&s, 0, sizeof(s));
	memset(&t, 0, sizeof(t));
	memset(&pre, 0, sizeof(pre));

	/* A destination with something in it: -1 must leave it unchanged. */
	pre.counters[0] = 7;
	struct hist *ph = slice_hist(&pre, 0);
	CHECK(ph != NULL);
	hist_record(ph, 42);
	struct slice snap;
	memset(&snap, 0, sizeof(snap));
	slice_merge(&snap, &pre);
	int rc = slice_decode_merge(&pre, data, size);
	CHECK(rc == 0 || rc == -1);
	if (rc == -1)
		CHECK(slice_same(&pre, &snap));
	slice_release(&pre);
	slice_release(&snap);
	if (rc == -1)
		return 0;

	CHECK(slice_decode_merge(&s, data, size) == 0);
	size_t n = slice_encode(&s, &enc);
	CHECK(n > 0);
	CHECK(slice_decode_merge(&t, enc, n) == 0);
	CHECK(slice_same(&s, &t));
	size_t n2 = slice_encode(&t, &enc2);
	CHECK(n2 == n && memcmp(enc, enc2, n) == 0);
	(void)slice_empty(&s);

	free(enc);
	free(enc2);
	slice_release(&s);
	slice_release(&t);
	return 0;
}
