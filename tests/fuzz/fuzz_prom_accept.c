/*
 * fuzz_prom_accept.c — libFuzzer target: prom_accept_protobuf() on any Accept
 * header.
 *
 * The input, NUL-terminated in an allocation of exactly its size plus one
 * (so ASan reports a read past the header), is the header. Checked: the
 * answer is only yes when the header names the protobuf type and the
 * delimited encoding, and the same header read twice gives the same answer.
 */
#define _GNU_SOURCE /* strcasestr */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "prom_accept.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *h = malloc(size + 1);
	if (h == NULL)
		return 0;
	memcpy(h, data, size);
	h[size] = '\0';
	bool yes = prom_accept_protobuf(h);
	if (yes) {
		CHECK(strcasestr(h, "application/vnd.google.protobuf") != NULL);
		CHECK(strcasestr(h, "delimited") != NULL);
		CHECK(strcasestr(h, "io.prometheus.client.MetricFamily") != NULL);
	}
	CHECK(prom_accept_protobuf(h) == yes);
	free(h);
	return 0;
}
