// gemini_sdk.cjs — the official @google/genai SDK streams one Gemini request
// (generateContentStream, which asks for ?alt=sse) against BASE_URL and
// prints, as one JSON object, every chunk it yielded (the SDK's own parsed
// GenerateContentResponse, as plain JSON), the text and thought parts it
// saw, and its time to the first chunk of each kind. Used by
// test_gemini.py; the request here is the one GEMINI_SDK_BODY describes
// there (keep the two in step).
//
// usage: node gemini_sdk.cjs SDK_DIR BASE_URL REQUEST_ID TTFT_MS ITL_MS TOKENS
const path = require("path");
const [sdkDir, baseUrl, rid, ttft, itl, tokens] = process.argv.slice(2);
const { GoogleGenAI } = require(path.join(sdkDir, "node_modules", "@google", "genai"));

async function main() {
  const ai = new GoogleGenAI({
    apiKey: "it-key",
    httpOptions: {
      baseUrl,
      headers: { "x-request-id": rid, "x-sim-ttft-ms": ttft, "x-sim-itl-ms": itl, "x-sim-tokens": tokens },
    },
  });
  const t0 = process.hrtime.bigint();
  const stream = await ai.models.generateContentStream({
    model: "gemini-2.5-flash",
    contents: "Why is the sky blue?",
    config: { thinkingConfig: { thinkingBudget: 3, includeThoughts: true } },
  });
  const chunks = [], texts = [], thoughts = [];
  let firstMs = null, firstAnswerMs = null;
  for await (const chunk of stream) {
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    const plain = JSON.parse(JSON.stringify(chunk));
    delete plain.sdkHttpResponse; // the HTTP headers it came with, not the chunk
    chunks.push(plain);
    for (const c of chunk.candidates || [])
      for (const p of (c.content && c.content.parts) || []) {
        if (typeof p.text !== "string" || p.text === "") continue;
        if (firstMs === null) firstMs = ms;
        if (p.thought) thoughts.push(p.text);
        else {
          texts.push(p.text);
          if (firstAnswerMs === null) firstAnswerMs = ms;
        }
      }
  }
  const last = chunks.length ? chunks[chunks.length - 1] : {};
  process.stdout.write(JSON.stringify({ chunks, texts, thoughts, usage: last.usageMetadata || null, firstMs,
                                        firstAnswerMs }));
}

main().catch((e) => {
  process.stderr.write(String((e && e.stack) || e) + "\n");
  process.exit(1);
});
