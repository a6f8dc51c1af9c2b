/*
 * realtime.c — a realtime session's event, from its message's "type"
 * (realtime.h). The type is read by a scan of the message's top level
 * (a "type" key nested before it, in an object or array, is skipped), so
 * a message cut at RT_MSG_MAX still classifies; only response.done is
 * parsed whole, for its usage.
 */
#include "realtime.h"

#include <jansson.h>
#include <string.h>

/* The top-level "type" string of a JSON object, without unescaping (event
 * names have no escapes): *n its length; NULL when none is found in the
 * bytes at hand. */
static const char *top_type(const char *s, size_t len, size_t *n)
{
	size_t i = 0;
	int depth = 0;
	bool key_next = false; /* at depth 1: the next string is a key */

	while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
		i++;
	if (i >= len || s[i] != '{')
		return NULL;
	for (; i < len; i++) {
		char c = s[i];
		if (c == '{' || c == '[') {
			depth++;
			key_next = depth == 1 && c == '{';
		} else if (c == '}' || c == ']') {
			depth--;
			if (depth <= 0)
				return NULL;
		} else if (c == ',' && depth == 1) {
			key_next = true;
		} else if (c == '"') {
			size_t start = ++i;
			while (i < len && s[i] != '"')
				i += s[i] == '\\' ? 2 : 1;
			if (i >= len)
				return NULL;
			if (depth == 1 && key_next) {
				key_next = false;
				if (i - start == 4 && memcmp(s + start, "type", 4) == 0) {
					size_t j = i + 1;
					while (j < len && (s[j] == ' ' || s[j] == ':' || s[j] == '\t'))
						j++;
					if (j >= len || s[j] != '"')
						return NULL;
					size_t v = ++j;
					while (j < len && s[j] != '"' && s[j] != '\\')
						j++;
					if (j >= len || s[j] != '"')
						return NULL;
					*n = j - v;
					return s + v;
				}
			}
		}
	}
	return NULL;
}

static bool is(const char *t, size_t n, const char *name)
{
	return strlen(name) == n && memcmp(t, name, n) == 0;
}

static void int_member(json_t *obj, const char *key, int64_t *out)
{
	json_t *v = json_object_get(obj, key);
	if (json_is_integer(v) && json_integer_value(v) >= 0)
		*out = json_integer_value(v);
}

static void done_usage(const char *msg, size_t len, struct usage *usage)
{
	json_t *root = json_loadb(msg, len, 0, NULL);
	json_t *resp = json_object_get(root, "response");
	json_t *u = json_object_get(resp, "usage");
	const char *status = json_string_value(json_object_get(resp, "status"));

	if (json_is_object(u)) {
		int_member(u, "input_tokens", &usage->input_tokens);
		int_member(u, "output_tokens", &usage->output_tokens);
		int_member(json_object_get(u, "input_token_details"), "cached_tokens", &usage->cached_tokens);
	}
	if (status && strcmp(status, "failed") == 0)
		usage->outcome = OUTCOME_FAILED;
	else if (status && (strcmp(status, "incomplete") == 0 || strcmp(status, "cancelled") == 0) &&
		 usage->outcome < OUTCOME_INCOMPLETE)
		usage->outcome = OUTCOME_INCOMPLETE;
	json_decref(root);
}

enum rt_event realtime_event(const char *msg, size_t len, bool whole, bool from_client, struct usage *usage)
{
	size_t n = 0;
	const char *t = top_type(msg, len, &n);

	if (!t)
		return RT_OTHER;
	if (from_client) {
		if (is(t, n, "response.create"))
			return RT_CREATE;
		return is(t, n, "input_audio_buffer.commit") ? RT_COMMIT : RT_OTHER;
	}
	if (is(t, n, "input_audio_buffer.speech_stopped")) /* server-side turn detection: the turn ended */
		return RT_SPEECH_STOPPED;
	if (is(t, n, "input_audio_buffer.committed"))
		return RT_COMMITTED;
	if (is(t, n, "response.created"))
		return RT_CREATED;
	if (is(t, n, "response.text.delta") || is(t, n, "response.output_text.delta") ||
	    is(t, n, "response.audio.delta") || is(t, n, "response.output_audio.delta") ||
	    is(t, n, "response.audio_transcript.delta") || is(t, n, "response.output_audio_transcript.delta"))
		return RT_DELTA;
	if (is(t, n, "response.done")) {
		if (whole && usage)
			done_usage(msg, len, usage);
		return RT_DONE;
	}
	if (is(t, n, "error"))
		return RT_ERROR;
	return RT_OTHER;
}

const char *realtime_start_name(enum rt_event ev)
{
	switch (ev) {
	case RT_CREATE: return "response.create";
	case RT_COMMIT: return "input_audio_buffer.commit";
	case RT_SPEECH_STOPPED: return "input_audio_buffer.speech_stopped";
	case RT_COMMITTED: return "input_audio_buffer.committed";
	case RT_CREATED: return "response.created";
	default: return NULL;
	}
}
