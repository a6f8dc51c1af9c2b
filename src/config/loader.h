/*
 * loader.h — tokentap's YAML configuration file (docs/config.md).
 */
#pragma once

#include <stddef.h>

#include "config.h"

/* Reads `path` into `c` (which holds the defaults) and checks it. Returns
 * the number of problems; each is a line "FILE:LINE: message" in `errs`. */
unsigned config_load_file(const char *path, struct config *c, char *errs, size_t errlen);

/* The listener's certificate and key as the file's tls.cert and tls.key are
 * checked (for --tls-cert and --tls-key): each one given must be a readable
 * regular file, and with both, they must load as a pair. Returns 0, or -1
 * with `err` saying what is wrong and `*bad` which: 0 the certificate, 1 the
 * key, 2 the pair. */
int loader_check_tls_files(const char *cert, const char *key, int *bad, char *err, size_t errlen);
