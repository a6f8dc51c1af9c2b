/*
 * admin_gate.c — the admin API's checks before a handler runs (see
 * admin_gate.h for the order and why each exists).
 *
 * Invariants: the token is read only by token_equal(), in time that does not
 * depend on where a wrong guess differs, and never copied into a message.
 */
#include "admin_gate.h"

#include <arpa/inet.h>
#include <event2/keyvalq_struct.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

static const char *const admin_no_params[] = { NULL };
static const char *const admin_stats_params[] = {
	"window", "route", "upstream", "model", "cold", "by", "tenant", NULL
};
/* /stats/prompt and /stats/curve: what /stats takes, and what keys the curve */
static const char *const admin_prompt_params[] = { "window", "route", "upstream", "model", "cold", "by", NULL };
static const char *const admin_recent_params[] = { "n", NULL };
static const char *const admin_history_params[] = { "step", "route", "upstream", "model", "cold", NULL };
static const char *const admin_compare_params[] = { "route", "window", "cold", NULL };
static const char *const admin_workload_params[] = { "route", "model", NULL };

const struct admin_route admin_routes[ADMIN_R__COUNT] = {
#define X(e, path, methods, allow, write, params, fn) [ADMIN_R_##e] = { path, methods, allow, write, params },
	ADMIN_ROUTES(X)
#undef X
};

/* Splits "name[:port]" / "[v6][:port]"; false when malformed. */
static bool host_split(const char *host, char *name, size_t cap)
{
	const char *end, *rest;

	if (host[0] == '[') {
		end = strchr(host, ']');
		if (!end)
			return false;
		rest = end + 1;
		end++; /* the brackets are part of the name */
	} else {
		end = strchr(host, ':');
		rest = end ? end : host + strlen(host);
		end = rest;
	}
	if ((size_t)(end - host) >= cap || end == host)
		return false;
	memcpy(name, host, (size_t)(end - host));
	name[end - host] = '\0';
	if (*rest) {
		size_t digits = strspn(rest + 1, "0123456789");
		if (rest[0] != ':' || digits == 0 || digits > 5 || rest[1 + digits])
			return false;
	}
	return true;
}

static bool ip_literal(const char *name)
{
	unsigned char buf[16];
	char v6[INET6_ADDRSTRLEN + 2];
	size_t n = strlen(name);

	if (inet_pton(AF_INET, name, buf) == 1)
		return true;
	if (n > 2 && n < sizeof(v6) && name[0] == '[' && name[n - 1] == ']') {
		memcpy(v6, name + 1, n - 2);
		v6[n - 2] = '\0';
		return inet_pton(AF_INET6, v6, buf) == 1;
	}
	return false;
}

int admin_host_allowed(const char *host, const char *bound_host)
{
	static const char *const loopback_names[] = { "localhost", "127.0.0.1", "[::1]" };
	char name[256];

	if (!host || !host_split(host, name, sizeof(name)))
		return 0;
	for (size_t i = 0; i < sizeof(loopback_names) / sizeof(loopback_names[0]); i++)
		if (strcasecmp(name, loopback_names[i]) == 0)
			return 1;
	if (bound_host && strcasecmp(name, bound_host) == 0)
		return 1;
	/* Bound to every address: any address literal names us. A DNS
	 * rebinding attack needs a host name, never a literal. */
	if (bound_host && (strcmp(bound_host, "0.0.0.0") == 0 || strcmp(bound_host, "[::]") == 0))
		return ip_literal(name);
	return 0;
}

/* The host part of an Origin ("http://host:port"); NULL for "null" and the
 * like, which never name us. */
static const char *origin_host(const char *origin)
{
	if (strncasecmp(origin, "http://", 7) == 0)
		return origin + 7;
	if (strncasecmp(origin, "https://", 8) == 0)
		return origin + 8;
	return NULL;
}

/* Same time whatever the input, for a given token length. */
static bool token_equal(const char *given, size_t glen, const char *want, size_t wlen)
{
	volatile unsigned char d = (unsigned char)(glen != wlen);

	for (size_t i = 0; i < wlen; i++)
		d |= (unsigned char)want[i] ^ (unsigned char)(i < glen ? given[i] : 0);
	return d == 0;
}

/* The bearer credential of an Authorization header, or NULL. */
static const char *bearer_of(const char *auth, size_t *len)
{
	const char *p, *end;

	if (!auth || strncasecmp(auth, "Bearer ", 7) != 0)
		return NULL;
	p = auth + 7;
	while (*p == ' ')
		p++;
	end = p + strlen(p);
	while (end > p && end[-1] == ' ')
		end--;
	*len = (size_t)(end - p);
	return *len ? p : NULL;
}

static void refuse(struct admin_verdict *v, int status, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void refuse(struct admin_verdict *v, int status, const char *param, const char *fmt, ...)
{
	va_list ap;

	v->status = status;
	snprintf(v->param, sizeof(v->param), "%.64s", param ? param : "");
	va_start(ap, fmt);
	vsnprintf(v->message, sizeof(v->message), fmt, ap);
	va_end(ap);
}

/* Writes pass the origin and token checks; false after refusing. */
static bool write_allowed(const struct admin_request *r, const struct admin_identity *id, struct admin_verdict *v)
{
	const char *given;
	size_t glen = 0;

	/* A browser page elsewhere may POST here without preflight; refuse it
	 * before anything else unless it carries credentials. */
	if (r->origin && !r->authorization) {
		const char *oh = origin_host(r->origin);
		if (!oh || !admin_host_allowed(oh, id->bound_host)) {
			refuse(v, 403, NULL, "cross-origin request refused (Origin %.100s)", r->origin);
			return false;
		}
	}
	if (!id->token) {
		refuse(v, 403, NULL,
		       "writes are disabled: no admin token is set; start tokentap with --admin-token-file PATH or the "
		       "TOKENTAP_ADMIN_TOKEN environment variable, then send Authorization: Bearer <token>");
		return false;
	}
	given = bearer_of(r->authorization, &glen);
	if (!given || !token_equal(given, glen, id->token, id->token_len)) {
		v->www_authenticate = true;
		refuse(v, 401, NULL, "%s", given ? "wrong bearer token" : "needs Authorization: Bearer <token>");
		return false;
	}
	return true;
}

/* Parses the query into `q`, refusing names not in `allowed` and names
 * given twice; false after refusing (q then empty). */
static bool params_parse(const char *query, const char *const *allowed, struct evkeyvalq *q, struct admin_verdict *v)
{
	struct evkeyval *kv, *other;

	if (!query || !*query)
		return true;
	/* a name without '=' (`?window`): libevent calls the whole query
	 * malformed; say which parameter lacks its value */
	for (const char *p = query; *p;) {
		size_t len = strcspn(p, "&");
		if (len && !memchr(p, '=', len)) {
			char name[65];
			snprintf(name, sizeof(name), "%.*s", (int)(len < 64 ? len : 64), p);
			refuse(v, 400, name, "parameter '%s' has no value; write %s=VALUE", name, name);
			return false;
		}
		p += len + (p[len] == '&');
	}
	if (evhttp_parse_query_str(query, q) == -1) {
		evhttp_clear_headers(q);
		refuse(v, 400, NULL, "malformed query string");
		return false;
	}
	TAILQ_FOREACH (kv, q, next) {
		size_t i;
		for (i = 0; allowed[i]; i++)
			if (strcmp(kv->key, allowed[i]) == 0)
				break;
		if (!allowed[i]) {
			char known[128] = "";
			for (size_t j = 0; allowed[j]; j++) {
				strncat(known, j ? ", " : "", sizeof(known) - strlen(known) - 1);
				strncat(known, allowed[j], sizeof(known) - strlen(known) - 1);
			}
			refuse(v, 400, kv->key, "unknown parameter '%.64s'; this endpoint takes %s", kv->key,
			       allowed[0] ? known : "no parameters");
			goto fail;
		}
		for (other = TAILQ_NEXT(kv, next); other; other = TAILQ_NEXT(other, next)) {
			if (strcmp(other->key, kv->key) == 0) {
				refuse(v, 400, kv->key, "parameter '%.64s' given more than once", kv->key);
				goto fail;
			}
		}
	}
	return true;
fail:
	evhttp_clear_headers(q);
	return false;
}

void admin_gate(const struct admin_request *r, const struct admin_identity *id, struct evkeyvalq *params,
		struct admin_verdict *v)
{
	const char *path = r->path && *r->path ? r->path : "/";
	const struct admin_route *rt = NULL;

	memset(v, 0, sizeof(*v));
	v->route = -1;
	TAILQ_INIT(params);
	/* No Host at all is HTTP/1.0 or a hand-made request, never a browser
	 * tricked by DNS rebinding, which always sends the name it resolved. */
	if (r->host && !admin_host_allowed(r->host, id->bound_host)) {
		refuse(v, 403, NULL, "Host '%.100s' is not this admin API (use %s, localhost or 127.0.0.1)", r->host,
		       id->listen_addr);
		return;
	}
	for (int i = 0; i < ADMIN_R__COUNT; i++)
		if (strcmp(path, admin_routes[i].path) == 0) {
			rt = &admin_routes[i];
			v->route = i;
		}
	if (!rt) {
		refuse(v, 404, NULL, "no such endpoint: %.200s (see docs/admin-api.md)", path);
		return;
	}
	if (!(r->method & rt->methods)) {
		v->allow = rt->allow;
		refuse(v, 405, NULL, "%s takes %s only", rt->path, rt->allow);
		return;
	}
	if (rt->write && !write_allowed(r, id, v))
		return;
	params_parse(r->query, rt->params, params, v);
}
