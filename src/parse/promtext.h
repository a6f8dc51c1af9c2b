/*
 * promtext.h — a small parser of the Prometheus text exposition format
 * (version 0.0.4; OpenMetrics text reads the same for what is kept here):
 * each sample's name, labels and value. Comments, HELP and TYPE lines are
 * skipped; so are lines that do not parse (counted), so that one odd line
 * of an engine's /metrics does not hide the rest.
 *
 * It faces untrusted input (an engine's endpoint, or whatever answers at its
 * address): it only reads the `len` bytes it is given, never past them; a
 * line of PROMTEXT_LINE_MAX bytes or more, or with more than PROMTEXT_LABELS_MAX
 * labels, is skipped whole. It allocates nothing. The caller bounds the body
 * (scrape.c reads at most SCRAPE_BODY_MAX). Fuzzed: tests/fuzz/fuzz_promtext.c.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define PROMTEXT_LINE_MAX 16384
#define PROMTEXT_LABELS_MAX 32

/* A label; `value` is unescaped (\\, \" and \n; a NUL byte in it fails
 * the line) and NUL-terminated in a
 * buffer valid during the callback only; `name` points into the input. */
struct promtext_label {
	const char *name;
	size_t name_len;
	const char *value;
	size_t value_len;
};

struct promtext_sample {
	const char *name; /* into the input; not NUL-terminated */
	size_t name_len;
	struct promtext_label labels[PROMTEXT_LABELS_MAX];
	unsigned nlabels;
	double value; /* NaN and ±Inf as written */
};

typedef void (*promtext_sample_fn)(void *arg, const struct promtext_sample *s);

struct promtext_result {
	size_t samples; /* passed to the callback */
	size_t skipped; /* lines that were neither samples, comments nor blank */
};

/* Calls `fn` for each sample of buf[0..len), in order. */
void promtext_parse(const char *buf, size_t len, promtext_sample_fn fn, void *arg, struct promtext_result *out);

/* Whether the sample's name is `name` (a NUL-terminated string). */
bool promtext_name_is(const struct promtext_sample *s, const char *name);

/* The label called `name`, or NULL. */
const struct promtext_label *promtext_label(const struct promtext_sample *s, const char *name);
