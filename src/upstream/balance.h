/*
 * balance.h — the choice of an upstream among a route's targets, from the
 * numbers tokentap measured of each: pure functions, no I/O, no clock, no
 * shared state (router.c gathers the numbers and applies the choice).
 *
 * Every function takes the eligible candidates only (weight above 0, not
 * tried, not ejected: router.c filters) and returns an index into them, or
 * -1 when there is none. A candidate at its max_concurrency is full: the
 * load-aware choices take one with a free slot before any full one, so a
 * request queues only when every candidate would make it.
 *
 * The TTFT model (struct ttft_fit): an exponentially weighted least-squares
 * line of the time from dispatch to first token (ms) against the prompt
 * tokens ahead of and including the request (x). docs/routing.md says how
 * each policy uses it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Why the upstream was chosen: the access log's `pick` and the label of
 * tokentap_route_decisions_total. */
#define PICK_REASONS(X) \
	X(WEIGHTED, "weighted") \
	X(LEAST_LOADED, "least_loaded") \
	X(LATENCY, "latency") \
	X(PREFIX, "prefix") \
	X(SATURATED_RELEASE, "saturated_release") \
	X(STICKY, "sticky") \
	X(PINNED, "pinned") \
	X(FAILOVER, "failover") \
	X(TTFT_DEADLINE, "ttft_deadline") \
	X(PROBE, "probe")

enum pick_reason {
#define X(e, s) PICK_##e,
	PICK_REASONS(X)
#undef X
		PICK__COUNT
};

const char *pick_reason_name(enum pick_reason r);

/* Weight of each new sample in the fit's moments. */
#define TTFT_FIT_ALPHA 0.1

/* The moments of the fit; n counts samples (capped: it only tells a new
 * fit from a settled one). */
struct ttft_fit {
	double n, mx, my, mxx, mxy;
};

/* Adds one sample: x tokens ahead (own included), y ms to first token. */
void ttft_fit_add(struct ttft_fit *f, double x, double y);

/* The predicted ms to first token with x tokens ahead; NaN with no sample.
 * Until the samples spread over loads, half the mean TTFT is taken as
 * fixed and half as proportional to x; the slope never falls below a
 * quarter of the proportional one, so a prediction always grows with the
 * work ahead (a burst read from one snapshot would otherwise herd). */
double ttft_fit_predict(const struct ttft_fit *f, double x);

/* What one candidate looks like now. */
struct bal_cand {
	unsigned weight;	 /* > 0 */
	unsigned active, queued; /* every worker's, this process */
	unsigned max_conc;	 /* 0: no limit */
	uint64_t prefill_tokens; /* prompt tokens in flight not yet at their first token */
	unsigned prefill_reqs;	 /* requests in flight not yet at their first token */
	int64_t eng_waiting;	 /* the engine's own queue when freshly scraped, else -1 */
	struct ttft_fit fit;	 /* fit.n == 0: no sample */
	double score;		 /* prefix: the rendezvous score of the request's key */
	double cached_tokens;	 /* latency: the request's prompt tokens it is expected to hold */
};

static inline bool bal_full(const struct bal_cand *c)
{
	return c->max_conc && c->active >= c->max_conc;
}

/* Power of two choices: two candidates drawn at random (from those with a
 * free slot when any has one), the one with fewer requests per weight
 * ((active + queued + 1) / weight) wins. `rnd`: 64 random bits. */
int bal_least_request(const struct bal_cand *c, unsigned n, uint64_t rnd);

/* The prompt tokens the candidate would have to prefill for a request of
 * `tokens`: those it is not expected to hold (c->cached_tokens), never
 * below 0. */
double bal_uncached(const struct bal_cand *c, double tokens);

/* The candidate's predicted TTFT (ms) for a request of `tokens` prompt
 * tokens: the fit at the tokens ahead of it (its own not expected to be
 * cached there, those in flight not yet at first token, and the engine's
 * queue beyond tokentap's own at the mean size of those), stretched by the
 * queue when it is full. NaN when the candidate has no sample. */
double bal_predict(const struct bal_cand *c, double tokens);

/* The latency choice in two steps, so that the caller fills in
 * cached_tokens for the drawn candidates only: bal_latency_draw puts up to
 * BAL_LATENCY_CHOICES candidates drawn at random, likelier by weight (from
 * those with a free slot when any has one), into idx[], and `prefer` (a
 * candidate index, or -1: the one expected to hold most of the prompt)
 * before them when it may be drawn: at most BAL_LATENCY_CHOICES + 1, how
 * many returned. bal_latency_choose: the lowest prediction among idx[]
 * wins, in *pred_ms; when none has a sample, the least_request choice over
 * them, *pred_ms NaN. bal_latency: both, with cached_tokens as given. */
#define BAL_LATENCY_CHOICES 3
unsigned bal_latency_draw(const struct bal_cand *c, unsigned n, int prefer, uint64_t rnd, unsigned *idx);
int bal_latency_choose(const struct bal_cand *c, const unsigned *idx, unsigned m, double tokens, double *pred_ms);
int bal_latency(const struct bal_cand *c, unsigned n, double tokens, uint64_t rnd, double *pred_ms);

/* Consistent hashing with bounded loads: candidates in order of their
 * rendezvous score (highest first); the first with a free slot whose load
 * (active + queued), this request added, stays within `factor` times its
 * weighted share of the route's load (rounded up) plus `slack` requests
 * takes it. *rank: how far down the order it was (0: the affine upstream).
 * When none qualifies, the least loaded per weight, *rank = n. */
int bal_prefix(const struct bal_cand *c, unsigned n, double factor, unsigned slack, unsigned *rank);

/* The weighted rendezvous score of `key` for the upstream named `name`:
 * the same in every process (no salt, no state). -weight / ln(u), u the
 * key's and the name's uniform draw in (0, 1), bal_rendezvous_u: when
 * every weight is the same, u alone orders the upstreams alike, without
 * a logarithm each. */
double bal_rendezvous(uint64_t key, const char *name, unsigned weight);
double bal_rendezvous_u(uint64_t key, const char *name);
/* The same from the name's hash, computed once per upstream (router.c):
 * bal_rendezvous_u(key, name) == bal_rendezvous_uh(key, bal_name_hash(name)). */
uint64_t bal_name_hash(const char *name);
double bal_rendezvous_uh(uint64_t key, uint64_t name_hash);
