/*
 * store_check.h — whether the store's LMDB file is safe to open: the
 * store's start-up check (store.c moves a corrupt file aside rather than
 * crash-looping on it).
 *
 * What "corrupt" means here: the file LMDB would map cannot be trusted to
 * read back, or to be written without LMDB failing an assertion. That is
 *   - mdb_env_open refusing it: MDB_INVALID (no valid meta page: garbage,
 *     zeroed meta pages, a file shorter than two pages), MDB_VERSION_MISMATCH
 *     (another LMDB data format), MDB_CORRUPTED, MDB_PAGE_NOTFOUND;
 *   - a page in use (below) past the end of the file: LMDB would map it
 *     and fault (SIGBUS) on the first read (truncated). Free pages past
 *     the end are sound: LMDB leaves unwritten a page that the commit
 *     which took it from the end freed again;
 *   - a page of the current trees (free list, main database, the named
 *     databases), read here with pread, that lies outside the file, does
 *     not carry its own number, is used twice, has bounds or records that
 *     do not fit it, or overflow pages past the end; or a tree deeper than
 *     LMDB walks;
 *   - a walk through LMDB of every record failing with one of the codes
 *     above, MDB_INCOMPATIBLE or MDB_CURSOR_FULL, or a free-list record
 *     naming a page outside the file or in use;
 *   - the store's own layout record unreadable, or not a tokentap layout
 *     (a tokentap layout of another version is refused, not moved);
 *   - the check dying: it runs in a child process, so that whatever it
 *     misses and LMDB faults on ends the child, not tokentap.
 * Any other failure (permissions, memory) is not a verdict on the file: the
 * open that follows reports it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

enum store_health { STORE_SOUND, STORE_CORRUPT, STORE_UNKNOWN };

/* Checks DIR/data.mdb (a missing or empty file is sound: LMDB starts it)
 * in a child process, so that a fault reading a damaged page ends the
 * child, not tokentap; a child that dies without its verdict is one.
 * `map_size` is the map LMDB will be opened with. `why` says what was
 * found (or, for STORE_UNKNOWN, why it could not be checked). */
enum store_health store_check_file(const char *dir, uint64_t map_size, char *why, size_t whylen);
