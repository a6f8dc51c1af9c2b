/*
 * bevio.c — see bevio.h.
 */
#include "bevio.h"

#include <event2/buffer.h>

ssize_t bevio_recv(struct bufferevent *bev, int fd, size_t want, struct msghdr *msg)
{
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v[2];
	ssize_t n;
	int nv, used = 0;

	/* the bufferevent keeps its input's end frozen but while it reads */
	evbuffer_unfreeze(in, 0);
	nv = evbuffer_reserve_space(in, (ev_ssize_t)want, v, 2);
	if (nv < 1) {
		evbuffer_freeze(in, 0);
		return BEVIO_NOMEM;
	}
	/* struct evbuffer_iovec is laid out as struct iovec */
	msg->msg_iov = (struct iovec *)v;
	msg->msg_iovlen = (size_t)nv;
	n = recvmsg(fd, msg, MSG_DONTWAIT);
	if (n > 0) {
		size_t left = (size_t)n;
		for (; used < nv && left; used++) {
			if (v[used].iov_len > left)
				v[used].iov_len = left;
			left -= v[used].iov_len;
		}
	}
	evbuffer_commit_space(in, v, used);
	evbuffer_freeze(in, 0);
	return n;
}

ssize_t bevio_read(struct bufferevent *bev, size_t want, ssize_t (*rd)(void *arg, char *buf, size_t len), void *arg)
{
	struct evbuffer *in = bufferevent_get_input(bev);
	struct evbuffer_iovec v;
	ssize_t n;

	evbuffer_unfreeze(in, 0);
	if (evbuffer_reserve_space(in, (ev_ssize_t)want, &v, 1) != 1) {
		evbuffer_freeze(in, 0);
		return BEVIO_NOMEM;
	}
	n = rd(arg, v.iov_base, v.iov_len < want ? v.iov_len : want);
	v.iov_len = n > 0 ? (size_t)n : 0;
	evbuffer_commit_space(in, &v, n > 0 ? 1 : 0);
	evbuffer_freeze(in, 0);
	return n;
}

int bevio_copy(struct evbuffer *dst, struct evbuffer *src)
{
	struct evbuffer_iovec v[16];
	struct evbuffer_ptr at;
	size_t len = evbuffer_get_length(src), done = 0;

	while (done < len) {
		if (evbuffer_ptr_set(src, &at, done, EVBUFFER_PTR_SET) == -1)
			return -1;
		int n = evbuffer_peek(src, (ev_ssize_t)(len - done), &at, v, 16);
		if (n > 16)
			n = 16;
		for (int i = 0; i < n && done < len; i++) {
			size_t take = v[i].iov_len < len - done ? v[i].iov_len : len - done;
			if (evbuffer_add(dst, v[i].iov_base, take) == -1)
				return -1;
			done += take;
		}
		if (n < 1)
			return -1; /* cannot happen while bytes are left */
	}
	return 0;
}
