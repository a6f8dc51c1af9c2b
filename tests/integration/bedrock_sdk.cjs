// bedrock_sdk.cjs — one streamed Bedrock request with AWS's own npm SDK
// (@aws-sdk/client-bedrock-runtime), pointed at tokentap or the simulator
// (test credentials: nothing checks the signature), over HTTP/1.1. Prints, as JSON on stdout,
// every event the SDK decoded from the event stream (its decoder checks both
// CRCs and every header), the time from just before the call to the first
// text delta (ms), or the exception the SDK raised from an exception message.
// Used by test_bedrock.py.
//
// Usage: node bedrock_sdk.cjs SDK_DIR ENDPOINT converse|invoke MODEL_ID REQUEST_ID TTFT_MS ITL_MS TOKENS [EXCEPTION]
"use strict";

const path = require("path");

async function main() {
	const [sdkDir, endpoint, op, modelId, rid, ttft, itl, tokens, exception] = process.argv.slice(2);
	const sdk = require(path.join(sdkDir, "node_modules", "@aws-sdk", "client-bedrock-runtime"));
	const { NodeHttpHandler } = require(path.join(sdkDir, "node_modules", "@smithy", "node-http-handler"));
	const client = new sdk.BedrockRuntimeClient({
		endpoint,
		// HTTP/1.1, as tokentap speaks: the client's default handler is
		// HTTP/2 (for the bidirectional operations), which needs TLS (h2)
		requestHandler: new NodeHttpHandler(),
		region: "us-east-1",
		credentials: { accessKeyId: "AKIDTOKENTAPTEST", secretAccessKey: "tokentap-test-secret" },
		maxAttempts: 1,
	});
	client.middlewareStack.add(
		(next) => async (args) => {
			const h = args.request.headers;
			h["x-request-id"] = rid;
			h["x-sim-ttft-ms"] = ttft;
			h["x-sim-itl-ms"] = itl;
			h["x-sim-tokens"] = tokens;
			if (exception)
				h["x-sim-exception"] = exception;
			return next(args);
		},
		{ step: "build", name: "tokentapSimHeaders" },
	);
	const events = [];
	let first = null;
	const t0 = process.hrtime.bigint();
	try {
		if (op === "converse") {
			const out = await client.send(
				new sdk.ConverseStreamCommand({
					modelId,
					messages: [{ role: "user", content: [{ text: "Why is the sky blue?" }] }],
					inferenceConfig: { maxTokens: 400 },
				}),
			);
			for await (const ev of out.stream) {
				if (first === null && ev.contentBlockDelta && ev.contentBlockDelta.delta.text)
					first = process.hrtime.bigint();
				events.push(ev);
			}
		} else {
			const out = await client.send(
				new sdk.InvokeModelWithResponseStreamCommand({
					modelId,
					contentType: "application/json",
					accept: "application/json",
					body: JSON.stringify({
						anthropic_version: "bedrock-2023-05-31",
						max_tokens: 400,
						messages: [{ role: "user", content: "Why is the sky blue?" }],
					}),
				}),
			);
			for await (const ev of out.body) {
				const obj = ev.chunk ? JSON.parse(Buffer.from(ev.chunk.bytes).toString("utf8")) : ev;
				if (first === null && obj.type === "content_block_delta")
					first = process.hrtime.bigint();
				events.push(obj);
			}
		}
	} catch (e) {
		process.stdout.write(JSON.stringify({ events, error: e.name, message: e.message }));
		return;
	}
	const ms = first === null ? null : Number(first - t0) / 1e6;
	process.stdout.write(JSON.stringify({ events, first_delta_ms: ms }));
}

main().catch((e) => {
	process.stderr.write(String((e && e.stack) || e) + "\n");
	process.exit(1);
});
