/*
 * test_store.c — slices, shards and the LMDB store: exact totals across
 * threads and flushes, persistence across reopen, refusal of a foreign
 * layout and of a second opener.
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
#include <time.h>
#include <unistd.h>

#include "slice.h"
#include "stats.h"
#include "store.h"

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

static const struct slo test_slo = { 2000000, 100000 };

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
	struct stats_shard *sh = stats_shard_new(NULL, w->store, 4, &test_slo, 1000);
	char model[16];
	struct req_record r;

	snprintf(model, sizeof(model), "m%u", w->id % 3);
	for (unsigned i = 0; i < w->requests; i++) {
		struct series *se = stats_series(sh, "default", "up", model, i % 7 == 0);
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

static void test_model_cap(void **state)
{
	struct stats_shard *sh = stats_shard_new(NULL, NULL, 2, &test_slo, 1000);
	struct series *a = stats_series(sh, "r", "u", "a", false);
	struct series *b = stats_series(sh, "r", "u", "b", false);
	struct series *a_cold = stats_series(sh, "r", "u", "a", true);
	struct series *c = stats_series(sh, "r", "u", "c", false);
	struct series *d = stats_series(sh, "r", "u", "d", false);

	assert_non_null(a);
	assert_ptr_not_equal(a, b);
	assert_ptr_not_equal(a, a_cold);
	assert_ptr_equal(a, stats_series(sh, "r", "u", "a", false));
	/* past the cap, new models fold into one "other" series */
	assert_ptr_equal(c, d);
	assert_ptr_equal(c, stats_series(sh, "r", "u", "other", false));
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
	store_close(st);
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
		cmocka_unit_test(test_slice_encode_roundtrip),
		cmocka_unit_test(test_log2_buckets),
		cmocka_unit_test(test_threads_totals_exact),
		cmocka_unit_test(test_reopen_keeps_numbers),
		cmocka_unit_test(test_foreign_layout_refused),
		cmocka_unit_test(test_model_cap),
		cmocka_unit_test(test_prune_past_retention),
		cmocka_unit_test(test_map_full_grows),
		cmocka_unit_test(test_windows_keep_curves),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
