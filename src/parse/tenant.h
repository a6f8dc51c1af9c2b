/*
 * tenant.h — a request's tenant from what the client sent: a header value
 * or a top-level JSON field kept when it is a clean name, an API key
 * (`Authorization: Bearer` or `x-api-key`) turned into a salted hash or a
 * configured tenant name. Pure functions: no I/O, no allocation.
 *
 * A tenant name is 1..TENANT_MAX bytes of [A-Za-z0-9._:@/+=~-]: safe in a
 * JSON string, a Prometheus label value, a YAML key and a shell word
 * without escaping. A value given but not such a name is refused: the
 * request's tenant is then TENANT_INVALID, never the bytes sent. An API key
 * never leaves here in clear: its label is "key-" and the first 16 hex
 * digits of HMAC-SHA256(salt, key); the configured map is keyed by the
 * key's plain SHA-256 (what `sha256sum` prints), so an operator can write
 * it without tokentap.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "strutil.h"

#define TENANT_MAX TENANT_NAME_MAX
#define TENANT_INVALID "invalid" /* a value was sent, but is no tenant name */
#define TENANT_OTHER "other"	 /* past the per-route cap (stats only) */
#define TENANT_ABSENT "none"	 /* no value sent (stats only) */
#define TENANT_KEY_PREFIX "key-"
#define TENANT_KEY_HEX 16 /* hex digits of the HMAC in a key's label */

/* tenant_name_ok (strutil.h): (s, len) is a tenant name as kept. */

/* The tenant of a header value or JSON field (s, len), spaces and tabs
 * around it dropped, into out (TENANT_MAX + 1 bytes): 1 a name, copied;
 * -1 not one (out is TENANT_INVALID); 0 empty (out is ""). */
int tenant_take(const char *s, size_t len, char *out);

/* The token of an `Authorization` value when its scheme is Bearer (any
 * case) and the token is not empty: true and (*tok, *toklen). */
bool tenant_bearer(const char *s, size_t len, const char **tok, size_t *toklen);

/* SHA-256 of the key, as 64 lowercase hex digits and a NUL. */
void tenant_key_sha256(const char *key, size_t len, char hex[65]);

/* "key-" + the first TENANT_KEY_HEX hex digits of HMAC-SHA256(salt, key),
 * into out (TENANT_MAX + 1 bytes). */
void tenant_key_label(const char *salt, size_t saltlen, const char *key, size_t len, char *out);
