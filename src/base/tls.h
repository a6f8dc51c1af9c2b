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
#include <stdint.h>
#include <sys/types.h>

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;
typedef struct ssl_session_st SSL_SESSION;
struct bufferevent;
struct evbuffer;
struct event_base;

/* The listener's context from PEM files. NULL with `err`. */
SSL_CTX *tls_server_ctx(const char *cert, const char *key, char *err, size_t errlen);

/* A context for connecting to an upstream; its connections' sessions are
 * kept for resumption (struct tls_resume). */
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

/*
 * Sessions resumed across an upstream's connections: the newest session
 * (ticket) any of its connections received, offered by the next one it
 * opens, so that a pool that opens connections as load comes spends a full
 * handshake only on its first. One per upstream object (worker-local), for
 * connections of `ctx` only: tls_resume_reset when the upstream takes a new
 * context (a reload), which also drops the session.
 */
struct tls_resume {
	SSL_CTX *ctx;
	SSL_SESSION *sess;
	uint64_t stored; /* sessions received */
};
void tls_resume_reset(struct tls_resume *r, SSL_CTX *ctx);

/* Offers `r`'s session on a connecting `bev` (before its handshake) and
 * keeps what the connection receives in `r`, which must outlive it. */
void tls_bev_resume(struct bufferevent *bev, struct tls_resume *r);

/* Whether `bev`'s handshake resumed a session. */
bool tls_bev_resumed(struct bufferevent *bev);

/*
 * Reading a connected TLS upstream without the bufferevent (upstream.c):
 * one read takes what the socket holds into a memory BIO, and tls_recv
 * decrypts every whole record of it into one buffer, where the
 * bufferevent would go through its input buffer a record at a time.
 */
SSL *tls_bev_ssl(struct bufferevent *bev); /* NULL: not TLS */

/* For a connection that only tls_recv reads from now on: a memory BIO
 * becomes its read side, which tls_recv fills from the socket, one read()
 * for every record the socket holds (up to about 17 KiB) instead of two
 * per record (its header, then its body), and OpenSSL takes each record
 * from where it lies (its read-ahead would move the bytes after a record
 * to the front of its buffer before each one). Without memory for the
 * BIO, OpenSSL's read-ahead. Not for a bufferevent's reads: it would not
 * know of the bytes taken. */
void tls_read_own(SSL *ssl);

/* Whether OpenSSL or the memory BIO holds bytes already read from the
 * socket (a record, or part of one): the socket will not say so. */
bool tls_pending(SSL *ssl);

struct tls_reader {
	SSL *ssl;
	bool more;	/* out: stopped with more to come without the socket's say (full, or at the close) */
	uint64_t reads; /* SSL_read calls that returned bytes, summed */
};

/* Up to `len` decrypted bytes into `buf`, as many records as are there
 * (`reader` is a struct tls_reader; the signature is bevio_read's). The
 * bytes (> 0), 0 at the close (close_notify, or the TCP close: SSL_OP_
 * IGNORE_UNEXPECTED_EOF), -1 with errno EAGAIN when no whole record is
 * there, another errno when the connection failed. */
ssize_t tls_recv(void *reader, char *buf, size_t len);

/*
 * Writing to a TLS client now, as the plain path does with send(): where
 * the bufferevent would copy the bytes into its output buffer and write
 * them at the next loop turn (an epoll_ctl each way and a wake-up), the
 * bytes of one upstream read leave at once, one record per 16 KiB. Only
 * when the output buffer is empty and the handshake done; returns how many
 * bytes of `p` it took (written, or queued in the output when the socket
 * filled mid-record); the caller queues the rest.
 */
size_t tls_bev_write(struct bufferevent *bev, const char *p, size_t n);

/* tls_bev_write for a TLS upstream's request: from the front of `src`,
 * one record per 16 KiB (a smaller request one record, its chains joined),
 * each drained as it is taken; returns the bytes taken. What is left in
 * `src` (the socket full, or the handshake not done) the caller queues. */
size_t tls_bev_send(struct bufferevent *bev, struct evbuffer *src);

/* While `keep`, `bev`'s record buffers stay between writes (a streaming
 * response: no free and allocation per record); when not, they are let go
 * now if empty, and after each read and write from then on, as the
 * contexts ask (an idle connection holds none). */
void tls_bev_keep_buffers(struct bufferevent *bev, bool keep);
