/*
 * sim_cache.c — the optional prefix-cache model of tokentap-sim
 * (--prefix-cache): it remembers the prompts it has seen in blocks of
 * SIM_CACHE_BLOCK_TOKENS tokens and reports the leading blocks a new prompt
 * shares with them as cached, as vLLM's automatic prefix caching does.
 *
 * A block is 4 bytes a token (the simulator's token count) times the block
 * size, identified by a hash chained over every block before it, so a block
 * matches only behind the same prefix. Only whole blocks are cached, and at
 * least one prompt token is always computed (vLLM's rule). The table holds
 * SIM_CACHE_SLOTS block hashes; a new block takes the slot its hash picks,
 * evicting whatever was there (a crude, bounded LRU).
 *
 * Invariant kept: memory is the fixed table, whatever the traffic. This is
 * the one place where a response body depends on earlier requests (usage's
 * cached counts), and only when the flag is on.
 */
#include "sim.h"

#include <stdlib.h>

#define SIM_CACHE_BLOCK_TOKENS 16
#define SIM_CACHE_BLOCK_BYTES (SIM_CACHE_BLOCK_TOKENS * 4)
#define SIM_CACHE_SLOTS 65536 /* a power of two */

static uint64_t table[SIM_CACHE_SLOTS]; /* 0: empty; else a block's chain hash | 1 */
static struct sim_cache_stats cache_stats;

void sim_cache_use(const char *text, size_t len, uint64_t n_in, uint64_t *cached, uint64_t *written)
{
	uint64_t h = 0xcbf29ce484222325ULL, hit_blocks = 0, new_blocks = 0;
	size_t blocks = len / SIM_CACHE_BLOCK_BYTES;
	bool hitting = true;

	for (size_t b = 0; b < blocks; b++) {
		uint64_t key = sim_mix(sim_hash(text + b * SIM_CACHE_BLOCK_BYTES, SIM_CACHE_BLOCK_BYTES, h)) | 1;
		uint64_t *slot = &table[key & (SIM_CACHE_SLOTS - 1)];

		h = key;
		if (hitting && *slot == key) {
			hit_blocks++;
			continue;
		}
		hitting = false;
		if (*slot != key) {
			*slot = key;
			new_blocks++;
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
}

const struct sim_cache_stats *sim_cache_stats(void)
{
	return &cache_stats;
}
