/*
 * wsframe.h — incremental, bounded parser of WebSocket frames (RFC 6455
 * section 5), one per direction of a tunnelled connection.
 *
 * Fed whatever slices the socket produced, it keeps at most a frame header
 * (14 bytes) between calls and never the payload: payload bytes go to the
 * `payload` hook unmasked (in pieces of at most WSF_CHUNK bytes), or are
 * only counted when there is no hook. It checks what a proxy must know to
 * stay in step with the stream and what the format forbids: the mask (a
 * client's frames masked, a server's not), reserved opcodes, control frames
 * fragmented or over 125 bytes, a continuation with no message begun, a new
 * message inside a fragmented one, a 64-bit length with its top bit set,
 * and tokentap's limits on a frame's and a message's payload. The first
 * violation sets `err`, once, and nothing more of the stream is parsed (the
 * caller ends the connection: a length-prefixed stream has no point to
 * resync at). RSV bits are passed on (extensions such as permessage-deflate
 * are the endpoints' business): a message whose first frame has RSV1 set is
 * flagged `compressed`. Control frames may come between the fragments of a
 * message (section 5.4); they do not end it. The bytes themselves are
 * forwarded by the caller untouched.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WSF_CHUNK 4096u	     /* payload bytes handed to one payload hook call, at most */
#define WSF_CONTROL_MAX 125u /* a control frame's payload (RFC 6455 5.5) */
#define WSF_HEADER_MAX 14u   /* 2 + 8 (extended length) + 4 (mask) */

enum wsf_op {
	WSF_OP_CONT = 0x0,
	WSF_OP_TEXT = 0x1,
	WSF_OP_BINARY = 0x2,
	WSF_OP_CLOSE = 0x8,
	WSF_OP_PING = 0x9,
	WSF_OP_PONG = 0xA,
};

/* Why a stream stopped being parsed. Append only. */
enum wsf_error {
	WSF_OK = 0,
	WSF_ERR_OPCODE,		  /* a reserved opcode (3-7, 0xB-0xF) */
	WSF_ERR_MASK,		  /* a client frame unmasked, or a server frame masked */
	WSF_ERR_CONTROL_LENGTH,	  /* a control frame over 125 bytes */
	WSF_ERR_CONTROL_FRAGMENT, /* a control frame without FIN */
	WSF_ERR_CONTINUATION,	  /* a continuation frame with no message begun */
	WSF_ERR_INTERLEAVED,	  /* a new data frame inside a fragmented message */
	WSF_ERR_LENGTH,		  /* a 64-bit length with its most significant bit set */
	WSF_ERR_FRAME_TOO_BIG,	  /* a frame's payload past limits.max_frame */
	WSF_ERR_MESSAGE_TOO_BIG,  /* a message's payload past limits.max_message */
};

/* The frame being parsed, as its header said. */
struct wsf_frame {
	uint8_t opcode; /* enum wsf_op */
	bool fin, rsv1, masked;
	uint64_t len; /* payload bytes */
	uint8_t mask[4];
	/* data frames: the opcode of the message it belongs to (a
	 * continuation's: its first frame's); control frames: their own */
	uint8_t msg_opcode;
	bool msg_compressed; /* the message's first frame had RSV1 */
	bool msg_first;	     /* the first frame of its message (a control frame: always) */
};

struct wsf_hooks {
	/* A frame's header has parsed (before any of its payload). */
	void (*frame)(void *arg, const struct wsf_frame *f);
	/* Payload bytes of the current frame, unmasked; NULL: only counted. */
	void (*payload)(void *arg, const struct wsf_frame *f, const uint8_t *p, size_t n);
	/* The current frame has ended (its payload all passed); a data frame
	 * with f->fin ends its message. */
	void (*frame_end)(void *arg, const struct wsf_frame *f);
};

struct wsf_limits {
	uint64_t max_frame;   /* payload bytes of one frame; 0: no limit */
	uint64_t max_message; /* payload bytes of one message, its fragments together; 0: no limit */
};

/* One direction of a connection; embedded in its owner. */
struct wsf_parser {
	bool from_client; /* frames must be masked (and a server's must not) */
	struct wsf_limits lim;
	const struct wsf_hooks *hooks; /* NULL: frames only checked and counted */
	void *arg;
	enum wsf_error err;
	bool err_split; /* the frame that broke the rule began in an earlier call (wsf_feed) */
	/* counted */
	uint64_t frames, messages, control_frames;
	/* state */
	uint8_t hdr[WSF_HEADER_MAX];
	unsigned hdr_len;   /* header bytes held */
	bool in_payload;    /* the header is done; `left` payload bytes to come */
	uint64_t left, at;  /* payload bytes left; taken so far (the mask's phase) */
	struct wsf_frame f; /* the current frame */
	bool in_message;    /* a fragmented data message is open */
	uint8_t msg_opcode;
	bool msg_compressed;
	uint64_t msg_bytes; /* payload of the open message so far */
};

void wsf_init(struct wsf_parser *p, bool from_client, const struct wsf_limits *lim, const struct wsf_hooks *hooks,
	      void *arg);

/*
 * Parses `len` more bytes of the stream. Returns the bytes taken: all of
 * them, unless the stream broke a rule (p->err set), then those of this
 * call before the frame that broke it (0 when its header began in an
 * earlier call, which took those bytes: a caller that forwarded them cannot
 * end the stream on a frame boundary). `*boundary` (NULL: not wanted) is how many of the
 * bytes taken end at a frame boundary (the bytes of a whole frame, or of a
 * frame begun before this call, are all counted once it ends).
 */
size_t wsf_feed(struct wsf_parser *p, const uint8_t *buf, size_t len, size_t *boundary);

/* Between frames: nothing of a frame is held or owed. */
bool wsf_at_boundary(const struct wsf_parser *p);

/* The error's name, for the log and the access log's error text. */
const char *wsf_error_name(enum wsf_error e);
/* The close status (RFC 6455 7.4.1) that answers `e`: 1009 for a size
 * limit, 1002 for the rest. */
uint16_t wsf_error_close_code(enum wsf_error e);

/*
 * Writes a close frame with `code` and `reason` (cut to fit a control
 * frame) into `out`, which holds WSF_HEADER_MAX + WSF_CONTROL_MAX bytes:
 * masked with `mask` when `mask` is not NULL (a frame to a server).
 * Returns its length.
 */
size_t wsf_close_frame(uint8_t *out, uint16_t code, const char *reason, const uint8_t *mask);
