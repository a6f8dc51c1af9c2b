/*
 * settings.c — the settings table made into data, its type parsers, and
 * what is generated from it: the defaults, flag application and --help.
 *
 * Each row's field is checked at compile time against its type's C type, so
 * a row cannot write a uint64_t into an unsigned.
 */
#include "settings.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"

/* size_t fields (max_event_size...) are written as uint64_t. */
_Static_assert(sizeof(size_t) == sizeof(uint64_t), "settings: SIZE rows need a 64-bit size_t");

/* The C type each setting type writes, for the compile-time check. */
enum { CT_U64, CT_UNSIGNED, CT_INT, CT_BOOL, CT_STR, CT_DOUBLE, CT_OTHER };
#define CT_OF_SIZE CT_U64
#define CT_OF_DURATION CT_U64
#define CT_OF_DURATION_S CT_U64
#define CT_OF_DURATION_OFF CT_U64
#define CT_OF_UINT CT_UNSIGNED
#define CT_OF_BOOL CT_BOOL
#define CT_OF_STRING CT_STR
#define CT_OF_STRING_OFF CT_STR
#define CT_OF_FILE CT_STR
#define CT_OF_LISTEN CT_STR
#define CT_OF_ADMIN_LISTEN CT_STR
#define CT_OF_URL CT_STR
#define CT_OF_LOGLEVEL CT_INT
#define CT_OF_WORKERS CT_UNSIGNED
#define CT_OF_FLAG CT_BOOL
#define CT_OF_RATIO CT_DOUBLE
#define CT_OF_FIELD(field) \
	_Generic(((struct config *)0)->field, \
		uint64_t: CT_U64, \
		unsigned: CT_UNSIGNED, \
		int: CT_INT, \
		bool: CT_BOOL, \
		const char *: CT_STR, \
		double: CT_DOUBLE, \
		default: CT_OTHER)

#define SETTING_CHECK(ID, yaml, flag, sh, TYPE, field, def, min, max, reload, metavar, help) \
	_Static_assert(CT_OF_FIELD(field) == CT_OF_##TYPE, "settings: " #ID "'s field is not of type " #TYPE);
SETTINGS(SETTING_CHECK)
#undef SETTING_CHECK

const struct setting settings[S__COUNT] = {
#define SETTING_ROW(ID, yaml, flag, sh, TYPE, field, def, min, max, reload, metavar, help) \
	[S_##ID] = { S_##ID, #ID, yaml, flag,	     sh,      ST_##TYPE, offsetof(struct config, field), \
		     def,    min, max,	SR_##reload, metavar, help },
	SETTINGS(SETTING_ROW)
#undef SETTING_ROW
};

const struct setting *settings_by_flag(const char *flag)
{
	for (size_t i = 0; i < S__COUNT; i++)
		if (settings[i].flag && strcmp(settings[i].flag, flag) == 0)
			return &settings[i];
	return NULL;
}

const struct setting *settings_by_yaml(const char *path)
{
	for (size_t i = 0; i < S__COUNT; i++)
		if (settings[i].yaml && strcmp(settings[i].yaml, path) == 0)
			return &settings[i];
	return NULL;
}

void settings_size_text(uint64_t v, char *out, size_t len)
{
	static const char units[] = { 'g', 'm', 'k' };
	for (int i = 0; i < 3; i++) {
		uint64_t unit = (uint64_t)1 << (10 * (3 - i));
		if (v && v % unit == 0) {
			snprintf(out, len, "%llu%c", (unsigned long long)(v / unit), units[i]);
			return;
		}
	}
	snprintf(out, len, "%llu", (unsigned long long)v);
}

static void duration_text(uint64_t ms, char *out, size_t len);

void setting_expected(const struct setting *s, char *out, size_t len)
{
	char lo[32], hi[32];

	switch (s->type) {
	case ST_SIZE:
		settings_size_text(s->min, lo, sizeof(lo));
		settings_size_text(s->max, hi, sizeof(hi));
		if (s->max) {
			snprintf(out, len, "a size from %s to %s, such as %s", lo, hi, s->def ? s->def : "32m");
		} else if (s->min) {
			snprintf(out, len, "a size of at least %s, such as %s", lo, s->def ? s->def : "32m");
		} else {
			snprintf(out, len, "a size such as %s", s->def ? s->def : "32m");
		}
		break;
	case ST_DURATION:
	case ST_DURATION_S:
		if (s->min > 1) {
			duration_text(s->min, lo, sizeof(lo));
			snprintf(out, len, "a duration of at least %s, such as %s; at most " DURATION_MAX_TEXT, lo,
				 s->def ? s->def : "5s");
		} else {
			snprintf(out, len, "a %sduration such as 300ms or 5s; at most " DURATION_MAX_TEXT,
				 s->min ? "positive " : "");
		}
		break;
	case ST_DURATION_OFF:
		snprintf(out, len, "a positive duration such as 300ms or 5s, or off; at most " DURATION_MAX_TEXT);
		break;
	case ST_UINT:
		if (s->min)
			snprintf(out, len, "a whole number of at least %llu", (unsigned long long)s->min);
		else
			snprintf(out, len, "a whole number");
		break;
	case ST_BOOL: snprintf(out, len, "true or false"); break;
	case ST_RATIO: snprintf(out, len, "a number from 0 to 1, such as 0.1"); break;
	case ST_LISTEN: snprintf(out, len, "a numeric ADDR:PORT such as 127.0.0.1:8080 or [::1]:8080"); break;
	case ST_URL: snprintf(out, len, "a URL such as http://127.0.0.1:8000"); break;
	case ST_ADMIN_LISTEN:
		snprintf(out, len,
			 "ADDR:PORT with an IP address or localhost, such as 127.0.0.1:9901 or [::1]:9901, or off");
		break;
	case ST_LOGLEVEL: snprintf(out, len, "error, warn, info or debug"); break;
	case ST_WORKERS: snprintf(out, len, "auto or a number of threads from 1 to %d", WORKERS_MAX); break;
	case ST_STRING:
	case ST_STRING_OFF:
	case ST_FILE:
	case ST_FLAG: snprintf(out, len, "a value"); break;
	}
}

static bool in_range(const struct setting *s, uint64_t v)
{
	return v >= s->min && (!s->max || v <= s->max);
}

/* A whole number up to 1e9, as the file has always read counts. */
static int parse_uint(const char *s, unsigned *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || !*s || *end || *s == '-' || v > 1000000000ul)
		return -1;
	*out = (unsigned)v;
	return 0;
}

int setting_parse(const struct setting *s, const char *text, struct config *c, char *why, size_t whylen)
{
	void *field = (char *)c + s->offset;
	uint64_t u64;
	unsigned u;
	enum log_level level;
	struct sockaddr_storage ss;
	unsigned sslen;

	switch (s->type) {
	case ST_SIZE:
		if (config_parse_size(text, &u64) == -1 || !in_range(s, u64))
			goto bad;
		*(uint64_t *)field = u64;
		return 0;
	case ST_DURATION:
		if (config_parse_duration_ms(text, &u64) == -1 || !in_range(s, u64))
			goto bad;
		*(uint64_t *)field = u64;
		return 0;
	case ST_DURATION_OFF:
		if (strcmp(text, "off") == 0) {
			*(uint64_t *)field = 0;
			return 0;
		}
		if (config_parse_duration_ms(text, &u64) == -1 || !in_range(s, u64))
			goto bad;
		*(uint64_t *)field = u64;
		return 0;
	case ST_DURATION_S: /* the range is on the milliseconds, before they are divided */
		if (config_parse_duration_ms(text, &u64) == -1 || !in_range(s, u64))
			goto bad;
		*(uint64_t *)field = u64 / 1000;
		return 0;
	case ST_UINT:
		if (parse_uint(text, &u) == -1 || !in_range(s, u))
			goto bad;
		*(unsigned *)field = u;
		return 0;
	case ST_BOOL:
		if (strcmp(text, "true") == 0 || strcmp(text, "yes") == 0 || strcmp(text, "on") == 0)
			*(bool *)field = true;
		else if (strcmp(text, "false") == 0 || strcmp(text, "no") == 0 || strcmp(text, "off") == 0)
			*(bool *)field = false;
		else
			goto bad;
		return 0;
	case ST_FLAG: *(bool *)field = true; return 0;
	case ST_RATIO: {
		char *end;
		errno = 0;
		double d = strtod(text, &end);
		if (errno || !*text || *end || !(d >= 0 && d <= 1)) /* NaN fails too */
			goto bad;
		*(double *)field = d;
		return 0;
	}
	case ST_STRING:
	case ST_FILE: *(const char **)field = text; return 0;
	case ST_STRING_OFF: *(const char **)field = strcmp(text, "off") == 0 ? NULL : text; return 0;
	case ST_LISTEN:
		if (config_parse_listen(text, &ss, &sslen) == -1)
			goto bad;
		*(const char **)field = text;
		return 0;
	case ST_ADMIN_LISTEN: {
		char host[64];
		int port, family;
		if (strcmp(text, "off") == 0) {
			*(const char **)field = NULL;
			return 0;
		}
		if (config_parse_admin_listen(text, host, sizeof(host), &port, &family) == -1)
			goto bad;
		*(const char **)field = text;
		return 0;
	}
	case ST_URL: {
		struct url_parts parts;
		if (config_parse_url(text, &parts, why, whylen) == -1)
			return -1;
		*(const char **)field = text;
		return 0;
	}
	case ST_LOGLEVEL:
		if (log_level_parse(text, &level) == -1)
			goto bad;
		*(int *)field = (int)level;
		return 0;
	case ST_WORKERS:
		if (config_parse_workers(text, &u) == -1)
			goto bad;
		*(unsigned *)field = u;
		return 0;
	}
bad : {
	char expect[200];
	setting_expected(s, expect, sizeof(expect));
	snprintf(why, whylen, "expected %s", expect);
}
	return -1;
}

int settings_apply_flag(const struct setting *s, const char *value, struct config *c, char *why, size_t whylen)
{
	if (setting_parse(s, value, c, why, whylen) == -1)
		return -1;
	if (s->id == S_LISTEN)
		c->nlisteners = 0; /* the flag replaces the file's list */
	else if (s->id == S_ADMIN_LISTEN)
		c->admin_listen_explicit = true; /* a busy port is then an error, not a warning */
	else if (s->id == S_MAX_CONNECTIONS)
		c->max_connections_explicit = true; /* kept even above the descriptor limit */
	return 0;
}

void settings_usage(FILE *out)
{
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		char left[64];

		if (!s->flag)
			continue;
		if (s->short_flag)
			snprintf(left, sizeof(left), "  -%c, --%s%s%s", s->short_flag, s->flag, s->metavar ? " " : "",
				 s->metavar ? s->metavar : "");
		else
			snprintf(left, sizeof(left), "      --%s%s%s", s->flag, s->metavar ? " " : "",
				 s->metavar ? s->metavar : "");
		fprintf(out, "%-28s  %s", left, s->help);
		if (s->def)
			fprintf(out, " (default %s)", s->def);
		fputc('\n', out);
	}
}

/* Whether row `s` holds the same value in both configs. */
static bool same_value(const struct setting *s, const struct config *a, const struct config *b)
{
	const void *fa = (const char *)a + s->offset, *fb = (const char *)b + s->offset;

	switch (s->type) {
	case ST_SIZE:
	case ST_DURATION:
	case ST_DURATION_S:
	case ST_DURATION_OFF: return *(const uint64_t *)fa == *(const uint64_t *)fb;
	case ST_UINT:
	case ST_WORKERS: return *(const unsigned *)fa == *(const unsigned *)fb;
	case ST_LOGLEVEL: return *(const int *)fa == *(const int *)fb;
	case ST_BOOL:
	case ST_FLAG: return *(const bool *)fa == *(const bool *)fb;
	case ST_RATIO: return *(const double *)fa == *(const double *)fb;
	case ST_STRING:
	case ST_STRING_OFF:
	case ST_FILE:
	case ST_LISTEN:
	case ST_ADMIN_LISTEN:
	case ST_URL: {
		const char *sa = *(const char *const *)fa, *sb = *(const char *const *)fb;
		return sa == sb || (sa && sb && strcmp(sa, sb) == 0);
	}
	}
	return true;
}

unsigned settings_warn_fixed(const struct config *boot, const struct config *next)
{
	struct listener_conf a[LISTENERS_MAX], b[LISTENERS_MAX];
	unsigned na = config_listeners(boot, a), nb = config_listeners(next, b), warned = 0;
	bool same = na == nb;

	/* RESTART_LISTENER rows: the set of listeners as a whole */
	for (unsigned i = 0; same && i < na; i++)
		same = (a[i].address == b[i].address ||
			(a[i].address && b[i].address && strcmp(a[i].address, b[i].address) == 0)) &&
		       !a[i].tls_cert == !b[i].tls_cert;
	if (!same) {
		log_warn(
			"reload: listener changes need a restart; certificates of existing TLS listeners are reloaded");
		warned++;
	}
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		if (s->reload == SR_RESTART && !same_value(s, boot, next)) {
			log_warn("reload: %s is read at start-up only; the change needs a restart",
				 s->yaml ? s->yaml : s->flag);
			warned++;
		}
	}
	return warned;
}

/* Writes `text` for a Markdown table cell: a '|' would end the cell. */
static void doc_cell_text(FILE *out, const char *text)
{
	for (const char *p = text; *p; p++) {
		if (*p == '|')
			fputc('\\', out);
		fputc(*p, out);
	}
}

/* A duration in ms as the docs write it: 1s, 24h, 300ms. */
static void duration_text(uint64_t ms, char *out, size_t len)
{
	if (ms && ms % 3600000 == 0)
		snprintf(out, len, "%lluh", (unsigned long long)(ms / 3600000));
	else if (ms && ms % 60000 == 0)
		snprintf(out, len, "%llum", (unsigned long long)(ms / 60000));
	else if (ms && ms % 1000 == 0)
		snprintf(out, len, "%llus", (unsigned long long)(ms / 1000));
	else
		snprintf(out, len, "%llums", (unsigned long long)ms);
}

static const char *doc_type(enum setting_type t)
{
	switch (t) {
	case ST_SIZE: return "size";
	case ST_DURATION: return "duration";
	case ST_DURATION_S: return "duration (kept in seconds)";
	case ST_DURATION_OFF: return "duration or `off`";
	case ST_UINT: return "count";
	case ST_BOOL: return "bool";
	case ST_STRING: return "string";
	case ST_STRING_OFF: return "string or `off`";
	case ST_FILE: return "file";
	case ST_LISTEN: return "address";
	case ST_ADMIN_LISTEN: return "address or `off`";
	case ST_URL: return "URL";
	case ST_LOGLEVEL: return "level";
	case ST_WORKERS: return "count or `auto`";
	case ST_FLAG: return "flag";
	case ST_RATIO: return "ratio";
	}
	return "?";
}

/* The range cell: what min and max (or the type itself) allow. */
static void doc_range(FILE *out, const struct setting *s)
{
	char lo[32], hi[32];

	switch (s->type) {
	case ST_SIZE:
		settings_size_text(s->min, lo, sizeof(lo));
		settings_size_text(s->max, hi, sizeof(hi));
		break;
	case ST_DURATION:
	case ST_DURATION_S:
	case ST_DURATION_OFF:
		duration_text(s->min, lo, sizeof(lo));
		duration_text(s->max, hi, sizeof(hi));
		if (s->min == 1 && !s->max) { /* the usual "> 0" */
			fputs("over 0", out);
			return;
		}
		break;
	case ST_UINT:
		snprintf(lo, sizeof(lo), "%llu", (unsigned long long)s->min);
		snprintf(hi, sizeof(hi), "%llu", (unsigned long long)s->max);
		break;
	case ST_WORKERS: fprintf(out, "`auto` or 1 to %d", WORKERS_MAX); return;
	case ST_LOGLEVEL: fputs("`error`, `warn`, `info`, `debug`", out); return;
	case ST_LISTEN: fputs("numeric `ADDR:PORT`", out); return;
	case ST_ADMIN_LISTEN: fputs("`ADDR:PORT` or `localhost:PORT`", out); return;
	case ST_URL: fputs("`http://` or `https://` `HOST[:PORT]`", out); return;
	case ST_FILE: fputs("a readable file", out); return;
	case ST_RATIO: fputs("`0` to `1`", out); return;
	case ST_BOOL:
	case ST_FLAG:
	case ST_STRING:
	case ST_STRING_OFF: fputs("—", out); return;
	}
	if (s->min && s->max)
		fprintf(out, "`%s` to `%s`", lo, hi);
	else if (s->min)
		fprintf(out, "at least `%s`", lo);
	else if (s->max)
		fprintf(out, "up to `%s`", hi);
	else
		fputs("any", out);
}

static const char *doc_reload(enum setting_reload r)
{
	switch (r) {
	case SR_LIVE: return "live";
	case SR_RESTART: return "restart";
	case SR_RESTART_LISTENER: return "restart (listener set)";
	case SR_NONE: return "— (command line)";
	}
	return "?";
}

void settings_doc_table(FILE *out)
{
	fputs(SETTINGS_DOC_BEGIN, out);
	fputs("| key | flag | type | default | range | reload | meaning |\n", out);
	fputs("|---|---|---|---|---|---|---|\n", out);
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];

		if (!s->yaml && !s->flag)
			continue; /* a fixed value, not a setting */
		if (s->yaml)
			fprintf(out, "| `%s` | ", s->yaml);
		else
			fputs("| — | ", out);
		if (s->flag) {
			if (s->short_flag)
				fprintf(out, "`-%c`, ", s->short_flag);
			fprintf(out, "`--%s", s->flag);
			if (s->metavar) {
				fputc(' ', out);
				doc_cell_text(out, s->metavar);
			}
			fputs("` | ", out);
		} else {
			fputs("— | ", out);
		}
		fprintf(out, "%s | ", doc_type(s->type));
		if (s->def)
			fprintf(out, "`%s`", s->def);
		else if (s->type == ST_BOOL || s->type == ST_FLAG)
			fputs("`false`", out);
		else if (s->type == ST_STRING || s->type == ST_URL)
			fputs("none", out);
		else
			fputs("off", out);
		fputs(" | ", out);
		doc_range(out, s);
		fprintf(out, " | %s | ", doc_reload(s->reload));
		doc_cell_text(out, s->help);
		fputs(" |\n", out);
	}
	fputs(SETTINGS_DOC_END, out);
}
