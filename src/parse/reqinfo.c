/*
 * reqinfo.c — top-level "model", "stream" and a batch's input count out of
 * a request body prefix.
 *
 * One hand-written scanner serves complete bodies and truncated prefixes
 * alike, so both give the same answer for the bytes they share. It walks the
 * top-level object key by key and skips every other value whole without
 * building it, so a "model" nested in messages or tools is never mistaken
 * for the request's. Invariants:
 *
 *  - Nothing is allocated; nesting is tracked in a fixed bit stack of
 *    REQINFO_DEPTH_MAX levels, deeper input is rejected as not JSON.
 *  - Every read is bounded by `len`: running out of bytes in a prefix ends
 *    the scan with what was found so far (a value cut in the middle does not
 *    count). In a body said to be complete it means the body is not JSON.
 *  - It checks structure (strings, brackets, separators), not every scalar:
 *    it is not a validator.
 *  - The strings it hands out are text, whatever the body held: valid
 *    UTF-8 without control characters (string_char says how).
 */
#include "reqinfo.h"

#include <stdint.h>
#include <string.h>

#include "strutil.h"

#define REQINFO_DEPTH_MAX 512

enum scan_status {
	SCAN_OK = 0,
	SCAN_SHORT, /* ran out of bytes */
	SCAN_BAD,   /* not JSON */
};

struct scan {
	const char *p;
	const char *end;
	const char *field;	/* an extra top-level string field to read, or NULL */
	const char *inputs_key; /* the top-level field whose elements are counted, or NULL */
};

static void scan_space(struct scan *s)
{
	while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
		s->p++;
}

/* Moves past the string whose opening quote is at s->p. */
static enum scan_status scan_skip_string(struct scan *s)
{
	const char *p = s->p + 1;
	for (;;) {
		const char *q = find_either(p, s->end, '"', '\\'); /* a word at a time */
		if (q >= s->end)
			return SCAN_SHORT;
		if (*q == '"') {
			s->p = q + 1;
			return SCAN_OK;
		}
		if (q + 1 >= s->end)
			return SCAN_SHORT;
		p = q + 2;
	}
}

static int is_scalar_byte(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'E';
}

/* Moves past one value of any type, nested ones included, checking that
 * brackets pair up. */
static enum scan_status scan_skip_value(struct scan *s)
{
	uint64_t is_array[REQINFO_DEPTH_MAX / 64] = { 0 };
	int depth = 0;
	int expect_value = 1; /* a value (or a key / closing bracket) comes next */

	for (;;) {
		scan_space(s);
		if (s->p >= s->end)
			return SCAN_SHORT;
		char c = *s->p;
		if (!expect_value) {
			if (depth == 0)
				return SCAN_OK;
			if (c == ',') {
				s->p++;
				expect_value = 1;
				continue;
			}
			int arr = (int)((is_array[(depth - 1) / 64] >> ((depth - 1) % 64)) & 1);
			if ((c == ']' && arr) || (c == '}' && !arr)) {
				s->p++;
				depth--;
				continue;
			}
			return SCAN_BAD;
		}
		if (c == '{' || c == '[') {
			if (depth == REQINFO_DEPTH_MAX)
				return SCAN_BAD;
			uint64_t bit = (uint64_t)1 << (depth % 64);
			if (c == '[')
				is_array[depth / 64] |= bit;
			else
				is_array[depth / 64] &= ~bit;
			depth++;
			s->p++;
			scan_space(s);
			if (s->p >= s->end)
				return SCAN_SHORT;
			if (*s->p == (c == '[' ? ']' : '}')) {
				s->p++;
				depth--;
				expect_value = 0;
			} else if (c == '{' && *s->p != '"') {
				return SCAN_BAD;
			}
			continue;
		}
		if (c == '"') {
			enum scan_status st = scan_skip_string(s);
			if (st != SCAN_OK)
				return st;
			int in_object = depth > 0 && !((is_array[(depth - 1) / 64] >> ((depth - 1) % 64)) & 1);
			if (in_object) {
				/* A string in an object is a key when ':' follows. */
				scan_space(s);
				if (s->p >= s->end)
					return SCAN_SHORT;
				if (*s->p == ':') {
					s->p++;
					continue;
				}
			}
			expect_value = 0;
			continue;
		}
		if (!is_scalar_byte(c))
			return SCAN_BAD;
		while (s->p < s->end && is_scalar_byte(*s->p))
			s->p++;
		/* A number at the very end of a prefix may go on. */
		if (s->p >= s->end)
			return SCAN_SHORT;
		expect_value = 0;
	}
}

static int is_number_start(char c)
{
	return (c >= '0' && c <= '9') || c == '-';
}

/* Counts the inputs of the value at s->p (reqinfo_parse_inputs says how)
 * and moves past it; *n is -1 for a value that is neither a string nor an
 * array. Each element is skipped whole, so the count is of the array's own
 * elements, never of those nested in them. */
static enum scan_status scan_count_inputs(struct scan *s, int64_t *n)
{
	*n = -1;
	if (*s->p == '"') {
		enum scan_status st = scan_skip_string(s);
		if (st == SCAN_OK)
			*n = 1;
		return st;
	}
	if (*s->p != '[')
		return scan_skip_value(s);
	int64_t count = 0;
	int numbers = 1; /* every element so far a number: one input of token ids */
	s->p++;
	scan_space(s);
	if (s->p >= s->end)
		return SCAN_SHORT;
	if (*s->p == ']') {
		s->p++;
		*n = 0;
		return SCAN_OK;
	}
	for (;;) {
		scan_space(s);
		if (s->p >= s->end)
			return SCAN_SHORT;
		numbers &= is_number_start(*s->p);
		enum scan_status st = scan_skip_value(s);
		if (st != SCAN_OK)
			return st;
		count++;
		scan_space(s);
		if (s->p >= s->end)
			return SCAN_SHORT;
		if (*s->p == ']') {
			s->p++;
			*n = numbers ? 1 : count;
			return SCAN_OK;
		}
		if (*s->p != ',')
			return SCAN_BAD;
		s->p++;
	}
}

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int read_hex4(const char *p, const char *end, unsigned *out)
{
	if (end - p < 4)
		return -1;
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		int h = hex_value(p[i]);
		if (h < 0)
			return -1;
		v = v << 4 | (unsigned)h;
	}
	*out = v;
	return 0;
}

/* One character of a JSON string's text at *pp (before its closing quote):
 * its code point in *cp, *pp moved past it. The text is kept as text
 * (strutil.h): a byte that is not well-formed UTF-8, a control character
 * (raw or escaped, \u0000 included) and an unpaired surrogate escape, which
 * Python's json lets through, all become U+FFFD. SCAN_SHORT when the bytes
 * end inside the character, SCAN_BAD for an escape JSON does not have. */
static enum scan_status string_char(const char **pp, const char *end, uint32_t *cp)
{
	const char *p = *pp;
	if (*p != '\\') {
		size_t k;
		int32_t c = utf8_decode(p, end, &k);
		if (c == -2)
			return SCAN_SHORT;
		*cp = c < 0 || utf8_is_control((uint32_t)c) ? UTF8_REPLACEMENT : (uint32_t)c;
		*pp = p + k;
		return SCAN_OK;
	}
	if (end - p < 2)
		return SCAN_SHORT;
	char e = p[1];
	unsigned u;
	p += 2;
	switch (e) {
	case '"':
	case '\\':
	case '/': *cp = (unsigned char)e; break;
	case 'b':
	case 'f':
	case 'n':
	case 'r':
	case 't': *cp = UTF8_REPLACEMENT; break; /* control characters */
	case 'u':
		if (end - p < 4)
			return SCAN_SHORT;
		if (read_hex4(p, end, &u) == -1)
			return SCAN_BAD;
		p += 4;
		*cp = utf8_is_control(u) ? UTF8_REPLACEMENT : u;
		if (u >= 0xDC00 && u <= 0xDFFF) {
			*cp = UTF8_REPLACEMENT; /* a low surrogate alone */
		} else if (u >= 0xD800 && u < 0xDC00) {
			unsigned lo;
			*cp = UTF8_REPLACEMENT; /* unless a low surrogate follows */
			if (p < end && *p != '\\')
				break;
			if (end - p >= 2 && p[1] != 'u')
				break;
			if (end - p < 6)
				return SCAN_SHORT;
			if (read_hex4(p + 2, end, &lo) == -1)
				return SCAN_BAD;
			if (lo >= 0xDC00 && lo <= 0xDFFF) {
				p += 6;
				*cp = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
			}
		}
		break;
	default: return SCAN_BAD;
	}
	*pp = p;
	return SCAN_OK;
}

/* Decodes the string at s->p into dst (cap bytes, always NUL-terminated,
 * cut at a character boundary when too long) and moves past it. What dst
 * holds is text by strutil.h's rule, whatever the body held. */
static enum scan_status scan_read_string(struct scan *s, char *dst, size_t cap)
{
	size_t n = 0;
	int full = 0; /* once a character did not fit, the rest is dropped */
	const char *p = s->p + 1;
	dst[0] = '\0';
	while (p < s->end && *p != '"') {
		uint32_t cp;
		enum scan_status st = string_char(&p, s->end, &cp);
		if (st != SCAN_OK)
			return st;
		if (!full)
			full = !utf8_put(dst, cap, &n, cp);
	}
	if (p >= s->end)
		return SCAN_SHORT;
	dst[n] = '\0';
	s->p = p + 1;
	return SCAN_OK;
}

/* Whether the key [key_start, key_end) (a string's text, quotes excluded)
 * is `want` once its escapes are decoded: upstreams decode them before
 * they look a key up, so "mod\u0065l" is their "model" and must be ours. */
static int key_is(const char *key_start, const char *key_end, const char *want)
{
	size_t n = strlen(want);
	if (memchr(key_start, '\\', (size_t)(key_end - key_start)) == NULL)
		return (size_t)(key_end - key_start) == n && memcmp(key_start, want, n) == 0;
	char buf[REQINFO_MODEL_MAX + 1];
	size_t got = 0;
	if (n >= sizeof(buf) - 1)
		return 0;
	for (const char *p = key_start; p < key_end;) {
		uint32_t cp;
		if (string_char(&p, key_end, &cp) != SCAN_OK || !utf8_put(buf, n + 2, &got, cp))
			return 0; /* cannot be valid here (scan_skip_string passed it), or longer than want */
	}
	return got == n && memcmp(buf, want, n) == 0;
}

/* Walks the top-level object. Keys are compared once decoded (key_is), and
 * of a key given twice the last one counts, as in the upstreams' parsers
 * (Python's json, nlohmann::json, Go's encoding/json): tokentap reads the
 * value the upstream serves. */
static enum scan_status scan_top(struct scan *s, struct reqinfo *out)
{
	scan_space(s);
	if (s->p >= s->end)
		return SCAN_SHORT;
	if (*s->p != '{')
		return SCAN_BAD;
	s->p++;
	scan_space(s);
	if (s->p >= s->end)
		return SCAN_SHORT;
	if (*s->p == '}') {
		s->p++;
		return SCAN_OK;
	}
	for (;;) {
		scan_space(s);
		if (s->p >= s->end)
			return SCAN_SHORT;
		if (*s->p != '"')
			return SCAN_BAD;
		const char *key = s->p + 1;
		enum scan_status st = scan_skip_string(s);
		if (st != SCAN_OK)
			return st;
		const char *key_end = s->p - 1;
		scan_space(s);
		if (s->p >= s->end)
			return SCAN_SHORT;
		if (*s->p != ':')
			return SCAN_BAD;
		s->p++;
		scan_space(s);
		if (s->p >= s->end)
			return SCAN_SHORT;

		if (s->inputs_key && key_is(key, key_end, s->inputs_key)) {
			int64_t n;
			out->inputs = -1; /* a later duplicate wins, even one that is cut */
			st = scan_count_inputs(s, &n);
			if (st != SCAN_OK)
				return st;
			out->inputs = n;
		} else if (s->field && key_is(key, key_end, s->field) && *s->p == '"') {
			char v[REQINFO_MODEL_MAX];
			st = scan_read_string(s, v, sizeof(v));
			if (st != SCAN_OK)
				return st;
			memcpy(out->field_value, v, sizeof(v));
		} else if (key_is(key, key_end, "model") && *s->p == '"') {
			char model[REQINFO_MODEL_MAX];
			st = scan_read_string(s, model, sizeof(model));
			if (st != SCAN_OK)
				return st;
			memcpy(out->model, model, sizeof(model));
		} else if (key_is(key, key_end, "stream") && (*s->p == 't' || *s->p == 'f')) {
			int v = *s->p == 't';
			const char *lit = v ? "true" : "false";
			size_t n = strlen(lit);
			size_t have = (size_t)(s->end - s->p);
			if (memcmp(s->p, lit, have < n ? have : n) != 0)
				return SCAN_BAD;
			if (have < n)
				return SCAN_SHORT; /* "tru" at the very end of a prefix */
			s->p += n;
			if (s->p < s->end && is_scalar_byte(*s->p))
				return SCAN_BAD;
			out->stream = v;
		} else {
			/* A later duplicate wins, even when it is null: as if absent. */
			if (key_is(key, key_end, "stream"))
				out->stream = -1;
			else if (key_is(key, key_end, "model"))
				out->model[0] = '\0';
			if (s->field && key_is(key, key_end, s->field))
				out->field_value[0] = '\0';
			st = scan_skip_value(s);
			if (st != SCAN_OK)
				return st;
		}

		scan_space(s);
		if (s->p >= s->end)
			return SCAN_SHORT;
		if (*s->p == '}') {
			s->p++;
			return SCAN_OK;
		}
		if (*s->p != ',')
			return SCAN_BAD;
		s->p++;
	}
}

static int parse(const char *body, size_t len, bool complete, const char *field, const char *inputs_key,
		 struct reqinfo *out)
{
	out->model[0] = '\0';
	out->stream = -1;
	out->field_value[0] = '\0';
	out->inputs = -1;
	if (body == NULL)
		return -1;
	struct scan s = { body, body + len, field, inputs_key };
	scan_space(&s);
	if (s.p == s.end)
		return -1; /* nothing but blanks: no sign of JSON yet */
	enum scan_status st = scan_top(&s, out);
	if (st == SCAN_OK && complete) {
		scan_space(&s);
		if (s.p != s.end)
			st = SCAN_BAD; /* trailing bytes after the object */
	}
	if (st == SCAN_BAD || (st == SCAN_SHORT && complete)) {
		out->model[0] = '\0';
		out->stream = -1;
		out->field_value[0] = '\0';
		out->inputs = -1;
		return -1;
	}
	return 0;
}

int reqinfo_parse(const char *body, size_t len, bool complete, struct reqinfo *out)
{
	return parse(body, len, complete, NULL, NULL, out);
}

int reqinfo_parse_field(const char *body, size_t len, bool complete, const char *field, struct reqinfo *out)
{
	return parse(body, len, complete, field, NULL, out);
}

int reqinfo_parse_inputs(const char *body, size_t len, bool complete, const char *key, struct reqinfo *out)
{
	return parse(body, len, complete, NULL, key, out);
}

int reqinfo_parse_inputs_field(const char *body, size_t len, bool complete, const char *key, const char *field,
			       struct reqinfo *out)
{
	return parse(body, len, complete, field, key, out);
}

void reqinfo_path_model(const char *seg, size_t len, char *out, size_t cap)
{
	char raw[REQINFO_MODEL_MAX * 4];
	size_t n = 0, got = 0;

	/* Percent-decoded first, as far as the output could hold; then read
	 * as UTF-8, anything else becoming U+FFFD. */
	for (size_t i = 0; i < len && n < sizeof(raw); i++) {
		int hi, lo;
		if (seg[i] == '%' && i + 2 < len && (hi = hex_value(seg[i + 1])) >= 0 &&
		    (lo = hex_value(seg[i + 2])) >= 0) {
			raw[n++] = (char)(hi << 4 | lo);
			i += 2;
		} else {
			raw[n++] = seg[i];
		}
	}
	if (cap == 0)
		return;
	out[0] = '\0';
	for (const char *p = raw, *end = raw + n; p < end;) {
		size_t k;
		int32_t c = utf8_decode(p, end, &k);
		uint32_t cp = c < 0 || utf8_is_control((uint32_t)c) ? UTF8_REPLACEMENT : (uint32_t)c;
		if (!utf8_put(out, cap, &got, cp))
			break;
		p += k;
	}
	out[got] = '\0';
}
