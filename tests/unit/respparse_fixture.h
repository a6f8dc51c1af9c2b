/*
 * respparse_fixture.h — response-parser hooks for the unit tests that watch
 * something else than the head and the body: they take both and keep
 * nothing.
 */
#pragma once

#include <stddef.h>

#include "respparse.h"

static inline void ignore_head(void *arg, const struct respparse *rp)
{
	(void)arg;
	(void)rp;
}

static inline void ignore_body(void *arg, const char *at, size_t len)
{
	(void)arg;
	(void)at;
	(void)len;
}
