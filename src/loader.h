/*
 * loader.h — tokentap's YAML configuration file (docs/config.md).
 */
#pragma once

#include <stddef.h>

#include "config.h"

/* Reads `path` into `c` (which holds the defaults) and checks it. Returns
 * the number of problems; each is a line "FILE:LINE: message" in `errs`. */
unsigned config_load_file(const char *path, struct config *c, char *errs, size_t errlen);
