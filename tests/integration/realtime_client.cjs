// realtime_client.cjs — an OpenAI-Realtime-style text session with the npm
// `ws` client library: connects to URL (headers from HEADERS_JSON), waits
// for session.created, then ROUNDS times adds a user item and sends
// response.create, reading until response.done. Prints as JSON on stdout,
// per response: the ms from sending response.create to the first
// *.delta (performance.now()), the deltas' count and text, the gaps
// between deltas, and response.done's usage; then the close code.
// Used by test_realtime.py.
//
// Usage: node realtime_client.cjs WS_DIR URL HEADERS_JSON ROUNDS
"use strict";

const path = require("path");

async function main() {
	const [wsDir, url, headersJson, rounds] = process.argv.slice(2);
	const WebSocket = require(path.join(wsDir, "node_modules", "ws"));
	const ws = new WebSocket(url, { headers: JSON.parse(headersJson) });
	const responses = [];
	let cur = null;
	let created = null;

	function next() {
		if (responses.length === Number(rounds)) {
			ws.close(1000, "done");
			return;
		}
		ws.send(JSON.stringify({
			type: "conversation.item.create",
			item: { type: "message", role: "user", content: [{ type: "input_text", text: "say something " + responses.length }] },
		}));
		cur = { sent: performance.now(), ttft_ms: null, deltas: 0, text: "", gaps_ms: [], last: 0 };
		ws.send(JSON.stringify({ type: "response.create", response: { output_modalities: ["text"] } }));
	}
	ws.on("message", (data) => {
		const ev = JSON.parse(data.toString());
		const now = performance.now();
		if (ev.type === "session.created") {
			created = ev.session;
			next();
		} else if (ev.type.endsWith(".delta") && cur) {
			if (cur.ttft_ms === null) cur.ttft_ms = now - cur.sent;
			else cur.gaps_ms.push(now - cur.last);
			cur.last = now;
			cur.deltas++;
			cur.text += ev.delta;
		} else if (ev.type === "response.done" && cur) {
			responses.push({ ttft_ms: cur.ttft_ms, deltas: cur.deltas, text: cur.text, gaps_ms: cur.gaps_ms,
				id: ev.response.id, status: ev.response.status, usage: ev.response.usage });
			cur = null;
			next();
		} else if (ev.type === "error") {
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
