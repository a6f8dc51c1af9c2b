/*
 * eventstream.h — incremental framer for application/vnd.amazon.eventstream,
 * the binary framing of AWS's streamed answers (Bedrock's ConverseStream and
 * InvokeModelWithResponseStream).
 *
 * A message is a 12-byte prelude (total length, headers length, a CRC32 of
 * those 8 bytes), the headers, the payload and a CRC32 of everything before
 * it; integers are big-endian (docs/dev/wire-formats.md, section (l), gives
 * the sources). The framer is fed whatever slices the socket produced, keeps
 * the partial message between calls, checks both CRCs and every length, and
 * calls back once per message that passed them. One buffer per stream, grown
 * at most to `max_message` bytes: a longer message that is still within the
 * format's own bounds is skipped (counted in `oversized`), its CRC still
 * checked as it passes. Anything the format does not allow (a bad CRC, a
 * length past the format's bounds or below its minimum, headers overrunning
 * their section, an unknown header type, more than EVS_MAX_HEADER_COUNT
 * headers) is a protocol error: `error` is set, once, and nothing more of the
 * stream is framed, since a length-prefixed stream has no point to resync
 * at. The bytes themselves are forwarded by the caller untouched.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EVS_PRELUDE_LEN 12u
#define EVS_MIN_MESSAGE 16u	     /* a prelude and the message CRC: no headers, no payload */
#define EVS_MAX_HEADERS (128u << 10) /* the format's bound on the headers section */
#define EVS_MAX_PAYLOAD (16u << 20)  /* ... and on the payload */
#define EVS_MAX_MESSAGE (EVS_MIN_MESSAGE + EVS_MAX_HEADERS + EVS_MAX_PAYLOAD)
#define EVS_MAX_HEADER_COUNT 64u /* tokentap's: AWS sends three or four */

/* Why a stream stopped being framed. Append only. */
enum evs_error {
	EVS_OK = 0,
	EVS_ERR_SHORT,		/* total length below EVS_MIN_MESSAGE */
	EVS_ERR_LONG,		/* total length past EVS_MAX_MESSAGE */
	EVS_ERR_HEADERS_LENGTH, /* headers length past its bound or past the message */
	EVS_ERR_PRELUDE_CRC,
	EVS_ERR_MESSAGE_CRC,
	EVS_ERR_HEADER_OVERRUN, /* a header runs past the headers section */
	EVS_ERR_HEADER_TYPE,	/* a value type the format does not have */
	EVS_ERR_HEADER_NAME,	/* a header with an empty name */
	EVS_ERR_HEADER_COUNT,	/* more than EVS_MAX_HEADER_COUNT headers */
	EVS_ERR_TRUNCATED,	/* the body ended inside a message (evs_finish) */
};

/* What a message's `:message-type` header says. */
enum evs_msg_type {
	EVS_MSG_OTHER = 0, /* absent, not a string, or another value */
	EVS_MSG_EVENT,
	EVS_MSG_EXCEPTION, /* a modelled error: `:exception-type` names it */
	EVS_MSG_ERROR,	   /* an unmodelled one: `:error-code` names it */
};

/* A (pointer, length) view; p is NULL when absent. */
struct evs_str {
	const char *p;
	size_t n;
};

/* One message that passed every check. Pointers are valid only during the
 * callback; nothing is NUL-terminated. */
struct evs_message {
	enum evs_msg_type type;
	struct evs_str event_type;     /* `:event-type` */
	struct evs_str exception_type; /* `:exception-type` */
	struct evs_str error_code;     /* `:error-code` */
	struct evs_str content_type;   /* `:content-type` */
	unsigned headers;	       /* how many headers it had */
	const char *payload;
	size_t payload_len;
};

typedef void (*evs_cb)(void *arg, const struct evs_message *m);

struct evs_framer {
	evs_cb cb;
	void *arg;
	size_t max_message; /* buffered at most; a longer message is skipped */
	/* private: the message in progress */
	unsigned char prelude[EVS_PRELUDE_LEN];
	size_t prelude_have;
	uint32_t total, headers_len;
	size_t have;	       /* bytes after the prelude seen so far */
	unsigned char tail[4]; /* its last bytes: the message CRC */
	uint32_t crc;	       /* running CRC32 of the message so far */
	bool skip;	       /* longer than max_message: checked, not kept */
	char *buf;	       /* the bytes after the prelude, when kept */
	size_t cap;
	/* readable by the caller */
	enum evs_error error; /* sticky: once set, feed does nothing */
	uint64_t offset;      /* stream bytes consumed; at an error, where the failing message began */
	uint64_t messages;    /* delivered */
	uint64_t oversized;   /* skipped for max_message */
};

/* Prepares `f`; allocates nothing until a message needs buffering.
 * `max_message` 0 means 1 MiB; it is never taken above EVS_MAX_MESSAGE. */
void evs_init(struct evs_framer *f, size_t max_message, evs_cb cb, void *arg);

/* Consumes `len` bytes; calls `cb` for every message they complete. */
void evs_feed(struct evs_framer *f, const char *buf, size_t len);

/* End of body: a message left unfinished is EVS_ERR_TRUNCATED. */
void evs_finish(struct evs_framer *f);

/* Releases the buffer; safe on a zeroed or freed framer. */
void evs_free(struct evs_framer *f);

/* Short stable name of an error: "prelude_crc", ...; "ok" for EVS_OK. */
const char *evs_error_name(enum evs_error e);

/* Checks and reads one whole message at p (exactly `len` bytes, its total
 * length): what the framer does with a message, without the framer. */
enum evs_error evs_parse(const char *p, size_t len, struct evs_message *m);

/* Whether a view holds exactly the literal `lit`. */
bool evs_str_is(struct evs_str s, const char *lit);
