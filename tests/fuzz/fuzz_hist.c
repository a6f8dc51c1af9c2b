/*
 * fuzz_hist.c — libFuzzer target: hist_decode_merge() on bytes read
 * back from the store, which a corrupted or hostile file may hold anything.
 *
 * Checked: decoding never reads past its input (the input is an exact-size
 * heap block) and reports how much it used, within the input; a failed
 * decode leaves the destination untouched (it already holds samples here);
 * a successful one yields a histogram that keeps the invariants of hist.h,
 * and that histogram encodes and decodes back to itself, with the same bytes
 * when encoded again (the encoding is canonical). Quantiles and cumulative
 * counts of a decoded histogram are computed too, for UBSan's sake.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "hist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct hist dst, before, h, again, prefilled;
	size_t used = 12345;

	/* Decode into a histogram that already holds samples: -1 must leave it
	 * as it was, 0 must add exactly what a decode into an empty one gives. */
	hist_init(&prefilled);
	hist_record(&prefilled, 3);
	hist_record(&prefilled, 150000);
	dst = prefilled;
	before = dst;
	int rc = hist_decode_merge(&dst, data, size, &used);
	CHECK(rc == 0 || rc == -1);
	if (rc == -1) {
		CHECK(memcmp(&dst, &before, sizeof(dst)) == 0);
		CHECK(used == 12345);
		return 0;
	}
	CHECK(used >= 1 && used <= size);

	hist_init(&h);
	size_t used2 = 0;
	CHECK(hist_decode_merge(&h, data, size, &used2) == 0);
	CHECK(used2 == used);
	CHECK(hist_consistent(&h));
	{
		struct hist sum = prefilled;
		hist_merge(&sum, &h);
		CHECK(memcmp(&sum, &dst, sizeof(sum)) == 0);
	}

	/* Encode, decode, compare; encode again, compare bytes. */
	size_t cap = hist_encoded_max(&h);
	uint8_t *enc = malloc(cap ? cap : 1), *enc2 = malloc(cap ? cap : 1);
	CHECK(enc && enc2);
	size_t n = hist_encode(&h, enc, cap);
	CHECK(n > 0 && n <= cap);
	hist_init(&again);
	size_t used3 = 0;
	CHECK(hist_decode_merge(&again, enc, n, &used3) == 0);
	CHECK(used3 == n);
	CHECK(memcmp(&again, &h, sizeof(h)) == 0);
	size_t n2 = hist_encode(&again, enc2, cap);
	CHECK(n2 == n && memcmp(enc, enc2, n) == 0);
	free(enc);
	free(enc2);

	/* Readers of a decoded histogram. */
	static const double qs[] = { 0, 0.5, 0.9, 0.99, 0.999, 1 };
	uint64_t prev = 0;
	for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
		uint64_t v = hist_quantile(&h, qs[i]);
		if (h.count) {
			CHECK(v >= h.min && v <= h.max);
			CHECK(v >= prev);
		}
		prev = v;
	}
	double c = hist_count_le(&h, h.count ? h.max : 0);
	CHECK(c == (double)h.count);
	(void)hist_mean(&h);
	return 0;
}
