/*
 * series_key.h — a series' identity as one byte string: the key the stats
 * shards hash, the store keeps in LMDB and the admin API splits again.
 *
 * Below both stats.c (which builds keys) and store.c (which stores and reads
 * them back), so neither needs the other for it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* One series' identity, serialized as "route\0upstream\0model\0" + '0'|'1'.
 * The store keeps it as an LMDB key, so it is at most LMDB's longest key
 * (511 bytes; store_open checks the library agrees). Route and upstream
 * names (CONFIG_NAME_MAX) and models (REQINFO_MODEL_MAX) are bounded so
 * that every key fits. */
#define SERIES_KEY_MAX 511
#define SERIES_MODEL_OTHER "other"
#define SERIES_MODEL_UNKNOWN "unknown"
/* What series_key_parse() gives for a name in a key that is not text
 * (strutil.h): U+FFFD. */
#define SERIES_NAME_NOT_TEXT "\xef\xbf\xbd"

/* Writes the key of these labels into `out` (SERIES_KEY_MAX bytes); returns
 * its length, or 0 when it would not fit. */
size_t series_key_build(char *out, const char *route, const char *upstream, const char *model, bool cold);

/* A tenant series: the requests of one tenant on one route, every upstream
 * and model, kept beside the (route, upstream, model) series:
 * "route\0\0tenant\0t". series_key_parse refuses it (the 't'), so every
 * reader of the model series passes over it; _parse_tenant reads it. */
size_t series_key_build_tenant(char *out, const char *route, const char *tenant);
int series_key_parse_tenant(const char *key, size_t len, const char **route, const char **tenant);
/* The key is a tenant series' (well formed or not). */
bool series_key_is_tenant(const char *key, size_t len);

/* Splits a serialized key; returns 0 or -1 when it is malformed. A name in
 * it that is not text comes out as SERIES_NAME_NOT_TEXT. */
int series_key_parse(const char *key, size_t len, const char **route, const char **upstream, const char **model,
		     bool *cold);
