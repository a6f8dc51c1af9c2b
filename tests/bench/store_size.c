/*
 * store_size.c — measures what one busy series costs on disk over the full
 * retention (a day of minute slices, thirty days of hour slices, all-time).
 *
 * Traffic: by default 10 requests/s, 256 output tokens each, log-normal
 * TTFT (median 180 ms), ITL (median 22 ms) and prompt length (median 800
 * tokens), 1-32 requests in flight. Sixty distinct minutes are generated and
 * reused; the hour slice is their exact merge. Everything goes through the
 * real store — encoding, compression, pruning — and the LMDB pages in use
 * are reported.
 *
 *   store_size [requests_per_minute] [tokens_per_request]
 */
#include <lmdb.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "slice.h"
#include "store.h"

static uint64_t rng = 88172645463325252ull;

static double uniform(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
}

static double lognormal(double median, double sigma)
{
	double z = sqrt(-2.0 * log(uniform())) * cos(2.0 * M_PI * uniform());
	return median * exp(sigma * z);
}

static void minute_traffic(struct slice *sl, unsigned requests, unsigned tokens)
{
	static const struct slo slo = { 2000000, 100000 };
	struct req_record r;

	for (unsigned i = 0; i < requests; i++) {
		memset(&r, 0, sizeof(r));
		r.status = 200;
		r.usage.input_tokens = (int64_t)lognormal(800, 0.8);
		r.usage.output_tokens = tokens;
		r.at[TL_ARRIVE] = 1;
		r.at[TL_REQ_HEADERS] = r.at[TL_DISPATCH] = r.at[TL_UP_CONNECTED] = 20000;
		r.at[TL_REQ_SENT] = 40000;
		r.at[TL_RESP_HEADERS] = 300000;
		uint64_t t = (uint64_t)lognormal(180e6, 0.6);
		unsigned inflight = 1 + (unsigned)(uniform() * 32);
		for (unsigned k = 0; k < tokens; k++) {
			uint64_t gap;
			if (record_token_event(&r, t, &gap))
				slice_record_itl(sl, gap, inflight);
			t += (uint64_t)lognormal(22e6, 0.3);
		}
		r.at[TL_RESP_END] = r.at[TL_CLIENT_DONE] = t;
		slice_record_request(sl, &r, inflight, &slo);
		record_release(&r);
	}
}

/* The size zlib makes of `n` bytes at the store's level. */
static size_t deflated(const uint8_t *raw, size_t n)
{
	uLongf zlen = compressBound((uLong)n);
	uint8_t *z = malloc(zlen);
	size_t out = z && compress2(z, &zlen, raw, (uLong)n, 6) == Z_OK ? (size_t)zlen : 0;
	free(z);
	return out;
}

static void submit(struct store *st, uint64_t sec, const struct slice *sl)
{
	static const char key[] = "default\0" "127.0.0.1:8000\0" "llama-3-70b\0" "0";
	struct store_batch *b = calloc(1, sizeof(*b));
	b->sec = sec;
	b->items = calloc(1, sizeof(*b->items));
	b->n = b->cap = 1;
	memcpy(b->items[0].key, key, sizeof(key) - 1);
	b->items[0].keylen = sizeof(key) - 1;
	b->items[0].len = slice_encode(sl, &b->items[0].blob);
	store_submit(st, b);
}

/* Pages the slices actually occupy (branch, leaf and overflow pages of the
 * `slices` database); pages LMDB keeps free for reuse are not counted. */
static size_t pages_in_use(const char *dir)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_stat stat;
	size_t used = 0;

	mdb_env_create(&env);
	mdb_env_set_maxdbs(env, 8);
	if (mdb_env_open(env, dir, MDB_RDONLY, 0) == 0 && mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0) {
		if (mdb_dbi_open(txn, "slices", 0, &dbi) == 0 && mdb_stat(txn, dbi, &stat) == 0)
			used = (stat.ms_branch_pages + stat.ms_leaf_pages + stat.ms_overflow_pages) * (size_t)stat.ms_psize;
		mdb_txn_abort(txn);
	}
	mdb_env_close(env);
	return used;
}

/* Writes a series' full retention into a fresh store; returns the slice
 * pages in use, and those of the older days alone in *older. */
static size_t measure(struct slice minutes[60], const struct slice *hour, size_t *older)
{
	char dir[] = "/tmp/tokentap-store-size-XXXXXX";
	struct store_options o;
	char err[256], cmd[300];
	uint64_t now = (uint64_t)time(NULL);

	if (!mkdtemp(dir))
		exit(1);
	store_options_defaults(&o);
	o.dir = dir;
	o.prune_every_s = 0; /* prune after every commit: retention as in steady state */
	struct store *st = store_open(&o, err, sizeof(err));
	if (!st) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	/* thirty days of history, oldest first: by now only hour slices */
	for (unsigned h = 30 * 24 - 1; h >= 24; h--) {
		submit(st, now - (uint64_t)h * 3600, hour);
		if (h % 100 == 0)
			store_sync(st); /* stay under the writer's queue bound */
	}
	store_sync(st);
	*older = pages_in_use(dir);
	/* the last day, minute by minute */
	for (unsigned m = 24 * 60; m > 0; m--) {
		submit(st, now - (uint64_t)m * 60, &minutes[m % 60]);
		if (m % 120 == 0)
			store_sync(st);
	}
	store_sync(st);
	store_close(st);
	size_t used = pages_in_use(dir);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		exit(1);
	return used;
}

int main(int argc, char **argv)
{
	unsigned per_min = argc > 1 ? (unsigned)atoi(argv[1]) : 600;
	unsigned tokens = argc > 2 ? (unsigned)atoi(argv[2]) : 256;
	struct slice minutes[60], hour;

	memset(minutes, 0, sizeof(minutes));
	memset(&hour, 0, sizeof(hour));
	for (unsigned m = 0; m < 60; m++) {
		minute_traffic(&minutes[m], per_min, tokens);
		slice_merge(&hour, &minutes[m]);
	}
	uint8_t *blob;
	size_t mlen = slice_encode(&minutes[0], &blob);
	size_t mz = deflated(blob, mlen);
	free(blob);
	size_t hlen = slice_encode(&hour, &blob);
	size_t hz = deflated(blob, hlen);
	free(blob);
	printf("one series: %u requests/min, %u output tokens each\n", per_min, tokens);
	printf("encoded slice before compression: minute %zu bytes, hour %zu bytes\n", mlen, hlen);
	printf("deflated as the store does (level 6): minute %zu bytes, hour %zu bytes\n", mz, hz);
	size_t older, used = measure(minutes, &hour, &older);
	printf("slice pages in use: %.1f MiB for the full retention (%.1f MiB of it the 29 older days)\n",
	       (double)used / (1 << 20), (double)older / (1 << 20));
	printf("100 such series: about %.0f MiB\n", (double)used * 100 / (1 << 20));
	for (unsigned m = 0; m < 60; m++)
		slice_release(&minutes[m]);
	slice_release(&hour);
	return 0;
}
