/*
 * sim_cache.c — the optional prefix-cache model of tokentap-sim
 * (--prefix-cache): it remembers the prompts it has seen in blocks of
 * SIM_CACHE_BLOCK_TOKENS tokens and reports the leading blocks a new prompt
 * shares with them as cached, as vLLM's automatic prefix caching does.
 *
 * A block is 4 bytes a token (the simulator's token count) times the block
 * size, identified by a hash chained over every block before it, so a block
 * matches only behind the same prefix. Only whole blocks are cached, and at
 * least one prompt token is always computed (vLLM's rule).
 *
 * The cache holds at most --prefix-cache-tokens tokens (whole blocks) and
 * evicts the least recently used block when a new one needs room, as a
 * replica whose KV memory is full does. Every block a prompt used becomes
 * recently used in reverse order, the prompt's first block last, so that
 * eviction takes a prompt's tail before its head (vLLM frees a finished
 * sequence's blocks the same way): a shared system prompt outlives the
 * conversations behind it.
 *
 * Invariant kept: memory is the table sized once at start, whatever the
 * traffic. This is the one place where a response body depends on earlier
 * requests (usage's cached counts), and only when the flag is on.
 */
#include "sim.h"

#include <stdlib.h>

#define SIM_CACHE_BLOCK_TOKENS 16
#define SIM_CACHE_BLOCK_BYTES (SIM_CACHE_BLOCK_TOKENS * 4)
#define NIL UINT32_MAX

/* One resident block: its chain hash, its place in the LRU list (head: most
 * recently used) and in its hash bucket's chain. */
struct block {
	uint64_t key;
	uint32_t newer, older, chain;
};

static struct {
	struct block *blocks; /* cap entries, the first `used` of them live */
	uint32_t *buckets;    /* mask + 1 chain heads */
	uint32_t cap, used, mask, mru, lru;
	uint64_t *keys; /* one prompt's chain hashes, grown as needed */
	size_t keys_cap;
} C = { .mru = NIL, .lru = NIL };

static struct sim_cache_stats cache_stats;

int sim_cache_init(uint64_t tokens)
{
	uint64_t cap = tokens / SIM_CACHE_BLOCK_TOKENS, n = 1;

	if (cap == 0)
		cap = 1;
	while (n < cap)
		n <<= 1;
	C.blocks = calloc(cap, sizeof(*C.blocks));
	C.buckets = malloc(n * sizeof(*C.buckets));
	if (C.blocks == NULL || C.buckets == NULL)
		return -1;
	for (uint64_t i = 0; i < n; i++)
		C.buckets[i] = NIL;
	C.cap = (uint32_t)cap;
	C.mask = (uint32_t)(n - 1);
	cache_stats.capacity_tokens = cap * SIM_CACHE_BLOCK_TOKENS;
	return 0;
}

void sim_cache_shutdown(void)
{
	free(C.blocks);
	free(C.buckets);
	free(C.keys);
	C.blocks = NULL;
	C.buckets = NULL;
	C.keys = NULL;
}

static uint32_t find(uint64_t key)
{
	uint32_t i = C.buckets[key & C.mask];

	while (i != NIL && C.blocks[i].key != key)
		i = C.blocks[i].chain;
	return i;
}

static void lru_unlink(uint32_t i)
{
	struct block *b = &C.blocks[i];

	if (b->newer != NIL)
		C.blocks[b->newer].older = b->older;
	else
		C.mru = b->older;
	if (b->older != NIL)
		C.blocks[b->older].newer = b->newer;
	else
		C.lru = b->newer;
	b->newer = b->older = NIL;
}

static void lru_push(uint32_t i)
{
	struct block *b = &C.blocks[i];

	b->newer = NIL;
	b->older = C.mru;
	if (C.mru != NIL)
		C.blocks[C.mru].newer = i;
	else
		C.lru = i;
	C.mru = i;
}

static void chain_unlink(uint32_t i)
{
	uint32_t *p = &C.buckets[C.blocks[i].key & C.mask];

	while (*p != i)
		p = &C.blocks[*p].chain;
	*p = C.blocks[i].chain;
}

/* Stores key as the most recently used block, evicting the least recently
 * used one when the cache is full. */
static void insert(uint64_t key)
{
	uint32_t i;
	uint32_t *head = &C.buckets[key & C.mask];

	if (C.used < C.cap) {
		i = C.used++;
	} else {
		i = C.lru;
		lru_unlink(i);
		chain_unlink(i);
		cache_stats.evicted_blocks++;
	}
	C.blocks[i].key = key;
	C.blocks[i].chain = *head;
	*head = i;
	lru_push(i);
}

void sim_cache_use(const char *text, size_t len, uint64_t n_in, uint64_t *cached, uint64_t *written)
{
	uint64_t h = 0xcbf29ce484222325ULL, hit_blocks = 0, new_blocks = 0;
	size_t blocks = len / SIM_CACHE_BLOCK_BYTES;
	bool hitting = true, keep = true;

	if (blocks > C.keys_cap) {
		uint64_t *k = realloc(C.keys, blocks * sizeof(*k));

		if (k != NULL) {
			C.keys = k;
			C.keys_cap = blocks;
		} else {
			keep = false; /* no reordering this time; the counts stay exact */
		}
	}
	for (size_t b = 0; b < blocks; b++) {
		uint64_t key = sim_mix(sim_hash(text + b * SIM_CACHE_BLOCK_BYTES, SIM_CACHE_BLOCK_BYTES, h)) | 1;
		uint32_t i = find(key);

		h = key;
		if (keep)
			C.keys[b] = key;
		if (hitting && i != NIL) {
			hit_blocks++;
			continue;
		}
		hitting = false;
		if (i == NIL) {
			insert(key);
			new_blocks++;
		}
	}
	/* Reverse order: the prompt's first block ends most recently used. */
	for (size_t b = keep ? blocks : 0; b-- > 0;) {
		uint32_t i = find(C.keys[b]);

		if (i != NIL && i != C.mru) {
			lru_unlink(i);
			lru_push(i);
		}
	}
	*cached = hit_blocks * SIM_CACHE_BLOCK_TOKENS;
	if (*cached >= n_in)
		*cached = n_in - 1; /* the last prompt token is always computed */
	*written = new_blocks * SIM_CACHE_BLOCK_TOKENS;
	if (*written > n_in - *cached)
		*written = n_in - *cached;
	cache_stats.lookups++;
	cache_stats.prompt_tokens += n_in;
	cache_stats.cached_tokens += *cached;
	cache_stats.resident_tokens = (uint64_t)C.used * SIM_CACHE_BLOCK_TOKENS;
}

const struct sim_cache_stats *sim_cache_stats(void)
{
	return &cache_stats;
}
