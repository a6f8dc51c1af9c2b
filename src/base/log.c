/*
 * log.c — the one leveled logger: one write(2) per line so lines from
 * several threads never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum log_level log_level_max = LOG_INFO;
static const char *const level_names[] = { "error", "warn", "info", "debug" };

int log_level_parse(const char *name, enum log_level *out)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcmp(name, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -1;
}

void log_set_level(enum log_level level)
{
	log_level_max = level;
}

int log_enabled(enum log_level level)
{
	return level <= log_level_max;
}

static void log_vwrite(enum log_level level, uint64_t conn_id, const char *fmt, va_list ap)
{
	char line[2048];
	struct timespec ts;
	struct tm tm;
	size_t n;

	if (!log_enabled(level))
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ %-5s ", ts.tv_nsec / 1000000, level_names[level]);
	if (conn_id)
		n += (size_t)snprintf(line + n, sizeof(line) - n, "c%llu ", (unsigned long long)conn_id);
	if (n < sizeof(line)) {
		int m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
		if (m > 0)
			n += (size_t)m;
	}
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	/* stderr is unbuffered; one write keeps the line whole. */
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vwrite(level, 0, fmt, ap);
	va_end(ap);
}

void log_conn(enum log_level level, uint64_t conn_id, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_vwrite(level, conn_id, fmt, ap);
	va_end(ap);
}
