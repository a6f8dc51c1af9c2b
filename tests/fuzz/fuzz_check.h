/*
 * fuzz_check.h — CHECK(), an assertion for the fuzz targets that stays on
 * whatever the build type (RelWithDebInfo defines NDEBUG, which would turn
 * assert() off) and aborts, so that libFuzzer records the input.
 */
#pragma once

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond) \
	do { \
		if (!(cond)) { \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			abort(); \
		} \
	} while (0)
