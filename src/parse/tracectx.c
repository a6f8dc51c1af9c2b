/*
 * tracectx.c — W3C Trace Context values: traceparent parsed and written,
 * tracestate checked, ids drawn. See tracectx.h for the forms accepted.
 */
#include "tracectx.h"

#include <string.h>

/* A lower-case hex digit's value, or -1 (upper case is invalid here). */
static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* n bytes from 2n hex digits; -1 on a non-hex one. */
static int unhex(const char *s, uint8_t *out, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
		if (hi < 0 || lo < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return 0;
}

static bool all_zero(const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

int tracectx_parse(const char *s, size_t len, struct trace_ctx *out)
{
	struct trace_ctx t;
	uint8_t version;

	if (len < TRACEPARENT_LEN || unhex(s, &version, 1) == -1 || version == 0xff)
		return -1;
	if (version == 0 ? len != TRACEPARENT_LEN : len > TRACEPARENT_LEN && s[TRACEPARENT_LEN] != '-')
		return -1;
	if (s[2] != '-' || s[35] != '-' || s[52] != '-')
		return -1;
	if (unhex(s + 3, t.trace_id, 16) == -1 || unhex(s + 36, t.span_id, 8) == -1 || unhex(s + 53, &t.flags, 1) == -1)
		return -1;
	if (all_zero(t.trace_id, 16) || all_zero(t.span_id, 8))
		return -1;
	*out = t;
	return 0;
}

void tracectx_hex(const uint8_t *b, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[2 * n] = '\0';
}

void tracectx_format(const struct trace_ctx *t, char out[TRACEPARENT_LEN + 1])
{
	uint8_t flags = t->flags & TRACE_FLAG_SAMPLED;

	memcpy(out, "00-", 3);
	tracectx_hex(t->trace_id, 16, out + 3);
	out[35] = '-';
	tracectx_hex(t->span_id, 8, out + 36);
	out[52] = '-';
	tracectx_hex(&flags, 1, out + 53);
}

static bool lcalpha(char c)
{
	return c >= 'a' && c <= 'z';
}

static bool key_char(char c)
{
	return lcalpha(c) || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' || c == '/';
}

/* key = simple-key / tenant-id "@" system-id: a simple key starts with a
 * letter and has at most 256 characters; a tenant id starts with a letter
 * or digit (at most 241), a system id with a letter (at most 14). */
static bool key_valid(const char *k, size_t len)
{
	const char *at = memchr(k, '@', len);

	if (!at) {
		if (len < 1 || len > 256 || !lcalpha(k[0]))
			return false;
	} else {
		size_t tl = (size_t)(at - k), sl = len - tl - 1;
		if (tl < 1 || tl > 241 || sl < 1 || sl > 14 || !(lcalpha(k[0]) || (k[0] >= '0' && k[0] <= '9')) ||
		    !lcalpha(at[1]))
			return false;
	}
	for (size_t i = 0; i < len; i++)
		if (k + i != at && !key_char(k[i]))
			return false;
	return true;
}

/* value = 0*255(chr) nblk-chr: printable ASCII but ',' and '=', spaces
 * inside only. */
static bool value_valid(const char *v, size_t len)
{
	if (len < 1 || len > 256 || v[len - 1] == ' ')
		return false;
	for (size_t i = 0; i < len; i++)
		if (v[i] < 0x20 || v[i] > 0x7e || v[i] == ',' || v[i] == '=')
			return false;
	return true;
}

int tracestate_add(struct tracestate_scan *sc, const char *s, size_t len)
{
	size_t i = 0;

	sc->len += (sc->len ? 1 : 0) + len;
	if (sc->len > TRACESTATE_MAX_LEN)
		return -1;
	while (i <= len) {
		size_t end = i;
		while (end < len && s[end] != ',')
			end++;
		size_t a = i, b = end;
		while (a < b && (s[a] == ' ' || s[a] == '\t'))
			a++;
		while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
			b--;
		if (a < b) { /* an empty member (",,") is allowed and not counted */
			const char *eq = memchr(s + a, '=', b - a);
			if (!eq || sc->members == TRACESTATE_MAX_MEMBERS)
				return -1;
			size_t klen = (size_t)(eq - (s + a));
			if (!key_valid(s + a, klen) || !value_valid(eq + 1, b - a - klen - 1))
				return -1;
			for (unsigned k = 0; k < sc->members; k++)
				if (sc->keys[k].len == klen && memcmp(sc->keys[k].key, s + a, klen) == 0)
					return -1;
			sc->keys[sc->members].key = s + a;
			sc->keys[sc->members].len = klen;
			sc->members++;
		}
		i = end + 1;
	}
	return 0;
}

uint64_t trace_rng_next(struct trace_rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double trace_rng_unit(struct trace_rng *r)
{
	return (double)(trace_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

void trace_rng_id(struct trace_rng *r, uint8_t *out, size_t n)
{
	do {
		for (size_t i = 0; i < n; i += 8) {
			uint64_t v = trace_rng_next(r);
			size_t take = n - i < 8 ? n - i : 8;
			memcpy(out + i, &v, take);
		}
	} while (all_zero(out, n));
}

static const char *const sampler_names[SAMPLER__COUNT] = {
	"parentbased_always_on", "parentbased_traceidratio", "always_on", "always_off", "traceidratio",
};

int trace_sampler_parse(const char *name)
{
	for (int i = 0; i < SAMPLER__COUNT; i++)
		if (name && strcmp(name, sampler_names[i]) == 0)
			return i;
	return -1;
}

const char *trace_sampler_name(enum trace_sampler s)
{
	return s < SAMPLER__COUNT ? sampler_names[s] : "?";
}

static bool ratio_sampled(double ratio, const uint8_t id[16])
{
	uint64_t v = 0;
	for (int i = 8; i < 16; i++)
		v = v << 8 | id[i];
	if (!(ratio > 0))
		return false;
	if (ratio >= 1)
		return true;
	/* in integers: (double)v rounds, 2^63 - 1 would read as 2^63; ratio < 1 keeps the bound below 2^64 */
	return v < (uint64_t)(ratio * 18446744073709551616.0);
}

bool trace_sample(enum trace_sampler s, double ratio, const uint8_t trace_id[16], const struct trace_ctx *parent)
{
	switch (s) {
	case SAMPLER_ON: return true;
	case SAMPLER_OFF: return false;
	case SAMPLER_RATIO: return ratio_sampled(ratio, trace_id);
	case SAMPLER_PARENT_RATIO:
		return parent ? (parent->flags & TRACE_FLAG_SAMPLED) != 0 : ratio_sampled(ratio, trace_id);
	case SAMPLER_PARENT_ON:
	default: return parent ? (parent->flags & TRACE_FLAG_SAMPLED) != 0 : true;
	}
}
