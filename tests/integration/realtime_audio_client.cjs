// realtime_audio_client.cjs — OpenAI-Realtime-style audio turns with the
// npm `ws` client library. Connects to URL (headers from HEADERS_JSON),
// waits for session.created, then plays TURNS user turns of CHUNKS
// input_audio_buffer.append messages each (base64 PCM16), in MODE:
//   manual  turn detection off: the client sends input_audio_buffer.commit,
//           waits for input_audio_buffer.committed, then GAP_MS later sends
//           response.create asking for audio output;
//   vad     session.update turns server_vad on (silence_duration_ms
//           GAP_MS, output audio): the client only appends; the server
//           ends the turn (speech_stopped, committed) and creates the
//           response itself.
//   barge   as vad, but the second turn is spoken while the first
//           response runs (after its first delta): the server cancels it.
//   queue   as barge with interrupt_response false: the first response
//           runs on, the second turn's response comes after it.
// Prints as JSON on stdout, per response (in response.done order): its
// status and usage, the audio and transcript deltas' counts, the audio
// bytes decoded, and the client's clocks (performance.now(), ms): when the
// turn ended by the client's own send (commit) or read (speech_stopped,
// committed), when response.create was sent, when the first delta came.
// Used by test_realtime_audio.py.
//
// Usage: node realtime_audio_client.cjs WS_DIR URL HEADERS_JSON MODE TURNS CHUNKS GAP_MS
"use strict";

const path = require("path");

async function main() {
	const [wsDir, url, headersJson, mode, turnsArg, chunksArg, gapArg] = process.argv.slice(2);
	const WebSocket = require(path.join(wsDir, "node_modules", "ws"));
	const ws = new WebSocket(url, { headers: JSON.parse(headersJson) });
	const turns = Number(turnsArg), chunks = Number(chunksArg), gap = Number(gapArg);
	const audio = Buffer.alloc(960, 7).toString("base64"); // 20 ms of 24 kHz PCM16
	const responses = [];
	const turnEnds = []; // per turn: { commit_sent, speech_stopped, committed }
	let spoken = 0;
	let cur = null; // the response whose deltas are coming
	let created = null;

	function speak() {
		spoken++;
		turnEnds.push({});
		for (let i = 0; i < chunks; i++)
			ws.send(JSON.stringify({ type: "input_audio_buffer.append", audio }));
		if (mode === "manual") {
			turnEnds[spoken - 1].commit_sent = performance.now();
			ws.send(JSON.stringify({ type: "input_audio_buffer.commit" }));
		}
	}
	function finish() {
		ws.close(1000, "done");
	}
	ws.on("message", (data) => {
		const now = performance.now();
		const ev = JSON.parse(data.toString());
		const turn = turnEnds[spoken - 1];
		switch (ev.type) {
		case "session.created":
			created = ev.session;
			if (mode !== "manual")
				ws.send(JSON.stringify({ type: "session.update", session: { type: "realtime", output_modalities: ["audio"],
					audio: { input: { turn_detection: { type: "server_vad", silence_duration_ms: gap,
						interrupt_response: mode !== "queue" } } } } }));
			else
				speak();
			break;
		case "session.updated":
			speak();
			break;
		case "input_audio_buffer.speech_stopped":
			turn.speech_stopped = now;
			break;
		case "input_audio_buffer.committed":
			turn.committed = now;
			if (mode === "manual")
				setTimeout(() => {
					turn.create_sent = performance.now();
					ws.send(JSON.stringify({ type: "response.create", response: { output_modalities: ["audio"] } }));
				}, gap);
			break;
		case "response.created":
			cur = { turn: spoken - 1, first: null, audio_deltas: 0, transcript_deltas: 0, audio_bytes: 0, transcript: "" };
			break;
		case "response.output_audio.delta":
		case "response.output_audio_transcript.delta":
			if (!cur)
				throw new Error("a delta outside a response");
			if (cur.first === null) {
				cur.first = now;
				if ((mode === "barge" || mode === "queue") && spoken < turns)
					speak(); // the user talks over the answer
			}
			if (ev.type === "response.output_audio.delta") {
				cur.audio_deltas++;
				cur.audio_bytes += Buffer.from(ev.delta, "base64").length;
			} else {
				cur.transcript_deltas++;
				cur.transcript += ev.delta;
			}
			break;
		case "response.done":
			responses.push({ ...cur, ...turnEnds[cur.turn], status: ev.response.status, usage: ev.response.usage });
			cur = null;
			if (responses.length === turns)
				finish();
			else if (mode !== "barge" && mode !== "queue")
				speak();
			break;
		case "error":
			throw new Error("error event: " + JSON.stringify(ev));
		}
	});
	const result = await new Promise((resolve, reject) => {
		ws.on("close", (code, reason) => resolve({ code, reason: reason.toString() }));
		ws.on("error", reject);
		ws.on("unexpected-response", (req, res) => resolve({ status: res.statusCode }));
	});
	process.stdout.write(JSON.stringify({ session: created, responses, ...result }));
}

main().catch((e) => {
	process.stderr.write(String((e && e.stack) || e) + "\n");
	process.exit(1);
});
