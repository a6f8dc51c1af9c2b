/*
 * scrape.c — the scraper's thread, its targets, and what an answer means.
 *
 * Only the scraper's thread touches its loop and its targets. The main
 * thread talks to it through `pending` (a new list of targets, or stop)
 * under `lock`, and an eventfd that wakes the loop. A target is one
 * upstream's metrics_url: a timer that starts a GET every interval (none
 * while the previous one runs), a deadline timer of the same length that
 * cancels a GET still running, and the connection, dropped after any
 * failure and made again at the next scrape. A connection is never freed
 * inside its own request's callback: the callback only marks it.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include "scrape.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/time.h>
#include <unistd.h>

#include "log.h"
#include "promtext.h"
#include "timeline.h"
#include "tls.h"

/* What one target scrapes; also the form a reload hands over. An https
 * metrics_url is verified as the upstream's own url is: its tls.verify and
 * tls.ca_file, and the name tls.server_name or else the metrics host. */
struct target_spec {
	char *name, *url, *metrics_url;
	struct metrics_url_parts parts;
	uint64_t interval_ms;
	enum engine_kind engine;
	bool tls_verify;
	char *tls_ca_file, *tls_name; /* NULL: the system store; the metrics host */
};

struct target {
	struct target_spec spec;
	struct scrape *s;
	struct event *tick;	/* the next scrape */
	struct event *deadline; /* the running one gives up */
	struct evhttp_connection *conn;
	struct evhttp_request *req; /* in flight, NULL none */
	bool drop_conn;		    /* free conn before the next scrape */
	SSL_CTX *tls_ctx;	    /* an https metrics_url's, made at its first scrape */
	enum evhttp_request_error req_error;
	bool req_failed;
	unsigned streak;   /* failures in a row */
	uint64_t failures; /* since start */
	uint64_t successes;
	struct engine_state last;
};

struct scrape {
	pthread_t thread;
	bool running;
	struct event_base *base;
	int wake_fd;
	struct event *wake_ev;
	struct target **targets;
	size_t ntargets;
	pthread_mutex_t lock; /* pending, stopping */
	struct target_spec *pending;
	size_t npending;
	bool have_pending, stopping;
};

const char *scrape_engine_name(enum engine_kind e)
{
	switch (e) {
	case ENGINE_VLLM: return "vllm";
	case ENGINE_SGLANG: return "sglang";
	case ENGINE_LLAMACPP: return "llamacpp";
	case ENGINE_AUTO: break;
	}
	return "auto";
}

/* ---- reading an answer ---- */

enum { E_VLLM, E_SGLANG, E_LLAMACPP, E__COUNT };

/* One engine's figures as they add up over the samples. */
struct acc {
	double running, waiting, kv, kv_old, hits, queries, old_hits, old_queries, hit_gauge;
	bool has_running, has_waiting, has_kv, has_kv_old, has_hits, has_queries, has_old, has_hit_gauge;
};

static void add(double *sum, bool *has, double v)
{
	*sum += v;
	*has = true;
}

static void take_max(double *m, bool *has, double v)
{
	if (!*has || v > *m)
		*m = v;
	*has = true;
}

static void on_sample(void *arg, const struct promtext_sample *s)
{
	struct acc *a = arg, *v = &a[E_VLLM], *g = &a[E_SGLANG], *l = &a[E_LLAMACPP];
	double x = s->value;

	if (!isfinite(x))
		return;
	if (promtext_name_is(s, "vllm:num_requests_running"))
		add(&v->running, &v->has_running, x);
	else if (promtext_name_is(s, "vllm:num_requests_waiting"))
		add(&v->waiting, &v->has_waiting, x);
	else if (promtext_name_is(s, "vllm:kv_cache_usage_perc"))
		take_max(&v->kv, &v->has_kv, x);
	else if (promtext_name_is(s, "vllm:gpu_cache_usage_perc")) /* its name before v0.10 */
		take_max(&v->kv_old, &v->has_kv_old, x);
	else if (promtext_name_is(s, "vllm:prefix_cache_queries_total"))
		add(&v->queries, &v->has_queries, x);
	else if (promtext_name_is(s, "vllm:prefix_cache_hits_total"))
		add(&v->hits, &v->has_hits, x);
	else if (promtext_name_is(s, "vllm:gpu_prefix_cache_queries_total"))
		add(&v->old_queries, &v->has_old, x);
	else if (promtext_name_is(s, "vllm:gpu_prefix_cache_hits_total"))
		add(&v->old_hits, &v->has_old, x);
	else if (promtext_name_is(s, "vllm:gpu_prefix_cache_hit_rate")) /* the V0 engine's gauge */
		take_max(&v->hit_gauge, &v->has_hit_gauge, x);
	else if (promtext_name_is(s, "sglang:num_running_reqs"))
		add(&g->running, &g->has_running, x);
	else if (promtext_name_is(s, "sglang:num_queue_reqs"))
		add(&g->waiting, &g->has_waiting, x);
	else if (promtext_name_is(s, "sglang:token_usage"))
		take_max(&g->kv, &g->has_kv, x);
	else if (promtext_name_is(s, "sglang:cache_hit_rate"))
		take_max(&g->hit_gauge, &g->has_hit_gauge, x);
	else if (promtext_name_is(s, "llamacpp:requests_processing"))
		add(&l->running, &l->has_running, x);
	else if (promtext_name_is(s, "llamacpp:requests_deferred"))
		add(&l->waiting, &l->has_waiting, x);
	else if (promtext_name_is(s, "llamacpp:kv_cache_usage_ratio"))
		take_max(&l->kv, &l->has_kv, x);
}

/* A request count as tokentap keeps it: rounded, from 0 to
 * ENGINE_COUNT_MAX. The sum of an engine's samples may be any double
 * (+inf once finite ones overflow): bounded before it becomes an integer,
 * so that the conversion is defined and sums of counts cannot overflow. */
static int64_t count_of(double v, bool has)
{
	if (!has)
		return -1;
	if (!(v > 0)) /* negative, or NaN */
		return 0;
	return v >= (double)ENGINE_COUNT_MAX ? ENGINE_COUNT_MAX : (int64_t)llround(v);
}

static double frac_of(double v, bool has)
{
	return has ? (v < 0 ? 0 : v > 1 ? 1 : v) : NAN;
}

int scrape_read(const char *body, size_t len, enum engine_kind want, struct engine_state *out, char *err, size_t errlen)
{
	static const enum engine_kind kinds[E__COUNT] = { ENGINE_VLLM, ENGINE_SGLANG, ENGINE_LLAMACPP };
	struct acc a[E__COUNT];
	struct promtext_result r;
	int pick = -1;

	memset(a, 0, sizeof(a));
	promtext_parse(body, len, on_sample, a, &r);
	for (int i = 0; i < E__COUNT && pick < 0; i++)
		if ((want == ENGINE_AUTO || want == kinds[i]) && (a[i].has_running || a[i].has_waiting))
			pick = i;
	if (pick < 0) {
		if (want == ENGINE_AUTO)
			snprintf(err, errlen,
				 "no request gauges of vLLM, SGLang or llama.cpp in the answer (%zu samples, %zu lines "
				 "that did not parse)",
				 r.samples, r.skipped);
		else
			snprintf(err, errlen,
				 "no request gauges of %s in the answer (%zu samples, %zu lines that "
				 "did not parse)",
				 scrape_engine_name(want), r.samples, r.skipped);
		return -1;
	}
	const struct acc *p = &a[pick];
	out->scraped = true;
	out->engine = kinds[pick];
	out->running = count_of(p->running, p->has_running);
	out->waiting = count_of(p->waiting, p->has_waiting);
	out->kv_use = p->has_kv ? frac_of(p->kv, true) : frac_of(p->kv_old, p->has_kv_old);
	if (p->has_queries && p->has_hits)
		out->prefix_hit = p->queries > 0 ? frac_of(p->hits / p->queries, true) : NAN;
	else if (p->has_old)
		out->prefix_hit = p->old_queries > 0 ? frac_of(p->old_hits / p->old_queries, true) : NAN;
	else
		out->prefix_hit = frac_of(p->hit_gauge, p->has_hit_gauge);
	return 0;
}

/* ---- the targets ---- */

static void spec_free(struct target_spec *t)
{
	free(t->name);
	free(t->url);
	free(t->metrics_url);
	free(t->tls_ca_file);
	free(t->tls_name);
	memset(t, 0, sizeof(*t));
}

static void specs_free(struct target_spec *t, size_t n)
{
	for (size_t i = 0; t && i < n; i++)
		spec_free(&t[i]);
	free(t);
}

/* The upstreams of `cfg` with a metrics_url, copied. -1 out of memory. */
static int specs_of(const struct config *cfg, struct target_spec **out, size_t *n)
{
	struct target_spec *t = calloc(cfg->nupstreams ? cfg->nupstreams : 1, sizeof(*t));
	size_t k = 0;
	char err[300];

	*out = NULL;
	*n = 0;
	if (!t)
		return -1;
	for (unsigned i = 0; i < cfg->nupstreams; i++) {
		const struct upstream_conf *uc = &cfg->upstreams[i];
		if (!uc->metrics_url)
			continue;
		struct target_spec *ts = &t[k];
		if (config_parse_metrics_url(uc->metrics_url, &ts->parts, err, sizeof(err)) == -1)
			continue; /* the loader refused it already */
		ts->name = strdup(uc->name);
		ts->url = strdup(uc->url);
		ts->metrics_url = strdup(uc->metrics_url);
		ts->interval_ms = uc->metrics_interval_ms ? uc->metrics_interval_ms : METRICS_INTERVAL_DEFAULT;
		ts->engine = uc->engine;
		ts->tls_verify = uc->tls_verify;
		ts->tls_ca_file = uc->tls_ca_file ? strdup(uc->tls_ca_file) : NULL;
		ts->tls_name = uc->tls_server_name ? strdup(uc->tls_server_name) : NULL;
		k++;
		if (!ts->name || !ts->url || !ts->metrics_url || (uc->tls_ca_file && !ts->tls_ca_file) ||
		    (uc->tls_server_name && !ts->tls_name)) {
			specs_free(t, k);
			return -1;
		}
	}
	*out = t;
	*n = k;
	return 0;
}

static struct timeval tv_ms(uint64_t ms)
{
	struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

static uint64_t unix_ms_now(void)
{
	struct timeval tv;
	gettimeofday(&tv, NULL);
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

static void publish(struct target *t)
{
	upstream_engine_publish(t->spec.name, t->spec.url, &t->last);
}

static void scrape_failed(struct target *t, const char *why)
{
	t->failures++;
	if (t->streak++ == 0)
		log_warn(
			"upstream %s: scraping %s failed: %s (shown in /upstreams; logged again once it recovers "
			"and fails anew)",
			t->spec.name, t->spec.metrics_url, why);
	t->last.failing = true;
	t->last.failures = t->failures;
	snprintf(t->last.error, sizeof(t->last.error), "%s", why);
	t->drop_conn = true;
	publish(t);
}

static void scrape_ok(struct target *t, const char *body, size_t len)
{
	struct engine_state st;
	char err[160];

	memset(&st, 0, sizeof(st));
	if (scrape_read(body, len, t->spec.engine, &st, err, sizeof(err)) == -1) {
		scrape_failed(t, err);
		return;
	}
	if (t->streak)
		log_info("upstream %s: scraping %s works again after %u failure(s)", t->spec.name, t->spec.metrics_url,
			 t->streak);
	t->streak = 0;
	st.at_unix_ms = unix_ms_now();
	st.at_ns = clock_now_ns();
	st.failures = t->failures;
	st.successes = ++t->successes;
	t->last = st;
	publish(t);
}

static const char *request_error_text(enum evhttp_request_error e)
{
	switch (e) {
	case EVREQ_HTTP_TIMEOUT: return "timed out";
	case EVREQ_HTTP_EOF: return "the connection closed early";
	case EVREQ_HTTP_INVALID_HEADER: return "an invalid or too large response head";
	case EVREQ_HTTP_BUFFER_ERROR: return "a read or write error";
	case EVREQ_HTTP_REQUEST_CANCEL: return "cancelled";
	case EVREQ_HTTP_DATA_TOO_LONG: return "the body is larger than 4 MiB";
	}
	return "failed";
}

static void on_req_error(enum evhttp_request_error e, void *arg)
{
	struct target *t = arg;
	t->req_error = e;
	t->req_failed = true;
}

/* The GET is done, one way or another; `req` is freed by libevent after. */
static void on_response(struct evhttp_request *req, void *arg)
{
	struct target *t = arg;
	char why[200];

	t->req = NULL;
	evtimer_del(t->deadline);
	int code = req ? evhttp_request_get_response_code(req) : 0;
	char tls_why[160];
	const char *tls_err = t->spec.parts.tls && t->conn ? tls_bev_error(evhttp_connection_get_bufferevent(t->conn),
									   tls_why, sizeof(tls_why))
							   : "";
	if ((t->req_failed || code == 0) && *tls_err) {
		snprintf(why, sizeof(why), "TLS: %s", tls_err);
		scrape_failed(t, why);
	} else if (t->req_failed || code == 0) {
		scrape_failed(t, t->req_failed ? request_error_text(t->req_error) : "cannot connect");
	} else if (code != 200) {
		snprintf(why, sizeof(why), "HTTP %d", code);
		scrape_failed(t, why);
	} else {
		struct evbuffer *in = evhttp_request_get_input_buffer(req);
		size_t len = evbuffer_get_length(in);
		const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
		scrape_ok(t, body, len);
	}
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct target *t = arg;

	(void)fd;
	(void)what;
	if (!t->req)
		return;
	evhttp_cancel_request(t->req); /* no callback follows */
	t->req = NULL;
	scrape_failed(t, "no complete answer within metrics_interval");
}

static void start_get(struct target *t)
{
	char host_hdr[300];
	const struct metrics_url_parts *p = &t->spec.parts;

	if (t->drop_conn && t->conn) {
		evhttp_connection_free(t->conn);
		t->conn = NULL;
	}
	t->drop_conn = false;
	if (!t->conn) {
		if (p->tls && !t->tls_ctx) {
			char err[200];
			if (!(t->tls_ctx = tls_client_ctx(t->spec.tls_verify, t->spec.tls_ca_file, err, sizeof(err)))) {
				scrape_failed(t, err);
				return;
			}
		}
		struct bufferevent *bev = NULL;
		if (p->tls &&
		    !(bev = tls_bev_connect(t->s->base, t->tls_ctx, t->spec.tls_name ? t->spec.tls_name : p->host,
					    t->spec.tls_verify))) {
			scrape_failed(t, "cannot create a TLS connection");
			return;
		}
		/* with a bufferevent of ours, the connection owns it */
		if (!(t->conn = evhttp_connection_base_bufferevent_new(t->s->base, NULL, bev, p->host,
								       (unsigned short)p->port))) {
			if (bev)
				bufferevent_free(bev);
			scrape_failed(t, "cannot create a connection");
			return;
		}
		evhttp_connection_set_max_body_size(t->conn, SCRAPE_BODY_MAX);
		evhttp_connection_set_max_headers_size(t->conn, 64 << 10);
		struct timeval tv = tv_ms(t->spec.interval_ms);
		evhttp_connection_set_timeout_tv(t->conn, &tv);
	}
	t->req_failed = false;
	if (!(t->req = evhttp_request_new(on_response, t))) {
		scrape_failed(t, "out of memory");
		return;
	}
	evhttp_request_set_error_cb(t->req, on_req_error);
	struct evkeyvalq *h = evhttp_request_get_output_headers(t->req);
	snprintf(host_hdr, sizeof(host_hdr), strchr(p->host, ':') ? "[%s]:%u" : "%s:%u", p->host, p->port);
	evhttp_add_header(h, "Host", host_hdr);
	evhttp_add_header(h, "Accept", "text/plain;version=0.0.4");
	evhttp_add_header(h, "User-Agent", "tokentap-scrape");
	if (evhttp_make_request(t->conn, t->req, EVHTTP_REQ_GET, p->path) == -1) {
		t->req = NULL; /* freed by libevent on failure */
		scrape_failed(t, "cannot send the request");
		return;
	}
	struct timeval dl = tv_ms(t->spec.interval_ms * 9 / 10); /* before the next tick */
	evtimer_add(t->deadline, &dl);
}

/* Every interval: a GET, unless the last one still runs. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct target *t = arg;
	struct timeval next = tv_ms(t->spec.interval_ms);

	(void)fd;
	(void)what;
	evtimer_add(t->tick, &next);
	if (!t->req) /* else its deadline is about to end it */
		start_get(t);
}

static void target_free(struct target *t)
{
	if (!t)
		return;
	if (t->req)
		evhttp_cancel_request(t->req);
	if (t->conn)
		evhttp_connection_free(t->conn);
	if (t->tick)
		event_free(t->tick);
	if (t->deadline)
		event_free(t->deadline);
	tls_ctx_free(t->tls_ctx);
	spec_free(&t->spec);
	free(t);
}

static struct target *target_new(struct scrape *s, struct target_spec *spec)
{
	struct target *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->s = s;
	t->spec = *spec;
	memset(spec, 0, sizeof(*spec));
	t->tick = evtimer_new(s->base, on_tick, t);
	t->deadline = evtimer_new(s->base, on_deadline, t);
	if (!t->tick || !t->deadline) {
		target_free(t);
		return NULL;
	}
	t->last.running = t->last.waiting = -1;
	t->last.kv_use = t->last.prefix_hit = NAN;
	struct timeval now = { 0, 0 };
	evtimer_add(t->tick, &now);
	return t;
}

static bool same_target(const struct target *t, const struct target_spec *sp)
{
	const struct target_spec *a = &t->spec;
	return strcmp(a->name, sp->name) == 0 && strcmp(a->url, sp->url) == 0 &&
	       strcmp(a->metrics_url, sp->metrics_url) == 0 && a->tls_verify == sp->tls_verify &&
	       strcmp(a->tls_ca_file ? a->tls_ca_file : "", sp->tls_ca_file ? sp->tls_ca_file : "") == 0 &&
	       strcmp(a->tls_name ? a->tls_name : "", sp->tls_name ? sp->tls_name : "") == 0;
}

/* On the scraper's thread: the new list replaces the old one. */
static void apply(struct scrape *s, struct target_spec *specs, size_t n)
{
	struct target **next = calloc(n ? n : 1, sizeof(*next));
	size_t k = 0;

	if (!next) {
		log_error("scrape: out of memory; the upstreams scraped stay as they were");
		return;
	}
	for (size_t i = 0; i < n; i++) {
		struct target *t = NULL;
		for (size_t j = 0; j < s->ntargets; j++)
			if (s->targets[j] && same_target(s->targets[j], &specs[i])) {
				t = s->targets[j];
				s->targets[j] = NULL;
				t->spec.interval_ms = specs[i].interval_ms;
				t->spec.engine = specs[i].engine;
				break;
			}
		if (!t && !(t = target_new(s, &specs[i]))) {
			log_error("scrape: out of memory; upstream %s is not scraped", specs[i].name);
			continue;
		}
		next[k++] = t;
	}
	for (size_t j = 0; j < s->ntargets; j++)
		target_free(s->targets[j]);
	free(s->targets);
	s->targets = next;
	s->ntargets = k;
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct scrape *s = arg;
	struct target_spec *specs = NULL;
	size_t n = 0;
	bool have = false, stop;
	uint64_t v;

	(void)what;
	if (read(fd, &v, sizeof(v)) == -1) {
		/* spurious */
	}
	pthread_mutex_lock(&s->lock);
	stop = s->stopping;
	if (s->have_pending) {
		specs = s->pending;
		n = s->npending;
		have = true;
		s->pending = NULL;
		s->npending = 0;
		s->have_pending = false;
	}
	pthread_mutex_unlock(&s->lock);
	if (stop) {
		specs_free(specs, n);
		apply(s, NULL, 0); /* cancels what runs, frees the targets */
		event_base_loopbreak(s->base);
		return;
	}
	if (have)
		apply(s, specs, n);
	specs_free(specs, n); /* emptied where taken */
}

static void *scrape_main(void *arg)
{
	struct scrape *s = arg;

	pthread_setname_np(pthread_self(), "tokentap-scrape");
	event_base_dispatch(s->base);
	return NULL;
}

static void wake(struct scrape *s)
{
	uint64_t one = 1;
	if (write(s->wake_fd, &one, sizeof(one)) == -1) {
		/* the counter is saturated: it is awake anyway */
	}
}

struct scrape_list {
	struct target_spec *specs;
	size_t n;
};

struct scrape_list *scrape_list_of(const struct config *cfg)
{
	struct scrape_list *l = calloc(1, sizeof(*l));

	if (!l || specs_of(cfg, &l->specs, &l->n) == -1) {
		free(l);
		log_error("scrape: out of memory; the upstreams scraped stay as they were");
		return NULL;
	}
	return l;
}

void scrape_use(struct scrape *s, struct scrape_list *l)
{
	if (!l)
		return;
	if (!s) {
		specs_free(l->specs, l->n);
		free(l);
		return;
	}
	pthread_mutex_lock(&s->lock);
	specs_free(s->pending, s->npending); /* one not yet taken */
	s->pending = l->specs;
	s->npending = l->n;
	s->have_pending = true;
	pthread_mutex_unlock(&s->lock);
	free(l);
	wake(s);
}

struct scrape *scrape_start(const struct config *cfg, char *err, size_t errlen)
{
	struct scrape *s = calloc(1, sizeof(*s));
	sigset_t block, old;

	if (!s) {
		snprintf(err, errlen, "scrape: out of memory");
		return NULL;
	}
	pthread_mutex_init(&s->lock, NULL);
	s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->wake_fd == -1 || !(s->base = event_base_new()) ||
	    !(s->wake_ev = event_new(s->base, s->wake_fd, EV_READ | EV_PERSIST, on_wake, s)) ||
	    event_add(s->wake_ev, NULL) == -1) {
		snprintf(err, errlen, "scrape: cannot set up its event loop");
		goto fail;
	}
	struct scrape_list *l = scrape_list_of(cfg);
	if (!l) {
		snprintf(err, errlen, "scrape: out of memory");
		goto fail;
	}
	scrape_use(s, l); /* taken by the first wake-up */
	/* signals stay with the main thread */
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	int rc = pthread_create(&s->thread, NULL, scrape_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		snprintf(err, errlen, "scrape: cannot start its thread: %s", strerror(rc));
		goto fail;
	}
	s->running = true;
	return s;
fail:
	scrape_stop(s);
	return NULL;
}

void scrape_stop(struct scrape *s)
{
	if (!s)
		return;
	if (s->running) {
		pthread_mutex_lock(&s->lock);
		s->stopping = true;
		pthread_mutex_unlock(&s->lock);
		wake(s);
		pthread_join(s->thread, NULL);
	}
	apply(s, NULL, 0); /* a thread that never ran */
	free(s->targets);  /* the empty list apply left */
	specs_free(s->pending, s->npending);
	if (s->wake_ev)
		event_free(s->wake_ev);
	if (s->base)
		event_base_free(s->base);
	if (s->wake_fd != -1)
		close(s->wake_fd);
	pthread_mutex_destroy(&s->lock);
	free(s);
}
