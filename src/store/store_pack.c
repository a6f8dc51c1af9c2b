/*
 * store_pack.c — day packs: the writer moves the hour slices of each series
 * into one value per day once no 1h or 24h window reads them, trims the
 * packs of the oldest day to the retention, and drops the load curves of
 * days the 7d window no longer reaches (docs/storage.md, "Day packs").
 *
 * Invariants:
 *   - only the writer thread runs a pass, in its own write transaction;
 *   - an hour of a series is in its 'h' slice, its pack, or both (a late
 *     delta not packed yet), never lost and never counted twice: an hour
 *     moves into its pack in the transaction that deletes its 'h' key;
 *   - a pass that fails commits nothing, and the next one starts over;
 *   - a pass rewrites at most pack_per_pass packs; what is left is taken up
 *     at the writer's next flush, not a minute later.
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "varint.h"

/*
 * An hour slice deflates to 3-5 KiB for a busy series, and LMDB stores any
 * value over about 2 KiB in whole 4 KiB overflow pages, so a value per hour
 * leaves part of a page empty. Once no 1h or 24h window reads any hour of
 * a day (a day more than 24 hours old), the writer moves the series' 'h'
 * slices of that day into one value per series and day, kind 'd':
 *
 *   byte 0   flags (PACK_NO_CURVES: the load curves were dropped)
 *   then     a stored value ('r' or 'z', see store_value_pack) of:
 *            PACK_VERSION, varint n, then n times: varint hour of the day
 *            (0-23, strictly increasing), varint length, encoded slice
 *
 * One partly filled page per day instead of one per hour, deflate sees the
 * whole day, the 1h and 24h windows read 'h' slices as before, and a
 * series costs one pack write a day, not one per hour. Moving hours (read
 * the pack, add the hours, write it, delete the 'h' keys) happens in one
 * write transaction, so readers, which take 'h' and 'd' from one read
 * transaction, see every hour exactly once, packed or not. An 'h' slice that arrives for an hour already packed
 * (stats held in memory through a fault and committed later) is merged into
 * the pack's hour at the next pass.
 *
 * Hours before the 7d window are read by no window, so a day wholly before
 * it keeps its counters and main histograms but not its load curves.
 */
#define PACK_VERSION 1
#define PACK_NO_CURVES 0x01
#define PACK_GRACE_S 60 /* hours count as ended this long after their end: late flushes land first */
#define DAY_HOURS 24	/* the 24h window reads the curves of no hour older than 24 */

void store_pack_free(struct pack *pk)
{
	free(pk->raw);
	memset(pk, 0, sizeof(*pk));
}

int store_pack_parse(const uint8_t *v, size_t n, struct pack *pk)
{
	const uint8_t *raw, *p, *end;
	size_t len;
	uint8_t *owned;
	uint64_t count, hour, elen;

	memset(pk, 0, sizeof(*pk));
	if (n < 2 || store_value_raw(v + 1, n - 1, &raw, &len, &owned) == -1)
		return -1;
	if (!owned && len && (owned = malloc(len)))
		memcpy(owned, raw, len);
	if (!owned)
		return -1;
	pk->raw = owned;
	pk->flags = v[0];
	p = owned;
	end = owned + len;
	if (*p++ != PACK_VERSION || varint_get(&p, end, &count) == -1 || count > 24)
		goto bad;
	for (uint64_t i = 0; i < count; i++) {
		if (varint_get(&p, end, &hour) == -1 || hour > 23 || (i && hour <= pk->e[i - 1].hour) ||
		    varint_get(&p, end, &elen) == -1 || elen > (uint64_t)(end - p))
			goto bad;
		pk->e[i] = (struct pack_entry){ (unsigned)hour, p, (size_t)elen };
		p += elen;
	}
	if (p != end)
		goto bad;
	pk->n = (unsigned)count;
	return 0;
bad:
	store_pack_free(pk);
	return -1;
}

/* Writes `pk` under `k9` (deletes the key when it holds no hour). */
static int pack_put(struct store *st, MDB_txn *txn, const uint8_t k9[9], const struct pack *pk)
{
	MDB_val k = { 9, (void *)k9 }, v;
	size_t cap = 1 + VARINT_MAX, n = 0, packedlen;
	uint8_t *raw, *packed;
	int rc;

	if (pk->n == 0) {
		rc = mdb_del(txn, st->dbi_slices, &k, NULL);
		return rc == MDB_NOTFOUND ? 0 : rc;
	}
	for (unsigned i = 0; i < pk->n; i++)
		cap += 2 * VARINT_MAX + pk->e[i].len;
	if (!(raw = malloc(cap)))
		return ENOMEM;
	raw[n++] = PACK_VERSION;
	n += varint_put(raw + n, pk->n);
	for (unsigned i = 0; i < pk->n; i++) {
		n += varint_put(raw + n, pk->e[i].hour);
		n += varint_put(raw + n, pk->e[i].len);
		memcpy(raw + n, pk->e[i].p, pk->e[i].len);
		n += pk->e[i].len;
	}
	packed = store_value_pack(raw, n, 1, &packedlen);
	free(raw);
	if (!packed)
		return ENOMEM;
	packed[0] = pk->flags;
	v.mv_size = packedlen;
	v.mv_data = packed;
	rc = mdb_put(txn, st->dbi_slices, &k, &v, 0);
	free(packed);
	return rc;
}

/*
 * Rewrites the pack of series `id` for `day`: adds the 'h' slices of the
 * `nh` hours listed (merged with the pack's own hour where it has one) and
 * deletes their keys, drops the hours of the day before `keep_from` (past
 * retention) and, with `strip`, every load curve. Writes nothing when
 * nothing changes. An 'h' slice or a pack that does not decode is dropped
 * with a warning, as merge_into (store.c) replaces one.
 */
static int pack_rewrite(struct store *st, MDB_txn *txn, uint32_t id, uint32_t day, const uint32_t *hours, size_t nh,
			unsigned keep_from, bool strip)
{
	uint8_t pk9[9], hk9[9];
	MDB_val k = { 9, pk9 }, v;
	struct pack old, out;
	uint8_t *enc[24] = { 0 };
	bool changed = nh > 0;
	int rc;

	memset(&out, 0, sizeof(out));
	slice_key(pk9, 'd', day, id);
	rc = mdb_get(txn, st->dbi_slices, &k, &v);
	if (rc == MDB_NOTFOUND) {
		memset(&old, 0, sizeof(old));
	} else if (rc) {
		return rc;
	} else if (store_pack_parse(v.mv_data, v.mv_size, &old) == -1) {
		log_warn("store: a stored day of hour slices did not decode; it is replaced");
		changed = true;
	}
	out.flags = old.flags | (strip ? PACK_NO_CURVES : 0);
	if (strip && !(old.flags & PACK_NO_CURVES))
		changed = true;

	size_t j = 0, o = 0;
	for (unsigned hod = keep_from; hod < 24; hod++) {
		struct pack_entry *have = NULL;
		bool add = false;
		while (o < old.n && old.e[o].hour < hod) {
			changed = true; /* an hour before keep_from: past retention */
			o++;
		}
		if (o < old.n && old.e[o].hour == hod)
			have = &old.e[o++];
		while (j < nh && hours[j] < day * 24 + hod)
			j++;
		if (j < nh && hours[j] == day * 24 + hod)
			add = true;
		if (!have && !add)
			continue;
		if (have && !add && !(strip && !(old.flags & PACK_NO_CURVES))) {
			out.e[out.n++] = *have; /* as it is */
			continue;
		}
		struct slice s;
		memset(&s, 0, sizeof(s));
		if (have && slice_decode_merge(&s, have->p, have->len) == -1)
			log_warn("store: an hour slice in a day pack did not decode; it is replaced");
		if (add) {
			MDB_val hk = { 9, hk9 }, hv;
			slice_key(hk9, 'h', day * 24 + hod, id);
			rc = mdb_get(txn, st->dbi_slices, &hk, &hv);
			if (rc == 0 && store_value_merge(&s, hv.mv_data, hv.mv_size) == -1)
				log_warn("store: a stored slice did not decode; it is dropped");
			else if (rc && rc != MDB_NOTFOUND) {
				slice_release(&s);
				goto out;
			}
		}
		if (strip)
			slice_drop_curves(&s);
		size_t len = slice_encode(&s, &enc[hod]);
		slice_release(&s);
		if (!len) {
			rc = ENOMEM;
			goto out;
		}
		out.e[out.n++] = (struct pack_entry){ hod, enc[hod], len };
	}
	if (o < old.n)
		changed = true; /* cannot happen with a sound pack: hours are below 24 */
	rc = 0;
	if (!changed)
		goto out;
	if ((rc = pack_put(st, txn, pk9, &out)))
		goto out;
	for (size_t i = 0; i < nh; i++) {
		MDB_val hk = { 9, hk9 };
		slice_key(hk9, 'h', hours[i], id);
		rc = mdb_del(txn, st->dbi_slices, &hk, NULL);
		if (rc && rc != MDB_NOTFOUND)
			goto out;
		rc = 0;
	}
out:
	for (unsigned i = 0; i < 24; i++)
		free(enc[i]);
	store_pack_free(&old);
	return rc;
}

struct pack_ref {
	uint32_t id, t; /* t: an hour ('h' keys) or a day ('d' keys) */
};

static int pack_ref_cmp(const void *a, const void *b)
{
	const struct pack_ref *x = a, *y = b;
	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return x->t < y->t ? -1 : x->t > y->t;
}

/* Where the pack pass stands; what it did is kept only once it commits. */
struct pack_state {
	uint32_t trimmed;  /* packs trimmed to this oldest hour */
	uint32_t stripped; /* packs of days before this one have no curves */
	/* a trim cut short at the bound: the oldest hour it trims to, and the
	 * series id it goes on from */
	uint32_t trim_at, trim_from;
	size_t budget; /* packs this pass may still rewrite */
	size_t hours, packs;
	bool more; /* stopped at the bound with work left */
};

/* A pass that goes on from where the store's last committed one left. */
static void pack_state_init(struct pack_state *ps, const struct store *st)
{
	memset(ps, 0, sizeof(*ps));
	ps->trimmed = st->pack_trimmed;
	ps->stripped = st->pack_stripped;
	ps->trim_at = st->pack_trim_at;
	ps->trim_from = st->pack_trim_from;
	ps->budget = st->opt.pack_per_pass ? st->opt.pack_per_pass : SIZE_MAX;
}

/* Takes one pack rewrite from the budget; false, noting that work is
 * left, when none is left. */
static bool pack_take(struct pack_state *ps)
{
	if (ps->budget == 0) {
		ps->more = true;
		return false;
	}
	ps->budget--;
	return true;
}

/*
 * Lists the keys of `kind` numbered from..to-1 (with `unstripped`, only the
 * packs without PACK_NO_CURVES), sorted by series, then number.
 */
static int pack_list(struct store *st, MDB_txn *txn, char kind, uint32_t from, uint32_t to, bool unstripped,
		     struct pack_ref **out, size_t *n)
{
	MDB_cursor *cur;
	uint8_t start[9];
	MDB_val k = { 9, start }, v;
	size_t cap = 0;
	int rc;

	*out = NULL;
	*n = 0;
	if (from >= to)
		return 0;
	if ((rc = mdb_cursor_open(txn, st->dbi_slices, &cur)))
		return rc;
	slice_key(start, kind, from, 0);
	for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
		const uint8_t *kb = k.mv_data;
		if (k.mv_size != 9 || kb[0] != (uint8_t)kind || get_be32(kb + 1) >= to)
			break;
		if (unstripped && v.mv_size && (((const uint8_t *)v.mv_data)[0] & PACK_NO_CURVES))
			continue;
		if (*n == cap) {
			cap = cap ? cap * 2 : 64;
			void *p = realloc(*out, cap * sizeof(**out));
			if (!p) {
				rc = ENOMEM;
				break;
			}
			*out = p;
		}
		(*out)[(*n)++] = (struct pack_ref){ get_be32(kb + 5), get_be32(kb + 1) };
	}
	mdb_cursor_close(cur);
	if (rc != MDB_NOTFOUND && rc != 0) {
		free(*out);
		*out = NULL;
		*n = 0;
		return rc;
	}
	if (*n)
		qsort(*out, *n, sizeof(**out), pack_ref_cmp);
	return 0;
}

/*
 * The pack pass, in the caller's write transaction: moves the 'h' slices
 * within retention of each day no 1h or 24h window reads (all its hours
 * over DAY_HOURS old) into their day packs; once per hour, trims the
 * packs of the oldest day to the hours within retention; once per day,
 * drops the load curves of the packs of days the 7d window no longer
 * reaches. `ps` says what was done before and is updated.
 *
 * A pass rewrites at most ps->budget packs (store_options.pack_per_pass),
 * so that it holds the writer, and the flushes queued behind it, for about
 * as long as a flush; with work left it sets ps->more, and the writer goes
 * on at its next flush. Each step finds its own work again: 'h' keys not
 * yet packed, packs without PACK_NO_CURVES; only the trim keeps a place,
 * the series id it stopped at.
 */
static int pack_pass(struct store *st, MDB_txn *txn, uint64_t now, struct pack_state *ps)
{
	uint64_t keep = st->opt.hour_retention_s;
	uint32_t oldest = (uint32_t)(now > keep ? (now - keep) / 3600 : 0);
	uint32_t settled = (uint32_t)(now > PACK_GRACE_S ? (now - PACK_GRACE_S) / 3600 : 0);
	uint32_t unread = settled > DAY_HOURS ? settled - DAY_HOURS : 0;
	uint32_t complete = unread / 24 * 24; /* whole days whose hours no 1h or 24h window reads */
	uint32_t cur_hour = (uint32_t)(now / 3600);
	uint32_t horizon = cur_hour >= WEEK_HOURS - 1 ? (cur_hour - (WEEK_HOURS - 1)) / 24 : 0;
	struct pack_ref *refs = NULL;
	size_t n = 0;
	int rc;

	/* complete hours, grouped by series and day */
	if ((rc = pack_list(st, txn, 'h', oldest, complete, false, &refs, &n)))
		goto out;
	for (size_t i = 0; i < n && !rc && pack_take(ps);) {
		uint32_t id = refs[i].id, day = refs[i].t / 24, hours[24];
		size_t nh = 0;
		for (; i < n && refs[i].id == id && refs[i].t / 24 == day; i++)
			hours[nh++] = refs[i].t;
		rc = pack_rewrite(st, txn, id, day, hours, nh, day == oldest / 24 ? oldest % 24 : 0, day < horizon);
		ps->hours += nh;
		ps->packs++;
	}
	free(refs);
	refs = NULL;
	if (rc)
		goto out;

	/* the oldest day's packs, once the oldest hour kept moves */
	if (ps->trimmed != oldest) {
		uint32_t day = oldest / 24;
		size_t i;
		if (ps->trim_at != oldest) {
			ps->trim_at = oldest;
			ps->trim_from = 0;
		}
		if ((rc = pack_list(st, txn, 'd', day, day + 1, false, &refs, &n)))
			goto out;
		for (i = 0; i < n && !rc; i++) {
			if (refs[i].id < ps->trim_from)
				continue;
			if (!pack_take(ps)) {
				ps->trim_from = refs[i].id;
				break;
			}
			rc = pack_rewrite(st, txn, refs[i].id, day, NULL, 0, oldest % 24, day < horizon);
		}
		free(refs);
		refs = NULL;
		if (rc)
			goto out;
		if (i == n) {
			ps->trimmed = oldest;
			ps->trim_from = 0;
		}
	}

	/* the days the 7d window has left behind */
	if (ps->stripped != horizon) {
		if ((rc = pack_list(st, txn, 'd', oldest / 24, horizon, true, &refs, &n)))
			goto out;
		size_t i;
		for (i = 0; i < n && !rc && pack_take(ps); i++) {
			uint32_t day = refs[i].t;
			rc = pack_rewrite(st, txn, refs[i].id, day, NULL, 0, day == oldest / 24 ? oldest % 24 : 0,
					  true);
		}
		if (rc)
			goto out;
		if (i == n)
			ps->stripped = horizon;
	}
out:
	free(refs);
	return rc;
}

/* Runs the pack pass in its own write transaction: all of it or nothing,
 * so a failure (map or disk full) leaves every 'h' slice where it was. */
static int pack_commit(struct store *st, uint64_t now, struct pack_state *ps)
{
	MDB_txn *txn;
	int rc;

	pthread_rwlock_rdlock(&st->map_lock);
	rc = mdb_txn_begin(st->env, NULL, 0, &txn);
	if (rc == 0) {
		rc = pack_pass(st, txn, now, ps);
		if (rc)
			mdb_txn_abort(txn);
		else
			rc = mdb_txn_commit(txn);
	}
	pthread_rwlock_unlock(&st->map_lock);
	return rc;
}

/* Packs what is due, up to the bound of a pass; says a failure once per
 * cause (the hours stay as they are, read as before, and are tried again
 * at the next once-a-minute pass). */
void store_pack_run(struct store *st, uint64_t now)
{
	struct pack_state ps;
	int rc;

	pack_state_init(&ps, st);
	rc = pack_commit(st, now, &ps);
	if (rc == MDB_MAP_FULL && store_map_grow(st) == 0) {
		pack_state_init(&ps, st);
		rc = pack_commit(st, now, &ps);
	}
	if (rc) {
		if (rc != st->pack_said && !st->fault)
			log_warn(
				"store: packing hour slices into days failed: %s; they stay as they are and are "
				"tried again",
				mdb_strerror(rc));
		else
			log_debug("store: packing hour slices into days failed: %s", mdb_strerror(rc));
		st->pack_said = rc;
		st->pack_more = false;
		return;
	}
	st->pack_said = 0;
	st->pack_trimmed = ps.trimmed;
	st->pack_stripped = ps.stripped;
	st->pack_trim_at = ps.trim_at;
	st->pack_trim_from = ps.trim_from;
	st->pack_more = ps.more;
	if (ps.hours)
		log_debug("store: packed %zu hour slice(s) into %zu day(s)%s", ps.hours, ps.packs,
			  ps.more ? "; more at the next flush" : "");
}
