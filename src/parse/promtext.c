/*
 * promtext.c — the Prometheus text format, one line at a time.
 *
 * A line is found with memchr within the input and parsed between its two
 * ends; every read checks the line's end first, so a line cut off by the
 * end of the input is one more line, never a read past it. Label values are
 * unescaped into a scratch buffer on the stack that a line cannot overflow:
 * an unescaped value is never longer than its escaped text, and each value
 * takes at least four bytes of the line (a="") for the one NUL it adds.
 */
#include "promtext.h"

#include <stdlib.h>
#include <string.h>

struct line {
	const char *p, *e;
};

static bool is_space(char c)
{
	return c == ' ' || c == '\t';
}

static void skip_spaces(struct line *l)
{
	while (l->p < l->e && is_space(*l->p))
		l->p++;
}

static bool name_start(char c, bool colon)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}

static bool name_char(char c, bool colon)
{
	return name_start(c, colon) || (c >= '0' && c <= '9');
}

/* A metric name (colons allowed) or a label name (not). */
static bool take_name(struct line *l, bool colon, const char **name, size_t *len)
{
	const char *start = l->p;

	if (l->p == l->e || !name_start(*l->p, colon))
		return false;
	while (l->p < l->e && name_char(*l->p, colon))
		l->p++;
	*name = start;
	*len = (size_t)(l->p - start);
	return true;
}

/* A quoted value, unescaped into scratch[*used...], NUL-terminated. */
static bool take_value(struct line *l, char *scratch, size_t cap, size_t *used, struct promtext_label *lab)
{
	char *out = scratch + *used, *o = out;

	if (l->p == l->e || *l->p != '"')
		return false;
	l->p++;
	for (;;) {
		if (l->p == l->e || (size_t)(o - scratch) + 1 >= cap)
			return false;
		char c = *l->p++;
		if (c == '"')
			break;
		if (c == '\0') /* the value is handed on as a C string */
			return false;
		if (c == '\\') {
			if (l->p == l->e)
				return false;
			c = *l->p++;
			if (c == 'n')
				c = '\n';
			else if (c != '\\' && c != '"')
				return false;
		}
		*o++ = c;
	}
	*o = '\0';
	lab->value = out;
	lab->value_len = (size_t)(o - out);
	*used += lab->value_len + 1;
	return true;
}

static bool take_labels(struct line *l, struct promtext_sample *s, char *scratch, size_t cap)
{
	size_t used = 0;

	l->p++; /* '{' */
	for (;;) {
		skip_spaces(l);
		if (l->p < l->e && *l->p == '}')
			break;
		if (s->nlabels == PROMTEXT_LABELS_MAX)
			return false;
		struct promtext_label *lab = &s->labels[s->nlabels];
		if (!take_name(l, false, &lab->name, &lab->name_len))
			return false;
		skip_spaces(l);
		if (l->p == l->e || *l->p != '=')
			return false;
		l->p++;
		skip_spaces(l);
		if (!take_value(l, scratch, cap, &used, lab))
			return false;
		s->nlabels++;
		skip_spaces(l);
		if (l->p < l->e && *l->p == ',') {
			l->p++;
			continue;
		}
		if (l->p < l->e && *l->p == '}')
			break;
		return false;
	}
	l->p++; /* '}' */
	return true;
}

/* The sample value: a float as Go's ParseFloat takes it, which strtod
 * covers (NaN, +Inf, -Inf, exponents). */
static bool take_number(struct line *l, double *v)
{
	char tmp[64], *end;
	const char *start = l->p;

	while (l->p < l->e && !is_space(*l->p))
		l->p++;
	size_t n = (size_t)(l->p - start);
	if (n == 0 || n >= sizeof(tmp))
		return false;
	memcpy(tmp, start, n);
	tmp[n] = '\0';
	*v = strtod(tmp, &end);
	return end == tmp + n;
}

/* An optional timestamp: an integer of milliseconds, ignored. */
static bool take_timestamp(struct line *l)
{
	if (l->p < l->e && *l->p == '-')
		l->p++;
	const char *digits = l->p;
	while (l->p < l->e && *l->p >= '0' && *l->p <= '9')
		l->p++;
	return l->p > digits;
}

/* 1: a sample in *s; 0: blank or a comment; -1: does not parse. */
static int parse_line(struct line *l, struct promtext_sample *s, char *scratch, size_t cap)
{
	skip_spaces(l);
	if (l->p == l->e || *l->p == '#')
		return 0;
	s->nlabels = 0;
	if (!take_name(l, true, &s->name, &s->name_len))
		return -1;
	skip_spaces(l);
	if (l->p < l->e && *l->p == '{') {
		if (!take_labels(l, s, scratch, cap))
			return -1;
		skip_spaces(l);
	}
	if (!take_number(l, &s->value))
		return -1;
	skip_spaces(l);
	if (l->p < l->e && !take_timestamp(l))
		return -1;
	skip_spaces(l);
	return l->p == l->e ? 1 : -1;
}

void promtext_parse(const char *buf, size_t len, promtext_sample_fn fn, void *arg, struct promtext_result *out)
{
	char scratch[PROMTEXT_LINE_MAX];
	struct promtext_sample s;
	const char *p = buf, *end = buf + len;

	memset(out, 0, sizeof(*out));
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl ? nl : end;
		struct line l = { p, le };

		p = nl ? nl + 1 : end;
		if (l.e > l.p && l.e[-1] == '\r')
			l.e--;
		if ((size_t)(l.e - l.p) >= PROMTEXT_LINE_MAX) {
			out->skipped++;
			continue;
		}
		switch (parse_line(&l, &s, scratch, sizeof(scratch))) {
		case 1:
			out->samples++;
			fn(arg, &s);
			break;
		case 0: break;
		default: out->skipped++; break;
		}
	}
}

bool promtext_name_is(const struct promtext_sample *s, const char *name)
{
	size_t n = strlen(name);
	return s->name_len == n && memcmp(s->name, name, n) == 0;
}

const struct promtext_label *promtext_label(const struct promtext_sample *s, const char *name)
{
	size_t n = strlen(name);
	for (unsigned i = 0; i < s->nlabels; i++)
		if (s->labels[i].name_len == n && memcmp(s->labels[i].name, name, n) == 0)
			return &s->labels[i];
	return NULL;
}
