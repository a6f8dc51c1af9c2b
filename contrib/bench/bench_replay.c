/*
 * bench_replay.c — `--replay FILE`: a trace in the Mooncake shape (tokentap's
 * workload capture, docs/workload.md, or any JSONL with `timestamp` in ms,
 * `input_length`, `output_length`, `hash_ids`) read, sorted by arrival and
 * scaled by --speed; and the prompt text of each request made from its hash
 * ids, so that requests whose ids share a prefix get text sharing a prefix.
 *
 * Each hash id stands for one block of --block-tokens tokens: its text is a
 * pure function of (seed, id), 4 bytes a token as the simulator counts. A
 * request's prompt is its blocks' text in order, cut or padded (with text of
 * its own) to exactly input_length tokens.
 */
#include "bench.h"

#include <errno.h>
#include <event2/buffer.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

static int cmp_entry(const void *a, const void *b)
{
	const struct replay_entry *x = a, *y = b;
	if (x->t_ms != y->t_ms)
		return x->t_ms < y->t_ms ? -1 : 1;
	return x->line < y->line ? -1 : x->line > y->line;
}

static void replay_clear(struct replay *rp)
{
	for (size_t i = 0; i < rp->n; i++)
		free(rp->e[i].ids);
	free(rp->e);
	rp->e = NULL;
	rp->n = 0;
}

void replay_free(struct replay *rp)
{
	if (rp)
		replay_clear(rp);
}

/* A whole number from 0 to max in `o[key]`; -1 when absent or another type. */
static int64_t field_uint(json_t *o, const char *key, int64_t max)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
		return -1;
	return json_integer_value(v);
}

int replay_load(struct replay *rp, const char *path, double speed, uint64_t limit, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, alloc = 0, lineno = 0;
	ssize_t len;
	int rc = -1;

	memset(rp, 0, sizeof(*rp));
	if (!f) {
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	while ((len = getline(&line, &cap, f)) != -1) {
		json_error_t je;
		json_t *o, *ids;
		struct replay_entry e = { 0 };
		int64_t ts, in, out;

		lineno++;
		if (strspn(line, " \t\r\n") == (size_t)len)
			continue;
		o = json_loadb(line, (size_t)len, 0, &je);
		ts = o ? field_uint(o, "timestamp", INT64_MAX / 2) : -1;
		in = o ? field_uint(o, "input_length", BENCH_MAX_LEN) : -1;
		out = o ? field_uint(o, "output_length", BENCH_MAX_LEN) : -1;
		ids = o ? json_object_get(o, "hash_ids") : NULL;
		if (!o || ts < 0 || in < 0 || out < 0 || (ids && !json_is_array(ids))) {
			snprintf(err, errlen,
				 "%s line %zu: expected a JSON object with timestamp (ms), input_length and "
				 "output_length as whole numbers (up to %u tokens) and hash_ids as an array",
				 path, lineno, BENCH_MAX_LEN);
			json_decref(o);
			goto out;
		}
		e.t_ms = (uint64_t)ts;
		e.in_len = (uint32_t)in;
		e.out_len = (uint32_t)(out ? out : 1); /* max_tokens 0 is refused by servers */
		e.line = lineno;
		e.nids = ids ? (uint32_t)json_array_size(ids) : 0;
		if (e.nids) {
			e.ids = malloc(e.nids * sizeof(*e.ids));
			if (!e.ids) {
				json_decref(o);
				snprintf(err, errlen, "out of memory");
				goto out;
			}
			for (uint32_t i = 0; i < e.nids; i++) {
				json_t *id = json_array_get(ids, i);
				if (!json_is_integer(id) || json_integer_value(id) < 0) {
					snprintf(err, errlen,
						 "%s line %zu: hash_ids[%u] is not a whole number of 0 or more", path,
						 lineno, i);
					free(e.ids);
					json_decref(o);
					goto out;
				}
				e.ids[i] = (uint64_t)json_integer_value(id);
			}
		}
		json_decref(o);
		if (rp->n == alloc) {
			size_t na = alloc ? alloc * 2 : 256;
			struct replay_entry *ne = realloc(rp->e, na * sizeof(*ne));
			if (!ne) {
				free(e.ids);
				snprintf(err, errlen, "out of memory");
				goto out;
			}
			rp->e = ne;
			alloc = na;
		}
		rp->e[rp->n++] = e;
	}
	if (!rp->n) {
		snprintf(err, errlen, "%s holds no requests", path);
		goto out;
	}
	qsort(rp->e, rp->n, sizeof(*rp->e), cmp_entry);
	if (limit && limit < rp->n) {
		for (size_t i = limit; i < rp->n; i++)
			free(rp->e[i].ids);
		rp->n = limit;
	}
	/* offsets from the first arrival, scaled; a replay longer than any
	 * duration tokentap takes is refused rather than waited for */
	uint64_t t0 = rp->e[0].t_ms;
	double span_ms = (double)(rp->e[rp->n - 1].t_ms - t0) / speed;
	if (span_ms > (double)DURATION_MAX_MS) {
		snprintf(err, errlen,
			 "%s: its arrivals span %.0f ms (line %zu's timestamp %llu after line %zu's %llu), a replay "
			 "of %.3g h at --speed %g: the longest replay is " DURATION_MAX_TEXT,
			 path, (double)(rp->e[rp->n - 1].t_ms - t0), rp->e[rp->n - 1].line,
			 (unsigned long long)rp->e[rp->n - 1].t_ms, rp->e[0].line, (unsigned long long)t0,
			 span_ms / 3600000.0, speed);
		goto out;
	}
	for (size_t i = 0; i < rp->n; i++)
		rp->e[i].t_ns = (uint64_t)llround((double)(rp->e[i].t_ms - t0) * 1e6 / speed);
	rc = 0;
out:
	free(line);
	fclose(f);
	if (rc == -1)
		replay_clear(rp);
	return rc;
}

void replay_prompt_add(struct evbuffer *out, const struct replay *rp, uint64_t seq, uint64_t seed)
{
	const struct replay_entry *e = &rp->e[seq];
	size_t left = (size_t)e->in_len * BENCH_BYTES_PER_TOKEN;
	size_t block = (size_t)rp->block_tokens * BENCH_BYTES_PER_TOKEN;
	struct evbuffer *tmp = evbuffer_new();

	for (uint32_t i = 0; i < e->nids && left && tmp; i++) {
		size_t take = block < left ? block : left;
		/* the block's text: the same for the same id in every request */
		prompt_text_add(tmp, rp->block_tokens, seed ^ 0x7a3c11d5u, e->ids[i]);
		evbuffer_remove_buffer(tmp, out, take);
		evbuffer_drain(tmp, evbuffer_get_length(tmp));
		left -= take;
	}
	evbuffer_free(tmp);
	/* past its blocks (a trace's input_length beyond them): text of its own,
	 * whole tokens */
	if (left)
		prompt_text_add(out, (uint32_t)(left / BENCH_BYTES_PER_TOKEN), seed ^ 0x3e5f00a1u,
				((uint64_t)1 << 63) | seq);
}
