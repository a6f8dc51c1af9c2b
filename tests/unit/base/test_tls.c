/*
 * test_tls.c — tls_recv, the read of a TLS upstream without its
 * bufferevent, over a real TLS 1.3 connection on a socket pair. The
 * client's socket reads go through a BIO that counts them, so what is
 * checked is how often tls_recv goes to the socket, not only what it
 * returns:
 *
 * - records already in the socket come out in one call (read-ahead: one
 *   read takes them all), and the call reads on to the socket's EAGAIN,
 *   so a record that arrives meanwhile comes out in the same call;
 * - a record cut in two by the socket: the first part gives EAGAIN and
 *   nothing, the second the whole record;
 * - data and close_notify in one read: the data, with `more` set (the
 *   close waits in OpenSSL, not in the socket), then 0;
 * - the TCP close after data without close_notify: the data, then 0.
 *
 * The key and certificate are made here (P-256, self-signed); the client
 * does not verify, as nothing here is about verification.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "tls.h"

/* ---- a BIO on a socket that counts its reads ---- */

static int counted_reads;
static void (*after_read)(void); /* called once after the next read that returns bytes */
static int read_eof;		 /* the counted socket's read returned 0 (as a socket BIO, for BIO_eof) */

static int cbio_read(BIO *b, char *buf, int len)
{
	counted_reads++;
	ssize_t n = read(BIO_get_fd(b, NULL), buf, (size_t)len);
	BIO_clear_retry_flags(b);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		BIO_set_retry_read(b);
	if (n == 0)
		read_eof = 1;
	if (n > 0 && after_read) {
		void (*f)(void) = after_read;
		after_read = NULL;
		f();
	}
	return (int)n;
}

static int cbio_write(BIO *b, const char *buf, int len)
{
	ssize_t n = write(BIO_get_fd(b, NULL), buf, (size_t)len);
	BIO_clear_retry_flags(b);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		BIO_set_retry_write(b);
	return (int)n;
}

static long cbio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	switch (cmd) {
	case BIO_C_SET_FD: BIO_set_data(b, (void *)(intptr_t)(*(int *)ptr + 1)); return 1;
	case BIO_C_GET_FD:
		if (ptr)
			*(int *)ptr = (int)(intptr_t)BIO_get_data(b) - 1;
		return (int)(intptr_t)BIO_get_data(b) - 1;
	case BIO_CTRL_FLUSH: return 1;
	case BIO_CTRL_EOF: return read_eof;
	default: (void)num; return 0;
	}
}

static BIO *counting_bio(int fd)
{
	static BIO_METHOD *m;
	if (!m) {
		m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "counting fd");
		BIO_meth_set_read(m, cbio_read);
		BIO_meth_set_write(m, cbio_write);
		BIO_meth_set_ctrl(m, cbio_ctrl);
	}
	BIO *b = BIO_new(m);
	BIO_set_fd(b, fd, BIO_NOCLOSE);
	BIO_set_init(b, 1);
	return b;
}

/* ---- one connection: server on s[1] (a plain socket BIO), client on s[0] ---- */

struct conn {
	int s[2];
	SSL_CTX *sctx, *cctx;
	SSL *srv, *cli;
};

static void make_cert(SSL_CTX *ctx)
{
	EVP_PKEY *key = EVP_EC_gen("P-256");
	X509 *x = X509_new();
	assert_non_null(key);
	X509_set_version(x, 2);
	ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
	X509_gmtime_adj(X509_getm_notBefore(x), 0);
	X509_gmtime_adj(X509_getm_notAfter(x), 3600);
	X509_set_pubkey(x, key);
	X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1,
				   -1, 0);
	X509_set_issuer_name(x, X509_get_subject_name(x));
	assert_true(X509_sign(x, key, EVP_sha256()) > 0);
	assert_int_equal(SSL_CTX_use_certificate(ctx, x), 1);
	assert_int_equal(SSL_CTX_use_PrivateKey(ctx, key), 1);
	X509_free(x);
	EVP_PKEY_free(key);
}

static void conn_open(struct conn *c)
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, c->s), 0);
	for (int i = 0; i < 2; i++)
		fcntl(c->s[i], F_SETFL, fcntl(c->s[i], F_GETFL) | O_NONBLOCK);
	c->sctx = SSL_CTX_new(TLS_server_method());
	c->cctx = SSL_CTX_new(TLS_client_method());
	make_cert(c->sctx);
	SSL_CTX_set_num_tickets(c->sctx, 0); /* nothing after the handshake but what a test sends */
	SSL_CTX_set_min_proto_version(c->cctx, TLS1_3_VERSION);
	SSL_CTX_set_options(c->cctx, SSL_OP_IGNORE_UNEXPECTED_EOF); /* as tls_client_ctx */
	c->srv = SSL_new(c->sctx);
	c->cli = SSL_new(c->cctx);
	SSL_set_fd(c->srv, c->s[1]);
	BIO *b = counting_bio(c->s[0]);
	SSL_set_bio(c->cli, b, b);
	SSL_set_accept_state(c->srv);
	SSL_set_connect_state(c->cli);
	int done_s = 0, done_c = 0;
	for (int i = 0; i < 100 && !(done_s && done_c); i++) {
		if (!done_c)
			done_c = SSL_do_handshake(c->cli) == 1;
		if (!done_s)
			done_s = SSL_do_handshake(c->srv) == 1;
	}
	assert_true(done_s && done_c);
	tls_read_own(c->cli);
	counted_reads = 0;
	read_eof = 0;
}

static void conn_close(struct conn *c)
{
	SSL_free(c->srv);
	SSL_free(c->cli);
	SSL_CTX_free(c->sctx);
	SSL_CTX_free(c->cctx);
	close(c->s[0]);
	if (c->s[1] >= 0)
		close(c->s[1]);
}

static void send_record(struct conn *c, const char *s)
{
	size_t w = 0;
	assert_int_equal(SSL_write_ex(c->srv, s, strlen(s), &w), 1);
	assert_int_equal(w, strlen(s));
}

#define EV1 "data: {\"choices\":[{\"delta\":{\"content\":\"one\"}}]}\n\n"
#define EV2 "data: {\"choices\":[{\"delta\":{\"content\":\"two\"}}]}\n\n"

static struct conn *late_conn;

static void send_late_record(void)
{
	send_record(late_conn, EV2);
}

static void test_records_in_one_read(void **state)
{
	(void)state;
	struct conn c;
	char buf[65536];
	conn_open(&c);

	send_record(&c, EV1);
	send_record(&c, EV2);
	struct tls_reader rd = { .ssl = c.cli };
	ssize_t n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, strlen(EV1) + strlen(EV2));
	assert_memory_equal(buf, EV1 EV2, (size_t)n);
	assert_false(rd.more);
	assert_int_equal(rd.reads, 2);
	assert_int_equal(counted_reads, 2); /* both records in one read, then EAGAIN */
	assert_false(tls_pending(c.cli));

	/* nothing there: one read, EAGAIN */
	counted_reads = 0;
	n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, -1);
	assert_int_equal(errno, EAGAIN);
	assert_int_equal(counted_reads, 1);
	conn_close(&c);
}

/* A burst of small records: all of them come out, in few reads (16.5 KiB
 * each, as read-ahead took), and once the connection is read empty its
 * memory BIO holds no burst-sized buffer; a lone record after it keeps a
 * small one. */
static void test_burst_then_idle(void **state)
{
	(void)state;
	struct conn c;
	static char buf[262144];
	char want[65536];
	size_t wlen = 0;
	conn_open(&c);

	for (int i = 0; i < 200; i++) { /* what the socket pair's buffer takes of small writes */
		send_record(&c, i % 2 ? EV2 : EV1);
		memcpy(want + wlen, i % 2 ? EV2 : EV1, strlen(EV1));
		wlen += strlen(EV1);
	}
	struct tls_reader rd = { .ssl = c.cli };
	ssize_t n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, (ssize_t)wlen);
	assert_memory_equal(buf, want, wlen);
	assert_false(rd.more);
	assert_int_equal(rd.reads, 200);
	assert_true(counted_reads <= 3); /* ~20 KB on the wire: 2 reads and the EAGAIN */
	assert_false(tls_pending(c.cli));
	BUF_MEM *bm = NULL;
	assert_true(BIO_get_mem_ptr(SSL_get_rbio(c.cli), &bm) > 0 && bm);
	assert_true(bm->max <= 4096);

	send_record(&c, EV1);
	n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, strlen(EV1));
	assert_memory_equal(buf, EV1, (size_t)n);
	conn_close(&c);
}

/* A call whose buffer fills after the memory BIO was fed a second time:
 * the rest of that feed waits in the BIO, not in the socket, which will
 * not wake for it, so the call says `more`; the next call takes the rest
 * without waiting for the socket. */
static void test_full_after_a_second_feed(void **state)
{
	(void)state;
	struct conn c;
	static char buf[65536], want[65536], ev[201];
	size_t wlen = 0, got = 0;
	conn_open(&c);

	memset(ev, 'x', 200);		/* 222 bytes a record on the wire: 76 of them in a feed */
	for (int i = 0; i < 120; i++) { /* 26 KB: two feeds, within the socket pair's buffer */
		ev[0] = (char)('a' + i % 26);
		send_record(&c, ev);
		memcpy(want + wlen, ev, 200);
		wlen += 200;
	}
	size_t first = 17500; /* past the first feed's 15,200 bytes of records */
	struct tls_reader rd = { .ssl = c.cli };
	ssize_t n = tls_recv(&rd, buf, first);
	assert_int_equal(n, (ssize_t)first);
	assert_true(rd.more);
	assert_true(tls_pending(c.cli));
	got = (size_t)n;
	n = tls_recv(&rd, buf + got, sizeof(buf) - got);
	assert_int_equal(n, (ssize_t)(wlen - got));
	assert_memory_equal(buf, want, wlen);
	assert_false(rd.more);
	conn_close(&c);
}

static void test_record_arriving_meanwhile(void **state)
{
	(void)state;
	struct conn c;
	char buf[65536];
	conn_open(&c);

	/* EV2 reaches the socket just after the read that took EV1: the
	 * call takes it too, rather than leaving it to the next wake-up */
	send_record(&c, EV1);
	late_conn = &c;
	after_read = send_late_record;
	struct tls_reader rd = { .ssl = c.cli };
	ssize_t n = tls_recv(&rd, buf, sizeof(buf));
	assert_null(after_read);
	assert_int_equal(n, strlen(EV1) + strlen(EV2));
	assert_memory_equal(buf, EV1 EV2, (size_t)n);
	assert_int_equal(rd.reads, 2);
	assert_int_equal(counted_reads, 3);
	conn_close(&c);
}

static void test_record_cut_in_two(void **state)
{
	(void)state;
	struct conn c;
	char buf[65536], wire[1024];
	conn_open(&c);

	/* the server's record, taken off the wire before the client sees it */
	send_record(&c, EV1);
	ssize_t w = read(c.s[0], wire, sizeof(wire));
	assert_true(w > 10);
	assert_int_equal(write(c.s[1], wire, 10), 10);

	struct tls_reader rd = { .ssl = c.cli };
	ssize_t n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, -1);
	assert_int_equal(errno, EAGAIN);
	assert_true(tls_pending(c.cli)); /* the record's start, held */

	assert_int_equal(write(c.s[1], wire + 10, (size_t)w - 10), w - 10);
	n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, strlen(EV1));
	assert_memory_equal(buf, EV1, strlen(EV1));
	assert_false(rd.more);
	conn_close(&c);
}

static void test_data_then_close_notify(void **state)
{
	(void)state;
	struct conn c;
	char buf[65536];
	conn_open(&c);

	send_record(&c, EV1);
	assert_true(SSL_shutdown(c.srv) >= 0);
	struct tls_reader rd = { .ssl = c.cli };
	ssize_t n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, strlen(EV1));
	assert_true(rd.more); /* the close is in OpenSSL's hands: the socket will not wake for it */
	assert_int_equal(tls_recv(&rd, buf, sizeof(buf)), 0);
	conn_close(&c);
}

static void test_data_then_tcp_close(void **state)
{
	(void)state;
	struct conn c;
	char buf[65536];
	conn_open(&c);

	send_record(&c, EV1);
	close(c.s[1]);
	c.s[1] = -1;
	struct tls_reader rd = { .ssl = c.cli };
	ssize_t n = tls_recv(&rd, buf, sizeof(buf));
	assert_int_equal(n, strlen(EV1));
	assert_memory_equal(buf, EV1, strlen(EV1));
	/* the socket at its end stays readable: the next call sees the close */
	int r = -1;
	for (int i = 0; i < 3 && (r = (int)tls_recv(&rd, buf, sizeof(buf))) > 0; i++)
		;
	if (r != 0)
		print_message("tls_recv after the close: %d, errno %d (%s)\n", r, errno, strerror(errno));
	assert_int_equal(r, 0);
	conn_close(&c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_records_in_one_read),	 cmocka_unit_test(test_record_arriving_meanwhile),
		cmocka_unit_test(test_record_cut_in_two),	 cmocka_unit_test(test_data_then_close_notify),
		cmocka_unit_test(test_data_then_tcp_close),	 cmocka_unit_test(test_burst_then_idle),
		cmocka_unit_test(test_full_after_a_second_feed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
