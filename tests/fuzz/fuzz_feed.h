/*
 * fuzz_feed.h — a stream fed to a framer the way the targets that compare
 * framings feed it: whole when `split` is NULL, else in reads whose sizes
 * the input chose, split[k % nsplit] bytes each (0 reads one byte), then
 * finished.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "framer.h"

static inline void fuzz_feed(struct framer *f, const uint8_t *body, size_t len, const uint8_t *split, unsigned nsplit)
{
	if (!split) {
		framer_feed(f, (const char *)body, len);
	} else {
		size_t off = 0;
		for (unsigned k = 0; off < len; k++) {
			size_t piece = split[k % nsplit] ? split[k % nsplit] : 1;
			if (piece > len - off)
				piece = len - off;
			framer_feed(f, (const char *)body + off, piece);
			off += piece;
		}
	}
	framer_finish(f);
}
