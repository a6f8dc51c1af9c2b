/*
 * loader.c — reads tokentap's YAML configuration into struct config.
 *
 * libyaml builds the document; this file walks it against a fixed schema.
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

struct field {
	const char *name;
	field_fn fn;
};

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
		f->fn(l, v, key, obj);
	}
}

/* ---- sections ---- */

#define CFG(obj) ((struct config *)(obj))

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
 * the table did not give, a custom function winning over a generated one. */
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
		sec->fields[n] = (struct field){ sec->names[n], dot ? f_section : f_row };
		for (const struct field *c = custom; c && c->name; c++)
			if (strcmp(c->name, sec->names[n]) == 0)
				sec->fields[n].fn = c->fn;
		n++;
	}
	for (const struct field *c = custom; c && c->name && n < SECTION_KEYS_MAX; c++) {
		bool seen = false;
		for (size_t j = 0; j < n && !seen; j++)
			seen = strcmp(sec->fields[j].name, c->name) == 0;
		if (!seen)
			sec->fields[n++] = *c;
	}
	sec->fields[n] = (struct field){ NULL, NULL };
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

static void u_name(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &UP(o)->name);
	UP(o)->name_line = (int)v->start_mark.line + 1;
}
static void u_url(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct url_parts parts;
	char err[400];
	get_string(l, v, key, &UP(o)->url);
	if (UP(o)->url && config_parse_url(UP(o)->url, &parts, err, sizeof(err)) == -1)
		problem(l, v, "%s: %s", key, err);
}
static void u_tls_verify(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_bool(l, v, key, &UP(o)->tls_verify);
}
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
static void u_tls_name(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &UP(o)->tls_server_name);
}
static void u_tls(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = {
		{ "verify", u_tls_verify }, { "ca_file", u_tls_ca }, { "server_name", u_tls_name }, { NULL, NULL }
	};
	UP(o)->tls_line = (int)v->start_mark.line + 1;
	walk(l, v, key, fields, o);
}
static void u_max_conc(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_uint(l, v, key, &UP(o)->max_concurrency);
}
static void u_queue_max(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_uint(l, v, key, &UP(o)->queue_max);
}
static void u_queue_timeout(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_duration(l, v, key, &UP(o)->queue_timeout_ms);
}
static void u_queue(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "max", u_queue_max }, { "timeout", u_queue_timeout }, { NULL, NULL } };
	walk(l, v, key, fields, o);
}
static void u_t_connect(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_duration(l, v, key, &UP(o)->connect_timeout_ms);
}
static void u_t_first_byte(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_duration(l, v, key, &UP(o)->first_byte_timeout_ms);
}
static void u_t_idle(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_duration(l, v, key, &UP(o)->idle_timeout_ms);
}
static void u_timeouts(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = {
		{ "connect", u_t_connect }, { "first_byte", u_t_first_byte }, { "idle", u_t_idle }, { NULL, NULL }
	};
	walk(l, v, key, fields, o);
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

static void u_metrics_url(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct metrics_url_parts parts;
	char err[400];
	get_string(l, v, key, &UP(o)->metrics_url);
	if (UP(o)->metrics_url && config_parse_metrics_url(UP(o)->metrics_url, &parts, err, sizeof(err)) == -1)
		problem(l, v, "%s: %s", key, err);
}
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
					     [ENGINE_LLAMACPP] = "llamacpp" };
	const char *s = scalar(l, v, key);

	UP(o)->metrics_line = (int)v->start_mark.line + 1;
	UP(o)->metrics_key = "engine";
	if (!s)
		return;
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(s, names[i]) == 0) {
			UP(o)->engine = (enum engine_kind)i;
			return;
		}
	problem(l, v, "%s: expected auto, vllm, sglang or llamacpp, got '%s'", key, s);
}

static void u_eject_after(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_uint(l, v, key, &UP(o)->eject_after);
}
static void u_eject_backoff(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_duration(l, v, key, &UP(o)->eject_backoff_ms);
}
static void u_eject_max(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_duration(l, v, key, &UP(o)->eject_max_ms);
}
static void u_eject(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "after", u_eject_after },
					       { "backoff", u_eject_backoff },
					       { "max_backoff", u_eject_max },
					       { NULL, NULL } };
	walk(l, v, key, fields, o);
	if (UP(o)->eject_max_ms < UP(o)->eject_backoff_ms)
		problem(l, v, "%s: max_backoff (%llums) is shorter than backoff (%llums); make it at least as long",
			key, (unsigned long long)UP(o)->eject_max_ms, (unsigned long long)UP(o)->eject_backoff_ms);
}

static void f_upstreams(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = {
		{ "name", u_name },
		{ "url", u_url },
		{ "max_concurrency", u_max_conc },
		{ "queue", u_queue },
		{ "timeouts", u_timeouts },
		{ "labels", u_labels },
		{ "tls", u_tls },
		{ "metrics_url", u_metrics_url },
		{ "metrics_interval", u_metrics_interval },
		{ "engine", u_engine },
		{ "eject", u_eject },
		{ NULL, NULL },
	};
	struct config *c = CFG(o);
	char path[64];

	if (v->type != YAML_SEQUENCE_NODE) {
		problem(l, v, "%s: expected a list of upstreams", key);
		return;
	}
	size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	c->upstreams = config_own(c, calloc(n ? n : 1, sizeof(*c->upstreams)));
	c->nupstreams = 0;
	for (size_t i = 0; i < n && c->upstreams; i++) {
		yaml_node_t *item = node(l, v->data.sequence.items.start[i]);
		struct upstream_conf *u = &c->upstreams[c->nupstreams++];
		config_upstream_defaults(u);
		u->line = (int)item->start_mark.line + 1;
		snprintf(path, sizeof(path), "upstreams[%zu]", i);
		walk(l, item, path, fields, u);
		if (u->metrics_line && !u->metrics_url) /* metrics_interval or engine alone */
			problem_line(l, (unsigned long)u->metrics_line, "%s.%s: needs metrics_url", path,
				     u->metrics_key);
	}
}

/* ---- routes ---- */

#define RT(obj) ((struct route_conf *)(obj))

static void r_name(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &RT(o)->name);
}
static void r_prefix(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &RT(o)->path_prefix);
}
static void r_method(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &RT(o)->method);
}
static void r_host(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &RT(o)->host);
}
static void r_model(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &RT(o)->model);
}
static void r_match(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = {
		{ "path_prefix", r_prefix }, { "method", r_method }, { "host", r_host },
		{ "model", r_model },	     { NULL, NULL },
	};
	walk(l, v, key, fields, o);
}

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

static void t_upstream(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &((struct route_target *)o)->upstream);
	((struct route_target *)o)->line = (int)v->start_mark.line + 1;
}
static void t_weight(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_uint(l, v, key, &((struct route_target *)o)->weight);
}

static void r_split(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "upstream", t_upstream }, { "weight", t_weight }, { NULL, NULL } };
	struct route_conf *r = RT(o);
	char path[300];

	if (v->type != YAML_SEQUENCE_NODE) {
		problem(l, v, "%s: expected a list of {upstream: NAME, weight: N}", key);
		return;
	}
	if (r->ntargets) {
		problem(l, v, "%s: give either `upstream:` or `split:`, not both", key);
		return;
	}
	size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	if (!targets_alloc(l, r, n))
		return;
	r->split = true;
	r->split_line = (int)v->start_mark.line + 1;
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *item = node(l, v->data.sequence.items.start[i]);
		struct route_target *t = &r->targets[r->ntargets++];
		t->weight = 1;
		t->line = (int)item->start_mark.line + 1;
		snprintf(path, sizeof(path), "%s[%zu]", key, i);
		walk(l, item, path, fields, t);
		if (!t->upstream)
			problem(l, item, "%s: needs an upstream", path);
	}
}

static void sticky_once(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	if (RT(o)->sticky != STICKY_NONE)
		problem(l, v, "%s: give sticky.header or sticky.json_field, not both", key);
}
static void s_header(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	sticky_once(l, v, key, o);
	RT(o)->sticky = STICKY_HEADER;
	get_string(l, v, key, &RT(o)->sticky_key);
}
static void s_json(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	sticky_once(l, v, key, o);
	RT(o)->sticky = STICKY_JSON_FIELD;
	get_string(l, v, key, &RT(o)->sticky_key);
}
static void r_sticky(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "header", s_header }, { "json_field", s_json }, { NULL, NULL } };
	walk(l, v, key, fields, o);
}
static void m_upstream(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_string(l, v, key, &RT(o)->mirror_upstream);
	RT(o)->mirror_line = (int)v->start_mark.line + 1;
}
static void m_percent(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_uint(l, v, key, &RT(o)->mirror_percent);
}
static void m_max_in_flight(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_uint(l, v, key, &RT(o)->mirror_max_in_flight);
	if (RT(o)->mirror_max_in_flight == 0)
		problem(l, v, "%s: must be at least 1 (percent: 0 turns mirroring off)", key);
}
static void r_mirror(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "upstream", m_upstream },
					       { "percent", m_percent },
					       { "max_in_flight", m_max_in_flight },
					       { NULL, NULL } };
	RT(o)->mirror_percent = 100;
	RT(o)->mirror_max_in_flight = MIRROR_MAX_IN_FLIGHT;
	walk(l, v, key, fields, o);
	if (!RT(o)->mirror_upstream)
		problem(l, v, "%s: needs an upstream", key);
}
static void r_failover(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_bool(l, v, key, &RT(o)->failover);
}

static void r_ttft_deadline(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_duration(l, v, key, &RT(o)->ttft_deadline_ms);
}

static void r_balance(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const char *const names[] = { [BALANCE_WEIGHTED] = "weighted",
					     [BALANCE_LEAST_REQUEST] = "least_request",
					     [BALANCE_LATENCY] = "latency",
					     [BALANCE_PREFIX] = "prefix" };
	const char *s = scalar(l, v, key);

	if (!s)
		return;
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(s, names[i]) == 0) {
			RT(o)->balance = (enum balance_policy)i;
			return;
		}
	problem(l, v, "%s: expected weighted, least_request, latency or prefix, got '%s'", key, s);
}
static void r_prefix_blocks(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	unsigned n = 0;
	unsigned before = l->problems;
	get_uint(l, v, key, &n);
	if (l->problems != before)
		return;
	if (n < 1 || n > PREFIX_BLOCKS_MAX)
		problem(l, v, "%s: expected from 1 to %d blocks, got %u", key, PREFIX_BLOCKS_MAX, n);
	else
		RT(o)->prefix_blocks = n;
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

static void f_routes(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = {
		{ "name", r_name },
		{ "match", r_match },
		{ "upstream", r_upstream },
		{ "split", r_split },
		{ "sticky", r_sticky },
		{ "failover", r_failover },
		{ "mirror", r_mirror },
		{ "ttft_deadline", r_ttft_deadline },
		{ "balance", r_balance },
		{ "prefix_blocks", r_prefix_blocks },
		{ "load_factor", r_load_factor },
		{ NULL, NULL },
	};
	struct config *c = CFG(o);
	char path[64];

	if (v->type != YAML_SEQUENCE_NODE) {
		problem(l, v, "%s: expected a list of routes", key);
		return;
	}
	size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	c->routes = config_own(c, calloc(n ? n : 1, sizeof(*c->routes)));
	c->nroutes = 0;
	for (size_t i = 0; i < n && c->routes; i++) {
		yaml_node_t *item = node(l, v->data.sequence.items.start[i]);
		struct route_conf *r = &c->routes[c->nroutes++];
		config_route_defaults(r);
		r->line = (int)item->start_mark.line + 1;
		snprintf(path, sizeof(path), "routes[%zu]", i);
		walk(l, item, path, fields, r);
		if (!r->name) {
			char *name = config_own(c, malloc(32));
			if (name)
				snprintf(name, 32, "route%zu", i + 1);
			r->name = name ? name : "route";
		}
	}
}

static void f_tls_cert(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_readable_file(l, v, key, &CFG(o)->tls_cert);
}
static void f_tls_key(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_readable_file(l, v, key, &CFG(o)->tls_key);
}
static void f_tls(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "cert", f_tls_cert }, { "key", f_tls_key }, { NULL, NULL } };
	unsigned before = l->problems;
	walk(l, v, key, fields, o);
	check_server_tls(l, v, key, CFG(o)->tls_cert, CFG(o)->tls_key, before);
}

#define LST(obj) ((struct listener_conf *)(obj))

static void l_address(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	struct sockaddr_storage ss;
	unsigned len;
	get_string(l, v, key, &LST(o)->address);
	if (LST(o)->address && config_parse_listen(LST(o)->address, &ss, &len) == -1)
		problem(l, v, "%s: expected a numeric ADDR:PORT such as 127.0.0.1:8080", key);
}
static void l_cert(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_readable_file(l, v, key, &LST(o)->tls_cert);
}
static void l_key(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	get_readable_file(l, v, key, &LST(o)->tls_key);
}
static void l_tls(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "cert", l_cert }, { "key", l_key }, { NULL, NULL } };
	unsigned before = l->problems;
	walk(l, v, key, fields, o);
	check_server_tls(l, v, key, LST(o)->tls_cert, LST(o)->tls_key, before);
}

static void f_listeners(struct load *l, yaml_node_t *v, const char *key, void *o)
{
	static const struct field fields[] = { { "address", l_address }, { "tls", l_tls }, { NULL, NULL } };
	struct config *c = CFG(o);
	char path[64];

	if (v->type != YAML_SEQUENCE_NODE) {
		problem(l, v, "%s: expected a list of {address, tls}", key);
		return;
	}
	size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
	c->listeners = config_own(c, calloc(n ? n : 1, sizeof(*c->listeners)));
	c->nlisteners = 0;
	for (size_t i = 0; i < n && c->listeners; i++) {
		yaml_node_t *item = node(l, v->data.sequence.items.start[i]);
		struct listener_conf *lc = &c->listeners[c->nlisteners++];
		lc->line = (int)item->start_mark.line + 1;
		snprintf(path, sizeof(path), "listeners[%zu]", i);
		walk(l, item, path, fields, lc);
	}
}

/* Top-level keys that are not rows of the settings table. */
static const struct field top_custom[] = {
	{ "tls", f_tls }, { "upstreams", f_upstreams }, { "routes", f_routes }, { "listeners", f_listeners },
	{ NULL, NULL },
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
	return l.problems + config_validate(c, errs, errlen);
}
