/*
 * cli.h — the command line: flags, an optional YAML file, and the config
 * they make together.
 *
 * `-c FILE` loads the file first; flags given beside it override what it
 * says. Without a file, `--upstream URL` makes a one-upstream, one-route
 * config. The same arguments are applied again on SIGHUP, so a reload reads
 * the file anew and keeps the command line's overrides.
 */
#pragma once

#include <stdbool.h>

#include "config.h"

enum cli_result {
	CLI_RUN,	 /* cfg is ready */
	CLI_EXIT_OK,	 /* --help, --version, -t on a good file: exit 0 */
	CLI_EXIT_USAGE,	 /* a bad flag: exit 2, the message already printed */
	CLI_EXIT_CONFIG, /* a bad config file: exit 1, every problem printed */
};

/* Fills `cfg` (defaults first) from the arguments. Prints what the user
 * must read (help, errors). With `quiet_ok`, nothing is printed on success
 * (reloads). */
enum cli_result cli_config(int argc, char **argv, struct config *cfg);

/* Like cli_config, for a reload: problems go to `errs` instead of stderr,
 * and --help / -t cannot occur. 0, or -1 with `errs`. */
int cli_reload(int argc, char **argv, struct config *cfg, char *errs, size_t errlen);
