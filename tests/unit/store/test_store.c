/*
 * test_store.c — the LMDB store: exact totals across threads and flushes,
 * persistence across reopen, refusal of a foreign layout, of another
 * program's database and of a second opener, pruning, the map growing,
 * the window boundaries, short retention warned, stale readers cleared,
 * load curves kept in the long windows. The day packs are tested in
 * test_store_pack.c, slices and shards without a store in test_slice.c.
 *
 * The store's sources are included, not linked, so that the tests can
 * read its insides (held minutes, the slices database).
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
#include "store_fixture.h"

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

/* A series key of exactly SERIES_KEY_MAX bytes (the longest the stats side
 * builds) is stored, queried, and keeps its id across a reopen. */
static void test_longest_series_key(void **state)
{
	char *dir = make_dir();
	struct store_options o;
	char err[256];
	char model[SERIES_KEY_MAX - 11 - 2 + 1]; /* "default\0up\0" + model + "\0" + cold */
	uint64_t now = (uint64_t)time(NULL);

	(void)state;
	memset(model, 'm', sizeof(model) - 1);
	model[sizeof(model) - 1] = '\0';
	store_options_defaults(&o);
	o.dir = dir;
	for (unsigned round = 1; round <= 2; round++) {
		struct store *st = store_open(&o, err, sizeof(err));
		assert_non_null(st);
		store_submit(st, batch_at(now - 30, model, 3));
		store_sync(st);
		assert_int_equal(total_requests(st, WIN_1H, NULL, NULL), 3 * round);
		assert_int_equal(total_requests(st, WIN_ALL, NULL, NULL), 3 * round);
		struct store_result res;
		assert_int_equal(store_query(st, WIN_1H, &res, err, sizeof(err)), 0);
		assert_int_equal(res.n, 1);
		assert_int_equal(res.series[0].keylen, SERIES_KEY_MAX);
		store_result_free(&res);
		store_close(st);
	}
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_totals_exact),   cmocka_unit_test(test_reopen_keeps_numbers),
		cmocka_unit_test(test_foreign_layout_refused), cmocka_unit_test(test_foreign_database_left_alone),
		cmocka_unit_test(test_prune_past_retention),   cmocka_unit_test(test_map_full_grows),
		cmocka_unit_test(test_window_boundaries),      cmocka_unit_test(test_short_retention_warned),
		cmocka_unit_test(test_stale_reader_cleared),   cmocka_unit_test(test_windows_keep_curves),
		cmocka_unit_test(test_longest_series_key),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
