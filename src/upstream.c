/*
 * upstream.c — upstream resolution, connecting, and the idle pool.
 */
#include "upstream.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "tls.h"

static int parse_url(const char *url, char *host, size_t hostlen, char *port, size_t portlen, bool *tls, char *err,
		     size_t errlen)
{
	const char *p, *hend, *pstart = NULL;

	if (strncmp(url, "http://", 7) == 0) {
		*tls = false;
		p = url + 7;
	} else if (strncmp(url, "https://", 8) == 0) {
		*tls = true;
		p = url + 8;
	} else {
		snprintf(err, errlen, "upstream %s: expected a URL like http://127.0.0.1:8000", url);
		return -1;
	}
	if (*p == '[') { /* [v6]:port */
		hend = strchr(p, ']');
		if (!hend) {
			snprintf(err, errlen, "upstream %s: unterminated IPv6 address", url);
			return -1;
		}
		p++;
		if (hend[1] == ':')
			pstart = hend + 2;
		else if (hend[1] && hend[1] != '/')
			goto bad;
	} else {
		hend = p + strcspn(p, ":/");
		if (*hend == ':')
			pstart = hend + 1;
	}
	if (hend == p || (size_t)(hend - p) >= hostlen)
		goto bad;
	memcpy(host, p, (size_t)(hend - p));
	host[hend - p] = '\0';
	if (pstart) {
		size_t n = strspn(pstart, "0123456789");
		if (n == 0 || n >= portlen || (pstart[n] && strcmp(pstart + n, "/") != 0))
			goto bad;
		memcpy(port, pstart, n);
		port[n] = '\0';
		if (atoi(port) <= 0 || atoi(port) > 65535)
			goto bad;
	} else {
		const char *rest = hend + (*hend == ']');
		if (*rest && strcmp(rest, "/") != 0) {
			snprintf(err, errlen, "upstream %s: a path after the address is not supported", url);
			return -1;
		}
		snprintf(port, portlen, "%s", *tls ? "443" : "80");
	}
	return 0;
bad:
	snprintf(err, errlen, "upstream %s: expected http://HOST[:PORT] with a port from 1 to 65535", url);
	return -1;
}

struct upstream *upstream_new(struct event_base *base, const struct config *cfg, const struct upstream_conf *uc,
			      char *err, size_t errlen)
{
	char host[256], port[8];
	struct addrinfo hints, *res = NULL;
	struct upstream *up;
	int rc;

	bool tls;

	if (parse_url(uc->url, host, sizeof(host), port, sizeof(port), &tls, err, errlen) == -1)
		return NULL;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "upstream %s: cannot resolve %s: %s", uc->name, host, gai_strerror(rc));
		return NULL;
	}
	up = calloc(1, sizeof(*up));
	if (!up || !(up->name = strdup(uc->name)) || !(up->url = strdup(uc->url))) {
		if (up)
			free(up->name);
		free(up);
		freeaddrinfo(res);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	memcpy(&up->addr, res->ai_addr, res->ai_addrlen);
	up->addrlen = res->ai_addrlen;
	freeaddrinfo(res);
	up->base = base;
	up->tls = tls;
	snprintf(up->host, sizeof(up->host), "%s", host);
	TAILQ_INIT(&up->idle);
	TAILQ_INIT(&up->waiting);
	if (!upstream_adopt(up, cfg, uc)) {
		free(up->name);
		free(up->url);
		free(up);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	return up;
}

static void conf_release(struct upstream_conf *c)
{
	free((char *)c->name);
	free((char *)c->url);
	free((char *)c->tls_ca_file);
	free((char *)c->tls_server_name);
	for (unsigned i = 0; i < c->nlabels; i++) {
		free((char *)c->labels[i].key);
		free((char *)c->labels[i].value);
	}
	memset(c, 0, sizeof(*c));
}

/* A deep copy: the config it comes from may be freed first. */
static int conf_copy(struct upstream_conf *dst, const struct upstream_conf *src)
{
	*dst = *src;
	dst->name = strdup(src->name);
	dst->url = strdup(src->url);
	dst->tls_ca_file = src->tls_ca_file ? strdup(src->tls_ca_file) : NULL;
	dst->tls_server_name = src->tls_server_name ? strdup(src->tls_server_name) : NULL;
	for (unsigned i = 0; i < src->nlabels; i++) {
		dst->labels[i].key = strdup(src->labels[i].key);
		dst->labels[i].value = strdup(src->labels[i].value);
	}
	bool ok = dst->name && dst->url && (!src->tls_ca_file || dst->tls_ca_file) &&
		  (!src->tls_server_name || dst->tls_server_name);
	for (unsigned i = 0; i < src->nlabels; i++)
		ok = ok && dst->labels[i].key && dst->labels[i].value;
	if (!ok) {
		conf_release(dst);
		return -1;
	}
	return 0;
}

struct upstream *upstream_adopt(struct upstream *up, const struct config *cfg, const struct upstream_conf *uc)
{
	struct upstream_conf copy;

	if (conf_copy(&copy, uc) == -1)
		return up->refs ? up : NULL; /* keep the settings it had */
	if (up->tls) {
		char err[512];
		SSL_CTX *ctx = tls_client_ctx(copy.tls_verify, copy.tls_ca_file, err, sizeof(err));
		if (!ctx) {
			log_error("upstream %s: %s", up->name, err);
			conf_release(&copy);
			return up->refs ? up : NULL;
		}
		tls_ctx_free(up->tls_ctx);
		up->tls_ctx = ctx;
	}
	conf_release(&up->conf);
	up->conf = copy;
	up->refs++;
	up->pool_idle_timeout_ms = cfg->pool_idle_timeout_ms;
	up->pool_max_idle = cfg->pool_max_idle;
	up->cold_idle_ms = cfg->cold_idle_ms;
	up->connect_timeout_ms = uc->connect_timeout_ms ? uc->connect_timeout_ms : cfg->connect_timeout_ms;
	up->first_byte_timeout_ms = uc->first_byte_timeout_ms ? uc->first_byte_timeout_ms : cfg->first_byte_timeout_ms;
	up->idle_timeout_ms = uc->idle_timeout_ms ? uc->idle_timeout_ms : cfg->idle_timeout_ms;
	return up;
}

void upstream_ref(struct upstream *up)
{
	up->refs++;
}

bool upstream_same(const struct upstream *up, const struct upstream_conf *uc)
{
	return strcmp(up->name, uc->name) == 0 && strcmp(up->url, uc->url) == 0;
}

enum admit upstream_admit(struct upstream *up, struct up_waiter *w)
{
	unsigned max = up->conf.max_concurrency;

	if (!max || (up->active < max && up->queued == 0)) {
		up->active++;
		return ADMIT_NOW;
	}
	if (up->queued >= up->conf.queue_max) {
		up->rejected++;
		return ADMIT_FULL;
	}
	TAILQ_INSERT_TAIL(&up->waiting, w, link);
	w->queued = true;
	up->queued++;
	return ADMIT_QUEUED;
}

void upstream_leave(struct upstream *up)
{
	struct up_waiter *w;

	if (up->active)
		up->active--;
	/* FIFO: the oldest waiter takes the slot just freed */
	if ((w = TAILQ_FIRST(&up->waiting)) && (!up->conf.max_concurrency || up->active < up->conf.max_concurrency)) {
		TAILQ_REMOVE(&up->waiting, w, link);
		w->queued = false;
		up->queued--;
		up->active++;
		w->ready(w);
	}
}

void upstream_cancel(struct upstream *up, struct up_waiter *w)
{
	if (!w->queued)
		return;
	TAILQ_REMOVE(&up->waiting, w, link);
	w->queued = false;
	up->queued--;
}

static void upconn_close(struct upconn *c)
{
	if (c->bev)
		bufferevent_free(c->bev);
	free(c);
}

void upstream_free(struct upstream *up)
{
	struct upconn *c;

	if (!up || --up->refs > 0)
		return;
	while ((c = TAILQ_FIRST(&up->idle))) {
		TAILQ_REMOVE(&up->idle, c, link);
		upconn_close(c);
	}
	conf_release(&up->conf);
	tls_ctx_free(up->tls_ctx);
	free(up->name);
	free(up->url);
	free(up);
}

static void pool_remove(struct upconn *c)
{
	TAILQ_REMOVE(&c->up->idle, c, link);
	c->up->n_idle--;
}

/* An idle connection must stay silent: data, a close or the idle timeout all
 * end it. */
static void on_idle_read(struct bufferevent *bev, void *arg)
{
	struct upconn *c = arg;
	log_debug("upstream %s: idle connection u%llu sent unexpected data; closing", c->up->name,
		  (unsigned long long)c->id);
	pool_remove(c);
	upconn_close(c);
}

static void on_idle_event(struct bufferevent *bev, short what, void *arg)
{
	struct upconn *c = arg;
	pool_remove(c);
	upconn_close(c);
}

struct upconn *upstream_acquire(struct upstream *up, bool *reused)
{
	struct upconn *c = TAILQ_FIRST(&up->idle);

	if (c) {
		pool_remove(c);
		bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
		bufferevent_set_timeouts(c->bev, NULL, NULL);
		up->in_flight++;
		up->reused++;
		*reused = true;
		return c;
	}
	*reused = false;
	return upstream_connect_new(up);
}

struct upconn *upstream_connect_new(struct upstream *up)
{
	struct upconn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->up = up;
	c->id = ++up->opened;
	c->bev = up->tls ? tls_bev_connect(up->base, up->tls_ctx, up->conf.tls_server_name ? up->conf.tls_server_name : up->host,
					   up->conf.tls_verify)
			 : bufferevent_socket_new(up->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!c->bev) {
		free(c);
		return NULL;
	}
	/* Errors, refused connections included, arrive on the caller's event
	 * callback; a -1 here means not even a socket could be made. */
	if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&up->addr, (int)up->addrlen) == -1) {
		upconn_close(c);
		return NULL;
	}
	int one = 1;
	setsockopt(bufferevent_getfd(c->bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	up->in_flight++;
	return c;
}

bool upstream_dispatch_cold(const struct upstream *up, bool reused, uint64_t now_ns)
{
	if (reused)
		return false;
	if (up->completed == 0 || up->failing)
		return true;
	/* in_flight counts this request: nothing else ran meanwhile */
	return up->active <= 1 && now_ns - up->last_done_ns > up->cold_idle_ms * 1000000u;
}

void upstream_note_result(struct upstream *up, bool responded, uint64_t now_ns)
{
	if (responded) {
		up->completed++;
		up->last_done_ns = now_ns;
		up->failing = false;
	} else {
		up->failing = true;
	}
}

void upstream_release(struct upconn *c, bool reusable)
{
	struct upstream *up;

	if (!c)
		return;
	up = c->up;
	up->in_flight--;
	if (!reusable || !c->connected || up->n_idle >= up->pool_max_idle ||
	    evbuffer_get_length(bufferevent_get_input(c->bev)) != 0 ||
	    evbuffer_get_length(bufferevent_get_output(c->bev)) != 0) {
		upconn_close(c);
		return;
	}
	struct timeval tv = { (time_t)(up->pool_idle_timeout_ms / 1000),
			      (suseconds_t)(up->pool_idle_timeout_ms % 1000) * 1000 };
	bufferevent_setcb(c->bev, on_idle_read, NULL, on_idle_event, c);
	bufferevent_set_timeouts(c->bev, &tv, NULL);
	bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	bufferevent_enable(c->bev, EV_READ);
	TAILQ_INSERT_HEAD(&up->idle, c, link); /* most recently used first: warmest socket */
	up->n_idle++;
}
