/*
 * paired.c — primaries and their shadows paired, and the series of their
 * differences (paired.h says what is kept and who may touch what).
 *
 *   mirror_start ─ paired_link_new ─▶ link ◀─ primary meter_finish ─┐
 *                                       ▲                            ├─ second half: pair ─lock─▶ series
 *                                       └── shadow meter_finish ─────┘
 *
 * Invariants: a link is freed by the last of its two holders; the table is
 * only touched under `lock`; a series' window is a ring of the last
 * PAIRED_WINDOW pairs, `head` its oldest when full.
 */
#include "paired.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "timeline.h"

const char *paired_metric_name(enum paired_metric m)
{
	static const char *const names[] = {
#define X(e, k) #k,
		PAIRED_METRICS(X)
#undef X
	};
	return m < PM__COUNT ? names[m] : "?";
}

double paired_floor(unsigned metric)
{
	return metric == PM_OUTPUT_TOKENS ? 0 : PAIRED_FLOOR_MS;
}

int paired_verdict(const struct seqsign *s, double hl, double a_median, unsigned metric)
{
	double least = fmax(SEQSIGN_BAND * fabs(a_median), paired_floor(metric));

	if (!s->verdict || isnan(hl) || isnan(a_median) || fabs(hl) <= least || (hl > 0) != (s->verdict > 0))
		return 0;
	return s->verdict;
}

const char *paired_verdict_name(int verdict, unsigned metric)
{
	if (!verdict)
		return "undecided";
	if (metric == PM_OUTPUT_TOKENS)
		return verdict > 0 ? "B more" : "A more";
	return verdict > 0 ? "A faster" : "B faster";
}

bool paired_significant(const struct signrank *sr, double a_median, unsigned metric)
{
	return sr->nonzero && sr->p < PAIRED_ALPHA && !isnan(a_median) &&
	       fabs(sr->hl) > fmax(SEQSIGN_BAND * fabs(a_median), paired_floor(metric));
}

static json_t *num(double v)
{
	return isnan(v) || isinf(v) ? json_null() : json_real(v);
}

static json_t *u64(uint64_t v)
{
	return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

json_t *paired_metric_json(const struct signrank *sr, double a_median, const struct seqsign *seq, unsigned metric)
{
	int verdict = paired_verdict(seq, sr->hl, a_median, metric);
	json_t *o = json_object();

	if (!o)
		return NULL;
	json_object_set_new(o, "n", u64(sr->n));
	json_object_set_new(o, "nonzero", u64(sr->nonzero));
	json_object_set_new(o, "a_median", num(a_median));
	json_object_set_new(o, "median_diff", num(sr->median));
	json_object_set_new(o, "hl_shift", num(sr->hl));
	json_object_set_new(o, "hl_ci", json_pack("[o,o]", num(sr->hl_lo), num(sr->hl_hi)));
	json_object_set_new(o, "ci_level", num(sr->ci_level));
	json_object_set_new(o, "relative_shift", a_median > 0 ? num(sr->hl / a_median) : json_null());
	json_object_set_new(o, "w_plus", json_real(sr->w_plus));
	json_object_set_new(o, "p_value", json_real(sr->p));
	json_object_set_new(o, "exact", json_boolean(sr->exact));
	json_object_set_new(o, "significant", json_boolean(paired_significant(sr, a_median, metric)));
	json_object_set_new(o, "verdict", json_string(paired_verdict_name(verdict, metric)));
	json_object_set_new(o, "since_pairs", verdict ? u64(seq->since) : json_null());
	json_object_set_new(o, "sequential",
			    json_pack("{s:o,s:o,s:o,s:s,s:o,s:o,s:f}", "pairs", u64(seq->pairs), "b_greater",
				      u64(seq->b_greater), "a_greater", u64(seq->a_greater), "called",
				      paired_verdict_name(seq->verdict, metric), "called_at",
				      seq->verdict ? u64(seq->since) : json_null(), "log_evidence",
				      num(seqsign_log_evidence(seq)), "log_threshold", -log(PAIRED_ALPHA)));
	return o;
}

void paired_values(const struct req_record *rec, double out[PM__COUNT])
{
	double d[RM__COUNT];

	record_derive(rec, d);
	out[PM_TTFT] = d[RM_TTFT];
	out[PM_ANSWER_TTFT] = d[RM_ANSWER_TTFT];
	out[PM_TPOT] = d[RM_TPOT];
	out[PM_E2E] = d[RM_E2E];
	/* counted when the server said, or when token events were seen; a
	 * shadow's unread non-streamed body says nothing */
	out[PM_OUTPUT_TOKENS] =
		rec->usage.output_tokens >= 0 || rec->token_events ? (double)record_output_tokens(rec) : NAN;
}

/* ---- links ---- */

struct half {
	bool in;
	bool failed;
	double v[PM__COUNT];
	char upstream[128];
};

struct paired_link {
	unsigned refs;	     /* 2 at birth: the primary's meter and the shadow's */
	struct half side[2]; /* [0] primary, [1] shadow */
	char route[128], model[128];
};

struct paired_link *paired_link_new(void)
{
	struct paired_link *l = calloc(1, sizeof(*l));
	if (l)
		l->refs = 2;
	return l;
}

void paired_link_drop(struct paired_link **l)
{
	if (!l || !*l)
		return;
	if (--(*l)->refs == 0)
		free(*l);
	*l = NULL;
}

/* ---- the series ---- */

struct series_state {
	char route[128], primary[128], shadow[128], model[128];
	uint64_t pairs, errors_primary, errors_shadow, both_errors;
	struct metric_state {
		size_t n, head;
		double a[PAIRED_WINDOW], b[PAIRED_WINDOW];
		struct seqsign seq;
	} metric[PM__COUNT];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct series_state *table[PAIRED_SERIES_MAX];
static size_t ntable;
static uint64_t dropped; /* pairs of series past the bound */

static void copy_name(char *dst, size_t cap, const char *src)
{
	snprintf(dst, cap, "%s", src ? src : "none");
}

/* Under the lock. NULL when the table is full or memory ran out. */
static struct series_state *series_of(const char *route, const char *primary, const char *shadow)
{
	for (size_t i = 0; i < ntable; i++)
		if (!strcmp(table[i]->route, route) && !strcmp(table[i]->primary, primary) &&
		    !strcmp(table[i]->shadow, shadow))
			return table[i];
	if (ntable == PAIRED_SERIES_MAX)
		return NULL;
	struct series_state *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	copy_name(s->route, sizeof(s->route), route);
	copy_name(s->primary, sizeof(s->primary), primary);
	copy_name(s->shadow, sizeof(s->shadow), shadow);
	table[ntable++] = s;
	return s;
}

static void series_add(const struct paired_link *l)
{
	const struct half *a = &l->side[0], *b = &l->side[1];

	pthread_mutex_lock(&lock);
	struct series_state *s = series_of(l->route, a->upstream, b->upstream);
	if (!s) {
		dropped++;
		goto out;
	}
	copy_name(s->model, sizeof(s->model), l->model);
	if (a->failed || b->failed) {
		s->errors_primary += a->failed;
		s->errors_shadow += b->failed;
		s->both_errors += a->failed && b->failed;
		goto out;
	}
	s->pairs++;
	for (unsigned m = 0; m < PM__COUNT; m++) {
		double x = a->v[m], y = b->v[m];
		if (isnan(x) || isnan(y) || x < 0 || y < 0)
			continue; /* missing on a side: not paired */
		struct metric_state *mt = &s->metric[m];
		size_t at = (mt->head + mt->n) % PAIRED_WINDOW;
		if (mt->n == PAIRED_WINDOW) {
			at = mt->head;
			mt->head = (mt->head + 1) % PAIRED_WINDOW;
		} else {
			mt->n++;
		}
		mt->a[at] = x;
		mt->b[at] = y;
		seqsign_add(&mt->seq, x, y, SEQSIGN_BAND, paired_floor(m), PAIRED_ALPHA);
	}
out:
	pthread_mutex_unlock(&lock);
}

void paired_link_finish(struct paired_link **l, const struct req_record *rec, bool shadow, const char *route,
			const char *upstream)
{
	struct paired_link *k;

	if (!l || !(k = *l))
		return;
	struct half *h = &k->side[shadow];
	h->in = true;
	h->failed = rec->error != REQ_ERR_NONE;
	paired_values(rec, h->v);
	copy_name(h->upstream, sizeof(h->upstream), upstream);
	if (!shadow) {
		copy_name(k->route, sizeof(k->route), route);
		copy_name(k->model, sizeof(k->model), rec->model[0] ? rec->model : NULL);
	}
	if (k->side[0].in && k->side[1].in)
		series_add(k);
	paired_link_drop(l);
}

int paired_snapshot(const char *route, struct paired_view **out, size_t *n)
{
	int rc = 0;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&lock);
	size_t want = 0;
	for (size_t i = 0; i < ntable; i++)
		want += !route || !strcmp(table[i]->route, route);
	if (!want)
		goto out;
	*out = calloc(want, sizeof(**out));
	if (!*out) {
		rc = -1;
		goto out;
	}
	for (size_t i = 0; i < ntable; i++) {
		const struct series_state *s = table[i];
		if (route && strcmp(s->route, route))
			continue;
		struct paired_view *v = &(*out)[(*n)++];
		memcpy(v->route, s->route, sizeof(v->route));
		memcpy(v->primary, s->primary, sizeof(v->primary));
		memcpy(v->shadow, s->shadow, sizeof(v->shadow));
		memcpy(v->model, s->model, sizeof(v->model));
		v->pairs = s->pairs;
		v->errors_primary = s->errors_primary;
		v->errors_shadow = s->errors_shadow;
		v->both_errors = s->both_errors;
		for (unsigned m = 0; m < PM__COUNT; m++) {
			struct paired_metric_view *mv = &v->metric[m];
			mv->n = s->metric[m].n;
			mv->seq = s->metric[m].seq;
			for (size_t j = 0; j < mv->n; j++) {
				size_t at = (s->metric[m].head + j) % PAIRED_WINDOW;
				mv->a[j] = s->metric[m].a[at];
				mv->b[j] = s->metric[m].b[at];
			}
		}
	}
out:
	pthread_mutex_unlock(&lock);
	return rc;
}

uint64_t paired_dropped(void)
{
	pthread_mutex_lock(&lock);
	uint64_t n = dropped;
	pthread_mutex_unlock(&lock);
	return n;
}

void paired_reset(void)
{
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < ntable; i++)
		free(table[i]);
	ntable = 0;
	dropped = 0;
	pthread_mutex_unlock(&lock);
}
