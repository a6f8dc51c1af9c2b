/*
 * fdlimit.h — file descriptors as a resource: the process limit raised at
 * start-up, the estimate of what a configuration may hold at once, and the
 * log line of a listener that ran out (docs/security.md, "Descriptors").
 */
#pragma once

#include <stdint.h>

struct config;

/* How long a listener stops accepting after accept() failed (out of
 * descriptors, most often): the pending connections wait in the kernel's
 * backlog instead of the loop spinning on an error that stays. */
#define ACCEPT_PAUSE_MS 250

/* The admin API's connections at once (admin.c); counted in fdlimit_need. */
#define ADMIN_MAX_CONNECTIONS 64

/* Descriptors the configuration may hold at once with `nworkers` workers:
 * two per client connection (it and the upstream connection its request
 * holds), each worker's idle pooled upstream connections and mirror
 * exchanges, the admin API's connections, and a fixed part for the
 * listeners, the event loops, the store, the logs and the standard streams. */
uint64_t fdlimit_need(const struct config *c, unsigned nworkers);

/* At start-up: raises the soft RLIMIT_NOFILE to the hard one (or to what
 * the kernel allows a process, /proc/sys/fs/nr_open, when that is lower) and
 * logs the change; then fdlimit_fit, logging a lowered cap; then as
 * fdlimit_check. */
void fdlimit_raise(struct config *c, unsigned nworkers);

/* When the user did not set limits.max_connections: lowers it to the most
 * the soft limit in force holds beside the rest of fdlimit_need (at least
 * 1), if that is less. Returns the new value, 0 when unchanged. Every
 * configuration a worker takes goes through it, so that all agree. */
unsigned fdlimit_fit(struct config *c, unsigned nworkers);

/* Warns when the soft limit in force is below fdlimit_need, saying what
 * to change, and naming limits.max_connections only when the user set it.
 * Returns the limit in force (0 when unknown). */
uint64_t fdlimit_check(const struct config *c, unsigned nworkers);

/* A failed accept() on `who` ("proxy", "admin") with errno `err`: logs it at
 * most once a second over the whole process (any thread), saying how many
 * failures since the last line were not logged. */
void fdlimit_accept_failed(const char *who, int err);
