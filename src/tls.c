/*
 * tls.c — OpenSSL contexts and TLS bufferevents.
 *
 * Both kinds of context release a connection's record buffers (about 17 KiB
 * each way) whenever they are empty: an idle keep-alive connection, client
 * or pooled upstream, then costs little more than a plain one, and a busy
 * one takes them again from the allocator, which keeps them at hand.
 */
#include "tls.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>

static void last_error(char *err, size_t errlen, const char *what)
{
	unsigned long e = ERR_get_error();
	char reason[256] = "unknown error";
	if (e)
		ERR_error_string_n(e, reason, sizeof(reason));
	snprintf(err, errlen, "%s: %s", what, reason);
	ERR_clear_error();
}

SSL_CTX *tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
	char what[512];

	if (!ctx) {
		last_error(err, errlen, "TLS");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
	SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
	snprintf(what, sizeof(what), "TLS certificate %s", cert);
	if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
		last_error(err, errlen, what);
		goto fail;
	}
	snprintf(what, sizeof(what), "TLS key %s", key);
	if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
		last_error(err, errlen, what);
		goto fail;
	}
	if (SSL_CTX_check_private_key(ctx) != 1) {
		snprintf(err, errlen, "TLS key %s does not match certificate %s", key, cert);
		goto fail;
	}
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

SSL_CTX *tls_client_ctx(bool verify, const char *ca_file, char *err, size_t errlen)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	char what[512];

	if (!ctx) {
		last_error(err, errlen, "TLS");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
	/* An upstream that closes without close_notify ends its stream
	 * (BEV_EVENT_EOF) rather than failing it (OpenSSL 3 makes it an error):
	 * whether the response was whole is the HTTP framing's to say
	 * (exchange.c), and a response that the close delimits ends there, as
	 * most servers and proxies take it. */
	SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
	if (verify) {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
		if (ca_file) {
			snprintf(what, sizeof(what), "TLS CA file %s", ca_file);
			if (SSL_CTX_load_verify_locations(ctx, ca_file, NULL) != 1) {
				last_error(err, errlen, what);
				SSL_CTX_free(ctx);
				return NULL;
			}
		} else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
			last_error(err, errlen, "TLS system CA store");
			SSL_CTX_free(ctx);
			return NULL;
		}
	} else {
		SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	}
	return ctx;
}

void tls_ctx_free(SSL_CTX *ctx)
{
	SSL_CTX_free(ctx);
}

struct bufferevent *tls_bev_accept(struct event_base *base, SSL_CTX *ctx, int fd)
{
	SSL *ssl = SSL_new(ctx);
	struct bufferevent *bev;

	if (!ssl)
		return NULL;
	bev = bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
	if (!bev)
		SSL_free(ssl);
	return bev;
}

struct bufferevent *tls_bev_connect(struct event_base *base, SSL_CTX *ctx, const char *server_name, bool verify)
{
	SSL *ssl = SSL_new(ctx);
	struct bufferevent *bev;

	if (!ssl)
		return NULL;
	/* RFC 6066 §3: server_name carries host names, never a literal IPv4 or
	 * IPv6 address; an address is matched against the certificate's IP
	 * names instead */
	unsigned char addr[16];
	bool ip = inet_pton(AF_INET, server_name, addr) == 1 || inet_pton(AF_INET6, server_name, addr) == 1;
	if (!ip && SSL_set_tlsext_host_name(ssl, server_name) != 1)
		goto fail;
	if (verify) {
		/* the certificate must name this host, not just chain to a CA */
		SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		if (ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), server_name) != 1
		       : SSL_set1_host(ssl, server_name) != 1)
			goto fail;
	}
	bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_CONNECTING, BEV_OPT_CLOSE_ON_FREE);
	if (!bev)
		SSL_free(ssl);
	return bev;
fail:
	SSL_free(ssl);
	return NULL;
}

const char *tls_bev_error(struct bufferevent *bev, char *buf, size_t len)
{
	unsigned long e;
	buf[0] = '\0';
	if (!tls_bev_is_tls(bev))
		return buf;
	while ((e = bufferevent_get_openssl_error(bev)))
		if (ERR_GET_LIB(e)) /* the last real one says most */
			ERR_error_string_n(e, buf, len);
	/* a failed verification says why better than the handshake error */
	SSL *ssl = bufferevent_openssl_get_ssl(bev);
	long vr = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
	if (vr != X509_V_OK)
		snprintf(buf, len, "certificate verify failed: %s", X509_verify_cert_error_string(vr));
	return buf;
}

bool tls_bev_is_tls(struct bufferevent *bev)
{
	return bev && bufferevent_openssl_get_ssl(bev) != NULL;
}
