// otel_propagate.cjs — the official OpenTelemetry W3C propagator on both
// ends of tokentap, for test_tracectx.py.
//
//   node otel_propagate.cjs NODE_PREFIX send PORT REQUEST_ID
//     makes a sampled span context (random ids, a tracestate), injects it
//     into a chat request with W3CTraceContextPropagator and sends that to
//     127.0.0.1:PORT; prints {traceId, spanId, carrier, status}.
//   node otel_propagate.cjs NODE_PREFIX extract HEADERS_JSON
//     extracts a span context from the headers an upstream received;
//     prints {traceId, spanId, traceFlags, isRemote, traceState} or null.
"use strict";
const path = require("path");
const http = require("http");
const crypto = require("crypto");

const prefix = path.resolve(process.argv[2]);
const req = (m) => require(path.join(prefix, "node_modules", m));
const api = req("@opentelemetry/api");
const { W3CTraceContextPropagator, TraceState } = req("@opentelemetry/core");
const prop = new W3CTraceContextPropagator();

if (process.argv[3] === "send") {
  const sc = {
    traceId: crypto.randomBytes(16).toString("hex"),
    spanId: crypto.randomBytes(8).toString("hex"),
    traceFlags: api.TraceFlags.SAMPLED,
    traceState: new TraceState("vendor=abc,other=x1"),
  };
  const ctx = api.trace.setSpanContext(api.ROOT_CONTEXT, sc);
  const carrier = {};
  prop.inject(ctx, carrier, api.defaultTextMapSetter);
  const body = JSON.stringify({ messages: [{ role: "user", content: "hi" }], stream: false });
  const headers = Object.assign({ "content-type": "application/json", "x-request-id": process.argv[5] }, carrier);
  const r = http.request({ host: "127.0.0.1", port: Number(process.argv[4]), method: "POST",
                           path: "/v1/chat/completions", headers, timeout: 10000 }, (res) => {
    res.resume();
    res.on("end", () => {
      process.stdout.write(JSON.stringify({ traceId: sc.traceId, spanId: sc.spanId, carrier,
                                            status: res.statusCode }));
    });
  });
  r.on("timeout", () => r.destroy(new Error("timeout")));
  r.on("error", (e) => { console.error(e.message); process.exit(1); });
  r.end(body);
} else if (process.argv[3] === "extract") {
  const headers = JSON.parse(process.argv[4]);
  const ctx = prop.extract(api.ROOT_CONTEXT, headers, api.defaultTextMapGetter);
  const sc = api.trace.getSpanContext(ctx);
  process.stdout.write(JSON.stringify(sc ? { traceId: sc.traceId, spanId: sc.spanId, traceFlags: sc.traceFlags,
                                             isRemote: sc.isRemote,
                                             traceState: sc.traceState ? sc.traceState.serialize() : null }
                                         : null));
} else {
  console.error("usage: otel_propagate.cjs NODE_PREFIX send PORT RID | extract HEADERS_JSON");
  process.exit(2);
}
