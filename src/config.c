/*
 * config.c — defaults and value parsers for tokentap's settings.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

void config_defaults(struct config *c)
{
	memset(c, 0, sizeof(*c));
	c->listen = "127.0.0.1:8080";
	c->max_body_size = 32u << 20; /* prompts with images are large */
	c->max_header_size = 32u << 10;
	c->max_headers = 100;
	c->header_timeout_ms = 30000;
	c->keepalive_timeout_ms = 75000;
	c->connect_timeout_ms = 5000;
	/* Long prompts, full queues: the first byte of a stream can take minutes. */
	c->first_byte_timeout_ms = 300000;
	c->idle_timeout_ms = 300000;
	c->pool_idle_timeout_ms = 60000;
	c->pool_max_idle = 256;
	c->stream_buffer = 256u << 10;
	c->max_event_size = 1u << 20;
	c->body_inspect_max = 64u << 10;
	c->data_dir = "tokentap-data";
	c->flush_ms = 1000;
	c->max_models = 32;
	c->slo_ttft_ms = 2000;
	c->slo_tpot_ms = 100;
	c->cold_idle_ms = 60000;
	c->minute_retention_s = 24 * 3600;
	c->hour_retention_s = 30 * 24 * 3600;
}

static int parse_scaled(const char *s, uint64_t *out, const char *const units[], const uint64_t scale[],
			size_t nunits, uint64_t bare_scale)
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

int config_parse_duration_ms(const char *s, uint64_t *out)
{
	static const char *const units[] = { "ms", "s", "m", "h" };
	static const uint64_t scale[] = { 1, 1000, 60000, 3600000 };
	return parse_scaled(s, out, units, scale, 4, 1000);
}
