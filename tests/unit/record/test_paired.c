/*
 * test_paired.c — pairing primaries with shadows: either half may finish
 * first, a failed half is counted and not paired, a half that ends
 * unrecorded pairs nothing, a metric missing on one side is left out, the
 * window keeps the last PAIRED_WINDOW pairs, series are per (route,
 * primary, shadow) and bounded; the shown verdict needs a material shift.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paired.h"
#include "timeline.h"

/* A streamed record: arrival at 0, first token at ttft ms, the end at e2e
 * ms, `tokens` token events; `err` its error. */
static void make_rec(struct req_record *r, double ttft, double e2e, unsigned tokens, enum req_error err)
{
	memset(r, 0, sizeof(*r));
	strcpy(r->model, "m");
	r->usage = USAGE_UNKNOWN;
	r->error = err;
	r->at[TL_ARRIVE] = 1000000000ull;
	if (tokens) {
		r->at[TL_FIRST_TOKEN] = r->at[TL_FIRST_ANSWER] = r->at[TL_ARRIVE] + (uint64_t)(ttft * 1e6);
		r->at[TL_LAST_TOKEN] = r->at[TL_ARRIVE] + (uint64_t)(e2e * 1e6);
		r->token_events = tokens;
	}
	r->at[TL_RESP_END] = r->at[TL_ARRIVE] + (uint64_t)(e2e * 1e6);
}

static const struct paired_view *find(const struct paired_view *v, size_t n, const char *shadow)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(v[i].shadow, shadow))
			return &v[i];
	return NULL;
}

/* One mirrored request: primary values (ta, ea), shadow values (tb, eb). */
static void pair(const char *route, const char *shadow, double ta, double tb, bool shadow_first)
{
	struct req_record a, b;
	struct paired_link *la = paired_link_new(), *lb = la;
	assert_non_null(la);
	make_rec(&a, ta, ta + 10, 5, REQ_ERR_NONE);
	make_rec(&b, tb, tb + 10, 5, REQ_ERR_NONE);
	if (shadow_first) {
		paired_link_finish(&lb, &b, true, route, shadow);
		assert_null(lb);
		paired_link_finish(&la, &a, false, route, "primary");
	} else {
		paired_link_finish(&la, &a, false, route, "primary");
		paired_link_finish(&lb, &b, true, route, shadow);
	}
	assert_null(la);
	assert_null(lb);
}

static void test_either_order(void **state)
{
	struct paired_view *v;
	size_t n;
	(void)state;
	paired_reset();
	pair("chat", "shadow", 20, 22, false);
	pair("chat", "shadow", 30, 33, true);
	assert_int_equal(paired_snapshot("chat", &v, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(v[0].primary, "primary");
	assert_string_equal(v[0].shadow, "shadow");
	assert_string_equal(v[0].model, "m");
	assert_int_equal(v[0].pairs, 2);
	const struct paired_metric_view *t = &v[0].metric[PM_TTFT];
	assert_int_equal(t->n, 2);
	assert_true(fabs(t->a[0] - 20) < 1e-6 && fabs(t->b[0] - 22) < 1e-6);
	assert_true(fabs(t->a[1] - 30) < 1e-6 && fabs(t->b[1] - 33) < 1e-6);
	assert_int_equal(v[0].metric[PM_OUTPUT_TOKENS].n, 2);
	assert_int_equal(v[0].metric[PM_E2E].n, 2);
	free(v);
	/* another route's series is not in this one's snapshot */
	assert_int_equal(paired_snapshot("other", &v, &n), 0);
	assert_int_equal(n, 0);
	assert_null(v);
}

static void test_errors_and_drops(void **state)
{
	struct req_record a, b;
	struct paired_view *v;
	size_t n;
	(void)state;
	paired_reset();
	/* the shadow failed: counted, not paired */
	struct paired_link *la = paired_link_new(), *lb = la;
	make_rec(&a, 20, 30, 5, REQ_ERR_NONE);
	make_rec(&b, 0, 5, 0, REQ_ERR_UPSTREAM_RESET);
	paired_link_finish(&la, &a, false, "chat", "primary");
	paired_link_finish(&lb, &b, true, "chat", "shadow");
	/* the shadow abandoned unrecorded: nothing at all */
	la = paired_link_new();
	lb = la;
	paired_link_drop(&lb);
	assert_null(lb);
	paired_link_finish(&la, &a, false, "chat", "primary");
	paired_link_drop(&la); /* a cleared pointer: nothing */
	paired_link_drop(NULL);
	/* a non-streamed shadow: no token, so no ttft and no token count */
	la = paired_link_new();
	lb = la;
	make_rec(&b, 0, 31, 0, REQ_ERR_NONE);
	paired_link_finish(&lb, &b, true, "chat", "shadow");
	paired_link_finish(&la, &a, false, "chat", "primary");
	assert_int_equal(paired_snapshot(NULL, &v, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(v[0].pairs, 1);
	assert_int_equal(v[0].errors_shadow, 1);
	assert_int_equal(v[0].errors_primary, 0);
	assert_int_equal(v[0].metric[PM_TTFT].n, 0);
	assert_int_equal(v[0].metric[PM_OUTPUT_TOKENS].n, 0);
	assert_int_equal(v[0].metric[PM_E2E].n, 1); /* e2e both sides have */
	free(v);
}

static void test_window_and_bound(void **state)
{
	struct paired_view *v;
	size_t n;
	char name[32];
	(void)state;
	paired_reset();
	for (int i = 0; i < PAIRED_WINDOW + 10; i++)
		pair("chat", "shadow", 10 + i, 12 + i, i & 1);
	for (int i = 0; i < PAIRED_SERIES_MAX + 3; i++) {
		snprintf(name, sizeof(name), "s%d", i);
		pair("other", name, 10, 20, false);
	}
	assert_int_equal(paired_snapshot("chat", &v, &n), 0);
	assert_int_equal(n, 1);
	const struct paired_view *s = find(v, n, "shadow");
	assert_non_null(s);
	assert_int_equal(s->pairs, PAIRED_WINDOW + 10);
	assert_int_equal(s->metric[PM_TTFT].n, PAIRED_WINDOW);
	/* the oldest ten left; the window is in order */
	assert_true(fabs(s->metric[PM_TTFT].a[0] - 20) < 1e-6);
	assert_true(fabs(s->metric[PM_TTFT].a[PAIRED_WINDOW - 1] - (10 + PAIRED_WINDOW + 9)) < 1e-6);
	/* 2 ms apart, over 1 % while ttft is under 200: called early; every pair counted */
	assert_int_equal(s->metric[PM_TTFT].seq.pairs, PAIRED_WINDOW + 10);
	assert_int_equal(s->metric[PM_TTFT].seq.verdict, 1);
	free(v);
	assert_int_equal(paired_snapshot(NULL, &v, &n), 0);
	assert_int_equal(n, PAIRED_SERIES_MAX); /* 1 + 63 of "other"; the rest dropped */
	assert_int_equal(paired_dropped(), 4);
	free(v);
	paired_reset();
}

/* Called by the rule, shown only while the shift is material and agrees. */
static void test_verdict_rule(void **state)
{
	struct seqsign s = { 0 };
	(void)state;
	s.verdict = 1;
	s.since = 20;
	assert_int_equal(paired_verdict(&s, 2.0, 20, PM_TTFT), 1);
	assert_int_equal(paired_verdict(&s, 0.5, 20, PM_TTFT), 0);  /* under the 1 ms floor */
	assert_int_equal(paired_verdict(&s, 1.5, 200, PM_TTFT), 0); /* under 1 % of 200 */
	assert_int_equal(paired_verdict(&s, -2.0, 20, PM_TTFT), 0); /* the other way */
	assert_int_equal(paired_verdict(&s, 0.5, 20, PM_OUTPUT_TOKENS), 1);
	s.verdict = 0;
	assert_int_equal(paired_verdict(&s, 5, 20, PM_TTFT), 0);
	assert_string_equal(paired_verdict_name(1, PM_TTFT), "A faster");
	assert_string_equal(paired_verdict_name(-1, PM_E2E), "B faster");
	assert_string_equal(paired_verdict_name(1, PM_OUTPUT_TOKENS), "B more");
	assert_string_equal(paired_verdict_name(0, PM_TTFT), "undecided");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_either_order),
		cmocka_unit_test(test_errors_and_drops),
		cmocka_unit_test(test_window_and_bound),
		cmocka_unit_test(test_verdict_rule),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
