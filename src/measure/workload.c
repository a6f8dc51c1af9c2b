/*
 * workload.c — the workload capture: a streaming scan of request bodies for
 * their prompt text, the salted hash chain over it, and the writer thread
 * that turns finished requests into trace lines (workload.h says what).
 *
 *   request.c body bytes ─▶ workload_feed ─▶ JSON scan ─prompt bytes─▶ chain (SHA-256 per block)
 *   meter_finish ─▶ workload_record ─copy─▶ queue (bounded) ─▶ writer: ids, JSON line, rotation
 *                                                               └─▶ summary (ring, groups) ─▶ GET /workload
 *
 * Invariants: the scan keeps a fixed amount of state per request (a depth
 * stack, a short key buffer) and does constant work per byte plus one
 * SHA-256 block step; the chain's result does not depend on how the body
 * was split into reads; a worker takes the queue's lock only to push one
 * pointer and never waits on the disk; the salt never leaves this file;
 * every file holds whole lines (a write a full disk cut short is cut off);
 * the summary's state is fixed at start (WL_SUMMARY_WINDOW records,
 * WL_GROUPS_MAX groups of WL_SERIES_SLOTS slots), and the admin thread
 * holds its lock only for a copy.
 */
#include "workload.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "classify.h"
#include "log.h"
#include "strutil.h"
#include "timeline.h"

/* ---- the scan of a request body ---- */

#define SCAN_DEPTH 64
#define KEY_MAX 24
#define NUM_MAX 64 /* a max_tokens number written longer is no number of ours */

/* What a JSON value is to the capture, from the key it sits under. */
enum wl_kind { WK_OTHER, WK_PROMPT, WK_MAXTOK, WK_SESSION, WK_ROLE };

/* What an object's `role` said, per depth. */
enum wl_role { WR_NONE, WR_USER, WR_OTHER };

struct wl_req {
	uint8_t salt[16];
	size_t block_bytes;
	/* the scan */
	unsigned depth;		      /* containers open */
	uint8_t is_obj[SCAN_DEPTH];   /* per depth: an object (else an array) */
	uint8_t kind[SCAN_DEPTH];     /* per depth: an array's element kind, an object's current member kind */
	uint8_t role[SCAN_DEPTH];     /* per depth: an object's `role` (enum wl_role) */
	uint64_t opened[SCAN_DEPTH];  /* per depth: prompt_bytes when the container opened */
	bool want_key;		      /* in an object, the next string is a key */
	bool in_str, esc, str_is_key; /* inside a string */
	uint8_t str_kind;	      /* a value string's kind */
	char key[KEY_MAX];	      /* the key being read, decoded (a longer one is no key of ours) */
	unsigned key_len;
	bool key_esc;	    /* the key's last byte was a backslash */
	uint8_t key_hex;    /* hex digits of a \u escape still to come */
	uint32_t key_cp;    /* the \u escape's value so far */
	bool in_num;	    /* inside a max_tokens number */
	char num[NUM_MAX];  /* its text (a longer one is absent) */
	unsigned num_len;   /* past NUM_MAX it still grows */
	int64_t max_tokens; /* -1: not asked, or not a count */
	/* the chain */
	EVP_MD_CTX *block; /* the block being filled */
	bool block_open;
	size_t fill;	     /* bytes in it */
	uint8_t prev[32];    /* the last closed block's digest */
	uint64_t *hashes;    /* closed blocks, then (in wl_req_hashes) the partial one */
	size_t nhashes, cap; /* nhashes counts closed blocks */
	uint64_t partial;    /* the open block's hash, valid when partial_n */
	bool partial_n;
	uint64_t prompt_bytes;
	/* the end of the first message whose role is "user" */
	bool turn_done, has_turn;
	uint64_t turn_hash, turn_bytes;
	/* the session key: the salted hash of `user` / `user_id` / `session_id` */
	EVP_MD_CTX *session;
	bool has_session;
	uint64_t session_hash;
};

static uint64_t digest64(const uint8_t d[32])
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | d[i];
	return v;
}

struct wl_req *wl_req_new(const uint8_t salt[16], size_t block_bytes)
{
	struct wl_req *w = calloc(1, sizeof(*w));

	if (!w)
		return NULL;
	memcpy(w->salt, salt, sizeof(w->salt));
	w->block_bytes = block_bytes ? block_bytes : 1;
	w->max_tokens = -1;
	w->block = EVP_MD_CTX_new();
	if (!w->block) {
		free(w);
		return NULL;
	}
	return w;
}

void workload_req_free(struct wl_req *w)
{
	if (!w)
		return;
	EVP_MD_CTX_free(w->block);
	EVP_MD_CTX_free(w->session);
	free(w->hashes);
	free(w);
}

/* A block starts: the digest covers the salt and the previous block's
 * digest (zeros for the first), so each hash stands for the whole prefix. */
static void block_begin(struct wl_req *w)
{
	EVP_DigestInit_ex(w->block, EVP_sha256(), NULL);
	EVP_DigestUpdate(w->block, w->salt, sizeof(w->salt));
	EVP_DigestUpdate(w->block, w->prev, sizeof(w->prev));
	w->block_open = true;
	w->fill = 0;
}

static void block_close(struct wl_req *w)
{
	unsigned int n = 0;

	EVP_DigestFinal_ex(w->block, w->prev, &n);
	w->block_open = false;
	if (w->nhashes == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 16;
		uint64_t *h = realloc(w->hashes, (cap + 1) * sizeof(*h));
		if (!h)
			return;
		w->hashes = h;
		w->cap = cap;
	}
	w->hashes[w->nhashes++] = digest64(w->prev);
}

/* Prompt bytes into the chain, block by block. */
static void chain_feed(struct wl_req *w, const char *at, size_t len)
{
	w->prompt_bytes += len;
	while (len && w->nhashes < WL_HASHES_MAX) {
		if (!w->block_open)
			block_begin(w);
		size_t take = w->block_bytes - w->fill;
		if (take > len)
			take = len;
		EVP_DigestUpdate(w->block, at, take);
		w->fill += take;
		at += take;
		len -= take;
		if (w->fill == w->block_bytes)
			block_close(w);
	}
}

static enum wl_kind key_kind(const char *k, unsigned len, unsigned depth)
{
	static const char *const prompt[] = { "content", "text", "prompt", "input", "system" };
	static const char *const maxtok[] = { "max_tokens", "max_completion_tokens", "max_output_tokens" };

	for (size_t i = 0; i < sizeof(prompt) / sizeof(prompt[0]); i++)
		if (strlen(prompt[i]) == len && memcmp(prompt[i], k, len) == 0)
			return WK_PROMPT;
	if (depth == 1)
		for (size_t i = 0; i < sizeof(maxtok) / sizeof(maxtok[0]); i++)
			if (strlen(maxtok[i]) == len && memcmp(maxtok[i], k, len) == 0)
				return WK_MAXTOK;
	if (depth >= 2 && len == 4 && memcmp(k, "role", 4) == 0)
		return WK_ROLE;
	if ((depth == 1 && len == 4 && memcmp(k, "user", 4) == 0) ||
	    (depth <= 2 && len == 7 && memcmp(k, "user_id", 7) == 0) ||
	    (depth == 1 && len == 10 && memcmp(k, "session_id", 10) == 0))
		return WK_SESSION;
	return WK_OTHER;
}

/* The kind of a value starting here. */
static uint8_t value_kind(const struct wl_req *w)
{
	if (w->depth == 0 || w->depth > SCAN_DEPTH)
		return WK_OTHER;
	return w->kind[w->depth - 1];
}

static void push(struct wl_req *w, bool obj)
{
	uint8_t k = value_kind(w);

	if (w->depth < SCAN_DEPTH) {
		w->is_obj[w->depth] = obj;
		w->role[w->depth] = WR_NONE;
		w->opened[w->depth] = w->prompt_bytes;
		/* an array's elements are what it is; an object's members wait for their keys */
		w->kind[w->depth] = obj ? WK_OTHER : (k == WK_PROMPT ? WK_PROMPT : WK_OTHER);
	}
	w->depth++;
	w->want_key = obj;
}

static bool top_is_obj(const struct wl_req *w)
{
	return w->depth && w->depth <= SCAN_DEPTH && w->is_obj[w->depth - 1];
}

/* One decoded character of a key into w->key; past KEY_MAX the length
 * still grows: a longer key matches none of ours. */
static void key_put(struct wl_req *w, char c)
{
	if (w->key_len < KEY_MAX)
		w->key[w->key_len] = c;
	if (w->key_len <= KEY_MAX)
		w->key_len++;
}

/* One byte of a key's JSON text. Escapes are decoded, as an upstream
 * decodes them before it looks the key up ("cont\u0065nt" is its
 * "content"); a character past ASCII, which none of our keys has, is kept
 * as a byte that matches none. */
static void key_byte(struct wl_req *w, char c)
{
	if (w->key_hex) {
		int h = c >= '0' && c <= '9'			 ? c - '0'
			: (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
								 : -1;
		w->key_cp = h < 0 ? 0x80 : (w->key_cp << 4 | (uint32_t)h) & 0xFFFF;
		if (h < 0)
			w->key_hex = 1; /* not JSON: the key matches none */
		if (--w->key_hex == 0)
			key_put(w, w->key_cp < 0x80 ? (char)w->key_cp : (char)0x80);
		return;
	}
	if (w->key_esc) {
		w->key_esc = false;
		if (c == 'u') {
			w->key_hex = 4;
			w->key_cp = 0;
			return;
		}
		/* \" \\ \/ are themselves; \n and the others, controls, match none */
		key_put(w, c == '"' || c == '\\' || c == '/' ? c : '\x01');
		return;
	}
	if (c == '\\')
		w->key_esc = true;
	else
		key_put(w, c);
}

/* Inside a string: prompt text to the chain, a key to its buffer, a
 * session value to its hash. Returns the bytes taken (up to the closing
 * quote, excluded). */
static size_t scan_string(struct wl_req *w, const char *at, size_t len)
{
	size_t i = 0;

	while (i < len) {
		char c = at[i];
		if (w->esc)
			w->esc = false;
		else if (c == '\\')
			w->esc = true;
		else if (c == '"')
			break;
		i++;
	}
	if (w->str_is_key || w->str_kind == WK_ROLE) {
		for (size_t j = 0; j < i; j++)
			key_byte(w, at[j]); /* a role is decoded as a key is */
	} else if (w->str_kind == WK_PROMPT) {
		chain_feed(w, at, i);
	} else if (w->str_kind == WK_SESSION && w->session) {
		EVP_DigestUpdate(w->session, at, i);
	}
	return i;
}

static void string_begin(struct wl_req *w)
{
	w->in_str = true;
	w->esc = false;
	w->str_is_key = top_is_obj(w) && w->want_key;
	w->key_len = 0;
	w->key_esc = false;
	w->key_hex = 0;
	w->str_kind = w->str_is_key ? WK_OTHER : value_kind(w);
	if (w->str_kind == WK_MAXTOK)
		w->max_tokens = -1; /* a string is no count */
	if (w->str_kind == WK_SESSION && !w->has_session) {
		if (!w->session)
			w->session = EVP_MD_CTX_new();
		if (w->session) {
			EVP_DigestInit_ex(w->session, EVP_sha256(), NULL);
			EVP_DigestUpdate(w->session, w->salt, sizeof(w->salt));
			EVP_DigestUpdate(w->session, "session", 7);
		}
	} else if (w->str_kind == WK_SESSION) {
		w->str_kind = WK_OTHER; /* the first one counts */
	}
}

static void string_end(struct wl_req *w)
{
	w->in_str = false;
	if (w->str_is_key) {
		if (w->depth && w->depth <= SCAN_DEPTH)
			w->kind[w->depth - 1] = (uint8_t)key_kind(w->key, w->key_len, w->depth);
		w->want_key = false;
	} else if (w->str_kind == WK_ROLE) {
		if (w->depth && w->depth <= SCAN_DEPTH)
			w->role[w->depth - 1] = w->key_len == 4 && memcmp(w->key, "user", 4) == 0 ? WR_USER : WR_OTHER;
	} else if (w->str_kind == WK_PROMPT) {
		/* a separator: ["ab"] and ["a", "b"] are different prompts */
		chain_feed(w, "\x1e", 1);
	} else if (w->str_kind == WK_SESSION && w->session) {
		uint8_t d[32];
		unsigned int n = 0;
		EVP_DigestFinal_ex(w->session, d, &n);
		w->session_hash = digest64(d);
		w->has_session = true;
	}
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool num_char(char c)
{
	return is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/*
 * The value of a JSON number's text when it is a whole number from 0 to
 * WL_MAX_TOKENS_MAX (256.0, 1e3 and 2500e-1 are), else -1: a fraction, a
 * negative, a larger value, or text that is not a JSON number. Exact: read
 * as decimal digits and a power of ten, never through a double.
 */
static int64_t num_value(const char *p, size_t n)
{
	const char *end = p + n;
	char dig[NUM_MAX];
	size_t nd = 0;
	int64_t e10 = 0, v = 0;

	bool neg = p < end && *p == '-'; /* only -0 can be in range: checked below */

	if (neg)
		p++;
	if (p == end || !is_digit(*p) || (*p == '0' && p + 1 < end && is_digit(p[1])))
		return -1;
	for (; p < end && is_digit(*p); p++)
		dig[nd++] = *p;
	if (p < end && *p == '.') {
		if (++p == end || !is_digit(*p))
			return -1;
		for (; p < end && is_digit(*p); p++, e10--)
			dig[nd++] = *p;
	}
	if (p < end && (*p == 'e' || *p == 'E')) {
		bool eneg = false;
		int64_t x = 0;
		if (++p < end && (*p == '+' || *p == '-'))
			eneg = *p++ == '-';
		if (p == end || !is_digit(*p))
			return -1;
		for (; p < end && is_digit(*p); p++)
			if (x < 1000000) /* past any exponent that can matter */
				x = x * 10 + (*p - '0');
		e10 += eneg ? -x : x;
	}
	if (p != end)
		return -1;
	/* the digits without leading and trailing zeros */
	size_t lo = 0;
	while (lo < nd && dig[lo] == '0')
		lo++;
	while (nd > lo && dig[nd - 1] == '0') {
		nd--;
		e10++;
	}
	if (lo == nd)
		return 0; /* zero, -0 included, whatever the exponent */
	if (neg || e10 < 0 || (int64_t)(nd - lo) + e10 > 16)
		return -1; /* a fraction, a negative, or 10^16 or more */
	for (size_t i = lo; i < nd; i++)
		v = v * 10 + (dig[i] - '0');
	for (int64_t i = 0; i < e10; i++)
		v *= 10;
	return v <= WL_MAX_TOKENS_MAX ? v : -1;
}

/* A max_tokens number ends: the last one read counts. */
static void num_end(struct wl_req *w)
{
	w->in_num = false;
	w->max_tokens = w->num_len <= NUM_MAX ? num_value(w->num, w->num_len) : -1;
}

/* The chain's hash over every prompt byte so far: the open block's from a
 * copy of its digest, so the chain goes on. False when the chain stopped
 * (WL_HASHES_MAX) or is empty. */
static bool chain_now(struct wl_req *w, uint64_t *out)
{
	if (w->nhashes >= WL_HASHES_MAX || !w->prompt_bytes)
		return false;
	if (!w->block_open || !w->fill) {
		if (!w->nhashes)
			return false;
		*out = w->hashes[w->nhashes - 1];
		return true;
	}
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	uint8_t d[32];
	unsigned int dn = 0;
	bool ok = c && EVP_MD_CTX_copy_ex(c, w->block) == 1 && EVP_DigestFinal_ex(c, d, &dn) == 1;
	EVP_MD_CTX_free(c);
	if (ok)
		*out = digest64(d);
	return ok;
}

/* The first object with "role": "user" closes: the chain through it (every
 * prompt byte before it and its own text) is the conversation's key, the
 * same in each of its later turns, which resend it unchanged. One with no
 * prompt text of its own (an image alone) leaves it to the next. */
static void turn_end(struct wl_req *w)
{
	if (w->prompt_bytes == w->opened[w->depth - 1])
		return;
	w->turn_done = true;
	w->has_turn = chain_now(w, &w->turn_hash);
	w->turn_bytes = w->prompt_bytes;
}

void wl_req_feed(struct wl_req *w, const char *at, size_t len)
{
	size_t i = 0;

	while (i < len) {
		if (w->in_str) {
			i += scan_string(w, at + i, len - i);
			if (i < len) { /* the closing quote */
				string_end(w);
				i++;
			}
			continue;
		}
		char c = at[i++];
		if (w->in_num) {
			if (num_char(c)) {
				if (w->num_len < NUM_MAX)
					w->num[w->num_len] = c;
				if (w->num_len <= NUM_MAX)
					w->num_len++;
				continue;
			}
			num_end(w);
		}
		switch (c) {
		case '"': string_begin(w); break;
		case '{':
		case '[':
			if (value_kind(w) == WK_MAXTOK && top_is_obj(w))
				w->max_tokens = -1; /* a container is no count */
			push(w, c == '{');
			break;
		case '}':
		case ']':
			if (c == '}' && !w->turn_done && top_is_obj(w) && w->role[w->depth - 1] == WR_USER)
				turn_end(w);
			if (w->depth)
				w->depth--;
			w->want_key = false;
			break;
		case ',': w->want_key = top_is_obj(w); break;
		case ':': w->want_key = false; break;
		default:
			if (value_kind(w) == WK_MAXTOK && top_is_obj(w) && c != ' ' && c != '\t' && c != '\n' &&
			    c != '\r') {
				/* a number starts; any other value (true, null) is no count */
				w->in_num = num_char(c);
				w->num[0] = c;
				w->num_len = 1;
				w->max_tokens = -1;
			}
			break;
		}
	}
}

size_t wl_req_hashes(struct wl_req *w, const uint64_t **out)
{
	size_t n = w->nhashes;

	if (w->block_open && w->fill && !w->hashes) {
		w->hashes = malloc(17 * sizeof(*w->hashes));
		if (w->hashes)
			w->cap = 16;
	}
	/* the open block's digest from a copy, so the chain could go on; the
	 * array always has one slot past cap for it */
	if (w->block_open && w->fill && w->hashes) {
		EVP_MD_CTX *c = EVP_MD_CTX_new();
		uint8_t d[32];
		unsigned int dn = 0;
		if (c && EVP_MD_CTX_copy_ex(c, w->block) == 1 && EVP_DigestFinal_ex(c, d, &dn) == 1)
			w->hashes[n++] = digest64(d);
		EVP_MD_CTX_free(c);
	}
	*out = w->hashes;
	return n;
}

int64_t wl_req_max_tokens(const struct wl_req *w)
{
	return w->max_tokens;
}

uint64_t wl_req_prompt_bytes(const struct wl_req *w)
{
	return w->prompt_bytes;
}

bool wl_req_first_turn(const struct wl_req *w, uint64_t *hash, uint64_t *bytes)
{
	if (!w->has_turn)
		return false;
	*hash = w->turn_hash;
	*bytes = w->turn_bytes;
	return true;
}

bool wl_req_first_turn_seen(const struct wl_req *w)
{
	return w->turn_done;
}

/* ---- hash → id ---- */

/* Open addressing, doubled at half full, up to `max` entries (a bound on
 * memory: 2 slots of 17 bytes an entry, the slots a power of two). Past
 * it, a new hash still gets a new id, so no two blocks share one, but is
 * not remembered: counted in `forgotten`. */
struct wl_ids {
	uint64_t *key, *val;
	size_t cap, n, max;
	uint64_t next;
	uint64_t forgotten; /* ids given to hashes not remembered */
	bool *used;
};

struct wl_ids *wl_ids_new(size_t max)
{
	struct wl_ids *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->max = max ? max : WL_HASH_IDS_DEFAULT;
	t->cap = 1024;
	t->key = calloc(t->cap, sizeof(*t->key));
	t->val = calloc(t->cap, sizeof(*t->val));
	t->used = calloc(t->cap, sizeof(*t->used));
	if (!t->key || !t->val || !t->used) {
		wl_ids_free(t);
		return NULL;
	}
	return t;
}

void wl_ids_free(struct wl_ids *t)
{
	if (!t)
		return;
	free(t->key);
	free(t->val);
	free(t->used);
	free(t);
}

static size_t ids_slot(const struct wl_ids *t, uint64_t h)
{
	size_t i = (size_t)(h * 0x9e3779b97f4a7c15ull) & (t->cap - 1);
	while (t->used[i] && t->key[i] != h)
		i = (i + 1) & (t->cap - 1);
	return i;
}

static void ids_grow(struct wl_ids *t)
{
	struct wl_ids n = { 0 };

	n.cap = t->cap * 2;
	n.key = calloc(n.cap, sizeof(*n.key));
	n.val = calloc(n.cap, sizeof(*n.val));
	n.used = calloc(n.cap, sizeof(*n.used));
	if (!n.key || !n.val || !n.used) {
		free(n.key);
		free(n.val);
		free(n.used);
		return;
	}
	for (size_t i = 0; i < t->cap; i++)
		if (t->used[i]) {
			size_t j = ids_slot(&n, t->key[i]);
			n.used[j] = true;
			n.key[j] = t->key[i];
			n.val[j] = t->val[i];
		}
	free(t->key);
	free(t->val);
	free(t->used);
	t->key = n.key;
	t->val = n.val;
	t->used = n.used;
	t->cap = n.cap;
}

uint64_t wl_ids_get(struct wl_ids *t, uint64_t hash)
{
	size_t i = ids_slot(t, hash);

	if (t->used[i])
		return t->val[i];
	if (t->n >= t->max) {
		t->forgotten++;
		return t->next++;
	}
	uint64_t id = t->next++;
	t->used[i] = true;
	t->key[i] = hash;
	t->val[i] = id;
	t->n++;
	if (t->n * 2 > t->cap && t->n < t->max)
		ids_grow(t);
	return id;
}

size_t wl_ids_count(const struct wl_ids *t)
{
	return t->n;
}

uint64_t wl_ids_forgotten(const struct wl_ids *t)
{
	return t->forgotten;
}

/* ---- the capture ---- */

/* One finished request, as queued: copied, so the request may go. */
struct wl_item {
	uint64_t arrive_ns;
	int64_t input_tokens, output_tokens, cached_tokens, max_tokens;
	uint64_t prompt_bytes;
	double ttft_ms, e2e_ms;
	int status;
	enum req_error error;
	enum api_kind api;
	int stream;
	bool has_session;
	uint64_t session;
	char route[64], upstream[64], model[128];
	char tenant[TENANT_MAX + 1];
	size_t nh, nclosed; /* hashes, and of them whole blocks (the first nclosed) */
	uint64_t hashes[];  /* nh */
};

struct workload {
	struct workload_options o;
	char *path;
	uint8_t salt[16];
	uint64_t start_ns; /* the capture's start: timestamps count from it */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct wl_item *q[WL_QUEUE_MAX];
	size_t qhead, qlen;
	bool stop;
	_Atomic uint64_t dropped_queue; /* records the queue had no room for */
	/* the writer's own */
	int fd;
	uint64_t size;		/* of the file being written */
	uint64_t dropped_write; /* records a failed open or write lost */
	uint64_t reported;	/* drops already said */
	uint64_t warn_at_ns;	/* the next warning not before */
	uint64_t open_retry_ns; /* an open that failed is not retried before */
	uint64_t free_retry_ns; /* no rotated file to delete: not looked for before */
	struct wl_ids *ids;
	/* conversations (the writer's own): each record's last whole block,
	 * direct-mapped on its hash, so that a later prompt that extends it is
	 * found to be its next turn; a slot taken by another record forgets */
	struct wl_turn {
		bool used;
		bool has_session;
		uint32_t turn;
		uint64_t block, session, record, conversation, prompt_bytes;
	} * turns;
	uint64_t records; /* records formed since the start: the next one's number */
	/* the summary behind GET /workload: written by the writer, read by
	 * the admin thread, both under sum_mu */
	pthread_mutex_t sum_mu;
	struct wl_summary {
		struct wl_ring {
			uint64_t ts_us, end_us; /* arrival and end, µs since the capture's start */
			uint32_t in, out;
			uint16_t group;
		} ring[WL_SUMMARY_WINDOW];
		size_t ring_head, ring_n;
		struct wl_group {
			char route[64], model[128];
			uint64_t records, streamed, cached_records, cached_tokens, cached_input;
			uint64_t blocks, shared_blocks;
			uint64_t seen_ns; /* the latest arrival counted in it */
			uint32_t series[WL_SERIES_SLOTS];
		} groups[WL_GROUPS_MAX];
		size_t ngroups;
		size_t other;	   /* the "(other)" group's index; WL_GROUPS_MAX: none yet */
		unsigned step_idx; /* into series_steps */
		uint64_t written, no_space, write_error, open_error, too_large;
		uint64_t freed_files;		  /* rotated files deleted to make room on a full disk */
		uint64_t ids_kept, ids_forgotten; /* the hash → id table's, as of the last record */
		char last_error[96];		  /* "" while writing works */
	} sum;
};

/* The arrival series' steps, in seconds, each a multiple of the one before
 * (a slot of the old step falls in one slot of the new): 240 slots of the
 * last cover 240 days. */
static const uint32_t series_steps[] = { 1, 2, 10, 20, 60, 120, 600, 1200, 3600, 7200, 21600, 43200, 86400 };
#define SERIES_STEPS (sizeof(series_steps) / sizeof(series_steps[0]))

static struct workload *g_wl;

bool workload_active(void)
{
	return g_wl != NULL;
}

void workload_feed(struct wl_req **slot, const char *at, size_t len)
{
	struct workload *wl = g_wl;

	if (!wl)
		return;
	if (!*slot)
		*slot = wl_req_new(wl->salt, (size_t)wl->o.block_tokens * WL_BYTES_PER_TOKEN);
	if (*slot)
		wl_req_feed(*slot, at, len);
}

void workload_record(const struct req_record *rec, struct wl_req *w, const char *route, const char *upstream)
{
	struct workload *wl = g_wl;
	const uint64_t *h = NULL;
	size_t nh;
	double m[RM__COUNT];
	struct wl_item *it;

	if (!wl)
		return;
	nh = w ? wl_req_hashes(w, &h) : 0;
	it = malloc(sizeof(*it) + nh * sizeof(uint64_t));
	if (!it) {
		atomic_fetch_add(&wl->dropped_queue, 1);
		return;
	}
	record_derive(rec, m);
	it->arrive_ns = rec->at[TL_ARRIVE];
	it->input_tokens = rec->usage.input_tokens;
	it->output_tokens = record_output_tokens(rec);
	it->cached_tokens = rec->usage.cached_tokens;
	it->max_tokens = w ? w->max_tokens : -1;
	it->prompt_bytes = w ? w->prompt_bytes : 0;
	it->ttft_ms = m[RM_TTFT];
	it->e2e_ms = m[RM_E2E];
	it->status = rec->status;
	it->error = rec->error;
	it->api = rec->api;
	it->stream = rec->stream;
	it->has_session = w && w->has_session;
	it->session = w ? w->session_hash : 0;
	it->nclosed = w ? w->nhashes : 0;
	copy_trunc(it->route, sizeof(it->route), route ? route : "", route ? strlen(route) : 0);
	copy_trunc(it->upstream, sizeof(it->upstream), upstream ? upstream : "", upstream ? strlen(upstream) : 0);
	copy_trunc(it->model, sizeof(it->model), rec->model, strlen(rec->model));
	memcpy(it->tenant, rec->tenant, sizeof(it->tenant));
	it->nh = nh;
	if (nh)
		memcpy(it->hashes, h, nh * sizeof(uint64_t));
	pthread_mutex_lock(&wl->mu);
	if (wl->qlen == WL_QUEUE_MAX) {
		pthread_mutex_unlock(&wl->mu);
		atomic_fetch_add(&wl->dropped_queue, 1);
		free(it);
		return;
	}
	wl->q[(wl->qhead + wl->qlen) % WL_QUEUE_MAX] = it;
	wl->qlen++;
	pthread_cond_signal(&wl->cv);
	pthread_mutex_unlock(&wl->mu);
}

static json_t *ms_or_null(double ms)
{
	return isnan(ms) ? json_null() : json_real(round(ms * 1000.0) / 1000.0);
}

static json_t *str_or_null(const char *s)
{
	return *s ? json_string(s) : json_null();
}

/* The "(other)" group, made the first time it is needed: the groups keep
 * a place for it. */
static struct wl_group *group_other(struct wl_summary *s)
{
	if (s->other == WL_GROUPS_MAX) {
		s->other = s->ngroups++;
		struct wl_group *g = &s->groups[s->other];
		memset(g, 0, sizeof(*g));
		copy_trunc(g->route, sizeof(g->route), "(other)", 7);
		copy_trunc(g->model, sizeof(g->model), "(other)", 7);
	}
	return &s->groups[s->other];
}

/* Group `g` gives its place to another pair: what it counted moves to
 * "(other)" (its records in the window too), so the totals stay whole. */
static void group_fold(struct wl_summary *s, struct wl_group *g)
{
	struct wl_group *o = group_other(s);
	uint16_t from = (uint16_t)(g - s->groups), to = (uint16_t)s->other;

	o->records += g->records;
	o->streamed += g->streamed;
	o->cached_records += g->cached_records;
	o->cached_tokens += g->cached_tokens;
	o->cached_input += g->cached_input;
	o->blocks += g->blocks;
	o->shared_blocks += g->shared_blocks;
	if (g->seen_ns > o->seen_ns)
		o->seen_ns = g->seen_ns;
	for (size_t i = 0; i < WL_SERIES_SLOTS; i++)
		o->series[i] += g->series[i];
	for (size_t i = 0; i < s->ring_n; i++)
		if (s->ring[i].group == from)
			s->ring[i].group = to;
	memset(g, 0, sizeof(*g));
}

/*
 * The group of a (route, model) pair, admitted as the stats admit a model
 * name: a pair already grouped is found whatever the answer; a new one
 * takes a group only when `ok` (the upstream answered 2xx), so names an
 * upstream refuses never crowd out real ones: a free group, else, when all
 * WL_GROUPS_MAX - 1 are taken, the one whose latest arrival is the oldest,
 * once it is `idle_ns` old (0: never), its counts folded into "(other)".
 * Anything else counts under "(other)". `now_ns`: the record's arrival.
 * Under sum_mu.
 */
static struct wl_group *group_of(struct wl_summary *s, const char *route, const char *model, bool ok, uint64_t now_ns,
				 uint64_t idle_ns)
{
	struct wl_group *g = NULL, *lru = NULL;

	for (size_t i = 0; i < s->ngroups && !g; i++)
		if (i != s->other && strcmp(s->groups[i].route, route) == 0 && strcmp(s->groups[i].model, model) == 0)
			g = &s->groups[i];
	if (!g && ok) {
		if (s->ngroups - (s->other != WL_GROUPS_MAX) < WL_GROUPS_MAX - 1) {
			g = &s->groups[s->ngroups++];
			memset(g, 0, sizeof(*g));
		} else if (idle_ns) {
			for (size_t i = 0; i < s->ngroups; i++)
				if (i != s->other && now_ns >= s->groups[i].seen_ns + idle_ns &&
				    (!lru || s->groups[i].seen_ns < lru->seen_ns))
					lru = &s->groups[i];
			if (lru) {
				group_fold(s, lru);
				g = lru;
			}
		}
		if (g) {
			copy_trunc(g->route, sizeof(g->route), route, strlen(route));
			copy_trunc(g->model, sizeof(g->model), model, strlen(model));
		}
	}
	if (!g)
		g = group_other(s);
	if (now_ns > g->seen_ns)
		g->seen_ns = now_ns;
	return g;
}

/* One arrival into its group's series: the step grows (every group's
 * slots merged) until the arrival's slot fits. */
static void series_add(struct wl_summary *s, struct wl_group *g, uint64_t ts_ms)
{
	uint64_t sec = ts_ms / 1000;

	while (sec / series_steps[s->step_idx] >= WL_SERIES_SLOTS && s->step_idx + 1 < SERIES_STEPS) {
		uint32_t from = series_steps[s->step_idx], to = series_steps[s->step_idx + 1];
		for (size_t k = 0; k < s->ngroups; k++) {
			uint32_t *v = s->groups[k].series;
			for (size_t i = 0; i < WL_SERIES_SLOTS; i++) {
				uint32_t c = v[i];
				v[i] = 0;
				v[i * from / to] += c;
			}
		}
		s->step_idx++;
	}
	uint64_t slot = sec / series_steps[s->step_idx];
	g->series[slot < WL_SERIES_SLOTS ? slot : WL_SERIES_SLOTS - 1]++;
}

/* A record into the summary: its group's counts and the window's ring. */
static void summary_add(struct workload *wl, const struct wl_item *it, uint64_t ts_ms, int64_t in, uint64_t shared)
{
	struct wl_summary *s = &wl->sum;
	uint64_t ts_us = it->arrive_ns > wl->start_ns ? (it->arrive_ns - wl->start_ns) / 1000u : 0;
	/* an unknown e2e (no response end) counts the request in flight only
	 * at its own arrival */
	uint64_t dur_us = isnan(it->e2e_ms) || it->e2e_ms < 0 ? 0 : (uint64_t)(it->e2e_ms * 1000.0);

	pthread_mutex_lock(&wl->sum_mu);
	s->ids_kept = wl_ids_count(wl->ids);
	s->ids_forgotten = wl_ids_forgotten(wl->ids);
	struct wl_group *g = group_of(s, it->route, it->model, it->status >= 200 && it->status < 300, it->arrive_ns,
				      wl->o.group_idle_ms * 1000000u);
	g->records++;
	g->streamed += it->stream == 1;
	if (it->cached_tokens >= 0 && in > 0) {
		g->cached_records++;
		g->cached_tokens += (uint64_t)it->cached_tokens;
		g->cached_input += (uint64_t)in;
	}
	g->blocks += it->nh;
	g->shared_blocks += shared;
	series_add(s, g, ts_ms);
	s->ring[(s->ring_head + s->ring_n) % WL_SUMMARY_WINDOW] =
		(struct wl_ring){ ts_us, ts_us + (dur_us ? dur_us : 1), (uint32_t)(in > UINT32_MAX ? UINT32_MAX : in),
				  (uint32_t)(it->output_tokens < 0	      ? 0
					     : it->output_tokens > UINT32_MAX ? UINT32_MAX
									      : it->output_tokens),
				  (uint16_t)(g - s->groups) };
	if (s->ring_n < WL_SUMMARY_WINDOW)
		s->ring_n++;
	else
		s->ring_head = (s->ring_head + 1) % WL_SUMMARY_WINDOW;
	pthread_mutex_unlock(&wl->sum_mu);
}

/* Where a record stands in its conversation. A chat client resends the
 * whole history each turn, so the previous turn is the latest earlier
 * record whose whole blocks all lead this prompt, with a shorter prompt (a
 * retry of the same prompt is not a turn) and, when both name a session,
 * the same one. Searched from this prompt's last whole block down, so the
 * longest history wins. */
struct wl_link {
	uint64_t record, conversation, previous;
	uint32_t turn;
	bool has_previous;
};

static struct wl_link conversation_link(struct workload *wl, const struct wl_item *it)
{
	struct wl_link l = { .record = wl->records++ };

	l.conversation = l.record;
	for (size_t i = it->nclosed; i-- > 0;) {
		const struct wl_turn *t = &wl->turns[it->hashes[i] & (WL_TURN_SLOTS - 1)];

		if (!t->used || t->block != it->hashes[i] || t->prompt_bytes >= it->prompt_bytes ||
		    (t->has_session && it->has_session && t->session != it->session))
			continue;
		l.has_previous = true;
		l.previous = t->record;
		l.conversation = t->conversation;
		l.turn = t->turn + 1;
		break;
	}
	if (it->nclosed) {
		uint64_t last = it->hashes[it->nclosed - 1];

		wl->turns[last & (WL_TURN_SLOTS - 1)] = (struct wl_turn){
			.used = true,
			.has_session = it->has_session,
			.turn = l.turn,
			.block = last,
			.session = it->session,
			.record = l.record,
			.conversation = l.conversation,
			.prompt_bytes = it->prompt_bytes,
		};
	}
	return l;
}

/* The line of one record; the hash ids are numbered here, in file order. */
static char *item_line(struct workload *wl, const struct wl_item *it)
{
	json_t *o = json_object(), *ids = json_array();
	uint64_t ts = it->arrive_ns > wl->start_ns ? (it->arrive_ns - wl->start_ns) / 1000000u : 0;
	bool estimated = it->input_tokens < 0;
	int64_t in = estimated ? (int64_t)((it->prompt_bytes + WL_BYTES_PER_TOKEN - 1) / WL_BYTES_PER_TOKEN)
			       : it->input_tokens;
	char sess[17];
	char *line;

	uint64_t shared = 0;
	for (size_t i = 0; i < it->nh; i++) {
		uint64_t before = wl->ids->next, id = wl_ids_get(wl->ids, it->hashes[i]);
		shared += id < before;
		json_array_append_new(ids, json_integer((json_int_t)id));
	}
	summary_add(wl, it, ts, in, shared);
	json_object_set_new(o, "timestamp", json_integer((json_int_t)ts));
	json_object_set_new(o, "input_length", json_integer(in));
	json_object_set_new(o, "output_length", json_integer(it->output_tokens < 0 ? 0 : it->output_tokens));
	json_object_set_new(o, "hash_ids", ids);
	if (estimated)
		json_object_set_new(o, "input_length_estimated", json_true());
	json_object_set_new(o, "route", str_or_null(it->route));
	json_object_set_new(o, "upstream", str_or_null(it->upstream));
	json_object_set_new(o, "model", str_or_null(it->model));
	json_object_set_new(o, "tenant", str_or_null(it->tenant));
	json_object_set_new(o, "api", json_string(classify_api_name(it->api)));
	json_object_set_new(o, "stream", it->stream < 0 ? json_null() : json_boolean(it->stream));
	json_object_set_new(o, "cached_tokens", it->cached_tokens < 0 ? json_null() : json_integer(it->cached_tokens));
	json_object_set_new(o, "max_tokens", it->max_tokens < 0 ? json_null() : json_integer(it->max_tokens));
	snprintf(sess, sizeof(sess), "%016llx", (unsigned long long)it->session);
	json_object_set_new(o, "session", it->has_session ? json_string(sess) : json_null());
	{
		struct wl_link l = conversation_link(wl, it);

		json_object_set_new(o, "record", json_integer((json_int_t)l.record));
		json_object_set_new(o, "conversation", json_integer((json_int_t)l.conversation));
		json_object_set_new(o, "turn", json_integer(l.turn));
		json_object_set_new(o, "previous", l.has_previous ? json_integer((json_int_t)l.previous) : json_null());
	}
	json_object_set_new(o, "ttft_ms", ms_or_null(it->ttft_ms));
	json_object_set_new(o, "e2e_ms", ms_or_null(it->e2e_ms));
	json_object_set_new(o, "status", json_integer(it->status));
	json_object_set_new(o, "outcome", json_string(it->error == REQ_ERR_NONE ? "ok" : req_error_name(it->error)));
	line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
	json_decref(o);
	return line;
}

/* The file is full: PATH.1 … PATH.(max_files-1) move up by one, the oldest
 * goes, PATH becomes PATH.1. */
static void rotate(struct workload *wl)
{
	size_t n = strlen(wl->path) + 16;
	char *from = malloc(n), *to = malloc(n);

	if (wl->fd != -1)
		close(wl->fd);
	wl->fd = -1;
	if (from && to) {
		if (wl->o.max_files <= 1) {
			unlink(wl->path);
		} else {
			snprintf(to, n, "%s.%u", wl->path, wl->o.max_files - 1);
			unlink(to);
			for (unsigned k = wl->o.max_files - 1; k > 1; k--) {
				snprintf(from, n, "%s.%u", wl->path, k - 1);
				snprintf(to, n, "%s.%u", wl->path, k);
				rename(from, to);
			}
			snprintf(to, n, "%s.1", wl->path);
			rename(wl->path, to);
		}
	}
	free(from);
	free(to);
}

static void warn_drops(struct workload *wl, uint64_t now, const char *why)
{
	uint64_t total = atomic_load(&wl->dropped_queue) + wl->dropped_write;

	if (total == wl->reported || now < wl->warn_at_ns)
		return;
	log_warn("workload capture: %llu records dropped so far (%s); forwarding is not affected",
		 (unsigned long long)total, why);
	wl->reported = total;
	wl->warn_at_ns = now + 10ull * 1000000000u; /* at most one line per 10 s */
}

/* A record lost at the writer: counted by reason (`counter`, in sum), said
 * (rate-limited), and the error kept for GET /workload. */
static void write_failed(struct workload *wl, uint64_t now, uint64_t *counter, const char *why)
{
	wl->dropped_write++;
	pthread_mutex_lock(&wl->sum_mu);
	(*counter)++;
	copy_trunc(wl->sum.last_error, sizeof(wl->sum.last_error), why, strlen(why));
	pthread_mutex_unlock(&wl->sum_mu);
	warn_drops(wl, now, why);
}

/* A line written; after failures, said once: the capture resumed. */
static void write_ok(struct workload *wl)
{
	bool resumed;

	pthread_mutex_lock(&wl->sum_mu);
	wl->sum.written++;
	resumed = wl->sum.last_error[0] != 0;
	wl->sum.last_error[0] = 0;
	pthread_mutex_unlock(&wl->sum_mu);
	if (resumed)
		log_info("workload capture: writing %s again (%llu records dropped so far)", wl->path,
			 (unsigned long long)(atomic_load(&wl->dropped_queue) + wl->dropped_write));
}

/* One line appended whole: 0, or the errno of the write that failed. A
 * full disk may take part of a line: that part is cut off again, so the
 * file stays whole lines (O_APPEND: the next write lands at the cut). */
static int write_line(struct workload *wl, const char *line, size_t len)
{
	size_t done = 0;
	ssize_t n = 0;

	while (done < len && (n = write(wl->fd, line + done, len - done)) > 0)
		done += (size_t)n;
	if (done == len)
		return 0;
	int e = n == 0 ? EIO : errno;
	if (done && ftruncate(wl->fd, (off_t)wl->size) == -1)
		log_warn("workload capture: %s: cannot cut a partial line: %s", wl->path, strerror(errno));
	return e;
}

/* The oldest rotated file (PATH.k, the highest k there is) deleted to make
 * room: true when one was. Without any, not looked for again for a second
 * (up to max_files - 1 unlink calls a look). */
static bool free_oldest(struct workload *wl, uint64_t now)
{
	size_t n = strlen(wl->path) + 16;
	char *p;

	if (wl->o.max_files <= 1 || now < wl->free_retry_ns || !(p = malloc(n)))
		return false;
	for (unsigned k = wl->o.max_files - 1; k >= 1; k--) {
		snprintf(p, n, "%s.%u", wl->path, k);
		if (unlink(p) == 0) {
			log_warn("workload capture: the disk is full: deleted %s, the oldest file, to go on", p);
			free(p);
			pthread_mutex_lock(&wl->sum_mu);
			wl->sum.freed_files++;
			pthread_mutex_unlock(&wl->sum_mu);
			return true;
		}
	}
	free(p);
	wl->free_retry_ns = now + 1000000000u;
	return false;
}

/* The file opened for appending, if it is not and may be tried now; its
 * size is what it holds. */
static void open_file(struct workload *wl, uint64_t now)
{
	if (wl->fd != -1 || now < wl->open_retry_ns)
		return;
	wl->fd = open(wl->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (wl->fd == -1) {
		log_warn("workload capture: %s: %s; records are dropped until it opens", wl->path, strerror(errno));
		wl->open_retry_ns = now + 1000000000u;
	} else {
		off_t end = lseek(wl->fd, 0, SEEK_END);
		wl->size = end > 0 ? (uint64_t)end : 0;
	}
}

static void write_item(struct workload *wl, const struct wl_item *it)
{
	uint64_t now = clock_now_ns();
	char *line = item_line(wl, it);
	size_t len;

	if (!line) {
		write_failed(wl, now, &wl->sum.write_error, "out of memory");
		return;
	}
	len = strlen(line);
	line[len++] = '\n'; /* json_dumps leaves room: the NUL becomes the newline */
	/* no file grows past max_size: a line that would not fit even in an
	 * empty file is dropped, counted; one that does not fit in this file
	 * goes to a new one (the file found at start counts with what it holds) */
	if (len > wl->o.max_size) {
		write_failed(wl, now, &wl->sum.too_large, "a record longer than workload.max_size");
		free(line);
		return;
	}
	open_file(wl, now);
	if (wl->fd != -1 && wl->size && wl->size + len > wl->o.max_size) {
		rotate(wl);
		open_file(wl, now);
	}
	if (wl->fd == -1) {
		write_failed(wl, now, &wl->sum.open_error, "the file cannot be opened");
	} else {
		int e = write_line(wl, line, len);
		/* a full disk: the capture's own oldest file goes first, as
		 * rotation would have let it go, and the line is tried again */
		if ((e == ENOSPC || e == EDQUOT) && free_oldest(wl, now))
			e = write_line(wl, line, len);
		if (!e) {
			wl->size += len;
			write_ok(wl);
		} else {
			write_failed(wl, now, e == ENOSPC || e == EDQUOT ? &wl->sum.no_space : &wl->sum.write_error,
				     strerror(e));
		}
	}
	free(line);
}

static void *writer_main(void *arg)
{
	struct workload *wl = arg;

	pthread_mutex_lock(&wl->mu);
	for (;;) {
		while (!wl->qlen && !wl->stop)
			pthread_cond_wait(&wl->cv, &wl->mu);
		if (!wl->qlen && wl->stop)
			break;
		struct wl_item *it = wl->q[wl->qhead];
		wl->qhead = (wl->qhead + 1) % WL_QUEUE_MAX;
		wl->qlen--;
		pthread_mutex_unlock(&wl->mu);
		write_item(wl, it);
		warn_drops(wl, clock_now_ns(), "the queue was full");
		free(it);
		pthread_mutex_lock(&wl->mu);
	}
	pthread_mutex_unlock(&wl->mu);
	return NULL;
}

int workload_open(const struct workload_options *o, char *err, size_t errlen)
{
	struct workload *wl;

	if (g_wl || !o->path)
		return 0;
	wl = calloc(1, sizeof(*wl));
	if (!wl)
		goto fail;
	wl->o = *o;
	if (!wl->o.block_tokens)
		wl->o.block_tokens = 512;
	if (!wl->o.max_files)
		wl->o.max_files = 1;
	wl->path = strdup(o->path);
	wl->ids = wl_ids_new(wl->o.max_hash_ids);
	wl->turns = calloc(WL_TURN_SLOTS, sizeof(*wl->turns));
	wl->fd = -1;
	if (!wl->path || !wl->ids || !wl->turns)
		goto fail;
	if (getrandom(wl->salt, sizeof(wl->salt), 0) != (ssize_t)sizeof(wl->salt))
		goto fail;
	wl->start_ns = clock_now_ns();
	wl->sum.other = WL_GROUPS_MAX;
	pthread_mutex_init(&wl->mu, NULL);
	pthread_mutex_init(&wl->sum_mu, NULL);
	pthread_cond_init(&wl->cv, NULL);
	if (pthread_create(&wl->thread, NULL, writer_main, wl) != 0) {
		pthread_mutex_destroy(&wl->mu);
		pthread_mutex_destroy(&wl->sum_mu);
		pthread_cond_destroy(&wl->cv);
		goto fail;
	}
	g_wl = wl;
	log_info("workload capture to %s (blocks of %u tokens ~ %u bytes)", wl->path, wl->o.block_tokens,
		 wl->o.block_tokens * WL_BYTES_PER_TOKEN);
	return 0;
fail:
	snprintf(err, errlen, "workload capture: cannot start: %s", strerror(errno ? errno : ENOMEM));
	if (wl) {
		wl_ids_free(wl->ids);
		free(wl->turns);
		free(wl->path);
		free(wl);
	}
	return -1;
}

void workload_close(void)
{
	struct workload *wl = g_wl;

	if (!wl)
		return;
	pthread_mutex_lock(&wl->mu);
	wl->stop = true;
	pthread_cond_signal(&wl->cv);
	pthread_mutex_unlock(&wl->mu);
	pthread_join(wl->thread, NULL);
	g_wl = NULL;
	wl->warn_at_ns = 0;
	warn_drops(wl, clock_now_ns(), "at exit");
	if (wl->fd != -1)
		close(wl->fd);
	pthread_mutex_destroy(&wl->mu);
	pthread_mutex_destroy(&wl->sum_mu);
	pthread_cond_destroy(&wl->cv);
	wl_ids_free(wl->ids);
	free(wl->turns);
	memset(wl->salt, 0, sizeof(wl->salt));
	free(wl->path);
	free(wl);
}

/* ---- the summary ---- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double round3(double v)
{
	return round(v * 1000.0) / 1000.0;
}

/* Powers of two as histogram bounds: the smallest 2^k >= v (1 for 0). */
static unsigned pow2_bucket(uint64_t v)
{
	unsigned b = 0;
	while (b < 63 && ((uint64_t)1 << b) < v)
		b++;
	return b;
}

/* Nearest-rank quantiles of a sorted array, its mean and max, and its
 * histogram: counts per power-of-two upper bound `le`, from the smallest
 * value's bucket to the largest's. */
static json_t *dist_json(const uint64_t *v, size_t n)
{
	json_t *o = json_object(), *h = json_array();
	static const struct {
		const char *key;
		double q;
	} qs[] = { { "p50", 0.5 }, { "p90", 0.9 }, { "p99", 0.99 } };
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += (double)v[i];
	json_object_set_new(o, "mean", n ? json_real(round3(sum / (double)n)) : json_null());
	for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++) {
		size_t rank = (size_t)ceil(qs[i].q * (double)n);
		json_object_set_new(o, qs[i].key, n ? json_integer((json_int_t)v[rank ? rank - 1 : 0]) : json_null());
	}
	json_object_set_new(o, "max", n ? json_integer((json_int_t)v[n - 1]) : json_null());
	if (n) {
		size_t i = 0;
		for (unsigned b = pow2_bucket(v[0]); b <= pow2_bucket(v[n - 1]); b++) {
			uint64_t le = (uint64_t)1 << b, c = 0;
			for (; i < n && v[i] <= le; i++)
				c++;
			json_t *e = json_object();
			json_object_set_new(e, "le", json_integer((json_int_t)le));
			json_object_set_new(e, "count", json_integer((json_int_t)c));
			json_array_append_new(h, e);
		}
	}
	json_object_set_new(o, "histogram", h);
	return o;
}

/* Scratch for one selection's window: arrays of WL_SUMMARY_WINDOW. */
struct sel_scratch {
	uint64_t *ts, *end, *in, *out, *conc;
};

static bool group_matches(const struct wl_group *g, const char *route, const char *model)
{
	return (!route || strcmp(g->route, route) == 0) && (!model || strcmp(g->model, model) == 0);
}

static json_t *share(uint64_t part, uint64_t whole)
{
	return whole ? json_real((double)part / (double)whole) : json_null();
}

/* The summary of the records of `route` and `model` (NULL: any), from a
 * snapshot; adds its fields to `o`. */
static void selection_json(json_t *o, const struct wl_summary *s, const char *route, const char *model,
			   struct sel_scratch *x)
{
	bool match[WL_GROUPS_MAX];
	uint64_t records = 0, streamed = 0, cached_records = 0, cached = 0, cached_input = 0, blocks = 0, shared = 0;
	uint64_t series[WL_SERIES_SLOTS] = { 0 };
	size_t n = 0, last = 0;

	for (size_t g = 0; g < s->ngroups; g++) {
		const struct wl_group *gr = &s->groups[g];
		match[g] = group_matches(gr, route, model);
		if (!match[g])
			continue;
		records += gr->records;
		streamed += gr->streamed;
		cached_records += gr->cached_records;
		cached += gr->cached_tokens;
		cached_input += gr->cached_input;
		blocks += gr->blocks;
		shared += gr->shared_blocks;
		for (size_t i = 0; i < WL_SERIES_SLOTS; i++) {
			series[i] += gr->series[i];
			if (gr->series[i] && i + 1 > last)
				last = i + 1;
		}
	}
	for (size_t i = 0; i < s->ring_n; i++) {
		const struct wl_ring *r = &s->ring[(s->ring_head + i) % WL_SUMMARY_WINDOW];
		if (r->group >= s->ngroups || !match[r->group])
			continue;
		x->ts[n] = r->ts_us;
		x->end[n] = r->end_us;
		x->in[n] = r->in;
		x->out[n] = r->out;
		n++;
	}
	json_object_set_new(o, "records", json_integer((json_int_t)records));
	json_object_set_new(o, "stream_share", share(streamed, records));
	json_object_set_new(o, "cached_token_share", share(cached, cached_input));
	json_object_set_new(o, "cached_reported_records", json_integer((json_int_t)cached_records));
	json_object_set_new(o, "prefix_blocks", json_integer((json_int_t)blocks));
	json_object_set_new(o, "prefix_shared_blocks", json_integer((json_int_t)shared));
	json_object_set_new(o, "prefix_sharing_ratio",
			    blocks ? json_real(round3((double)shared / (double)blocks)) : json_null());
	json_t *arr = json_object(), *counts = json_array();
	json_object_set_new(arr, "step_s", json_integer(series_steps[s->step_idx]));
	for (size_t i = 0; i < last; i++)
		json_array_append_new(counts, json_integer(series[i]));
	json_object_set_new(arr, "counts", counts);
	json_object_set_new(o, "arrivals", arr);

	/* the window: sorted by arrival (records are written as they finish) */
	json_object_set_new(o, "window_records", json_integer((json_int_t)n));
	qsort(x->ts, n, sizeof(*x->ts), cmp_u64);
	qsort(x->end, n, sizeof(*x->end), cmp_u64);
	qsort(x->in, n, sizeof(*x->in), cmp_u64);
	qsort(x->out, n, sizeof(*x->out), cmp_u64);
	double span_s = n > 1 ? (double)(x->ts[n - 1] - x->ts[0]) / 1e6 : 0;
	json_object_set_new(o, "span_s", json_real(round3(span_s)));
	json_object_set_new(o, "arrival_rate", span_s > 0 ? json_real(round3((double)(n - 1) / span_s)) : json_null());
	double mean = 0, m2 = 0;
	for (size_t i = 1; i < n; i++) { /* Welford over the gaps */
		double g = (double)(x->ts[i] - x->ts[i - 1]), d = g - mean;
		mean += d / (double)i;
		m2 += d * (g - mean);
	}
	json_object_set_new(o, "interarrival_cv",
			    n > 2 && mean > 0 ? json_real(round3(sqrt(m2 / (double)(n - 1)) / mean)) : json_null());
	json_object_set_new(o, "input_length", dist_json(x->in, n));
	json_object_set_new(o, "output_length", dist_json(x->out, n));
	/* concurrency at each arrival: the selection's requests with arrival
	 * <= t < end, itself included (arrivals tied at t all count) */
	size_t started = 0, ended = 0;
	for (size_t i = 0; i < n; i++) {
		while (started < n && x->ts[started] <= x->ts[i])
			started++;
		while (ended < n && x->end[ended] <= x->ts[i])
			ended++;
		x->conc[i] = started - ended;
	}
	qsort(x->conc, n, sizeof(*x->conc), cmp_u64);
	json_object_set_new(o, "concurrency", dist_json(x->conc, n));
}

/* by_route / by_model: one entry per distinct name among the groups the
 * filters select, each the summary of that name and the other filter. */
static json_t *breakdown(const struct wl_summary *s, bool by_route, const char *route, const char *model,
			 struct sel_scratch *x)
{
	json_t *a = json_array();

	for (size_t g = 0; g < s->ngroups; g++) {
		const struct wl_group *gr = &s->groups[g];
		const char *name = by_route ? gr->route : gr->model;
		bool seen = false;
		if (!group_matches(gr, route, model))
			continue;
		for (size_t k = 0; k < g && !seen; k++)
			seen = group_matches(&s->groups[k], route, model) &&
			       strcmp(by_route ? s->groups[k].route : s->groups[k].model, name) == 0;
		if (seen)
			continue;
		json_t *e = json_object();
		json_object_set_new(e, by_route ? "route" : "model", json_string(name));
		selection_json(e, s, by_route ? name : route, by_route ? model : name, x);
		json_array_append_new(a, e);
	}
	return a;
}

static json_t *str_or_json_null(const char *v)
{
	return v ? json_string(v) : json_null();
}

char *workload_summary_json(const char *route, const char *model)
{
	struct workload *wl = g_wl;
	json_t *o = json_object();
	struct wl_summary *s = NULL;
	struct sel_scratch x = { 0 };
	char *text;

	json_object_set_new(o, "capturing", json_boolean(wl != NULL));
	if (!wl)
		goto done;
	s = malloc(sizeof(*s));
	x.ts = malloc(WL_SUMMARY_WINDOW * sizeof(uint64_t));
	x.end = malloc(WL_SUMMARY_WINDOW * sizeof(uint64_t));
	x.in = malloc(WL_SUMMARY_WINDOW * sizeof(uint64_t));
	x.out = malloc(WL_SUMMARY_WINDOW * sizeof(uint64_t));
	x.conc = malloc(WL_SUMMARY_WINDOW * sizeof(uint64_t));
	if (!s || !x.ts || !x.end || !x.in || !x.out || !x.conc) {
		json_decref(o);
		o = NULL;
		goto done;
	}
	/* a copy, so the writer waits only for a memcpy */
	pthread_mutex_lock(&wl->sum_mu);
	memcpy(s, &wl->sum, sizeof(*s));
	pthread_mutex_unlock(&wl->sum_mu);
	uint64_t dropped = atomic_load(&wl->dropped_queue);

	json_object_set_new(o, "block_tokens", json_integer(wl->o.block_tokens));
	json_object_set_new(o, "written", json_integer((json_int_t)s->written));
	json_object_set_new(o, "dropped_queue_full", json_integer((json_int_t)dropped));
	json_t *d = json_object();
	json_object_set_new(d, "queue_full", json_integer((json_int_t)dropped));
	json_object_set_new(d, "no_space", json_integer((json_int_t)s->no_space));
	json_object_set_new(d, "write_error", json_integer((json_int_t)s->write_error));
	json_object_set_new(d, "open_error", json_integer((json_int_t)s->open_error));
	json_object_set_new(d, "too_large", json_integer((json_int_t)s->too_large));
	json_object_set_new(o, "dropped", d);
	json_object_set_new(o, "last_error", s->last_error[0] ? json_string(s->last_error) : json_null());
	json_object_set_new(o, "freed_files", json_integer((json_int_t)s->freed_files));
	json_object_set_new(o, "max_hash_ids",
			    json_integer((json_int_t)(wl->o.max_hash_ids ? wl->o.max_hash_ids : WL_HASH_IDS_DEFAULT)));
	json_object_set_new(o, "hash_ids_kept", json_integer((json_int_t)s->ids_kept));
	json_object_set_new(o, "hash_ids_forgotten", json_integer((json_int_t)s->ids_forgotten));
	json_t *f = json_object();
	json_object_set_new(f, "route", str_or_json_null(route));
	json_object_set_new(f, "model", str_or_json_null(model));
	json_object_set_new(o, "filter", f);
	selection_json(o, s, route, model, &x);
	json_object_set_new(o, "by_route", breakdown(s, true, route, model, &x));
	json_object_set_new(o, "by_model", breakdown(s, false, route, model, &x));
done:
	free(s);
	free(x.ts);
	free(x.end);
	free(x.in);
	free(x.out);
	free(x.conc);
	if (!o)
		return NULL;
	text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
	json_decref(o);
	return text;
}

const char *const workload_drop_reasons[WL_DROP__COUNT] = { "queue_full", "no_space", "write_error", "open_error",
							    "too_large" };

bool workload_counts(struct workload_counts *c)
{
	struct workload *wl = g_wl;

	if (!wl)
		return false;
	pthread_mutex_lock(&wl->sum_mu);
	c->written = wl->sum.written;
	c->dropped[WL_DROP_NO_SPACE] = wl->sum.no_space;
	c->dropped[WL_DROP_WRITE_ERROR] = wl->sum.write_error;
	c->dropped[WL_DROP_OPEN_ERROR] = wl->sum.open_error;
	c->dropped[WL_DROP_TOO_LARGE] = wl->sum.too_large;
	c->hash_ids_forgotten = wl->sum.ids_forgotten;
	pthread_mutex_unlock(&wl->sum_mu);
	c->dropped[WL_DROP_QUEUE_FULL] = atomic_load(&wl->dropped_queue);
	return true;
}
