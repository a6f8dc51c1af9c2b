/*
 * bench_session.c — multi-turn conversations over shared system prompts
 * (--sessions): the workload of a chat service, whose requests share long
 * prefixes that a prefix cache, and a router that knows of it, can use.
 *
 * Request number seq is turn t of session s, in rounds over the sessions,
 * round t rotated by c_t: position i of the round is session (i - c_t) mod S.
 *
 *   seq:      0    1   ..  S-1 |  S      S+1     ..  2S-1 | ... | S*T ...
 *   session:  0    1   ..  S-1 |  -c_1   1-c_1   ..  (mod S) | ... | S (new ones)
 *   turn:     0    0   ..  0   |  1      1       ..  1    | ... | 0
 *
 * c_0 = 0 and each step c_(t+1) - c_t is drawn from the seed in [S/2, S):
 * the rotation keeps the order from lining up with a round robin over
 * replicas (with S a multiple of their count, a fixed order would send a
 * session to the same replica every turn), and the step's size keeps a
 * session's next turn at least S/2 requests after its previous one, so
 * with at most S/2 in flight it is sent after that turn's answer has
 * ended. Session s opens with system prompt k(s), drawn from the seed
 * among the K; turn t resends the whole history: the system prompt, then
 * user turn 0, answer 0, ..., user turn t. The answers are synthetic text
 * of the length asked for at that turn, not what the server sent back, so
 * the whole workload is a pure function of the seed and seq
 * (a server's cache of the tokens it generated does not help; its cache of
 * the previous turn's prompt does).
 *
 * Invariant: every text is prompt_text_add()'s, a pure function of (seed,
 * its own salt, its index), so equal histories give equal bytes on every
 * target and in every round run with the same seed.
 */
#include "bench.h"

#include <event2/buffer.h>

#define SALT_SYSTEM 0x73797374656d2121ull
#define SALT_SYSTEM_LEN 0x6c656e6774682121ull
#define SALT_USER 0x7573657274757221ull
#define SALT_ANSWER 0x616e737765722121ull

/* A turn's index among all turns of all sessions, for its lengths and text. */
static uint64_t turn_index(const struct bench_opts *o, uint64_t session, unsigned turn)
{
	return session * o->turns + turn;
}

static uint32_t system_len(const struct bench_opts *o, unsigned k)
{
	return dist_draw(&o->system_len, o->seed ^ SALT_SYSTEM_LEN, k, 1);
}

static uint32_t user_len(const struct bench_opts *o, uint64_t session, unsigned turn)
{
	return dist_draw(&o->input_len, o->seed ^ 0x1f2e3d4cu, turn_index(o, session, turn), 1);
}

static uint32_t answer_len(const struct bench_opts *o, uint64_t session, unsigned turn)
{
	return dist_draw(&o->output_len, o->seed ^ 0x5a6b7c8du, turn_index(o, session, turn), 1);
}

void session_turn_of(const struct bench_opts *o, uint64_t seq, struct session_turn *st)
{
	uint64_t S = o->sessions, per_round = S * o->turns, r = seq % per_round, epoch = seq / per_round;
	uint64_t in = 0, c = 0, half = (S + 1) / 2;
	struct rng g;

	st->turn = (unsigned)(r / S);
	rng_seed(&g, o->seed ^ 0x726f756e64732121ull ^ (epoch * 0x9e3779b97f4a7c15ull));
	for (unsigned t = 0; t < st->turn; t++)
		c += S > 2 ? half + rng_next(&g) % (S - half) : 0;
	st->session = epoch * S + (r % S + S - c % S) % S;
	/* drawn, not s mod K: with K and S multiples of the replicas' count,
	 * a round robin would bring every session of a system prompt to the
	 * same replica within a round */
	rng_seed(&g, o->seed ^ SALT_SYSTEM ^ (st->session * 0x9e3779b97f4a7c15ull));
	st->system = (unsigned)(rng_next(&g) % o->system_prompts);
	in = system_len(o, st->system);
	for (unsigned t = 0; t < st->turn; t++)
		in += (uint64_t)user_len(o, st->session, t) + answer_len(o, st->session, t);
	in += user_len(o, st->session, st->turn);
	st->in_len = in > UINT32_MAX ? UINT32_MAX : (uint32_t)in;
	st->out_len = answer_len(o, st->session, st->turn);
}

static void message_add(struct evbuffer *b, const char *role, bool first)
{
	evbuffer_add_printf(b, "%s{\"role\":\"%s\",\"content\":\"", first ? "" : ",", role);
}

void session_body_add(struct evbuffer *b, const struct bench_opts *o, const struct session_turn *st)
{
	bool chat = o->api != BAPI_OPENAI_COMPLETIONS && o->api != BAPI_OLLAMA_GENERATE;
	bool system_apart = o->api == BAPI_ANTHROPIC; /* a top-level field, not a message */
	uint32_t slen = system_len(o, st->system);

	if (!chat) {
		/* one prompt: the history's texts back to back */
		evbuffer_add_printf(b, "\"prompt\":\"");
		prompt_text_add(b, slen, o->seed ^ SALT_SYSTEM, st->system);
		for (unsigned t = 0; t <= st->turn; t++) {
			prompt_text_add(b, user_len(o, st->session, t), o->seed ^ SALT_USER,
					turn_index(o, st->session, t));
			if (t < st->turn)
				prompt_text_add(b, answer_len(o, st->session, t), o->seed ^ SALT_ANSWER,
						turn_index(o, st->session, t));
		}
		evbuffer_add_printf(b, "\"");
		return;
	}
	if (system_apart) {
		evbuffer_add_printf(b, "\"system\":\"");
		prompt_text_add(b, slen, o->seed ^ SALT_SYSTEM, st->system);
		evbuffer_add_printf(b, "\",");
	}
	evbuffer_add_printf(b, o->api == BAPI_OPENAI_RESPONSES ? "\"input\":[" : "\"messages\":[");
	if (!system_apart) {
		message_add(b, "system", true);
		prompt_text_add(b, slen, o->seed ^ SALT_SYSTEM, st->system);
		evbuffer_add_printf(b, "\"}");
	}
	for (unsigned t = 0; t <= st->turn; t++) {
		message_add(b, "user", system_apart && t == 0);
		prompt_text_add(b, user_len(o, st->session, t), o->seed ^ SALT_USER, turn_index(o, st->session, t));
		evbuffer_add_printf(b, "\"}");
		if (t < st->turn) {
			message_add(b, "assistant", false);
			prompt_text_add(b, answer_len(o, st->session, t), o->seed ^ SALT_ANSWER,
					turn_index(o, st->session, t));
			evbuffer_add_printf(b, "\"}");
		}
	}
	evbuffer_add_printf(b, "]");
}
