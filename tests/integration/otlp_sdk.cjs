// otlp_sdk.cjs — the official OpenTelemetry JS SDK and its OTLP/HTTP
// exporters (protobuf and JSON), for test_otlp.py.
//
//   node otlp_sdk.cjs NODE_PREFIX export URL [json]
//     exports one known span (a remote parent, fixed times, attributes of
//     each type, two events) to URL with OTLPTraceExporter (protobuf, from
//     exporter-trace-otlp-proto; with `json`, OTLP/JSON from
//     exporter-trace-otlp-http) and
//     prints what it sent: {traceId, spanId, parentSpanId, name, kind,
//     start, end (ns as strings), attributes, events, service}.
//   node otlp_sdk.cjs NODE_PREFIX send PORT REQUEST_ID STREAM
//     starts a client span with the SDK's tracer (always sampled), injects
//     it with the W3C propagator into a chat request to 127.0.0.1:PORT, ends
//     it after the answer; prints {traceId, spanId, status}.
"use strict";
const path = require("path");
const http = require("http");

const prefix = path.resolve(process.argv[2]);
const req = (m) => require(path.join(prefix, "node_modules", m));
const api = req("@opentelemetry/api");
const { W3CTraceContextPropagator } = req("@opentelemetry/core");
const { BasicTracerProvider, SimpleSpanProcessor, AlwaysOnSampler } = req("@opentelemetry/sdk-trace-base");
const { resourceFromAttributes } = req("@opentelemetry/resources");

async function exportKnown(url, json) {
  const { OTLPTraceExporter } = req(json ? "@opentelemetry/exporter-trace-otlp-http"
                                         : "@opentelemetry/exporter-trace-otlp-proto");
  const exporter = new OTLPTraceExporter({ url });
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ "service.name": "otlp-sdk-test", "deployment.environment": "ci" }),
    sampler: new AlwaysOnSampler(),
    spanProcessors: [new SimpleSpanProcessor(exporter)],
  });
  const tracer = provider.getTracer("otlp_sdk.cjs", "1.0.0");
  const parent = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331",
                   traceFlags: api.TraceFlags.SAMPLED, isRemote: true };
  const ctx = api.trace.setSpanContext(api.ROOT_CONTEXT, parent);
  const start = [1764000000, 123456789];
  const span = tracer.startSpan("chat known-model", {
    kind: api.SpanKind.SERVER, startTime: start,
    attributes: { "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 42, "x.ratio": 0.25, "x.flag": true },
  }, ctx);
  span.addEvent("first_token", {}, [1764000000, 623456789]);
  span.addEvent("resp_end", { n: 3 }, [1764000001, 5]);
  span.setStatus({ code: api.SpanStatusCode.ERROR, message: "boom" });
  span.end([1764000001, 900000001]);
  await provider.forceFlush();
  await provider.shutdown();
  const sc = span.spanContext();
  process.stdout.write(JSON.stringify({
    traceId: sc.traceId, spanId: sc.spanId, parentSpanId: parent.spanId, name: "chat known-model",
    start: "1764000000123456789", end: "1764000001900000001",
    attributes: { "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 42, "x.ratio": 0.25, "x.flag": true },
    events: [["first_token", "1764000000623456789"], ["resp_end", "1764000001000000005"]],
  }));
}

function send(port, rid, stream) {
  const provider = new BasicTracerProvider({ sampler: new AlwaysOnSampler() });
  const tracer = provider.getTracer("otlp_sdk.cjs");
  const span = tracer.startSpan("client call", { kind: api.SpanKind.CLIENT });
  const ctx = api.trace.setSpan(api.ROOT_CONTEXT, span);
  const carrier = {};
  new W3CTraceContextPropagator().inject(ctx, carrier, api.defaultTextMapSetter);
  const body = JSON.stringify({ model: "m1", messages: [{ role: "user", content: "hi" }], stream });
  const headers = Object.assign({ "content-type": "application/json", "x-request-id": rid }, carrier);
  const r = http.request({ host: "127.0.0.1", port, method: "POST", path: "/v1/chat/completions", headers,
                           timeout: 10000 }, (res) => {
    res.resume();
    res.on("end", () => {
      span.end();
      const sc = span.spanContext();
      process.stdout.write(JSON.stringify({ traceId: sc.traceId, spanId: sc.spanId, status: res.statusCode,
                                            carrier }));
    });
  });
  r.on("timeout", () => r.destroy(new Error("timeout")));
  r.on("error", (e) => { console.error(e.message); process.exit(1); });
  r.end(body);
}

const mode = process.argv[3];
if (mode === "export") {
  exportKnown(process.argv[4], process.argv[5] === "json").catch((e) => { console.error(e.stack || e); process.exit(1); });
} else if (mode === "send") {
  send(Number(process.argv[4]), process.argv[5], process.argv[6] === "1");
} else {
  console.error("usage: otlp_sdk.cjs NODE_PREFIX export URL [json] | send PORT RID STREAM");
  process.exit(2);
}
