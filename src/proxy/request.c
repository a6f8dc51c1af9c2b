/*
 * request.c — the request object: its head noted into the record, its id,
 * what the body prefix tells the router (model, stream flag, sticky field),
 * the body framed for the upstream and the shadow, routing orchestrated
 * (exchange_pick, the shadow, exchange_admit), and the outcome recorded
 * once. It reads no client field: the client (client.c) owns the request
 * and is the owner its exchange reaches through the hooks.
 */
#include "request.h"

#include <event2/buffer.h>
#include <llhttp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bevio.h"
#include "classify.h"
#include "config.h"
#include "exchange.h"
#include "log.h"
#include "meter.h"
#include "mirror.h"
#include "otlp_metrics.h"
#include "reqinfo.h"
#include "router.h"
#include "strutil.h"
#include "tenant.h"
#include "timeline.h"
#include "workload.h"

/* Request ids: 128 bits from a random seed and a counter, mixed so that ids
 * look random yet never repeat within a process. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

void request_id_generate(struct request_ids *ids, char *out, size_t len)
{
	uint64_t hi = mix64(ids->seed + ++ids->counter);
	snprintf(out, len, "%016llx%016llx", (unsigned long long)hi, (unsigned long long)mix64(hi ^ ids->seed));
}

/* A client-supplied id is kept only when it is safe to log and forward. */
static bool request_id_acceptable(const char *s, size_t len)
{
	if (len == 0 || len > REQUEST_ID_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\')
			return false;
	}
	return true;
}

/* (s, len) without the spaces and tabs around it. */
static inline __attribute__((always_inline)) void trim_ows(const char **s, size_t *len)
{
	while (*len && ((*s)[0] == ' ' || (*s)[0] == '\t'))
		(*s)++, (*len)--;
	while (*len && ((*s)[*len - 1] == ' ' || (*s)[*len - 1] == '\t'))
		(*len)--;
}

static int g_env_sampler = -1;	/* OTEL_TRACES_SAMPLER's, or -1 */
static double g_env_ratio = -1; /* OTEL_TRACES_SAMPLER_ARG's, or -1 */

static void request_sampler_env(void)
{
	const char *v = getenv("OTEL_TRACES_SAMPLER"), *arg = getenv("OTEL_TRACES_SAMPLER_ARG");
	char *end;

	if (v && *v && (g_env_sampler = trace_sampler_parse(v)) < 0)
		log_warn("OTEL_TRACES_SAMPLER=%s is not a sampler tokentap knows: parentbased_always_on instead", v);
	if (v && *v && g_env_sampler < 0)
		g_env_sampler = SAMPLER_PARENT_ON;
	if (g_env_sampler >= 0 && arg && *arg) {
		double r = strtod(arg, &end);
		if (end == arg || *end || !(r >= 0 && r <= 1))
			log_warn("OTEL_TRACES_SAMPLER_ARG=%s is not a ratio from 0 to 1: ignored", arg);
		else
			g_env_ratio = r;
	}
}

/* The sampler and its ratio: tracing.sampler with tracing.sample_ratio when
 * the file names one; else OTEL_TRACES_SAMPLER with OTEL_TRACES_SAMPLER_ARG
 * (the ratio, else tracing.sample_ratio), read once; else
 * parentbased_traceidratio at tracing.sample_ratio (parentbased_always_on at
 * its default 1). An unknown name was refused at load (the file) or warned
 * of at start (the environment, then the default as the SDKs do). */
static enum trace_sampler sampler_of(const struct config *cfg, double *ratio)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	*ratio = cfg->trace_ratio;
	if (cfg->trace_sampler) {
		int s = trace_sampler_parse(cfg->trace_sampler);
		return s < 0 ? SAMPLER_PARENT_RATIO : (enum trace_sampler)s;
	}
	pthread_once(&once, request_sampler_env);
	if (g_env_sampler < 0)
		return SAMPLER_PARENT_RATIO;
	if (g_env_ratio >= 0)
		*ratio = g_env_ratio;
	return (enum trace_sampler)g_env_sampler;
}

/*
 * The request's trace (W3C Trace Context, tracectx.h). Exactly one valid
 * traceparent: its trace goes on, sampled as the sampler says (by default
 * the client's flag: sampler_of), and
 * tokentap's span (a new id) is the parent the upstream sees; the client's
 * tracestate goes with it when the list is valid and within bounds. No
 * traceparent, a broken one or several: a new trace when the route
 * generation's tracing.new_traces says so, sampled as the sampler says,
 * else none (the upstream then gets no traceparent and no tracestate, so a
 * broken one is never passed on). One span per request: a failover or a
 * shadow copy sends the same traceparent (exchange_head_write).
 */
static void request_trace(struct request *req)
{
	const struct reqhead *rh = &req->head;
	const struct config *cfg = &req->x.rt->cfg;
	struct trace_rng *rng = &req->env->trace_rng;
	struct tracestate_scan sc;
	const char *tp = NULL;
	size_t tplen = 0;
	unsigned ntp = 0;
	bool state_ok = true;

	memset(&sc, 0, sizeof(sc));
	for (unsigned i = 0; i < rh->nhdr; i++) {
		const struct hdr *h = &rh->hdrs[i];
		if (h->kind != HDR_TRACEPARENT && h->kind != HDR_TRACESTATE)
			continue;
		const char *val = rh->buf + h->val_off;
		size_t vlen = h->val_len;
		trim_ows(&val, &vlen);
		if (h->kind == HDR_TRACEPARENT) {
			ntp++;
			tp = val;
			tplen = vlen;
		} else if (state_ok) {
			state_ok = tracestate_add(&sc, val, vlen) == 0;
		}
	}
	double ratio;
	enum trace_sampler smp = sampler_of(cfg, &ratio);
	if (ntp == 1 && tracectx_parse(tp, tplen, &req->rec.trace) == 0) {
		req->rec.traced = true;
		req->rec.has_parent = true;
		memcpy(req->rec.parent_span_id, req->rec.trace.span_id, sizeof(req->rec.parent_span_id));
		req->rec.trace_state = state_ok && sc.members > 0;
		bool on = trace_sample(smp, ratio, req->rec.trace.trace_id, &req->rec.trace);
		req->rec.trace.flags =
			(uint8_t)((req->rec.trace.flags & ~TRACE_FLAG_SAMPLED) | (on ? TRACE_FLAG_SAMPLED : 0));
	} else if (cfg->trace_new) {
		req->rec.traced = true;
		trace_rng_id(rng, req->rec.trace.trace_id, sizeof(req->rec.trace.trace_id));
		req->rec.trace.flags = trace_sample(smp, ratio, req->rec.trace.trace_id, NULL) ? TRACE_FLAG_SAMPLED : 0;
	} else {
		return;
	}
	trace_rng_id(rng, req->rec.trace.span_id, sizeof(req->rec.trace.span_id));
}

/* ---- request objects ---- */

/*
 * Finished requests are kept for the next ones of the same worker
 * (request_retire, at most REQUEST_SPARES of them, env->spares), with the
 * buffers they grew: the head's buffer and header array, the exchange's
 * pending and replay buffers and its timers; the body prefix's buffer (64
 * KiB, let go once the prefix is read) is kept once per worker. So a
 * request on a kept connection (or a new one) is made without a calloc of
 * the whole object, its buffers and its timer. The worker's, not each
 * connection's: an idle connection holds none, and the spares number no
 * more than the requests that finished while others had not yet begun.
 */

char *request_prefix_buf(struct request *req)
{
	if (!req->body_prefix) {
		req->body_prefix = req->env->prefix_spare ? req->env->prefix_spare : malloc(BODY_INSPECT_MAX);
		req->env->prefix_spare = NULL;
	}
	return req->body_prefix;
}

/* The body prefix read (or the request over): its buffer kept for the
 * worker's next one when none is kept yet, else freed. */
static void request_prefix_drop(struct request *req)
{
	if (!req->body_prefix)
		return;
	if (!req->env->prefix_spare)
		req->env->prefix_spare = req->body_prefix;
	else
		free(req->body_prefix);
	req->body_prefix = NULL;
}

/* A spare made ready: zeroed as calloc would, but for what it keeps. */
static struct request *request_renew(struct request *req)
{
	CHECK_OBJ(req, REQUEST_MAGIC);
	struct reqhead head = req->head;
	struct evbuffer *pending = req->x.pending, *replay = req->x.replay_spare;
	struct loop_deadline timer = req->x.timer;
	struct event *deadline = req->x.deadline;

	memset(req, 0, sizeof(*req));
	req->head = head;
	req->x.pending = pending;
	req->x.replay_spare = replay;
	req->x.timer = timer;
	req->x.deadline = deadline;
	return req;
}

struct request *request_new(struct request_env *env, const struct exchange_hooks *hooks, void *owner,
			    uint64_t arrive_ns, uint64_t log_id)
{
	const struct config *cfg = &env->router->cfg;
	const struct reqparse_limits lim = { cfg->max_header_size, cfg->max_headers, cfg->max_body_size };
	struct request *spare = env->spares, *req;

	if (spare) {
		env->spares = spare->next_spare;
		env->nspares--;
		req = request_renew(spare);
	} else if (!(req = calloc(1, sizeof(*req)))) {
		return NULL;
	}
	OBJ_MAGIC_SET(req, REQUEST_MAGIC);
	req->env = env;
	req->x.rt = env->router;
	router_ref(req->x.rt);
	req->rec.usage = USAGE_UNKNOWN;
	req->rec.inputs = -1;
	req->rec.stream = -1;
	req->rec.itl_keep = env->x.meter.alog != NULL || otlp_metrics_active(); /* the gaps are samples of both */
	req->rec.at[TL_ARRIVE] = arrive_ns;
	if ((spare ? reqhead_reset(&req->head, &lim) : reqhead_init(&req->head, &lim)) == -1 ||
	    exchange_init(&req->x, &env->x, hooks, owner, &req->rec, &req->head, env->router, log_id, false) == -1) {
		request_free(req);
		return NULL;
	}
	return req;
}

/* What a finished request holds and gives back, whether its memory goes
 * (request_free) or is kept as a spare (request_retire, `keep`). */
static void request_drop_parts(struct request *req, bool keep)
{
	exchange_release(&req->x, false);
	tunnel_free(&req->tunnel);
	if (req->mirror)
		mirror_detach(req->mirror, req->x.body_done);
	if (keep)
		exchange_recycle(&req->x);
	else
		exchange_free(&req->x);
	workload_req_free(req->rec.wl);
	record_release(&req->rec);
	free(req->chain);
	router_unref(req->x.rt);
	req->chain = NULL;
	req->rec.wl = NULL;
	req->mirror = NULL;
	req->x.rt = NULL;
}

void request_free(struct request *req)
{
	if (!req)
		return;
	CHECK_OBJ(req, REQUEST_MAGIC);
	request_drop_parts(req, false);
	reqhead_free(&req->head);
	free(req->body_prefix);
	OBJ_MAGIC_CLEAR(req);
	free(req);
}

void request_retire(struct request *req)
{
	if (!req)
		return;
	CHECK_OBJ(req, REQUEST_MAGIC);
	struct request_env *env = req->env;
	if (env->nspares >= REQUEST_SPARES) {
		request_free(req);
		return;
	}
	request_drop_parts(req, true);
	request_prefix_drop(req);
	req->next_spare = env->spares;
	env->spares = req;
	env->nspares++;
}

void request_env_spares_free(struct request_env *env)
{
	free(env->prefix_spare);
	env->prefix_spare = NULL;
	while (env->spares) {
		struct request *req = env->spares;
		env->spares = req->next_spare;
		request_free(req);
	}
	env->nspares = 0;
}

/* Each request is logged and counted once, when its outcome is known
 * (meter_finish). */
void request_record(struct request *req)
{
	CHECK_OBJ(req, REQUEST_MAGIC);
	exchange_meter_label(&req->x);
	if (meter_finish(&req->x.meter))
		upstream_count_outcome(req->x.up, req->x.meter.rec);
}

/* What the record takes from a parsed head: method, path, API, id and the
 * default stream flag. Runs once per request, when the head has parsed,
 * whether it is then dispatched or refused (a refused request is logged
 * with them). */
void request_note_head(struct request *req)
{
	const struct reqhead *rh = &req->head;
	const char *method = llhttp_method_name(rh->method);
	const char *url = rh->buf + rh->url_off;
	const struct hdr *h;
	size_t plen = 0;

	if (req->rec.at[TL_REQ_HEADERS])
		return;
	timeline_mark(&req->rec, TL_REQ_HEADERS, clock_now_ns());
	copy_trunc(req->rec.method, sizeof(req->rec.method), method, strlen(method));
	while (plen < rh->url_len && url[plen] != '?' && url[plen] != '#')
		plen++;
	copy_trunc(req->rec.path, sizeof(req->rec.path), url, plen);
	req->rec.api = classify_api(url, plen);
	{
		const char *model;
		size_t mlen = classify_path_model(req->rec.api, url, plen, &model);
		if (mlen)
			copy_trunc(req->rec.model, sizeof(req->rec.model), model, mlen); /* Gemini: the body has none */
	}
	h = reqhead_kind(rh, HDR_X_REQUEST_ID);
	if (h && request_id_acceptable(rh->buf + h->val_off, h->val_len))
		copy_trunc(req->rec.id, sizeof(req->rec.id), rh->buf + h->val_off, h->val_len);
	else
		request_id_generate(&req->env->ids, req->rec.id, sizeof(req->rec.id));
	request_trace(req);
	if (req->rec.api == API_OLLAMA_CHAT || req->rec.api == API_OLLAMA_GENERATE)
		req->rec.stream = 1; /* Ollama streams unless told not to */
	else if (req->rec.api == API_GEMINI_STREAM)
		req->rec.stream = 1; /* the method says it, not the body */
	else
		req->rec.stream = classify_path_streams(req->rec.api, url, plen) ? 1 : 0;
	size_t moff, mlen;
	if (classify_bedrock_path_model(url, plen, &moff, &mlen)) {
		req->model_in_path = true;
		reqinfo_path_model(url + moff, mlen, req->rec.model, sizeof(req->rec.model));
	}
}

/* The prefix policy's key: the hash chain of the workload capture
 * (workload.h) over the prompt text of the body prefix, in blocks of
 * PREFIX_BLOCK_TOKENS (at 4 bytes a token), with no salt, so that every
 * tokentap of a fleet computes the same one. A chat body's key is the
 * chain through the end of its first user message, which every later turn
 * of the conversation resends unchanged and which tells conversations over
 * one system prompt apart, when that end lies within the first `want`
 * blocks; any other body's (no user message, or its end past them) is the
 * hash of the last whole block among the first `want` (the one open block
 * when the prompt is shorter than one), which stands for every block
 * before it. The scan stops once that is known. With `keep` (latency), the
 * chain of every whole block is kept for the choice too (x.pick.chain). */
static void request_prefix_key(struct request *req, unsigned want, bool keep)
{
	static const uint8_t no_salt[16];
	size_t block = (size_t)PREFIX_BLOCK_TOKENS * WL_BYTES_PER_TOKEN, done = 0;
	uint64_t cap = (uint64_t)want * block, turn_hash, turn_bytes;
	struct wl_req *w = wl_req_new(no_salt, block);
	const uint64_t *h;

	if (!w)
		return; /* out of memory: routed as if the prompt were unknown */
	while (done < req->body_prefix_len && wl_req_prompt_bytes(w) <= cap && (keep || !wl_req_first_turn_seen(w))) {
		size_t take = req->body_prefix_len - done < 4096 ? req->body_prefix_len - done : 4096;
		wl_req_feed(w, req->body_prefix + done, take);
		done += take;
	}
	uint64_t whole = wl_req_prompt_bytes(w) / block;
	size_t n = wl_req_hashes(w, &h);
	size_t k = whole ? (whole < want ? whole : want) : (n ? 1 : 0);
	if (wl_req_first_turn(w, &turn_hash, &turn_bytes) && turn_bytes <= cap) {
		req->x.pick.has_prefix = true;
		req->x.pick.prefix_key = turn_hash;
		req->x.pick.prefix_blocks = (unsigned)((turn_bytes + block - 1) / block);
	} else if (k && h) {
		req->x.pick.has_prefix = true;
		req->x.pick.prefix_key = h[k - 1];
		req->x.pick.prefix_blocks = (unsigned)k;
	}
	if (keep && whole && h && !req->chain) {
		size_t m = whole < n ? whole : n;
		if (m > want)
			m = want;
		if ((req->chain = malloc(m * sizeof(*req->chain)))) {
			memcpy(req->chain, h, m * sizeof(*req->chain));
			req->x.pick.chain = req->chain;
			req->x.pick.nchain = (unsigned)m;
		}
	}
	workload_req_free(w);
}

/* The tenant's source for a request of route `r`: the route's own, else
 * the top level's. */
static const struct tenant_conf *tenant_conf_of(const struct config *cfg, const struct route *r)
{
	if (r && r->conf->tenant.source != TENANT_NONE)
		return &r->conf->tenant;
	return &cfg->tenant;
}

/* The value of header `name` when the request has exactly one (trimmed);
 * two or more: *many. */
static bool header_once(const struct reqhead *rh, const char *name, const char **val, size_t *vlen, bool *many)
{
	unsigned n = 0;

	for (unsigned i = 0; i < rh->nhdr; i++) {
		const struct hdr *h = &rh->hdrs[i];
		if (!name_eq(rh->buf + h->name_off, h->name_len, name))
			continue;
		if (n++ == 0) {
			*val = rh->buf + h->val_off;
			*vlen = h->val_len;
			trim_ows(val, vlen);
		}
	}
	*many = n > 1;
	return n == 1;
}

/* An API key's tenant: its configured name (tenant.keys, by the key's
 * SHA-256), else its salted label. Neither the key nor its plain SHA-256
 * is kept. */
static void tenant_of_key(const struct config *cfg, const char *key, size_t len, char *out)
{
	char sha[65];

	if (cfg->ntenant_keys) {
		tenant_key_sha256(key, len, sha);
		size_t lo = 0, hi = cfg->ntenant_keys;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			int c = strcmp(cfg->tenant_keys[mid].sha256, sha);
			if (c == 0) {
				copy_trunc(out, TENANT_MAX + 1, cfg->tenant_keys[mid].name,
					   strlen(cfg->tenant_keys[mid].name));
				explicit_bzero(sha, sizeof(sha));
				return;
			}
			if (c < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		explicit_bzero(sha, sizeof(sha));
	}
	const char *salt = cfg->tenant_salt ? cfg->tenant_salt : "";
	tenant_key_label(salt, strlen(salt), key, len, out);
}

/* The request's tenant (rec.tenant), by the `tenant:` of route `r` (NULL:
 * matched here, only when some `tenant:` is set), from its head, or from
 * `json`, the value of the route's JSON field (NULL: the body was not
 * JSON). Two headers of the source's name, or an Authorization with both a
 * bearer and an x-api-key that differ, are TENANT_INVALID: which one
 * counts would be the client's choice. */
static void request_tenant(struct request *req, const struct route *r, const char *json)
{
	const struct config *cfg = &req->x.rt->cfg;

	if (!cfg->tenant_any)
		return;
	if (!r)
		r = req->x.route ? req->x.route : exchange_match(&req->x);
	const struct tenant_conf *t = tenant_conf_of(cfg, r);
	const char *v = NULL;
	size_t vlen = 0;
	bool many = false;
	char *out = req->rec.tenant;

	out[0] = '\0';
	req->rec.tenant_on = t->source != TENANT_NONE;
	switch (t->source) {
	case TENANT_NONE: return;
	case TENANT_HEADER:
		if (header_once(&req->head, t->name, &v, &vlen, &many))
			(void)tenant_take(v, vlen, out);
		else if (many)
			copy_trunc(out, TENANT_MAX + 1, TENANT_INVALID, strlen(TENANT_INVALID));
		return;
	case TENANT_JSON_FIELD:
		if (json)
			(void)tenant_take(json, strlen(json), out);
		return;
	case TENANT_API_KEY: {
		const char *a = NULL, *k = NULL, *tok = NULL;
		size_t alen = 0, klen = 0, toklen = 0;
		bool amany = false, kmany = false;
		bool has_a = header_once(&req->head, "authorization", &a, &alen, &amany);
		bool has_k = header_once(&req->head, "x-api-key", &k, &klen, &kmany);
		bool bearer = has_a && tenant_bearer(a, alen, &tok, &toklen);
		if (amany || kmany || (bearer && has_k && (toklen != klen || memcmp(tok, k, klen) != 0))) {
			copy_trunc(out, TENANT_MAX + 1, TENANT_INVALID, strlen(TENANT_INVALID));
			return;
		}
		if (bearer)
			tenant_of_key(cfg, tok, toklen, out);
		else if (has_k && klen)
			tenant_of_key(cfg, k, klen, out);
		return;
	}
	}
}

/* Reads the model, stream flag and any sticky field from the body prefix;
 * then routes the request if routing was waiting for them. The sticky field
 * is the one of the route the request matches, which may depend on the
 * model: so the model first, then the route, then (a second read of the
 * prefix) that route's field. */
void request_learn_body(struct request *req, bool complete)
{
	struct reqinfo info;
	const struct route *r = NULL;
	const struct config *cfg = &req->x.rt->cfg;
	/* the top level's tenant field is read in the same pass; a route's
	 * own, once the route is known, in a second one */
	const char *tfield = cfg->tenant.source == TENANT_JSON_FIELD ? cfg->tenant.name : NULL;
	char tvalue[REQINFO_MODEL_MAX];
	bool tjson = false;

	if (req->reqinfo_done)
		return;
	req->reqinfo_done = true;
	if (req->body_prefix_len && reqinfo_parse_inputs_field(req->body_prefix, req->body_prefix_len, complete,
							       classify_inputs_key(req->rec.api), tfield, &info) == 0) {
		if (tfield) {
			copy_trunc(tvalue, sizeof(tvalue), info.field_value, strlen(info.field_value));
			tjson = true;
		}
		bool gemini = req->rec.api == API_GEMINI || req->rec.api == API_GEMINI_STREAM;
		/* Gemini's model and streaming are in its path (request_note_head),
		 * and Bedrock's body names no model: its path did */
		if (!gemini && !req->model_in_path)
			copy_trunc(req->rec.model, sizeof(req->rec.model), info.model, strlen(info.model));
		req->rec.inputs = info.inputs;
		const char *alt = classify_inputs_alt_key(req->rec.api);
		if (info.inputs < 0 && alt &&
		    reqinfo_parse_inputs(req->body_prefix, req->body_prefix_len, complete, alt, &info) == 0)
			req->rec.inputs = info.inputs;
		if (info.stream >= 0 && !gemini)
			req->rec.stream = info.stream;
		r = exchange_match(&req->x);
		if (r && r->conf->balance == BALANCE_PREFIX)
			request_prefix_key(req, r->conf->prefix_blocks, false);
		else if (r && r->conf->balance == BALANCE_LATENCY && r->ntargets > 1)
			request_prefix_key(req, PREFIX_BLOCKS_MAX, true);
		if (r && r->conf->sticky == STICKY_JSON_FIELD &&
		    reqinfo_parse_field(req->body_prefix, req->body_prefix_len, complete, r->conf->sticky_key, &info) ==
			    0)
			copy_trunc(req->x.sticky_value, sizeof(req->x.sticky_value), info.field_value,
				   strlen(info.field_value));
		const struct tenant_conf *t = tenant_conf_of(cfg, r);
		if (t->source == TENANT_JSON_FIELD && (!tfield || strcmp(t->name, tfield) != 0)) {
			tjson = reqinfo_parse_field(req->body_prefix, req->body_prefix_len, complete, t->name, &info) ==
				0;
			if (tjson)
				copy_trunc(tvalue, sizeof(tvalue), info.field_value, strlen(info.field_value));
		}
	}
	request_tenant(req, r, tjson ? tvalue : NULL);
	/* A chunked body's size is known only as it comes: the choice counts
	 * what was read before routing (all of it when it ended within
	 * BODY_INSPECT_MAX; else that much, a floor) */
	if (req->head.chunked && req->x.xstate == XS_AWAIT_BODY && !req->x.pick.tokens)
		req->x.pick.tokens = (double)(uint64_t)(req->body_prefix_len / WL_BYTES_PER_TOKEN);
	request_prefix_drop(req);
	if (req->x.xstate == XS_AWAIT_BODY)
		request_route(req);
}

/* Body bytes for the upstream (and the mirror, if any), re-framed when the
 * client sent them chunked: chunk boundaries are tokentap's own. */
int request_body_bytes(struct request *req, const char *at, size_t len)
{
	char size_line[24] = "";
	int n = 0;
	bool bad = false; /* an add failed: out of memory */

	if (req->head.chunked)
		n = snprintf(size_line, sizeof(size_line), "%zx\r\n", len);
	bad |= evbuffer_add(req->x.pending, size_line, (size_t)n) == -1;
	bad |= evbuffer_add(req->x.pending, at, len) == -1;
	if (req->head.chunked)
		bad |= evbuffer_add(req->x.pending, "\r\n", 2) == -1;
	if (bad)
		return -1;
	if (req->mirror && n)
		mirror_feed(req->mirror, size_line, (size_t)n);
	if (req->mirror)
		mirror_feed(req->mirror, at, len);
	if (req->mirror && req->head.chunked)
		mirror_feed(req->mirror, "\r\n", 2);
	if (req->mirror)
		mirror_flush(req->mirror);
	workload_feed(&req->rec.wl, at, len);
	return 0;
}

int request_body_end(struct request *req)
{
	if (req->head.chunked) {
		if (evbuffer_add(req->x.pending, "0\r\n\r\n", 5) == -1)
			return -1;
		if (req->mirror)
			mirror_feed(req->mirror, "0\r\n\r\n", 5);
		if (req->mirror)
			mirror_flush(req->mirror);
	}
	req->x.body_done = true;
	if (req->mirror)
		mirror_body_done(req->mirror);
	request_learn_body(req, true);
	return 0;
}

int request_mirror_copy(const struct request *req, const struct upstream *shadow, struct evbuffer *out)
{
	if (exchange_head_write(&req->head, &req->rec, shadow, out) == -1)
		return -1;
	/* pending holds body bytes only here: the primary's head comes later */
	return bevio_copy(out, req->x.pending);
}

/* Starts the shadow copy: its own head, the body bytes so far, and from
 * now on every body byte the primary gets (request_body_bytes). Out of
 * memory for the copy: no shadow. */
static void request_mirror(struct request *req)
{
	struct request_env *renv = req->env;
	struct evbuffer *bytes = evbuffer_new();
	const struct mirror_env env = { &renv->x, &renv->mirrors, req->x.log_id };

	if (!bytes)
		return;
	if (request_mirror_copy(req, req->x.route->mirror, bytes) == -1) {
		evbuffer_free(bytes);
		return;
	}
	req->mirror =
		mirror_start(&env, req->x.route->mirror, req->x.route->name, req->x.route->conf->mirror_max_in_flight,
			     &req->x.meter, &req->head, bytes, &req->mirror);
	evbuffer_free(bytes);
	if (req->mirror && req->x.body_done)
		mirror_body_done(req->mirror);
}

/* Picks the route and the upstream, starts the shadow when the route
 * mirrors this request (not when the override header pinned the upstream),
 * then asks the upstream for a slot. Called once the head is parsed, or
 * once the body prefix is, when routing needs it. */
void request_route(struct request *req)
{
	bool pinned;

	/* Routed before its body was read (nothing routes on it): the tenant
	 * its head gives now, so that a request refused here or at admission
	 * has it; request_learn_body sets it again, a JSON field's included. */
	if (!req->reqinfo_done)
		request_tenant(req, NULL, NULL);
	if (exchange_pick(&req->x, &pinned) == XR_ENDED)
		return;
	/* a WebSocket is never mirrored: a shadow cannot tunnel */
	if (!pinned && !req->head.websocket && route_mirror_pick(req->x.route))
		request_mirror(req);
	(void)exchange_admit(&req->x);
}
