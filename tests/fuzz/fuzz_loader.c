/*
 * fuzz_loader.c — libFuzzer target: the YAML configuration loader.
 *
 * The input is a configuration file (written to a memfd and loaded through
 * its /proc path, as the loader reads files). Checked: the loader returns
 * the number of problems; with problems, the message names the file and a
 * line for each; without, every route sends to defined upstreams and the
 * listeners in force parse; loading twice gives the same answer (no state
 * leaks between loads); nothing crashes, leaks or reads out of bounds.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "config.h"
#include "fuzz_check.h"
#include "loader.h"
#include "log.h"

static unsigned load(const char *path, char *errs, size_t errlen, unsigned *nroutes)
{
	struct config c;
	config_defaults(&c);
	unsigned problems = config_load_file(path, &c, errs, errlen);
	if (problems == 0) {
		struct listener_conf ls[LISTENERS_MAX];
		CHECK(config_listeners(&c, ls) >= 1);
		CHECK(c.nupstreams >= 1);
		for (unsigned i = 0; i < c.nroutes; i++)
			for (unsigned t = 0; t < c.routes[i].ntargets; t++) {
				bool known = false;
				for (unsigned u = 0; u < c.nupstreams; u++)
					known |= strcmp(c.upstreams[u].name, c.routes[i].targets[t].upstream) == 0;
				CHECK(known);
			}
	}
	*nroutes = c.nroutes;
	config_free(&c);
	return problems;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
	static char errs[2][16384];
	char path[64];
	unsigned r1, r2;
	int fd = memfd_create("tokentap-fuzz-config", MFD_CLOEXEC);

	CHECK(fd >= 0);
	CHECK(write(fd, data, len) == (ssize_t)len);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	log_set_level(LOG_ERROR); /* log_level keys must not flood the output */
	unsigned p1 = load(path, errs[0], sizeof(errs[0]), &r1);
	unsigned p2 = load(path, errs[1], sizeof(errs[1]), &r2);
	close(fd);
	CHECK(p1 == p2 && r1 == r2);
	CHECK(strcmp(errs[0], errs[1]) == 0);
	if (p1)
		CHECK(strncmp(errs[0], path, strlen(path)) == 0 && strchr(errs[0], '\n'));
	return 0;
}
