/*
 * test_realtime.c — a realtime session's events (realtime.c): each kind
 * from its top-level type, either direction; a nested "type" before the
 * top-level one skipped; the names of the events a TTFT starts at; a message cut short still classified by its
 * prefix; response.done's usage and status read only from a whole message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "realtime.h"

static enum rt_event ev(const char *s, bool client)
{
	struct usage u = USAGE_UNKNOWN;
	return realtime_event(s, strlen(s), true, client, &u);
}

static void test_kinds(void **state)
{
	(void)state;
	assert_int_equal(ev("{\"type\":\"response.create\",\"response\":{}}", true), RT_CREATE);
	assert_int_equal(ev("{\"event_id\":\"e\", \"type\" : \"input_audio_buffer.commit\"}", true), RT_COMMIT);
	assert_int_equal(ev("{\"type\":\"input_audio_buffer.append\",\"audio\":\"AAAA\"}", true), RT_OTHER);
	assert_int_equal(ev("{\"type\":\"response.create\"}", false), RT_OTHER); /* not from a server */
	assert_int_equal(ev("{\"type\":\"input_audio_buffer.commit\"}", false), RT_OTHER);
	assert_int_equal(ev("{\"type\":\"input_audio_buffer.committed\"}", false), RT_COMMITTED);
	assert_int_equal(ev("{\"type\":\"input_audio_buffer.committed\"}", true), RT_OTHER); /* not from a client */
	assert_int_equal(ev("{\"type\":\"input_audio_buffer.speech_stopped\",\"audio_end_ms\":900}", false),
			 RT_SPEECH_STOPPED);
	assert_int_equal(ev("{\"type\":\"input_audio_buffer.speech_started\"}", false), RT_OTHER);
	assert_int_equal(ev("{\"type\":\"response.created\",\"response\":{}}", false), RT_CREATED);
	assert_int_equal(ev("{\"type\":\"response.output_audio_transcript.delta\"}", false), RT_DELTA);
	assert_int_equal(ev("{\"type\":\"response.output_audio.done\"}", false), RT_OTHER);
	assert_int_equal(ev("{\"type\":\"response.text.delta\",\"delta\":\"a\"}", false), RT_DELTA);
	assert_int_equal(ev("{\"type\":\"response.output_text.delta\"}", false), RT_DELTA);
	assert_int_equal(ev("{\"type\":\"response.audio.delta\"}", false), RT_DELTA);
	assert_int_equal(ev("{\"type\":\"response.output_audio.delta\"}", false), RT_DELTA);
	assert_int_equal(ev("{\"type\":\"response.audio_transcript.delta\"}", false), RT_DELTA);
	assert_int_equal(ev("{\"type\":\"response.text.delta\"}", true), RT_OTHER);
	assert_int_equal(ev("{\"type\":\"response.text.done\"}", false), RT_OTHER);
	assert_int_equal(ev("{\"type\":\"error\",\"error\":{}}", false), RT_ERROR);
	assert_int_equal(ev("{\"type\":\"session.created\"}", false), RT_OTHER);
	/* the top level's, not a nested one's */
	assert_int_equal(ev("{\"item\":{\"type\":\"response.create\"},\"type\":\"conversation.item.create\"}", true),
			 RT_OTHER);
	assert_int_equal(ev("{\"a\":[{\"type\":\"x\"}],\"type\":\"response.output_text.delta\"}", false), RT_DELTA);
	/* a string value that looks like a key is not one */
	assert_int_equal(ev("{\"a\":\"type\",\"type\":\"response.done\"}", false), RT_DONE);
	assert_int_equal(ev("[\"type\"]", false), RT_OTHER);
	assert_int_equal(ev("", false), RT_OTHER);
	assert_int_equal(ev("{\"type\":", false), RT_OTHER);
}

static void test_start_names(void **state)
{
	(void)state;
	assert_string_equal(realtime_start_name(RT_CREATE), "response.create");
	assert_string_equal(realtime_start_name(RT_COMMIT), "input_audio_buffer.commit");
	assert_string_equal(realtime_start_name(RT_SPEECH_STOPPED), "input_audio_buffer.speech_stopped");
	assert_string_equal(realtime_start_name(RT_COMMITTED), "input_audio_buffer.committed");
	assert_string_equal(realtime_start_name(RT_CREATED), "response.created");
	assert_null(realtime_start_name(RT_DELTA));
	assert_null(realtime_start_name(RT_OTHER));
}

static void test_cut_and_usage(void **state)
{
	static const char done[] =
		"{\"type\":\"response.done\",\"response\":{\"status\":\"completed\",\"output\":[],"
		"\"usage\":{\"total_tokens\":16,\"input_tokens\":11,\"output_tokens\":5,"
		"\"input_token_details\":{\"cached_tokens\":3}}}}";
	struct usage u = USAGE_UNKNOWN;
	(void)state;

	/* an audio delta cut at any point past its type still counts */
	static const char audio[] = "{\"type\":\"response.audio.delta\",\"delta\":\"AAAAAAAA\"}";
	for (size_t n = 30; n < sizeof(audio) - 1; n++)
		assert_int_equal(realtime_event(audio, n, false, false, &u), RT_DELTA);
	assert_int_equal(realtime_event(done, sizeof(done) - 1, false, false, &u), RT_DONE);
	assert_int_equal(u.input_tokens, -1); /* cut: no usage read */
	assert_int_equal(realtime_event(done, sizeof(done) - 1, true, false, &u), RT_DONE);
	assert_int_equal(u.input_tokens, 11);
	assert_int_equal(u.output_tokens, 5);
	assert_int_equal(u.cached_tokens, 3);
	assert_int_equal(u.outcome, OUTCOME_NONE);
	struct usage f = USAGE_UNKNOWN;
	const char *failed = "{\"type\":\"response.done\",\"response\":{\"status\":\"failed\"}}";
	assert_int_equal(realtime_event(failed, strlen(failed), true, false, &f), RT_DONE);
	assert_int_equal(f.outcome, OUTCOME_FAILED);
	assert_int_equal(f.output_tokens, -1);
	struct usage c = USAGE_UNKNOWN;
	const char *cancelled = "{\"type\":\"response.done\",\"response\":{\"status\":\"cancelled\"}}";
	assert_int_equal(realtime_event(cancelled, strlen(cancelled), true, false, &c), RT_DONE);
	assert_int_equal(c.outcome, OUTCOME_INCOMPLETE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kinds),
		cmocka_unit_test(test_start_names),
		cmocka_unit_test(test_cut_and_usage),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
