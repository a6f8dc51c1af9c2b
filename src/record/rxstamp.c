/*
 * rxstamp.c — kernel receive timestamps mapped onto CLOCK_MONOTONIC.
 */
#include "rxstamp.h"

#include <string.h>

#include "timeline.h"

/* An older stamp is not trusted (a wall-clock step between the stamp and the
 * offset would make it wrong); a loop stalled longer is measured from the read. */
#define RXSTAMP_MAX_AGE_NS 5000000000ull
#define RXSTAMP_REFRESH_NS 1000000000ull

int rxstamp_enable(int fd)
{
	int one = 1;
	return setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
}

int64_t rxstamp_realtime_offset(void)
{
	int64_t best_w = INT64_MAX, off = 0;

	for (int i = 0; i < 16; i++) {
		struct timespec a, b;
		clock_gettime(CLOCK_REALTIME, &a);
		uint64_t m = clock_now_ns();
		clock_gettime(CLOCK_REALTIME, &b);
		int64_t ra = (int64_t)a.tv_sec * 1000000000 + a.tv_nsec;
		int64_t rb = (int64_t)b.tv_sec * 1000000000 + b.tv_nsec;
		if (rb - ra < best_w) {
			best_w = rb - ra;
			off = ra + (rb - ra) / 2 - (int64_t)m;
		}
	}
	return off;
}

void rxstamp_prepare(struct msghdr *msg, union rxstamp_ctl *ctl)
{
	msg->msg_control = ctl->buf;
	msg->msg_controllen = sizeof(ctl->buf);
}

uint64_t rxstamp_of(struct rxclock *c, const struct msghdr *msg, uint64_t now)
{
	if (!c->taken_ns || now - c->taken_ns > RXSTAMP_REFRESH_NS) {
		c->rt_offset_ns = rxstamp_realtime_offset();
		c->taken_ns = now;
	}
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR((struct msghdr *)msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SO_TIMESTAMPNS)
			continue;
		struct timespec ts;
		memcpy(&ts, CMSG_DATA(cm), sizeof(ts));
		int64_t k = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec - c->rt_offset_ns;
		if (k > 0 && (uint64_t)k <= now && now - (uint64_t)k < RXSTAMP_MAX_AGE_NS)
			return (uint64_t)k;
	}
	return now;
}
