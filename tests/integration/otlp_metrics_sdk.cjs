// otlp_metrics_sdk.cjs — the official OpenTelemetry JS metrics SDK and its
// OTLP/HTTP metric exporters (protobuf and JSON), for test_otlp_metrics.py.
//
//   node otlp_metrics_sdk.cjs NODE_PREFIX export URL [json]
//     records known values into two exponential histograms (one of them
//     with two attribute sets) and a counter, exports them once to URL with
//     OTLPMetricExporter (protobuf, cumulative; with `json`, OTLP/JSON from
//     exporter-metrics-otlp-http), and prints what the same
//     SDK aggregated (a second reader, in memory): per metric its name,
//     unit, temporality and data points (attributes, count, sum, min, max,
//     scale, zeroCount, positive offset and counts).
"use strict";
const path = require("path");

const prefix = path.resolve(process.argv[2]);
const req = (m) => require(path.join(prefix, "node_modules", m));
const { MeterProvider, PeriodicExportingMetricReader, InMemoryMetricExporter, AggregationType,
        AggregationTemporality } = req("@opentelemetry/sdk-metrics");
const { resourceFromAttributes } = req("@opentelemetry/resources");

async function exportKnown(url, json) {
  const { OTLPMetricExporter } = req(json ? "@opentelemetry/exporter-metrics-otlp-http"
                                          : "@opentelemetry/exporter-metrics-otlp-proto");
  const memory = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const otlp = new PeriodicExportingMetricReader({ exporter: new OTLPMetricExporter({ url }),
                                                   exportIntervalMillis: 3600000 });
  const mem = new PeriodicExportingMetricReader({ exporter: memory, exportIntervalMillis: 3600000 });
  const provider = new MeterProvider({
    resource: resourceFromAttributes({ "service.name": "otlp-metrics-sdk-test" }),
    views: [{ instrumentName: "gen_ai.*", aggregation: { type: AggregationType.EXPONENTIAL_HISTOGRAM } }],
    readers: [otlp, mem],
  });
  const meter = provider.getMeter("otlp_metrics_sdk.cjs", "1.0.0");
  const dur = meter.createHistogram("gen_ai.client.operation.duration", { unit: "s" });
  const tok = meter.createHistogram("gen_ai.client.token.usage", { unit: "{token}" });
  const a = { "gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "server.port": 8000 };
  for (const v of [0.05, 0.1, 0.1, 0.25, 2.5, 0])
    dur.record(v, a);
  for (const v of [7, 7, 120, 4096])
    tok.record(v, Object.assign({ "gen_ai.token.type": "input" }, a));
  for (const v of [1, 3])
    tok.record(v, Object.assign({ "gen_ai.token.type": "output" }, a));
  await provider.forceFlush();
  const out = [];
  for (const rm of memory.getMetrics())
    for (const sm of rm.scopeMetrics)
      for (const m of sm.metrics)
        out.push({
          name: m.descriptor.name, unit: m.descriptor.unit, temporality: m.aggregationTemporality,
          points: m.dataPoints.map((p) => ({
            attributes: p.attributes, count: p.value.count, sum: p.value.sum, min: p.value.min, max: p.value.max,
            scale: p.value.scale, zeroCount: p.value.zeroCount, offset: p.value.positive.offset,
            counts: p.value.positive.bucketCounts,
          })),
        });
  await provider.shutdown();
  process.stdout.write(JSON.stringify(out));
}

const mode = process.argv[3];
if (mode === "export") {
  exportKnown(process.argv[4], process.argv[5] === "json").catch((e) => { console.error(e && e.stack || e); process.exit(1); });
} else {
  console.error("usage: otlp_metrics_sdk.cjs NODE_PREFIX export URL [json]");
  process.exit(2);
}
