/*
 * meter.h — measuring one response as it passes: written once, used by
 * every exchange (exchange.c), a primary request's and a shadow's alike.
 *
 * The owner's response parser (respparse) hands the meter the head, the body
 * bytes and the end (meter_head, meter_body, meter_complete); the meter
 * stamps the timeline, frames a streamed body into events (framer), finds
 * the token events and the usage (classify) and keeps the inter-token gaps
 * of one read as a run, recorded into the series once per read
 * (meter_read_end), when a gap of another length breaks the run, and at
 * meter_finish. meter_finish records the outcome once: the access log, the
 * stats series and, for a primary, the recent-requests ring.
 *
 * The meter never calls up: what its owner does on the same events (timers,
 * keep-alive, the connection's loop priority after the first token) the
 * owner does after calling it. The series is resolved once, at the first
 * ITL record or at meter_finish, from the labels its owner keeps current
 * (meter_label) before either can happen.
 *
 * A shadow (`shadow` at meter_init) is measured as a primary is, but its
 * outcome goes neither to the recent-requests ring nor to the workload
 * capture: both say what clients asked and were answered, and a shadow's
 * answer is a copy no client saw (the access log has it, marked `mirror`,
 * and so does its own series).
 *
 * Owner: embedded in the exchange (a request's or a mirror's) whose record
 * it fills; meter_free with it.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "classify.h"
#include "framer.h"

struct accesslog;
struct evbuffer;
struct recent;
struct req_record;
struct respparse;
struct series;
struct stats_shard;
struct upstream;

/* A non-streamed response body is kept up to this size, for its usage
 * (classify_body); a larger one is not read for it, except the last
 * RESP_TAIL_MAX bytes of a batch API's answer, whose usage comes after
 * its vectors (classify_body_tail). */
#define RESP_BODY_MAX (1u << 20)
#define RESP_TAIL_MAX (16u << 10)

/* Where records go; each may be NULL (not kept). */
struct paired_link;

struct meter_env {
	struct stats_shard *stats;
	struct accesslog *alog;
	struct recent *recent;
};

struct meter {
	struct meter_env env;
	struct req_record *rec;	      /* the owner's record, filled here */
	const struct respparse *resp; /* the owner's parser, whose hooks call this meter */
	bool shadow;
	size_t max_event_size; /* the framer's bound on one event */
	struct framer framer;
	bool framer_failed;    /* framer_error was noted (meter.c, note_framer_error) */
	struct evbuffer *body; /* a non-streamed body, up to RESP_BODY_MAX, for classify_body */
	bool body_tail;	       /* body holds only the last RESP_TAIL_MAX bytes of a larger one */
	bool json_array;       /* a 2xx answer framed as a JSON array (classify_streams_json_array) */
	uint64_t now;	       /* the clock reading of the read being parsed */
	/* ITL gaps not yet in the series: a run of equal ones (the events of
	 * one read share a clock reading), recorded as one. */
	uint64_t itl_run_gap, itl_run_n;
	struct series *series;	      /* resolved once, at the first record */
	const char *route, *upstream; /* labels; "none" until set */
	bool cold;
	unsigned load;		  /* requests on or queued for the upstream when routed, this one included */
	bool recorded;		  /* meter_finish ran */
	struct paired_link *pair; /* a mirrored request's link to its other half (paired.h); NULL: none */
};

/* `rec` and `resp` belong to the owner and outlive the meter. */
void meter_init(struct meter *m, const struct meter_env *env, struct req_record *rec, const struct respparse *resp,
		size_t max_event_size, bool shadow);
/* Accepts a zeroed meter; safe twice. */
void meter_free(struct meter *m);

/* The response measured so far is dropped: the request goes to another
 * upstream before any byte of it reached the client (exchange.c). The
 * framer, the body kept, and what the record took from the response (its
 * status, usage, events, the timeline from the connection on) are reset;
 * the labels, the pairing and the series (resolved only by a token gap or
 * by meter_finish, neither of which came) are kept. */
void meter_restart(struct meter *m);

/* The series' labels and the load, as the owner knows them now; NULL names
 * read "none". Strings are borrowed: they must last until the series is
 * resolved (the first ITL record or meter_finish). Once resolved, a new
 * label no longer moves the series. */
void meter_label(struct meter *m, const char *route, const char *upstream, bool cold, unsigned load);

/* A read from the upstream begins: its bytes were received at `now`. */
static inline void meter_read_begin(struct meter *m, uint64_t now)
{
	m->now = now;
}
/* ... and is parsed: the ITL run it left goes to the series. */
void meter_read_end(struct meter *m);

/* The response parser's hooks, called first by the owner's: the final head
 * (status, TL_RESP_HEADERS, the stream flag, the framer), body bytes, the
 * end (TL_RESP_END, the framer's last event or the body's usage, the
 * outcome the server's own word gives). */
void meter_head(struct meter *m, const struct respparse *rp);
void meter_body(struct meter *m, const char *at, size_t len);
/* meter_body of each slice in turn, the parser's whole chunks of one read */
void meter_body_v(struct meter *m, const struct framer_slice *v, size_t n);
void meter_complete(struct meter *m);
/* meter_body as the parser's body hook, for an owner that gives the parser
 * its meter as the hooks' `arg` (the owner has nothing to add there). */
void meter_resp_body(void *meter, const char *at, size_t len);

/* A token event found outside the framer (a realtime session's delta,
 * tunnel.c): counted, stamped at `now` and its gap into the ITL run, as a
 * framed one would be. */
void meter_token(struct meter *m, enum token_kind kind, uint64_t now);

/* The outcome is known: records the request once — the access log, the
 * last ITL run, the stats series and, for a primary, the recent ring — and
 * returns true; a second call does nothing and returns false. The
 * upstream's own counters are its owner's (upstream_count_outcome), so
 * that the meter knows nothing of upstreams. */
bool meter_finish(struct meter *m);

/* Links a primary's meter and its shadow's, so that the two records are
 * compared as a pair once both have finished (paired.h). */
void meter_pair(struct meter *primary, struct meter *shadow);

/* A shadow's record, from its primary's: the same id, method, path, model,
 * API, stream flag and arrival, marked as a mirror, usage unknown. */
void meter_record_shadow(struct req_record *dst, const struct req_record *primary);
