// sdk_reasoning.cjs — streams one reasoning request with an official SDK and
// prints, as JSON on stdout: every event the SDK yielded (copied as it was
// yielded), the SDK's final typed object where it has a helper for one, the
// raw response body the SDK read (teed from its fetch), and the times from
// just before the call to the first token event (reasoning or answer) and to
// the first answer event (text or tool call), in ms.
// Used by test_sdk_reasoning.py, which holds the request bodies.
//
// Usage: node sdk_reasoning.cjs MODE SDK_DIR BASE_URL REQUEST_ID HEADERS_JSON BODY_JSON
//   MODE: chat (openai, chat.completions.create), responses (openai,
//   responses.stream helper), anthropic (@anthropic-ai/sdk, messages.stream
//   helper).
"use strict";

const path = require("path");

// The SDK's fetch, with the body teed: one copy for the SDK, one read here.
function teeFetch(raw) {
	return async (url, init) => {
		const r = await fetch(url, init);
		if (!r.body) return r;
		const [a, b] = r.body.tee();
		raw.done = new Response(b).text().then((t) => {
			raw.text = t;
		});
		return new Response(a, { status: r.status, statusText: r.statusText, headers: r.headers });
	};
}

function load(sdkDir, name) {
	const m = require(path.join(sdkDir, "node_modules", name));
	return m.default || m;
}

async function main() {
	const [mode, sdkDir, baseURL, rid, headersJson, bodyJson] = process.argv.slice(2);
	const headers = Object.assign({ "x-request-id": rid }, JSON.parse(headersJson));
	const body = JSON.parse(bodyJson);
	const raw = { text: null, done: Promise.resolve() };
	const events = [];
	let first = null,
		firstAnswer = null,
		final = null;
	const opts = { baseURL, maxRetries: 0, timeout: 30000, fetch: teeFetch(raw) };
	const t0 = process.hrtime.bigint();
	const seen = (ev, token, answer) => {
		const now = process.hrtime.bigint();
		if (first === null && token) first = now;
		if (firstAnswer === null && answer) firstAnswer = now;
		events.push(JSON.parse(JSON.stringify(ev)));
	};

	if (mode === "chat") {
		const client = new (load(sdkDir, "openai"))(Object.assign({ apiKey: "sk-test" }, opts));
		const stream = await client.chat.completions.create(body, { headers });
		for await (const ch of stream) {
			const d = ch.choices && ch.choices[0] && ch.choices[0].delta;
			const answer = !!(d && (d.content || d.tool_calls));
			seen(ch, answer || !!(d && d.reasoning_content), answer);
		}
	} else if (mode === "responses") {
		const client = new (load(sdkDir, "openai"))(Object.assign({ apiKey: "sk-test" }, opts));
		const stream = client.responses.stream(body, { headers });
		for await (const ev of stream)
			seen(ev, ev.type.endsWith(".delta"),
				ev.type === "response.output_text.delta" || ev.type === "response.function_call_arguments.delta");
		final = await stream.finalResponse();
	} else if (mode === "anthropic") {
		const client = new (load(sdkDir, "@anthropic-ai/sdk"))(Object.assign({ apiKey: "sk-ant-test" }, opts));
		const stream = client.messages.stream(body, { headers });
		for await (const ev of stream) {
			const delta = ev.type === "content_block_delta" && ev.delta.type !== "signature_delta";
			seen(ev, delta, delta && ev.delta.type !== "thinking_delta");
		}
		final = await stream.finalMessage();
	} else {
		throw new Error("unknown mode " + mode);
	}
	await raw.done;
	const ms = (t) => (t === null ? null : Number(t - t0) / 1e6);
	process.stdout.write(JSON.stringify({ events, final, raw: raw.text, first_ms: ms(first),
		first_answer_ms: ms(firstAnswer) }));
}

main().catch((e) => {
	process.stderr.write(String((e && e.stack) || e) + "\n");
	process.exit(1);
});
