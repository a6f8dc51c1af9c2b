/*
 * bevio.h — reading a socket into a bufferevent's input buffer ourselves;
 * copying an evbuffer without a buffer of one's own (bevio_copy).
 *
 * tokentap reads plain client and upstream sockets itself rather than
 * through the bufferevent (client.c: the kernel's receive stamp needs
 * recvmsg; upstream.c: one read instead of ioctl(FIONREAD) plus a 4 KiB
 * readv; over TLS too, once connected: tls_recv), and leaves the rest
 * (writing, the handshake, callbacks) to the bufferevent.
 */
#pragma once

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <sys/socket.h>
#include <sys/types.h>

/* One recvmsg() of at most `want` bytes from `fd` onto the end of `bev`'s
 * input buffer, without copying. `msg` may carry a control buffer (its
 * iovec is set here). Returns the bytes received, 0 at EOF, -1 with errno
 * set, or BEVIO_NOMEM when no room could be reserved. */
#define BEVIO_NOMEM (-2)
ssize_t bevio_recv(struct bufferevent *bev, int fd, size_t want, struct msghdr *msg);

/* The same with a reader of one's own: `rd(arg, buf, len)` fills at most
 * `len` contiguous bytes reserved at the end of `bev`'s input buffer and
 * returns as recv() does (tls_recv). Returns what `rd` returned, or
 * BEVIO_NOMEM. */
ssize_t bevio_read(struct bufferevent *bev, size_t want, ssize_t (*rd)(void *arg, char *buf, size_t len), void *arg);

/* Appends a copy of all of `src`'s bytes to `dst`, chain by chain
 * (evbuffer_peek, then evbuffer_add per piece), `src` unchanged; no
 * buffer of its own is allocated. 0, or -1 when an add failed: `dst` may
 * then hold part of the copy, and the caller discards it. */
int bevio_copy(struct evbuffer *dst, struct evbuffer *src) __attribute__((warn_unused_result));
