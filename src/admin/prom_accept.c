/*
 * prom_accept.c — content negotiation of /metrics: the protobuf exposition
 * for a scraper that asks for it, the text format for everyone else.
 *
 * An Accept header is a comma-separated list of media ranges, each a type
 * and `;`-separated parameters, one of which may be the q weight. Only what
 * the decision needs is parsed: the type, the proto and encoding parameters
 * of the protobuf range, and q. A malformed range counts for nothing.
 */
#include "prom_accept.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The q of a media range's parameters (1 when absent, 0 when unreadable). */
static double q_of(const char *params, size_t len)
{
	for (size_t i = 0; i < len;) {
		while (i < len && (params[i] == ';' || params[i] == ' ' || params[i] == '\t'))
			i++;
		if (len - i >= 2 && (params[i] == 'q' || params[i] == 'Q') && params[i + 1] == '=') {
			char num[16];
			size_t k = 0;
			for (i += 2; i < len && k + 1 < sizeof(num) && params[i] != ';'; i++)
				num[k++] = params[i];
			num[k] = '\0';
			char *end;
			double q = strtod(num, &end);
			return end == num || q < 0 || q > 1 || q != q ? 0 : q;
		}
		while (i < len && params[i] != ';')
			i++;
	}
	return 1;
}

/* Whether parameter `name` of a media range is `want`, quoted or not, with
 * no regard to case. */
static bool param_is(const char *params, size_t len, const char *name, const char *want)
{
	size_t nl = strlen(name), wl = strlen(want);

	for (size_t i = 0; i < len;) {
		while (i < len && (params[i] == ';' || params[i] == ' ' || params[i] == '\t'))
			i++;
		size_t start = i;
		while (i < len && params[i] != ';')
			i++;
		const char *p = params + start;
		size_t pl = i - start;
		while (pl && (p[pl - 1] == ' ' || p[pl - 1] == '\t'))
			pl--;
		if (pl <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != '=')
			continue;
		p += nl + 1;
		pl -= nl + 1;
		if (pl >= 2 && p[0] == '"' && p[pl - 1] == '"') {
			p++;
			pl -= 2;
		}
		return pl == wl && strncasecmp(p, want, wl) == 0;
	}
	return false;
}

bool prom_accept_protobuf(const char *accept)
{
	static const char proto_type[] = "application/vnd.google.protobuf";
	double q_proto = 0, q_text = 0;

	if (!accept)
		return false;
	for (const char *p = accept; *p;) {
		while (*p == ',' || *p == ' ' || *p == '\t')
			p++;
		size_t len = strcspn(p, ",");
		size_t tl = strcspn(p, ";,");
		const char *params = p + tl;
		size_t plen = len - tl;
		while (tl && (p[tl - 1] == ' ' || p[tl - 1] == '\t'))
			tl--;
		double q = q_of(params, plen);
		if (tl == sizeof(proto_type) - 1 && strncasecmp(p, proto_type, tl) == 0) {
			if (param_is(params, plen, "proto", "io.prometheus.client.MetricFamily") &&
			    param_is(params, plen, "encoding", "delimited") && q > q_proto)
				q_proto = q;
		} else if ((tl == 10 && strncasecmp(p, "text/plain", 10) == 0) ||
			   (tl == 6 && strncasecmp(p, "text/*", 6) == 0) || (tl == 3 && strncmp(p, "*/*", 3) == 0)) {
			if (q > q_text)
				q_text = q;
		}
		p += len;
	}
	return q_proto > 0 && q_proto >= q_text;
}
