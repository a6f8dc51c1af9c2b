/*
 * sim_text.c — where the simulator's determinism lives: a byte hash, a
 * splitmix64 PRNG, the built-in word list tokens are drawn from, and the
 * JSON string escaper every response shape writes text through.
 *
 * Invariant: nothing here reads a clock, an address or global state, so a
 * (seed, body) pair always yields the same words on every machine.
 */
#include "sim.h"

#include <event2/buffer.h>

#include <stdio.h>
#include <string.h>

/* FNV-1a, 64 bit, continued from h so several inputs can be chained. */
uint64_t sim_hash(const void *data, size_t len, uint64_t h)
{
	const unsigned char *p = data;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

/* The splitmix64 finaliser: spreads FNV's weak low bits over all 64. */
uint64_t sim_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

uint64_t sim_prng_next(struct sim_prng *p)
{
	p->state += 0x9e3779b97f4a7c15ULL;
	return sim_mix(p->state);
}

/*
 * 64 entries so a draw is six bits. Every entry starts with the space that
 * separates it from the previous token; the first token skips it. Three
 * entries need JSON escaping (a quote, a newline, a backslash) and one is
 * multi-byte UTF-8, so the proxy's classifiers meet escapes and non-ASCII
 * text about once every sixteen tokens, as they do with real models.
 */
static const char *const sim_words[] = {
	" the",		" a",	   " model",	 " token",  " latency",	   " stream",	" server", " request",
	" of",		" and",	   " to",	 " in",	    " is",	   " that",	" for",	   " with",
	" time",	" first",  " each",	 " next",   " fast",	   " slow",	" queue",  " batch",
	" cache",	" prompt", " answer",	 " data",   " proxy",	   " measure",	" tail",   " percentile",
	" load",	" curve",  " upstream",	 " client", " byte",	   " event",	" chunk",  " line",
	" word",	" text",   " simple",	 " quiet",  " river",	   " mountain", " light",  " night",
	" number",	" seven",  " forty-two", " yes",    " no",	   " maybe",	" then",   " it",
	" was",		" will",   ",",		 ".",	    " \"quoted\"", /* needs \" in JSON */
	" end.\n",							   /* needs \n in JSON */
	" back\\slash",							   /* needs \\ in JSON */
	" caf\xc3\xa9",							   /* UTF-8, written raw */
};

_Static_assert(sizeof(sim_words) / sizeof(sim_words[0]) == 64, "sim_text_word draws six bits: keep exactly 64 words");

const char *sim_text_word(struct sim_prng *p, bool first, size_t *len)
{
	const char *w = sim_words[sim_prng_next(p) >> 58];

	/* the first token drops its separating space; punctuation has none to
	 * drop (skipping a byte of "," would leave an empty, tokenless delta) */
	if (first && *w == ' ')
		w++;
	*len = strlen(w);
	return w;
}

/*
 * Escapes what JSON requires and nothing else: '"', '\\' and control
 * characters; UTF-8 passes through raw, as Python's json.dumps(...,
 * ensure_ascii=False) and most servers' Rust/Go encoders write it.
 */
void sim_json_str(struct evbuffer *out, const char *s, size_t len)
{
	size_t run = 0;

	evbuffer_add(out, "\"", 1);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[8];
		const char *e = NULL;

		if (c == '"')
			e = "\\\"";
		else if (c == '\\')
			e = "\\\\";
		else if (c == '\n')
			e = "\\n";
		else if (c == '\r')
			e = "\\r";
		else if (c == '\t')
			e = "\\t";
		else if (c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", c);
			e = esc;
		}
		if (e == NULL)
			continue;
		if (i > run)
			evbuffer_add(out, s + run, i - run);
		evbuffer_add(out, e, strlen(e));
		run = i + 1;
	}
	if (len > run)
		evbuffer_add(out, s + run, len - run);
	evbuffer_add(out, "\"", 1);
}
