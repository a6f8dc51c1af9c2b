/*
 * otlp_json.c — an OTLP message as OTLP/JSON, by its protoc-c descriptor
 * (otlp_json.h says the rules). The JSON is built with jansson and written
 * compact; one call per export, on an exporter's thread.
 */
#include "otlp_json.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *message_json(const ProtobufCMessage *m);

/* OTLP's ids are hex, every other bytes field base64. */
static bool hex_bytes(const char *name)
{
	return strcmp(name, "trace_id") == 0 || strcmp(name, "span_id") == 0 || strcmp(name, "parent_span_id") == 0;
}

/* snake_case to lowerCamelCase, as protobuf's JSON names are derived. */
static void camel(const char *name, char *out, size_t cap)
{
	size_t n = 0;
	bool up = false;

	for (const char *p = name; *p && n + 1 < cap; p++) {
		if (*p == '_') {
			up = true;
			continue;
		}
		out[n++] = up && *p >= 'a' && *p <= 'z' ? (char)(*p - 'a' + 'A') : *p;
		up = false;
	}
	out[n] = '\0';
}

static json_t *bytes_json(const char *name, const ProtobufCBinaryData *b)
{
	static const char hex[] = "0123456789abcdef";
	static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t cap = hex_bytes(name) ? b->len * 2 : (b->len + 2) / 3 * 4, n = 0;
	char *s = malloc(cap + 1);

	if (!s)
		return NULL;
	if (hex_bytes(name)) {
		for (size_t i = 0; i < b->len; i++) {
			s[n++] = hex[b->data[i] >> 4];
			s[n++] = hex[b->data[i] & 15];
		}
	} else {
		for (size_t i = 0; i < b->len; i += 3) {
			uint32_t v = (uint32_t)b->data[i] << 16;
			if (i + 1 < b->len)
				v |= (uint32_t)b->data[i + 1] << 8;
			if (i + 2 < b->len)
				v |= b->data[i + 2];
			s[n++] = b64[v >> 18 & 63];
			s[n++] = b64[v >> 12 & 63];
			s[n++] = i + 1 < b->len ? b64[v >> 6 & 63] : '=';
			s[n++] = i + 2 < b->len ? b64[v & 63] : '=';
		}
	}
	json_t *j = json_stringn(s, n);
	free(s);
	return j;
}

/* A string: the text when it is UTF-8 (what tokentap captures is kept so,
 * strutil.h), else with each byte outside ASCII as '?', never dropped. */
static json_t *string_json(const char *s)
{
	json_t *j = json_string(s);
	if (j)
		return j;
	char *c = strdup(s);
	if (!c)
		return NULL;
	for (char *p = c; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	j = json_string(c);
	free(c);
	return j;
}

static json_t *double_json(double v)
{
	if (isnan(v))
		return json_string("NaN");
	if (isinf(v))
		return json_string(v > 0 ? "Infinity" : "-Infinity");
	return json_real(v);
}

static json_t *decimal_json(uint64_t v, bool negative)
{
	char b[24];
	snprintf(b, sizeof(b), "%s%" PRIu64, negative ? "-" : "", v);
	return json_string(b);
}

/* The value at p of field f's type (one element of a repeated field). */
static json_t *value_json(const ProtobufCFieldDescriptor *f, const void *p)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32: return json_integer(*(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32: return json_integer(*(const uint32_t *)p);
	case PROTOBUF_C_TYPE_ENUM: return json_integer(*(const int *)p);
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64: {
		int64_t v = *(const int64_t *)p;
		return decimal_json(v < 0 ? 0 - (uint64_t)v : (uint64_t)v, v < 0);
	}
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64: return decimal_json(*(const uint64_t *)p, false);
	case PROTOBUF_C_TYPE_FLOAT: return double_json(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE: return double_json(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL: return json_boolean(*(const protobuf_c_boolean *)p);
	case PROTOBUF_C_TYPE_STRING: return string_json(*(char *const *)p);
	case PROTOBUF_C_TYPE_BYTES: return bytes_json(f->name, p);
	case PROTOBUF_C_TYPE_MESSAGE: return message_json(*(ProtobufCMessage *const *)p);
	}
	return NULL;
}

static size_t element_size(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64: return 8;
	case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
	case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
	case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
	case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
	case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
	case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
	default: return 4;
	}
}

/* Whether a singular field without presence holds its default (then it is
 * left out, as protobuf's JSON mapping does). */
static bool is_default(const ProtobufCFieldDescriptor *f, const void *p)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;
		return !s || !*s;
	}
	case PROTOBUF_C_TYPE_BYTES: return ((const ProtobufCBinaryData *)p)->len == 0;
	case PROTOBUF_C_TYPE_MESSAGE: return *(ProtobufCMessage *const *)p == NULL;
	case PROTOBUF_C_TYPE_DOUBLE: return *(const double *)p == 0 && !signbit(*(const double *)p);
	case PROTOBUF_C_TYPE_FLOAT: return *(const float *)p == 0 && !signbit(*(const float *)p);
	default: {
		static const uint8_t zero[8];
		return memcmp(p, zero, element_size(f->type)) == 0;
	}
	}
}

/* Whether field f of m is on the wire. */
static bool present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, const void *p)
{
	const char *base = (const char *)m;

	if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
		return *(const uint32_t *)(base + f->quantifier_offset) == f->id;
	switch (f->label) {
	case PROTOBUF_C_LABEL_REQUIRED: return true;
	case PROTOBUF_C_LABEL_OPTIONAL:
		/* proto2: a pointer's presence is the pointer, a scalar's its has_ */
		if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)
			return *(void *const *)p != NULL;
		return *(const protobuf_c_boolean *)(base + f->quantifier_offset);
	case PROTOBUF_C_LABEL_NONE: return !is_default(f, p);
	default: return false;
	}
}

static json_t *message_json(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	json_t *o = json_object();
	char key[128];

	if (!o)
		return NULL;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const char *p = (const char *)m + f->offset;
		json_t *v;

		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
			if (!n)
				continue;
			const char *arr = *(const char *const *)p;
			size_t sz = element_size(f->type);
			if (!(v = json_array()))
				goto oom;
			for (size_t k = 0; k < n; k++)
				if (json_array_append_new(v, value_json(f, arr + k * sz)) == -1) {
					json_decref(v);
					goto oom;
				}
		} else {
			if (!present(m, f, p))
				continue;
			if (!(v = value_json(f, p)))
				goto oom;
		}
		camel(f->name, key, sizeof(key));
		if (json_object_set_new(o, key, v) == -1)
			goto oom;
	}
	return o;
oom:
	json_decref(o);
	return NULL;
}

char *otlp_json_encode(const ProtobufCMessage *m, size_t *len)
{
	json_t *j = message_json(m);
	char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;

	json_decref(j);
	*len = s ? strlen(s) : 0;
	return s;
}
