/*
 * test_store_pack.c — the day packs of hour slices: packing changes no
 * window, before or after a restart; a pass that does not commit changes
 * nothing; retention drops exactly the hours past it; an hour that comes
 * after its day was packed; old days lose their load curves; a pass is
 * bounded; free pages past the end of the file a pack pass leaves are kept
 * by the start-up check.
 *
 * The store's sources are included, not linked, so that the pack pass can
 * be run at a chosen time and its transaction aborted instead of committed.
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

/* Every stored window's query still gives what `before` holds. */
static void assert_queries_unchanged(struct store *st, struct store_result before[N_STORED])
{
	struct store_result after[N_STORED];

	query_all(st, after);
	for (size_t w = 0; w < N_STORED; w++)
		assert_results_equal(&before[w], &after[w]);
	free_all(after);
}

/* The store in `dir` opened again: every window still gives `before`,
 * which is then freed. */
static struct store *reopen_unchanged(char *dir, struct store_result before[N_STORED])
{
	struct store_options o;
	char err[256];
	struct store *st;

	store_options_defaults(&o);
	o.dir = dir;
	st = store_open(&o, err, sizeof(err));
	assert_non_null(st);
	assert_queries_unchanged(st, before);
	free_all(before);
	return st;
}

/* The end of a test: `before` freed, the store closed and its directory
 * removed. */
static void close_all(struct store *st, char *dir, struct store_result before[N_STORED])
{
	free_all(before);
	store_close(st);
	remove_dir(dir);
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
	struct store_result before[N_STORED];
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
	assert_queries_unchanged(st, before);
	assert_int_equal(store_verify(st, &series1, &slices1, &bad1, err, sizeof(err)), 0);
	assert_int_equal(bad1, 0);
	assert_int_equal(series1, series0);
	/* minutes past their 24 h are pruned; every hour is still counted */
	assert_true(count_keys(st, 'm') < m0);
	assert_int_equal(slices1, slices0 - m0 + count_keys(st, 'm'));
	slices0 = slices1;

	/* packing again changes nothing */
	assert_int_equal(pack_all(st, now), 1);
	assert_queries_unchanged(st, before);
	store_close(st);

	/* Packing deletes and writes many records in a commit, which can
	 * leave the file's last page free and unwritten: the start-up check
	 * must take that for sound, not move the store aside as truncated. */
	st = reopen_unchanged(dir, before);
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
	struct store_result before[N_STORED];
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
	assert_queries_unchanged(st, before);

	/* committed, the same pass moves those hours and nothing else */
	pack_state_init(&ps, st);
	assert_int_equal(pack_commit(st, now, &ps), 0);
	assert_int_equal(count_keys(st, 'h'), h0 - ps.hours);
	assert_queries_unchanged(st, before);
	close_all(st, dir, before);
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
	struct store_result before[N_STORED];

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
	assert_queries_unchanged(st, before);
	close_all(st, dir, before);
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

struct pack_list {
	struct pack_sum *out;
	size_t n, max;
};

static void pack_sum_add(const MDB_val *k, const MDB_val *v, void *arg)
{
	struct pack_list *l = arg;

	assert_true(l->n < l->max && k->mv_size == 9);
	memcpy(l->out[l->n].key, k->mv_data, 9);
	l->out[l->n].crc = (uint32_t)crc32(0, v->mv_data, (uInt)v->mv_size);
	l->n++;
}

/* The packs in the store, in key order; how many. */
static size_t pack_sums(struct store *st, struct pack_sum *out, size_t max)
{
	struct pack_list l = { out, 0, max };

	return each_key(st, 'd', pack_sum_add, &l);
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
	struct store_result before[N_STORED];
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
		assert_queries_unchanged(st, before);
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
	close_all(st, dir, before);
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
	struct store_result before[N_STORED];
	char path[512];
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

	st = reopen_unchanged(dir, before);
	store_close(st);
	assert_int_equal(stat(path, &sb), 0); /* not moved aside */
	remove_dir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
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
