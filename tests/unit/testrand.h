/*
 * testrand.h — a reproducible random source for the unit tests and the
 * benchmarks: xorshift64 (one state per file, seeded by assigning
 * `testrand_state`), uniform on (0, 1), the standard normal (Box-Muller)
 * and the lognormal. The same seed gives the same numbers on every run.
 */
#pragma once

#include <math.h>
#include <stdint.h>

static uint64_t testrand_state = 0x9e3779b97f4a7c15ull;

static inline double uniform(void)
{
	testrand_state ^= testrand_state << 13;
	testrand_state ^= testrand_state >> 7;
	testrand_state ^= testrand_state << 17;
	return ((double)(testrand_state >> 11) + 0.5) / 9007199254740992.0;
}

static inline double normal(void)
{
	return sqrt(-2.0 * log(uniform())) * cos(2.0 * M_PI * uniform());
}

static inline double lognormal(double median, double sigma)
{
	return median * exp(sigma * normal());
}
