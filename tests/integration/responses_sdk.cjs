// responses_sdk.cjs — streams one Responses request with the official `openai`
// npm SDK and prints, as JSON on stdout, every event the SDK yielded and the
// time from just before the call to the first output_text delta (ms).
// Used by test_responses.py, whose SDK_BODY is the request made here.
//
// Usage: node responses_sdk.cjs SDK_DIR BASE_URL REQUEST_ID TTFT_MS ITL_MS TOKENS
"use strict";

const path = require("path");

async function main() {
	const [sdkDir, baseURL, rid, ttft, itl, tokens] = process.argv.slice(2);
	const OpenAI = require(path.join(sdkDir, "node_modules", "openai"));
	const Client = OpenAI.default || OpenAI;
	const client = new Client({ baseURL, apiKey: "sk-test", maxRetries: 0, timeout: 30000 });
	const events = [];
	let first = null;
	const t0 = process.hrtime.bigint();
	const stream = await client.responses.create(
		{
			model: "sim-model",
			input: [{ role: "user", content: "Why is the sky blue?" }],
			stream: true,
		},
		{ headers: { "x-request-id": rid, "x-sim-ttft-ms": ttft, "x-sim-itl-ms": itl, "x-sim-tokens": tokens } },
	);
	for await (const ev of stream) {
		if (first === null && ev.type === "response.output_text.delta")
			first = process.hrtime.bigint();
		events.push(ev);
	}
	const ms = first === null ? null : Number(first - t0) / 1e6;
	process.stdout.write(JSON.stringify({ events, first_delta_ms: ms }));
}

main().catch((e) => {
	process.stderr.write(String((e && e.stack) || e) + "\n");
	process.exit(1);
});
