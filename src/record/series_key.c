/*
 * series_key.c — building and splitting serialized series keys.
 */
#include "series_key.h"

#include <string.h>

#include "config.h"
#include "reqinfo.h"
#include "strutil.h"

/* Every route, upstream and model the configuration and the request parser
 * allow make a key that fits. */
_Static_assert(2 * (CONFIG_NAME_MAX + 1) + REQINFO_MODEL_MAX + 1 <= SERIES_KEY_MAX, "series keys fit");

size_t series_key_build(char *out, const char *route, const char *upstream, const char *model, bool cold)
{
	size_t lr = strlen(route), lu = strlen(upstream), lm = strlen(model);

	if (lr + lu + lm + 4 > SERIES_KEY_MAX)
		return 0;
	memcpy(out, route, lr + 1);
	memcpy(out + lr + 1, upstream, lu + 1);
	memcpy(out + lr + lu + 2, model, lm + 1);
	out[lr + lu + lm + 3] = cold ? '1' : '0';
	return lr + lu + lm + 4;
}

int series_key_parse(const char *key, size_t len, const char **route, const char **upstream, const char **model,
		     bool *cold)
{
	const char *p = key, *end = key + len;
	const char *parts[3];

	for (int i = 0; i < 3; i++) {
		const char *z = memchr(p, '\0', (size_t)(end - p));
		if (!z)
			return -1;
		parts[i] = p;
		p = z + 1;
	}
	if (end - p != 1 || (*p != '0' && *p != '1'))
		return -1;
	*route = parts[0];
	*upstream = parts[1];
	*model = parts[2];
	/* Names are text when they are built (reqinfo.c, config.c); a store
	 * written before model names were kept as text may hold one that is
	 * not, which would make /metrics unparseable for every scraper. */
	for (int i = 0; i < 3; i++) {
		const char **name = i == 0 ? route : i == 1 ? upstream : model;
		if (!utf8_is_clean(*name, strlen(*name)))
			*name = SERIES_NAME_NOT_TEXT;
	}
	*cold = *p == '1';
	return 0;
}

size_t series_key_build_tenant(char *out, const char *route, const char *tenant)
{
	size_t n = series_key_build(out, route, "", tenant, false);
	if (n)
		out[n - 1] = 't';
	return n;
}

bool series_key_is_tenant(const char *key, size_t len)
{
	return len > 0 && key[len - 1] == 't';
}

int series_key_parse_tenant(const char *key, size_t len, const char **route, const char **tenant)
{
	const char *p = key, *end = key + len, *parts[3];

	for (int i = 0; i < 3; i++) {
		const char *z = memchr(p, '\0', (size_t)(end - p));
		if (!z)
			return -1;
		parts[i] = p;
		p = z + 1;
	}
	if (end - p != 1 || *p != 't' || parts[1][0] != '\0')
		return -1;
	*route = utf8_is_clean(parts[0], strlen(parts[0])) ? parts[0] : SERIES_NAME_NOT_TEXT;
	*tenant = tenant_name_ok(parts[2], strlen(parts[2])) ? parts[2] : SERIES_NAME_NOT_TEXT;
	return 0;
}
