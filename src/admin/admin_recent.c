/*
 * admin_recent.c — renders GET /requests/recent from a snapshot of the ring.
 *
 * One object per request, made by the access log's writer (record_json, from
 * the one RECORD_FIELDS list) so that a line of either reads the same: same
 * keys, same units, in this answer's own order: identity, outcome, usage,
 * the whole timeline in ms since `arrive` (null where not reached), the
 * derived metrics of record_derive under their X-macro keys, and the ITL
 * summary the ring keeps (count of every gap; mean and max over the gaps
 * the record kept, the first ITL_SAMPLES_MAX).
 */
#include "admin_recent.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accesslog.h"

int admin_recent_parse_n(const char *s, size_t max, size_t *out, char *err, size_t errlen)
{
	unsigned long long v;
	char *end;

	if (!s || !*s || strspn(s, "0123456789") != strlen(s))
		goto bad;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < 1 || v > max)
		goto bad;
	*out = (size_t)v;
	return 0;
bad:
	snprintf(err, errlen, "bad value '%.32s' for n: expected a whole number from 1 to %zu", s ? s : "", max);
	return -1;
}

/* Adds `v` under `key`, null when its allocation failed. */
static void put(json_t *o, const char *key, json_t *v)
{
	json_object_set_new(o, key, v ? v : json_null());
}

char *admin_recent_render(const struct recent_entry *e, size_t n, size_t capacity)
{
	json_t *root = json_object(), *arr = json_array();
	char *text = NULL;

	if (!root || !arr)
		goto out;
	put(root, "capacity", json_integer((json_int_t)capacity));
	put(root, "n", json_integer((json_int_t)n));
	for (size_t i = 0; i < n; i++) {
		json_t *o = record_json(&e[i].rec, &e[i]);
		if (!o || json_array_append_new(arr, o) == -1)
			goto out;
	}
	json_object_set(root, "requests", arr);
	text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
out:
	json_decref(arr);
	json_decref(root);
	return text;
}
