/*
 * fuzz_check.h — what the fuzz targets share: CHECK() from src/base/check.h, an
 * assertion that stays on whatever the build type and aborts, so that
 * libFuzzer records the input; and a digest to compare runs by.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

/* FNV-1a over `len` bytes, chained from `h` (start with FUZZ_FNV_SEED): the
 * targets compare digests of what one run saw with another run's. */
#define FUZZ_FNV_SEED 0xcbf29ce484222325ull

static inline uint64_t fuzz_fnv(uint64_t h, const void *p, size_t len)
{
	const unsigned char *s = p;
	for (size_t i = 0; i < len; i++)
		h = (h ^ s[i]) * 0x100000001b3ull;
	return h;
}
