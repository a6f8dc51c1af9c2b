/*
 * framer_bench.c — framer_feed() per event, on the bytes a proxy reading an
 * OpenAI chat stream sees: vLLM-shaped chunks, one SSE event each, fed
 *   - one event per feed (each event its own HTTP chunk, as llhttp hands
 *     the body over when the upstream writes one event per chunk), and
 *   - sixteen events per feed (one slice holding many events);
 * with LF line ends and with CRLF. Prints ns per event for each (wall
 * clock: compare builds on a quiet machine, or run it under
 * `valgrind --tool=callgrind` for instruction counts, which load does not
 * move; `framer_bench ROUNDS K` runs only the K-th of the four, 0-3). Not a test: run it by hand; exits 1 if an event
 * is lost.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "framer.h"

#define EVENTS 512

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void on_event(void *arg, const struct framer_event *ev)
{
	size_t *n = arg;
	*n += ev->data_len != 0;
}

/* EVENTS chat chunks; off[i] is where event i starts, off[EVENTS] the end. */
static char *build(const char *eol, size_t *off)
{
	size_t cap = EVENTS * 512, n = 0;
	char *s = malloc(cap);
	for (int i = 0; i < EVENTS; i++) {
		off[i] = n;
		n += (size_t)snprintf(
			s + n, cap - n,
			"data: {\"id\":\"chatcmpl-8c5a1e0f2b3d4e5f\",\"object\":\"chat.completion.chunk\","
			"\"created\":1751642570,\"model\":\"sim-model\",\"choices\":[{\"index\":0,"
			"\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}]}%s%s",
			i % 3 ? " word" : " longer-word", eol, eol);
	}
	off[EVENTS] = n;
	return s;
}

static int run(const char *label, const char *eol, int per_feed, int rounds)
{
	size_t off[EVENTS + 1];
	char *s = build(eol, off);
	size_t got = 0;
	double t0 = now_ns();
	for (int r = 0; r < rounds; r++) {
		struct framer f;
		framer_init(&f, FRAMER_SSE, 0, on_event, &got);
		for (int i = 0; i < EVENTS; i += per_feed) {
			int j = i + per_feed < EVENTS ? i + per_feed : EVENTS;
			framer_feed(&f, s + off[i], off[j] - off[i]);
		}
		framer_finish(&f);
		framer_free(&f);
	}
	double ns = (now_ns() - t0) / ((double)rounds * EVENTS);
	printf("framer_feed %-5s %2d event(s) per feed: %7.2f ns/event\n", label, per_feed, ns);
	free(s);
	return got == (size_t)rounds * EVENTS ? 0 : 1;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 2000;
	int only = argc > 2 ? atoi(argv[2]) : -1; /* one of the four, 0-3, for callgrind */
	if (rounds < 1)
		rounds = 1;
	int bad = 0;
	if (only < 0 || only == 0)
		bad |= run("LF", "\n", 1, rounds);
	if (only < 0 || only == 1)
		bad |= run("LF", "\n", 16, rounds);
	if (only < 0 || only == 2)
		bad |= run("CRLF", "\r\n", 1, rounds);
	if (only < 0 || only == 3)
		bad |= run("CRLF", "\r\n", 16, rounds);
	if (bad)
		fprintf(stderr, "framer_bench: events lost\n");
	return bad;
}
