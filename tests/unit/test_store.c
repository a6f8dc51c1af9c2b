/*
 * test_store.c — slices, shards and the LMDB store: exact totals across
 * threads and flushes, persistence across reopen, refusal of a foreign
 * layout and of a second opener, and the day packs of hour slices.
 *
 * The store's sources (store.c, store_held.c, store_pack.c,
 * store_query.c) are included, not linked, so that the pack pass can be
 * run at a chosen time and its transaction aborted instead of committed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "slice.h"
#include "stats.h"
#include "store.c"
#include "store_held.c"
#include "store_pack.c"
#include "store_query.c"

static char *make_dir(void)
{
	char tmpl[] = "/tmp/tokentap-test-store-XXXXXX";
	char *d = mkdtemp(tmpl);
	assert_non_null(d);
	return strdup(d);
}

static void remove_dir(char *d)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	assert_int_equal(system(cmd), 0);
	free(d);
}

/* A finished streamed request: ttft, `tokens` token events `itl_us` apart. */
static void fake_request(struct req_record *r, uint64_t ttft_us, unsigned tokens, uint64_t itl_us)
{
	memset(r, 0, sizeof(*r));
	r->itl_keep = true; /* the tests replay the gaps */
	r->usage.input_tokens = 10;
	r->usage.output_tokens = tokens;
	r->status = 200;
	r->at[TL_ARRIVE] = 1000000;
	r->at[TL_REQ_HEADERS] = r->at[TL_ARRIVE] + 1000;
	r->at[TL_DISPATCH] = r->at[TL_REQ_HEADERS];
	r->at[TL_UP_CONNECTED] = r->at[TL_DISPATCH];
	r->at[TL_REQ_SENT] = r->at[TL_DISPATCH] + 1000;
	r->at[TL_RESP_HEADERS] = r->at[TL_REQ_SENT] + 1000;
	uint64_t t = r->at[TL_ARRIVE] + ttft_us * 1000;
	for (unsigned i = 0; i < tokens; i++, t += itl_us * 1000) {
		uint64_t gap;
		record_token_event(r, t, &gap);
	}
	r->at[TL_RESP_END] = t;
	r->at[TL_CLIENT_DONE] = t;
}

static const struct slo test_slo = { 2000000, 100000, 0 };

static void test_slice_encode_roundtrip(void **state)
{
	struct slice a, b;
	struct req_record r;
	uint8_t *blob = NULL;
	size_t len;

	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	fake_request(&r, 50000, 20, 10000);
	slice_record_request(&a, &r, 3, &test_slo);
	for (size_t i = 0; i < r.itl_n; i++)
		slice_record_itl(&a, r.itl_ns[i], 3);
	record_release(&r);
	len = slice_encode(&a, &blob);
	assert_true(len > 0);
	assert_int_equal(slice_decode_merge(&b, blob, len), 0);
	for (unsigned i = 0; i < CT__COUNT; i++)
		assert_int_equal(a.counters[i], b.counters[i]);
	for (unsigned i = 0; i < SLICE_SLOTS; i++) {
		if (!a.slot[i] || !a.slot[i]->count) {
			assert_true(!b.slot[i] || !b.slot[i]->count);
			continue;
		}
		assert_non_null(b.slot[i]);
		assert_memory_equal(a.slot[i], b.slot[i], sizeof(struct hist));
	}
	assert_int_equal(b.counters[CT_REQUESTS], 1);
	assert_int_equal(b.counters[CT_OUTPUT_TOKENS], 20);
	assert_int_equal(b.slot[HM_ITL]->count, 19);
	assert_int_equal(b.slot[HM_TTFT]->min, 50000);
	assert_int_equal(b.slot[SLOT_CURVE(CURVE_TTFT, log2_bucket(3, INFLIGHT_BUCKETS))]->count, 1);
	/* truncated and garbage input are refused, dst untouched */
	for (size_t cut = 0; cut < len; cut++)
		assert_int_equal(slice_decode_merge(&b, blob, cut), -1);
	assert_int_equal(b.counters[CT_REQUESTS], 1);
	free(blob);
	slice_release(&a);
	slice_release(&b);
}

/* ITL gaps are stored in µs rounded to nearest, as ttft and the rest are
 * (and as the access log prints them), not rounded down. */
static void test_itl_rounds_to_nearest(void **state)
{
	struct slice sl;
	struct req_record r;

	memset(&sl, 0, sizeof(sl));
	slice_record_itl(&sl, 1999, 1);
	slice_record_itl(&sl, 2499, 1);
	slice_record_itl(&sl, 2500, 1);
	assert_int_equal(sl.slot[HM_ITL]->min, 2);
	assert_int_equal(sl.slot[HM_ITL]->max, 3);
	assert_int_equal(sl.slot[HM_ITL]->sum, 2 + 2 + 3);
	fake_request(&r, 1000, 4, 1000);
	r.at[TL_FIRST_TOKEN] = r.at[TL_ARRIVE] + 1999; /* ttft 1.999 µs */
	slice_record_request(&sl, &r, 1, &test_slo);
	assert_int_equal(sl.slot[HM_TTFT]->max, 2);
	record_release(&r);
	slice_release(&sl);
}

static void test_log2_buckets(void **state)
{
	assert_int_equal(log2_bucket(0, 12), 0);
	assert_int_equal(log2_bucket(1, 12), 0);
	assert_int_equal(log2_bucket(2, 12), 1);
	assert_int_equal(log2_bucket(3, 12), 2);
	assert_int_equal(log2_bucket(4, 12), 2);
	assert_int_equal(log2_bucket(5, 12), 3);
	assert_int_equal(log2_bucket(1024, 12), 10);
	assert_int_equal(log2_bucket(1025, 12), 11);
	assert_int_equal(log2_bucket(1u << 30, 12), 11);
	for (unsigned b = 0; b < 11; b++) {
		assert_int_equal(log2_bucket(log2_bucket_low(b), 12), b);
		assert_int_equal(log2_bucket(log2_bucket_high(b, 12), 12), b);
	}
}

static uint64_t total_requests(struct store *st, enum store_window w, uint64_t *itl_count, uint64_t *p50)
{
	struct store_result res;
	char err[256];
	struct slice all;
	uint64_t n;

	memset(&all, 0, sizeof(all));
	assert_int_equal(store_query(st, w, &res, err, sizeof(err)), 0);
	for (size_t i = 0; i < res.n; i++)
		slice_merge(&all, &res.series[i].slice);
	store_result_free(&res);
	n = all.counters[CT_REQUESTS];
	if (itl_count)
		*itl_count = all.slot[HM_ITL] ? all.slot[HM_ITL]->count : 0;
	if (p50)
		*p50 = all.slot[HM_TTFT] ? hist_quantile(all.slot[HM_TTFT], 0.5) : 0;
	slice_release(&all);
	return n;
}

struct worker_arg {
	struct store *store;
	unsigned id, requests;
};

/* One worker: its own shard, recording and flushing with no coordination. */
static void *worker(void *p)
{
	struct worker_arg *w = p;
	struct stats_shard *sh = stats_shard_new(NULL, w->store, 4, 0, &test_slo, 1000);
	char model[16];
	struct req_record r;

	snprintf(model, sizeof(model), "m%u", w->id % 3);
	for (unsigned i = 0; i < w->requests; i++) {
		struct series *se = stats_series(sh, "default", "up", model, i % 7 == 0, true);
		fake_request(&r, 1000 + i % 500, 5, 2000);
		for (size_t k = 0; k < r.itl_n; k++)
			stats_record_itl(se, r.itl_ns[k], 1);
		stats_record_request(se, &r, 1);
		record_release(&r);
		if (i % 97 == 0)
			stats_shard_flush(sh);
	}
	stats_shard_free(sh); /* flushes the rest */
	return NULL;
}

static void test_threads_totals_exact(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	char err[256];
	pthread_t t[4];
	struct worker_arg a[4];
	uint64_t itl;

	store_options_defaults(&o);
	o.dir = dir;
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	for (unsigned i = 0; i < 4; i++) {
		a[i] = (struct worker_arg){ st, i, 2000 + i * 37 };
		assert_int_equal(pthread_create(&t[i], NULL, worker, &a[i]), 0);
	}
	for (unsigned i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	store_sync(st);
	uint64_t expect = 0;
	for (unsigned i = 0; i < 4; i++)
		expect += a[i].requests;
	assert_int_equal(total_requests(st, WIN_ALL, &itl, NULL), expect);
	assert_int_equal(itl, expect * 4);
	assert_int_equal(total_requests(st, WIN_1H, NULL, NULL), expect);
	assert_int_equal(total_requests(st, WIN_5M, NULL, NULL), expect);
	store_close(st);
	remove_dir(dir);
}

static void test_reopen_keeps_numbers(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	char err[256];
	uint64_t p50a, p50b;

	store_options_defaults(&o);
	o.dir = dir;
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	struct worker_arg a = { st, 0, 500 };
	worker(&a);
	store_sync(st);
	assert_int_equal(total_requests(st, WIN_1H, NULL, &p50a), 500);
	/* a second opener of the same directory is refused with a reason */
	struct store *st2 = store_open(&o, err, sizeof(err));
	assert_null(st2);
	assert_non_null(strstr(err, "in use by another tokentap"));
	store_close(st);

	st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	assert_int_equal(total_requests(st, WIN_1H, NULL, &p50b), 500);
	assert_int_equal(total_requests(st, WIN_ALL, NULL, NULL), 500);
	assert_int_equal(p50a, p50b);
	assert_int_equal(store_reset(st, err, sizeof(err)), 0);
	assert_int_equal(total_requests(st, WIN_ALL, NULL, NULL), 0);
	store_close(st);
	remove_dir(dir);
}

static void test_foreign_layout_refused(void **state)
{
	char *dir = make_dir();
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = { 6, "layout" }, v = { 16, "tokentap-stats-9" };
	struct store_options o;
	char err[512];

	assert_int_equal(mdb_env_create(&env), 0);
	mdb_env_set_maxdbs(env, 8);
	assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, "meta", MDB_CREATE, &dbi), 0);
	assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);

	store_options_defaults(&o);
	o.dir = dir;
	assert_null(store_open(&o, err, sizeof(err)));
	assert_non_null(strstr(err, "tokentap-stats-9"));
	remove_dir(dir);
}

/* Writes one record into database `name` (NULL: the main one) of a new
 * LMDB environment in `dir`. */
static void lmdb_put_one(const char *dir, const char *name, const char *key, const char *val)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = { strlen(key), (void *)key }, v = { strlen(val), (void *)val };

	assert_int_equal(mdb_env_create(&env), 0);
	mdb_env_set_maxdbs(env, 8);
	assert_int_equal(mdb_env_open(env, dir, 0, 0640), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
	assert_int_equal(mdb_dbi_open(txn, name, name ? MDB_CREATE : 0, &dbi), 0);
	assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
	assert_int_equal(mdb_txn_commit(txn), 0);
	mdb_env_close(env);
}

/* True when `dir`'s LMDB still has `key` in database `name` and no `meta`
 * database was added (for name != "meta"). */
static bool lmdb_untouched(const char *dir, const char *name, const char *key)
{
	MDB_env *env;
	MDB_txn *txn;
	MDB_dbi dbi;
	MDB_val k = { strlen(key), (void *)key }, v;
	bool ok;

	assert_int_equal(mdb_env_create(&env), 0);
	mdb_env_set_maxdbs(env, 8);
	assert_int_equal(mdb_env_open(env, dir, MDB_RDONLY, 0640), 0);
	assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
	ok = mdb_dbi_open(txn, name, 0, &dbi) == 0 && mdb_get(txn, dbi, &k, &v) == 0;
	if (name && strcmp(name, "meta") != 0)
		ok = ok && mdb_dbi_open(txn, "meta", 0, &dbi) == MDB_NOTFOUND;
	mdb_txn_abort(txn);
	mdb_env_close(env);
	return ok;
}

/* Another program's LMDB in the data directory is refused, with a message
 * that says so, and left as it was: not written to, not moved aside. */
static void test_foreign_database_left_alone(void **state)
{
	static const struct {
		const char *db, *key, *val;
	} cases[] = {
		{ "jobs", "job-1", "queued" },		/* named databases, no meta */
		{ NULL, "plain-key", "plain-value" },	/* records in the main database */
		{ "meta", "layout", "someone-else-1" }, /* a meta of its own */
		{ "meta", "owner", "someone else" },	/* a meta without a layout */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *dir = make_dir(), err[512], path[600];
		struct store_options o;
		struct stat sb;

		lmdb_put_one(dir, cases[i].db, cases[i].key, cases[i].val);
		store_options_defaults(&o);
		o.dir = dir;
		assert_null(store_open(&o, err, sizeof(err)));
		assert_non_null(strstr(err, "not a tokentap store"));
		assert_non_null(strstr(err, dir));
		snprintf(path, sizeof(path), "%s/data.mdb", dir);
		assert_int_equal(stat(path, &sb), 0);
		assert_true(lmdb_untouched(dir, cases[i].db, cases[i].key));
		remove_dir(dir);
	}
}

static void test_model_cap(void **state)
{
	struct stats_shard *sh = stats_shard_new(NULL, NULL, 2, 0, &test_slo, 1000);
	struct series *a = stats_series(sh, "r", "u", "a", false, true);
	struct series *b = stats_series(sh, "r", "u", "b", false, true);
	struct series *a_cold = stats_series(sh, "r", "u", "a", true, true);
	struct series *c = stats_series(sh, "r", "u", "c", false, true);
	struct series *d = stats_series(sh, "r", "u", "d", false, true);

	assert_non_null(a);
	assert_ptr_not_equal(a, b);
	assert_ptr_not_equal(a, a_cold);
	assert_ptr_equal(a, stats_series(sh, "r", "u", "a", false, true));
	/* past the cap, new models fold into one "other" series */
	assert_ptr_equal(c, d);
	assert_ptr_equal(c, stats_series(sh, "r", "u", "other", false, true));
	/* the cap is the route's, for every shard and upstream: another worker
	 * names a and b, on any upstream, and folds c into "other" */
	struct stats_shard *sh2 = stats_shard_new(NULL, NULL, 2, 0, &test_slo, 1000);
	struct series *o2 = stats_series(sh2, "r", "u2", "other", false, true);
	assert_ptr_not_equal(stats_series(sh2, "r", "u2", "a", false, true), o2);
	assert_ptr_not_equal(stats_series(sh2, "r", "u", "b", false, true), o2);
	assert_ptr_equal(stats_series(sh2, "r", "u2", "c", false, true), o2);
	/* another route has a budget of its own */
	assert_ptr_not_equal(stats_series(sh2, "r2", "u", "c", false, true),
			     stats_series(sh2, "r2", "u", "other", false, true));
	/* a failed answer admits no name, but stays under one already admitted */
	struct series *o3 = stats_series(sh2, "r3", "u", "other", false, true);
	assert_ptr_equal(stats_series(sh2, "r3", "u", "x", false, false), o3);
	struct series *y = stats_series(sh2, "r3", "u", "y", false, true);
	assert_ptr_not_equal(y, o3);
	assert_ptr_equal(stats_series(sh2, "r3", "u", "y", false, false), y);
	assert_ptr_not_equal(stats_series(sh2, "r3", "u", "y", true, false), o3);
	assert_ptr_equal(stats_series(sh2, "r3", "u", "x", true, false),
			 stats_series(sh2, "r3", "u", "other", true, true));
	assert_ptr_not_equal(stats_series(sh2, "r3", "u", "x", false, true), o3);
	stats_shard_free(sh2);
	stats_shard_free(sh);
}

/* A batch with one series' slice holding `requests` requests, stamped `sec`. */
static struct store_batch *batch_at(uint64_t sec, const char *model, unsigned requests)
{
	struct store_batch *b = calloc(1, sizeof(*b));
	struct slice sl;
	struct req_record r;

	memset(&sl, 0, sizeof(sl));
	for (unsigned i = 0; i < requests; i++) {
		fake_request(&r, 1000 + i, 4, 3000 + i);
		slice_record_request(&sl, &r, 2, &test_slo);
		for (size_t k = 0; k < r.itl_n; k++)
			slice_record_itl(&sl, r.itl_ns[k], 2);
		record_release(&r);
	}
	b->sec = sec;
	b->items = calloc(1, sizeof(*b->items));
	b->cap = b->n = 1;
	memcpy(b->items[0].key, "default\0up\0", 11);
	size_t ml = strlen(model);
	memcpy(b->items[0].key + 11, model, ml + 1);
	b->items[0].key[11 + ml + 1] = '0';
	b->items[0].keylen = 11 + ml + 2;
	b->items[0].len = slice_encode(&sl, &b->items[0].blob);
	assert_true(b->items[0].len > 0);
	slice_release(&sl);
	return b;
}

static void test_prune_past_retention(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	char err[256];
	uint64_t series, slices, bad, now = (uint64_t)time(NULL);

	store_options_defaults(&o);
	o.dir = dir;
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	/* three days old: its minute slice is past the 24 h retention, its hour
	 * slice within 30 days; the writer prunes after its first commit */
	store_submit(st, batch_at(now - 3 * 86400, "old", 5));
	store_sync(st);
	assert_int_equal(store_verify(st, &series, &slices, &bad, err, sizeof(err)), 0);
	assert_int_equal(series, 1);
	assert_int_equal(bad, 0);
	assert_int_equal(slices, 2); /* hour + all-time */
	assert_int_equal(total_requests(st, WIN_ALL, NULL, NULL), 5);
	assert_int_equal(total_requests(st, WIN_24H, NULL, NULL), 0);
	store_close(st);
	remove_dir(dir);
}

static size_t count_keys(struct store *st, char kind);

static void test_map_full_grows(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	char err[256];
	uint64_t now = (uint64_t)time(NULL);
	unsigned total = 0;

	store_options_defaults(&o);
	o.dir = dir;
	o.map_size = 64u << 10; /* far too small: the writer must grow it */
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	for (unsigned i = 0; i < 120; i++) {
		char model[16];
		snprintf(model, sizeof(model), "m%u", i);
		store_submit(st, batch_at(now - i * 60, model, 3));
		total += 3;
		if (i % 10 == 0)
			store_sync(st);
	}
	store_sync(st);
	assert_int_equal(total_requests(st, WIN_ALL, NULL, NULL), total);
	/* Committed, not held in memory after a failed commit (which would
	 * give the same totals): no fault, nothing held, the map grew and
	 * LMDB has it, and every series has its minute, hour and all-time key. */
	assert_int_equal(st->fault, 0);
	assert_null(st->held_head);
	assert_true(st->map_size > 64u << 10);
	MDB_envinfo info;
	assert_int_equal(mdb_env_info(st->env, &info), 0);
	assert_int_equal(info.me_mapsize, st->map_size);
	assert_int_equal(count_keys(st, 'm'), 120);
	assert_int_equal(count_keys(st, 'h'), 120);
	assert_int_equal(count_keys(st, 'a'), 120);
	store_close(st);
	/* and a fresh open reads it all back */
	st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	assert_int_equal(total_requests(st, WIN_ALL, NULL, NULL), total);
	store_close(st);
	remove_dir(dir);
}

/* Each window holds exactly the batches inside it: 1m from the ring,
 * 1h/24h from minute slices, 7d from hour slices, all from all-time. */
static void test_window_boundaries(void **state)
{
	static const struct {
		int64_t ago;
		unsigned requests;
	} at[] = { { 30, 1 }, { 120, 2 }, { 30 * 60, 4 }, { 2 * 3600, 8 }, { 2 * 86400, 16 }, { 10 * 86400, 32 } };
	static const struct {
		enum store_window w;
		uint64_t want;
	} windows[] = { { WIN_1M, 1 }, { WIN_5M, 3 }, { WIN_1H, 7 }, { WIN_24H, 15 }, { WIN_7D, 31 }, { WIN_ALL, 63 } };
	char *dir = make_dir();
	struct store_options o;
	char err[256];
	uint64_t now = (uint64_t)time(NULL);

	store_options_defaults(&o);
	o.dir = dir;
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
		store_submit(st, batch_at(now - (uint64_t)at[i].ago, "w", at[i].requests));
	store_sync(st);
	for (size_t i = 0; i < sizeof(windows) / sizeof(windows[0]); i++) {
		uint64_t got = total_requests(st, windows[i].w, NULL, NULL);
		if (got != windows[i].want)
			fail_msg("window %s: %llu requests, want %llu", store_window_name(windows[i].w),
				 (unsigned long long)got, (unsigned long long)windows[i].want);
	}
	store_close(st);
	remove_dir(dir);
}

/* stderr into a file while `fn` runs; returns what was written (malloc). */
static char *stderr_of(void (*fn)(void *), void *arg)
{
	char path[] = "/tmp/tokentap-test-stderr-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	char *buf = calloc(1, 65536);

	assert_true(fd != -1 && saved != -1 && buf);
	fflush(stderr);
	assert_int_equal(dup2(fd, 2), 2);
	fn(arg);
	fflush(stderr);
	assert_int_equal(dup2(saved, 2), 2);
	close(saved);
	assert_true(pread(fd, buf, 65535, 0) >= 0);
	close(fd);
	unlink(path);
	return buf;
}

struct open_call {
	struct store_options o;
	struct store *st;
	char err[256];
};

static void open_store(void *arg)
{
	struct open_call *c = arg;
	c->st = store_open(&c->o, c->err, sizeof(c->err));
}

/* A minute retention under 24 h, or an hour retention under 7 days, cuts
 * the 24h or 7d window short: said once at open. */
static void test_short_retention_warned(void **state)
{
	struct open_call c;
	char *dir = make_dir(), *out;

	store_options_defaults(&c.o);
	c.o.dir = dir;
	out = stderr_of(open_store, &c);
	assert_non_null(c.st);
	assert_null(strstr(out, "retention"));
	store_close(c.st);
	free(out);

	c.o.minute_retention_s = 3600;
	c.o.hour_retention_s = 2 * 86400;
	out = stderr_of(open_store, &c);
	assert_non_null(c.st);
	assert_non_null(strstr(out, "store.minute_retention"));
	assert_non_null(strstr(out, "24h window"));
	assert_non_null(strstr(out, "store.hour_retention"));
	assert_non_null(strstr(out, "7d window"));
	store_close(c.st);
	free(out);
	remove_dir(dir);
}

/* Blocks in a child with the environment of `dir` open, optionally inside a
 * read transaction; writes a byte to `ready` once there. */
static pid_t lmdb_child(const char *dir, bool reading, int ready)
{
	pid_t pid = fork();
	assert_true(pid != -1);
	if (pid == 0) {
		MDB_env *env;
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed assertion ends the test without killing us */
		MDB_txn *txn;
		if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 8) != 0 ||
		    mdb_env_set_mapsize(env, 64u << 20) != 0 || mdb_env_open(env, dir, MDB_NOTLS, 0640) != 0)
			_exit(1);
		if (reading && mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) != 0)
			_exit(1);
		if (write(ready, "x", 1) != 1)
			_exit(1);
		for (int i = 0; i < 600; i++)
			sleep(1); /* until killed; bounded all the same */
		_exit(0);
	}
	return pid;
}

static int count_reader_lines(const char *msg, void *ctx)
{
	(void)msg;
	(*(int *)ctx)++;
	return 0;
}

/* A reader slot left by a process killed inside a read transaction is
 * cleared by store_open. Another process keeps the environment open, so
 * the lock table is not simply reset by an exclusive first opener. */
static void test_stale_reader_cleared(void **state)
{
	struct open_call c;
	char *dir = make_dir(), *out, b;
	int p[2], lines = 0;

	store_options_defaults(&c.o);
	c.o.dir = dir;
	c.st = store_open(&c.o, c.err, sizeof(c.err));
	assert_non_null(c.st);
	store_close(c.st);

	assert_int_equal(pipe(p), 0);
	pid_t holder = lmdb_child(dir, false, p[1]);
	assert_int_equal(read(p[0], &b, 1), 1);
	pid_t reader = lmdb_child(dir, true, p[1]);
	assert_int_equal(read(p[0], &b, 1), 1);
	assert_int_equal(kill(reader, SIGKILL), 0);
	assert_int_equal(waitpid(reader, NULL, 0), reader);

	out = stderr_of(open_store, &c);
	assert_non_null(c.st);
	if (!strstr(out, "cleared 1 stale reader slot(s)"))
		fail_msg("no stale reader cleared; the log said: %s", out);
	/* the table lists no reader now (mdb_reader_list prints a header
	 * line, then one per slot in use) */
	mdb_reader_list(c.st->env, count_reader_lines, &lines);
	assert_int_equal(lines, 1);
	store_close(c.st);
	free(out);
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	close(p[0]);
	close(p[1]);
	remove_dir(dir);
}

/* Curves live in hour and all-time slices: a 7d window has them, and old
 * data keeps them in the all-time slice. */
static void test_windows_keep_curves(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	struct store_result res;
	char err[256];
	uint64_t now = (uint64_t)time(NULL);

	store_options_defaults(&o);
	o.dir = dir;
	o.prune_every_s = 0;
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	store_submit(st, batch_at(now - 10 * 86400, "old", 4)); /* outside 7d */
	store_submit(st, batch_at(now - 3600, "new", 4));
	store_sync(st);
	/* the 7d window still has the recent hour's curve */
	assert_int_equal(store_query(st, WIN_7D, &res, err, sizeof(err)), 0);
	assert_int_equal(res.n, 1);
	assert_non_null(res.series[0].slice.slot[SLOT_CURVE(CURVE_TTFT, log2_bucket(2, INFLIGHT_BUCKETS))]);
	store_result_free(&res);
	/* all-time keeps every curve and every count */
	assert_int_equal(store_query(st, WIN_ALL, &res, err, sizeof(err)), 0);
	assert_int_equal(res.n, 2);
	for (size_t i = 0; i < res.n; i++) {
		assert_int_equal(res.series[i].slice.counters[CT_REQUESTS], 4);
		assert_non_null(res.series[i].slice.slot[SLOT_CURVE(CURVE_TTFT, log2_bucket(2, INFLIGHT_BUCKETS))]);
	}
	store_result_free(&res);
	uint64_t series, slices, bad;
	assert_int_equal(store_verify(st, &series, &slices, &bad, err, sizeof(err)), 0);
	assert_int_equal(bad, 0);
	store_close(st);
	remove_dir(dir);
}

/* ---- day packs ---- */

/* A batch like batch_at's for series `model`, with requests whose times
 * depend on `seed`, so that hours differ. */
static struct store_batch *batch_seeded(uint64_t sec, const char *model, unsigned requests, unsigned seed)
{
	struct store_batch *b = batch_at(sec, model, 0);
	struct slice sl;
	struct req_record r;

	memset(&sl, 0, sizeof(sl));
	for (unsigned i = 0; i < requests; i++) {
		fake_request(&r, 1000 + (seed * 7919 + i * 104729) % 900000, 3 + (seed + i) % 5, 2000 + seed * 13 + i);
		slice_record_request(&sl, &r, 1 + (seed + i) % 40, &test_slo);
		for (size_t k = 0; k < r.itl_n; k++)
			slice_record_itl(&sl, r.itl_ns[k], 1 + (seed + i) % 40);
		record_release(&r);
	}
	free(b->items[0].blob);
	b->items[0].len = slice_encode(&sl, &b->items[0].blob);
	assert_true(b->items[0].len > 0);
	slice_release(&sl);
	return b;
}

static bool slot_empty(const struct hist *h)
{
	return !h || !h->count;
}

/* Two results hold the same series with the same counters and buckets. */
static void assert_results_equal(const struct store_result *a, const struct store_result *b)
{
	if (a->n != b->n)
		fail_msg("%zu series in one result, %zu in the other", a->n, b->n);
	for (size_t i = 0; i < a->n; i++) {
		const struct store_series *x = &a->series[i], *y = NULL;
		for (size_t j = 0; j < b->n; j++)
			if (b->series[j].keylen == x->keylen && memcmp(b->series[j].key, x->key, x->keylen) == 0)
				y = &b->series[j];
		assert_non_null(y);
		assert_memory_equal(x->slice.counters, y->slice.counters, sizeof(x->slice.counters));
		for (unsigned k = 0; k < SLICE_SLOTS; k++) {
			assert_int_equal(slot_empty(x->slice.slot[k]), slot_empty(y->slice.slot[k]));
			if (!slot_empty(x->slice.slot[k]))
				assert_memory_equal(x->slice.slot[k], y->slice.slot[k], sizeof(struct hist));
		}
	}
}

static const enum store_window stored_windows[] = { WIN_1H, WIN_24H, WIN_7D, WIN_ALL };
#define N_STORED (sizeof(stored_windows) / sizeof(stored_windows[0]))

static void query_all(struct store *st, struct store_result res[N_STORED])
{
	char err[256];
	for (size_t w = 0; w < N_STORED; w++)
		assert_int_equal(store_query(st, stored_windows[w], &res[w], err, sizeof(err)), 0);
}

static void free_all(struct store_result res[N_STORED])
{
	for (size_t w = 0; w < N_STORED; w++)
		store_result_free(&res[w]);
}

/* Keys of `kind` in the slices database. */
static size_t count_keys(struct store *st, char kind)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	uint8_t start[9];
	MDB_val k = { 9, start }, v;
	size_t n = 0;

	assert_int_equal(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_cursor_open(txn, st->dbi_slices, &cur), 0);
	slice_key(start, kind, 0, 0);
	for (int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0 && ((uint8_t *)k.mv_data)[0] == (uint8_t)kind;
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
		n++;
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return n;
}

/* The oldest hour that has an 'h' key, UINT32_MAX when none has. */
static uint32_t oldest_hour_key(struct store *st)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	uint8_t start[9];
	MDB_val k = { 9, start }, v;
	uint32_t oldest = UINT32_MAX;

	assert_int_equal(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_cursor_open(txn, st->dbi_slices, &cur), 0);
	slice_key(start, 'h', 0, 0);
	if (mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE) == 0 && ((uint8_t *)k.mv_data)[0] == 'h')
		oldest = get_be32((uint8_t *)k.mv_data + 1);
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return oldest;
}

/* Every hour stored, in 'h' keys and in packs: a bit per hour back from
 * `cur_hour` (bit k: hour cur_hour - k), OR-ed over the series; and whether
 * any hour is stored twice for one series. */
static void stored_hours(struct store *st, uint32_t cur_hour, uint64_t bits[4], bool *twice)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	struct {
		uint32_t id, hour;
	} seen[4096];
	size_t n = 0;

	memset(bits, 0, 4 * sizeof(uint64_t));
	*twice = false;
	assert_int_equal(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_cursor_open(txn, st->dbi_slices, &cur), 0);
	while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
		const uint8_t *kb = k.mv_data;
		uint32_t t = get_be32(kb + 1), id = get_be32(kb + 5), hours[24];
		unsigned nh = 0;
		if (kb[0] == 'h') {
			hours[nh++] = t;
		} else if (kb[0] == 'd') {
			struct pack pk;
			assert_int_equal(store_pack_parse(v.mv_data, v.mv_size, &pk), 0);
			for (unsigned i = 0; i < pk.n; i++)
				hours[nh++] = t * 24 + pk.e[i].hour;
			store_pack_free(&pk);
		}
		for (unsigned i = 0; i < nh; i++) {
			uint32_t back = cur_hour - hours[i];
			assert_true(back < 256);
			bits[back / 64] |= (uint64_t)1 << (back % 64);
			for (size_t j = 0; j < n; j++)
				if (seen[j].id == id && seen[j].hour == hours[i])
					*twice = true;
			assert_true(n < 4096);
			seen[n].id = id;
			seen[n].hour = hours[i];
			n++;
		}
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
}

/* Waits out the last two minutes of an hour, so that the windows do not
 * move while a test compares them, and the first three: open_with_hours
 * writes series up to two minutes before each hour it means, and hours
 * count as ended a minute after their end. */
static void away_from_hour_end(void)
{
	uint64_t now = (uint64_t)time(NULL);
	if (now % 3600 > 3600 - 120)
		sleep((unsigned)(3600 - now % 3600 + 1));
	now = (uint64_t)time(NULL);
	if (now % 3600 < 180)
		sleep((unsigned)(180 - now % 3600));
}

/* Three series, hours from now back over ten days, a few skipped, one
 * series quieter; the writer packs nothing by itself. */
static struct store *open_with_hours(const char *dir, uint64_t now, unsigned back)
{
	struct store_options o;
	char err[256];

	store_options_defaults(&o);
	o.dir = dir;
	o.prune_every_s = UINT64_MAX; /* the test runs the pass itself */
	struct store *st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	for (unsigned k = 0; k <= back; k++) {
		uint64_t sec = now - (uint64_t)k * 3600;
		if (k % 11 == 5)
			continue;
		store_submit(st, batch_seeded(sec, "a", 3 + k % 4, k));
		store_submit(st, batch_seeded(sec - 60, "b", 1 + k % 2, k + 1000));
		if (k % 3 == 0)
			store_submit(st, batch_seeded(sec - 120, "c", 2, k + 2000));
		if (k % 50 == 0)
			store_sync(st);
	}
	store_sync(st);
	return st;
}

/* The writer's once-a-minute pass (pruning, then packing) at `now`, and
 * the packing passes that go on from it at its next flushes, until none is
 * left to do; returns how many packing passes that took. */
static unsigned pack_all(struct store *st, uint64_t now)
{
	unsigned passes = 1;

	prune(st, now);
	store_pack_run(st, now);
	while (st->pack_more) {
		assert_true(passes < 1000);
		store_pack_run(st, now);
		passes++;
	}
	return passes;
}

/* Packing changes no window, before or after a restart; store_verify
 * counts every hour as before; only the current hour stays an 'h' key. */
static void test_pack_windows_identical(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	struct store_result before[N_STORED], after[N_STORED];
	char err[256];
	uint64_t series0, slices0, bad0, series1, slices1, bad1;

	away_from_hour_end();
	uint64_t now = (uint64_t)time(NULL);
	uint32_t cur_hour = (uint32_t)(now / 3600);
	struct store *st = open_with_hours(dir, now, 10 * 24);
	assert_int_equal(count_keys(st, 'd'), 0);
	query_all(st, before);
	assert_true(before[2].n == 3 && before[3].n == 3);
	assert_int_equal(store_verify(st, &series0, &slices0, &bad0, err, sizeof(err)), 0);
	assert_int_equal(bad0, 0);
	size_t m0 = count_keys(st, 'm');

	pack_all(st, now);
	assert_true(count_keys(st, 'd') > 0);
	/* whole days are packed once the 24h window reads none of their
	 * hours: no hour slice older than two days is left */
	assert_true(oldest_hour_key(st) + 2 * 24 >= cur_hour);
	uint64_t bits[4];
	bool twice;
	stored_hours(st, cur_hour, bits, &twice);
	assert_false(twice);
	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);
	assert_int_equal(store_verify(st, &series1, &slices1, &bad1, err, sizeof(err)), 0);
	assert_int_equal(bad1, 0);
	assert_int_equal(series1, series0);
	/* minutes past their 24 h are pruned; every hour is still counted */
	assert_true(count_keys(st, 'm') < m0);
	assert_int_equal(slices1, slices0 - m0 + count_keys(st, 'm'));
	slices0 = slices1;

	/* packing again changes nothing */
	assert_int_equal(pack_all(st, now), 1);
	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);
	store_close(st);

	/* Packing deletes and writes many records in a commit, which can
	 * leave the file's last page free and unwritten: the start-up check
	 * must take that for sound, not move the store aside as truncated. */
	store_options_defaults(&o);
	o.dir = dir;
	st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);
	free_all(before);
	assert_int_equal(store_verify(st, &series1, &slices1, &bad1, err, sizeof(err)), 0);
	assert_int_equal(bad1, 0);
	assert_int_equal(slices1, slices0);
	store_close(st);
	remove_dir(dir);
}

/* A pack pass that does not commit (a crash, a full map) leaves every
 * hour slice where it was. */
static void test_pack_not_committed(void **state)
{
	char *dir = make_dir();
	struct store_result before[N_STORED], after[N_STORED];
	struct pack_state ps;
	MDB_txn *txn;

	away_from_hour_end();
	uint64_t now = (uint64_t)time(NULL);
	struct store *st = open_with_hours(dir, now, 3 * 24);
	size_t h0 = count_keys(st, 'h');
	query_all(st, before);

	pack_state_init(&ps, st);
	assert_int_equal(mdb_txn_begin(st->env, NULL, 0, &txn), 0);
	assert_int_equal(pack_pass(st, txn, now, &ps), 0);
	assert_true(ps.hours > 0 && ps.packs > 0);
	mdb_txn_abort(txn);
	assert_int_equal(count_keys(st, 'h'), h0);
	assert_int_equal(count_keys(st, 'd'), 0);
	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);

	/* committed, the same pass moves those hours and nothing else */
	pack_state_init(&ps, st);
	assert_int_equal(pack_commit(st, now, &ps), 0);
	assert_int_equal(count_keys(st, 'h'), h0 - ps.hours);
	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);
	free_all(before);
	store_close(st);
	remove_dir(dir);
}

/* Retention drops exactly the hours past it, packed or not: whole day
 * packs, and the expired hours of the oldest day's packs. */
static void test_pack_retention(void **state)
{
	char *dir = make_dir();
	uint64_t bits[4];
	bool twice;

	away_from_hour_end();
	uint64_t now = (uint64_t)time(NULL);
	uint32_t cur_hour = (uint32_t)(now / 3600);
	struct store *st = open_with_hours(dir, now, 5 * 24);
	st->opt.hour_retention_s = 3 * 86400 + 5 * 3600; /* a day boundary falls inside a pack */
	for (unsigned later = 0; later <= 30; later += 3) {
		uint64_t t = now + (uint64_t)later * 3600;
		uint32_t oldest = (uint32_t)((t - st->opt.hour_retention_s) / 3600);
		pack_all(st, t);
		stored_hours(st, cur_hour, bits, &twice);
		assert_false(twice);
		for (unsigned k = 0; k <= 5 * 24; k++) {
			bool written = k % 11 != 5, kept = cur_hour - k >= oldest;
			bool have = bits[k / 64] & ((uint64_t)1 << (k % 64));
			if (have != (written && kept))
				fail_msg("%u hours later: hour now-%u is %s", later, k, have ? "kept" : "gone");
		}
	}
	/* the all-time slice is not a matter of retention */
	uint64_t series, slices, bad;
	char err[256];
	assert_int_equal(store_verify(st, &series, &slices, &bad, err, sizeof(err)), 0);
	assert_int_equal(bad, 0);
	assert_int_equal(count_keys(st, 'a'), 3);
	store_close(st);
	remove_dir(dir);
}

/* An hour that arrives after its day was packed (stats held through a
 * fault) is counted at once and merged into the pack at the next pass. */
static void test_pack_late_hour(void **state)
{
	char *dir = make_dir();
	struct store_result before[N_STORED], after[N_STORED];

	away_from_hour_end();
	uint64_t now = (uint64_t)time(NULL);
	struct store *st = open_with_hours(dir, now, 4 * 24);
	pack_all(st, now);
	size_t packs = count_keys(st, 'd'), hours = count_keys(st, 'h');
	/* an hour the pack lacks (k % 11 == 5 was skipped), one it has */
	store_submit(st, batch_seeded(now - 60 * 3600, "a", 4, 77));
	store_submit(st, batch_seeded(now - 80 * 3600, "b", 2, 78));
	store_sync(st);
	assert_int_equal(count_keys(st, 'h'), hours + 2);
	query_all(st, before);
	pack_all(st, now);
	assert_int_equal(count_keys(st, 'd'), packs);
	assert_int_equal(count_keys(st, 'h'), hours);
	uint64_t bits[4];
	bool twice;
	stored_hours(st, (uint32_t)(now / 3600), bits, &twice);
	assert_false(twice);
	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);
	free_all(before);
	store_close(st);
	remove_dir(dir);
}

/* Days the 7d window no longer reaches lose their load curves, and only
 * they; their counters and main histograms stay. */
static void test_pack_old_days_drop_curves(void **state)
{
	char *dir = make_dir();

	away_from_hour_end();
	uint64_t now = (uint64_t)time(NULL);
	uint32_t cur_hour = (uint32_t)(now / 3600), horizon = (cur_hour - (WEEK_HOURS - 1)) / 24;
	struct store *st = open_with_hours(dir, now, 10 * 24);
	pack_all(st, now);
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	unsigned old_days = 0, new_days = 0;
	assert_int_equal(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_cursor_open(txn, st->dbi_slices, &cur), 0);
	while (mdb_cursor_get(cur, &k, &v, MDB_NEXT) == 0) {
		const uint8_t *kb = k.mv_data;
		struct pack pk;
		if (kb[0] != 'd')
			continue;
		bool old = get_be32(kb + 1) < horizon;
		assert_int_equal(store_pack_parse(v.mv_data, v.mv_size, &pk), 0);
		assert_int_equal(!!(pk.flags & PACK_NO_CURVES), old);
		for (unsigned i = 0; i < pk.n; i++) {
			struct slice s;
			memset(&s, 0, sizeof(s));
			assert_int_equal(slice_decode_merge(&s, pk.e[i].p, pk.e[i].len), 0);
			assert_true(s.counters[CT_REQUESTS] > 0);
			assert_non_null(s.slot[HM_TTFT]);
			bool curves = false;
			for (unsigned j = HM__COUNT; j < SLICE_SLOTS; j++)
				curves |= !slot_empty(s.slot[j]);
			assert_int_equal(curves, !old);
			slice_release(&s);
		}
		old_days += old;
		new_days += !old;
		store_pack_free(&pk);
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	assert_true(old_days > 0 && new_days > 0);
	store_close(st);
	remove_dir(dir);
}

/* A day pack's key and a CRC of its stored value. */
struct pack_sum {
	uint8_t key[9];
	uint32_t crc;
};

/* The packs in the store, in key order; how many. */
static size_t pack_sums(struct store *st, struct pack_sum *out, size_t max)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	uint8_t start[9];
	MDB_val k = { 9, start }, v;
	size_t n = 0;

	assert_int_equal(mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn), 0);
	assert_int_equal(mdb_cursor_open(txn, st->dbi_slices, &cur), 0);
	slice_key(start, 'd', 0, 0);
	for (int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0 && ((uint8_t *)k.mv_data)[0] == 'd';
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		assert_true(n < max && k.mv_size == 9);
		memcpy(out[n].key, k.mv_data, 9);
		out[n].crc = (uint32_t)crc32(0, v.mv_data, (uInt)v.mv_size);
		n++;
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return n;
}

/* The packs written, rewritten or deleted between two listings. */
static size_t packs_changed(const struct pack_sum *a, size_t na, const struct pack_sum *b, size_t nb)
{
	size_t i = 0, j = 0, changed = 0;

	while (i < na || j < nb) {
		int c = i == na ? 1 : j == nb ? -1 : memcmp(a[i].key, b[j].key, 9);
		if (c == 0)
			changed += a[i++].crc != b[j++].crc;
		else if (c < 0)
			changed++, i++;
		else
			changed++, j++;
	}
	return changed;
}

/* One flush with no stats in it: the writer's tick, nothing else. */
static void empty_flush(struct store *st, uint64_t sec)
{
	struct store_batch *b = calloc(1, sizeof(*b));
	assert_non_null(b);
	b->sec = sec;
	store_submit(st, b);
	store_sync(st);
}

#define PACK_SUMS_MAX 256

/* A pack pass rewrites at most pack_per_pass packs; the writer goes on at
 * its next flushes until everything is packed, and the packs come out
 * byte for byte as unbounded passes make them: hours moved, the oldest
 * day trimmed to the retention, the days past the 7d window without
 * curves. The windows read the same all along. */
static void test_pack_pass_bounded(void **state)
{
	static struct pack_sum ref[PACK_SUMS_MAX], prev[PACK_SUMS_MAX], cur[PACK_SUMS_MAX];
	char *dir = make_dir(), *ref_dir = make_dir();
	struct store_options o;
	struct store_result before[N_STORED], after[N_STORED];
	char err[256];
	uint64_t bits[4];
	bool twice;
	const unsigned bound = 2;
	/* the retention ends inside a day, so that day's packs are trimmed */
	const uint64_t keep = 8 * 86400 + 5 * 3600, later = 3 * 3600;

	away_from_hour_end();
	uint64_t now = (uint64_t)time(NULL);
	uint32_t cur_hour = (uint32_t)(now / 3600);

	/* the reference: the same hours, each step in one unbounded pass */
	struct store *st = open_with_hours(ref_dir, now, 10 * 24);
	st->opt.hour_retention_s = keep;
	st->opt.pack_per_pass = 0;
	assert_int_equal(pack_all(st, now), 1);
	size_t nref = pack_sums(st, ref, PACK_SUMS_MAX);
	assert_true(nref > 3 * bound);
	assert_int_equal(pack_all(st, now + later), 1);
	size_t nref_later = pack_sums(st, ref + nref, PACK_SUMS_MAX - nref);
	store_close(st);

	/* packed by the writer, `bound` packs a flush; pruning (and a full
	 * pass) only at the first flush after the restart */
	st = open_with_hours(dir, now, 10 * 24);
	query_all(st, before);
	store_close(st);
	store_options_defaults(&o);
	o.dir = dir;
	o.hour_retention_s = keep;
	o.pack_per_pass = bound;
	o.prune_every_s = 3600;
	st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	size_t nprev = pack_sums(st, prev, PACK_SUMS_MAX), ncur;
	unsigned flushes = 0;
	do {
		empty_flush(st, now);
		ncur = pack_sums(st, cur, PACK_SUMS_MAX);
		size_t changed = packs_changed(prev, nprev, cur, ncur);
		if (changed > bound)
			fail_msg("flush %u rewrote %zu packs, more than %u", flushes, changed, bound);
		memcpy(prev, cur, ncur * sizeof(*cur));
		nprev = ncur;
		assert_true(++flushes < 200);
		/* every hour is counted once at every step */
		stored_hours(st, cur_hour, bits, &twice);
		assert_false(twice);
		query_all(st, after);
		for (size_t w = 0; w < N_STORED; w++)
			assert_results_equal(&before[w], &after[w]);
		free_all(after);
	} while (st->pack_more);
	assert_true(flushes >= nref / bound);
	assert_int_equal(ncur, nref);
	assert_int_equal(packs_changed(ref, nref, cur, ncur), 0);
	assert_true(oldest_hour_key(st) + 2 * 24 >= cur_hour);

	/* hours later, the oldest day's packs are trimmed, `bound` a pass;
	 * the writer is idle, the test runs the passes it would */
	prune(st, now + later);
	unsigned passes = 0;
	nprev = pack_sums(st, prev, PACK_SUMS_MAX);
	do {
		store_pack_run(st, now + later);
		ncur = pack_sums(st, cur, PACK_SUMS_MAX);
		assert_true(packs_changed(prev, nprev, cur, ncur) <= bound);
		memcpy(prev, cur, ncur * sizeof(*cur));
		nprev = ncur;
		assert_true(++passes < 200);
	} while (st->pack_more);
	assert_int_equal(ncur, nref_later);
	assert_int_equal(packs_changed(ref + nref, nref_later, cur, ncur), 0);
	free_all(before);
	store_close(st);
	remove_dir(dir);
	remove_dir(ref_dir);
}

/* A commit that takes pages from the end of the file and frees them again
 * (merged away by deletes) leaves them free and unwritten: the file ends
 * before its last page. That is sound, and the start-up check must keep
 * the store; it used to move it aside as truncated. A pack pass over ten
 * days of hours, unbounded, makes such a commit. */
static void test_free_pages_past_end_kept(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	struct store_result before[N_STORED], after[N_STORED];
	char err[256], path[512];
	MDB_env *env;
	MDB_envinfo info;
	MDB_stat ms;
	struct stat sb;

	away_from_hour_end();
	uint64_t now = (uint64_t)time(NULL);
	struct store *st = open_with_hours(dir, now, 10 * 24);
	st->opt.pack_per_pass = 0; /* all of it in one commit */
	pack_all(st, now);
	query_all(st, before);
	store_close(st);

	assert_int_equal(mdb_env_create(&env), 0);
	mdb_env_set_maxdbs(env, 8);
	assert_int_equal(mdb_env_open(env, dir, MDB_RDONLY, 0640), 0);
	assert_int_equal(mdb_env_info(env, &info), 0);
	assert_int_equal(mdb_env_stat(env, &ms), 0);
	mdb_env_close(env);
	snprintf(path, sizeof(path), "%s/data.mdb", dir);
	assert_int_equal(stat(path, &sb), 0);
	if ((uint64_t)sb.st_size >= ((uint64_t)info.me_last_pgno + 1) * ms.ms_psize) {
		free_all(before);
		remove_dir(dir);
		skip(); /* this LMDB wrote the whole file: nothing to check */
	}

	store_options_defaults(&o);
	o.dir = dir;
	st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);
	free_all(before);
	store_close(st);
	assert_int_equal(stat(path, &sb), 0); /* not moved aside */
	remove_dir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slice_encode_roundtrip),
		cmocka_unit_test(test_log2_buckets),
		cmocka_unit_test(test_itl_rounds_to_nearest),
		cmocka_unit_test(test_threads_totals_exact),
		cmocka_unit_test(test_reopen_keeps_numbers),
		cmocka_unit_test(test_foreign_layout_refused),
		cmocka_unit_test(test_foreign_database_left_alone),
		cmocka_unit_test(test_model_cap),
		cmocka_unit_test(test_prune_past_retention),
		cmocka_unit_test(test_map_full_grows),
		cmocka_unit_test(test_window_boundaries),
		cmocka_unit_test(test_short_retention_warned),
		cmocka_unit_test(test_stale_reader_cleared),
		cmocka_unit_test(test_windows_keep_curves),
		cmocka_unit_test(test_pack_windows_identical),
		cmocka_unit_test(test_pack_not_committed),
		cmocka_unit_test(test_pack_retention),
		cmocka_unit_test(test_pack_late_hour),
		cmocka_unit_test(test_pack_old_days_drop_curves),
		cmocka_unit_test(test_pack_pass_bounded),
		cmocka_unit_test(test_free_pages_past_end_kept),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
