/*
 * otlp_json.h — OTLP/JSON: an OTLP message (protoc-c, proto/otlp_*.proto)
 * as the JSON body of an OTLP/HTTP export with Content-Type
 * application/json (docs/observability.md, "Protocols").
 *
 * The encoding is protobuf's JSON mapping with OTLP's exceptions, as the
 * OTLP specification defines it (specification.md, "JSON Protobuf
 * Encoding"): object keys are the fields' names in lowerCamelCase;
 * traceId, spanId and parentSpanId are hex strings (not base64); enum
 * values are integers; 64-bit integers are decimal strings; other bytes are
 * base64. As the mapping has it, a field at its default is left out unless
 * it has presence (proto2 `optional`, a oneof member), and a non-finite
 * double is "NaN", "Infinity" or "-Infinity".
 *
 * It walks the message's protoc-c descriptor, so the field names of
 * proto/otlp_*.proto are on this wire: they must stay the specification's.
 * The exporters' threads call it, never a worker.
 */
#pragma once

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

/* The message as compact JSON: malloc'd text of *len bytes (NUL-terminated),
 * or NULL out of memory. */
char *otlp_json_encode(const ProtobufCMessage *m, size_t *len);
