// ws_client.cjs — a WebSocket session with the npm `ws` client library:
// connects to URL, sends each message of MESSAGES (JSON: an array of
// {"text": s} or {"binary": base64}), collects what comes back until the
// server closes (it closes, 1000 "done", once as many came back as it
// sent), and prints as JSON on stdout the messages received (same
// shape), the close code and reason, and the ms from each send to the next
// message received.
// Used by test_websocket.py.
//
// Usage: node ws_client.cjs WS_DIR URL MESSAGES_JSON [PERMESSAGE_DEFLATE(0|1)]
"use strict";

const path = require("path");

async function main() {
	const [wsDir, url, msgsJson, deflate] = process.argv.slice(2);
	const WebSocket = require(path.join(wsDir, "node_modules", "ws"));
	const msgs = JSON.parse(msgsJson);
	const ws = new WebSocket(url, { perMessageDeflate: deflate === "1", headers: { "x-request-id": "it-ws-npm" } });
	const got = [];
	let sentAt = 0;
	const gaps = [];
	ws.on("open", () => {
		for (const m of msgs) {
			sentAt = performance.now();
			if (m.text !== undefined) ws.send(m.text);
			else ws.send(Buffer.from(m.binary, "base64"));
		}
	});
	ws.on("message", (data, isBinary) => {
		if (gaps.length < msgs.length) gaps.push(performance.now() - sentAt);
		got.push(isBinary ? { binary: Buffer.from(data).toString("base64") } : { text: data.toString() });
		if (got.length === msgs.length) ws.close(1000, "done");
	});
	const result = await new Promise((resolve, reject) => {
		ws.on("close", (code, reason) => resolve({ code, reason: reason.toString() }));
		ws.on("error", reject);
		ws.on("unexpected-response", (req, res) => resolve({ status: res.statusCode }));
	});
	process.stdout.write(JSON.stringify({ got, gaps, ...result }));
}

main().catch((e) => {
	process.stderr.write(String((e && e.stack) || e) + "\n");
	process.exit(1);
});
