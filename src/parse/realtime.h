/*
 * realtime.h — the events of a realtime WebSocket session (OpenAI Realtime,
 * vLLM's /v1/realtime): JSON text messages with a top-level "type"
 * (docs/dev/wire-formats.md, section (m), gives the names and their source).
 * tunnel.c hands each text message (or its first RT_MSG_MAX bytes) here and
 * measures a response from the client's request for it to the server's
 * response.done.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "classify.h"

/* The bytes of one message kept to classify it: its type comes first in
 * every event seen; a response.done longer than this is classified but its
 * usage is not read. */
#define RT_MSG_MAX (256u << 10)

enum rt_event {
	RT_OTHER = 0,
	RT_REQUEST, /* client: response.create, input_audio_buffer.commit */
	RT_DELTA,   /* server: a text, audio or transcript delta (a token event) */
	RT_DONE,    /* server: response.done (usage, status) */
	RT_ERROR,   /* server: error */
};

/*
 * Classifies one message: `msg` its first `len` bytes, `whole` when that is
 * all of it. From the client (`from_client`) or the server. RT_DONE of a
 * whole message also fills `usage` (input, output and cached tokens; the
 * outcome from response.status: failed, incomplete; cancelled counts as
 * incomplete); fields it lacks stay as they were.
 */
enum rt_event realtime_event(const char *msg, size_t len, bool whole, bool from_client, struct usage *usage);
