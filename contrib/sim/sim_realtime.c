/*
 * sim_realtime.c — GET /v1/realtime upgraded to a WebSocket (RFC 6455), an
 * OpenAI-Realtime-shaped text session: session.created on open, and per
 * client response.create the events of one response, named as the GA API
 * names them: response.created, response.output_item.added,
 * response.content_part.added, one response.output_text.delta per token
 * (the first --ttft-ms after the response.create arrived, the rest
 * --itl-ms apart, response.max_output_tokens of them, else --tokens;
 * x-sim-ttft-ms / x-sim-itl-ms / x-sim-tokens on the handshake override),
 * the .done events and response.done with usage.
 * response.cancel ends the response in progress as "cancelled"; a second
 * response.create while one runs gets the API's error event. Audio in:
 * input_audio_buffer.append / .commit / .clear; with server VAD turned on
 * by session.update, the silence after a turn's last append ends it
 * (speech_stopped, committed) and creates its response, and speech during
 * a response cancels it. Audio out (the session's or the response's
 * output_modalities): per token a base64 PCM16 response.output_audio.delta
 * and a response.output_audio_transcript.delta. docs/simulator.md
 * ("Realtime sessions") has the details. Pings are answered with pongs, a
 * close frame with a close frame, then the socket is closed.
 *
 * sim_conn.c hands the connection over (sim_realtime_take) once it has
 * parsed the handshake; from then on this file owns the bufferevent.
 *
 * Invariants: a session's bytes after the 101 are a pure function of
 * (--seed, the handshake's query, the client's messages, the overrides):
 * ids count up, words and audio bytes come from a PRNG seeded by them;
 * audio times (audio_start_ms, audio_end_ms) count the audio appended,
 * not the clock; under server VAD, where a turn ends and where speech cuts
 * a response short also depend on when the appends come. A token is drawn
 * only while the output holds under RT_HIGH_WATER bytes (a stalled client
 * stalls generation). A session is freed from a zero-delay event, never
 * inside its own callbacks.
 */
#include "sim.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <jansson.h>
#include <openssl/evp.h>

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define RT_HIGH_WATER (64 * 1024)
#define RT_LOW_WATER (16 * 1024)
#define RT_MAX_MESSAGE (16 * 1024 * 1024) /* client message, all fragments */
#define RT_AUDIO_CHUNK 2400		  /* output PCM16 bytes per token: 50 ms at 24 kHz */
#define RT_AUDIO_BYTES_PER_MS 48	  /* input PCM16 at 24 kHz, mono */
#define RT_AUDIO_BYTES_PER_TOKEN 4800	  /* input audio tokens: one per 100 ms */
#define RT_VAD_SILENCE_MS 500		  /* silence_duration_ms when turn_detection names none */

struct rt_sess {
	struct bufferevent *bev;
	struct event *tick, *reaper;
	struct event *vad;     /* server VAD: the silence after the last append */
	struct evbuffer *msg;  /* the data message being reassembled */
	struct evbuffer *text; /* the answer so far, for the .done events */
	bool in_msg;	       /* a fragmented message is open */
	bool closing;	       /* a close frame is sent: end once drained */
	bool dead;
	bool counted; /* the handshake is in sim_stats.requests */
	char *model_json;
	uint64_t ttft_ns, itl_ns;
	int64_t tokens;	      /* x-sim-tokens, -1 none */
	uint64_t path_hash;   /* of the handshake's query: folds into every PRNG */
	uint64_t event_no;    /* event_id counter */
	uint64_t responses;   /* responses started */
	uint64_t input_bytes; /* client text since the last response began */
	/* audio in: the buffer not yet committed, all appended (the session's
	 * audio clock), the committed turns' tokens not yet in a response */
	uint64_t audio_buf, audio_total, audio_tokens;
	uint64_t items;	    /* user items made from the audio buffer */
	char turn_item[32]; /* the item of the turn being spoken */
	bool audio_session; /* the session's output_modalities name "audio" */
	/* server VAD (session.update's turn_detection) */
	bool vad_on, vad_create, vad_interrupt, speaking;
	bool queued; /* a turn ended during a response: its response comes next */
	uint64_t silence_ms;
	/* the response in progress */
	bool active, stalled;
	bool audio; /* audio out: an audio and a transcript delta per token */
	struct sim_prng prng;
	uint64_t n_in, n_in_audio, n_out, sent, deadline_ns;
	char resp_id[32], item_id[32];
};

/* ---- frames ---- */

/* One unmasked server frame. */
static void ws_frame(struct rt_sess *s, unsigned op, const void *p, size_t n)
{
	struct evbuffer *out = bufferevent_get_output(s->bev);
	unsigned char h[10];
	size_t hl = 2;

	h[0] = (unsigned char)(0x80 | op);
	if (n < 126) {
		h[1] = (unsigned char)n;
	} else if (n < 65536) {
		h[1] = 126;
		h[2] = (unsigned char)(n >> 8);
		h[3] = (unsigned char)n;
		hl = 4;
	} else {
		h[1] = 127;
		for (int i = 0; i < 8; i++)
			h[2 + i] = (unsigned char)((uint64_t)n >> (56 - 8 * i));
		hl = 10;
	}
	evbuffer_add(out, h, hl);
	evbuffer_add(out, p, n);
	sim_stats.bytes_sent += hl + n;
}

/* The event in b (its closing brace still to add) as one text frame. */
static void send_event(struct rt_sess *s, struct evbuffer *b)
{
	evbuffer_add(b, "}", 1);
	ws_frame(s, 1, evbuffer_pullup(b, -1), evbuffer_get_length(b));
	evbuffer_drain(b, evbuffer_get_length(b));
}

/* Opens event `type` in b: {"type":..,"event_id":.. */
static void event_open(struct rt_sess *s, struct evbuffer *b, const char *type)
{
	evbuffer_add_printf(b, "{\"type\":\"%s\",\"event_id\":\"event_sim%016" PRIx64 "\"", type,
			    sim_mix(sim_cfg.seed ^ s->path_hash ^ ++s->event_no));
}

static void send_close(struct rt_sess *s, uint16_t code, const char *reason)
{
	unsigned char p[125];
	size_t n = strlen(reason) < 123 ? strlen(reason) : 123;

	if (s->closing)
		return;
	p[0] = (unsigned char)(code >> 8);
	p[1] = (unsigned char)code;
	memcpy(p + 2, reason, n);
	ws_frame(s, 8, p, n + 2);
	s->closing = true;
	s->active = false;
	event_del(s->tick);
	bufferevent_setwatermark(s->bev, EV_WRITE, 0, 0); /* the write callback once all has left */
}

/* ---- lifetime ---- */

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
	struct rt_sess *s = arg;

	(void)fd;
	(void)what;
	event_free(s->tick);
	event_free(s->reaper);
	event_free(s->vad);
	bufferevent_free(s->bev);
	evbuffer_free(s->msg);
	evbuffer_free(s->text);
	free(s->model_json);
	free(s);
	sim_stats.open_connections--;
}

/* Ends the session; client_left: the client went away (EOF, error). */
static void sess_kill(struct rt_sess *s, bool client_left)
{
	if (s->dead)
		return;
	s->dead = true;
	if (client_left && s->active) {
		sim_stats.last_abort_ns = sim_now_ns();
		if (s->counted)
			sim_stats.aborted++;
	} else if (s->counted) {
		sim_stats.completed++;
	}
	event_del(s->tick);
	event_del(s->vad);
	bufferevent_disable(s->bev, EV_READ | EV_WRITE);
	bufferevent_setcb(s->bev, NULL, NULL, NULL, NULL);
	event_active(s->reaper, EV_TIMEOUT, 1);
}

/* ---- a response ---- */

static void response_object(struct rt_sess *s, struct evbuffer *b, const char *status, bool done)
{
	size_t tlen = evbuffer_get_length(s->text);

	evbuffer_add_printf(b,
			    ",\"response\":{\"object\":\"realtime.response\",\"id\":\"%s\",\"status\":\"%s\","
			    "\"status_details\":null,\"output\":[",
			    s->resp_id, status);
	if (done) {
		evbuffer_add_printf(b,
				    "{\"id\":\"%s\",\"object\":\"realtime.item\",\"type\":\"message\",\"status\":"
				    "\"%s\",\"role\":\"assistant\",\"content\":[{\"type\":\"%s\",\"%s\":",
				    s->item_id, status, s->audio ? "output_audio" : "output_text",
				    s->audio ? "transcript" : "text");
		sim_json_str(b, tlen ? (const char *)evbuffer_pullup(s->text, -1) : "", tlen);
		evbuffer_add(b, "}]}", 3);
	}
	evbuffer_add_printf(b, "],\"conversation_id\":\"conv_sim\",\"output_modalities\":[\"%s\"],\"model\":%s,",
			    s->audio ? "audio" : "text", s->model_json);
	if (done) {
		/* audio out: each token one audio and one transcript token */
		uint64_t out_audio = s->audio ? s->sent : 0, out = s->sent + out_audio;
		uint64_t in_audio = s->n_in_audio, in_text = s->n_in - in_audio;

		evbuffer_add_printf(b,
				    "\"usage\":{\"total_tokens\":%" PRIu64 ",\"input_tokens\":%" PRIu64
				    ",\"output_tokens\":%" PRIu64 ",\"input_token_details\":{\"text_tokens\":%" PRIu64
				    ",\"audio_tokens\":%" PRIu64
				    ",\"cached_tokens\":0},\"output_token_details\":{\"text_tokens\":%" PRIu64
				    ",\"audio_tokens\":%" PRIu64 "}}}",
				    s->n_in + out, s->n_in, out, in_text, in_audio, s->sent, out_audio);
	} else
		evbuffer_add(b, "\"usage\":null}", 13);
}

static void response_begin(struct rt_sess *s, int64_t max_out, bool audio, const char *body, size_t len)
{
	struct evbuffer *b = evbuffer_new();
	uint64_t h;

	s->responses++;
	h = sim_mix(sim_cfg.seed ^ s->path_hash ^ sim_hash(body, len, s->responses));
	snprintf(s->resp_id, sizeof(s->resp_id), "resp_%016" PRIx64, h);
	snprintf(s->item_id, sizeof(s->item_id), "item_%016" PRIx64, sim_mix(h));
	s->prng.state = h;
	s->n_in_audio = s->audio_tokens;
	s->n_in = (s->input_bytes + len + 3) / 4 + s->audio_tokens;
	s->input_bytes = 0;
	s->audio_tokens = 0;
	s->audio = audio;
	/* as the HTTP APIs: the header, else the request's limit, else --tokens */
	s->n_out = s->tokens >= 0 ? (uint64_t)s->tokens : max_out >= 0 ? (uint64_t)max_out : sim_cfg.tokens;
	s->sent = 0;
	s->active = true;
	s->deadline_ns = sim_now_ns() + s->ttft_ns;
	evbuffer_drain(s->text, evbuffer_get_length(s->text));

	event_open(s, b, "response.created");
	response_object(s, b, "in_progress", false);
	send_event(s, b);
	event_open(s, b, "response.output_item.added");
	evbuffer_add_printf(b,
			    ",\"response_id\":\"%s\",\"output_index\":0,\"item\":{\"id\":\"%s\",\"object\":"
			    "\"realtime.item\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":"
			    "\"assistant\",\"content\":[]}",
			    s->resp_id, s->item_id);
	send_event(s, b);
	event_open(s, b, "response.content_part.added");
	evbuffer_add_printf(b,
			    ",\"response_id\":\"%s\",\"item_id\":\"%s\",\"output_index\":0,\"content_index\":0,"
			    "\"part\":{\"type\":\"%s\",\"%s\":\"\"}",
			    s->resp_id, s->item_id, s->audio ? "audio" : "text", s->audio ? "transcript" : "text");
	send_event(s, b);
	evbuffer_free(b);
}

static void tick_at(struct rt_sess *s, uint64_t due_ns, uint64_t now);

/* The .done events and response.done, status "completed" or "cancelled";
 * then a response queued behind this one begins. */
static void response_end(struct rt_sess *s, const char *status)
{
	struct evbuffer *b = evbuffer_new();
	size_t tlen = evbuffer_get_length(s->text);
	const char *t = tlen ? (const char *)evbuffer_pullup(s->text, -1) : "";
	char where[128];

	snprintf(where, sizeof(where), ",\"response_id\":\"%s\",\"item_id\":\"%s\",\"output_index\":0", s->resp_id,
		 s->item_id);
	if (s->audio) {
		event_open(s, b, "response.output_audio.done");
		evbuffer_add_printf(b, "%s,\"content_index\":0", where);
		send_event(s, b);
		event_open(s, b, "response.output_audio_transcript.done");
		evbuffer_add_printf(b, "%s,\"content_index\":0,\"transcript\":", where);
	} else {
		event_open(s, b, "response.output_text.done");
		evbuffer_add_printf(b, "%s,\"content_index\":0,\"text\":", where);
	}
	sim_json_str(b, t, tlen);
	send_event(s, b);
	event_open(s, b, "response.content_part.done");
	evbuffer_add_printf(b, "%s,\"content_index\":0,\"part\":{\"type\":\"%s\",\"%s\":", where,
			    s->audio ? "audio" : "text", s->audio ? "transcript" : "text");
	sim_json_str(b, t, tlen);
	evbuffer_add(b, "}", 1);
	send_event(s, b);
	event_open(s, b, "response.output_item.done");
	evbuffer_add_printf(b,
			    ",\"response_id\":\"%s\",\"output_index\":0,\"item\":{\"id\":\"%s\",\"object\":"
			    "\"realtime.item\",\"type\":\"message\",\"status\":\"%s\",\"role\":\"assistant\","
			    "\"content\":[{\"type\":\"%s\",\"%s\":",
			    s->resp_id, s->item_id, status, s->audio ? "output_audio" : "output_text",
			    s->audio ? "transcript" : "text");
	sim_json_str(b, t, tlen);
	evbuffer_add(b, "}]}", 3);
	send_event(s, b);
	event_open(s, b, "response.done");
	response_object(s, b, status, true);
	send_event(s, b);
	evbuffer_free(b);
	s->active = false;
	event_del(s->tick);
	if (s->queued && !s->closing && !s->dead) {
		s->queued = false;
		response_begin(s, -1, s->audio_session, "", 0);
		tick_at(s, sim_now_ns(), sim_now_ns()); /* pump from the loop, not from inside one */
	}
}

static void tick_at(struct rt_sess *s, uint64_t due_ns, uint64_t now)
{
	uint64_t d = due_ns > now ? due_ns - now : 0;
	struct timeval tv = { .tv_sec = (time_t)(d / 1000000000ULL),
			      .tv_usec = (suseconds_t)(d % 1000000000ULL / 1000) };

	evtimer_add(s->tick, &tv);
}

/* One response.output_audio.delta: RT_AUDIO_CHUNK bytes of PCM16 from the
 * response's PRNG, base64. */
static void audio_delta(struct rt_sess *s, struct evbuffer *b)
{
	unsigned char pcm[RT_AUDIO_CHUNK], b64[RT_AUDIO_CHUNK / 3 * 4 + 1];

	for (size_t i = 0; i < sizeof(pcm); i += 8) {
		uint64_t r = sim_mix(s->prng.state + s->sent * sizeof(pcm) + i);
		memcpy(pcm + i, &r, sizeof(pcm) - i < 8 ? sizeof(pcm) - i : 8);
	}
	int n = EVP_EncodeBlock(b64, pcm, (int)sizeof(pcm));
	event_open(s, b, "response.output_audio.delta");
	evbuffer_add_printf(b,
			    ",\"response_id\":\"%s\",\"item_id\":\"%s\",\"output_index\":0,"
			    "\"content_index\":0,\"delta\":\"",
			    s->resp_id, s->item_id);
	evbuffer_add(b, b64, (size_t)n);
	evbuffer_add(b, "\"", 1);
	send_event(s, b);
}

/* Sends what is due, then sets the timer or waits for the output to drain. */
static void pump(struct rt_sess *s)
{
	struct evbuffer *b;
	int burst = 0;

	if (s->dead || s->closing || !s->active)
		return;
	b = evbuffer_new();
	s->stalled = false;
	for (;;) {
		uint64_t now = sim_now_ns();
		const char *w;
		size_t wl;

		if (s->sent == s->n_out) {
			response_end(s, "completed");
			break;
		}
		if (now < s->deadline_ns) {
			tick_at(s, s->deadline_ns, now);
			break;
		}
		if (evbuffer_get_length(bufferevent_get_output(s->bev)) >= RT_HIGH_WATER) {
			s->stalled = true;
			break;
		}
		w = sim_text_word(&s->prng, s->sent == 0, &wl);
		evbuffer_add(s->text, w, wl);
		if (s->audio)
			audio_delta(s, b);
		event_open(s, b, s->audio ? "response.output_audio_transcript.delta" : "response.output_text.delta");
		evbuffer_add_printf(b,
				    ",\"response_id\":\"%s\",\"item_id\":\"%s\",\"output_index\":0,"
				    "\"content_index\":0,\"delta\":",
				    s->resp_id, s->item_id);
		sim_json_str(b, w, wl);
		send_event(s, b);
		s->sent++;
		/* one itl after this one was due; no catch-up burst after a stall */
		s->deadline_ns += s->itl_ns;
		if (s->deadline_ns + s->itl_ns < now)
			s->deadline_ns = now + s->itl_ns;
		if (s->sent < s->n_out && s->deadline_ns <= now && ++burst >= 64) {
			tick_at(s, now, now); /* itl 0: let the loop breathe */
			break;
		}
	}
	evbuffer_free(b);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	pump(arg);
}

/* ---- client messages ---- */

static void send_error(struct rt_sess *s, const char *code, const char *message)
{
	struct evbuffer *b = evbuffer_new();

	event_open(s, b, "error");
	evbuffer_add_printf(b, ",\"error\":{\"type\":\"invalid_request_error\",\"code\":\"%s\",\"message\":", code);
	sim_json_str(b, message, strlen(message));
	evbuffer_add_printf(b, ",\"param\":null,\"event_id\":null}");
	send_event(s, b);
	evbuffer_free(b);
}

/* Whether a modalities array (GA output_modalities, beta modalities) of
 * `o` names "audio"; `dflt` when `o` has neither. */
static bool wants_audio(json_t *o, bool dflt)
{
	json_t *m = json_object_get(o, "output_modalities");
	size_t i;
	json_t *v;

	if (!json_is_array(m))
		m = json_object_get(o, "modalities");
	if (!json_is_array(m))
		return dflt;
	json_array_foreach (m, i, v) {
		if (json_is_string(v) && strcmp(json_string_value(v), "audio") == 0)
			return true;
	}
	return false;
}

/* The audio buffer becomes the turn's user item: committed. */
static void commit_turn(struct rt_sess *s)
{
	struct evbuffer *b = evbuffer_new();

	if (!s->speaking) /* a manual commit: the item is made now */
		snprintf(s->turn_item, sizeof(s->turn_item), "item_user%016" PRIx64,
			 sim_mix(sim_cfg.seed ^ s->path_hash ^ ++s->items));
	s->speaking = false;
	event_del(s->vad);
	s->audio_tokens += (s->audio_buf + RT_AUDIO_BYTES_PER_TOKEN - 1) / RT_AUDIO_BYTES_PER_TOKEN;
	s->audio_buf = 0;
	event_open(s, b, "input_audio_buffer.committed");
	evbuffer_add_printf(b, ",\"previous_item_id\":null,\"item_id\":\"%s\"", s->turn_item);
	send_event(s, b);
	evbuffer_free(b);
}

/* Server VAD: the silence after the last append has lasted: the speech
 * stopped, the turn is committed, and a response created for it. */
static void on_vad(evutil_socket_t fd, short what, void *arg)
{
	struct rt_sess *s = arg;
	struct evbuffer *b;

	(void)fd;
	(void)what;
	if (s->dead || s->closing || !s->speaking)
		return;
	b = evbuffer_new();
	event_open(s, b, "input_audio_buffer.speech_stopped");
	evbuffer_add_printf(b, ",\"audio_end_ms\":%" PRIu64 ",\"item_id\":\"%s\"",
			    s->audio_total / RT_AUDIO_BYTES_PER_MS + s->silence_ms, s->turn_item);
	send_event(s, b);
	evbuffer_free(b);
	commit_turn(s);
	if (s->vad_create && !s->active) {
		response_begin(s, -1, s->audio_session, "", 0);
		pump(s);
	} else if (s->vad_create) {
		s->queued = true; /* interrupt_response false: after the one running */
	}
}

/* input_audio_buffer.append: its audio's bytes; under server VAD the
 * first one of a turn is speech starting (a response running is cut
 * short, as the API's interrupt_response does) and each one restarts the
 * silence clock. */
static void on_append(struct rt_sess *s, json_t *m)
{
	const char *a = json_string_value(json_object_get(m, "audio"));
	size_t al = a ? strlen(a) : 0;
	uint64_t bytes = al / 4 * 3 - (al >= 1 && a[al - 1] == '=') - (al >= 2 && a[al - 2] == '=');
	struct timeval tv = { .tv_sec = (time_t)(s->silence_ms / 1000),
			      .tv_usec = (suseconds_t)(s->silence_ms % 1000 * 1000) };

	if (al % 4)
		bytes = al * 3 / 4;
	if (s->vad_on && !s->speaking) {
		struct evbuffer *b = evbuffer_new();

		s->speaking = true;
		snprintf(s->turn_item, sizeof(s->turn_item), "item_user%016" PRIx64,
			 sim_mix(sim_cfg.seed ^ s->path_hash ^ ++s->items));
		if (s->active && s->vad_interrupt)
			response_end(s, "cancelled");
		event_open(s, b, "input_audio_buffer.speech_started");
		evbuffer_add_printf(b, ",\"audio_start_ms\":%" PRIu64 ",\"item_id\":\"%s\"",
				    s->audio_total / RT_AUDIO_BYTES_PER_MS, s->turn_item);
		send_event(s, b);
		evbuffer_free(b);
	}
	s->audio_buf += bytes;
	s->audio_total += bytes;
	if (s->vad_on)
		evtimer_add(s->vad, &tv);
}

/* session.update: output modalities and turn detection (the GA shape,
 * session.audio.input.turn_detection, or the beta one,
 * session.turn_detection), answered with session.updated. */
static void on_session_update(struct rt_sess *s, json_t *m)
{
	json_t *sess = json_object_get(m, "session");
	json_t *td = json_object_get(json_object_get(json_object_get(sess, "audio"), "input"), "turn_detection");
	struct evbuffer *b = evbuffer_new();

	if (!td)
		td = json_object_get(sess, "turn_detection");
	s->audio_session = wants_audio(sess, s->audio_session);
	if (json_is_null(td)) {
		s->vad_on = false;
		s->speaking = false;
		s->queued = false;
		event_del(s->vad);
	} else if (json_is_object(td)) {
		json_t *ms = json_object_get(td, "silence_duration_ms");
		json_t *cr = json_object_get(td, "create_response");
		json_t *ir = json_object_get(td, "interrupt_response");

		s->vad_on = true;
		s->silence_ms = json_is_integer(ms) && json_integer_value(ms) >= 0 ? (uint64_t)json_integer_value(ms)
										   : RT_VAD_SILENCE_MS;
		s->vad_create = !json_is_false(cr);
		s->vad_interrupt = !json_is_false(ir);
	}
	event_open(s, b, "session.updated");
	evbuffer_add_printf(b,
			    ",\"session\":{\"type\":\"realtime\",\"object\":\"realtime.session\",\"model\":%s,"
			    "\"output_modalities\":[\"%s\"],\"audio\":{\"input\":{\"turn_detection\":",
			    s->model_json, s->audio_session ? "audio" : "text");
	if (s->vad_on)
		evbuffer_add_printf(b,
				    "{\"type\":\"server_vad\",\"silence_duration_ms\":%" PRIu64
				    ",\"create_response\":%s,"
				    "\"interrupt_response\":%s}",
				    s->silence_ms, s->vad_create ? "true" : "false",
				    s->vad_interrupt ? "true" : "false");
	else
		evbuffer_add(b, "null", 4);
	evbuffer_add(b, "}}}", 3);
	send_event(s, b);
	evbuffer_free(b);
}

static void on_message(struct rt_sess *s, const char *p, size_t n)
{
	json_t *m = json_loadb(p, n, 0, NULL);
	const char *type = json_string_value(json_object_get(m, "type"));

	if (type == NULL) {
		send_error(s, "invalid_json", "a client event must be a JSON object with a \"type\"");
	} else if (strcmp(type, "response.create") == 0) {
		json_t *lim = json_object_get(json_object_get(m, "response"), "max_output_tokens");

		if (s->active) {
			send_error(s, "conversation_already_has_active_response",
				   "Conversation already has an active response in progress");
		} else {
			response_begin(s, json_is_integer(lim) ? json_integer_value(lim) : -1,
				       wants_audio(json_object_get(m, "response"), s->audio_session), p, n);
			pump(s);
		}
	} else if (strcmp(type, "response.cancel") == 0) {
		if (s->active)
			response_end(s, "cancelled");
	} else if (strcmp(type, "input_audio_buffer.append") == 0) {
		on_append(s, m);
	} else if (strcmp(type, "input_audio_buffer.commit") == 0) {
		if (s->audio_buf == 0)
			send_error(s, "input_audio_buffer_commit_empty", "the input audio buffer is empty");
		else
			commit_turn(s);
	} else if (strcmp(type, "input_audio_buffer.clear") == 0) {
		struct evbuffer *b = evbuffer_new();

		s->audio_buf = 0;
		s->speaking = false;
		event_del(s->vad);
		event_open(s, b, "input_audio_buffer.cleared");
		send_event(s, b);
		evbuffer_free(b);
	} else if (strcmp(type, "session.update") == 0) {
		s->input_bytes += n;
		on_session_update(s, m);
	} else {
		s->input_bytes += n; /* conversation items, session updates: the prompt */
	}
	json_decref(m);
}

/* Parses whole client frames from the input; false once the session ends. */
static bool read_frames(struct rt_sess *s)
{
	struct evbuffer *in = bufferevent_get_input(s->bev);

	while (!s->dead) {
		size_t have = evbuffer_get_length(in), hl = 2;
		unsigned char h[14], *p;
		uint64_t n;
		unsigned op;
		bool fin;

		if (have < 2)
			return true;
		evbuffer_copyout(in, h, have < sizeof(h) ? have : sizeof(h));
		op = h[0] & 0x0F;
		fin = h[0] & 0x80;
		n = h[1] & 0x7F;
		if (n == 126) {
			hl = 4;
		} else if (n == 127) {
			hl = 10;
		}
		if (have < hl + 4)
			return true;
		if (n == 126)
			n = (uint64_t)h[2] << 8 | h[3];
		else if (n == 127)
			for (int i = 0; i < 8; i++)
				n = (i ? n << 8 : 0) | h[2 + i];
		if (!(h[1] & 0x80) || (h[0] & 0x70) || (op > 2 && op < 8) || op > 10 ||
		    (op >= 8 && (!fin || n > 125))) {
			send_close(s, 1002, "protocol error");
			return false;
		}
		if (n > RT_MAX_MESSAGE || (op < 8 && evbuffer_get_length(s->msg) + n > RT_MAX_MESSAGE)) {
			send_close(s, 1009, "message too big");
			return false;
		}
		if (have < hl + 4 + n)
			return true;
		p = evbuffer_pullup(in, (ev_ssize_t)(hl + 4 + n)) + hl + 4;
		for (uint64_t i = 0; i < n; i++)
			p[i] ^= h[hl + i % 4];
		if (op == 9) {
			ws_frame(s, 10, p, n);
		} else if (op == 8) {
			/* echo the code, then end once the output has left */
			if (n >= 2)
				ws_frame(s, 8, p, 2);
			else
				ws_frame(s, 8, "", 0);
			s->closing = true;
			s->active = false;
			event_del(s->tick);
			bufferevent_setwatermark(s->bev, EV_WRITE, 0, 0);
			evbuffer_drain(in, evbuffer_get_length(in));
			return false;
		} else if (op != 10) {
			if ((op == 0) != s->in_msg) {
				send_close(s, 1002, "unexpected continuation");
				return false;
			}
			if (op == 1)
				s->in_msg = true;
			evbuffer_add(s->msg, p, n);
			if (fin && s->in_msg) {
				size_t ml = evbuffer_get_length(s->msg);

				s->in_msg = false;
				on_message(s, ml ? (const char *)evbuffer_pullup(s->msg, -1) : "", ml);
				evbuffer_drain(s->msg, ml);
			} else if (op == 2) {
				evbuffer_drain(s->msg, evbuffer_get_length(s->msg)); /* binary: ignored */
				if (!fin)
					s->in_msg = true;
			}
		}
		evbuffer_drain(in, hl + 4 + n);
	}
	return false;
}

/* ---- callbacks ---- */

static void on_read(struct bufferevent *bev, void *arg)
{
	struct rt_sess *s = arg;

	if (s->closing) {
		evbuffer_drain(bufferevent_get_input(bev), evbuffer_get_length(bufferevent_get_input(bev)));
		return;
	}
	read_frames(s);
	if (s->closing && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
		sess_kill(s, false);
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct rt_sess *s = arg;

	if (s->closing) {
		if (evbuffer_get_length(bufferevent_get_output(bev)) == 0)
			sess_kill(s, false);
		return;
	}
	if (s->stalled)
		pump(s);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct rt_sess *s = arg;

	(void)bev;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		sess_kill(s, true);
}

/* ---- the handshake ---- */

static bool accept_key(const char *key, char out[32])
{
	static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdl = 0;
	char buf[128];
	int n = snprintf(buf, sizeof(buf), "%s%s", key, guid);

	if (n < 0 || (size_t)n >= sizeof(buf) || !EVP_Digest(buf, (size_t)n, md, &mdl, EVP_sha1(), NULL) || mdl != 20)
		return false;
	EVP_EncodeBlock((unsigned char *)out, md, 20); /* 28 characters and a NUL */
	return true;
}

/* The value of `name` in a query string, percent escapes left as they are. */
static char *query_value(const char *q, const char *name)
{
	size_t nl = strlen(name);

	while (q != NULL && *q != '\0') {
		size_t l = strcspn(q, "&");

		if (l > nl && strncmp(q, name, nl) == 0 && q[nl] == '=')
			return strndup(q + nl + 1, l - nl - 1);
		q += l + (q[l] == '&');
	}
	return NULL;
}

int sim_realtime_take(struct event_base *base, struct bufferevent *bev, const struct sim_rt_open *o)
{
	struct rt_sess *s;
	struct evbuffer *out;
	char acc[32];
	char *model;

	if (o->key == NULL || !accept_key(o->key, acc))
		return -1;
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return -1;
	s->bev = bev;
	s->tick = evtimer_new(base, on_tick, s);
	s->reaper = event_new(base, -1, 0, on_reap, s);
	s->vad = evtimer_new(base, on_vad, s);
	s->msg = evbuffer_new();
	s->text = evbuffer_new();
	model = query_value(o->query, "model");
	{
		struct evbuffer *b = evbuffer_new();
		const char *mv = model != NULL && *model != '\0' ? model : sim_cfg.model;

		if (b != NULL) {
			size_t n;

			sim_json_str(b, mv, strlen(mv));
			n = evbuffer_get_length(b);
			s->model_json = malloc(n + 1);
			if (s->model_json != NULL) {
				evbuffer_remove(b, s->model_json, n);
				s->model_json[n] = '\0';
			}
			evbuffer_free(b);
		}
	}
	free(model);
	if (s->tick == NULL || s->reaper == NULL || s->vad == NULL || s->msg == NULL || s->text == NULL ||
	    s->model_json == NULL) {
		if (s->tick != NULL)
			event_free(s->tick);
		if (s->reaper != NULL)
			event_free(s->reaper);
		if (s->vad != NULL)
			event_free(s->vad);
		if (s->msg != NULL)
			evbuffer_free(s->msg);
		if (s->text != NULL)
			evbuffer_free(s->text);
		free(s->model_json);
		free(s);
		return -1;
	}
	s->ttft_ns = (o->ttft_ms >= 0 ? (uint64_t)o->ttft_ms : sim_cfg.ttft_ms) * 1000000ULL;
	s->itl_ns = (o->itl_ms >= 0 ? (uint64_t)o->itl_ms : sim_cfg.itl_ms) * 1000000ULL;
	s->tokens = o->tokens;
	s->counted = o->counted;
	s->path_hash = sim_hash(o->query ? o->query : "", o->query ? strlen(o->query) : 0, 0x7265616c74696d65ULL);

	out = bufferevent_get_output(bev);
	{
		size_t before = evbuffer_get_length(out);

		evbuffer_add_printf(out,
				    "HTTP/1.1 101 Switching Protocols\r\nserver: tokentap-sim\r\nupgrade: websocket\r\n"
				    "connection: Upgrade\r\nsec-websocket-accept: %s\r\n",
				    acc);
		if (o->request_id != NULL)
			evbuffer_add_printf(out, "x-request-id: %s\r\n", o->request_id);
		evbuffer_add(out, "\r\n", 2);
		sim_stats.bytes_sent += evbuffer_get_length(out) - before;
	}
	{
		struct evbuffer *b = evbuffer_new();

		event_open(s, b, "session.created");
		evbuffer_add_printf(b,
				    ",\"session\":{\"type\":\"realtime\",\"object\":\"realtime.session\",\"id\":"
				    "\"sess_%016" PRIx64 "\",\"model\":%s,\"output_modalities\":[\"text\"]}",
				    sim_mix(sim_cfg.seed ^ s->path_hash), s->model_json);
		send_event(s, b);
		evbuffer_free(b);
	}
	bufferevent_setcb(bev, on_read, on_write, on_event, s);
	bufferevent_setwatermark(bev, EV_WRITE, RT_LOW_WATER, 0);
	bufferevent_enable(bev, EV_READ | EV_WRITE);
	if (evbuffer_get_length(bufferevent_get_input(bev)) > 0)
		on_read(bev, s); /* frames that came with the handshake */
	return 0;
}
