/*
 * bench_dist.c — the random parts of a benchmark: prompt and output lengths,
 * arrival gaps, prompt text.
 *
 * Everything here is a pure function of the seed (and the request number
 * where there is one), so two runs with the same flags send the same
 * lengths and the same text in the same order, whatever the concurrency.
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

void rng_seed(struct rng *r, uint64_t seed)
{
	r->s = seed;
}

uint64_t rng_next(struct rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double rng_unit(struct rng *r)
{
	/* 53 random bits, shifted off zero so that log() is always defined */
	return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(struct rng *r)
{
	double u1 = rng_unit(r), u2 = rng_unit(r);
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Marsaglia and Tsang's method; for shape < 1 the usual boost
 * gamma(k) = gamma(k + 1) * U^(1/k). Mean k. */
static double rng_gamma(struct rng *r, double k)
{
	double boost = 1.0;
	if (k < 1.0) {
		boost = pow(rng_unit(r), 1.0 / k);
		k += 1.0;
	}
	double d = k - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
	for (int i = 0; i < 1000; i++) {
		double x = rng_normal(r), v = 1.0 + c * x;
		if (v <= 0)
			continue;
		v = v * v * v;
		double u = rng_unit(r);
		if (log(u) < 0.5 * x * x + d - d * v + d * log(v))
			return d * v * boost;
	}
	return k * boost; /* practically unreachable: fall back to the mean */
}

double arrival_gap_s(struct rng *r, enum arrivals kind, double rate, double burstiness)
{
	if (kind == ARRIVALS_GAMMA)
		return rng_gamma(r, burstiness) / (burstiness * rate);
	return -log(rng_unit(r)) / rate;
}

/* ---- length distributions ---- */

static int parse_num(const char *s, const char *end, double *out)
{
	char buf[64];
	size_t n = (size_t)(end - s);
	char *e;

	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n);
	buf[n] = '\0';
	errno = 0;
	*out = strtod(buf, &e);
	if (*e != '\0' || errno || !isfinite(*out) || *out < 0 || *out > BENCH_MAX_LEN)
		return -1;
	return 0;
}

static int load_file(struct dist *d, const char *path, unsigned min, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char line[128];
	size_t cap = 0, lineno = 0;

	if (!f) {
		snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		char *e;
		lineno++;
		if (line[0] == '#' || line[strspn(line, " \t\r\n")] == '\0')
			continue;
		errno = 0;
		unsigned long v = strtoul(line, &e, 10);
		e += strspn(e, " \t\r\n");
		if (*e != '\0' || errno || v < min || v > BENCH_MAX_LEN || line[0] == '-') {
			snprintf(err, errlen, "%s:%zu: expected a length from %u to %u, one per line", path, lineno,
				 min, BENCH_MAX_LEN);
			goto fail;
		}
		if (d->n == BENCH_MAX_FILE_LENS) {
			snprintf(err, errlen, "%s: more than %d lengths", path, BENCH_MAX_FILE_LENS);
			goto fail;
		}
		if (d->n == cap) {
			size_t ncap = cap ? cap * 2 : 256;
			uint32_t *p = realloc(d->vals, ncap * sizeof(*p));
			if (!p) {
				snprintf(err, errlen, "%s: out of memory", path);
				goto fail;
			}
			d->vals = p;
			cap = ncap;
		}
		d->vals[d->n++] = (uint32_t)v;
	}
	if (ferror(f)) {
		snprintf(err, errlen, "cannot read '%s'", path);
		goto fail;
	}
	fclose(f);
	if (d->n == 0) {
		snprintf(err, errlen, "%s holds no lengths", path);
		return -1;
	}
	return 0;
fail:
	fclose(f);
	return -1;
}

int dist_parse(struct dist *d, const char *s, unsigned min, char *err, size_t errlen)
{
	const char *colon = strchr(s, ':');
	const char *rest = colon ? colon + 1 : s;
	size_t kind_len = colon ? (size_t)(colon - s) : 0;

	memset(d, 0, sizeof(*d));
	snprintf(d->desc, sizeof(d->desc), "%s", s);
	if (!colon || (kind_len == 5 && !memcmp(s, "fixed", 5))) {
		if (parse_num(rest, rest + strlen(rest), &d->a) || d->a != floor(d->a) || d->a < min)
			goto bad;
		d->kind = DIST_FIXED;
		snprintf(d->desc, sizeof(d->desc), "%u", (unsigned)d->a);
		return 0;
	}
	if (kind_len == 4 && !memcmp(s, "file", 4)) {
		d->kind = DIST_FILE;
		if (!*rest) {
			snprintf(err, errlen, "file: needs a path");
			return -1;
		}
		return load_file(d, rest, min, err, errlen);
	}
	const char *c2 = strchr(rest, ':');
	if (!c2 || parse_num(rest, c2, &d->a) || parse_num(c2 + 1, c2 + 1 + strlen(c2 + 1), &d->b))
		goto bad;
	if (kind_len == 7 && !memcmp(s, "uniform", 7)) {
		if (d->a != floor(d->a) || d->b != floor(d->b) || d->a > d->b || d->a < min)
			goto bad;
		d->kind = DIST_UNIFORM;
		return 0;
	}
	if (kind_len == 6 && !memcmp(s, "normal", 6)) {
		if (d->a < min)
			goto bad;
		d->kind = DIST_NORMAL;
		return 0;
	}
bad:
	snprintf(err, errlen,
		 "'%s' is not a length distribution: use fixed:N, uniform:A:B, normal:MEAN:SD or file:PATH "
		 "(lengths %u to %u)",
		 s, min, BENCH_MAX_LEN);
	return -1;
}

uint32_t dist_draw(const struct dist *d, uint64_t seed, uint64_t seq, unsigned min)
{
	struct rng r;
	double v;

	rng_seed(&r, seed ^ (seq * 0xd1b54a32d192ed03ull));
	rng_next(&r);
	switch (d->kind) {
	case DIST_FIXED: return (uint32_t)d->a;
	case DIST_UNIFORM: return (uint32_t)(d->a + floor(rng_unit(&r) * (d->b - d->a + 1)));
	case DIST_NORMAL:
		v = llround(d->a + d->b * rng_normal(&r));
		if (v < min)
			v = min;
		if (v > BENCH_MAX_LEN)
			v = BENCH_MAX_LEN;
		return (uint32_t)v;
	case DIST_FILE: return d->vals[seq % d->n];
	}
	return min;
}

void dist_free(struct dist *d)
{
	free(d->vals);
	d->vals = NULL;
	d->n = 0;
}

/* ---- prompt text ---- */

static const char *const words[] = {
	"the",	  "model",  "server", "token", "stream", "latency", "request", "answer", "batch",  "cache",
	"prompt", "first",  "queue",  "load",  "time",	 "memory",  "kernel",  "every",	 "short",  "story",
	"about",  "river",  "light",  "under", "quiet",	 "signal",  "north",   "paper",	 "window", "garden",
	"simple", "number", "would",  "with",  "from",	 "into",    "there",   "while",	 "after",  "again",
};

void prompt_text_add(struct evbuffer *out, uint32_t tokens, uint64_t seed, uint64_t seq)
{
	size_t left = (size_t)tokens * BENCH_BYTES_PER_TOKEN;
	char buf[4096];
	size_t n = 0;
	struct rng r;

	rng_seed(&r, seed ^ 0x5bd1e995u ^ (seq * 0x9e3779b97f4a7c15ull));
	while (left > 0) {
		const char *w = words[rng_next(&r) % (sizeof(words) / sizeof(words[0]))];
		size_t wl = strlen(w);
		if (wl + 1 <= left) {
			memcpy(buf + n, w, wl);
			buf[n + wl] = ' ';
			n += wl + 1;
			left -= wl + 1;
		} else {
			/* the last few bytes: letters, so the count stays exact */
			memset(buf + n, 'a', left);
			n += left;
			left = 0;
		}
		if (n > sizeof(buf) - 16) {
			evbuffer_add(out, buf, n);
			n = 0;
		}
	}
	if (n)
		evbuffer_add(out, buf, n);
}
