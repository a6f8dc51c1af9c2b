// realtime_sdk.cjs — a realtime text session with the official `openai` npm
// SDK's OpenAIRealtimeWS (openai/realtime/ws, on the `ws` package): the
// client's baseURL BASE_URL (https://…/v1; the SDK always connects wss://),
// the CA file for the listener's certificate in NODE_EXTRA_CA_CERTS.
// ROUNDS times: a user item, response.create, read to response.done. Prints
// as JSON the URL the SDK built and, per response, the ms from sending
// response.create to the first response.output_text.delta, the deltas and
// response.done's usage.
// Used by test_realtime.py.
//
// Usage: node realtime_sdk.cjs SDK_DIR BASE_URL MODEL REQUEST_ID ROUNDS
"use strict";

const path = require("path");

async function main() {
	const [sdkDir, baseURL, model, requestId, rounds] = process.argv.slice(2);
	const { OpenAI } = require(path.join(sdkDir, "node_modules", "openai"));
	const { OpenAIRealtimeWS } = require(path.join(sdkDir, "node_modules", "openai", "realtime", "ws"));
	const client = new OpenAI({ apiKey: "sk-test", baseURL });
	const rt = new OpenAIRealtimeWS({ model, options: { headers: { "x-request-id": requestId } } }, client);
	const responses = [];
	let cur = null;
	let session = null;

	function next() {
		if (responses.length === Number(rounds)) {
			rt.close({ code: 1000, reason: "done" });
			return;
		}
		rt.send({
			type: "conversation.item.create",
			item: { type: "message", role: "user", content: [{ type: "input_text", text: "hello " + responses.length }] },
		});
		cur = { sent: performance.now(), ttft_ms: null, deltas: 0 };
		rt.send({ type: "response.create", response: { output_modalities: ["text"] } });
	}
	const result = await new Promise((resolve, reject) => {
		rt.on("session.created", (ev) => {
			session = ev.session;
			next();
		});
		rt.on("response.output_text.delta", () => {
			if (cur.ttft_ms === null) cur.ttft_ms = performance.now() - cur.sent;
			cur.deltas++;
		});
		rt.on("response.done", (ev) => {
			responses.push({ ttft_ms: cur.ttft_ms, deltas: cur.deltas, status: ev.response.status, usage: ev.response.usage });
			next();
		});
		rt.on("error", reject);
		rt.socket.on("close", (code) => resolve({ code }));
	});
	process.stdout.write(JSON.stringify({ url: String(rt.url), session, responses, ...result }));
}

main().catch((e) => {
	process.stderr.write(String((e && e.stack) || e) + "\n");
	process.exit(1);
});
