/*
 * store_size.c — measures what one busy series costs on disk over the full
 * retention (a day of minute slices, thirty days of hour slices, all-time).
 *
 * Traffic: by default 10 requests/s, 256 output tokens each, log-normal
 * TTFT (median 180 ms), ITL (median 22 ms) and prompt length (median 800
 * tokens), 1-32 requests in flight. A pool of distinct minutes is generated
 * and reused; each hour is the exact merge of sixty minutes drawn from the
 * pool, so that no two hours are the same (identical hours would flatter
 * any compression that spans hours, as the store's day packs do).
 * Everything goes through the real store — encoding, compression, packing,
 * pruning — and the LMDB pages in use are reported. Then the writer's time
 * to pack a day of hours of 100 such series, in one pass and in passes of
 * the default bound, and the time of the windows that read hours over
 * them, are measured.
 *
 *   store_size [requests_per_minute] [tokens_per_request]
 */
#include <lmdb.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "slice.h"
#include "store.h"
#include "testrand.h"

static void minute_traffic(struct slice *sl, unsigned requests, unsigned tokens)
{
	static const struct slo slo = { 2000000, 100000, 0 };
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
			if (record_token_event(&r, TOKEN_ANSWER, t, &gap))
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

#define POOL 120 /* distinct minutes */

/* Hour number `h`: sixty minutes of the pool, drawn by a generator seeded
 * with `h`, merged. */
static void hour_slice(struct slice *out, const struct slice pool[POOL], unsigned h)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (h + 1);

	slice_release(out);
	for (unsigned m = 0; m < 60; m++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		slice_merge(out, &pool[x % POOL]);
	}
}

/* One batch at `sec` holding `sl` for `nseries` series (models m0, m1, ...). */
static void submit_n(struct store *st, uint64_t sec, const struct slice *sl, unsigned nseries)
{
	struct store_batch *b = calloc(1, sizeof(*b));
	uint8_t *blob;
	size_t len = slice_encode(sl, &blob);

	b->sec = sec;
	b->items = calloc(nseries, sizeof(*b->items));
	b->n = b->cap = nseries;
	for (unsigned i = 0; i < nseries; i++) {
		int kl = snprintf(b->items[i].key, sizeof(b->items[i].key), "default%c127.0.0.1:8000%cm%u%c0", 0, 0, i,
				  0);
		b->items[i].keylen = (size_t)kl;
		b->items[i].blob = malloc(len);
		memcpy(b->items[i].blob, blob, len);
		b->items[i].len = len;
	}
	free(blob);
	store_submit(st, b);
}

static void submit(struct store *st, uint64_t sec, const struct slice *sl)
{
	submit_n(st, sec, sl, 1);
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
			used = (stat.ms_branch_pages + stat.ms_leaf_pages + stat.ms_overflow_pages) *
			       (size_t)stat.ms_psize;
		mdb_txn_abort(txn);
	}
	mdb_env_close(env);
	return used;
}

static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Writes a series' full retention into a fresh store; returns the slice
 * pages in use, and those of the older days alone in *older. */
static size_t measure(const struct slice pool[POOL], size_t *older)
{
	struct slice hour;
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
	memset(&hour, 0, sizeof(hour));
	for (unsigned h = 30 * 24 - 1; h >= 24; h--) {
		hour_slice(&hour, pool, h);
		submit(st, now - (uint64_t)h * 3600, &hour);
		if (h % 100 == 0)
			store_sync(st); /* stay under the writer's queue bound */
	}
	store_sync(st);
	slice_release(&hour);
	*older = pages_in_use(dir);
	/* the last day, minute by minute */
	for (unsigned m = 24 * 60; m > 0; m--) {
		submit(st, now - (uint64_t)m * 60, &pool[m % POOL]);
		if (m % 120 == 0)
			store_sync(st);
	}
	store_sync(st);
	store_close(st);
	size_t used = pages_in_use(dir);
	struct stat sb;
	snprintf(cmd, sizeof(cmd), "%s/data.mdb", dir);
	if (stat(cmd, &sb) == 0)
		printf("data.mdb: %.1f MiB (free pages LMDB keeps for reuse included)\n",
		       (double)sb.st_size / (1 << 20));
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		exit(1);
	return used;
}

/* `bounded`: the default bound on the packs a pass rewrites; else none. */
static struct store *open_store(const char *dir, uint64_t prune_every_s, bool bounded)
{
	struct store_options o;
	char err[256];

	store_options_defaults(&o);
	o.dir = dir;
	o.prune_every_s = prune_every_s;
	if (!bounded)
		o.pack_per_pass = 0;
	struct store *st = store_open(&o, err, sizeof(err));
	if (!st) {
		fprintf(stderr, "%s\n", err);
		exit(1);
	}
	return st;
}

/* One flush of 100 series in the current hour, committed: its time. */
static double flush_ms(struct store *st, const struct slice *sl)
{
	double t0 = mono_ms();
	submit_n(st, (uint64_t)time(NULL), sl, 100);
	store_sync(st);
	return mono_ms() - t0;
}

/*
 * The writer's time for 100 such series: a day of their hours two days ago
 * is written with pruning off, then the store is reopened with it on, and
 * the flushes that follow pack that day (all in the first, with `bounded`
 * off; pack_per_pass packs a flush, with it on) before later ones pay for
 * their commit alone. Returns the store, open, in its directory `dir`.
 */
static struct store *pack_time(const struct slice pool[POOL], char *dir, bool bounded)
{
	struct slice hour;
	struct store_options def;
	uint64_t day = (uint64_t)time(NULL) / 86400 - 2;

	if (!mkdtemp(dir))
		exit(1);
	struct store *st = open_store(dir, UINT64_MAX, bounded);
	memset(&hour, 0, sizeof(hour));
	for (unsigned h = 0; h < 24; h++) {
		hour_slice(&hour, pool, h);
		submit_n(st, day * 86400 + h * 3600 + 1800, &hour, 100);
		store_sync(st);
	}
	slice_release(&hour);
	store_close(st);
	st = open_store(dir, 0, bounded);
	store_options_defaults(&def);
	unsigned packing = bounded ? (100 + def.pack_per_pass - 1) / def.pack_per_pass : 1;
	double slowest = 0, sum = 0, rest = 0;
	for (unsigned i = 0; i < packing; i++) {
		double t = flush_ms(st, &pool[i % POOL]);
		sum += t;
		slowest = t > slowest ? t : slowest;
	}
	for (unsigned i = 0; i < 5; i++)
		rest += flush_ms(st, &pool[(packing + i) % POOL]);
	if (bounded)
		printf("writer, 100 such series, %u packs a pass: %u flushes pack a day of their hours, the slowest "
		       "%.0f ms, %.0f ms on average; later flushes %.0f ms (commit and pruning)\n",
		       def.pack_per_pass, packing, slowest, sum / packing, rest / 5);
	else
		printf("writer, 100 such series, no bound on a pass: the flush that packs a day of their hours "
		       "%.0f ms, later flushes %.0f ms (commit and pruning)\n",
		       slowest, rest / 5);
	return st;
}

static void remove_store(struct store *st, const char *dir)
{
	char cmd[300];

	store_close(st);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		exit(1);
}

/* Packing timed without and with the bound on a pass, then the windows
 * that read hours timed over the last two days. */
static void writer_time(const struct slice pool[POOL])
{
	char dir0[] = "/tmp/tokentap-store-size-XXXXXX", dir[] = "/tmp/tokentap-store-size-XXXXXX";
	struct slice hour;
	char err[256];

	remove_store(pack_time(pool, dir0, false), dir0);
	struct store *st = pack_time(pool, dir, true);
	memset(&hour, 0, sizeof(hour));

	/* the last two days, then what the windows that read hours cost */
	uint64_t now = (uint64_t)time(NULL);
	for (unsigned h = 48; h > 0; h--) {
		hour_slice(&hour, pool, 100 + h);
		submit_n(st, now - (uint64_t)h * 3600, &hour, 100);
		store_sync(st);
	}
	submit_n(st, now, &pool[0], 100);
	store_sync(st);
	static const enum store_window wins[] = { WIN_1H, WIN_24H, WIN_7D };
	printf("queries over 100 such series:");
	for (unsigned w = 0; w < 3; w++) {
		struct store_result res;
		double t0 = mono_ms();
		for (unsigned i = 0; i < 5; i++) {
			if (store_query(st, wins[w], &res, err, sizeof(err)) == -1) {
				fprintf(stderr, "%s\n", err);
				exit(1);
			}
			store_result_free(&res);
		}
		printf(" %s %.0f ms%s", store_window_name(wins[w]), (mono_ms() - t0) / 5, w < 2 ? "," : "\n");
	}
	slice_release(&hour);
	remove_store(st, dir);
}

int main(int argc, char **argv)
{
	testrand_state = 88172645463325252ull;
	unsigned per_min = argc > 1 ? (unsigned)atoi(argv[1]) : 600;
	unsigned tokens = argc > 2 ? (unsigned)atoi(argv[2]) : 256;
	static struct slice minutes[POOL];
	struct slice hour;

	memset(&hour, 0, sizeof(hour));
	for (unsigned m = 0; m < POOL; m++)
		minute_traffic(&minutes[m], per_min, tokens);
	hour_slice(&hour, minutes, 0);
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
	size_t older, used = measure(minutes, &older);
	printf("slice pages in use: %.1f MiB for the full retention (%.1f MiB of it the 29 older days)\n",
	       (double)used / (1 << 20), (double)older / (1 << 20));
	printf("100 such series: about %.0f MiB\n", (double)used * 100 / (1 << 20));
	writer_time(minutes);
	for (unsigned m = 0; m < POOL; m++)
		slice_release(&minutes[m]);
	slice_release(&hour);
	return 0;
}
