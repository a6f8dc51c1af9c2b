/*
 * store_fixture.h — what the store's unit tests share: temporary data
 * directories, a finished request and a batch of them to record, the SLO
 * they are judged by, and a count of the keys of one kind in a store.
 * Included once per test file, after the store's sources (test_store.c,
 * test_store_pack.c) or its headers (test_slice.c); the helpers are static
 * inline so that a file that does not use one is not warned about it.
 */
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "slice.h"
#include "store_int.h"
#include "timeline.h"

/* The goodput SLO the tests record under: 2 s to first token, 100 ms per
 * output token, the longest gap not checked. */
static inline char *make_dir(void)
{
	char tmpl[] = "/tmp/tokentap-test-store-XXXXXX";
	char *d = mkdtemp(tmpl);
	assert_non_null(d);
	return strdup(d);
}

static inline void remove_dir(char *d)
{
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	assert_int_equal(system(cmd), 0);
	free(d);
}

/* A finished streamed request: ttft, `tokens` token events `itl_us` apart. */
static inline void fake_request(struct req_record *r, uint64_t ttft_us, unsigned tokens, uint64_t itl_us)
{
	memset(r, 0, sizeof(*r));
	r->itl_keep = true; /* the tests replay the gaps */
	r->usage = USAGE_UNKNOWN;
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
		record_token_event(r, TOKEN_ANSWER, t, &gap);
	}
	r->at[TL_RESP_END] = t;
	r->at[TL_CLIENT_DONE] = t;
}

static const struct slo test_slo = { 2000000, 100000, 0 };

/* Start-up settings for a stats shard: test_slo's thresholds, a 1 s flush,
 * `max_models` per route, model slots kept `model_idle_ms` (0: for ever). */
static inline struct config test_boot(unsigned max_models, uint64_t model_idle_ms)
{
	struct config c;

	config_defaults(&c);
	c.max_models = max_models;
	c.model_idle_ms = model_idle_ms;
	c.slo_ttft_ms = test_slo.ttft_us / 1000;
	c.slo_tpot_ms = test_slo.tpot_us / 1000;
	c.slo_itl_ms = test_slo.itl_us / 1000;
	c.flush_ms = 1000;
	return c;
}

/* A batch with one series' slice holding `requests` requests, stamped `sec`. */
static inline struct store_batch *batch_at(uint64_t sec, const char *model, unsigned requests)
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

/* Walks the keys of `kind` in the slices database in key order, calling
 * each(key, value, arg) on each when `each` is not NULL; how many. */
static inline size_t each_key(struct store *st, char kind, void (*each)(const MDB_val *, const MDB_val *, void *),
			      void *arg)
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
	     rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		if (each)
			each(&k, &v, arg);
		n++;
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	return n;
}

/* Keys of `kind` in the slices database. */
static inline size_t count_keys(struct store *st, char kind)
{
	return each_key(st, kind, NULL, NULL);
}
