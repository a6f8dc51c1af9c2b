/*
 * bench_tls.c — tokentap-bench over https://: one client context for the
 * whole process (tokentap's own, src/base/tls.c: TLS 1.2 at least, the
 * certificate checked against the URL's host unless --insecure), SNI from
 * the URL's host, and the newest session the server handed out offered on
 * every new connection, so that connections after the first resume rather
 * than pay a full handshake (as a client pool or a proxy's upstream pool
 * does). What was negotiated and how many handshakes resumed is counted per
 * run for the report.
 */
#include "bench.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <string.h>

#include "tls.h"

/* The newest session from the server; owned here. A TLS 1.3 server sends
 * its tickets after the handshake, so this is kept from the callback rather
 * than read off a connection. It is a copy: the bench closes connections
 * without close_notify, and OpenSSL then marks the connection's own session
 * object as not resumable. */
static SSL_SESSION *last_session;

static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
	SSL_SESSION *copy = SSL_SESSION_dup(sess);
	(void)ssl;
	if (copy) {
		if (last_session)
			SSL_SESSION_free(last_session);
		last_session = copy;
	}
	return 0; /* sess stays the connection's */
}

int bench_tls_setup(struct bench_opts *o, char *err, size_t errlen)
{
	SSL_CTX *ctx = tls_client_ctx(!o->tls_insecure, o->tls_ca, err, errlen);
	if (!ctx)
		return -1;
	if (o->tls_ciphersuites && SSL_CTX_set_ciphersuites(ctx, o->tls_ciphersuites) != 1) {
		snprintf(err, errlen, "--tls-ciphersuites '%s': no TLS 1.3 suite OpenSSL knows", o->tls_ciphersuites);
		tls_ctx_free(ctx);
		return -1;
	}
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(ctx, on_new_session);
	o->tls_ctx = ctx;
	return 0;
}

void bench_tls_free(struct bench_opts *o)
{
	if (last_session)
		SSL_SESSION_free(last_session);
	last_session = NULL;
	if (o->tls_ctx)
		tls_ctx_free(o->tls_ctx);
	o->tls_ctx = NULL;
}

struct bufferevent *bench_tls_bev(struct event_base *base, const struct bench_opts *o)
{
	struct bufferevent *bev = tls_bev_connect(base, o->tls_ctx, o->host, !o->tls_insecure);
	if (!bev)
		return NULL;
	/* each connection its own copy: one closed without close_notify
	 * retires the session object it holds, which must not be ours */
	SSL_SESSION *copy = last_session ? SSL_SESSION_dup(last_session) : NULL;
	if (copy) {
		(void)SSL_set_session(bufferevent_openssl_get_ssl(bev), copy);
		SSL_SESSION_free(copy); /* the connection holds its own reference */
	}
	/* a close without close_notify ends a response the close delimits */
	bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	return bev;
}

void bench_tls_connected(struct bufferevent *bev, struct bench_result *res)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);
	if (!ssl)
		return;
	res->tls_handshakes++;
	res->tls_resumed += SSL_session_reused(ssl) == 1;
	snprintf(res->tls_protocol, sizeof(res->tls_protocol), "%s", SSL_get_version(ssl));
	snprintf(res->tls_cipher, sizeof(res->tls_cipher), "%s", SSL_get_cipher_name(ssl));
}

const char *bench_tls_error(struct bufferevent *bev, char *buf, size_t len)
{
	return tls_bev_error(bev, buf, len);
}
