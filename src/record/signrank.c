/*
 * signrank.c — Wilcoxon signed-rank, Hodges-Lehmann and the sequential
 * sign test (signrank.h says what each computes).
 *
 * Invariants: the input is never changed (a copy is sorted); the exact
 * distribution is a count over subsets of integer weights (mid-ranks
 * doubled, so ties stay exact), at most SIGNRANK_EXACT_MAX of them.
 */
#define _GNU_SOURCE /* lgamma_r: lgamma writes the global signgam */
#include "signrank.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void swap(double *x, double *y)
{
	double t = *x;
	*x = *y;
	*y = t;
}

/* The k-th smallest (0-based) of v[0..n), v reordered: selection with a
 * three-way partition, so runs of equal values (ties) end it at once. */
static double select_kth(double *v, size_t n, size_t k)
{
	size_t lo = 0, hi = n; /* k is in [lo, hi) */

	while (hi - lo > 1) {
		double pivot = v[lo + (hi - lo) / 2];
		size_t lt = lo, i = lo, gt = hi; /* [lo,lt) < pivot, [lt,i) = pivot, [gt,hi) > pivot */
		while (i < gt) {
			if (v[i] < pivot)
				swap(&v[lt++], &v[i++]);
			else if (v[i] > pivot)
				swap(&v[i], &v[--gt]);
			else
				i++;
		}
		if (k < lt)
			hi = lt;
		else if (k >= gt)
			lo = gt;
		else
			return pivot;
	}
	return v[k];
}

static double median_of(double *v, size_t n)
{
	double hi = select_kth(v, n, n / 2);
	if (n % 2)
		return hi;
	return (select_kth(v, n, n / 2 - 1) + hi) / 2;
}

/* How many subsets of the weights sum to each s in [0, total]: malloc'd,
 * total + 1 counts (exact in a double up to 2^53 subsets: n <= 50). */
static double *subset_counts(const unsigned *weights, size_t n, unsigned *total)
{
	double *count;
	unsigned reach = 0;

	*total = 0;
	for (size_t i = 0; i < n; i++)
		*total += weights[i];
	count = calloc(*total + 1, sizeof(*count));
	if (!count)
		return NULL;
	count[0] = 1;
	for (size_t i = 0; i < n; i++) {
		for (unsigned s = reach + 1; s-- > 0;)
			if (count[s] != 0)
				count[s + weights[i]] += count[s];
		reach += weights[i];
	}
	return count;
}

double signrank_median(const double *v, size_t n)
{
	double *copy = n ? malloc(n * sizeof(*copy)) : NULL, m;

	if (!copy)
		return NAN;
	memcpy(copy, v, n * sizeof(*copy));
	m = median_of(copy, n);
	free(copy);
	return m;
}

double signrank_cdf(const unsigned *weights, size_t n, unsigned w)
{
	unsigned total;
	double p = 0, *count = subset_counts(weights, n, &total);

	if (!count)
		return NAN;
	for (unsigned s = 0; s <= w && s <= total; s++)
		p += count[s];
	free(count);
	return ldexp(p, -(int)n);
}

/* The standard normal quantile of q in (0, 1), by bisection on erfc: a few
 * dozen steps, called once per test. */
static double normal_quantile(double q)
{
	double lo = -40, hi = 40;
	for (int i = 0; i < 100; i++) {
		double mid = (lo + hi) / 2;
		if (0.5 * erfc(-mid / M_SQRT2) < q)
			lo = mid;
		else
			hi = mid;
	}
	return (lo + hi) / 2;
}

/* The signed-rank statistic and its p-value over the sorted |d|. */
static void rank_test(const double *d, size_t n, struct signrank *out)
{
	double *mag = malloc(n * sizeof(*mag));
	unsigned *w2 = NULL;
	size_t m = 0;
	double ties = 0;

	if (!mag)
		return;
	for (size_t i = 0; i < n; i++)
		if (d[i] != 0)
			mag[m++] = fabs(d[i]);
	out->nonzero = m;
	if (!m)
		goto out;
	qsort(mag, m, sizeof(*mag), cmp_double);
	w2 = malloc(m * sizeof(*w2));
	if (!w2)
		goto out;
	/* mid-ranks, doubled: a run of equal |d| from rank i+1 to j shares (i+1+j)/2 */
	for (size_t i = 0; i < m;) {
		size_t j = i;
		while (j < m && mag[j] == mag[i])
			j++;
		double t = (double)(j - i);
		ties += t * t * t - t;
		for (size_t k = i; k < j; k++)
			w2[k] = (unsigned)(i + 1 + j);
		i = j;
	}
	/* W+ from the doubled ranks: each d finds its rank by binary search */
	unsigned wp2 = 0, total2 = 0;
	for (size_t k = 0; k < m; k++)
		total2 += w2[k];
	for (size_t i = 0; i < n; i++) {
		if (d[i] <= 0)
			continue;
		size_t lo = 0, hi = m;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (mag[mid] < d[i])
				lo = mid + 1;
			else
				hi = mid;
		}
		wp2 += w2[lo];
	}
	out->w_plus = wp2 / 2.0;
	if (m <= SIGNRANK_EXACT_MAX) {
		unsigned tail = wp2 < total2 - wp2 ? wp2 : total2 - wp2;
		double c = signrank_cdf(w2, m, tail);
		if (!isnan(c)) {
			out->exact = true;
			out->p = fmin(1, 2 * c);
			goto out;
		}
	}
	double nn = (double)m, mean = nn * (nn + 1) / 4;
	double var = nn * (nn + 1) * (2 * nn + 1) / 24 - ties / 48;
	if (var > 0) {
		out->z = (out->w_plus - mean) / sqrt(var);
		out->p = erfc(fabs(out->z) / M_SQRT2);
	}
out:
	free(w2);
	free(mag);
}

/* The Hodges-Lehmann shift over all n differences and the interval that
 * inverts the signed-rank test: the (C+1)-th smallest and largest Walsh
 * averages, C the largest count whose lower tail is within (1-conf)/2. */
static int hodges_lehmann(const double *d, size_t n, double confidence, struct signrank *out)
{
	size_t nw = n * (n + 1) / 2, k = 0;
	double *walsh = malloc(nw * sizeof(*walsh));
	double half = (1 - confidence) / 2;

	if (!walsh)
		return -1;
	for (size_t i = 0; i < n; i++)
		for (size_t j = i; j < n; j++)
			walsh[k++] = (d[i] + d[j]) / 2;
	out->hl = median_of(walsh, nw);
	out->hl_lo = out->hl_hi = NAN;
	long c = -1;
	if (n <= SIGNRANK_EXACT_MAX) {
		unsigned w[SIGNRANK_EXACT_MAX], total;
		for (size_t i = 0; i < n; i++)
			w[i] = (unsigned)(i + 1);
		double *count = subset_counts(w, n, &total), tail = 0, cum = 0;
		if (!count) {
			free(walsh);
			return -1;
		}
		/* P(W <= c) grows with c: step up while within the tail */
		for (unsigned t = 0; t <= total; t++) {
			cum += ldexp(count[t], -(int)n);
			if (cum > half)
				break;
			c = t;
			tail = cum;
		}
		free(count);
		out->ci_level = 1 - 2 * tail;
	} else {
		double nn = (double)n, mean = nn * (nn + 1) / 4, sd = sqrt(nn * (nn + 1) * (2 * nn + 1) / 24);
		double cc = floor(mean - normal_quantile(1 - half) * sd);
		c = cc < 0 ? -1 : (long)cc;
		out->ci_level = confidence;
	}
	if (c >= 0 && (size_t)c < nw - 1 - (size_t)c) {
		out->hl_lo = select_kth(walsh, nw, (size_t)c);
		out->hl_hi = select_kth(walsh, nw, nw - 1 - (size_t)c);
	} else {
		out->ci_level = NAN;
	}
	free(walsh);
	return 0;
}

int signrank_test(const double *d, size_t n, double confidence, struct signrank *out)
{
	memset(out, 0, sizeof(*out));
	out->p = 1;
	out->median = out->hl = out->hl_lo = out->hl_hi = out->ci_level = NAN;
	out->n = n;
	if (!n)
		return 0;
	out->median = signrank_median(d, n);
	if (isnan(out->median))
		return -1;
	rank_test(d, n, out);
	if (hodges_lehmann(d, n, confidence, out) == -1) {
		memset(out, 0, sizeof(*out));
		out->p = 1;
		return -1;
	}
	return 0;
}

double seqsign_log_evidence(const struct seqsign *s)
{
	double k = (double)s->b_greater, m = (double)(s->b_greater + s->a_greater);
	int sign;
	/* Beta(1,1) mixture of p^k (1-p)^(m-k) over p, against (1/2)^m */
	return lgamma_r(k + 1, &sign) + lgamma_r(m - k + 1, &sign) - lgamma_r(m + 2, &sign) + m * M_LN2;
}

void seqsign_add(struct seqsign *s, double a, double b, double band, double floor, double alpha)
{
	double top = a > b ? a : b;

	s->pairs++;
	if (fabs(b - a) <= fmax(band * top, floor))
		return; /* a tie: within the band, or both zero */
	if (b > a)
		s->b_greater++;
	else
		s->a_greater++;
	if (!s->verdict && seqsign_log_evidence(s) >= -log(alpha)) {
		s->verdict = s->b_greater > s->a_greater ? 1 : -1;
		s->since = s->pairs;
	}
}
