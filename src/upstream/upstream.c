/*
 * upstream.c — upstream resolution, connecting, and the idle pool.
 */
#include "upstream.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <math.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <time.h>
#include <unistd.h>

#include "bevio.h"
#include "check.h"
#include "config.h"
#include "log.h"
#include "loop.h"
#include "tls.h"

/* ---- what the workers' copies of one upstream share ---- */

struct up_share {
	char *key; /* name, NUL, url */
	size_t keylen;
	unsigned refs;		 /* under shares_lock */
	_Atomic unsigned active; /* admitted requests, all workers */
	_Atomic unsigned queued; /* waiting requests, all workers */
	/* for labelling cold requests: the server's, not one worker's */
	_Atomic uint64_t completed;		   /* exchanges that got a response */
	_Atomic uint64_t last_done_ns;		   /* when the last one ended */
	_Atomic bool failing;			   /* the last connect attempt failed */
	_Atomic uint64_t counters[UPC__COUNT];	   /* UPSTREAM_COUNTERS */
	struct upstream *members[WORKERS_MAX * 4]; /* under shares_lock: whom to wake */
	unsigned nmembers;
	LIST_ENTRY(up_share) link;
	/* The engine's view (scrape.c): all of it under shares_lock, and the
	 * numbers a request records again in a seqlock, odd while written
	 * (the one writer holds shares_lock), for workers that take no lock. */
	struct engine_state engine;
	_Atomic uint64_t eng_seq;
	_Atomic bool eng_known;
	_Atomic int64_t eng_running, eng_waiting;
	_Atomic uint64_t eng_kv_bits; /* the double's bits */
	_Atomic uint64_t eng_at_ns;
	/* What the balancing choice reads (balance.h): prompt tokens and
	 * requests in flight not yet at their first token; the TTFT fit's
	 * moments (doubles' bits), written by whoever holds fit_busy, with the
	 * mean prompt size and when the last sample came. */
	_Atomic uint64_t prefill_tokens;
	_Atomic unsigned prefill_reqs;
	atomic_flag fit_busy;
	_Atomic uint64_t fit_bits[5]; /* n, mx, my, mxx, mxy */
	_Atomic uint64_t tok_mean_bits;
	_Atomic uint64_t fit_at_ns;
	_Atomic uint64_t pred_err_bits, pred_bias_bits, predictions; /* under fit_busy too */
	/* outlier ejection: failures in a row, until when it is out (0: in),
	 * how many times in a row it was ejected, whether its probe runs */
	_Atomic unsigned fails_in_row;
	_Atomic uint64_t eject_until_ns;
	_Atomic unsigned eject_level;
	_Atomic uint64_t ejections;
	_Atomic bool probing;
	/* upstream_held_*: the server's id, and the chain hashes of the blocks
	 * sent to it (0: an empty slot) */
	unsigned held_id;
	_Atomic uint64_t held[UP_HELD_SLOTS];
};

/* Taken when an upstream object is made or freed and to wake other workers,
 * never per token. */
static pthread_mutex_t shares_lock = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, up_share) shares = LIST_HEAD_INITIALIZER(shares);

static struct up_share *share_join(struct upstream *up)
{
	size_t nl = strlen(up->name), ul = strlen(up->url), kl = nl + 1 + ul;
	struct up_share *s;

	pthread_mutex_lock(&shares_lock);
	LIST_FOREACH (s, &shares, link)
		if (s->keylen == kl && memcmp(s->key, up->name, nl + 1) == 0 &&
		    memcmp(s->key + nl + 1, up->url, ul) == 0)
			break;
	if (!s && (s = calloc(1, sizeof(*s))) && (s->key = malloc(kl + 1))) {
		memcpy(s->key, up->name, nl + 1);
		memcpy(s->key + nl + 1, up->url, ul + 1);
		s->keylen = kl;
		static unsigned next_held_id;
		s->held_id = next_held_id++ % 0xffffu + 1;
		LIST_INSERT_HEAD(&shares, s, link);
	} else if (s && !s->key) {
		free(s);
		s = NULL;
	}
	if (s && s->nmembers < sizeof(s->members) / sizeof(s->members[0])) {
		s->members[s->nmembers++] = up;
		s->refs++;
	} else {
		s = NULL; /* more copies than workers could make: cannot happen */
	}
	pthread_mutex_unlock(&shares_lock);
	return s;
}

static void share_leave(struct upstream *up)
{
	struct up_share *s = up->share;

	if (!s)
		return;
	pthread_mutex_lock(&shares_lock);
	for (unsigned i = 0; i < s->nmembers; i++)
		if (s->members[i] == up) {
			s->members[i] = s->members[--s->nmembers];
			break;
		}
	if (--s->refs == 0) {
		LIST_REMOVE(s, link);
		free(s->key);
		free(s);
	}
	pthread_mutex_unlock(&shares_lock);
	up->share = NULL;
}

/* Wakes the other workers' copies that have requests waiting. */
static void share_kick_others(struct upstream *up)
{
	struct up_share *s = up->share;
	uint64_t one = 1;

	pthread_mutex_lock(&shares_lock);
	for (unsigned i = 0; i < s->nmembers; i++) {
		struct upstream *m = s->members[i];
		/* a stale hint costs a spurious wake-up, or none where one
		 * was due; a waiter never depends on it: upstream_admit wakes
		 * its own worker to look again after queueing */
		if (m != up && m->kick_fd != -1 && atomic_load_explicit(&m->queued_hint, memory_order_relaxed))
			if (write(m->kick_fd, &one, sizeof(one)) == -1) {
				/* saturated: it is awake anyway */
			}
	}
	pthread_mutex_unlock(&shares_lock);
}

/* Takes one slot of max_concurrency across workers, if one is free. */
static bool slot_take(struct upstream *up)
{
	unsigned max = up->conf.max_concurrency;
	unsigned cur = atomic_load(&up->share->active);

	while (!max || cur < max)
		if (atomic_compare_exchange_weak(&up->share->active, &cur, cur + 1))
			return true;
	return false;
}

/* Hands free slots to this worker's waiters, oldest first. */
static void admit_waiters(struct upstream *up)
{
	struct up_waiter *w;

	while ((w = TAILQ_FIRST(&up->waiting)) && slot_take(up)) {
		TAILQ_REMOVE(&up->waiting, w, link);
		w->queued = false;
		up->queued--;
		atomic_store_explicit(&up->queued_hint, up->queued, memory_order_relaxed);
		atomic_fetch_sub(&up->share->queued, 1);
		up->active++;
		w->ready(w);
	}
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	uint64_t n;

	(void)what;
	if (read(fd, &n, sizeof(n)) == -1) {
		/* nothing to read: a spurious wake-up */
	}
	admit_waiters(arg);
}

unsigned upstream_inflight(const struct upstream *up)
{
	return atomic_load(&up->share->active);
}

unsigned upstream_waiting(const struct upstream *up)
{
	return atomic_load(&up->share->queued);
}

static uint64_t double_bits(double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof(u));
	return u;
}

static double bits_double(uint64_t u)
{
	double d;
	memcpy(&d, &u, sizeof(d));
	return d;
}

void upstream_engine_publish(const char *name, const char *url, const struct engine_state *st)
{
	size_t nl = strlen(name), ul = strlen(url);
	struct up_share *s;

	pthread_mutex_lock(&shares_lock);
	LIST_FOREACH (s, &shares, link) {
		if (s->keylen != nl + 1 + ul || memcmp(s->key, name, nl + 1) != 0 ||
		    memcmp(s->key + nl + 1, url, ul) != 0)
			continue;
		struct engine_state keep = s->engine;
		s->engine = *st;
		if (st->failing && keep.scraped) { /* the last good values stay */
			s->engine.scraped = true;
			s->engine.engine = keep.engine;
			s->engine.running = keep.running;
			s->engine.waiting = keep.waiting;
			s->engine.kv_use = keep.kv_use;
			s->engine.prefix_hit = keep.prefix_hit;
			s->engine.at_unix_ms = keep.at_unix_ms;
			s->engine.at_ns = keep.at_ns;
			s->engine.in_flight_at = keep.in_flight_at;
		}
		if (!st->failing) {
			s->engine.in_flight_at = atomic_load(&s->active);
			uint64_t seq = atomic_load_explicit(&s->eng_seq, memory_order_relaxed);
			atomic_store_explicit(&s->eng_seq, seq + 1, memory_order_relaxed);
			atomic_thread_fence(memory_order_release);
			atomic_store_explicit(&s->eng_running, st->running, memory_order_relaxed);
			atomic_store_explicit(&s->eng_waiting, st->waiting, memory_order_relaxed);
			atomic_store_explicit(&s->eng_kv_bits, double_bits(st->kv_use), memory_order_relaxed);
			atomic_store_explicit(&s->eng_at_ns, st->at_ns, memory_order_relaxed);
			atomic_store_explicit(&s->eng_known, true, memory_order_relaxed);
			atomic_store_explicit(&s->eng_seq, seq + 2, memory_order_release);
		}
		break;
	}
	pthread_mutex_unlock(&shares_lock);
}

void upstream_engine_note(const struct upstream *up, struct engine_seen *out, uint64_t now_ns)
{
	struct up_share *s = up->share;
	uint64_t seq, at_ns;

	for (;;) {
		seq = atomic_load_explicit(&s->eng_seq, memory_order_acquire);
		out->known = atomic_load_explicit(&s->eng_known, memory_order_relaxed);
		out->running = atomic_load_explicit(&s->eng_running, memory_order_relaxed);
		out->waiting = atomic_load_explicit(&s->eng_waiting, memory_order_relaxed);
		out->kv_use = bits_double(atomic_load_explicit(&s->eng_kv_bits, memory_order_relaxed));
		at_ns = atomic_load_explicit(&s->eng_at_ns, memory_order_relaxed);
		atomic_thread_fence(memory_order_acquire);
		if (!(seq & 1) && atomic_load_explicit(&s->eng_seq, memory_order_relaxed) == seq)
			break;
	}
	out->age_ms = now_ns > at_ns ? (now_ns - at_ns) / 1000000 : 0;
	/* A scrape succeeds at least once an interval (its deadline is 9/10 of
	 * one) while the endpoint answers: older than two, the last one failed. */
	uint64_t every = up->conf.metrics_interval_ms ? up->conf.metrics_interval_ms : METRICS_INTERVAL_DEFAULT;
	out->fresh = out->known && out->age_ms <= 2 * every;
}

void upstream_engine_state(const struct upstream *up, struct engine_state *out)
{
	pthread_mutex_lock(&shares_lock);
	*out = up->share->engine;
	pthread_mutex_unlock(&shares_lock);
}

const char *const upstream_counter_keys[UPC__COUNT] = {
#define X(e, key, help) #key,
	UPSTREAM_COUNTERS(X)
#undef X
};
const char *const upstream_counter_help[UPC__COUNT] = {
#define X(e, key, help) help,
	UPSTREAM_COUNTERS(X)
#undef X
};

void upstream_count(struct upstream *up, enum upstream_counter c)
{
	if (up->share)
		atomic_fetch_add_explicit(&up->share->counters[c], 1, memory_order_relaxed);
}

uint64_t upstream_counter(const struct upstream *up, enum upstream_counter c)
{
	return up->share ? atomic_load_explicit(&up->share->counters[c], memory_order_relaxed) : 0;
}

static void fit_read(struct up_share *s, struct ttft_fit *f)
{
	f->n = bits_double(atomic_load_explicit(&s->fit_bits[0], memory_order_relaxed));
	f->mx = bits_double(atomic_load_explicit(&s->fit_bits[1], memory_order_relaxed));
	f->my = bits_double(atomic_load_explicit(&s->fit_bits[2], memory_order_relaxed));
	f->mxx = bits_double(atomic_load_explicit(&s->fit_bits[3], memory_order_relaxed));
	f->mxy = bits_double(atomic_load_explicit(&s->fit_bits[4], memory_order_relaxed));
}

static void share_balance(struct up_share *s, struct up_balance *b, uint64_t now, bool full)
{
	uint64_t until = atomic_load_explicit(&s->eject_until_ns, memory_order_relaxed);
	uint64_t at = atomic_load_explicit(&s->fit_at_ns, memory_order_relaxed);

	b->prefill_tokens = atomic_load_explicit(&s->prefill_tokens, memory_order_relaxed);
	b->prefill_reqs = atomic_load_explicit(&s->prefill_reqs, memory_order_relaxed);
	fit_read(s, &b->fit);
	b->tok_mean = bits_double(atomic_load_explicit(&s->tok_mean_bits, memory_order_relaxed));
	b->fit_age_ns = at && now >= at ? now - at : (at ? 0 : UINT64_MAX);
	b->eject = !until ? UP_IN : until > now ? UP_EJECTED : UP_PROBE_DUE;
	b->eject_left_ms = until > now ? (until - now) / 1000000 : 0;
	b->probing = atomic_load_explicit(&s->probing, memory_order_relaxed);
	b->fails_in_row = atomic_load_explicit(&s->fails_in_row, memory_order_relaxed);
	b->ejections = atomic_load_explicit(&s->ejections, memory_order_relaxed);
	b->pred_now_ms = b->pred_err_ms = b->pred_bias_ms = NAN;
	b->predictions = 0;
	if (!full)
		return;
	double mean = b->prefill_reqs ? (double)b->prefill_tokens / b->prefill_reqs : b->tok_mean;
	b->pred_now_ms = ttft_fit_predict(&b->fit, (double)b->prefill_tokens + (mean > 0 ? mean : 1));
	b->predictions = atomic_load_explicit(&s->predictions, memory_order_relaxed);
	b->pred_err_ms =
		b->predictions ? bits_double(atomic_load_explicit(&s->pred_err_bits, memory_order_relaxed)) : NAN;
	b->pred_bias_ms =
		b->predictions ? bits_double(atomic_load_explicit(&s->pred_bias_bits, memory_order_relaxed)) : NAN;
}

void upstream_balance_gate(const struct upstream *up, struct up_balance *out, uint64_t now_ns)
{
	const struct up_share *s = up->share;
	uint64_t until = atomic_load_explicit(&s->eject_until_ns, memory_order_relaxed);
	uint64_t at = atomic_load_explicit(&s->fit_at_ns, memory_order_relaxed);

	out->fit_age_ns = at && now_ns >= at ? now_ns - at : (at ? 0 : UINT64_MAX);
	out->eject = !until ? UP_IN : until > now_ns ? UP_EJECTED : UP_PROBE_DUE;
	out->eject_left_ms = until > now_ns ? (until - now_ns) / 1000000 : 0;
	out->probing = atomic_load_explicit(&s->probing, memory_order_relaxed);
}

void upstream_balance(const struct upstream *up, struct up_balance *out, uint64_t now_ns)
{
	share_balance(up->share, out, now_ns, true);
}

void upstream_balance_pick(const struct upstream *up, struct up_balance *out, uint64_t now_ns)
{
	share_balance(up->share, out, now_ns, false);
}

void upstream_prefill_add(struct upstream *up, uint64_t tokens)
{
	atomic_fetch_add_explicit(&up->share->prefill_tokens, tokens, memory_order_relaxed);
	atomic_fetch_add_explicit(&up->share->prefill_reqs, 1, memory_order_relaxed);
}

void upstream_prefill_sub(struct upstream *up, uint64_t tokens)
{
	atomic_fetch_sub_explicit(&up->share->prefill_tokens, tokens, memory_order_relaxed);
	atomic_fetch_sub_explicit(&up->share->prefill_reqs, 1, memory_order_relaxed);
}

void upstream_ttft_note(struct upstream *up, double tokens_ahead, double own_tokens, double predicted_ms, double ms,
			uint64_t now_ns)
{
	struct up_share *s = up->share;
	struct ttft_fit f;

	/* one writer at a time; a sample that finds another being written is
	 * dropped (the fit is an average: one sample less changes nothing) */
	if (atomic_flag_test_and_set_explicit(&s->fit_busy, memory_order_acquire))
		return;
	fit_read(s, &f);
	ttft_fit_add(&f, tokens_ahead, ms);
	double mean = bits_double(atomic_load_explicit(&s->tok_mean_bits, memory_order_relaxed));
	mean = f.n <= 1 ? own_tokens : mean + TTFT_FIT_ALPHA * (own_tokens - mean);
	atomic_store_explicit(&s->fit_bits[0], double_bits(f.n), memory_order_relaxed);
	atomic_store_explicit(&s->fit_bits[1], double_bits(f.mx), memory_order_relaxed);
	atomic_store_explicit(&s->fit_bits[2], double_bits(f.my), memory_order_relaxed);
	atomic_store_explicit(&s->fit_bits[3], double_bits(f.mxx), memory_order_relaxed);
	atomic_store_explicit(&s->fit_bits[4], double_bits(f.mxy), memory_order_relaxed);
	atomic_store_explicit(&s->tok_mean_bits, double_bits(mean), memory_order_relaxed);
	atomic_store_explicit(&s->fit_at_ns, now_ns ? now_ns : 1, memory_order_relaxed);
	if (predicted_ms >= 0) {
		uint64_t n = atomic_load_explicit(&s->predictions, memory_order_relaxed);
		double err = bits_double(atomic_load_explicit(&s->pred_err_bits, memory_order_relaxed));
		double bias = bits_double(atomic_load_explicit(&s->pred_bias_bits, memory_order_relaxed));
		double d = ms - predicted_ms, a = n ? TTFT_FIT_ALPHA : 1.0;
		err += a * ((d < 0 ? -d : d) - err);
		bias += a * (d - bias);
		atomic_store_explicit(&s->pred_err_bits, double_bits(err), memory_order_relaxed);
		atomic_store_explicit(&s->pred_bias_bits, double_bits(bias), memory_order_relaxed);
		atomic_store_explicit(&s->predictions, n + 1, memory_order_relaxed);
	}
	atomic_flag_clear_explicit(&s->fit_busy, memory_order_release);
}

bool upstream_probe_claim(struct upstream *up)
{
	bool no = false;
	return atomic_compare_exchange_strong(&up->share->probing, &no, true);
}

void upstream_probe_done(struct upstream *up)
{
	atomic_store(&up->share->probing, false);
}

void upstream_outlier_note(struct upstream *up, bool ok, uint64_t now_ns)
{
	struct up_share *s = up->share;
	uint64_t until = atomic_load(&s->eject_until_ns);

	if (ok) {
		atomic_store(&s->fails_in_row, 0);
		if (until) {
			atomic_store(&s->eject_until_ns, 0);
			atomic_store(&s->eject_level, 0);
			log_info("upstream %s answered its probe: back in every route's choice", up->name);
		}
		return;
	}
	unsigned n = atomic_fetch_add(&s->fails_in_row, 1) + 1;
	if (!up->conf.eject_after || until > now_ns)
		return; /* off, or out already: requests sent before it was ejected */
	if (!until && n < up->conf.eject_after)
		return;
	/* first ejection, or its probe (until passed) failed: a longer backoff */
	unsigned level = atomic_fetch_add(&s->eject_level, 1);
	uint64_t ms = up->conf.eject_backoff_ms;
	for (unsigned i = 0; i < level && ms < up->conf.eject_max_ms; i++)
		ms *= 2;
	if (ms > up->conf.eject_max_ms)
		ms = up->conf.eject_max_ms;
	atomic_store(&s->eject_until_ns, now_ns + ms * 1000000u);
	atomic_fetch_add(&s->ejections, 1);
	log_warn("upstream %s failed %u times in a row: out of every route's choice for %llu ms", up->name, n,
		 (unsigned long long)ms);
}

int upstream_gauges(struct upstream_gauge **out, size_t *n)
{
	struct upstream_gauge *g = NULL;
	struct up_share *s;
	size_t count = 0, i = 0;

	*out = NULL;
	*n = 0;
	pthread_mutex_lock(&shares_lock);
	LIST_FOREACH (s, &shares, link)
		count++;
	if (count && !(g = calloc(count, sizeof(*g))))
		goto fail;
	LIST_FOREACH (s, &shares, link) {
		if (!(g[i].name = strdup(s->key))) /* the name ends at the key's first NUL */
			goto fail;
		g[i].in_flight = atomic_load(&s->active);
		g[i].queued = atomic_load(&s->queued);
		for (unsigned c = 0; c < UPC__COUNT; c++)
			g[i].counters[c] = atomic_load_explicit(&s->counters[c], memory_order_relaxed);
		g[i].engine = s->engine;
		share_balance(s, &g[i].bal, clock_now_ns(), true);
		i++;
	}
	pthread_mutex_unlock(&shares_lock);
	*out = g;
	*n = count;
	return 0;
fail:
	pthread_mutex_unlock(&shares_lock);
	upstream_gauges_free(g, i);
	return -1;
}

void upstream_gauges_free(struct upstream_gauge *g, size_t n)
{
	for (size_t i = 0; g && i < n; i++)
		free(g[i].name);
	free(g);
}

struct upstream *upstream_new(struct event_base *base, const struct config *cfg, const struct upstream_conf *uc,
			      char *err, size_t errlen)
{
	struct url_parts u;
	struct addrinfo hints, *res = NULL;
	struct upstream_prep prep;
	struct upstream *up;
	char msg[400];
	int rc;

	if (config_parse_url(uc->url, &u, msg, sizeof(msg)) == -1) {
		snprintf(err, errlen, "upstream %s: %s", uc->name, msg);
		return NULL;
	}
	const char *host = u.host, *port = u.port;
	bool tls = u.tls;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		snprintf(err, errlen, "upstream %s: cannot resolve %s: %s", uc->name, host, gai_strerror(rc));
		return NULL;
	}
	up = calloc(1, sizeof(*up));
	if (!up || !(up->name = strdup(uc->name)) || !(up->url = strdup(uc->url))) {
		if (up)
			free(up->name);
		free(up);
		freeaddrinfo(res);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	memcpy(&up->addr, res->ai_addr, res->ai_addrlen);
	up->addrlen = res->ai_addrlen;
	freeaddrinfo(res);
	up->base = base;
	up->tls = tls;
	snprintf(up->host, sizeof(up->host), "%s", host);
	TAILQ_INIT(&up->idle);
	TAILQ_INIT(&up->waiting);
	up->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (up->kick_fd != -1)
		up->kick_ev = event_new(base, up->kick_fd, EV_READ | EV_PERSIST, on_kick, up);
	snprintf(err, errlen, "out of memory");
	if (!up->kick_ev || event_add(up->kick_ev, NULL) == -1 || !(up->share = share_join(up)) ||
	    upstream_prepare(up, uc, &prep, err, errlen) == -1) {
		share_leave(up);
		if (up->kick_ev)
			event_free(up->kick_ev);
		if (up->kick_fd != -1)
			close(up->kick_fd);
		free(up->name);
		free(up->url);
		free(up);
		return NULL; /* err: prepare's reason, else out of memory */
	}
	return upstream_adopt(up, cfg, &prep);
}

static void conf_release(struct upstream_conf *c)
{
	free((char *)c->name);
	free((char *)c->url);
	free((char *)c->tls_ca_file);
	free((char *)c->tls_server_name);
	free((char *)c->metrics_url);
	for (unsigned i = 0; i < c->nlabels; i++) {
		free((char *)c->labels[i].key);
		free((char *)c->labels[i].value);
	}
	memset(c, 0, sizeof(*c));
}

/* A deep copy: the config it comes from may be freed first. */
static int conf_copy(struct upstream_conf *dst, const struct upstream_conf *src)
{
	*dst = *src;
	dst->name = strdup(src->name);
	dst->url = strdup(src->url);
	dst->tls_ca_file = src->tls_ca_file ? strdup(src->tls_ca_file) : NULL;
	dst->tls_server_name = src->tls_server_name ? strdup(src->tls_server_name) : NULL;
	dst->metrics_url = src->metrics_url ? strdup(src->metrics_url) : NULL;
	for (unsigned i = 0; i < src->nlabels; i++) {
		dst->labels[i].key = strdup(src->labels[i].key);
		dst->labels[i].value = strdup(src->labels[i].value);
	}
	bool ok = dst->name && dst->url && (!src->tls_ca_file || dst->tls_ca_file) &&
		  (!src->tls_server_name || dst->tls_server_name) && (!src->metrics_url || dst->metrics_url);
	for (unsigned i = 0; i < src->nlabels; i++)
		ok = ok && dst->labels[i].key && dst->labels[i].value;
	if (!ok) {
		conf_release(dst);
		return -1;
	}
	return 0;
}

int upstream_prepare(const struct upstream *up, const struct upstream_conf *uc, struct upstream_prep *p, char *err,
		     size_t errlen)
{
	memset(p, 0, sizeof(*p));
	if (conf_copy(&p->conf, uc) == -1) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (up->tls) {
		char why[512];
		p->tls_ctx = tls_client_ctx(p->conf.tls_verify, p->conf.tls_ca_file, why, sizeof(why));
		if (!p->tls_ctx) {
			snprintf(err, errlen, "upstream %s: %s", up->name, why);
			conf_release(&p->conf);
			return -1;
		}
	}
	return 0;
}

void upstream_prep_discard(struct upstream_prep *p)
{
	if (!p->conf.name) /* zeroed: nothing prepared, or already adopted */
		return;
	conf_release(&p->conf);
	tls_ctx_free(p->tls_ctx);
	memset(p, 0, sizeof(*p));
}

struct upstream *upstream_adopt(struct upstream *up, const struct config *cfg, struct upstream_prep *p)
{
	const struct upstream_conf *uc;

	if (p->tls_ctx) {
		tls_ctx_free(up->tls_ctx);
		up->tls_ctx = p->tls_ctx;
		tls_resume_reset(&up->tls_resume, up->tls_ctx); /* no session of the old context */
	}
	conf_release(&up->conf);
	up->conf = p->conf;
	memset(p, 0, sizeof(*p));
	uc = &up->conf;
	up->refs++;
	up->pool_idle_timeout_ms = cfg->pool_idle_timeout_ms;
	up->cold_idle_ms = cfg->cold_idle_ms;
	up->connect_timeout_ms = uc->connect_timeout_ms ? uc->connect_timeout_ms : cfg->connect_timeout_ms;
	up->first_byte_timeout_ms = uc->first_byte_timeout_ms ? uc->first_byte_timeout_ms : cfg->first_byte_timeout_ms;
	up->idle_timeout_ms = uc->idle_timeout_ms ? uc->idle_timeout_ms : cfg->idle_timeout_ms;
	return up;
}

void upstream_ref(struct upstream *up)
{
	up->refs++;
}

bool upstream_same(const struct upstream *up, const struct upstream_conf *uc)
{
	return strcmp(up->name, uc->name) == 0 && strcmp(up->url, uc->url) == 0;
}

bool upstream_try_admit(struct upstream *up)
{
	if (!TAILQ_EMPTY(&up->waiting) || !slot_take(up))
		return false;
	up->active++;
	return true;
}

enum admit upstream_admit(struct upstream *up, struct up_waiter *w)
{
	uint64_t one = 1;

	if (upstream_try_admit(up))
		return ADMIT_NOW;
	/* the queue bound is the server's, across workers */
	if (atomic_fetch_add(&up->share->queued, 1) >= up->conf.queue_max) {
		atomic_fetch_sub(&up->share->queued, 1);
		up->rejected++;
		return ADMIT_FULL;
	}
	TAILQ_INSERT_TAIL(&up->waiting, w, link);
	w->queued = true;
	up->queued++;
	atomic_store_explicit(&up->queued_hint, up->queued, memory_order_relaxed);
	/* A slot freed elsewhere between slot_take and the count above saw no
	 * waiter and woke nobody: look again, from the loop (w->ready must not
	 * run inside this call). */
	if (write(up->kick_fd, &one, sizeof(one)) == -1) {
		/* saturated: a wake-up is pending anyway */
	}
	return ADMIT_QUEUED;
}

void upstream_leave(struct upstream *up)
{
	CHECK(up->active > 0); /* one leave per admission: more is a slot given back twice */
	up->active--;
	atomic_fetch_sub(&up->share->active, 1);
	/* FIFO: this worker's oldest waiter takes the slot just freed */
	admit_waiters(up);
	if (TAILQ_EMPTY(&up->waiting) && atomic_load(&up->share->queued) > 0)
		share_kick_others(up);
}

void upstream_cancel(struct upstream *up, struct up_waiter *w)
{
	if (!w->queued)
		return;
	TAILQ_REMOVE(&up->waiting, w, link);
	w->queued = false;
	up->queued--;
	atomic_store_explicit(&up->queued_hint, up->queued, memory_order_relaxed);
	atomic_fetch_sub(&up->share->queued, 1);
}

static void upconn_close(struct upconn *c)
{
	if (c->ssl && c->tls_wakeups)
		log_debug("upstream %s: u%llu closed; TLS: %llu bytes in %llu records, %llu reads, %llu partial",
			  c->up->name, (unsigned long long)c->id, (unsigned long long)c->tls_bytes,
			  (unsigned long long)c->tls_records, (unsigned long long)c->tls_wakeups,
			  (unsigned long long)c->tls_partial);
	if (c->rev)
		event_free(c->rev); /* safe inside its own callback: libevent does not touch it after */
	if (c->bev)
		bufferevent_free(c->bev);
	OBJ_MAGIC_CLEAR(c);
	free(c);
}

#define UPCONN_READ_MAX (64u << 10) /* bytes asked of one recv() */

/* The scratch buffer of upconn_direct reads. Static, per thread: a worker's
 * reads never overlap, and each is done with before the next. */
static _Thread_local char direct_buf[UPCONN_READ_MAX];

void upconn_set_direct(struct upconn *c, const struct upconn_direct *d, void *arg)
{
	c->direct = d;
	c->direct_arg = arg;
}

/* One read of `c`'s socket into `buf` (TLS: every whole record there). */
static ssize_t upconn_recv(struct upconn *c, evutil_socket_t fd, char *buf, size_t len, bool *more)
{
	if (!c->ssl)
		return recv(fd, buf, len, MSG_DONTWAIT);
	struct tls_reader rd = { .ssl = c->ssl };
	ssize_t n = tls_recv(&rd, buf, len);
	*more = rd.more;
	if (n > 0) {
		c->tls_wakeups++;
		c->tls_bytes += (uint64_t)n;
		c->tls_records += rd.reads;
	}
	/* stopped to wait for the socket with part of a record held */
	if ((n > 0 ? !rd.more : n < 0 && errno == EAGAIN) && tls_pending(c->ssl))
		c->tls_partial++;
	return n;
}

static ssize_t tls_recv_upconn(void *arg, char *buf, size_t len)
{
	void **a = arg; /* the connection, and where `more` goes */
	return upconn_recv(a[0], -1, buf, len, a[1]);
}

static void on_upconn_readable(evutil_socket_t fd, short what, void *arg)
{
	struct upconn *c = arg;
	CHECK_OBJ(c, UPCONN_MAGIC);
	struct bufferevent *bev = c->bev;
	struct msghdr msg = { 0 };
	bool more = false;
	ssize_t n;

	if (what & EV_TIMEOUT) {
		bufferevent_trigger_event(bev, BEV_EVENT_TIMEOUT | BEV_EVENT_READING, 0);
		return; /* c may be gone */
	}
	if (c->direct && evbuffer_get_length(bufferevent_get_input(bev)) == 0 && c->direct->ready(c->direct_arg)) {
		n = upconn_recv(c, fd, direct_buf, sizeof(direct_buf), &more);
		if (n > 0) {
			/* TLS: the rest at the next turn (freed with c if it goes) */
			if (more)
				event_active(c->rev, EV_READ, 1);
			c->direct->data(c->direct_arg, direct_buf, (size_t)n); /* c may be gone after */
			return;
		}
	} else if (c->ssl) {
		n = bevio_read(bev, UPCONN_READ_MAX, tls_recv_upconn, (void *[]){ c, &more });
	} else {
		n = bevio_recv(bev, fd, UPCONN_READ_MAX, &msg);
	}
	if (c->ssl && (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))) {
		/* The end: the bufferevent's own TLS reading stops there, and the
		 * exchange acts on a TLS close at the next turn (on_up_event),
		 * which a socket at EOF, still readable, must not hold off. */
		upconn_reading(c, false, 0);
	}
	if (n == BEVIO_NOMEM) {
		bufferevent_trigger_event(bev, BEV_EVENT_ERROR | BEV_EVENT_READING, 0);
	} else if (n > 0) {
		if (more)
			event_active(c->rev, EV_READ, 1);
		bufferevent_trigger(bev, EV_READ, 0); /* the read callback, now; c may be gone after */
	} else if (n == 0) {
		bufferevent_trigger_event(bev, BEV_EVENT_EOF | BEV_EVENT_READING, 0);
	} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
		bufferevent_trigger_event(bev, BEV_EVENT_ERROR | BEV_EVENT_READING, 0);
	}
}

/* A TLS connection's handshake is done: from here tokentap reads it
 * (on_upconn_readable), the bufferevent only writes. Left to the
 * bufferevent when no event can be made. */
static void upconn_tls_own(struct upconn *c)
{
	struct upstream *up = c->up;
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	SSL *ssl = tls_bev_ssl(c->bev);

	if (!ssl || fd < 0 || !(c->rev = event_new(up->base, fd, EV_READ | EV_PERSIST, on_upconn_readable, c)))
		return;
	bufferevent_disable(c->bev, EV_READ);
	bufferevent_set_timeouts(c->bev, NULL, NULL);
	tls_read_own(ssl);
	c->ssl = ssl;
	if (tls_bev_resumed(c->bev)) {
		up->tls_resumed++;
		log_debug("upstream %s: u%llu resumed a TLS session", up->name, (unsigned long long)c->id);
	}
}

void upconn_reading(struct upconn *c, bool on, uint64_t timeout_ms)
{
	if (!c->rev && c->connected && c->up->tls)
		upconn_tls_own(c);
	if (!c->rev) {
		struct timeval tv = loop_tv(timeout_ms);
		bufferevent_set_timeouts(c->bev, on && timeout_ms ? &tv : NULL, NULL);
		if (on)
			bufferevent_enable(c->bev, EV_READ);
		else
			bufferevent_disable(c->bev, EV_READ);
		return;
	}
	c->reading = on;
	if (!on) {
		event_del(c->rev);
		return;
	}
	if (timeout_ms) {
		struct timeval tv = loop_tv(timeout_ms);
		event_add(c->rev, &tv);
	} else {
		event_add(c->rev, NULL);
	}
	/* records read ahead while reading was off, or with the handshake */
	if (c->ssl && tls_pending(c->ssl))
		event_active(c->rev, EV_READ, 1);
}

void upconn_writing(struct upconn *c)
{
	if (!(bufferevent_get_enabled(c->bev) & EV_WRITE))
		bufferevent_enable(c->bev, EV_WRITE);
}

void upconn_priority(struct upconn *c, enum loop_prio prio)
{
	/* fails only while the event sits in the active queue: it then keeps
	 * its old priority for this one turn */
	if (c->rev)
		event_priority_set(c->rev, (int)prio);
}

void upstream_count_outcome(struct upstream *up, const struct req_record *rec)
{
	if (!up)
		return;
	up->requests++;
	if (rec->error != REQ_ERR_NONE) {
		up->errors[rec->error]++;
		up->last_error = rec->error;
		up->last_error_unix = (uint64_t)time(NULL);
	}
}

void upstream_free(struct upstream *up)
{
	struct upconn *c;

	if (!up || --up->refs > 0)
		return;
	while ((c = TAILQ_FIRST(&up->idle))) {
		TAILQ_REMOVE(&up->idle, c, link);
		upconn_close(c);
	}
	share_leave(up);
	if (up->kick_ev)
		event_free(up->kick_ev);
	if (up->kick_fd != -1)
		close(up->kick_fd);
	conf_release(&up->conf);
	tls_resume_reset(&up->tls_resume, NULL);
	tls_ctx_free(up->tls_ctx);
	free(up->name);
	free(up->url);
	free(up);
}

static void pool_remove(struct upconn *c)
{
	TAILQ_REMOVE(&c->up->idle, c, link);
	c->up->n_idle--;
}

/* An idle connection must stay silent: data, a close or the idle timeout all
 * end it. */
static void on_idle_read(struct bufferevent *bev, void *arg)
{
	struct upconn *c = arg;
	CHECK_OBJ(c, UPCONN_MAGIC);
	log_debug("upstream %s: idle connection u%llu sent unexpected data; closing", c->up->name,
		  (unsigned long long)c->id);
	pool_remove(c);
	upconn_close(c);
}

static void on_idle_event(struct bufferevent *bev, short what, void *arg)
{
	struct upconn *c = arg;
	CHECK_OBJ(c, UPCONN_MAGIC);
	pool_remove(c);
	upconn_close(c);
}

struct upconn *upstream_acquire(struct upstream *up, bool *reused)
{
	struct upconn *c = TAILQ_FIRST(&up->idle);

	if (c) {
		pool_remove(c);
		/* Plain TCP: the read event stays in epoll from the pool to the
		 * request (only its idle timer goes), so that a reused connection
		 * costs no epoll_ctl; whatever it reads now goes to the caller's
		 * callbacks. */
		if (c->rev)
			event_remove_timer(c->rev);
		else
			upconn_reading(c, false, 0);
		bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
		up->conns_out++;
		up->reused++;
		*reused = true;
		return c;
	}
	*reused = false;
	return upstream_connect_new(up);
}

struct upconn *upstream_connect_new(struct upstream *up)
{
	struct upconn *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	OBJ_MAGIC_SET(c, UPCONN_MAGIC);
	c->up = up;
	c->id = ++up->opened;
	c->bev = up->tls ? tls_bev_connect(up->base, up->tls_ctx,
					   up->conf.tls_server_name ? up->conf.tls_server_name : up->host,
					   up->conf.tls_verify)
			 : bufferevent_socket_new(up->base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!c->bev) {
		free(c);
		return NULL;
	}
	if (up->tls)
		tls_bev_resume(c->bev, &up->tls_resume);
	/* Errors, refused connections included, arrive on the caller's event
	 * callback; a -1 here means not even a socket could be made. */
	if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&up->addr, (int)up->addrlen) == -1) {
		upconn_close(c);
		return NULL;
	}
	int one = 1;
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (!up->tls && !(c->rev = event_new(up->base, fd, EV_READ | EV_PERSIST, on_upconn_readable, c))) {
		upconn_close(c);
		return NULL;
	}
	up->conns_out++;
	return c;
}

bool upstream_dispatch_cold(const struct upstream *up, bool reused, uint64_t now_ns)
{
	struct up_share *s = up->share;

	if (reused)
		return false;
	if (atomic_load_explicit(&s->completed, memory_order_relaxed) == 0 ||
	    atomic_load_explicit(&s->failing, memory_order_relaxed))
		return true;
	/* active counts this request: nothing else ran meanwhile, in any worker */
	return atomic_load_explicit(&s->active, memory_order_relaxed) <= 1 &&
	       now_ns - atomic_load_explicit(&s->last_done_ns, memory_order_relaxed) > up->cold_idle_ms * 1000000u;
}

void upstream_note_result(struct upstream *up, bool responded, uint64_t now_ns)
{
	struct up_share *s = up->share;

	up->failing = !responded;
	if (responded) {
		atomic_fetch_add_explicit(&s->completed, 1, memory_order_relaxed);
		atomic_store_explicit(&s->last_done_ns, now_ns, memory_order_relaxed);
	}
	atomic_store_explicit(&s->failing, !responded, memory_order_relaxed);
}

void upstream_release(struct upconn *c, bool reusable)
{
	struct upstream *up;

	if (!c)
		return;
	up = c->up;
	up->conns_out--;
	if (!reusable || !c->connected || up->n_idle >= POOL_MAX_IDLE ||
	    evbuffer_get_length(bufferevent_get_input(c->bev)) != 0 || (c->ssl && tls_pending(c->ssl)) ||
	    evbuffer_get_length(bufferevent_get_output(c->bev)) != 0) {
		upconn_close(c);
		return;
	}
	upconn_set_direct(c, NULL, NULL);
	bufferevent_setcb(c->bev, on_idle_read, NULL, on_idle_event, c);
	upconn_priority(c, LOOP_PRIO_NORMAL);
	bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	upconn_reading(c, true, up->pool_idle_timeout_ms);
	TAILQ_INSERT_HEAD(&up->idle, c, link); /* most recently used first: warmest socket */
	up->n_idle++;
}

/* ---- what each upstream is expected to hold (upstream_held_*) ---- */

/* Process-wide: block hash -> the upstream that got it last, the hash's
 * bits above 16 as the tag and the upstream's held_id below. */
#define HELD_OWNER_SLOTS (1u << 15)
static _Atomic uint64_t held_owner[HELD_OWNER_SLOTS];

static uint64_t held_val(uint64_t h)
{
	return h ? h : 1; /* 0 marks an empty slot */
}

static unsigned held_slot(uint64_t h, unsigned slots)
{
	return (unsigned)((h ^ (h >> 29)) & (slots - 1));
}

static bool held_has(const struct up_share *s, uint64_t h)
{
	return atomic_load_explicit(&s->held[held_slot(h, UP_HELD_SLOTS)], memory_order_relaxed) == held_val(h);
}

static uint64_t owner_tag(uint64_t h)
{
	return (h | 1) & ~(uint64_t)0xffff;
}

static unsigned owner_of(uint64_t h)
{
	uint64_t e =
		atomic_load_explicit(&held_owner[held_slot(h >> 16 | h << 48, HELD_OWNER_SLOTS)], memory_order_relaxed);
	return (e & ~(uint64_t)0xffff) == owner_tag(h) ? (unsigned)(e & 0xffff) : 0;
}

void upstream_held_note(struct upstream *up, const uint64_t *chain, unsigned n)
{
	struct up_share *s = up->share;

	if (!s)
		return;
	for (unsigned i = 0; i < n; i++) {
		uint64_t h = chain[i];
		_Atomic uint64_t *slot = &s->held[held_slot(h, UP_HELD_SLOTS)];
		/* read first: a block already there (a session's earlier turns)
		 * costs no write */
		if (atomic_load_explicit(slot, memory_order_relaxed) != held_val(h))
			atomic_store_explicit(slot, held_val(h), memory_order_relaxed);
		_Atomic uint64_t *o = &held_owner[held_slot(h >> 16 | h << 48, HELD_OWNER_SLOTS)];
		uint64_t e = owner_tag(h) | s->held_id;
		if (atomic_load_explicit(o, memory_order_relaxed) != e)
			atomic_store_explicit(o, e, memory_order_relaxed);
	}
}

/* The longest leading run of chain[0..n) that `has` finds, by bisection:
 * a block's hash covers every block before it, so a run that holds block
 * i holds those before it, but for a slot another block took since (then
 * the run found is shorter: a guess on the safe side). */
static unsigned held_run(bool (*has)(const void *ctx, uint64_t h), const void *ctx, const uint64_t *chain, unsigned n)
{
	unsigned lo = 0, hi = n;

	if (!n || !has(ctx, chain[0]))
		return 0;
	if (has(ctx, chain[n - 1]))
		return n;
	lo = 1;
	hi = n - 1;
	while (lo < hi) {
		unsigned mid = (lo + hi + 1) / 2;
		if (has(ctx, chain[mid - 1]))
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

static bool share_has(const void *ctx, uint64_t h)
{
	return held_has(ctx, h);
}

static bool owner_has(const void *ctx, uint64_t h)
{
	(void)ctx;
	return owner_of(h) != 0;
}

unsigned upstream_held_blocks(const struct upstream *up, const uint64_t *chain, unsigned n)
{
	return up->share ? held_run(share_has, up->share, chain, n) : 0;
}

unsigned upstream_held_owner(const uint64_t *chain, unsigned n, unsigned *blocks)
{
	*blocks = held_run(owner_has, NULL, chain, n);
	return *blocks ? owner_of(chain[*blocks - 1]) : 0;
}

unsigned upstream_held_id(const struct upstream *up)
{
	return up->share ? up->share->held_id : 0;
}
