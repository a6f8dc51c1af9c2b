/*
 * prom_accept.h — does an Accept header ask /metrics for the protobuf
 * exposition (prom_proto.h)? A parser of untrusted input: no I/O, no
 * allocation, reads the NUL-terminated header and nothing past it
 * (tests/fuzz/fuzz_prom_accept.c).
 */
#pragma once

#include <stdbool.h>

/*
 * True when an Accept header asks for the protobuf exposition: it lists
 * application/vnd.google.protobuf with proto=io.prometheus.client.MetricFamily
 * and encoding=delimited at a q above 0, and gives no range that takes the
 * text format (text/plain, any text subtype, any type) a higher q. Names are
 * matched without regard to case, values may be quoted. NULL or anything
 * else: false (the text format).
 */
bool prom_accept_protobuf(const char *accept);
