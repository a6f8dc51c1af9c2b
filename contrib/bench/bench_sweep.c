/*
 * bench_sweep.c — the latency-versus-load curve of a --sweep: a summary
 * table, the curve as JSON, and an SVG chart with throughput on the left
 * axis, TTFT p50/p99 on the right, concurrency on a log2 x axis, and the
 * knee marked.
 *
 * The knee is tokentap's: knee_find() over (concurrency, requests/s, p50
 * TTFT) with the same minimum number of requests per point as /stats/curve,
 * so "the knee" means the same thing here and in the admin API. Without
 * streaming there is no TTFT and p50 e2e stands in, as /stats/curve does.
 */
#include "bench.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include <jansson.h>

#include "knee.h"

static double rps(const struct bench_result *s)
{
	return s->elapsed_s > 0 ? (double)s->m.ok / s->elapsed_s : 0;
}

static double otps(const struct bench_result *s)
{
	return s->elapsed_s > 0 ? (double)s->m.output_tokens / s->elapsed_s : 0;
}

static bool use_ttft(const struct bench_opts *o)
{
	return o->stream;
}

static double latency_p50(const struct bench_opts *o, const struct bench_result *s)
{
	return report_quantile_ms(&s->m.h[use_ttft(o) ? BM_TTFT : BM_E2E], 0.5);
}

static struct knee sweep_knee(const struct bench_opts *o, const struct bench_result *steps, unsigned n)
{
	struct knee_point pts[BENCH_MAX_SWEEP];
	for (unsigned i = 0; i < n; i++) {
		pts[i].load = steps[i].concurrency;
		pts[i].throughput = rps(&steps[i]);
		pts[i].latency = latency_p50(o, &steps[i]);
		pts[i].requests = steps[i].m.ok;
	}
	return knee_find(pts, n, KNEE_MIN_REQUESTS);
}

static json_t *real_or_null(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

void sweep_table(FILE *f, const struct bench_opts *o, const struct bench_result *steps, unsigned n)
{
	struct knee k = sweep_knee(o, steps, n);

	fprintf(f, "\nsweep: %s, %s, model %s, input %s tokens, output %s tokens, closed loop per step%s\n",
		o->api_name, o->stream ? "streaming" : "not streaming", o->model ? o->model : "(server default)",
		o->input_len.desc, o->output_len.desc, o->warmup ? ", warm-up excluded" : "");
	fprintf(f, "%11s %8s %6s %12s %16s %13s %13s %12s %s\n", "concurrency", "ok", "failed", "requests/s",
		"output tokens/s", "ttft p50 ms", "ttft p99 ms", "itl p50 ms", "");
	for (unsigned i = 0; i < n; i++) {
		const struct bench_result *s = &steps[i];
		fprintf(f, "%11u %8llu %6llu %12.3f %16.1f %13.3f %13.3f %12.3f %s\n", s->concurrency,
			(unsigned long long)s->m.ok, (unsigned long long)s->m.failed, rps(s), otps(s),
			report_quantile_ms(&s->m.h[BM_TTFT], 0.5), report_quantile_ms(&s->m.h[BM_TTFT], 0.99),
			report_quantile_ms(&s->m.h[BM_ITL], 0.5), k.index == (int)i ? "<- knee" : "");
	}
	if (k.index < 0)
		fprintf(f, "knee: none (no step had %d ok requests with a latency)\n", KNEE_MIN_REQUESTS);
	else
		fprintf(f, "knee: concurrency %u (the last step up that raised requests/s per ms of p50 %s)%s\n",
			steps[k.index].concurrency, use_ttft(o) ? "ttft" : "e2e",
			k.saturated ? "" : "; the curve had not bent yet: the true knee may lie at higher concurrency");
}

static json_t *sweep_json(const struct bench_opts *o, const struct bench_result *steps, unsigned n)
{
	json_t *root = json_object(), *arr = json_array();
	struct knee k = sweep_knee(o, steps, n);

	json_object_set_new(root, "config", report_config_json(o));
	for (unsigned i = 0; i < n; i++) {
		const struct bench_result *s = &steps[i];
		json_t *e = json_object();
		json_object_set_new(e, "concurrency", json_integer(s->concurrency));
		json_object_set_new(e, "requests_per_s", json_real(rps(s)));
		json_object_set_new(e, "output_tokens_per_s", json_real(otps(s)));
		json_object_set_new(e, "input_tokens_per_s",
				    json_real(s->elapsed_s > 0 ? (double)s->m.input_tokens / s->elapsed_s : 0));
		json_object_set_new(e, "ttft_p50_ms", real_or_null(report_quantile_ms(&s->m.h[BM_TTFT], 0.5)));
		json_object_set_new(e, "ttft_p99_ms", real_or_null(report_quantile_ms(&s->m.h[BM_TTFT], 0.99)));
		json_object_set_new(e, "knee", json_boolean(k.index == (int)i));
		json_object_set_new(e, "result", report_result_json(o, s));
		json_array_append_new(arr, e);
	}
	json_object_set_new(root, "steps", arr);
	if (k.index >= 0) {
		json_t *kn = json_object();
		json_object_set_new(kn, "concurrency", json_integer(steps[k.index].concurrency));
		json_object_set_new(kn, "requests_per_s", json_real(rps(&steps[k.index])));
		json_object_set_new(kn, "latency_p50_ms", json_real(latency_p50(o, &steps[k.index])));
		json_object_set_new(kn, "latency_basis", json_string(use_ttft(o) ? "ttft" : "e2e"));
		json_object_set_new(kn, "saturated", json_boolean(k.saturated));
		json_object_set_new(root, "knee", kn);
	} else {
		json_object_set_new(root, "knee", json_null());
	}
	return root;
}

/* ---- SVG ---- */

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		default:
			if ((unsigned char)*s >= 0x20 || *s == '\t')
				fputc(*s, f);
		}
	}
}

/* A "nice" upper bound and step (1, 2 or 5 times a power of ten) for an
 * axis from 0 to at least `max`, with about five ticks. */
static void nice_axis(double max, double *top, double *step)
{
	if (!(max > 0) || !isfinite(max))
		max = 1;
	double raw = max / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
	*step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
	*top = ceil(max / *step) * *step;
}

#define W 860.0
#define H 500.0
#define ML 80.0
#define MR 80.0
#define MT 60.0
#define MB 70.0

static int svg_write(const char *path, const struct bench_opts *o, const struct bench_result *steps, unsigned n)
{
	FILE *f = fopen(path, "w");
	struct knee k = sweep_knee(o, steps, n);
	double tmax = 0, lmax = 0, xlo = INFINITY, xhi = 0;
	double ttop, tstep, ltop, lstep;
	const double pw = W - ML - MR, ph = H - MT - MB;
	char title[512];

	if (!f) {
		fprintf(stderr, BENCH_NAME ": --svg: cannot write %s: %s\n", path, strerror(errno));
		return -1;
	}
	for (unsigned i = 0; i < n; i++) {
		double t = rps(&steps[i]), p99 = report_quantile_ms(&steps[i].m.h[BM_TTFT], 0.99);
		tmax = t > tmax ? t : tmax;
		if (isfinite(p99) && p99 > lmax)
			lmax = p99;
		double lx = log2((double)steps[i].concurrency);
		xlo = lx < xlo ? lx : xlo;
		xhi = lx > xhi ? lx : xhi;
	}
	if (xhi - xlo < 1) {
		xlo -= 0.5;
		xhi += 0.5;
	}
	nice_axis(tmax, &ttop, &tstep);
	nice_axis(lmax, &ltop, &lstep);
#define XP(c) (ML + (log2((double)(c)) - xlo) / (xhi - xlo) * pw)
#define YT(v) (MT + ph - (v) / ttop * ph)
#define YL(v) (MT + ph - (v) / ltop * ph)

	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
	fprintf(f,
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
		"font-family=\"sans-serif\" font-size=\"12\">\n",
		W, H, W, H);
	fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
	snprintf(title, sizeof(title), "%s sweep: %s%s, model %s, input %s / output %s tokens", BENCH_NAME, o->api_name,
		 o->stream ? "" : " (not streaming)", o->model ? o->model : "(server default)", o->input_len.desc,
		 o->output_len.desc);
	fprintf(f, "<title>");
	xml_text(f, title);
	fprintf(f, "</title>\n<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", W / 2);
	xml_text(f, title);
	fprintf(f, "</text>\n");

	/* grid and axes */
	fprintf(f, "<g id=\"axes\" stroke=\"#444\" fill=\"none\">\n");
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", ML, MT, pw, ph);
	fprintf(f, "</g>\n<g id=\"y-left\" fill=\"#1f77b4\">\n");
	for (double v = 0; v <= ttop + tstep / 2; v += tstep) {
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ML, YT(v),
			ML + pw, YT(v));
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ML - 6, YT(v) + 4, v);
	}
	fprintf(f,
		"<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">throughput "
		"(requests/s)</text>\n</g>\n",
		ML - 55, MT + ph / 2);
	fprintf(f, "<g id=\"y-right\" fill=\"#d62728\">\n");
	for (double v = 0; v <= ltop + lstep / 2; v += lstep)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", ML + pw + 6, YL(v) + 4, v);
	fprintf(f,
		"<text transform=\"translate(%.1f,%.1f) rotate(90)\" text-anchor=\"middle\">TTFT (ms)</text>\n</g>\n",
		ML + pw + 55, MT + ph / 2);
	fprintf(f, "<g id=\"x-axis\">\n");
	for (unsigned i = 0; i < n; i++)
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%u</text>\n", XP(steps[i].concurrency),
			MT + ph + 18, steps[i].concurrency);
	fprintf(f,
		"<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">concurrency (requests in flight, closed loop; "
		"log scale)</text>\n</g>\n",
		ML + pw / 2, MT + ph + 44);

	/* the knee, under the curves */
	if (k.index >= 0) {
		const struct bench_result *s = &steps[k.index];
		double x = XP(s->concurrency);
		fprintf(f, "<g id=\"knee\" data-concurrency=\"%u\" data-saturated=\"%s\">\n", s->concurrency,
			k.saturated ? "true" : "false");
		fprintf(f,
			"<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#2ca02c\" stroke-width=\"1.5\" "
			"stroke-dasharray=\"6 4\"/>\n",
			x, MT, x, MT + ph);
		fprintf(f,
			"<circle cx=\"%.1f\" cy=\"%.1f\" r=\"8\" fill=\"none\" stroke=\"#2ca02c\" "
			"stroke-width=\"2\"/>\n",
			x, YT(rps(s)));
		fprintf(f,
			"<text x=\"%.1f\" y=\"%.1f\" fill=\"#2ca02c\" text-anchor=\"%s\">knee: concurrency %u, %.1f "
			"requests/s, ttft p50 %.1f ms%s</text>\n",
			x + (x > ML + pw / 2 ? -6 : 6), MT + 14, x > ML + pw / 2 ? "end" : "start", s->concurrency,
			rps(s), latency_p50(o, s), k.saturated ? "" : " (not yet bent)");
		fprintf(f, "</g>\n");
	}

	/* the curves */
	struct {
		const char *id, *color, *dash;
		int kind; /* 0 throughput, 1 ttft p50, 2 ttft p99 */
	} series[] = {
		{ "throughput", "#1f77b4", "", 0 },
		{ "ttft-p50", "#ff7f0e", "", 1 },
		{ "ttft-p99", "#d62728", " stroke-dasharray=\"5 3\"", 2 },
	};
	for (size_t sI = 0; sI < sizeof(series) / sizeof(series[0]); sI++) {
		fprintf(f, "<g id=\"%s\">\n<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
			series[sI].id, series[sI].color, series[sI].dash);
		for (unsigned i = 0; i < n; i++) {
			const struct bench_result *s = &steps[i];
			double v = series[sI].kind == 0
					   ? rps(s)
					   : report_quantile_ms(&s->m.h[BM_TTFT], series[sI].kind == 1 ? 0.5 : 0.99);
			if (!isfinite(v))
				continue;
			fprintf(f, "%.1f,%.1f ", XP(s->concurrency), series[sI].kind == 0 ? YT(v) : YL(v));
		}
		fprintf(f, "\"/>\n");
		for (unsigned i = 0; i < n; i++) {
			const struct bench_result *s = &steps[i];
			double v = series[sI].kind == 0
					   ? rps(s)
					   : report_quantile_ms(&s->m.h[BM_TTFT], series[sI].kind == 1 ? 0.5 : 0.99);
			if (isfinite(v))
				fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
					XP(s->concurrency), series[sI].kind == 0 ? YT(v) : YL(v), series[sI].color);
		}
		fprintf(f, "</g>\n");
	}

	/* legend */
	fprintf(f, "<g id=\"legend\">\n");
	const char *labels[] = { "throughput, requests/s (left axis)", "TTFT p50, ms (right axis)",
				 "TTFT p99, ms (right axis)" };
	for (size_t sI = 0; sI < 3; sI++) {
		double y = MT + 34 + 18.0 * (double)sI;
		fprintf(f,
			"<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
			ML + 12, y, ML + 36, y, series[sI].color, series[sI].dash);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", ML + 42, y + 4, labels[sI]);
	}
	fprintf(f, "</g>\n</svg>\n");
#undef XP
#undef YT
#undef YL
	if (ferror(f) | fclose(f)) {
		fprintf(stderr, BENCH_NAME ": --svg: cannot write %s\n", path);
		return -1;
	}
	return 0;
}

int sweep_write(const struct bench_opts *o, const struct bench_result *steps, unsigned n)
{
	int rc = 0;
	if (o->json_path && report_write_json(o->json_path, sweep_json(o, steps, n)) == -1)
		rc = -1;
	if (o->svg_path && svg_write(o->svg_path, o, steps, n) == -1)
		rc = -1;
	return rc;
}
