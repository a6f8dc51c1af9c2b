/*
 * tls.h — OpenSSL contexts for both sides: the listener's certificate, and
 * verified connections to https upstreams.
 *
 * Verification is on by default against the system CA store or a given CA
 * file, with the upstream's host name checked and sent as SNI; a certificate
 * that does not verify fails the request (502) with the reason logged, and
 * is never bypassed. TLS 1.2 is the minimum on both sides.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct ssl_ctx_st SSL_CTX;
struct bufferevent;
struct event_base;

/* The listener's context from PEM files. NULL with `err`. */
SSL_CTX *tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen);

/* A context for connecting to an upstream. */
SSL_CTX *tls_client_ctx(bool verify, const char *ca_file, char *err, size_t errlen);

void tls_ctx_free(SSL_CTX *ctx);

/* A TLS bufferevent: accepting on `fd`, or connecting (fd -1) to
 * `server_name` (SNI, and the name checked when verifying; an IP address is
 * not sent as SNI, and is checked against the certificate's IP names).
 * NULL on error. */
struct bufferevent *tls_bev_accept(struct event_base *base, SSL_CTX *ctx, int fd);
struct bufferevent *tls_bev_connect(struct event_base *base, SSL_CTX *ctx, const char *server_name, bool verify);

/* Why the TLS layer of `bev` failed, as text ("" when it did not). */
const char *tls_bev_error(struct bufferevent *bev, char *buf, size_t len);

/* Whether `bev` is a TLS bufferevent. */
bool tls_bev_is_tls(struct bufferevent *bev);
