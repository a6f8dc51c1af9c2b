/*
 * fuzz_admin_gate.c — libFuzzer target: the admin API's request gate
 * (src/admin/admin_gate.c), which decides from a request's method, target and
 * Host / Origin / Authorization headers which endpoint runs, if any.
 *
 * Input: a method selector byte, then up to four NUL-free fields separated
 * by '\n': the request target (parsed by libevent as evhttp does), Host,
 * Origin, Authorization; a missing field is an absent header. The gate is
 * given the token "s3cr3t-token" and the bound host 127.0.0.1.
 * Checked, independently of the gate's own code:
 *   - the status is 0 or one of 400, 401, 403, 404, 405, and the message
 *     is NUL-terminated;
 *   - a request that runs names an endpoint exactly, with an allowed
 *     method, and a Host that is absent or a loopback name;
 *   - a write runs only with "Bearer s3cr3t-token" (case-insensitive
 *     scheme, spaces around the credential) — never on a near miss;
 *   - every parameter handed to the handler is one the endpoint takes,
 *     and none twice; a refused request hands over none;
 *   - the token never appears in a refusal's message.
 */
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include "admin_gate.h"
#include "fuzz_check.h"

#define TOKEN "s3cr3t-token"

static const unsigned methods[] = { EVHTTP_REQ_GET,   EVHTTP_REQ_POST,	  EVHTTP_REQ_HEAD,
				    EVHTTP_REQ_PUT,   EVHTTP_REQ_DELETE,  EVHTTP_REQ_OPTIONS,
				    EVHTTP_REQ_TRACE, EVHTTP_REQ_CONNECT, EVHTTP_REQ_PATCH };

/* The credential of an Authorization value, by this file's own reading. */
static bool carries_token(const char *auth)
{
	const char *p, *end;

	if (!auth || strncasecmp(auth, "Bearer ", 7) != 0)
		return false;
	for (p = auth + 7; *p == ' '; p++)
		;
	for (end = p + strlen(p); end > p && end[-1] == ' '; end--)
		;
	return (size_t)(end - p) == strlen(TOKEN) && memcmp(p, TOKEN, strlen(TOKEN)) == 0;
}

static bool loopback_host(const char *host)
{
	static const char *const names[] = { "localhost", "127.0.0.1", "[::1]" };
	size_t n = host[0] == '[' ? (size_t)(strchr(host, ']') ? strchr(host, ']') - host + 1 : 0) : strcspn(host, ":");
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (n == strlen(names[i]) && strncasecmp(host, names[i], n) == 0)
			return true;
	return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *fields[4] = { NULL, NULL, NULL, NULL };
	char *buf, *p;
	struct evhttp_uri *uri;
	struct evkeyvalq params;
	struct admin_verdict v;

	if (size < 1 || memchr(data, '\0', size))
		return 0;
	buf = malloc(size);
	CHECK(buf != NULL);
	memcpy(buf, data + 1, size - 1);
	buf[size - 1] = '\0';
	p = buf;
	for (int i = 0; i < 4 && p; i++) {
		fields[i] = p;
		p = strchr(p, '\n');
		if (p)
			*p++ = '\0';
	}
	uri = evhttp_uri_parse_with_flags(fields[0] ? fields[0] : "/", 0);
	if (!uri) { /* evhttp answers 400 itself before the gate */
		free(buf);
		return 0;
	}
	struct admin_request r = { methods[data[0] % (sizeof(methods) / sizeof(methods[0]))],
				   evhttp_uri_get_path(uri),
				   evhttp_uri_get_query(uri),
				   fields[1],
				   fields[2],
				   fields[3] };
	struct admin_identity id = { "127.0.0.1", "127.0.0.1:9901", TOKEN, strlen(TOKEN) };

	admin_gate(&r, &id, &params, &v);
	CHECK(memchr(v.message, '\0', sizeof(v.message)) != NULL);
	CHECK(memchr(v.param, '\0', sizeof(v.param)) != NULL);
	if (v.status) {
		CHECK(v.status == 400 || v.status == 401 || v.status == 403 || v.status == 404 || v.status == 405);
		CHECK(TAILQ_EMPTY(&params));
		CHECK(strstr(v.message, TOKEN) == NULL || (r.path && strstr(r.path, TOKEN)) ||
		      (r.query && strstr(r.query, TOKEN)) || (r.host && strstr(r.host, TOKEN)) ||
		      (r.origin && strstr(r.origin, TOKEN)));
	} else {
		const char *path = r.path && *r.path ? r.path : "/";
		CHECK(v.route >= 0 && v.route < ADMIN_R__COUNT);
		const struct admin_route *rt = &admin_routes[v.route];
		CHECK(strcmp(path, rt->path) == 0);
		CHECK(r.method & rt->methods);
		CHECK(!r.host || loopback_host(r.host));
		if (rt->write)
			CHECK(carries_token(r.authorization));
		struct evkeyval *kv, *other;
		TAILQ_FOREACH (kv, &params, next) {
			bool known = false;
			for (size_t i = 0; rt->params[i]; i++)
				known |= strcmp(kv->key, rt->params[i]) == 0;
			CHECK(known);
			for (other = TAILQ_NEXT(kv, next); other; other = TAILQ_NEXT(other, next))
				CHECK(strcmp(other->key, kv->key) != 0);
		}
		evhttp_clear_headers(&params);
	}
	evhttp_uri_free(uri);
	free(buf);
	return 0;
}
