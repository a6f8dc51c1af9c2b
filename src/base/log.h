/*
 * log.h — the one leveled logger.
 *
 * Lines go to stderr as `LEVEL message`, prefixed with a connection id when
 * the caller has one. Nothing in the core writes to stderr directly.
 */
#pragma once

#include <stdint.h>

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* The level named error, warn, info or debug; -1 for any other name. */
int log_level_parse(const char *name, enum log_level *out);
/* Sets the most verbose level printed. */
void log_set_level(enum log_level level);
int log_enabled(enum log_level level);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, naming the connection the line is about. */
void log_conn(enum log_level level, uint64_t conn_id, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) \
	do { \
		if (log_enabled(LOG_DEBUG)) \
			log_msg(LOG_DEBUG, __VA_ARGS__); \
	} while (0)
