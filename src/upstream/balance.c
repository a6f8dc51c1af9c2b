/*
 * balance.c — the load-, latency- and prefix-aware choices (balance.h).
 */
#include "balance.h"

#include <math.h>
#include <string.h>

static const char *const reason_names[PICK__COUNT] = {
#define X(e, s) [PICK_##e] = s,
	PICK_REASONS(X)
#undef X
};

const char *pick_reason_name(enum pick_reason r)
{
	return (unsigned)r < PICK__COUNT ? reason_names[r] : "?";
}

void ttft_fit_add(struct ttft_fit *f, double x, double y)
{
	if (f->n == 0) {
		f->mx = x;
		f->my = y;
		f->mxx = x * x;
		f->mxy = x * y;
	} else {
		double a = TTFT_FIT_ALPHA;
		f->mx += a * (x - f->mx);
		f->my += a * (y - f->my);
		f->mxx += a * (x * x - f->mxx);
		f->mxy += a * (x * y - f->mxy);
	}
	if (f->n < 1000)
		f->n++;
}

double ttft_fit_predict(const struct ttft_fit *f, double x)
{
	if (f->n <= 0 || !(f->my >= 0))
		return NAN;
	double mx = f->mx > 1 ? f->mx : 1;
	double prop = f->my / mx; /* ms per token, were it all proportional */
	double var = f->mxx - f->mx * f->mx;
	double b = prop / 2;
	/* spread: the loads seen differ by more than a tenth of their mean */
	if (f->n >= 4 && var > 0.01 * mx * mx) {
		b = (f->mxy - f->mx * f->my) / var;
		if (b < prop / 4)
			b = prop / 4;
	}
	double a = f->my - b * f->mx;
	if (a < 0)
		a = 0;
	return a + b * x;
}

static double cand_load(const struct bal_cand *c)
{
	return ((double)c->active + c->queued + 1) / c->weight;
}

/* Whether candidate i may be drawn: with a free slot, or any when none has. */
static bool drawable(const struct bal_cand *c, unsigned i, bool free_only)
{
	return !free_only || !bal_full(&c[i]);
}

static bool any_free(const struct bal_cand *c, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (!bal_full(&c[i]))
			return true;
	return false;
}

static uint64_t next_rnd(uint64_t *s)
{
	/* splitmix64: one seed gives as many draws as a pick needs */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Up to `want` distinct drawable candidates into out[], likelier by
 * weight when `weighted`; returns how many. Bounded: 4 * want draws, then
 * the rest in order. */
static unsigned draw(const struct bal_cand *c, unsigned n, unsigned want, bool weighted, bool free_only, uint64_t rnd,
		     unsigned *out)
{
	unsigned m = 0, avail = 0;
	double total = 0;
	bool same = true; /* every one drawable at the same weight: drawn by index */

	for (unsigned i = 0; i < n; i++)
		if (drawable(c, i, free_only)) {
			avail++;
			total += weighted ? c[i].weight : 1;
			same &= !weighted || c[i].weight == c[0].weight;
		}
	same &= avail == n;
	if (want > avail)
		want = avail;
	for (unsigned tries = 0; m < want && tries < 4 * want; tries++) {
		double u = (double)(next_rnd(&rnd) >> 11) / 9007199254740992.0 * total;
		unsigned pick = n;
		if (same) {
			pick = (unsigned)(u / total * n);
			pick = pick < n ? pick : n - 1;
		}
		for (unsigned i = 0; !same && i < n; i++) {
			if (!drawable(c, i, free_only))
				continue;
			u -= weighted ? c[i].weight : 1;
			pick = i;
			if (u < 0)
				break;
		}
		bool seen = false;
		for (unsigned k = 0; k < m; k++)
			seen |= out[k] == pick;
		if (!seen && pick < n)
			out[m++] = pick;
	}
	for (unsigned i = 0; i < n && m < want; i++) {
		bool seen = false;
		for (unsigned k = 0; k < m; k++)
			seen |= out[k] == i;
		if (!seen && drawable(c, i, free_only))
			out[m++] = i;
	}
	return m;
}

static int least_of(const struct bal_cand *c, const unsigned *idx, unsigned m)
{
	int best = -1;

	for (unsigned k = 0; k < m; k++)
		if (best < 0 || cand_load(&c[idx[k]]) < cand_load(&c[best]))
			best = (int)idx[k];
	return best;
}

int bal_least_request(const struct bal_cand *c, unsigned n, uint64_t rnd)
{
	unsigned idx[2];

	if (!n)
		return -1;
	unsigned m = draw(c, n, 2, false, any_free(c, n), rnd, idx);
	return least_of(c, idx, m);
}

double bal_uncached(const struct bal_cand *c, double tokens)
{
	double own = tokens - c->cached_tokens;

	return own > 0 ? own : 0;
}

double bal_predict(const struct bal_cand *c, double tokens)
{
	double ahead = (double)c->prefill_tokens + bal_uncached(c, tokens);

	if (c->eng_waiting > (int64_t)c->prefill_reqs) {
		/* the engine queues more than tokentap sent it: another client's,
		 * or another tokentap's; sized like tokentap's own */
		double mean = c->prefill_reqs ? (double)c->prefill_tokens / c->prefill_reqs : tokens;
		ahead += (double)(c->eng_waiting - (int64_t)c->prefill_reqs) * mean;
	}
	double p = ttft_fit_predict(&c->fit, ahead);
	if (bal_full(c))
		p *= 1.0 + ((double)c->queued + 1) / c->max_conc; /* a wait for a slot first */
	return p;
}

unsigned bal_latency_draw(const struct bal_cand *c, unsigned n, int prefer, uint64_t rnd, unsigned *idx)
{
	if (!n)
		return 0;
	bool free_only = any_free(c, n);
	unsigned m = 0;
	if (prefer >= 0 && (unsigned)prefer < n && drawable(c, (unsigned)prefer, free_only))
		idx[m++] = (unsigned)prefer;
	unsigned got = draw(c, n, BAL_LATENCY_CHOICES, true, free_only, rnd, idx + m);
	unsigned out = m; /* the preferred one drawn again: kept once */
	for (unsigned k = 0; k < got; k++)
		if (!(m && idx[m + k] == idx[0]))
			idx[out++] = idx[m + k];
	return out;
}

int bal_latency_choose(const struct bal_cand *c, const unsigned *idx, unsigned m, double tokens, double *pred_ms)
{
	int best = -1;
	double best_p = NAN;

	*pred_ms = NAN;
	for (unsigned k = 0; k < m; k++) {
		double p = bal_predict(&c[idx[k]], tokens);
		if (isnan(p))
			continue;
		if (best < 0 || p < best_p) {
			best = (int)idx[k];
			best_p = p;
		}
	}
	if (best < 0)
		return m ? least_of(c, idx, m) : -1;
	*pred_ms = best_p;
	return best;
}

int bal_latency(const struct bal_cand *c, unsigned n, double tokens, uint64_t rnd, double *pred_ms)
{
	unsigned idx[BAL_LATENCY_CHOICES + 1];
	unsigned m = bal_latency_draw(c, n, -1, rnd, idx);

	return bal_latency_choose(c, idx, m, tokens, pred_ms);
}

int bal_prefix(const struct bal_cand *c, unsigned n, double factor, unsigned slack, unsigned *rank)
{
	double total = 1, wsum = 0; /* the route's load with this request */
	bool taken[64] = { false };
	unsigned lim = n < 64 ? n : 64;

	*rank = 0;
	if (!n)
		return -1;
	for (unsigned i = 0; i < lim; i++) {
		total += (double)c[i].active + c[i].queued;
		wsum += c[i].weight;
	}
	for (unsigned r = 0; r < lim; r++) {
		int best = -1;
		for (unsigned i = 0; i < lim; i++)
			if (!taken[i] && (best < 0 || c[i].score > c[best].score))
				best = (int)i;
		taken[best] = true;
		const struct bal_cand *b = &c[best];
		double bound = ceil(factor * total * b->weight / wsum) + slack;
		if (!bal_full(b) && (double)b->active + b->queued + 1 <= bound) {
			*rank = r;
			return best;
		}
	}
	*rank = n;
	int best = -1;
	for (unsigned i = 0; i < lim; i++)
		if (!bal_full(&c[i]) && (best < 0 || cand_load(&c[i]) < cand_load(&c[best])))
			best = (int)i;
	if (best < 0) /* every one full */
		for (unsigned i = 0; i < lim; i++)
			if (best < 0 || cand_load(&c[i]) < cand_load(&c[best]))
				best = (int)i;
	return best;
}

static uint64_t mix64(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

uint64_t bal_name_hash(const char *name)
{
	uint64_t h = 0x6a09e667f3bcc908ull; /* FNV-1a from a fixed basis */

	for (const char *p = name; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	return mix64(h);
}

double bal_rendezvous_uh(uint64_t key, uint64_t name_hash)
{
	/* two rounds: a key and a name that differ in one bit draw apart */
	uint64_t h = mix64(mix64(key ^ 0xbb67ae8584caa73bull) ^ name_hash);

	return ((double)(h >> 11) + 0.5) / 9007199254740992.0;
}

double bal_rendezvous_u(uint64_t key, const char *name)
{
	return bal_rendezvous_uh(key, bal_name_hash(name));
}

double bal_rendezvous(uint64_t key, const char *name, unsigned weight)
{
	return -(double)weight / log(bal_rendezvous_u(key, name));
}
