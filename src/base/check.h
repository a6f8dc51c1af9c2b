/*
 * check.h — invariants checked at run time.
 *
 * CHECK(cond) is compiled into every build, release included: it is for
 * the cheap structural invariants whose failure means the process state can
 * no longer be trusted (a state transition the table does not allow, a
 * count that went negative). It logs the file, line and condition through
 * the logger and aborts; it never returns on failure and never evaluates
 * `cond` more than once. Never per byte: it sits on transitions and
 * callback entries.
 *
 * assert() from <assert.h> is for the costlier invariants (a walk over a
 * histogram's buckets): the sanitizer and fuzz builds compile with
 * -UNDEBUG, so they run there and in Debug builds, not in RelWithDebInfo.
 *
 * Magic numbers, in builds without NDEBUG: an object whose struct starts
 * with OBJ_MAGIC_FIELD gets OBJ_MAGIC_SET(p, X_MAGIC) when made and
 * OBJ_MAGIC_CLEAR(p) when freed; CHECK_OBJ(p, X_MAGIC) at a callback's
 * entry then aborts, naming the expected magic, on a pointer to a freed or
 * foreign object instead of reading through it. With NDEBUG the three
 * compile to nothing and the field is absent. CHECK_OBJ reads `p` twice.
 */
#pragma once

#include <stdint.h>
#include <stdlib.h>

#include "log.h"

#define CHECK(cond) \
	do { \
		if (__builtin_expect(!(cond), 0)) { \
			log_error("%s:%d: check failed: %s", __FILE__, __LINE__, #cond); \
			abort(); \
		} \
	} while (0)

#ifndef NDEBUG
#define OBJ_MAGIC_FIELD uint32_t magic;
#define OBJ_MAGIC_SET(p, m) ((p)->magic = (m))
#define OBJ_MAGIC_CLEAR(p) ((p)->magic = 0)
#define CHECK_OBJ(p, m) \
	do { \
		if (__builtin_expect(!(p) || (p)->magic != (m), 0)) { \
			log_error("%s:%d: %s is not a live %s", __FILE__, __LINE__, #p, #m); \
			abort(); \
		} \
	} while (0)
#else
#define OBJ_MAGIC_FIELD
#define OBJ_MAGIC_SET(p, m) ((void)(p))
#define OBJ_MAGIC_CLEAR(p) ((void)(p))
#define CHECK_OBJ(p, m) ((void)(p))
#endif
