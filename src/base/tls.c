/*
 * tls.c — OpenSSL contexts and TLS bufferevents.
 *
 * Both kinds of context release a connection's record buffers (about 17 KiB
 * each way) whenever they are empty: an idle keep-alive connection, client
 * or pooled upstream, then costs little more than a plain one, and a busy
 * one takes them again from the allocator, which keeps them at hand. A TLS
 * client keeps them while its response streams (tls_bev_keep_buffers):
 * there a free and an allocation per record would be 8 % of its cost.
 */
#include "tls.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <arpa/inet.h>
#include <openssl/buffer.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <errno.h>
#include <pthread.h>
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
	/* moving: a record tls_bev_write could not finish is written again
	 * by the bufferevent from its output buffer (same bytes, new place) */
	SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
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

/* ---- upstream sessions, resumed across pooled connections ---- */

static int resume_idx = -1; /* SSL ex_data: the struct tls_resume a connection feeds */
static pthread_once_t resume_once = PTHREAD_ONCE_INIT;

static void resume_index(void)
{
	resume_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

/* A session (TLS 1.3: a ticket, which comes after the handshake) for the
 * connection's upstream. A private copy is kept: the connection's own
 * object is marked unresumable when it is freed without close_notify, as
 * pooled connections are. A connection of a context the upstream has
 * since replaced (a reload: another CA file, another verification) offers
 * nothing: its session would resume past the new context's checks. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
	struct tls_resume *r = resume_idx >= 0 ? SSL_get_ex_data(ssl, resume_idx) : NULL;

	if (r && r->ctx == SSL_get_SSL_CTX(ssl) && SSL_SESSION_is_resumable(sess)) {
		SSL_SESSION *copy = SSL_SESSION_dup(sess);
		if (copy) {
			SSL_SESSION_free(r->sess);
			r->sess = copy;
			r->stored++;
		}
	}
	return 0; /* the connection keeps its reference; ours is the copy */
}

void tls_resume_reset(struct tls_resume *r, SSL_CTX *ctx)
{
	SSL_SESSION_free(r->sess);
	r->sess = NULL;
	r->ctx = ctx;
}

void tls_bev_resume(struct bufferevent *bev, struct tls_resume *r)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);

	if (!ssl || resume_idx < 0 || r->ctx != SSL_get_SSL_CTX(ssl))
		return;
	SSL_set_ex_data(ssl, resume_idx, r);
	if (r->sess) {
		/* each connection its own copy, for the same reason */
		SSL_SESSION *copy = SSL_SESSION_dup(r->sess);
		if (copy) {
			SSL_set_session(ssl, copy);
			SSL_SESSION_free(copy); /* the connection holds its own reference */
		}
	}
}

bool tls_bev_resumed(struct bufferevent *bev)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);

	return ssl && SSL_session_reused(ssl);
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
	pthread_once(&resume_once, resume_index);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(ctx, on_new_session);
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

/* ---- reading a TLS upstream ourselves ---- */

SSL *tls_bev_ssl(struct bufferevent *bev)
{
	return bev ? bufferevent_openssl_get_ssl(bev) : NULL;
}

/* Bytes taken from the socket in one read for a connection tls_recv
 * feeds: a full record and its header, as read-ahead took. */
#define TLS_FEED (16384 + 512)

static _Thread_local char feed_buf[TLS_FEED];

#define TLS_MEM_KEEP 4096 /* the memory BIO's buffer kept between reads, at most */

void tls_read_own(SSL *ssl)
{
	BIO *sock = SSL_get_wbio(ssl), *mem;

	/* OpenSSL's read-ahead moves what it holds past a record to the front
	 * of its buffer before each record (OpenSSL 3.0, ssl3_read_n): with
	 * many small records in one read, most of a read's cost. A memory BIO
	 * that tls_recv fills from the socket gives OpenSSL each record
	 * from where it lies, at the cost of one copy of the bytes. */
	if (sock && SSL_get_rbio(ssl) == sock && (mem = BIO_new(BIO_s_mem()))) {
		BIO_set_mem_eof_return(mem, -1); /* empty: read again later */
		SSL_set0_rbio(ssl, mem);	 /* the socket BIO stays the write side */
		return;
	}
	SSL_set_read_ahead(ssl, 1); /* no memory: read-ahead, as before */
}

/* Whether tls_recv feeds `ssl` from its socket itself (tls_read_own). */
static inline bool tls_fed(SSL *ssl)
{
	return SSL_get_rbio(ssl) != SSL_get_wbio(ssl);
}

/* One read of the socket into the memory BIO: 1 with bytes, 0 when the
 * socket has none now, 2 at its end (the memory BIO then ends too, so
 * OpenSSL sees the close after the bytes before it), -1 on an error (errno
 * as the read left it). */
static int tls_feed(SSL *ssl)
{
	BIO *mem = SSL_get_rbio(ssl), *sock = SSL_get_wbio(ssl);
	int n = BIO_read(sock, feed_buf, (int)sizeof(feed_buf));

	if (n > 0) {
		if (BIO_write(mem, feed_buf, n) != n) {
			errno = ENOMEM;
			return -1;
		}
		return 1;
	}
	if (n < 0 && BIO_should_retry(sock))
		return 0;
	if (n == 0) {
		BIO_set_mem_eof_return(mem, 0);
		return 2;
	}
	if (!errno)
		errno = ECONNRESET;
	return -1;
}

bool tls_pending(SSL *ssl)
{
	return SSL_has_pending(ssl) == 1 || (tls_fed(ssl) && BIO_ctrl_pending(SSL_get_rbio(ssl)) > 0);
}

/* SSL_get_error needs an empty error queue. Looking costs a quarter of
 * clearing, which walks all 16 slots (about 850 instructions with OpenSSL
 * 3.0: more than the rest of a one-event read or write), and a read or
 * write that succeeds leaves nothing there. */
static inline void tls_err_reset(void)
{
	if (ERR_peek_error())
		ERR_clear_error();
}

static ssize_t tls_recv_records(struct tls_reader *rd, char *buf, size_t len);

ssize_t tls_recv(void *reader, char *buf, size_t len)
{
	struct tls_reader *rd = reader;

	if (!tls_fed(rd->ssl))
		return tls_recv_records(rd, buf, len);
	/* Fed a record at a time, OpenSSL's record buffer is empty after each
	 * one: released there, it would be freed and allocated again per
	 * record. Kept through the call, and let go at its end when empty. */
	bool release = (SSL_get_mode(rd->ssl) & SSL_MODE_RELEASE_BUFFERS) != 0;
	if (release)
		SSL_clear_mode(rd->ssl, SSL_MODE_RELEASE_BUFFERS);
	ssize_t n = tls_recv_records(rd, buf, len);
	int saved = errno;
	if (release) {
		SSL_set_mode(rd->ssl, SSL_MODE_RELEASE_BUFFERS);
		(void)SSL_free_buffers(rd->ssl); /* refused while part of a record is in it */
	}
	/* The memory BIO keeps the most it held: emptied after a burst, it
	 * makes way for a new one, so that a connection between reads (the
	 * pool, a stream after a burst) holds no more than a record or two,
	 * as with read-ahead, which let its buffer go. At a stream's pace it
	 * holds a record's bytes and stays. Not at the end, which the old
	 * one remembers. */
	BIO *mem = SSL_get_rbio(rd->ssl);
	BUF_MEM *bm = NULL;
	if ((n > 0 || (n < 0 && saved == EAGAIN)) && BIO_ctrl_pending(mem) == 0 && BIO_get_mem_ptr(mem, &bm) > 0 &&
	    bm && bm->max > TLS_MEM_KEEP) {
		BIO *fresh = BIO_new(BIO_s_mem());
		if (fresh) {
			BIO_set_mem_eof_return(fresh, -1);
			SSL_set0_rbio(rd->ssl, fresh);
		}
	}
	errno = saved;
	return n;
}

static ssize_t tls_recv_records(struct tls_reader *rd, char *buf, size_t len)
{
	size_t got = 0, n;
	int err = SSL_ERROR_NONE;
	bool fed = tls_fed(rd->ssl), ended = false;

	rd->more = false;
	tls_err_reset(); /* SSL_get_error reads the queue: ours only */
	while (got < len) {
		err = SSL_ERROR_NONE; /* a WANT_READ a feed answered is not why the loop ends */
		if (SSL_read_ex(rd->ssl, buf + got, len - got, &n) == 1) {
			got += n;
			rd->reads++;
			/* On to the socket's EAGAIN, even with OpenSSL's buffer
			 * empty: records that came while these were decrypted go
			 * in the same call. At a stream's pace that last read is
			 * one EAGAIN per wake-up; under load it finds more, and
			 * stopping at the buffer's end doubled the wake-ups and
			 * client writes and lost 17 % of the events/s in scenario
			 * (i) (docs/dev/perf-log.md, "The TLS path"). */
			continue;
		}
		err = SSL_get_error(rd->ssl, 0);
		if (err == SSL_ERROR_WANT_READ && fed && !ended) {
			int f = tls_feed(rd->ssl);
			if (f == 1)
				continue;
			if (f == 2) {
				ended = true; /* OpenSSL sees the end after what came before it */
				continue;
			}
			if (f < 0)
				err = SSL_ERROR_SYSCALL; /* errno says how */
		}
		/* The close, however it came: once it is seen, OpenSSL 3.0 answers
		 * every later SSL_read with 0 and no read, which SSL_get_error
		 * does not always call ZERO_RETURN (a spin on a socket at EOF). */
		if (SSL_get_shutdown(rd->ssl) & SSL_RECEIVED_SHUTDOWN)
			err = SSL_ERROR_ZERO_RETURN;
		break;
	}
	if (got) {
		/* Full, or stopped at the close or an error: what is left (bytes
		 * in OpenSSL's buffer, the close itself) may not wake the socket
		 * again. */
		rd->more = err != SSL_ERROR_WANT_READ;
		tls_err_reset();
		return (ssize_t)got;
	}
	switch (err) {
	case SSL_ERROR_WANT_READ: /* a partial record, or a ticket and no data */ errno = EAGAIN; return -1;
	case SSL_ERROR_ZERO_RETURN: /* close_notify, or a close without it (SSL_OP_IGNORE_UNEXPECTED_EOF) */ return 0;
	case SSL_ERROR_SYSCALL:
		if (!errno)
			errno = ECONNRESET;
		break;
	default: /* a bad record, or a read that needs a write (not met in TLS 1.3 streams) */ errno = EPROTO; break;
	}
	int saved = errno;
	ERR_clear_error();
	errno = saved;
	return -1;
}

/* ---- writing to a TLS client now ---- */

#define TLS_WRITE_PIECE 16384 /* a record; at most what the bufferevent retries with */

size_t tls_bev_write(struct bufferevent *bev, const char *p, size_t n)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);
	struct evbuffer *out = bufferevent_get_output(bev);
	size_t done = 0;

	if (!ssl || !SSL_is_init_finished(ssl) || evbuffer_get_length(out) != 0)
		return 0;
	/* Were something left in the queue after a write that succeeded, a
	 * later WANT_WRITE would read as a failure, and the bytes would go to
	 * the bufferevent, which clears and writes them itself. */
	tls_err_reset();
	while (done < n) {
		size_t piece = n - done < TLS_WRITE_PIECE ? n - done : TLS_WRITE_PIECE, w = 0;
		if (SSL_write_ex(ssl, p + done, piece, &w) == 1) {
			done += w;
			continue;
		}
		int err = SSL_get_error(ssl, 0);
		ERR_clear_error();
		if (err != SSL_ERROR_WANT_WRITE)
			break; /* the bufferevent's own write meets the failure */
		/* The socket is full mid-record: OpenSSL must be called again
		 * with this piece (its start, at least as long), which the
		 * bufferevent does from the front of its output: so the piece
		 * goes there first, in one piece. */
		struct evbuffer_iovec v;
		if (evbuffer_reserve_space(out, (ev_ssize_t)piece, &v, 1) != 1)
			break;
		memcpy(v.iov_base, p + done, piece);
		v.iov_len = piece;
		if (evbuffer_commit_space(out, &v, 1) == 0)
			done += piece;
		break;
	}
	return done;
}

size_t tls_bev_send(struct bufferevent *bev, struct evbuffer *src)
{
	struct evbuffer *out = bufferevent_get_output(bev);
	size_t done = 0, len;

	while ((len = evbuffer_get_length(src)) > 0 && evbuffer_get_length(out) == 0) {
		size_t piece = len < TLS_WRITE_PIECE ? len : TLS_WRITE_PIECE;
		/* one record from however many chains the piece spans (a head
		 * and its body: often one already, then this copies nothing) */
		const unsigned char *p = evbuffer_pullup(src, (ev_ssize_t)piece);
		if (!p)
			break; /* no memory to join them: the bufferevent writes them */
		/* a record the socket took part of goes on from the output's
		 * front (libevent sets SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER on
		 * the connection), the rest of `src` behind it */
		size_t w = tls_bev_write(bev, (const char *)p, piece);
		evbuffer_drain(src, w);
		done += w;
		if (w < piece)
			break;
	}
	return done;
}

void tls_bev_keep_buffers(struct bufferevent *bev, bool keep)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);

	if (!ssl)
		return;
	if (keep) {
		SSL_clear_mode(ssl, SSL_MODE_RELEASE_BUFFERS);
	} else {
		SSL_set_mode(ssl, SSL_MODE_RELEASE_BUFFERS);
		(void)SSL_free_buffers(ssl); /* refused while bytes are in them: they go after the next write */
	}
}
