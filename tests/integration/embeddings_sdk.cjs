// embeddings_sdk.cjs — one embeddings request with the official `openai` npm
// SDK (client.embeddings.create, which asks for base64 and decodes it) and
// prints, as JSON on stdout, what it returned.
// Used by test_embeddings.py, whose SDK_INPUT is the input sent here.
//
// Usage: node embeddings_sdk.cjs SDK_DIR BASE_URL REQUEST_ID ITL_MS
"use strict";

const path = require("path");

async function main() {
	const [sdkDir, baseURL, rid, itl] = process.argv.slice(2);
	const OpenAI = require(path.join(sdkDir, "node_modules", "openai"));
	const Client = OpenAI.default || OpenAI;
	const client = new Client({ baseURL, apiKey: "sk-test", maxRetries: 0, timeout: 30000 });
	const res = await client.embeddings.create(
		{ model: "sim-embed", input: ["the sky", "is blue", "because of Rayleigh scattering"] },
		{ headers: { "x-request-id": rid, "x-sim-itl-ms": itl } },
	);
	process.stdout.write(JSON.stringify(res));
}

main().catch((e) => {
	process.stderr.write(String((e && e.stack) || e) + "\n");
	process.exit(1);
});
