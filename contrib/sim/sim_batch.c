/*
 * sim_batch.c — tokentap-sim's optional continuous-batching model
 * (--batching): one scheduler, shared by every connection, that advances
 * in steps on a libevent timer the way vLLM or SGLang do.
 *
 *   submit -> [queue, FIFO] --admit--> [running batch] --n_out tokens--> done
 *                             fits max_batch and the KV budget
 *
 * A step is planned when it begins and applied when its timer fires:
 *   begin: admit from the queue head while the batch has a free slot and
 *          the KV budget holds the sequence (prompt + output tokens); give
 *          each prefilling sequence its share of this step's prefill
 *          (the whole prompt, or --chunked-prefill tokens in FIFO order);
 *          duration = base + per_seq * (sequences emitting a token)
 *                          + (prompt tokens prefilled) / prefill_tps
 *   end:   every emitting sequence gains one token (its first, when its
 *          prefill completed in this step); finished ones leave the batch
 *          and free their KV; each advanced sequence's connection is told;
 *          the next step begins at once when there is work.
 * A request arriving mid-step waits for that step to end (the engine is
 * busy), so the scheduler adds real queueing on top of the step times.
 *
 * Invariants: the scheduler never touches a socket and never frees a
 * sequence (its request owns it); everything here is single-threaded on
 * the event loop; nothing random happens, so timing depends only on the
 * flags and the arrival times.
 */
#include "sim.h"

#include <event2/buffer.h>
#include <event2/event.h>

#include <inttypes.h>
#include <stddef.h>

struct seq_list {
	struct sim_seq *head, *tail;
	uint64_t n;
};

enum batch_state {
	B_IDLE,	    /* no step in progress; a kick starts one */
	B_WARMING,  /* cold start: the timer ends the warm-up */
	B_STEPPING, /* the timer ends the current step */
};

static struct {
	struct event *timer; /* end of the step or of the warm-up */
	struct event *kick;  /* zero-delay: begin a step */
	struct seq_list queue, running;
	struct sim_seq *notify; /* sequences advanced by the ending step */
	enum batch_state state;
	uint64_t kv_used;
	uint64_t step_end_ns;  /* scheduled end of the current step */
	uint64_t step_ns;      /* duration of the current step */
	uint64_t last_busy_ns; /* end of the latest step */
	bool ever_busy;
	/* counters for /sim/stats */
	uint64_t steps, admitted, generated, prefilled, cold_starts;
} B;

/* ---- lists ---- */

static void list_push(struct seq_list *l, struct sim_seq *q)
{
	q->next = NULL;
	q->prev = l->tail;
	if (l->tail != NULL)
		l->tail->next = q;
	else
		l->head = q;
	l->tail = q;
	l->n++;
}

static void list_remove(struct seq_list *l, struct sim_seq *q)
{
	if (q->prev != NULL)
		q->prev->next = q->next;
	else
		l->head = q->next;
	if (q->next != NULL)
		q->next->prev = q->prev;
	else
		l->tail = q->prev;
	q->prev = q->next = NULL;
	l->n--;
}

/* ---- the cost model ---- */

static uint64_t ms_to_ns(double ms)
{
	return (uint64_t)(ms * 1e6 + 0.5);
}

static uint64_t prefill_ns(uint64_t tokens)
{
	return (uint64_t)((double)tokens * 1e9 / sim_cfg.prefill_tps + 0.5);
}

static uint64_t step_cost_ns(uint64_t n_emit, uint64_t n_prefill)
{
	return ms_to_ns(sim_cfg.step_base_ms) + ms_to_ns(sim_cfg.step_per_seq_ms * (double)n_emit) +
	       prefill_ns(n_prefill);
}

uint64_t sim_batch_nominal_itl_ns(void)
{
	return step_cost_ns(1, 0);
}

uint64_t sim_batch_nominal_ttft_ns(uint64_t n_in)
{
	uint64_t steps = 1;

	if (sim_cfg.chunked_prefill > 0)
		steps = (n_in + sim_cfg.chunked_prefill - 1) / sim_cfg.chunked_prefill;
	if (steps == 0)
		steps = 1;
	/* every step pays the base; only the last one emits */
	return (steps - 1) * ms_to_ns(sim_cfg.step_base_ms) + step_cost_ns(1, n_in);
}

/* ---- stepping ---- */

/* Rounded up to whole microseconds: a step never ends before its time. */
static void timer_in(uint64_t delay_ns)
{
	uint64_t us = (delay_ns + 999) / 1000;
	struct timeval tv = {
		.tv_sec = (time_t)(us / 1000000ULL),
		.tv_usec = (suseconds_t)(us % 1000000ULL),
	};

	evtimer_add(B.timer, &tv);
}

static bool fits(const struct sim_seq *q)
{
	if (B.running.n == 0)
		return true; /* alone, even a sequence over the whole budget */
	return B.running.n < sim_cfg.max_batch && B.kv_used + q->kv <= sim_cfg.kv_tokens;
}

/* Plans one step starting at start_ns; goes idle when there is no work. */
static void step_begin(uint64_t start_ns)
{
	uint64_t budget = sim_cfg.chunked_prefill > 0 ? sim_cfg.chunked_prefill : UINT64_MAX;
	uint64_t n_emit = 0, n_prefill = 0, now;
	struct sim_seq *q;

	while ((q = B.queue.head) != NULL && fits(q)) {
		list_remove(&B.queue, q);
		list_push(&B.running, q);
		q->where = SEQ_RUNNING;
		q->admit_ns = start_ns > q->submit_ns ? start_ns : q->submit_ns;
		B.kv_used += q->kv;
		B.admitted++;
	}
	if (B.running.n == 0) {
		B.state = B_IDLE;
		return;
	}
	for (q = B.running.head; q != NULL; q = q->next) {
		q->step_prefill = 0;
		q->step_emits = false;
		if (q->prefilled < q->n_in) {
			uint64_t take = q->n_in - q->prefilled;

			if (take > budget)
				take = budget;
			budget -= take;
			q->step_prefill = take;
			n_prefill += take;
			if (q->prefilled + take < q->n_in)
				continue; /* prefill goes on next step */
		}
		q->step_emits = true;
		n_emit++;
	}
	B.step_ns = step_cost_ns(n_emit, n_prefill);
	B.step_end_ns = start_ns + B.step_ns;
	B.state = B_STEPPING;
	now = sim_now_ns();
	timer_in(B.step_end_ns > now ? B.step_end_ns - now : 0);
}

static void notify_push(struct sim_seq *q)
{
	if (q->notify_pending)
		return;
	q->notify_pending = true;
	q->notify_next = B.notify;
	B.notify = q;
}

static void step_end(void)
{
	struct sim_seq *q, *next;
	uint64_t end = B.step_end_ns, now;
	/* what --server-timing reports as a token's moment: now, when its
	 * connection is about to be told, not the nominal end (libevent's
	 * timer counts from its cached loop time, so it can fire a little
	 * before the nominal end) */
	const uint64_t emitted = sim_now_ns();

	B.steps++;
	for (q = B.running.head; q != NULL; q = next) {
		next = q->next;
		q->prefilled += q->step_prefill;
		B.prefilled += q->step_prefill;
		q->step_prefill = 0;
		if (!q->step_emits)
			continue;
		q->step_emits = false;
		if (q->generated < q->n_out) {
			q->generated++;
			B.generated++;
			if (q->generated == 1)
				q->first_ns = emitted;
		}
		if (q->generated >= q->n_out) {
			q->last_ns = emitted;
			q->finished = true;
			list_remove(&B.running, q);
			q->where = SEQ_NONE;
			B.kv_used -= q->kv;
		}
		notify_push(q);
	}
	B.last_busy_ns = end;
	B.ever_busy = true;
	B.state = B_IDLE;

	/* Connections write what they can. A callback may cancel its own
	 * sequence (a dropped reader) or submit its next pipelined request;
	 * it never touches another connection's sequence. */
	while ((q = B.notify) != NULL) {
		B.notify = q->notify_next;
		q->notify_next = NULL;
		q->notify_pending = false;
		sim_conn_seq_progress(q);
	}

	/* Back to back on the nominal clock, so timer latency does not add up;
	 * but after a stall longer than a step, restart from now instead of
	 * running a burst of catch-up steps. */
	now = sim_now_ns();
	if (now > end + B.step_ns)
		end = now;
	if (B.state == B_IDLE)
		step_begin(end);
}

static bool goes_cold(uint64_t now)
{
	if (sim_cfg.cold_start_ms == 0)
		return false;
	/* The server starts cold, and cools after idle_ms without a step. */
	if (!B.ever_busy)
		return true;
	return now > B.last_busy_ns && now - B.last_busy_ns >= sim_cfg.idle_ms * 1000000ULL;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	if (B.state == B_WARMING) {
		B.state = B_IDLE;
		B.ever_busy = true;
		B.last_busy_ns = sim_now_ns();
		step_begin(B.last_busy_ns);
	} else if (B.state == B_STEPPING) {
		step_end();
	}
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	uint64_t now;

	if (B.state != B_IDLE || (B.queue.n == 0 && B.running.n == 0))
		return;
	now = sim_now_ns();
	if (goes_cold(now)) {
		B.state = B_WARMING;
		B.cold_starts++;
		timer_in(sim_cfg.cold_start_ms * 1000000ULL);
		return;
	}
	step_begin(now);
}

/* ---- interface ---- */

int sim_batch_init(struct event_base *base)
{
	B.timer = evtimer_new(base, on_timer, NULL);
	B.kick = event_new(base, -1, 0, on_kick, NULL);
	return B.timer != NULL && B.kick != NULL ? 0 : -1;
}

void sim_batch_shutdown(void)
{
	if (B.timer != NULL)
		event_free(B.timer);
	if (B.kick != NULL)
		event_free(B.kick);
	B.timer = B.kick = NULL;
}

void sim_batch_submit(struct sim_seq *q)
{
	q->prev = q->next = q->notify_next = NULL;
	q->kv = q->n_in + q->n_out;
	q->prefilled = q->step_prefill = q->generated = 0;
	q->step_emits = q->notify_pending = q->finished = false;
	q->submit_ns = sim_now_ns();
	q->admit_ns = q->first_ns = q->last_ns = 0;
	q->where = SEQ_QUEUED;
	list_push(&B.queue, q);
	/* Zero-delay, so requests arriving in the same loop turn share the
	 * first step, and no step starts inside a connection's callback. */
	if (B.state == B_IDLE)
		event_active(B.kick, EV_TIMEOUT, 1);
}

void sim_batch_cancel(struct sim_seq *q)
{
	if (q->where == SEQ_QUEUED) {
		list_remove(&B.queue, q);
	} else if (q->where == SEQ_RUNNING) {
		list_remove(&B.running, q);
		B.kv_used -= q->kv;
		/* The step in progress keeps its planned duration: the GPU
		 * work was already launched. */
	}
	q->where = SEQ_NONE;
	if (q->notify_pending) {
		struct sim_seq **pp = &B.notify;

		while (*pp != NULL && *pp != q)
			pp = &(*pp)->notify_next;
		if (*pp == q)
			*pp = q->notify_next;
		q->notify_next = NULL;
		q->notify_pending = false;
	}
}

struct sim_timing sim_batch_timing(const struct sim_seq *q)
{
	struct sim_timing t = { 0 };

	if (!q->finished || q->admit_ns == 0 || q->first_ns < q->admit_ns || q->last_ns < q->first_ns)
		return t;
	t.known = true;
	t.queue_ns = q->admit_ns - q->submit_ns;
	t.prefill_ns = q->first_ns - q->admit_ns;
	t.decode_ns = q->last_ns - q->first_ns;
	return t;
}

void sim_batch_stats_json(struct evbuffer *out)
{
	evbuffer_add_printf(out,
			    "{\"running\":%" PRIu64 ",\"queued\":%" PRIu64 ",\"kv_used\":%" PRIu64 ",\"steps\":%" PRIu64
			    ",\"admitted\":%" PRIu64 ",\"generated\":%" PRIu64 ",\"prefilled\":%" PRIu64
			    ",\"cold_starts\":%" PRIu64 ",\"dropped\":%" PRIu64 "}",
			    B.running.n, B.queue.n, B.kv_used, B.steps, B.admitted, B.generated, B.prefilled,
			    B.cold_starts, sim_stats.dropped);
}

void sim_batch_gauges(uint64_t *running, uint64_t *queued, uint64_t *kv_used)
{
	*running = B.running.n;
	*queued = B.queue.n;
	*kv_used = B.kv_used;
}
