/*
 * proxy.c — the listener and the proxy object: listening sockets, accept
 * (with the connection cap), the pause after a failed accept, a new
 * router generation, and draining at shutdown. Each accepted connection
 * becomes a client (client.c), which parses its requests (request.c) and
 * runs their exchanges with the upstreams (exchange.c):
 *
 *   proxy ─▶ client ─▶ request ─▶ exchange ─▶ meter
 *
 * The clients of one proxy share struct client_set, embedded here, so that
 * nothing below reads the proxy.
 */
#include "proxy.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "config.h"
#include "fdlimit.h"
#include "log.h"
#include "loop.h"
#include "mirror.h"
#include "router.h"
#include "rxstamp.h"
#include "timeline.h"

struct proxy {
	struct client_set set; /* set.base, set.renv.router (the current generation; one reference held) */
	struct event *drain_timer;
	struct listener {
		struct evconnlistener *lev;
		struct proxy *px;
		unsigned index;		       /* into the router's tls_listen[] */
		struct sockaddr_storage bound; /* the address it got */
		socklen_t boundlen;
		/* whether accepted sockets come with TCP_NODELAY and the receive
		 * stamps set on the listener (Linux copies both): 0 not known
		 * yet, 1 they do, -1 each connection sets them itself */
		signed char inherits;
	} listeners[LISTENERS_MAX];
	unsigned nlisteners;
	char listen_addr[LISTENERS_MAX * 64]; /* "ADDR:PORT, ADDR:PORT" */
	_Atomic unsigned clients_own;	      /* set.clients_all when the proxy is alone */
	struct evbuffer *tail;		      /* a response's last bytes between its upstream and its client */
	bool cap_warned;
	struct event *accept_timer; /* ends the listeners' pause after a failed accept */
};

static inline const struct config *pcfg(const struct proxy *px)
{
	return &px->set.renv.router->cfg;
}

/* ---- small helpers ---- */

static void format_addr(const struct sockaddr *sa, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)sa;
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		snprintf(out, len, "[%s]:%u", host, ntohs(s6->sin6_port));
	} else if (sa->sa_family == AF_INET && len >= sizeof("255.255.255.255:65535")) {
		/* what inet_ntop and "%s:%u" write, without the formatting engine:
		 * once per connection */
		const struct sockaddr_in *s4 = (const void *)sa;
		const unsigned char *b = (const unsigned char *)&s4->sin_addr;
		char *p = out;
		for (int i = 0; i < 4; i++) {
			unsigned v = b[i];
			if (v >= 100)
				*p++ = (char)('0' + v / 100);
			if (v >= 10)
				*p++ = (char)('0' + v / 10 % 10);
			*p++ = (char)('0' + v % 10);
			*p++ = i < 3 ? '.' : ':';
		}
		char digits[5];
		int n = 0;
		for (unsigned port = ntohs(s4->sin_port); n == 0 || port; port /= 10)
			digits[n++] = (char)('0' + port % 10);
		while (n)
			*p++ = digits[--n];
		*p = '\0';
	} else {
		const struct sockaddr_in *s4 = (const void *)sa;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		snprintf(out, len, "%s:%u", host, ntohs(s4->sin_port));
	}
}

/* Whether the first socket a listener accepted has the options the listener
 * was given: then no connection after it needs two setsockopt calls. */
static bool sockets_inherit(int fd)
{
	int nodelay = 0, stamps = 0;
	socklen_t len = sizeof(nodelay), len2 = sizeof(stamps);

	return getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len) == 0 && nodelay &&
	       getsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &stamps, &len2) == 0 && stamps;
}

static void on_accept(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
	struct listener *l = arg;
	struct proxy *px = l->px;
	const struct router *rt = px->set.renv.router;
	struct ssl_ctx_st *tls = l->index < rt->nlisteners ? rt->tls_listen[l->index] : NULL;
	char peer[64];
	int one = 1;

	if (px->set.draining) {
		evutil_closesocket(fd);
		return;
	}
	/* counted from here; client_free uncounts */
	if (atomic_fetch_add(px->set.clients_all, 1) >= pcfg(px)->max_connections) {
		atomic_fetch_sub(px->set.clients_all, 1);
		/* at the cap: a short answer and close, never touching the
		 * connections (and streams) already running */
		static const char busy[] =
			"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
			"content-length: 92\r\nconnection: close\r\n\r\n"
			"{\"error\":{\"message\":\"too many connections; try again later\","
			"\"type\":\"overloaded\",\"code\":503}}";
		ssize_t w = send(fd, busy, sizeof(busy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		(void)w;
		evutil_closesocket(fd);
		if (!px->cap_warned) {
			px->cap_warned = true;
			log_warn("connection cap of %u reached: new connections get 503", pcfg(px)->max_connections);
		}
		return;
	}
	px->cap_warned = false;
	if (l->inherits == 0)
		l->inherits = sockets_inherit(fd) ? 1 : -1;
	if (l->inherits < 0) {
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (!tls)
			(void)rxstamp_enable(fd);
	}
	format_addr(sa, peer, sizeof(peer));
	client_new(&px->set, fd, peer, tls);
}

/* The pause after a failed accept is over: listen again (unless draining
 * closed the listeners meanwhile). Should descriptors still be short, the
 * next failure pauses again. */
static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	struct proxy *px = arg;

	for (unsigned i = 0; i < px->nlisteners; i++)
		if (px->listeners[i].lev)
			evconnlistener_enable(px->listeners[i].lev);
}

/* accept() failed with an error that retrying at once would not cure
 * (libevent retries EINTR, EAGAIN and ECONNABORTED itself): most often out
 * of descriptors. The listener is level-triggered, so it would report the
 * same error on every pass of the loop; every listener of this worker
 * pauses instead, and the connections wait in the kernel's backlog. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
	struct listener *l = arg;
	struct proxy *px = l->px;
	int err = EVUTIL_SOCKET_ERROR();

	fdlimit_accept_failed("proxy", err);
	for (unsigned i = 0; i < px->nlisteners; i++)
		if (px->listeners[i].lev)
			evconnlistener_disable(px->listeners[i].lev);
	loop_timer_arm(px->accept_timer, ACCEPT_PAUSE_MS);
}

struct proxy *proxy_new(struct event_base *base, struct router *router, const struct proxy_env *env, char *err,
			size_t errlen)
{
	const struct proxy *first = env->first;
	const struct config *cfg = &router->cfg;
	struct listener_conf ls[LISTENERS_MAX];
	unsigned nls = config_listeners(cfg, ls);
	struct proxy *px;

	px = calloc(1, sizeof(*px));
	if (!px) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	px->set.base = base;
	px->set.renv.router = router;
	px->set.renv.x = (struct exchange_env){ .base = base,
						.meter = { env->stats, env->alog, env->recent },
						.current = &px->set.renv.router };
	px->set.clients_all = env->clients ? env->clients : &px->clients_own;
	px->tail = evbuffer_new();
	px->set.renv.x.tail = px->tail;
	px->accept_timer = evtimer_new(base, on_accept_resume, px);
	if (!px->tail || !px->accept_timer) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	LIST_INIT(&px->set.clients);
	struct request_ids *ids = &px->set.renv.ids;
	if (getrandom(&ids->seed, sizeof(ids->seed), 0) != sizeof(ids->seed))
		ids->seed = (uint64_t)clock_now_ns() ^ (uint64_t)getpid();
	struct trace_rng *trng = &px->set.renv.trace_rng;
	if (getrandom(&trng->s, sizeof(trng->s), 0) != sizeof(trng->s))
		trng->s = trace_rng_next(&(struct trace_rng){ ids->seed ^ (uint64_t)(uintptr_t)px });

	for (unsigned i = 0; i < nls; i++) {
		struct sockaddr_storage ss;
		unsigned sslen;
		struct listener *l = &px->listeners[i];
		char addr[64];
		unsigned flags = LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC;

		if (first && i < first->nlisteners) {
			ss = first->listeners[i].bound;
			sslen = (unsigned)first->listeners[i].boundlen;
		} else if (config_parse_listen(ls[i].address, &ss, &sslen) == -1) {
			snprintf(err, errlen, "listen address %s: expected a numeric ADDR:PORT, e.g. 127.0.0.1:8080",
				 ls[i].address);
			goto fail;
		}
		if (env->reuseport)
			flags |= LEV_OPT_REUSEABLE_PORT;
		l->px = px;
		l->index = i;
		l->lev = evconnlistener_new_bind(base, on_accept, l, flags, 1024, (struct sockaddr *)&ss, (int)sslen);
		if (!l->lev) {
			snprintf(err, errlen, "cannot listen on %s: %s", ls[i].address, strerror(errno));
			goto fail;
		}
		px->nlisteners++;
		evconnlistener_set_error_cb(l->lev, on_accept_error);
		/* Stamping on the listener keeps the kernel stamping every packet
		 * for as long as tokentap runs: it turns stamping on lazily (a
		 * deferred switch) when the first socket asks, so a request that
		 * arrived before its connection was accepted, after a quiet spell
		 * with no stamped socket open, would have none. Accepted sockets
		 * inherit the option, and TCP_NODELAY too (on_accept checks the
		 * first one and sets both itself where they do not). */
		(void)rxstamp_enable(evconnlistener_get_fd(l->lev));
		int one = 1;
		(void)setsockopt(evconnlistener_get_fd(l->lev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		l->boundlen = sizeof(l->bound);
		getsockname(evconnlistener_get_fd(l->lev), (struct sockaddr *)&l->bound, &l->boundlen);
		format_addr((struct sockaddr *)&l->bound, addr, sizeof(addr));
		size_t n = strlen(px->listen_addr);
		snprintf(px->listen_addr + n, sizeof(px->listen_addr) - n, "%s%s%s", n ? ", " : "", addr,
			 ls[i].tls_cert ? " (tls)" : "");
	}
	return px;
fail:
	for (unsigned i = 0; i < px->nlisteners; i++)
		evconnlistener_free(px->listeners[i].lev);
	if (px->accept_timer)
		event_free(px->accept_timer);
	if (px->tail)
		evbuffer_free(px->tail);
	free(px);
	return NULL;
}

const char *proxy_listen_addr(const struct proxy *px)
{
	return px->listen_addr;
}

void proxy_free(struct proxy *px)
{
	if (!px)
		return;
	for (unsigned i = 0; i < px->nlisteners; i++)
		if (px->listeners[i].lev)
			evconnlistener_free(px->listeners[i].lev);
	client_set_free_all(&px->set);
	mirror_abort_all(&px->set.renv.mirrors);
	request_env_spares_free(&px->set.renv);
	if (px->drain_timer)
		event_free(px->drain_timer);
	if (px->accept_timer)
		event_free(px->accept_timer);
	router_unref(px->set.renv.router);
	evbuffer_free(px->tail);
	free(px);
}

void proxy_set_router(struct proxy *px, struct router *router)
{
	struct router *old = px->set.renv.router;

	px->set.renv.router = router; /* new requests; running ones keep theirs */
	router_unref(old);
}

struct router *proxy_router(const struct proxy *px)
{
	return px->set.renv.router;
}

static void on_drain_timer(evutil_socket_t fd, short what, void *arg)
{
	struct proxy *px = arg;
	unsigned cut = client_set_cut(&px->set);

	log_warn("shutdown: grace period over; %u connection(s) cut", cut);
}

void proxy_drain(struct proxy *px, uint64_t grace_ms, void (*done)(void *arg), void *arg)
{
	unsigned busy;

	px->set.draining = true;
	px->set.drained = done;
	px->set.drained_arg = arg;
	/* Closed, not just paused: a paused listener still completes handshakes
	 * into its backlog, and those clients would hang until the exit. */
	for (unsigned i = 0; i < px->nlisteners; i++) {
		if (px->listeners[i].lev)
			evconnlistener_free(px->listeners[i].lev);
		px->listeners[i].lev = NULL;
	}
	busy = client_set_close_idle(&px->set);
	log_info("shutdown: no longer accepting; waiting for %u running request(s), at most %llu ms", busy,
		 (unsigned long long)grace_ms);
	px->drain_timer = evtimer_new(px->set.base, on_drain_timer, px);
	if (px->drain_timer)
		loop_timer_arm(px->drain_timer, grace_ms);
	if (LIST_EMPTY(&px->set.clients) && px->set.drained) {
		px->set.drained = NULL;
		done(arg);
	}
}
