/*
 * rxstamp.h — when bytes reached this host, not when this process got round
 * to reading them.
 *
 * With SO_TIMESTAMPNS on, every recvmsg() carries the kernel's receive time
 * of the newest segment it returned, on CLOCK_REALTIME. rxstamp maps it onto
 * CLOCK_MONOTONIC (the clock of every timeline stamp) with an offset taken
 * again each second, so an NTP slew never shows. A busy event loop or a
 * descheduled process then no longer shortens what is measured: the stamp
 * says when the data arrived.
 *
 * One struct rxclock per thread (it is not locked).
 */
#ifndef TOKENTAP_RXSTAMP_H
#define TOKENTAP_RXSTAMP_H

#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

/* Room for the ancillary data of one recvmsg(). */
union rxstamp_ctl {
	char buf[CMSG_SPACE(sizeof(struct timespec)) * 2];
	struct cmsghdr align;
};

struct rxclock {
	int64_t rt_offset_ns; /* CLOCK_REALTIME - CLOCK_MONOTONIC */
	uint64_t taken_ns;    /* monotonic time the offset was taken; 0: never */
};

/* Asks the kernel to stamp what `fd` receives. Returns 0 or -1 (errno). */
int rxstamp_enable(int fd);

/* CLOCK_REALTIME - CLOCK_MONOTONIC, from the tightest of a few samples. */
int64_t rxstamp_realtime_offset(void);

/* Points msg's control buffer at `ctl`. */
void rxstamp_prepare(struct msghdr *msg, union rxstamp_ctl *ctl);

/* The arrival time of what recvmsg() just returned into `msg`: the kernel's
 * stamp mapped onto CLOCK_MONOTONIC when there is a plausible one (not after
 * `now`, not older than 5 s), else `now`, the time read on wake-up. */
uint64_t rxstamp_of(struct rxclock *c, const struct msghdr *msg, uint64_t now);

#endif
