/*
 * config.c — the config struct: its defaults (each scalar's from the
 * settings table, settings.h; the entries' of upstreams and routes), the
 * value parsers the table's types use, ownership, and the cross-checks.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "settings.h"

/* Every row of the settings table with a default, parsed by its type's
 * parser: the text --help shows is the value the server starts with. */
void config_defaults(struct config *c)
{
	char why[200];

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < S__COUNT; i++)
		if (settings[i].def && setting_parse(&settings[i], settings[i].def, c, why, sizeof(why)) == -1)
			log_error("settings: the default of %s does not parse: %s", settings[i].name, why);
}

const char *balance_policy_name(enum balance_policy b)
{
	static const char *const names[] = { [BALANCE_WEIGHTED] = "weighted",
					     [BALANCE_LEAST_REQUEST] = "least_request",
					     [BALANCE_LATENCY] = "latency",
					     [BALANCE_PREFIX] = "prefix" };
	return (unsigned)b < sizeof(names) / sizeof(names[0]) ? names[b] : "?";
}

void config_upstream_defaults(struct upstream_conf *u)
{
	memset(u, 0, sizeof(*u));
	u->queue_timeout_ms = 30000;
	u->tls_verify = true; /* never bypassed silently */
	u->metrics_interval_ms = METRICS_INTERVAL_DEFAULT;
	u->eject_after = EJECT_AFTER_DEFAULT;
	u->eject_backoff_ms = EJECT_BACKOFF_MS_DEFAULT;
	u->eject_max_ms = EJECT_MAX_BACKOFF_MS_DEFAULT;
}

void config_route_defaults(struct route_conf *r)
{
	memset(r, 0, sizeof(*r));
	r->path_prefix = "/";
	r->failover = true;
	r->prefix_blocks = PREFIX_BLOCKS_DEFAULT;
	r->load_factor = LOAD_FACTOR_DEFAULT;
	r->load_slack = PREFIX_LOAD_SLACK_DEFAULT;
}

void *config_own(struct config *c, void *p)
{
	if (!p)
		return NULL;
	if (c->nowned == c->capowned) {
		size_t cap = c->capowned ? c->capowned * 2 : 32;
		char **q = realloc(c->owned, cap * sizeof(*q));
		if (!q) {
			free(p);
			return NULL;
		}
		c->owned = q;
		c->capowned = cap;
	}
	c->owned[c->nowned++] = p;
	return p;
}

char *config_strdup(struct config *c, const char *s)
{
	return s ? config_own(c, strdup(s)) : NULL;
}

unsigned config_listeners(const struct config *c, struct listener_conf out[LISTENERS_MAX])
{
	if (!c->nlisteners) {
		out[0] = (struct listener_conf){ c->listen, c->tls_cert, c->tls_key, 1 };
		return 1;
	}
	unsigned n = c->nlisteners < LISTENERS_MAX ? c->nlisteners : LISTENERS_MAX;
	memcpy(out, c->listeners, n * sizeof(*out));
	return n;
}

void config_free(struct config *c)
{
	for (size_t i = 0; i < c->nowned; i++)
		free(c->owned[i]);
	free(c->owned);
	memset(c, 0, sizeof(*c));
}

int config_single_upstream(struct config *c, char *err, size_t errlen)
{
	const char *url = c->upstream, *host = url;
	struct upstream_conf *u = config_own(c, calloc(1, sizeof(*u)));
	struct route_conf *r = config_own(c, calloc(1, sizeof(*r)));
	struct route_target *t = config_own(c, calloc(1, sizeof(*t)));

	if (!u || !r || !t) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (strncmp(host, "http://", 7) == 0)
		host += 7;
	else if (strncmp(host, "https://", 8) == 0)
		host += 8;
	size_t n = strcspn(host, "/");
	if (n > CONFIG_NAME_MAX)
		n = CONFIG_NAME_MAX; /* the name is a label: a long host is cut, not refused */
	char *name = config_own(c, strndup(host, n));
	if (!name) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	config_upstream_defaults(u);
	u->name = name;
	u->url = url;
	t->upstream = name;
	t->weight = 1;
	config_route_defaults(r);
	r->name = "default";
	r->targets = t;
	r->ntargets = 1;
	c->upstreams = u;
	c->nupstreams = 1;
	c->routes = r;
	c->nroutes = 1;
	return 0;
}

#define PROBLEM(line, ...) \
	do { \
		problems++; \
		if (c->path) \
			n += (size_t)snprintf(errs + n, n < errlen ? errlen - n : 0, "%s:%d: ", c->path, (line)); \
		n += (size_t)snprintf(errs + n, n < errlen ? errlen - n : 0, __VA_ARGS__); \
		n += (size_t)snprintf(errs + n, n < errlen ? errlen - n : 0, "\n"); \
	} while (0)

/* tracing.sampler's names: tracectx.c's trace_sampler_parse reads them
 * (config sits below parse, so the list is written here again). */
static bool sampler_known(const char *s)
{
	static const char *const names[] = { "parentbased_always_on", "parentbased_traceidratio", "always_on",
					     "always_off", "traceidratio" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(s, names[i]) == 0)
			return true;
	return false;
}

unsigned config_validate(const struct config *c, char *errs, size_t errlen)
{
	unsigned problems = 0;
	size_t n = strlen(errs);

	if (c->nupstreams == 0)
		PROBLEM(1, "upstreams: none defined; add a list with at least one {name, url}");
	for (unsigned i = 0; i < c->nupstreams; i++) {
		const struct upstream_conf *u = &c->upstreams[i];
		if (!u->name || !*u->name)
			PROBLEM(u->line, "upstreams[%u]: missing name", i);
		if (!u->url)
			PROBLEM(u->line, "upstreams[%u]: missing url (%s)", i, u->name ? u->name : "unnamed");
		if (u->name && strlen(u->name) > CONFIG_NAME_MAX)
			PROBLEM(u->name_line ? u->name_line : u->line, "upstreams[%u].name: at most %d bytes, got %zu",
				i, CONFIG_NAME_MAX, strlen(u->name));
		for (unsigned j = 0; j < i; j++)
			if (u->name && c->upstreams[j].name && strcmp(u->name, c->upstreams[j].name) == 0)
				PROBLEM(u->name_line ? u->name_line : u->line,
					"upstreams[%u].name: %s is already the name of upstreams[%u] (line %d)", i,
					u->name, j,
					c->upstreams[j].name_line ? c->upstreams[j].name_line : c->upstreams[j].line);
		if (u->queue_max && !u->max_concurrency)
			PROBLEM(u->line, "upstreams[%u].queue: a queue needs max_concurrency", i);
		if (u->url && strncmp(u->url, "https://", 8) != 0 && u->tls_line)
			PROBLEM(u->tls_line, "upstreams[%u].tls: only for https:// urls; this one is plain http", i);
	}
	if (c->trace_sampler && !sampler_known(c->trace_sampler))
		PROBLEM(1,
			"tracing.sampler: expected parentbased_always_on, parentbased_traceidratio, always_on, "
			"always_off or traceidratio, got \"%s\"",
			c->trace_sampler);
	if (c->nroutes == 0 && c->nupstreams > 1)
		PROBLEM(1, "routes: several upstreams but no routes; say which requests go where");
	if (!c->tls_cert != !c->tls_key)
		PROBLEM(1, "tls: give both cert and key");
	if (c->nlisteners && c->tls_cert)
		PROBLEM(c->listeners[0].line,
			"listeners: with a list, put tls under each listener, not at the top level");
	if (c->nlisteners && c->listen_line)
		PROBLEM(c->listen_line,
			"listen: give either listen or listeners, not both; put the address in the list");
	if (c->nlisteners > LISTENERS_MAX)
		PROBLEM(c->listeners[0].line, "listeners: at most %d", LISTENERS_MAX);
	for (unsigned i = 0; i < c->nlisteners; i++) {
		const struct listener_conf *l = &c->listeners[i];
		if (!l->address)
			PROBLEM(l->line, "listeners[%u]: missing address", i);
		if (!l->tls_cert != !l->tls_key)
			PROBLEM(l->line, "listeners[%u].tls: give both cert and key", i);
		size_t alen = l->address ? strlen(l->address) : 0;
		bool ephemeral = alen > 2 && strcmp(l->address + alen - 2, ":0") == 0; /* port 0: each gets its own */
		for (unsigned j = 0; j < i && !ephemeral; j++)
			if (l->address && c->listeners[j].address && strcmp(l->address, c->listeners[j].address) == 0)
				PROBLEM(l->line, "listeners[%u].address: %s is listed twice", i, l->address);
	}
	for (unsigned i = 0; i < c->nroutes; i++) {
		const struct route_conf *r = &c->routes[i];
		unsigned total = 0;
		for (unsigned j = 0; j < i; j++)
			if (r->name && c->routes[j].name && strcmp(r->name, c->routes[j].name) == 0)
				PROBLEM(r->line, "routes[%u].name: %s is already the name of routes[%u] (line %d)", i,
					r->name, j, c->routes[j].line);
		if (r->name && strlen(r->name) > CONFIG_NAME_MAX)
			PROBLEM(r->line, "routes[%u].name: at most %d bytes, got %zu", i, CONFIG_NAME_MAX,
				strlen(r->name));
		if (r->path_prefix && r->path_prefix[0] != '/')
			PROBLEM(r->line, "routes[%u].match.path_prefix: must start with /", i);
		if (r->ntargets == 0)
			PROBLEM(r->line, "routes[%u]: sends nowhere; give `upstream:` or `split:`", i);
		if (r->ntargets > ROUTE_TARGETS_MAX)
			PROBLEM(r->split_line, "routes[%u].split: at most %d upstreams", i, ROUTE_TARGETS_MAX);
		for (unsigned t = 0; t < r->ntargets; t++) {
			const struct route_target *tg = &r->targets[t];
			bool known = false;
			if (!tg->upstream)
				continue; /* reported where it was read */
			for (unsigned k = 0; k < c->nupstreams; k++)
				known |= c->upstreams[k].name && strcmp(c->upstreams[k].name, tg->upstream) == 0;
			for (unsigned s = 0; s < t; s++)
				if (r->targets[s].upstream && strcmp(r->targets[s].upstream, tg->upstream) == 0)
					PROBLEM(tg->line,
						"routes[%u].split[%u].upstream: %s is already split[%u]; give it one "
						"entry with the weights added up",
						i, t, tg->upstream, s);
			if (!known && r->split)
				PROBLEM(tg->line, "routes[%u].split[%u].upstream: %s is not defined in upstreams", i, t,
					tg->upstream);
			else if (!known)
				PROBLEM(tg->line, "routes[%u].upstream: %s is not defined in upstreams", i,
					tg->upstream);
			total += tg->weight;
		}
		if (r->ntargets && total == 0)
			PROBLEM(r->split_line ? r->split_line : r->line, "routes[%u].split: the weights add up to 0",
				i);
		if (r->mirror_upstream) {
			bool known = false;
			for (unsigned k = 0; k < c->nupstreams; k++)
				known |= c->upstreams[k].name && strcmp(c->upstreams[k].name, r->mirror_upstream) == 0;
			if (!known)
				PROBLEM(r->mirror_line, "routes[%u].mirror.upstream: %s is not defined in upstreams", i,
					r->mirror_upstream);
			if (r->mirror_percent > 100)
				PROBLEM(r->mirror_line, "routes[%u].mirror.percent: at most 100", i);
			for (unsigned t = 0; t < r->ntargets; t++)
				if (r->targets[t].upstream && strcmp(r->targets[t].upstream, r->mirror_upstream) == 0) {
					PROBLEM(r->mirror_line,
						"routes[%u].mirror.upstream: %s is also a target of this route; its "
						"copies would mix into that target's series: mirror to another "
						"upstream",
						i, r->mirror_upstream);
					break;
				}
		}
	}
	if (c->ntenant_keys && !config_tenant_keyed(c))
		PROBLEM(c->tenant.line ? c->tenant.line : 1,
			"tenant.keys: only with tenant.api_key: true (at the top level or in a route)");
	if (c->tenant_salt && strlen(c->tenant_salt) < 16)
		PROBLEM(c->tenant.line ? c->tenant.line : 1, "tenant.salt: at least 16 bytes, got %zu",
			strlen(c->tenant_salt));
	if (config_tenant_keyed(c) && !c->tenant_salt && !c->data_dir)
		PROBLEM(c->tenant.line ? c->tenant.line : 1,
			"tenant.api_key: needs tenant.salt, or a store.dir to keep a generated salt in");
	return problems;
}
#undef PROBLEM

bool config_tenant_keyed(const struct config *c)
{
	if (c->tenant.source == TENANT_API_KEY)
		return true;
	for (unsigned i = 0; i < c->nroutes; i++)
		if (c->routes[i].tenant.source == TENANT_API_KEY)
			return true;
	return false;
}

/* The generated salt: 32 hex digits from the kernel's random source, kept
 * in DIR/tenant-salt (mode 0600), so that a key's label stays the same
 * across restarts. */
int config_tenant_salt(struct config *c, bool create, char *err, size_t errlen)
{
	char path[4096], buf[130];
	int fd;
	ssize_t n;

	if (!config_tenant_keyed(c) || c->tenant_salt || !c->data_dir)
		return 0;
	snprintf(path, sizeof(path), "%s/tenant-salt", c->data_dir);
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd == -1 && errno == ENOENT && !create)
		return 0; /* -t: made when the server starts */
	if (fd == -1 && errno == ENOENT) {
		unsigned char raw[16];
		static const char digits[] = "0123456789abcdef";
		if (mkdir(c->data_dir, 0700) == -1 && errno != EEXIST) {
			snprintf(err, errlen, "tenant salt: cannot create %s: %s", c->data_dir, strerror(errno));
			return -1;
		}
		if (getentropy(raw, sizeof(raw)) == -1) {
			snprintf(err, errlen, "tenant salt: no random bytes: %s", strerror(errno));
			return -1;
		}
		for (size_t i = 0; i < sizeof(raw); i++) {
			buf[2 * i] = digits[raw[i] >> 4];
			buf[2 * i + 1] = digits[raw[i] & 15];
		}
		buf[32] = '\n';
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd != -1) {
			bool ok = write(fd, buf, 33) == 33;
			ok &= fsync(fd) == 0;
			close(fd);
			if (!ok) {
				unlink(path);
				snprintf(err, errlen, "tenant salt: cannot write %s", path);
				return -1;
			}
			log_info("tenant: generated a salt for the API keys' hash in %s", path);
		}
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	}
	if (fd == -1) {
		snprintf(err, errlen, "tenant salt: cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
		n--;
	if (n < 16 || n > 128) {
		snprintf(err, errlen, "tenant salt: %s holds no salt (16 to 128 bytes on one line)", path);
		return -1;
	}
	buf[n] = '\0';
	c->tenant_salt = config_strdup(c, buf);
	return c->tenant_salt ? 0 : -1;
}

static int parse_scaled(const char *s, uint64_t *out, const char *const units[], const uint64_t scale[], size_t nunits,
			uint64_t bare_scale)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || *s == '-' || *s == '+')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	uint64_t mul = bare_scale;
	if (*end) {
		size_t i;
		for (i = 0; i < nunits; i++)
			if (strcmp(end, units[i]) == 0)
				break;
		if (i == nunits)
			return -1;
		mul = scale[i];
	}
	if (mul && v > UINT64_MAX / mul)
		return -1;
	*out = (uint64_t)v * mul;
	return 0;
}

int config_parse_workers(const char *s, unsigned *out)
{
	char *end;
	unsigned long v;

	if (strcmp(s, "auto") == 0) {
		*out = 0;
		return 0;
	}
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < 1 || v > WORKERS_MAX)
		return -1;
	*out = (unsigned)v;
	return 0;
}

unsigned config_workers(const struct config *c)
{
	long n;

	if (c->workers)
		return c->workers;
	n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > WORKERS_MAX ? WORKERS_MAX : (unsigned)n;
}

int config_parse_size(const char *s, uint64_t *out)
{
	static const char *const units[] = { "k", "K", "m", "M", "g", "G" };
	static const uint64_t scale[] = { 1u << 10, 1u << 10, 1u << 20, 1u << 20, 1u << 30, 1u << 30 };
	return parse_scaled(s, out, units, scale, 6, 1);
}

int config_parse_listen(const char *s, struct sockaddr_storage *ss, unsigned *len)
{
	char host[64];
	const char *colon, *hs = s, *he;
	char *end;
	unsigned long port;

	if (!s)
		return -1;
	if (*s == '[') {
		he = strchr(s, ']');
		if (!he || he[1] != ':')
			return -1;
		hs = s + 1;
		colon = he + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return -1;
		he = colon;
	}
	if (he <= hs || (size_t)(he - hs) >= sizeof(host) || !colon[1])
		return -1;
	memcpy(host, hs, (size_t)(he - hs));
	host[he - hs] = '\0';
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || port > 65535 || colon[1] == '-' || colon[1] == '+')
		return -1;
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		*len = sizeof(*s4);
		return 0;
	}
	if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*s6);
		return 0;
	}
	return -1;
}

int config_parse_admin_listen(const char *spec, char *host, size_t hostcap, int *port, int *family)
{
	const char *colon, *h = spec, *hend;
	unsigned char buf[16];
	char *end;
	long p;

	if (!spec)
		return -1;
	if (spec[0] == '[') {
		hend = strchr(spec, ']');
		if (!hend || hend[1] != ':')
			return -1;
		h = spec + 1;
		colon = hend + 1;
	} else {
		colon = strrchr(spec, ':');
		if (!colon || memchr(spec, ':', (size_t)(colon - spec)))
			return -1;
		hend = colon;
	}
	if ((size_t)(hend - h) >= hostcap || hend == h)
		return -1;
	memcpy(host, h, (size_t)(hend - h));
	host[hend - h] = '\0';
	errno = 0;
	p = strtol(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || p < 0 || p > 65535)
		return -1;
	*port = (int)p;
	if (strcasecmp(host, "localhost") == 0)
		snprintf(host, hostcap, "127.0.0.1");
	if (inet_pton(AF_INET, host, buf) == 1)
		*family = AF_INET;
	else if (inet_pton(AF_INET6, host, buf) == 1)
		*family = AF_INET6;
	else
		return -1;
	return 0;
}

/* The authority of a URL after its scheme (`p`): an IP address in brackets
 * or a host name, up to ':' or one of `ends`, then an optional ":PORT" (0
 * in `port` when none) that one of `ends` or the string's end follows.
 * `rest` is left after it. `expect` says what the URL should look like. */
static int url_authority(const char *url, const char *p, const char *ends, const char *expect, char *host,
			 size_t hostcap, unsigned *port, const char **rest, char *err, size_t errlen)
{
	const char *hend;

	if (*p == '[') { /* [v6]:port */
		if (!(hend = strchr(p, ']'))) {
			snprintf(err, errlen, "unterminated IPv6 address in '%s'", url);
			return -1;
		}
		p++;
		*rest = hend + 1;
	} else {
		hend = p;
		while (*hend && *hend != ':' && !strchr(ends, *hend))
			hend++;
		*rest = hend;
	}
	if (hend == p) {
		snprintf(err, errlen, "no host in '%s'; expected %s", url, expect);
		return -1;
	}
	if ((size_t)(hend - p) >= hostcap) {
		snprintf(err, errlen, "the host name in '%.64s...' is longer than %zu characters", url, hostcap - 1);
		return -1;
	}
	memcpy(host, p, (size_t)(hend - p));
	host[hend - p] = '\0';
	*port = 0;
	if (**rest == ':') {
		const char *d = *rest + 1;
		size_t n = strspn(d, "0123456789");
		unsigned long v = n && n < 8 ? strtoul(d, NULL, 10) : 0;
		if (v < 1 || v > 65535 || (d[n] && !strchr(ends, d[n]))) {
			snprintf(err, errlen, "expected a port from 1 to 65535 in '%s'", url);
			return -1;
		}
		*port = (unsigned)v;
		*rest = d + n;
	}
	return 0;
}

int config_parse_url(const char *url, struct url_parts *out, char *err, size_t errlen)
{
	const char *p, *rest;
	unsigned port;

	if (strncmp(url, "http://", 7) == 0) {
		out->tls = false;
		p = url + 7;
	} else if (strncmp(url, "https://", 8) == 0) {
		out->tls = true;
		p = url + 8;
	} else {
		snprintf(err, errlen, "expected a URL like http://127.0.0.1:8000 or https://HOST, got '%s'", url);
		return -1;
	}
	if (url_authority(url, p, "/", "http://HOST[:PORT]", out->host, sizeof(out->host), &port, &rest, err, errlen) ==
	    -1)
		return -1;
	if (port)
		snprintf(out->port, sizeof(out->port), "%u", (unsigned)(uint16_t)port); /* checked: 1..65535 */
	else
		snprintf(out->port, sizeof(out->port), "%s", out->tls ? "443" : "80");
	if (*rest && strcmp(rest, "/") != 0) {
		snprintf(err, errlen,
			 "'%s': a path after the address is not supported; give only http[s]://HOST[:PORT] "
			 "(the request's own path is forwarded as is)",
			 url);
		return -1;
	}
	return 0;
}

int config_parse_duration_ms(const char *s, uint64_t *out)
{
	static const char *const units[] = { "ms", "s", "m", "h" };
	static const uint64_t scale[] = { 1, 1000, 60000, 3600000 };
	uint64_t ms;
	if (parse_scaled(s, &ms, units, scale, 4, 1000) == -1 || ms > DURATION_MAX_MS)
		return -1;
	*out = ms;
	return 0;
}

int config_parse_metrics_url(const char *url, struct metrics_url_parts *out, char *err, size_t errlen)
{
	const char *rest;
	unsigned port;
	size_t skip;

	if (strncmp(url, "http://", 7) == 0) {
		out->tls = false;
		skip = 7;
	} else if (strncmp(url, "https://", 8) == 0) {
		out->tls = true;
		skip = 8;
	} else {
		snprintf(err, errlen,
			 "expected a URL like http://127.0.0.1:8000/metrics (http:// or https://), got '%s'", url);
		return -1;
	}
	if (url_authority(url, url + skip, "/?", "http[s]://HOST[:PORT]/PATH", out->host, sizeof(out->host), &port,
			  &rest, err, errlen) == -1)
		return -1;
	out->port = port ? port : out->tls ? 443 : 80;
	if (*rest && *rest != '/' && *rest != '?') {
		snprintf(err, errlen, "unexpected '%c' after the host in '%s'", *rest, url);
		return -1;
	}
	if (strlen(rest) + 2 > sizeof(out->path)) {
		snprintf(err, errlen, "the path of '%.64s...' is longer than %zu characters", url,
			 sizeof(out->path) - 2);
		return -1;
	}
	if (strcspn(rest, " \t\r\n") != strlen(rest)) {
		snprintf(err, errlen, "white space in '%s'", url);
		return -1;
	}
	if (*rest == '/') {
		memcpy(out->path, rest, strlen(rest) + 1);
	} else if (strlen(rest) + 9 > sizeof(out->path)) {
		snprintf(err, errlen, "the query of '%.64s...' is too long", url);
		return -1;
	} else {
		memcpy(out->path, "/metrics", 8);
		memcpy(out->path + 8, rest, strlen(rest) + 1);
	}
	return 0;
}
