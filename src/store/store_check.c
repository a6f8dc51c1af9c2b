/*
 * store_check.c — the store's start-up check of its LMDB file: a walk of
 * LMDB's page structure with pread, then of every record through LMDB, in
 * a child process. See store_check.h for what counts as corrupt.
 */
#define _GNU_SOURCE /* strsignal */
#include "store_check.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static bool rc_corrupt(int rc)
{
	return rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH || rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND ||
	       rc == MDB_INCOMPATIBLE || rc == MDB_CURSOR_FULL;
}

/*
 * LMDB's on-disk format, data version 1 (LMDB 0.9, checked by mdb_env_open
 * before any of this is read), as mdb.c lays it out on a 64-bit machine.
 * LMDB trusts its pages: reading follows node offsets unchecked, and writing
 * asserts invariants (mp_upper >= mp_lower) that garbage breaks. So the
 * check reads every page of the tree itself, with pread and every offset
 * bounds-checked, before LMDB is let near it.
 */
#define PG_HDR 16 /* u64 pgno, u16 pad, u16 flags, u16 lower + u16 upper or u32 overflow pages */
#define PG_FLAGS 10
#define PG_LOWER 12
#define PG_UPPER 14
#define PG_OVPAGES 12
#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define P_META 0x08
#define P_LEAF2 0x20
#define NODE_HDR 8 /* u16 lo, u16 hi, u16 flags, u16 key size */
#define F_BIGDATA 0x01
#define F_SUBDATA 0x02
#define F_DUPDATA 0x04
#define META_DB(i) (PG_HDR + 24 + 48 * (i)) /* the free (0) and main (1) database records */
#define META_LAST (PG_HDR + 120)
#define META_TXNID (PG_HDR + 128)
#define DB_ROOT 40
#define DB_SIZE 48
#define KEY_MAX 511   /* LMDB's largest key */
#define TREE_DEPTH 32 /* LMDB's cursor stack */
#define NO_PAGE UINT64_MAX

struct walk {
	int fd;
	size_t psize;
	uint64_t last_pgno;
	uint64_t file_size; /* pages in use must lie below it */
	uint8_t *seen;	    /* a bit per page: used by the tree */
	uint8_t *bufs;	    /* a page per tree level */
	uint64_t budget;    /* records the file's pages could hold at most */
	char *why;
	size_t whylen;
};

static uint16_t get16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static bool seen_test_set(struct walk *w, uint64_t pgno)
{
	bool was = w->seen[pgno >> 3] & (1u << (pgno & 7));
	w->seen[pgno >> 3] |= (uint8_t)(1u << (pgno & 7));
	return was;
}

/* Reads page `pgno` into `buf`: it must lie in the file, carry its own
 * number and not be used twice. Its kind (P_BRANCH, P_LEAF, P_OVERFLOW or
 * P_META), or 0 with `why` set. */
static unsigned page_read(struct walk *w, uint64_t pgno, uint8_t *buf)
{
	unsigned kind;

	if (pgno < 2 || pgno > w->last_pgno) {
		snprintf(w->why, w->whylen, "a page number (%llu) outside the file", (unsigned long long)pgno);
		return 0;
	}
	if ((pgno + 1) * w->psize > w->file_size) {
		snprintf(w->why, w->whylen, "truncated: %llu bytes, but page %llu, in use, ends at byte %llu",
			 (unsigned long long)w->file_size, (unsigned long long)pgno,
			 (unsigned long long)((pgno + 1) * w->psize));
		return 0;
	}
	if (pread(w->fd, buf, w->psize, (off_t)(pgno * w->psize)) != (ssize_t)w->psize) {
		snprintf(w->why, w->whylen, "page %llu cannot be read", (unsigned long long)pgno);
		return 0;
	}
	kind = get16(buf + PG_FLAGS) & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META);
	if (get64(buf) != pgno || !kind) {
		snprintf(w->why, w->whylen, "page %llu has a bad header", (unsigned long long)pgno);
		return 0;
	}
	if (seen_test_set(w, pgno)) {
		snprintf(w->why, w->whylen, "page %llu is used twice", (unsigned long long)pgno);
		return 0;
	}
	return kind;
}

/* The overflow pages of one big value, `dsize` bytes from page `pgno`. */
static bool overflow_ok(struct walk *w, uint64_t pgno, uint64_t dsize)
{
	uint8_t *buf = w->bufs + 2 * TREE_DEPTH * w->psize;
	uint32_t n;
	unsigned kind = page_read(w, pgno, buf);

	if (!kind)
		return false;
	memcpy(&n, buf + PG_OVPAGES, sizeof(n));
	if (kind != P_OVERFLOW || n == 0 || n > w->last_pgno - pgno + 1 || dsize > (uint64_t)n * w->psize - PG_HDR) {
		snprintf(w->why, w->whylen, "the overflow pages at %llu do not fit the file", (unsigned long long)pgno);
		return false;
	}
	if ((pgno + n) * w->psize > w->file_size) {
		snprintf(w->why, w->whylen,
			 "truncated: %llu bytes, but overflow pages in use from %llu end at byte %llu",
			 (unsigned long long)w->file_size, (unsigned long long)pgno,
			 (unsigned long long)((pgno + n) * w->psize));
		return false;
	}
	for (uint64_t i = 1; i < n; i++) {
		if (seen_test_set(w, pgno + i)) {
			snprintf(w->why, w->whylen, "page %llu is used twice", (unsigned long long)(pgno + i));
			return false;
		}
	}
	return true;
}

/* Checks the tree under `pgno`, `depth` levels down; in the main database
 * (`main`), the named databases' trees too. The main tree reads into the
 * first TREE_DEPTH page buffers, a named tree into the next ones. */
static bool tree_ok(struct walk *w, uint64_t pgno, unsigned depth, bool main)
{
	uint8_t *buf = w->bufs + ((main ? 0 : TREE_DEPTH) + depth) * w->psize;
	unsigned kind;

	if (depth >= TREE_DEPTH) {
		snprintf(w->why, w->whylen, "a tree deeper than LMDB can walk");
		return false;
	}
	if (!(kind = page_read(w, pgno, buf)))
		return false;
	uint16_t lower = get16(buf + PG_LOWER), upper = get16(buf + PG_UPPER);
	if ((kind != P_BRANCH && kind != P_LEAF) || (get16(buf + PG_FLAGS) & P_LEAF2) || lower < PG_HDR ||
	    lower > upper || upper > w->psize || (lower & 1) || (kind == P_BRANCH && lower == PG_HDR)) {
		snprintf(w->why, w->whylen, "page %llu is not a sound tree page", (unsigned long long)pgno);
		return false;
	}
	for (unsigned i = 0; i < (lower - PG_HDR) / 2u; i++) {
		unsigned off = get16(buf + PG_HDR + 2 * i);
		if (off < upper || off > w->psize - NODE_HDR) {
			snprintf(w->why, w->whylen, "page %llu has a record outside it", (unsigned long long)pgno);
			return false;
		}
		const uint8_t *node = buf + off;
		uint16_t lo = get16(node), hi = get16(node + 2), flags = get16(node + 4), ksize = get16(node + 6);
		uint64_t dsize = (uint64_t)lo | (uint64_t)hi << 16;
		if (ksize > KEY_MAX || off + NODE_HDR + ksize > w->psize) {
			snprintf(w->why, w->whylen, "page %llu has a bad key", (unsigned long long)pgno);
			return false;
		}
		if (kind == P_BRANCH) {
			/* a branch record's size and flags fields hold the child's page number */
			if (!tree_ok(w, dsize | (uint64_t)flags << 32, depth + 1, main))
				return false;
			continue;
		}
		if (w->budget-- == 0) {
			snprintf(w->why, w->whylen, "more records than the file's pages hold");
			return false;
		}
		const uint8_t *data = node + NODE_HDR + ksize;
		uint64_t inline_size = flags & F_BIGDATA ? 8 : dsize;
		if ((flags & F_DUPDATA) || off + NODE_HDR + ksize + inline_size > w->psize ||
		    ((flags & F_SUBDATA) && (!main || (flags & F_BIGDATA) || dsize != DB_SIZE))) {
			snprintf(w->why, w->whylen, "page %llu has a bad record", (unsigned long long)pgno);
			return false;
		}
		if ((flags & F_BIGDATA) && !overflow_ok(w, get64(data), dsize))
			return false;
		uint64_t root;
		if ((flags & F_SUBDATA) && (root = get64(data + DB_ROOT)) != NO_PAGE && !tree_ok(w, root, 0, false))
			return false;
	}
	return true;
}

/* Every page of the trees the current meta page roots: the free list, the
 * main database and the named databases under it. */
static enum store_health pages_check(struct walk *w, int fd)
{
	uint8_t meta[2][PG_HDR + 136];
	int cur;

	if (sizeof(size_t) != 8)
		return STORE_SOUND; /* the offsets above are for 64-bit builds */
	for (int i = 0; i < 2; i++) {
		if (pread(fd, meta[i], sizeof(meta[i]), (off_t)(i * w->psize)) != (ssize_t)sizeof(meta[i])) {
			snprintf(w->why, w->whylen, "its meta pages cannot be read");
			return STORE_CORRUPT;
		}
	}
	/* LMDB uses the meta page of the later transaction */
	cur = get64(meta[1] + META_TXNID) > get64(meta[0] + META_TXNID);
	if (get64(meta[cur] + META_LAST) != w->last_pgno) {
		snprintf(w->why, w->whylen, "its meta pages disagree with LMDB");
		return STORE_UNKNOWN;
	}
	w->fd = fd;
	w->seen = calloc((size_t)(w->last_pgno / 8 + 1), 1);
	w->bufs = malloc((2 * TREE_DEPTH + 1) * w->psize);
	bool ok = w->seen && w->bufs;
	for (int i = 0; ok && i < 2; i++) {
		uint64_t root = get64(meta[cur] + META_DB(i) + DB_ROOT);
		if (root != NO_PAGE && !tree_ok(w, root, 0, i == 1))
			return STORE_CORRUPT; /* db_walk frees `seen` and `bufs` */
	}
	if (!ok) {
		snprintf(w->why, w->whylen, "out of memory");
		return STORE_UNKNOWN;
	}
	return STORE_SOUND;
}

/* A free-list record: a count, then that many page numbers, all in the file
 * and none in use by the tree. */
static bool free_record_ok(const struct walk *w, const MDB_val *v)
{
	size_t n, id;

	if (v->mv_size < sizeof(size_t) || v->mv_size % sizeof(size_t))
		return false;
	memcpy(&n, v->mv_data, sizeof(n)); /* 2-byte aligned in the page */
	if (n != v->mv_size / sizeof(size_t) - 1)
		return false;
	for (size_t i = 1; i <= n; i++) {
		memcpy(&id, (const char *)v->mv_data + i * sizeof(size_t), sizeof(id));
		if (id < 2 || id > w->last_pgno || (w->seen && (w->seen[id >> 3] & (1u << (id & 7)))))
			return false;
	}
	return true;
}

/* Reads every record of one database through LMDB: what LMDB itself
 * refuses, and the free list's contents. */
static enum store_health walk_db(struct walk *w, MDB_txn *txn, MDB_dbi dbi, const char *name)
{
	MDB_cursor *cur;
	MDB_val k, v;
	int rc;

	if ((rc = mdb_cursor_open(txn, dbi, &cur)) != 0) {
		snprintf(w->why, w->whylen, "database %s: %s", name, mdb_strerror(rc));
		return rc_corrupt(rc) ? STORE_CORRUPT : STORE_UNKNOWN;
	}
	while ((rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
		if (dbi == 0 && !free_record_ok(w, &v)) {
			snprintf(w->why, w->whylen, "the free-page list names pages outside the file or in use");
			break;
		}
	}
	mdb_cursor_close(cur);
	if (rc == MDB_NOTFOUND)
		return STORE_SOUND;
	if (rc == 0)
		return STORE_CORRUPT;
	snprintf(w->why, w->whylen, "database %s: %s", name, mdb_strerror(rc));
	return rc_corrupt(rc) ? STORE_CORRUPT : STORE_UNKNOWN;
}

/* The check itself, in the child: opens the database read-only, checks
 * its pages, then walks it through LMDB. `why` says what was found when the
 * answer is not STORE_SOUND. */
static enum store_health db_walk(const char *dir, uint64_t map_size, char *why, size_t whylen)
{
	static const char *const names[] = { "meta", "series", "series_by_id", "slices" };
	MDB_env *env = NULL;
	MDB_txn *txn = NULL;
	MDB_envinfo info;
	MDB_stat ms;
	MDB_dbi dbi;
	MDB_val k = { 6, "layout" }, v;
	struct stat sb;
	struct walk w = { .fd = -1, .why = why, .whylen = whylen };
	char path[4096];
	enum store_health h = STORE_UNKNOWN;
	int rc, fd = -1;

	snprintf(path, sizeof(path), "%s/data.mdb", dir);
	if ((rc = mdb_env_create(&env)) != 0) {
		snprintf(why, whylen, "%s", mdb_strerror(rc));
		return STORE_UNKNOWN;
	}
	mdb_env_set_maxdbs(env, 8);
	mdb_env_set_mapsize(env, (size_t)map_size);
	if ((rc = mdb_env_open(env, dir, MDB_RDONLY | MDB_NOTLS, 0640)) != 0) {
		snprintf(why, whylen, "%s", mdb_strerror(rc));
		h = rc_corrupt(rc) ? STORE_CORRUPT : STORE_UNKNOWN;
		goto out_env;
	}
	if (mdb_env_info(env, &info) != 0 || mdb_env_stat(env, &ms) != 0 || (fd = open(path, O_RDONLY)) == -1 ||
	    fstat(fd, &sb) == -1) {
		snprintf(why, whylen, "cannot read its size");
		goto out_env;
	}
	/* A file may end before its last page: LMDB does not write a page
	 * that the commit which took it from the end also freed (pages merged
	 * away while deleting, in the transaction that copied them), and
	 * keeps it in the free list. Only pages in use must be in the file;
	 * the page walk reads each one and says "truncated" for one past the
	 * end, which LMDB would fault on (SIGBUS) reading it. */
	uint64_t end = ((uint64_t)info.me_last_pgno + 1) * ms.ms_psize;
	w.psize = ms.ms_psize;
	w.last_pgno = info.me_last_pgno;
	w.file_size = (uint64_t)sb.st_size;
	w.budget = end / NODE_HDR;
	if ((h = pages_check(&w, fd)) != STORE_SOUND)
		goto out_env;
	if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn)) != 0) {
		snprintf(why, whylen, "%s", mdb_strerror(rc));
		h = rc_corrupt(rc) ? STORE_CORRUPT : STORE_UNKNOWN;
		goto out_env;
	}
	if ((h = walk_db(&w, txn, 0, "(free pages)")) != STORE_SOUND)
		goto out_txn;
	if ((rc = mdb_dbi_open(txn, NULL, 0, &dbi)) != 0 || (h = walk_db(&w, txn, dbi, "(main)")) != STORE_SOUND) {
		if (rc) {
			snprintf(why, whylen, "main database: %s", mdb_strerror(rc));
			h = rc_corrupt(rc) ? STORE_CORRUPT : STORE_UNKNOWN;
		}
		goto out_txn;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		rc = mdb_dbi_open(txn, names[i], 0, &dbi);
		if (rc == MDB_NOTFOUND)
			continue;
		if (rc) {
			snprintf(why, whylen, "database %s: %s", names[i], mdb_strerror(rc));
			h = rc_corrupt(rc) ? STORE_CORRUPT : STORE_UNKNOWN;
			goto out_txn;
		}
		if ((h = walk_db(&w, txn, dbi, names[i])) != STORE_SOUND)
			goto out_txn;
		if (i != 0)
			continue;
		rc = mdb_get(txn, dbi, &k, &v);
		if (rc && rc != MDB_NOTFOUND) {
			snprintf(why, whylen, "its layout record: %s", mdb_strerror(rc));
			h = rc_corrupt(rc) ? STORE_CORRUPT : STORE_UNKNOWN;
			goto out_txn;
		}
		/* A layout that is not tokentap's reads back fine: the file is
		 * sound, only not ours, and store_open refuses it unmoved. */
	}
	h = STORE_SOUND;
out_txn:
	mdb_txn_abort(txn);
out_env:
	mdb_env_close(env);
	if (fd != -1)
		close(fd);
	free(w.seen);
	free(w.bufs);
	return h;
}

/* Runs db_walk in a child, so that a fault reading a damaged page ends the
 * child, not tokentap; a child that dies without its verdict is one. */
enum store_health store_check_file(const char *dir, uint64_t map_size, char *why, size_t whylen)
{
	char path[4096], buf[512];
	struct stat sb;
	int fds[2], status = 0;
	size_t got = 0;
	pid_t pid, waited;

	snprintf(path, sizeof(path), "%s/data.mdb", dir);
	if (stat(path, &sb) == -1 || sb.st_size == 0)
		return STORE_SOUND; /* nothing written yet: LMDB starts it */
	if (pipe(fds) == -1) {
		snprintf(why, whylen, "cannot check it: pipe: %s", strerror(errno));
		return STORE_UNKNOWN;
	}
	pid = fork();
	if (pid == -1) {
		snprintf(why, whylen, "cannot check it: fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return STORE_UNKNOWN;
	}
	if (pid == 0) {
		/* The child reads, writes its verdict and leaves by _exit: no
		 * exit handlers, no stdio buffers of the parent flushed twice.
		 * (glibc keeps malloc and stdio usable after fork, which LMDB and
		 * map_base need.) A sanitizer's report of a fault goes nowhere:
		 * the parent says what happened. */
		int null = open("/dev/null", O_WRONLY);
		if (null != -1)
			dup2(null, STDERR_FILENO);
		close(fds[0]);
		enum store_health h = db_walk(dir, map_size, buf + 1, sizeof(buf) - 1);
		buf[0] = "SCU"[h];
		ssize_t n = write(fds[1], buf, strlen(buf));
		_exit(n > 0 ? 0 : 1);
	}
	close(fds[1]);
	for (int i = 0; i < 1000 && got < sizeof(buf) - 1; i++) {
		ssize_t n = read(fds[0], buf + got, sizeof(buf) - 1 - got);
		if (n == -1 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	buf[got] = '\0';
	close(fds[0]);
	do
		waited = waitpid(pid, &status, 0);
	while (waited == -1 && errno == EINTR);
	if (got == 0 && waited == -1) {
		snprintf(why, whylen, "cannot check it: waitpid: %s", strerror(errno));
		return STORE_UNKNOWN;
	}
	if (got == 0) {
		if (WIFSIGNALED(status))
			snprintf(why, whylen, "reading it crashed the check (signal %d, %s)", WTERMSIG(status),
				 strsignal(WTERMSIG(status)));
		else
			snprintf(why, whylen, "reading it crashed the check (exit status %d)",
				 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
		return STORE_CORRUPT;
	}
	snprintf(why, whylen, "%s", buf + 1);
	return buf[0] == 'S' ? STORE_SOUND : buf[0] == 'C' ? STORE_CORRUPT : STORE_UNKNOWN;
}
