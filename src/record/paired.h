/*
 * paired.h — mirrored requests paired with their primaries: per (route,
 * primary upstream, shadow upstream) the recent per-request differences
 * and a sequential verdict, for /compare's `paired` section.
 *
 * A mirrored request has two halves, the primary (exchange) and its shadow
 * (mirror), each with its own meter on the same worker. mirror_start links
 * the two meters to one `struct paired_link`; each meter_finish hands its
 * record over (paired_link_finish) and the second to finish, in either
 * order, turns the two into a pair: per metric (ttft, answer ttft, tpot,
 * e2e, output tokens) the two values, when both sides have it. A pair with
 * an error on either side is counted apart, not paired; a half that ends
 * unrecorded (a shadow abandoned, shutdown) only drops its reference.
 *
 * The link is touched by its worker only. The series table is shared by
 * every worker and the admin thread: one mutex, taken once per finished
 * pair and once per snapshot, never on the per-event path.
 *
 * Memory: at most PAIRED_SERIES_MAX series (further ones are counted in
 * `dropped` and not kept), each holding the last PAIRED_WINDOW pairs of
 * every metric (two doubles a value): about 40 KiB a series, 2.6 MiB at
 * most. The sequential state is a few counters a metric, kept since start.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "signrank.h"

struct req_record;

#define PAIRED_WINDOW 512
#define PAIRED_SERIES_MAX 64
/* The sequential rule's level: the chance two identical upstreams are ever
 * called different, however long they run (docs/metrics.md). */
#define PAIRED_ALPHA 0.01
/* Pairs closer than this are ties for the sequential rule (beside the
 * relative SEQSIGN_BAND), and a shift no larger is not significant: the
 * shadow is read at a lower loop priority than its primary and lags it by
 * a fraction of a millisecond, more on a busy host (docs/workload.md).
 * Output tokens: none. */
#define PAIRED_FLOOR_MS 1.0

/* The absolute tie floor of a metric, in its unit. */
double paired_floor(unsigned metric);

/* The verdict shown: the sequential rule's (+1 b greater, -1 a greater, 0
 * undecided), held back while the Hodges-Lehmann shift `hl` of the recent
 * pairs is within max(SEQSIGN_BAND * a_median, floor) or of the other sign:
 * a lopsided tail (the shadow now and then a millisecond late) is evidence,
 * but not a difference worth a verdict. An extra condition on a valid test:
 * the false-call rate stays at most PAIRED_ALPHA. */
int paired_verdict(const struct seqsign *s, double hl, double a_median, unsigned metric);

/* A verdict in words: "A faster" / "B faster" ("A more" / "B more" for
 * output tokens), "undecided". */
const char *paired_verdict_name(int verdict, unsigned metric);

/* The signed-rank result `sr` of the differences B - A is significant: p
 * below PAIRED_ALPHA and the Hodges-Lehmann shift beyond max(SEQSIGN_BAND *
 * a_median, floor), `a_median` A's median. */
bool paired_significant(const struct signrank *sr, double a_median, unsigned metric);

/* One metric's statistics as JSON, the same keys in /compare's `paired`
 * section and in tokentap-bench --compare (docs/workload.md): `sr` the
 * signed-rank test of the differences B - A, `a_median` A's median, `seq`
 * the sequential rule since the first pair. NULL when out of memory. */
struct json_t;
struct json_t *paired_metric_json(const struct signrank *sr, double a_median, const struct seqsign *seq,
				  unsigned metric);

#define PAIRED_METRICS(X) \
	X(TTFT, ttft_ms) \
	X(ANSWER_TTFT, answer_ttft_ms) \
	X(TPOT, tpot_ms) \
	X(E2E, e2e_ms) \
	X(OUTPUT_TOKENS, output_tokens)

enum paired_metric {
#define X(e, k) PM_##e,
	PAIRED_METRICS(X)
#undef X
		PM__COUNT
};

const char *paired_metric_name(enum paired_metric m);

/* The values of one finished half: NaN where the metric is missing. */
void paired_values(const struct req_record *rec, double out[PM__COUNT]);

/* ---- one mirrored request ---- */

struct paired_link;

/* A link for a primary and its shadow, both holding it: NULL when out of
 * memory (the request is then simply not paired). */
struct paired_link *paired_link_new(void);

/* A half is recorded: its values kept; when the other half is already in,
 * the pair goes to its series. `route`, `upstream` and the model name are
 * copied. Drops the half's reference and clears *l. */
void paired_link_finish(struct paired_link **l, const struct req_record *rec, bool shadow, const char *route,
			const char *upstream);

/* A half ends without a record: drops its reference, clears *l. NULL and
 * a cleared pointer are fine. */
void paired_link_drop(struct paired_link **l);

/* ---- the series, for /compare ---- */

struct paired_view {
	char route[128], primary[128], shadow[128], model[128];
	uint64_t pairs;				/* both halves finished without error */
	uint64_t errors_primary, errors_shadow; /* halves that failed: not paired */
	uint64_t both_errors;			/* of them, pairs where both failed */
	struct paired_metric_view {
		size_t n;		 /* pairs in the window */
		double a[PAIRED_WINDOW]; /* the primary's values, oldest first */
		double b[PAIRED_WINDOW]; /* the shadow's, in the same order */
		struct seqsign seq;	 /* since start */
	} metric[PM__COUNT];
};

/* Copies the series of `route` (every route when NULL): *out malloc'd,
 * *n of them. -1 when out of memory. */
int paired_snapshot(const char *route, struct paired_view **out, size_t *n);

/* Pairs not kept because PAIRED_SERIES_MAX series were already. */
uint64_t paired_dropped(void);

/* Forgets every series (tests). */
void paired_reset(void);
