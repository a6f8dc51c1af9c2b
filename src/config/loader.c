/*
 * loader.c — reads tokentap's YAML configuration into struct config.
 *
 * libyaml builds the document; this file walks it against a fixed schema:
 * the scalar settings come from SETTINGS(X) (settings.h); the list keys
 * (upstreams, routes, listeners, split) and their sections are tables of
 * rows (struct field: key, kind, member offset, range), read by one
 * read_field, with a function of its own only where a key's shape needs one
 * (labels, mirror, sticky, the TLS checks, metrics_interval, load_factor).
 * Every problem is reported, not just the first, as "FILE:LINE: message"
 * naming the key by its full path (routes[2].split[0].weight), and nothing
 * is silently ignored: an unknown key, a wrong type or a value that does
 * not parse is an error. What the server checks when it starts is checked
 * here the same way, so that `tokentap -t` passes only files the server
 * takes: upstream URLs through config_parse_url, and the TLS files named
 * (certificate, key, CA) by building their contexts. Host names are not
 * resolved here: a check may run on another machine than the server.
 * Reference: docs/config.md.
 */
#include "loader.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "log.h"
#include "settings.h"
#include "strutil.h"
#include "tls.h"

struct load {
	struct config *c;
	yaml_document_t *doc;
	char *errs;
	size_t errlen, n;
	unsigned problems;
};

static void problem(struct load *l, const yaml_node_t *node, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void problem_line(struct load *l, unsigned long line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void problem_va(struct load *l, unsigned long line, const char *fmt, va_list ap)
{
	size_t room;

	l->problems++;
	room = l->n < l->errlen ? l->errlen - l->n : 0;
	l->n += (size_t)snprintf(l->errs + l->n, room, "%s:%lu: ", l->c->path, line);
	room = l->n < l->errlen ? l->errlen - l->n : 0;
	l->n += (size_t)vsnprintf(l->errs + l->n, room, fmt, ap);
	room = l->n < l->errlen ? l->errlen - l->n : 0;
	l->n += (size_t)snprintf(l->errs + l->n, room, "\n");
}

static void problem(struct load *l, const yaml_node_t *node, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	problem_va(l, node ? (unsigned long)node->start_mark.line + 1 : 1ul, fmt, ap);
	va_end(ap);
}

/* For a problem found after the walk, at a line the walk noted. */
static void problem_line(struct load *l, unsigned long line, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	problem_va(l, line, fmt, ap);
	va_end(ap);
}

static yaml_node_t *node(struct load *l, int id)
{
	return yaml_document_get_node(l->doc, id);
}

static const char *scalar(struct load *l, yaml_node_t *n, const char *key)
{
	if (n->type != YAML_SCALAR_NODE) {
		problem(l, n, "%s: expected a single value, not a %s", key,
			n->type == YAML_MAPPING_NODE ? "mapping" : "list");
		return NULL;
	}
	return config_own(l->c, strndup((const char *)n->data.scalar.value, n->data.scalar.length));
}

static void get_string(struct load *l, yaml_node_t *n, const char *key, const char **out)
{
	const char *s = scalar(l, n, key);
	if (s)
		*out = s;
}

static void get_duration(struct load *l, yaml_node_t *n, const char *key, uint64_t *out)
{
	const char *s = scalar(l, n, key);
	if (s && (config_parse_duration_ms(s, out) == -1 || *out == 0))
		problem(l, n,
			"%s: expected a positive duration such as 300ms or 5s (at most " DURATION_MAX_TEXT
			"), got '%s'",
			key, s);
}

static void get_uint(struct load *l, yaml_node_t *n, const char *key, unsigned *out)
{
	const char *s = scalar(l, n, key);
	char *end;
	if (!s)
		return;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || !*s || *end || *s == '-' || v > 1000000000ul)
		problem(l, n, "%s: expected a whole number, got '%s'", key, s);
	else
		*out = (unsigned)v;
}

static void get_bool(struct load *l, yaml_node_t *n, const char *key, bool *out)
{
	const char *s = scalar(l, n, key);
	if (!s)
		return;
	if (strcmp(s, "true") == 0 || strcmp(s, "yes") == 0 || strcmp(s, "on") == 0)
		*out = true;
	else if (strcmp(s, "false") == 0 || strcmp(s, "no") == 0 || strcmp(s, "off") == 0)
		*out = false;
	else
		problem(l, n, "%s: expected true or false, got '%s'", key, s);
}

/* A file named by a setting (certificate, key, CA) must be a regular file
 * the server can read as it will be started: relative to the working
 * directory. Opened without blocking, so that a FIFO or a device named by
 * mistake is reported rather than waited on. */
static int readable_file(const char *path, char *err, size_t errlen)
{
	struct stat st;
	int fd, rc = 0;

	if ((fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) == -1) {
		snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) == -1 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s is not a regular file", path);
		rc = -1;
	}
	close(fd);
	return rc;
}

static void get_readable_file(struct load *l, yaml_node_t *n, const char *key, const char **out)
{
	const char *s = scalar(l, n, key);
	char err[600];

	if (!s)
		return;
	*out = s;
	if (readable_file(s, err, sizeof(err)) == -1)
		problem(l, n, "%s: %s", key, err);
}

/* With both files readable, the listener's context is built and freed
 * again: a key that does not match its certificate, or a file that is not
 * PEM, is reported here rather than when the server starts. */
static void check_server_tls(struct load *l, yaml_node_t *n, const char *key, const char *cert, const char *pkey,
			     unsigned problems_before)
{
	char err[600];
	SSL_CTX *ctx;

	if (!cert || !pkey || l->problems != problems_before)
		return;
	if (!(ctx = tls_server_ctx(cert, pkey, err, sizeof(err))))
		problem(l, n, "%s: %s", key, err);
	tls_ctx_free(ctx);
}

int loader_check_tls_files(const char *cert, const char *key, int *bad, char *err, size_t errlen)
{
	SSL_CTX *ctx;

	if (cert && readable_file(cert, err, errlen) == -1) {
		*bad = 0;
		return -1;
	}
	if (key && readable_file(key, err, errlen) == -1) {
		*bad = 1;
		return -1;
	}
	if (!cert || !key)
		return 0;
	if (!(ctx = tls_server_ctx(cert, key, err, errlen))) {
		*bad = 2;
		return -1;
	}
	tls_ctx_free(ctx);
	return 0;
}

typedef void (*field_fn)(struct load *l, yaml_node_t *value, const char *key, void *obj);

/* What a key holds, and so how its value is read. */
enum field_kind {
	FK_FN,		/* `fn` reads the value itself: the special cases */
	FK_STRING,	/* const char *, kept as given */
	FK_FILE,	/* const char *: a readable regular file */
	FK_UINT,	/* unsigned; with `hi`, from `lo` to `hi` `unit` */
	FK_DURATION,	/* uint64_t ms, positive */
	FK_BOOL,	/* bool */
	FK_ENUM,	/* an enum: the index of the value in `names` */
	FK_URL,		/* const char *: an upstream URL (config_parse_url) */
	FK_METRICS_URL, /* const char *: a metrics URL (config_parse_metrics_url) */
	FK_LISTEN,	/* const char *: a numeric ADDR:PORT */
	FK_MAP,		/* a mapping of `sub`'s keys on the same object; then `fn`, if any, checks it whole */
	FK_LIST,	/* a sequence of objects, as `list` says */
};

struct list_shape;

/* One key of a mapping: a row of a table walked by walk(). */
struct field {
	const char *name;
	enum field_kind kind;
	size_t off;		  /* of the member the value goes to */
	size_t line_off;	  /* of an int member noting the value's line; 0: none (no such member comes first) */
	unsigned lo, hi;	  /* FK_UINT's range (hi 0: any whole number) */
	const char *unit;	  /* FK_UINT with a range: what it counts, for the message */
	const char *const *names; /* FK_ENUM: the values, NULL-ended, by their enum number */
	const struct field *sub;  /* FK_MAP: its keys */
	const struct list_shape *list; /* FK_LIST */
	field_fn fn;
};

/* A list key: an array member and its count in the object, the element
 * size, the keys of one element, and what each element needs beside them. */
struct list_shape {
	const char *what; /* "expected a list of ..." */
	size_t array_off, count_off, elem;
	size_t line_off; /* of the element's int member noting its line */
	const struct field *fields;
	/* before the elements: 0 to read them, -1 to leave the list (may be NULL) */
	int (*begin)(struct load *l, yaml_node_t *v, const char *key, void *obj);
	void (*init)(void *elem); /* its defaults (may be NULL) */
	/* after one element's keys: the checks that need all of them (may be NULL) */
	void (*done)(struct load *l, yaml_node_t *item, const char *path, void *elem, size_t i);
};

#define ROW(key, K, T, member) \
	{ \
		.name = key, .kind = FK_##K, .off = offsetof(T, member) \
	}
#define ROW_LINE(key, K, T, member, line) \
	{ \
		.name = key, .kind = FK_##K, .off = offsetof(T, member), .line_off = offsetof(T, line) \
	}
#define ROW_RANGE(key, T, member, min, max, what) \
	{ \
		.name = key, .kind = FK_UINT, .off = offsetof(T, member), .lo = min, .hi = max, .unit = what \
	}
#define ROW_ENUM(key, T, member, values) \
	{ \
		.name = key, .kind = FK_ENUM, .off = offsetof(T, member), .names = values \
	}
#define ROW_MAP(key, keys, check) \
	{ \
		.name = key, .kind = FK_MAP, .sub = keys, .fn = check \
	}
#define ROW_LIST(key, shape) \
	{ \
		.name = key, .kind = FK_LIST, .list = &shape \
	}
#define ROW_FN(key, f) \
	{ \
		.name = key, .kind = FK_FN, .fn = f \
	}
#define ROWS_END \
	{ \
		.name = NULL \
	}

/* The key node of an earlier pair of `map` with the same key as `p`, or
 * NULL: YAML leaves duplicate keys to the reader, and here the second one is
 * an error rather than silently winning. */
static const yaml_node_t *twice(struct load *l, yaml_node_t *map, const yaml_node_pair_t *p)
{
	const yaml_node_t *k = node(l, p->key);

	for (const yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
		const yaml_node_t *e = node(l, q->key);
		if (e->type == YAML_SCALAR_NODE && e->data.scalar.length == k->data.scalar.length &&
		    memcmp(e->data.scalar.value, k->data.scalar.value, k->data.scalar.length) == 0)
			return e;
	}
	return NULL;
}

static void read_field(struct load *l, const struct field *f, yaml_node_t *v, const char *key, void *obj);

/* Walks a mapping: each key must be one of `fields`. `path` prefixes key
 * names in messages. */
static void walk(struct load *l, yaml_node_t *map, const char *path, const struct field *fields, void *obj)
{
	char key[256];

	if (map->type != YAML_MAPPING_NODE) {
		problem(l, map, "%s: expected a mapping of keys to values", path[0] ? path : "top level");
		return;
	}
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
		yaml_node_t *k = node(l, p->key), *v = node(l, p->value);
		if (k->type != YAML_SCALAR_NODE) {
			problem(l, k, "%s: keys must be plain names", path);
			continue;
		}
		const char *name = (const char *)k->data.scalar.value;
		const struct field *f;
		const yaml_node_t *first = twice(l, map, p);
		if (first) {
			snprintf(key, sizeof(key), "%s%s%s", path, path[0] ? "." : "", name);
			problem(l, k, "%s: given twice (first on line %lu); keep one", key,
				(unsigned long)first->start_mark.line + 1);
			continue;
		}
		for (f = fields; f->name; f++)
			if (strcmp(f->name, name) == 0)
				break;
		snprintf(key, sizeof(key), "%s%s%s", path, path[0] ? "." : "", name);
		if (!f->name) {
			char known[512];
			size_t kn = 0;
			known[0] = '\0';
			for (const struct field *g = fields; g->name && kn < sizeof(known); g++)
				kn += (size_t)snprintf(known + kn, sizeof(known) - kn, "%s%s", kn ? ", " : "", g->name);
			problem(l, k, "unknown key '%s'; known here: %s", key, known);
			continue;
		}
		read_field(l, f, v, key, obj);
	}
}

/* A whole number up to 1e9; with a range (hi), kept only inside it. */
static void get_count(struct load *l, yaml_node_t *v, const char *key, const struct field *f, unsigned *out)
{
	unsigned n = 0, before = l->problems;

	if (!f->hi) {
		get_uint(l, v, key, out);
		return;
	}
	get_uint(l, v, key, &n);
	if (l->problems != before)
		return;
	if (n < f->lo || n > f->hi)
		problem(l, v, "%s: expected from %u to %u %s, got %u", key, f->lo, f->hi, f->unit, n);
	else
		*out = n;
}

/* One of `names`: "expected a, b or c" otherwise. */
static void get_enum(struct load *l, yaml_node_t *v, const char *key, const char *const *names, int *out)
{
	const char *s = scalar(l, v, key);
	char expect[200];
	size_t n = 0, len = 0;

	if (!s)
		return;
	for (; names[n]; n++)
		if (strcmp(s, names[n]) == 0) {
			*out = (int)n;
			return;
		}
	expect[0] = '\0';
	for (size_t i = 0; i < n && len < sizeof(expect); i++)
		len += (size_t)snprintf(expect + len, sizeof(expect) - len, "%s%s",
					i == 0	     ? ""
					: i + 1 == n ? " or "
						     : ", ",
					names[i]);
	problem(l, v, "%s: expected %s, got '%s'", key, expect, s);
}

/* A sequence of objects as `shape` says: each element gets its defaults,
 * its line and its keys, at path KEY[i]. */
static void get_list(struct load *l, yaml_node_t *v, const char *key, const struct list_shape *shape, void *obj)
{
	char path[300], *array;
	unsigned *count = (unsigned *)((char *)obj + shape->count_off);

	if (v->type != YAML_SEQUENCE_NODE) {
		problem(l, v, "%s: expected a list of %s", key, shape->what);
		return;
	}
	if (shape->begin && shape->begin(l, v, key, obj) == -1)
		return;
	size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	array = config_own(l->c, calloc(n ? n : 1, shape->elem));
	/* the member is a pointer to the element type: stored as its bytes */
	memcpy((char *)obj + shape->array_off, &array, sizeof(array));
	*count = 0;
	for (size_t i = 0; i < n && array; i++) {
		yaml_node_t *item = node(l, v->data.sequence.items.start[i]);
		char *elem = array + shape->elem * (*count)++;
		if (shape->init)
			shape->init(elem);
		*(int *)(elem + shape->line_off) = (int)item->start_mark.line + 1;
		snprintf(path, sizeof(path), "%s[%zu]", key, i);
		walk(l, item, path, shape->fields, elem);
		if (shape->done)
			shape->done(l, item, path, elem, i);
	}
}

_Static_assert(sizeof(enum engine_kind) == sizeof(int) && sizeof(enum balance_policy) == sizeof(int),
	       "loader: FK_ENUM writes an int");

static void read_field(struct load *l, const struct field *f, yaml_node_t *v, const char *key, void *obj)
{
	void *at = (char *)obj + f->off;
	char err[400];

	if (f->line_off)
		*(int *)((char *)obj + f->line_off) = (int)v->start_mark.line + 1;
	switch (f->kind) {
	case FK_FN: f->fn(l, v, key, obj); return;
	case FK_STRING: get_string(l, v, key, at); return;
	case FK_FILE: get_readable_file(l, v, key, at); return;
	case FK_UINT: get_count(l, v, key, f, at); return;
	case FK_DURATION: get_duration(l, v, key, at); return;
	case FK_BOOL: get_bool(l, v, key, at); return;
	case FK_ENUM: get_enum(l, v, key, f->names, at); return;
	case FK_URL: {
		struct url_parts parts;
		get_string(l, v, key, at);
		if (*(const char **)at && config_parse_url(*(const char **)at, &parts, err, sizeof(err)) == -1)
			problem(l, v, "%s: %s", key, err);
		return;
	}
	case FK_METRICS_URL: {
		struct metrics_url_parts parts;
		get_string(l, v, key, at);
		if (*(const char **)at && config_parse_metrics_url(*(const char **)at, &parts, err, sizeof(err)) == -1)
			problem(l, v, "%s: %s", key, err);
		return;
	}
	case FK_LISTEN: {
		struct sockaddr_storage ss;
		unsigned len;
		get_string(l, v, key, at);
		if (*(const char **)at && config_parse_listen(*(const char **)at, &ss, &len) == -1)
			problem(l, v, "%s: expected a numeric ADDR:PORT such as 127.0.0.1:8080", key);
		return;
	}
	case FK_MAP:
		walk(l, v, key, f->sub, obj);
		if (f->fn)
			f->fn(l, v, key, obj);
		return;
	case FK_LIST: get_list(l, v, key, f->list, obj); return;
	}
}

/* ---- sections ---- */

#define CFG(obj) ((struct config *)(obj))

/* A file a settings row names is read as the server will read it: the
 * collector's CA through the same context the exporter builds, so that a
 * file with no certificate in it is a FILE:LINE and not a start whose
 * spans all fail. True when it said a problem. */
static bool file_problem(struct load *l, yaml_node_t *v, const struct setting *s, const char *key, const char *path)
{
	char err[600];
	SSL_CTX *ctx;

	if (readable_file(path, err, sizeof(err)) == -1) {
		problem(l, v, "%s: %s", key, err);
		return true;
	}
	if (s->id != S_OTLP_CA_FILE)
		return false;
	if (!(ctx = tls_client_ctx(true, path, err, sizeof(err)))) {
		problem(l, v, "%s: %s", key, err);
		return true;
	}
	tls_ctx_free(ctx);
	return false;
}

/* A scalar key of the settings table (settings.h): parsed by its row's type
 * and range, with the row's "expected" text in the message. */
static void f_row(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	const struct setting *s = settings_by_yaml(key);
	const char *text = scalar(l, v, key);
	char why[400];

	if (s && s->id == S_LISTEN)
		CFG(o)->listen_line = (int)v->start_mark.line + 1; /* `listen` beside `listeners` is refused */
	if (!s || !text)
		return;
	if (setting_parse(s, text, CFG(o), why, sizeof(why)) == -1) {
		problem(l, v, "%s: %s, got '%s'", key, why, text);
		return;
	}
	if (s->type == ST_FILE && file_problem(l, v, s, key, text))
		return;
	if (s->id == S_ADMIN_LISTEN)
		CFG(o)->admin_listen_explicit = true; /* a busy port is then an error, not a warning */
	else if (s->id == S_MAX_CONNECTIONS)
		CFG(o)->max_connections_explicit = true; /* kept even above the descriptor limit */
}

#define SECTION_KEYS_MAX 32

/* The keys a mapping at `path` ("" at the top, "store", ...) knows, made
 * from the settings table: each row under it gives its next name, a leaf
 * read by f_row or a section read by f_section, in table order; then the
 * keys of `custom` (lists, and the tls section with its file checks) that
 * the table did not give, a custom row winning over a generated one. */
struct section {
	struct field fields[SECTION_KEYS_MAX + 1];
	char names[SECTION_KEYS_MAX][48];
};

static void f_section(struct load *l, yaml_node_t *v, const char *key, void *o);

static void section_keys(struct section *sec, const char *path, const struct field *custom)
{
	size_t plen = strlen(path), n = 0;

	for (size_t i = 0; i < S__COUNT && n < SECTION_KEYS_MAX; i++) {
		const char *y = settings[i].yaml, *name, *dot;
		if (!y || (plen && (strncmp(y, path, plen) != 0 || y[plen] != '.')))
			continue;
		name = plen ? y + plen + 1 : y;
		dot = strchr(name, '.');
		size_t len = dot ? (size_t)(dot - name) : strlen(name);
		if (len >= sizeof(sec->names[0]))
			continue;
		bool seen = false;
		for (size_t j = 0; j < n && !seen; j++)
			seen = strlen(sec->names[j]) == len && strncmp(sec->names[j], name, len) == 0;
		if (seen)
			continue;
		memcpy(sec->names[n], name, len);
		sec->names[n][len] = '\0';
		sec->fields[n] = (struct field)ROW_FN(sec->names[n], dot ? f_section : f_row);
		for (const struct field *c = custom; c && c->name; c++)
			if (strcmp(c->name, sec->names[n]) == 0)
				sec->fields[n] = *c;
		n++;
	}
	for (const struct field *c = custom; c && c->name && n < SECTION_KEYS_MAX; c++) {
		bool seen = false;
		for (size_t j = 0; j < n && !seen; j++)
			seen = strcmp(sec->fields[j].name, c->name) == 0;
		if (!seen)
			sec->fields[n++] = *c;
	}
	sec->fields[n] = (struct field)ROWS_END;
}

/* A section of scalar settings (admin, store, limits, timeouts, slo). */
static void f_section(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct section sec;
	section_keys(&sec, key, NULL);
	walk(l, v, key, sec.fields, o);
}

/* ---- upstreams ---- */

#define UP(obj) ((struct upstream_conf *)(obj))

static void u_tls_ca(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	unsigned before = l->problems;
	char err[600];
	SSL_CTX *ctx;

	get_readable_file(l, v, key, &UP(o)->tls_ca_file);
	if (!UP(o)->tls_ca_file || l->problems != before)
		return;
	if (!(ctx = tls_client_ctx(true, UP(o)->tls_ca_file, err, sizeof(err))))
		problem(l, v, "%s: %s", key, err);
	tls_ctx_free(ctx);
}
static void u_labels(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct upstream_conf *u = UP(o);

	if (v->type != YAML_MAPPING_NODE) {
		problem(l, v, "%s: expected a mapping such as {runtime: vllm-0.6, hardware: H100}", key);
		return;
	}
	for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
		yaml_node_t *k = node(l, p->key), *val = node(l, p->value);
		const yaml_node_t *first = k->type == YAML_SCALAR_NODE ? twice(l, v, p) : NULL;
		if (first) {
			problem(l, k, "%s.%s: given twice (first on line %lu); keep one", key,
				(const char *)k->data.scalar.value, (unsigned long)first->start_mark.line + 1);
			continue;
		}
		if (u->nlabels == LABELS_MAX) {
			problem(l, k, "%s: at most %d labels", key, LABELS_MAX);
			return;
		}
		const char *ks = scalar(l, k, key), *vs = scalar(l, val, key);
		if (ks && vs)
			u->labels[u->nlabels++] = (struct label){ ks, vs };
	}
}

/* metrics_interval: its own range and message; it (or engine) without
 * metrics_url is refused once the whole entry is read. */
static void u_metrics_interval(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	const char *s = scalar(l, v, key);
	uint64_t ms;

	UP(o)->metrics_line = (int)v->start_mark.line + 1;
	UP(o)->metrics_key = "metrics_interval";
	if (!s)
		return;
	if (config_parse_duration_ms(s, &ms) == -1 || ms < METRICS_INTERVAL_MIN || ms > METRICS_INTERVAL_MAX)
		problem(l, v, "%s: expected a duration from %dms to %dm such as 5s, got '%s'", key,
			METRICS_INTERVAL_MIN, METRICS_INTERVAL_MAX / 60000, s);
	else
		UP(o)->metrics_interval_ms = ms;
}
static void u_engine(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const char *const names[] = { [ENGINE_AUTO] = "auto",
					     [ENGINE_VLLM] = "vllm",
					     [ENGINE_SGLANG] = "sglang",
					     [ENGINE_LLAMACPP] = "llamacpp",
					     NULL };

	UP(o)->metrics_line = (int)v->start_mark.line + 1;
	UP(o)->metrics_key = "engine";
	get_enum(l, v, key, names, (int *)&UP(o)->engine);
}

static void u_eject_check(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	if (UP(o)->eject_max_ms < UP(o)->eject_backoff_ms)
		problem(l, v, "%s: max_backoff (%llums) is shorter than backoff (%llums); make it at least as long",
			key, (unsigned long long)UP(o)->eject_max_ms, (unsigned long long)UP(o)->eject_backoff_ms);
}

static const struct field upstream_tls_keys[] = {
	ROW("verify", BOOL, struct upstream_conf, tls_verify),
	ROW_FN("ca_file", u_tls_ca),
	ROW("server_name", STRING, struct upstream_conf, tls_server_name),
	ROWS_END,
};
static const struct field upstream_queue_keys[] = {
	ROW("max", UINT, struct upstream_conf, queue_max),
	ROW("timeout", DURATION, struct upstream_conf, queue_timeout_ms),
	ROWS_END,
};
static const struct field upstream_timeout_keys[] = {
	ROW("connect", DURATION, struct upstream_conf, connect_timeout_ms),
	ROW("first_byte", DURATION, struct upstream_conf, first_byte_timeout_ms),
	ROW("idle", DURATION, struct upstream_conf, idle_timeout_ms),
	ROWS_END,
};
static const struct field upstream_eject_keys[] = {
	ROW("after", UINT, struct upstream_conf, eject_after),
	ROW("backoff", DURATION, struct upstream_conf, eject_backoff_ms),
	ROW("max_backoff", DURATION, struct upstream_conf, eject_max_ms),
	ROWS_END,
};
static const struct field upstream_keys[] = {
	ROW_LINE("name", STRING, struct upstream_conf, name, name_line),
	ROW("url", URL, struct upstream_conf, url),
	ROW("max_concurrency", UINT, struct upstream_conf, max_concurrency),
	ROW_MAP("queue", upstream_queue_keys, NULL),
	ROW_MAP("timeouts", upstream_timeout_keys, NULL),
	ROW_FN("labels", u_labels),
	{ .name = "tls",
	  .kind = FK_MAP,
	  .sub = upstream_tls_keys,
	  .line_off = offsetof(struct upstream_conf, tls_line) },
	ROW("metrics_url", METRICS_URL, struct upstream_conf, metrics_url),
	ROW_FN("metrics_interval", u_metrics_interval),
	ROW_FN("engine", u_engine),
	ROW_MAP("eject", upstream_eject_keys, u_eject_check),
	ROWS_END,
};

static void upstream_init(void *elem)
{
	config_upstream_defaults(elem);
}
static void upstream_done(struct load *l, yaml_node_t *item, const char *path, void *elem, size_t i)
{
	(void)item, (void)i;
	if (UP(elem)->metrics_line && !UP(elem)->metrics_url) /* metrics_interval or engine alone */
		problem_line(l, (unsigned long)UP(elem)->metrics_line, "%s.%s: needs metrics_url", path,
			     UP(elem)->metrics_key);
}
static const struct list_shape upstream_list = {
	.what = "upstreams",
	.array_off = offsetof(struct config, upstreams),
	.count_off = offsetof(struct config, nupstreams),
	.elem = sizeof(struct upstream_conf),
	.line_off = offsetof(struct upstream_conf, line),
	.fields = upstream_keys,
	.init = upstream_init,
	.done = upstream_done,
};

/* ---- routes ---- */

#define RT(obj) ((struct route_conf *)(obj))

static struct route_target *targets_alloc(struct load *l, struct route_conf *r, size_t n)
{
	r->targets = config_own(l->c, calloc(n ? n : 1, sizeof(*r->targets)));
	r->ntargets = 0;
	return r->targets;
}

static void r_upstream(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct route_conf *r = RT(o);
	const char *name = scalar(l, v, key);

	if (!name)
		return;
	if (r->ntargets) {
		problem(l, v, "%s: give either `upstream:` or `split:`, not both", key);
		return;
	}
	if (targets_alloc(l, r, 1)) {
		r->targets[0] = (struct route_target){ name, 1, (int)v->start_mark.line + 1 };
		r->ntargets = 1;
	}
}

static const struct field target_keys[] = {
	ROW_LINE("upstream", STRING, struct route_target, upstream, line),
	ROW("weight", UINT, struct route_target, weight),
	ROWS_END,
};
static int split_begin(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	if (RT(o)->ntargets) {
		problem(l, v, "%s: give either `upstream:` or `split:`, not both", key);
		return -1;
	}
	RT(o)->split = true;
	RT(o)->split_line = (int)v->start_mark.line + 1;
	return 0;
}
static void split_init(void *elem)
{
	((struct route_target *)elem)->weight = 1;
}
static void split_done(struct load *l, yaml_node_t *item, const char *path, void *elem, size_t i)
{
	(void)i;
	if (!((struct route_target *)elem)->upstream)
		problem(l, item, "%s: needs an upstream", path);
}
static const struct list_shape split_list = {
	.what = "{upstream: NAME, weight: N}",
	.array_off = offsetof(struct route_conf, targets),
	.count_off = offsetof(struct route_conf, ntargets),
	.elem = sizeof(struct route_target),
	.line_off = offsetof(struct route_target, line),
	.fields = target_keys,
	.begin = split_begin,
	.init = split_init,
	.done = split_done,
};

/* sticky: header or json_field, one of the two. */
static void sticky_key(struct load *l, yaml_node_t *v, const char *key, void *o, enum sticky_kind kind)
{
	if (RT(o)->sticky != STICKY_NONE)
		problem(l, v, "%s: give sticky.header or sticky.json_field, not both", key);
	RT(o)->sticky = kind;
	get_string(l, v, key, &RT(o)->sticky_key);
}
static void s_header(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	sticky_key(l, v, key, o, STICKY_HEADER);
}
static void s_json(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	sticky_key(l, v, key, o, STICKY_JSON_FIELD);
}
static void m_max_in_flight(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_uint(l, v, key, &RT(o)->mirror_max_in_flight);
	if (RT(o)->mirror_max_in_flight == 0)
		problem(l, v, "%s: must be at least 1 (percent: 0 turns mirroring off)", key);
}
static const struct field mirror_keys[] = {
	ROW_LINE("upstream", STRING, struct route_conf, mirror_upstream, mirror_line),
	ROW("percent", UINT, struct route_conf, mirror_percent),
	ROW_FN("max_in_flight", m_max_in_flight),
	ROWS_END,
};
/* mirror: its defaults only when given, and an upstream it must name. */
static void r_mirror(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	RT(o)->mirror_percent = 100;
	RT(o)->mirror_max_in_flight = MIRROR_MAX_IN_FLIGHT;
	walk(l, v, key, mirror_keys, o);
	if (!RT(o)->mirror_upstream)
		problem(l, v, "%s: needs an upstream", key);
}

static void r_load_factor(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	const char *s = scalar(l, v, key);
	char *end;

	if (!s)
		return;
	errno = 0;
	double f = strtod(s, &end);
	if (errno || !*s || *end || !(f > 1.0 && f <= 100.0))
		problem(l, v, "%s: expected a number above 1 and at most 100 such as 1.25, got '%s'", key, s);
	else
		RT(o)->load_factor = f;
}

/* ---- tenants ---- */

/* One source per `tenant:`: the header, the JSON field or the API key. */
static void tenant_source(struct load *l, yaml_node_t *v, const char *key, struct tenant_conf *t,
			  enum tenant_source src)
{
	const char *s;

	if (t->source != TENANT_NONE) {
		problem(l, v, "%s: give one of header, json_field or api_key, not two", key);
		return;
	}
	if (src == TENANT_API_KEY) {
		bool on = false;
		unsigned before = l->problems;
		get_bool(l, v, key, &on);
		if (l->problems == before && !on)
			problem(l, v, "%s: only true; leave tenant out for no tenants", key);
		if (on)
			t->source = src;
		return;
	}
	if (!(s = scalar(l, v, key)))
		return;
	size_t n = strlen(s);
	if (!n || n > 128) {
		problem(l, v, "%s: expected a name of 1 to 128 bytes, got %zu", key, n);
		return;
	}
	if (src == TENANT_HEADER) {
		char *low = config_strdup(l->c, s);
		for (size_t i = 0; low && i < n; i++) {
			unsigned char c = (unsigned char)low[i];
			if (c <= 0x20 || c >= 0x7f || strchr("\"(),/:;<=>?@[\\]{}", c)) {
				problem(l, v, "%s: '%s' is not a header name", key, s);
				return;
			}
			low[i] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
		}
		/* a credential header would put the credential in every log line */
		if (low && (strcmp(low, "authorization") == 0 || strcmp(low, "x-api-key") == 0 ||
			    strcmp(low, "proxy-authorization") == 0 || strcmp(low, "cookie") == 0)) {
			problem(l, v,
				"%s: %s carries a credential; use tenant.api_key: true, which keeps only its hash", key,
				s);
			return;
		}
		s = low;
	}
	t->source = src;
	t->name = s;
}

#define TNC(obj) (&CFG(obj)->tenant)
#define TNR(obj) (&RT(obj)->tenant)
static void tc_header(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	tenant_source(l, v, key, TNC(o), TENANT_HEADER);
}
static void tc_json(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	tenant_source(l, v, key, TNC(o), TENANT_JSON_FIELD);
}
static void tc_key(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	tenant_source(l, v, key, TNC(o), TENANT_API_KEY);
}
static void tr_header(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	tenant_source(l, v, key, TNR(o), TENANT_HEADER);
}
static void tr_json(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	tenant_source(l, v, key, TNR(o), TENANT_JSON_FIELD);
}
static void tr_key(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	tenant_source(l, v, key, TNR(o), TENANT_API_KEY);
}

static int tenant_key_cmp(const void *a, const void *b)
{
	return strcmp(((const struct tenant_key *)a)->sha256, ((const struct tenant_key *)b)->sha256);
}

/* tenant.keys: {SHA-256 of a key: tenant name}, sorted for the lookup. */
static void tc_keys(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct config *c = CFG(o);

	if (v->type != YAML_MAPPING_NODE) {
		problem(l, v, "%s: expected a mapping of an API key's SHA-256 (64 hex digits) to a tenant name", key);
		return;
	}
	size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
	c->tenant_keys = config_own(c, calloc(n ? n : 1, sizeof(*c->tenant_keys)));
	c->ntenant_keys = 0;
	for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top && c->tenant_keys; p++) {
		yaml_node_t *k = node(l, p->key), *val = node(l, p->value);
		const char *ks = scalar(l, k, key), *vs = scalar(l, val, key);
		if (!ks || !vs)
			continue;
		size_t kl = strlen(ks);
		bool hexok = kl == 64;
		for (size_t i = 0; hexok && i < kl; i++)
			hexok = (ks[i] >= '0' && ks[i] <= '9') || (ks[i] >= 'a' && ks[i] <= 'f') ||
				(ks[i] >= 'A' && ks[i] <= 'F');
		if (!hexok) {
			problem(l, k, "%s: '%.80s' is not a SHA-256 in hex (64 digits: printf %%s KEY | sha256sum)",
				key, ks);
			continue;
		}
		if (!tenant_name_ok(vs, strlen(vs))) {
			problem(l, val,
				"%s.%.16s...: '%.80s' is not a tenant name (1 to %d of A-Z a-z 0-9 . _ : @ / + = ~ -)",
				key, ks, vs, TENANT_NAME_MAX);
			continue;
		}
		struct tenant_key *e = &c->tenant_keys[c->ntenant_keys];
		for (size_t i = 0; i < 64; i++)
			e->sha256[i] = (char)(ks[i] >= 'A' && ks[i] <= 'F' ? ks[i] + 32 : ks[i]);
		e->name = vs;
		bool dup = false;
		for (unsigned j = 0; j < c->ntenant_keys && !dup; j++)
			dup = strcmp(c->tenant_keys[j].sha256, e->sha256) == 0;
		if (dup) {
			problem(l, k, "%s: %.16s... given twice; keep one", key, e->sha256);
			continue;
		}
		c->ntenant_keys++;
	}
	if (c->tenant_keys && c->ntenant_keys > 1)
		qsort(c->tenant_keys, c->ntenant_keys, sizeof(*c->tenant_keys), tenant_key_cmp);
}

static const struct field tenant_custom[] = {
	ROW_FN("header", tc_header),
	ROW_FN("json_field", tc_json),
	ROW_FN("api_key", tc_key),
	ROW_FN("keys", tc_keys),
	ROWS_END,
};
/* The top level's tenant: its source, and the settings rows under tenant.
 * (cap, idle, salt, metrics label). */
static void f_tenant(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct section sec;
	unsigned before = l->problems;

	CFG(o)->tenant.line = (int)v->start_mark.line + 1;
	section_keys(&sec, key, tenant_custom);
	walk(l, v, key, sec.fields, o);
	(void)before;
}

static const struct field route_tenant_keys[] = {
	ROW_FN("header", tr_header),
	ROW_FN("json_field", tr_json),
	ROW_FN("api_key", tr_key),
	ROWS_END,
};
static void r_tenant(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	unsigned before = l->problems;

	RT(o)->tenant.line = (int)v->start_mark.line + 1;
	walk(l, v, key, route_tenant_keys, o);
	if (l->problems == before && RT(o)->tenant.source == TENANT_NONE)
		problem(l, v, "%s: give one of header, json_field or api_key", key);
}

static const char *const balance_names[] = { [BALANCE_WEIGHTED] = "weighted",
					     [BALANCE_LEAST_REQUEST] = "least_request",
					     [BALANCE_LATENCY] = "latency",
					     [BALANCE_PREFIX] = "prefix",
					     NULL };
static const struct field match_keys[] = {
	ROW("path_prefix", STRING, struct route_conf, path_prefix),
	ROW("method", STRING, struct route_conf, method),
	ROW("host", STRING, struct route_conf, host),
	ROW("model", STRING, struct route_conf, model),
	ROWS_END,
};
static const struct field sticky_keys[] = {
	ROW_FN("header", s_header),
	ROW_FN("json_field", s_json),
	ROWS_END,
};
static const struct field route_keys[] = {
	ROW("name", STRING, struct route_conf, name),
	ROW_MAP("match", match_keys, NULL),
	ROW_FN("upstream", r_upstream),
	ROW_LIST("split", split_list),
	ROW_MAP("sticky", sticky_keys, NULL),
	ROW("failover", BOOL, struct route_conf, failover),
	ROW_FN("mirror", r_mirror),
	ROW("ttft_deadline", DURATION, struct route_conf, ttft_deadline_ms),
	ROW_ENUM("balance", struct route_conf, balance, balance_names),
	ROW_RANGE("prefix_blocks", struct route_conf, prefix_blocks, 1, PREFIX_BLOCKS_MAX, "blocks"),
	ROW_FN("load_factor", r_load_factor),
	ROW_RANGE("load_slack", struct route_conf, load_slack, 0, PREFIX_LOAD_SLACK_MAX, "requests"),
	ROW_FN("tenant", r_tenant),
	ROWS_END,
};

static void route_init(void *elem)
{
	config_route_defaults(elem);
}
/* A route without a name is named by its place: route1, route2... */
static void route_done(struct load *l, yaml_node_t *item, const char *path, void *elem, size_t i)
{
	(void)item, (void)path;
	if (!RT(elem)->name) {
		char *name = config_own(l->c, malloc(32));
		if (name)
			snprintf(name, 32, "route%zu", i + 1);
		RT(elem)->name = name ? name : "route";
	}
}
static const struct list_shape route_list = {
	.what = "routes",
	.array_off = offsetof(struct config, routes),
	.count_off = offsetof(struct config, nroutes),
	.elem = sizeof(struct route_conf),
	.line_off = offsetof(struct route_conf, line),
	.fields = route_keys,
	.init = route_init,
	.done = route_done,
};

/* ---- listeners and the top-level tls ---- */

#define LST(obj) ((struct listener_conf *)(obj))

static const struct field tls_keys[] = {
	ROW("cert", FILE, struct config, tls_cert),
	ROW("key", FILE, struct config, tls_key),
	ROWS_END,
};
static void f_tls(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	unsigned before = l->problems;
	walk(l, v, key, tls_keys, o);
	check_server_tls(l, v, key, CFG(o)->tls_cert, CFG(o)->tls_key, before);
}

static const struct field listener_tls_keys[] = {
	ROW("cert", FILE, struct listener_conf, tls_cert),
	ROW("key", FILE, struct listener_conf, tls_key),
	ROWS_END,
};
static void l_tls(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	unsigned before = l->problems;
	walk(l, v, key, listener_tls_keys, o);
	check_server_tls(l, v, key, LST(o)->tls_cert, LST(o)->tls_key, before);
}

static const struct field listener_keys[] = {
	ROW("address", LISTEN, struct listener_conf, address),
	ROW_FN("tls", l_tls),
	ROWS_END,
};
static const struct list_shape listener_list = {
	.what = "{address, tls}",
	.array_off = offsetof(struct config, listeners),
	.count_off = offsetof(struct config, nlisteners),
	.elem = sizeof(struct listener_conf),
	.line_off = offsetof(struct listener_conf, line),
	.fields = listener_keys,
};

/* Top-level keys that are not rows of the settings table. */
static const struct field top_custom[] = {
	ROW_FN("tls", f_tls),		ROW_LIST("upstreams", upstream_list),
	ROW_LIST("routes", route_list), ROW_LIST("listeners", listener_list),
	ROW_FN("tenant", f_tenant),	ROWS_END,
};

unsigned config_load_file(const char *path, struct config *c, char *errs, size_t errlen)
{
	struct load l = { c, NULL, errs, errlen, 0, 0 };
	yaml_parser_t parser;
	yaml_document_t doc;
	FILE *f;

	errs[0] = '\0';
	c->path = config_strdup(c, path);
	f = fopen(path, "rb");
	if (!f) {
		snprintf(errs, errlen, "%s: cannot open: %s\n", path, strerror(errno));
		return 1;
	}
	yaml_parser_initialize(&parser);
	yaml_parser_set_input_file(&parser, f);
	if (!yaml_parser_load(&parser, &doc)) {
		snprintf(errs, errlen, "%s:%lu: %s%s%s\n", path, (unsigned long)parser.problem_mark.line + 1,
			 parser.problem ? parser.problem : "YAML syntax error", parser.context ? " " : "",
			 parser.context ? parser.context : "");
		yaml_parser_delete(&parser);
		fclose(f);
		return 1;
	}
	l.doc = &doc;
	yaml_node_t *root = yaml_document_get_root_node(&doc);
	if (!root) {
		problem(&l, NULL, "the file is empty; see conf/tokentap.yaml for an example");
	} else {
		struct section top;
		section_keys(&top, "", top_custom);
		walk(&l, root, "", top.fields, c);
	}
	yaml_document_delete(&doc);
	yaml_parser_delete(&parser);
	fclose(f);
	if (l.problems == 0 && c->nroutes == 0 && c->nupstreams == 1) {
		/* one upstream and no routes: everything goes there */
		struct route_conf *r = config_own(c, calloc(1, sizeof(*r)));
		struct route_target *t = config_own(c, calloc(1, sizeof(*t)));
		if (r && t) {
			*t = (struct route_target){ c->upstreams[0].name, 1, 1 };
			config_route_defaults(r);
			r->name = "default";
			r->targets = t;
			r->ntargets = 1;
			r->line = 1;
			c->routes = r;
			c->nroutes = 1;
		}
	}
	c->tenant_any = c->tenant.source != TENANT_NONE;
	for (unsigned i = 0; i < c->nroutes; i++)
		c->tenant_any |= c->routes[i].tenant.source != TENANT_NONE;
	return l.problems + config_validate(c, errs, errlen);
}
