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
	/* Where a response's TTFT may start: the client asks for a response
	 * (response.create) or ends its audio turn (input_audio_buffer.commit);
	 * with server-side turn detection the server says the speech stopped
	 * (input_audio_buffer.speech_stopped), then commits the turn
	 * (input_audio_buffer.committed) and creates the response itself. */
	RT_CREATE,	   /* client: response.create */
	RT_COMMIT,	   /* client: input_audio_buffer.commit */
	RT_SPEECH_STOPPED, /* server: input_audio_buffer.speech_stopped */
	RT_COMMITTED,	   /* server: input_audio_buffer.committed */
	RT_CREATED,	   /* server: response.created */
	RT_DELTA,	   /* server: a text, audio or transcript delta (a token event) */
	RT_DONE,	   /* server: response.done (usage, status) */
	RT_ERROR,	   /* server: error */
};

/* The event's type as the wire names it, for RT_CREATE .. RT_CREATED
 * (static text); NULL for the others. */
const char *realtime_start_name(enum rt_event ev);

/*
 * Classifies one message: `msg` its first `len` bytes, `whole` when that is
 * all of it. From the client (`from_client`) or the server. RT_DONE of a
 * whole message also fills `usage` (input, output and cached tokens; the
 * outcome from response.status: failed, incomplete; cancelled counts as
 * incomplete); fields it lacks stay as they were.
 */
enum rt_event realtime_event(const char *msg, size_t len, bool whole, bool from_client, struct usage *usage);
