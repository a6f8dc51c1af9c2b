/*
 * classify.c — which streamed events carry tokens, what they carry, and
 * where usage lives.
 *
 * Every framed event of every streamed response passes through
 * classify_event(), so the token decision is made by byte scans, never by
 * parsing the event: keyscan_find() finds a quoted key such as "content", and the
 * bytes right after it say whether its value is a non-empty string, an
 * object, a non-empty array. Which key held text says what the event
 * carries: answer text, reasoning or a tool call (struct token_key). Usage
 * counts (usually one event per response) are read the same way, member by
 * member of the objects that hold them, with the semantics a JSON parser
 * would give (direct members only, the last of a repeated key, integers
 * only), so no event costs an allocation.
 *
 * Why a key scan cannot be fooled by text that merely looks like a key: in
 * valid JSON an unescaped '"' always delimits a string, and a string value
 * that contains "content": holds it as \"content\": with the quote escaped.
 * So a hit whose opening quote follows an odd run of backslashes lies inside
 * a string and is skipped; any other hit is a real string token, and it is a
 * key exactly when ':' follows it. What a key scan does not know is where in
 * the tree the key sits; the rules below only look for keys whose name,
 * together with the type of their value, is unambiguous in each API's event
 * shape (e.g. OpenAI's logprobs.content is an array, delta.content a string).
 *
 * The events of one stream look alike, so the caller may keep a hint (struct
 * classify_hint) of where the last one held its text: the key is then found
 * in one vector step instead of a search through the id, model and nesting
 * in front of it. Only the search for usage (and, for chat, timings and
 * the keys that outrank a hinted reasoning key, in the same pass) still
 * runs to each event's end.
 *
 * The engines' own per-request timings ride in the same final events and
 * bodies and are read the same way (struct server_timing). A chat or
 * completions event is searched for "usage" and "timings" in one pass
 * (keyscan_find_any), so a chunk without either (almost all of them) pays
 * one key search for both.
 *
 * The rules are documented for operators in docs/metrics.md; keep both in
 * step.
 */
#include "classify.h"

#include <stdint.h>
#include <string.h>

#include "keyscan.h"
#include "strutil.h"

/* A quoted key literal and its length, for key_find(). */
#define KEY(k) ("\"" k "\""), (sizeof("\"" k "\"") - 1)

struct api_route {
	const char *path;
	enum api_kind api;
};

/* Exact paths. llama.cpp's native API is /completion (singular); its
 * /completions alias streams the same native shape, which classify_event
 * recognises under API_OPENAI_COMPLETIONS too (see classify_completions). */
static const struct api_route api_routes[] = {
	{ "/v1/chat/completions", API_OPENAI_CHAT },
	{ "/chat/completions", API_OPENAI_CHAT },
	{ "/v1/completions", API_OPENAI_COMPLETIONS },
	{ "/completions", API_OPENAI_COMPLETIONS },
	{ "/completion", API_LLAMACPP },
	{ "/v1/messages", API_ANTHROPIC },
	{ "/generate_stream", API_TGI },
	{ "/generate", API_TGI },
	{ "/api/generate", API_OLLAMA_GENERATE },
	{ "/api/chat", API_OLLAMA_CHAT },
	{ "/v1/responses", API_OPENAI_RESPONSES },
	{ "/responses", API_OPENAI_RESPONSES },
	{ "/v1/embeddings", API_EMBEDDINGS },
	{ "/embeddings", API_EMBEDDINGS },
	{ "/v1/rerank", API_RERANK },
	{ "/v2/rerank", API_RERANK },
	{ "/rerank", API_RERANK },
	{ "/v1/score", API_SCORE },
	{ "/score", API_SCORE },
	{ "/v1/classify", API_CLASSIFY },
	{ "/classify", API_CLASSIFY },
	{ "/embed", API_TEI_EMBED },
	{ "/v1/realtime", API_REALTIME },
};

/* ---- Gemini paths ---------------------------------------------------------
 *
 * Google AI: /v1beta/models/MODEL:METHOD (also /v1/ and /v1alpha/);
 * Vertex AI: /v1/projects/P/locations/L/publishers/google/models/MODEL:METHOD
 * (also /v1beta1/). METHOD is generateContent or streamGenerateContent. */

/* Moves *p past the literal `lit` when [*p, end) starts with it. */
static bool skip_lit(const char **p, const char *end, const char *lit)
{
	size_t n = strlen(lit);
	if ((size_t)(end - *p) < n || memcmp(*p, lit, n) != 0)
		return false;
	*p += n;
	return true;
}

/* Moves *p past a non-empty path segment and the '/' after it. */
static bool skip_segment(const char **p, const char *end)
{
	const char *q = *p;
	while (q < end && *q != '/' && *q != ':')
		q++;
	if (q == *p || q >= end || *q != '/')
		return false;
	*p = q + 1;
	return true;
}

/* The Gemini API of the path, and where its model segment is. */
static enum api_kind gemini_path(const char *path, size_t len, const char **model, size_t *mlen)
{
	static const char gen[] = ":generateContent", sgen[] = ":streamGenerateContent";
	const char *p = path, *end;
	enum api_kind api;

	if (len > sizeof(sgen) - 1 && memcmp(path + len - (sizeof(sgen) - 1), sgen, sizeof(sgen) - 1) == 0) {
		api = API_GEMINI_STREAM;
		end = path + len - (sizeof(sgen) - 1);
	} else if (len > sizeof(gen) - 1 && memcmp(path + len - (sizeof(gen) - 1), gen, sizeof(gen) - 1) == 0) {
		api = API_GEMINI;
		end = path + len - (sizeof(gen) - 1);
	} else {
		return API_UNKNOWN;
	}
	if (skip_lit(&p, end, "/v1/projects/") || skip_lit(&p, end, "/v1beta1/projects/")) {
		if (!skip_segment(&p, end) || !skip_lit(&p, end, "locations/") || !skip_segment(&p, end) ||
		    !skip_lit(&p, end, "publishers/google/models/"))
			return API_UNKNOWN;
	} else if (!skip_lit(&p, end, "/v1beta/models/") && !skip_lit(&p, end, "/v1/models/") &&
		   !skip_lit(&p, end, "/v1alpha/models/")) {
		return API_UNKNOWN;
	}
	if (p == end || memchr(p, '/', (size_t)(end - p)) != NULL || memchr(p, ':', (size_t)(end - p)) != NULL)
		return API_UNKNOWN;
	*model = p;
	*mlen = (size_t)(end - p);
	return api;
}

/* Bedrock's runtime operations, /model/MODEL/OP. */
static const struct bedrock_op {
	const char *op; /* with its leading '/' */
	enum api_kind api;
	bool streams;
} bedrock_ops[] = {
	{ "/converse-stream", API_BEDROCK_CONVERSE, true },
	{ "/converse", API_BEDROCK_CONVERSE, false },
	{ "/invoke-with-response-stream", API_BEDROCK_INVOKE, true },
	{ "/invoke", API_BEDROCK_INVOKE, false },
};

/* The operation of a /model/MODEL/OP path (MODEL not empty), or NULL. */
static const struct bedrock_op *bedrock_op_of(const char *path, size_t len)
{
	static const char prefix[] = "/model/";
	const size_t pl = sizeof(prefix) - 1;

	if (path == NULL || len <= pl || memcmp(path, prefix, pl) != 0)
		return NULL;
	for (size_t i = 0; i < sizeof(bedrock_ops) / sizeof(bedrock_ops[0]); i++) {
		size_t n = strlen(bedrock_ops[i].op);
		if (len > pl + n && memcmp(path + len - n, bedrock_ops[i].op, n) == 0)
			return &bedrock_ops[i];
	}
	return NULL;
}

bool classify_bedrock_path_model(const char *path, size_t len, size_t *off, size_t *mlen)
{
	const struct bedrock_op *op = bedrock_op_of(path, len);
	if (op == NULL)
		return false;
	*off = sizeof("/model/") - 1;
	*mlen = len - *off - strlen(op->op);
	return true;
}

bool classify_path_streams(enum api_kind api, const char *path, size_t len)
{
	const struct bedrock_op *op = bedrock_op_of(path, len);
	return op != NULL && op->api == api && op->streams;
}

enum api_kind classify_api(const char *path, size_t len)
{
	const char *model;
	size_t mlen;

	if (path == NULL)
		return API_UNKNOWN;
	const struct bedrock_op *op = bedrock_op_of(path, len);
	if (op != NULL)
		return op->api;
	/* One trailing slash is tolerated ("/v1/messages/"), not more. */
	if (len > 1 && path[len - 1] == '/')
		len--;
	for (size_t i = 0; i < sizeof(api_routes) / sizeof(api_routes[0]); i++) {
		size_t n = strlen(api_routes[i].path);
		if (n == len && memcmp(path, api_routes[i].path, n) == 0)
			return api_routes[i].api;
	}
	return gemini_path(path, len, &model, &mlen);
}

size_t classify_path_model(enum api_kind api, const char *path, size_t len, const char **model)
{
	size_t mlen = 0;

	*model = NULL;
	if ((api != API_GEMINI && api != API_GEMINI_STREAM) || path == NULL)
		return 0;
	if (len > 1 && path[len - 1] == '/')
		len--;
	if (gemini_path(path, len, model, &mlen) != api) {
		*model = NULL;
		return 0;
	}
	for (size_t i = 0; i < mlen; i++) {
		unsigned char c = (unsigned char)(*model)[i];
		if (c <= 0x20 || c >= 0x7f || c == '"' || c == '\\') {
			*model = NULL;
			return 0;
		}
	}
	return mlen;
}

/* After a key at v: blanks, ':', blanks, a string. 1 with the string's
 * bytes when it is usable (plain visible ASCII, no escape, 1 to cap - 1
 * bytes), 0 when the literal was not a key (no ':' follows), -1 when it
 * was a key without a usable string. */
static int model_value(const char *v, const char *end, size_t cap, const char **s, size_t *n)
{
	while (v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r'))
		v++;
	if (v == end || *v++ != ':')
		return 0;
	while (v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r'))
		v++;
	if (v == end || *v++ != '"')
		return -1;
	size_t k = 0;
	while (v + k < end && v[k] != '"') {
		if (v[k] == '\\' || v[k] < 0x21 || v[k] > 0x7e || k + 1 >= cap)
			return -1;
		k++;
	}
	if (v + k == end || k == 0)
		return -1;
	*s = v;
	*n = k;
	return 1;
}

bool classify_resp_model(enum api_kind api, const char *p, size_t len, char *out, size_t cap)
{
	const char *key = "\"model\"", *end = p + len, *found = NULL, *s;
	size_t klen = 7, fn = 0, n;
	bool last = false;

	if (api == API_BEDROCK_CONVERSE || cap < 2)
		return false;
	if (api == API_GEMINI || api == API_GEMINI_STREAM) {
		key = "\"modelVersion\"";
		klen = 14;
		last = true;
	}
	for (const char *k = p; (k = keyscan_find(k, end, key, klen)) != NULL; k += klen) {
		int rc = model_value(k + klen, end, cap, &s, &n);
		if (rc == 1) {
			found = s;
			fn = n;
		}
		if (rc != 0 && !last)
			break; /* the first key decides */
	}
	if (!found)
		return false;
	memcpy(out, found, fn);
	out[fn] = '\0';
	return true;
}

bool classify_resp_model_at_end(enum api_kind api)
{
	return api == API_GEMINI;
}

bool classify_streams_json_array(enum api_kind api)
{
	return api == API_GEMINI_STREAM;
}

const char *classify_api_name(enum api_kind api)
{
	switch (api) {
	case API_OPENAI_CHAT: return "openai-chat";
	case API_OPENAI_COMPLETIONS: return "openai-completions";
	case API_ANTHROPIC: return "anthropic";
	case API_TGI: return "tgi";
	case API_LLAMACPP: return "llamacpp";
	case API_OLLAMA_GENERATE: return "ollama-generate";
	case API_OLLAMA_CHAT: return "ollama-chat";
	case API_OPENAI_RESPONSES: return "openai-responses";
	case API_EMBEDDINGS: return "embeddings";
	case API_RERANK: return "rerank";
	case API_SCORE: return "score";
	case API_CLASSIFY: return "classify";
	case API_TEI_EMBED: return "tei-embed";
	case API_GEMINI:
	case API_GEMINI_STREAM: return "gemini";
	case API_BEDROCK_CONVERSE: return "bedrock-converse";
	case API_BEDROCK_INVOKE: return "bedrock-invoke";
	case API_REALTIME: return "realtime";
	case API_UNKNOWN: break;
	}
	return "unknown";
}

/* Score pairs one text_1 with each text_2 (or one with one, list with
 * list), so text_2 holds as many elements as there are pairs. */
const char *classify_inputs_key(enum api_kind api)
{
	switch (api) {
	case API_EMBEDDINGS:
	case API_CLASSIFY: return "input";
	case API_RERANK: return "documents";
	case API_SCORE: return "text_2";
	case API_TEI_EMBED: return "inputs";
	default: break;
	}
	return NULL;
}

const char *classify_inputs_alt_key(enum api_kind api)
{
	return api == API_RERANK ? "texts" : NULL;
}

/* ---- byte scans ------------------------------------------------------- */

/* The bytes an event is scanned in. */
struct span {
	const char *p;
	const char *end;
};

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static const char *skip_space(const char *p, const char *end)
{
	while (p < end && is_space(*p))
		p++;
	return p;
}

/* The value of the key whose quoted name of length qlen starts at hit, or
 * NULL when that occurrence is not a key: inside a string (an odd run of
 * backslashes before it), not followed by ':', or with nothing after the
 * ':'. Judged by the bytes around the hit alone (the file header says why
 * that is enough). */
static const char *key_value(const struct span *s, const char *hit, size_t qlen)
{
	size_t bs = 0;
	while (hit - bs > s->p && hit[-(ptrdiff_t)bs - 1] == '\\')
		bs++;
	if (bs & 1)
		return NULL;
	const char *v = skip_space(hit + qlen, s->end);
	if (v >= s->end || *v != ':')
		return NULL; /* a string value, not a key */
	v = skip_space(v + 1, s->end);
	return v < s->end ? v : NULL;
}

/* Finds the next occurrence of the quoted key `qkey` (as made by KEY()) at or
 * after *from, and returns a pointer to its value (after ':' and blanks), or
 * NULL when there is none. *from is moved past the key, so a caller can loop
 * over every occurrence. Hits inside string values are skipped (see the file
 * header for why the backslash parity is enough). Whether a hit is a key
 * depends only on the bytes around it, and a rejected hit moves the search
 * on by one byte, not past the hit: in bytes that are not JSON an
 * occurrence can start inside a rejected one, and it is visited too. So
 * the hits accepted from any starting point are exactly those at or after
 * it, which is what lets a hint start the search anywhere. */
static const char *key_find(const struct span *s, const char **from, const char *qkey, size_t qlen)
{
	const char *p = *from;
	while (p < s->end) {
		const char *hit = keyscan_find(p, s->end, qkey, qlen);
		if (hit == NULL)
			break;
		p = hit + 1;
		const char *v = key_value(s, hit, qlen);
		if (v == NULL)
			continue;
		*from = hit + qlen;
		return v;
	}
	*from = s->end;
	return NULL;
}

/* A non-empty JSON string starts at v: '"' then anything but '"'. */
static int value_is_nonempty_string(const struct span *s, const char *v)
{
	return v + 1 < s->end && v[0] == '"' && v[1] != '"';
}

/* A JSON array with at least one element starts at v. */
static int value_is_nonempty_array(const struct span *s, const char *v)
{
	if (v >= s->end || *v != '[')
		return 0;
	const char *q = skip_space(v + 1, s->end);
	return q < s->end && *q != ']';
}

/* The value at v is the string literal `lit` (given with its quotes). */
static int value_is_string(const struct span *s, const char *v, const char *qlit, size_t qlen)
{
	return (size_t)(s->end - v) >= qlen && memcmp(v, qlit, qlen) == 0;
}

static int value_is_literal(const struct span *s, const char *v, const char *lit)
{
	size_t n = strlen(lit);
	return (size_t)(s->end - v) >= n && memcmp(v, lit, n) == 0;
}

/* ---- token keys ---------------------------------------------------------- */

/* A key whose non-empty value marks an event as token-bearing: a string
 * (the text) or, for tool calls, an array; and what that value is. */
struct token_key {
	const char *qkey; /* quoted, as made by KEY() */
	size_t qlen;
	bool array;
	enum token_kind kind;
};

/* Which kind wins when one event holds several: the answer, then a tool
 * call, then reasoning. Each API's keys are listed in this order. */
static int kind_rank(enum token_kind k)
{
	switch (k) {
	case TOKEN_ANSWER: return 0;
	case TOKEN_TOOL: return 1;
	case TOKEN_REASONING: return 2;
	case TOKEN_NONE: break;
	}
	return 3;
}

#define NKEYS(a) (sizeof(a) / sizeof((a)[0]))

static bool value_holds_text(const struct span *s, const char *v, const struct token_key *k)
{
	return k->array ? value_is_nonempty_array(s, v) : value_is_nonempty_string(s, v);
}

/* Searches [*from, end) for an occurrence of key k whose value holds text;
 * on success leaves *from just past that key. */
static bool key_holds_text(const struct span *s, const char **from, const struct token_key *k)
{
	const char *v;
	while ((v = key_find(s, from, k->qkey, k->qlen)) != NULL)
		if (value_holds_text(s, v, k))
			return true;
	return false;
}

/* Key k sits right at `at` and holds text: what key_holds_text() from
 * `at` finds first when the stream's events share their head, checked
 * without a search. key_value() judges the occurrence by the bytes around
 * it, as key_find() does, so when this says yes the search would have
 * stopped at the same place. */
static bool key_sits_with_text(const struct span *s, const char *at, const struct token_key *k)
{
	if ((size_t)(s->end - at) < k->qlen || !keyscan_same(at, k->qkey, k->qlen))
		return false;
	const char *v = key_value(s, at, k->qlen);
	return v != NULL && value_holds_text(s, v, k);
}

/* Notes in the hint that key number `rule` (1-based) held text at offset
 * `at`; an offset past what the hint can hold is not noted. */
static void hint_note(struct classify_hint *hint, size_t rule, size_t at)
{
	if (at <= UINT32_MAX) {
		hint->rule = (uint8_t)rule;
		hint->at = (uint32_t)at;
	}
}

/* The first of keys [0, n) that holds text anywhere in the event: its kind,
 * TOKEN_NONE when none does. */
static enum token_kind first_key_holding_text(const struct span *s, const struct token_key *keys, size_t n,
					      struct classify_hint *hint)
{
	for (size_t i = 0; i < n; i++) {
		const char *from = s->p;
		if (key_holds_text(s, &from, &keys[i])) {
			if (hint)
				hint_note(hint, i + 1, (size_t)(from - s->p) - keys[i].qlen);
			return keys[i].kind;
		}
	}
	return TOKEN_NONE;
}

/* What an OpenAI-shaped chunk holds besides its text. "usage":null rides
 * on every chunk with include_usage; only an object carries counts (the
 * final chunk, or every chunk with vLLM's continuous usage stats). Without
 * one, the chunk may still carry llama.cpp's "timings" (its finish chunk
 * without include_usage, or every chunk with timings_per_token). */
enum openai_extra { EXTRA_NONE, EXTRA_TIMINGS, EXTRA_USAGE };

/*
 * One pass over the event (keyscan_find_any) for two questions at once.
 * Returns whether some occurrence of keys [0, n) holds text: what n calls
 * of key_holds_text() from the event's start would say together, since
 * the pass visits every occurrence of every key and key_value() judges
 * each by the bytes around it alone, as key_find() does. When `extra` is
 * not NULL, also sets it: EXTRA_USAGE when some "usage" key has an object
 * value (what any_object() says), else EXTRA_TIMINGS when "timings"
 * occurs at all (what keyscan_find() says), else EXTRA_NONE. n + 2 keys
 * must fit in KEYSCAN_MAX_KEYS.
 */
static bool scan_once(const struct span *s, const struct token_key *keys, size_t n, enum openai_extra *extra)
{
	/* The usual call, every chat event's (n 0: usage and timings only),
	 * takes a key set checked at compile time. */
	static const struct keyscan_set usage_timings = KEYSCAN_SET2(KEY("usage"), KEY("timings"));
	struct keyscan_set local;
	const struct keyscan_set *set = &usage_timings;
	size_t which = 0;
	bool text = false, usage = false, timings = false;
	const char *p = s->p, *hit;

	if (n > 0 || !extra) {
		struct keyscan_key kk[KEYSCAN_MAX_KEYS];
		size_t m = 0;
		for (size_t i = 0; i < n; i++)
			kk[m++] = (struct keyscan_key){ keys[i].qkey, keys[i].qlen };
		if (extra) {
			kk[m++] = (struct keyscan_key){ KEY("usage") };
			kk[m++] = (struct keyscan_key){ KEY("timings") };
		}
		keyscan_set_init(&local, kk, m); /* m 0 or outside the contract: finds nothing */
		set = &local;
	}
	while ((!text || (extra && !usage)) && (hit = keyscan_find_set(p, s->end, set, &which)) != NULL) {
		const char *v = which <= n ? key_value(s, hit, set->keys[which].qlen) : NULL;
		if (which < n)
			text = text || (v != NULL && value_holds_text(s, v, &keys[which]));
		else if (which == n)
			usage = usage || (v != NULL && *v == '{');
		else
			timings = true;
		p = hit + 1;
	}
	if (extra)
		*extra = usage ? EXTRA_USAGE : timings ? EXTRA_TIMINGS : EXTRA_NONE;
	return text;
}

/*
 * What the event carries: the kind of the first of the keys (listed by
 * kind_rank) that holds text. With a hint, the key that held it in the
 * stream's last token event is looked for first from where it was. That
 * probe can only confirm: key_find() judges a hit by the bytes around it
 * (the backslashes before it, the ':' after it), not by where the search
 * began, so a hit it accepts from any starting point is one the full search
 * visits too. A confirmed key is the answer unless a key of a kind that
 * ranks before it holds text too, so those (none for an answer key, the
 * common case) are still looked for in the whole event. When the probe
 * finds nothing, every key is searched from the event's start, exactly as
 * without a hint.
 *
 * For chat and completions (`extra` not NULL) the keys ranked before a
 * confirmed reasoning or tool key (chat: content, refusal, tool_calls) are
 * looked for in the same pass as usage and timings (scan_once), which the
 * event pays anyway. What is relied on: the engines send nothing of higher
 * rank beside reasoning (the key alone in its delta, as vLLM does, or
 * beside null content and tool_calls, as SGLang does), so the pass
 * usually proves that none of them holds text. When it finds one that
 * does, the keys are searched one by one as before, so the answer and the
 * hint come out exactly as without the pass. The other APIs search the
 * higher keys one by one, as before (not measured, so not changed).
 * Figures: docs/dev/perf-log.md, "The classifier on reasoning chunks".
 */
static enum token_kind keys_kind(const struct span *s, const struct token_key *keys, size_t n,
				 struct classify_hint *hint, enum openai_extra *extra)
{
	size_t len = (size_t)(s->end - s->p);

	if (hint && hint->rule > 0 && hint->rule <= n && hint->at < len) {
		const struct token_key *k = &keys[hint->rule - 1];
		const char *from = s->p + hint->at;
		if (key_sits_with_text(s, from, k) ? (from += k->qlen, true) : key_holds_text(s, &from, k)) {
			size_t before = 0;
			while (before < n && kind_rank(keys[before].kind) < kind_rank(k->kind))
				before++;
			size_t at = (size_t)(from - s->p) - k->qlen;
			if (extra && before + 2 <= KEYSCAN_MAX_KEYS) {
				if (scan_once(s, keys, before, extra))
					return first_key_holding_text(s, keys, before, hint);
				hint_note(hint, hint->rule, at);
				return k->kind;
			}
			if (extra)
				scan_once(s, keys, 0, extra);
			enum token_kind better = first_key_holding_text(s, keys, before, hint);
			if (better != TOKEN_NONE)
				return better;
			hint_note(hint, hint->rule, at);
			return k->kind;
		}
	}
	if (extra)
		scan_once(s, keys, 0, extra);
	return first_key_holding_text(s, keys, n, hint);
}

/* Some occurrence of key `qkey` has an object value. */
static int any_object(const struct span *s, const char *qkey, size_t qlen)
{
	const char *from = s->p;
	const char *v;
	while ((v = key_find(s, &from, qkey, qlen)) != NULL)
		if (*v == '{')
			return 1;
	return 0;
}

/* Some occurrence of key "type" has the string value `qlit`. */
static int type_is(const struct span *s, const char *qlit, size_t qlen)
{
	const char *from = s->p;
	const char *v;
	while ((v = key_find(s, &from, KEY("type"))) != NULL)
		if (value_is_string(s, v, qlit, qlen))
			return 1;
	return 0;
}

/* The '"' that closes the string whose body starts at p, or NULL when it
 * is cut off: the first '"' after an even run of backslashes (an escape
 * takes the byte after its backslash), found with memchr, so the long text
 * of a Responses API response.completed costs a few calls, not a loop
 * per byte. */
static const char *closing_quote(const char *p, const char *end)
{
	while (p < end) {
		const char *q = memchr(p, '"', (size_t)(end - p));
		if (q == NULL)
			return NULL;
		size_t bs = 0;
		while (q - bs > p && q[-(ptrdiff_t)bs - 1] == '\\')
			bs++;
		if (!(bs & 1))
			return q;
		p = q + 1;
	}
	return NULL;
}

/* One past the end of the object or array starting at v, or s->end when it
 * is cut off. Strings are skipped whole, escapes included; brackets are only
 * counted, as the event is assumed well formed. */
static const char *container_end(const struct span *s, const char *v)
{
	int depth = 0;
	const char *p = v;
	while (p < s->end) {
		char c = *p++;
		if (c == '"') {
			p = closing_quote(p, s->end);
			if (p == NULL)
				return s->end;
			p++;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if ((c == '}' || c == ']') && --depth == 0) {
			return p;
		}
	}
	return s->end;
}

/* ---- usage counts: object members --------------------------------------- */

/* One past the closing quote of the string starting at p ('"'), or NULL
 * when it is cut off. */
static const char *string_end(const struct span *s, const char *p)
{
	for (p++;;) { /* a word at a time to the next quote or backslash */
		const char *q = find_either(p, s->end, '"', '\\');
		if (q >= s->end || (*q == '\\' && q + 1 >= s->end))
			return NULL;
		if (*q == '"')
			return q + 1;
		p = q + 2;
	}
}

/* One past the JSON value starting at v (s->end when it is cut off). */
static const char *value_end(const struct span *s, const char *v)
{
	if (*v == '{' || *v == '[')
		return container_end(s, v);
	if (*v == '"') {
		const char *e = string_end(s, v);
		return e ? e : s->end;
	}
	while (v < s->end && *v != ',' && *v != '}' && *v != ']' && !is_space(*v))
		v++;
	return v;
}

/* A member key asked for: quoted, as made by KEY(). */
struct member_key {
	const char *qkey;
	size_t qlen;
};

/* The values of members keys[0, n) of the object at obj, into vals[0, n)
 * (NULL for a key it has not, or all of them when obj is not an object),
 * in one walk of its members: vals[i] is what member(s, obj, keys[i])
 * gives, as the walk is the same whatever the key. Only the object's own
 * members count, not keys deeper down, and the last one wins when a key
 * repeats: what a JSON parser would give. */
static void members(const struct span *s, const char *obj, const struct member_key *keys, size_t n, const char **vals)
{
	for (size_t i = 0; i < n; i++)
		vals[i] = NULL;
	if (obj == NULL || obj >= s->end || *obj != '{')
		return;
	for (const char *p = skip_space(obj + 1, s->end); p < s->end && *p == '"';) {
		const char *kend = string_end(s, p);
		if (kend == NULL)
			break;
		const char *v = skip_space(kend, s->end);
		if (v >= s->end || *v != ':')
			break;
		v = skip_space(v + 1, s->end);
		if (v >= s->end)
			break;
		size_t klen = (size_t)(kend - p);
		for (size_t i = 0; i < n; i++)
			if (klen == keys[i].qlen && memcmp(p, keys[i].qkey, klen) == 0)
				vals[i] = v;
		p = skip_space(value_end(s, v), s->end);
		if (p >= s->end || *p != ',')
			break;
		p = skip_space(p + 1, s->end);
	}
}

/* The value of member `qkey` (quoted, as made by KEY()) of the object at
 * obj, or NULL when obj is not an object or has no such member (members()
 * for one key). */
static const char *member(const struct span *s, const char *obj, const char *qkey, size_t qlen)
{
	const struct member_key key = { qkey, qlen };
	const char *found;
	members(s, obj, &key, 1, &found);
	return found;
}

/* Stores member `qkey` of obj into *dst when it is a count: a JSON integer
 * (no fraction, no exponent) from 0 to INT64_MAX. */
static void count_at(const struct span *s, const char *v, int64_t *dst);

static void take_count(const struct span *s, const char *obj, const char *qkey, size_t qlen, int64_t *dst)
{
	count_at(s, member(s, obj, qkey, qlen), dst);
}

/* Stores the value at v (NULL: none) into *dst when it is a count. */
static void count_at(const struct span *s, const char *v, int64_t *dst)
{
	bool negative = false;
	int64_t n = 0;

	if (v == NULL)
		return;
	if (*v == '-') {
		negative = true;
		v++;
	}
	if (v >= s->end || *v < '0' || *v > '9')
		return;
	for (; v < s->end && *v >= '0' && *v <= '9'; v++) {
		int d = *v - '0';
		if (n > (INT64_MAX - d) / 10)
			return;
		n = n * 10 + d;
	}
	if (v < s->end && (*v == '.' || *v == 'e' || *v == 'E'))
		return;
	if (negative && n != 0)
		return;
	*dst = n;
}

/* ---- server timings ------------------------------------------------------ */

/* A JSON number of milliseconds at v, as nanoseconds (rounded to the
 * nearest): digits, an optional fraction and exponent, no sign. Anything
 * else (null, a string, a negative or too large value) is not a duration.
 * Integer arithmetic only: the digits are kept as a mantissa (the first 18
 * significant ones) and a power of ten. */
static bool parse_ms_ns(const char *v, const char *end, int64_t *out)
{
	uint64_t mant = 0;
	int digits = 0, exp10 = 6; /* ms to ns */
	bool any = false;

	for (; v < end && *v >= '0' && *v <= '9'; v++, any = true) {
		if (digits < 18) {
			mant = mant * 10 + (uint64_t)(*v - '0');
			digits += mant != 0;
		} else {
			exp10++;
		}
	}
	if (v < end && *v == '.') {
		v++;
		if (v >= end || *v < '0' || *v > '9')
			return false;
		for (; v < end && *v >= '0' && *v <= '9'; v++, any = true) {
			if (digits < 18) {
				mant = mant * 10 + (uint64_t)(*v - '0');
				digits += mant != 0;
				exp10--;
			}
		}
	}
	if (!any)
		return false;
	if (v < end && (*v == 'e' || *v == 'E')) {
		bool neg = false;
		int e = 0;
		v++;
		if (v < end && (*v == '+' || *v == '-'))
			neg = *v++ == '-';
		if (v >= end || *v < '0' || *v > '9')
			return false;
		for (; v < end && *v >= '0' && *v <= '9'; v++)
			if (e < 1000)
				e = e * 10 + (*v - '0');
		exp10 += neg ? -e : e;
	}
	if (v < end && *v != ',' && *v != '}' && *v != ']' && !is_space(*v))
		return false;
	if (mant == 0) {
		*out = 0;
		return true;
	}
	for (; exp10 > 0; exp10--) {
		if (mant > (uint64_t)INT64_MAX / 10)
			return false;
		mant *= 10;
	}
	for (; exp10 < 0 && mant > 0; exp10++)
		mant = exp10 == -1 ? (mant + 5) / 10 : mant / 10;
	if (mant > (uint64_t)INT64_MAX)
		return false;
	*out = (int64_t)mant;
	return true;
}

/* Stores member `qkey` of obj, a number of milliseconds, into *dst as ns;
 * true when it was one. */
static bool take_ms(const struct span *s, const char *obj, const char *qkey, size_t qlen, int64_t *dst)
{
	const char *v = member(s, obj, qkey, qlen);
	return v != NULL && parse_ms_ns(v, s->end, dst);
}

/* Stores member `qkey` of obj, an integer count of ns, into *dst; true when
 * it was one. */
static bool take_ns(const struct span *s, const char *obj, const char *qkey, size_t qlen, int64_t *dst)
{
	int64_t v = -1;
	take_count(s, obj, qkey, qlen, &v);
	if (v < 0)
		return false;
	*dst = v;
	return true;
}

/* llama.cpp's "timings": prompt_ms is the prefill of the uncached part of
 * the prompt (prompt_n tokens), predicted_ms the decode. No queue time:
 * llama.cpp does not report one. */
static void server_llamacpp(const struct span *s, const char *timings, struct server_timing *t)
{
	bool any = take_ms(s, timings, KEY("prompt_ms"), &t->prefill_ns);
	any |= take_ms(s, timings, KEY("predicted_ms"), &t->decode_ns);
	if (any)
		t->source = SERVER_LLAMACPP;
}

/* vLLM's "metrics" (--enable-per-request-metrics): time_to_first_token_ms
 * counts from when the request was scheduled, so it is the prefill, not a
 * TTFT; any field may be null. */
static void server_vllm(const struct span *s, const char *metrics, struct server_timing *t)
{
	bool any = take_ms(s, metrics, KEY("queue_time_ms"), &t->queue_ns);
	any |= take_ms(s, metrics, KEY("time_to_first_token_ms"), &t->prefill_ns);
	any |= take_ms(s, metrics, KEY("generation_time_ms"), &t->decode_ns);
	if (any)
		t->source = SERVER_VLLM;
}

/* Ollama's final object, integer ns. load_duration runs from the handler's
 * entry to a runner being ready: its scheduler wait and the model load. */
static void server_ollama(const struct span *s, const char *root, struct server_timing *t)
{
	bool any = take_ns(s, root, KEY("load_duration"), &t->load_ns);
	any |= take_ns(s, root, KEY("prompt_eval_duration"), &t->prefill_ns);
	any |= take_ns(s, root, KEY("eval_duration"), &t->decode_ns);
	if (any)
		t->source = SERVER_OLLAMA;
}

const char *classify_server_name(enum server_source src)
{
	switch (src) {
	case SERVER_LLAMACPP: return "llamacpp";
	case SERVER_OLLAMA: return "ollama";
	case SERVER_VLLM: return "vllm";
	case SERVER_TGI: return "tgi";
	case SERVER_BEDROCK: return "bedrock";
	case SERVER_NONE: break;
	}
	return NULL;
}

static bool header_is(const char *name, size_t nlen, const char *lit)
{
	size_t n = strlen(lit);
	if (nlen != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (c >= 'A' && c <= 'Z')
			c = (char)(c - 'A' + 'a');
		if (c != lit[i])
			return false;
	}
	return true;
}

/* TGI's values are integer milliseconds (as_millis()); surrounding blanks
 * are allowed, nothing else. */
static bool header_ms(const char *val, size_t vlen, int64_t *dst)
{
	const char *p = val, *end = val + vlen;
	int64_t n = 0;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	if (p == end)
		return false;
	for (; p < end; p++) {
		if (*p < '0' || *p > '9' || n > (INT64_MAX / 1000000 - 9) / 10)
			return false;
		n = n * 10 + (*p - '0');
	}
	*dst = n * 1000000;
	return true;
}

void classify_header(const char *name, size_t nlen, const char *val, size_t vlen, struct server_timing *t)
{
	int64_t *dst = NULL;
	if (name == NULL || val == NULL || t == NULL || nlen < 8 || (name[0] != 'x' && name[0] != 'X'))
		return;
	if (header_is(name, nlen, "x-queue-time"))
		dst = &t->queue_ns;
	else if (header_is(name, nlen, "x-inference-time"))
		dst = &t->inference_ns;
	else if (header_is(name, nlen, "x-validation-time"))
		dst = &t->validation_ns;
	else if (header_is(name, nlen, "x-amzn-bedrock-invocation-latency")) {
		/* a non-streamed InvokeModel's whole call, integer ms */
		if (header_ms(val, vlen, &t->inference_ns))
			t->source = SERVER_BEDROCK;
		return;
	}
	if (dst && header_ms(val, vlen, dst))
		t->source = SERVER_TGI;
}

/* Where each API keeps its counts; `root` is the event's (or body's) top
 * object. */

/* OpenAI's details: cached (and, newer, cache-write) tokens within the
 * prompt, reasoning tokens within the output. SGLang puts reasoning_tokens
 * at the top of usage; the standard place wins when both are there. */
static void usage_openai_of(const struct span *s, const char *usage, struct usage *u)
{
	static const struct member_key keys[] = {
		{ KEY("prompt_tokens") },    { KEY("completion_tokens") },	   { KEY("prompt_tokens_details") },
		{ KEY("reasoning_tokens") }, { KEY("completion_tokens_details") },
	};
	const char *v[NKEYS(keys)];

	if (usage == NULL)
		return;
	members(s, usage, keys, NKEYS(keys), v);
	count_at(s, v[0], &u->input_tokens);
	count_at(s, v[1], &u->output_tokens);
	if (v[2] != NULL) {
		static const struct member_key pkeys[] = { { KEY("cached_tokens") }, { KEY("cache_write_tokens") } };
		const char *pv[NKEYS(pkeys)];
		members(s, v[2], pkeys, NKEYS(pkeys), pv);
		count_at(s, pv[0], &u->cached_tokens);
		count_at(s, pv[1], &u->cache_write_tokens);
	}
	count_at(s, v[3], &u->reasoning_tokens);
	take_count(s, v[4], KEY("reasoning_tokens"), &u->reasoning_tokens);
}

static void usage_openai(const struct span *s, const char *root, struct usage *u)
{
	usage_openai_of(s, member(s, root, KEY("usage")), u);
}

/* The one-answer APIs: every token is a prompt token. OpenAI's embeddings
 * and vLLM's say so in usage.prompt_tokens; Jina's rerank has only
 * usage.total_tokens, which is the same count there. */
static void usage_prompt_only(const struct span *s, const char *root, struct usage *u)
{
	const char *usage = member(s, root, KEY("usage"));
	take_count(s, usage, KEY("prompt_tokens"), &u->input_tokens);
	if (u->input_tokens < 0)
		take_count(s, usage, KEY("total_tokens"), &u->input_tokens);
}

/* The server timings an OpenAI-shaped chunk or body may carry at its top:
 * llama.cpp's "timings", vLLM's "metrics". */
static void server_openai_of(const struct span *s, const char *timings, const char *metrics, struct usage *u)
{
	server_llamacpp(s, timings, &u->server);
	server_vllm(s, metrics, &u->server);
}

static void server_openai(const struct span *s, const char *root, struct usage *u)
{
	static const struct member_key keys[] = { { KEY("timings") }, { KEY("metrics") } };
	const char *v[NKEYS(keys)];
	members(s, root, keys, NKEYS(keys), v);
	server_openai_of(s, v[0], v[1], u);
}

static void usage_tgi(const struct span *s, const char *root, struct usage *u)
{
	const char *details = member(s, root, KEY("details"));
	take_count(s, details, KEY("generated_tokens"), &u->output_tokens);
	/* Newer TGI sends the prompt length in stream details; prefill is
	 * only there on request, so it is not counted. */
	take_count(s, details, KEY("input_length"), &u->input_tokens);
}

static void usage_llamacpp(const struct span *s, const char *root, struct usage *u)
{
	/* timings first, so the top-level counts win when both are present.
	 * timings.prompt_n is only the part of the prompt that was not in
	 * the cache (cache_n): the whole prompt is their sum. */
	const char *timings = member(s, root, KEY("timings"));
	int64_t prefill = -1, cached = -1;
	server_llamacpp(s, timings, &u->server);
	take_count(s, timings, KEY("prompt_n"), &prefill);
	take_count(s, timings, KEY("cache_n"), &cached);
	if (cached >= 0)
		u->cached_tokens = cached;
	if (prefill >= 0 && prefill <= INT64_MAX - (cached > 0 ? cached : 0))
		u->input_tokens = prefill + (cached > 0 ? cached : 0);
	take_count(s, timings, KEY("predicted_n"), &u->output_tokens);
	take_count(s, root, KEY("tokens_evaluated"), &u->input_tokens);
	take_count(s, root, KEY("tokens_predicted"), &u->output_tokens);
}

static void usage_ollama(const struct span *s, const char *root, struct usage *u)
{
	server_ollama(s, root, &u->server);
	take_count(s, root, KEY("prompt_eval_count"), &u->input_tokens);
	take_count(s, root, KEY("eval_count"), &u->output_tokens);
}

/* Anthropic's input_tokens is what was neither read from nor written to
 * the cache; the whole prompt is its sum with cache_read_input_tokens and
 * cache_creation_input_tokens, and that is what input_tokens means here as
 * for every API. The counts of message_delta are cumulative, so a later
 * event repeating them changes nothing; one that leaves out the cache
 * counts keeps those already read. output_tokens_details.thinking_tokens
 * is the reasoning. message_start's output_tokens is a placeholder and is
 * not read (`output`). */
static void usage_anthropic(const struct span *s, const char *usage, bool output, struct usage *u)
{
	int64_t in = -1;
	if (usage == NULL)
		return;
	take_count(s, usage, KEY("input_tokens"), &in);
	take_count(s, usage, KEY("cache_read_input_tokens"), &u->cached_tokens);
	take_count(s, usage, KEY("cache_creation_input_tokens"), &u->cache_write_tokens);
	if (in >= 0) {
		int64_t rd = u->cached_tokens > 0 ? u->cached_tokens : 0;
		int64_t wr = u->cache_write_tokens > 0 ? u->cache_write_tokens : 0;
		if (rd <= INT64_MAX - wr && in <= INT64_MAX - rd - wr)
			u->input_tokens = in + rd + wr;
	}
	if (output) {
		take_count(s, usage, KEY("output_tokens"), &u->output_tokens);
		take_count(s, member(s, usage, KEY("output_tokens_details")), KEY("thinking_tokens"),
			   &u->reasoning_tokens);
	}
}

static void usage_anthropic_start(const struct span *s, const char *root, struct usage *u)
{
	usage_anthropic(s, member(s, member(s, root, KEY("message")), KEY("usage")), false, u);
}

static void usage_anthropic_delta(const struct span *s, const char *root, struct usage *u)
{
	usage_anthropic(s, member(s, root, KEY("usage")), true, u);
}

/* ---- per-API event rules ----------------------------------------------- */

/* Each API's token keys, in the order they are searched: answer keys,
 * then tool calls, then reasoning (kind_rank). `true` marks a key whose
 * value is an array (tool calls). */
static const struct token_key openai_chat_keys[] = {
	{ KEY("content"), false, TOKEN_ANSWER },      { KEY("refusal"), false, TOKEN_ANSWER },
	{ KEY("tool_calls"), true, TOKEN_TOOL },      { KEY("reasoning_content"), false, TOKEN_REASONING },
	{ KEY("reasoning"), false, TOKEN_REASONING },
};
/* Anthropic content_block_delta: text_delta, input_json_delta and
 * thinking_delta carry these; signature_delta (the thinking block's closing
 * signature, an opaque blob) and citations_delta carry none of them and are
 * not tokens. */
static const struct token_key anthropic_keys[] = {
	{ KEY("text"), false, TOKEN_ANSWER },
	{ KEY("partial_json"), false, TOKEN_TOOL },
	{ KEY("thinking"), false, TOKEN_REASONING },
};
static const struct token_key content_key[] = { { KEY("content"), false, TOKEN_ANSWER } };
static const struct token_key text_key[] = { { KEY("text"), false, TOKEN_ANSWER } };
static const struct token_key ollama_generate_keys[] = { { KEY("response"), false, TOKEN_ANSWER },
							 { KEY("tool_calls"), true, TOKEN_TOOL },
							 { KEY("thinking"), false, TOKEN_REASONING } };
static const struct token_key ollama_chat_keys[] = { { KEY("content"), false, TOKEN_ANSWER },
						     { KEY("tool_calls"), true, TOKEN_TOOL },
						     { KEY("thinking"), false, TOKEN_REASONING } };

/* Reads what scan_once() found. */
static void openai_read_extra(const struct span *s, enum openai_extra extra, struct usage *u)
{
	switch (extra) {
	case EXTRA_USAGE: {
		/* usage, timings and metrics in one walk of the chunk: what
		 * usage_openai() then server_openai() read. */
		static const struct member_key keys[] = { { KEY("usage") }, { KEY("timings") }, { KEY("metrics") } };
		const char *v[NKEYS(keys)];
		members(s, s->p, keys, NKEYS(keys), v);
		usage_openai_of(s, v[0], u);
		server_openai_of(s, v[1], v[2], u);
		break;
	}
	case EXTRA_TIMINGS: server_openai(s, s->p, u); break;
	case EXTRA_NONE: break;
	}
}

static enum token_kind classify_openai_chat(const struct span *s, struct usage *u, struct classify_hint *h)
{
	enum openai_extra extra;
	enum token_kind token = keys_kind(s, openai_chat_keys, NKEYS(openai_chat_keys), h, &extra);
	if (u)
		openai_read_extra(s, extra, u);
	return token;
}

static enum token_kind classify_llamacpp(const struct span *s, struct usage *u, struct classify_hint *h)
{
	enum token_kind token = keys_kind(s, content_key, NKEYS(content_key), h, NULL);
	if (u && (keyscan_find(s->p, s->end, KEY("tokens_predicted")) != NULL || any_object(s, KEY("timings"))))
		usage_llamacpp(s, s->p, u);
	return token;
}

/* OpenAI completions put text in choices[].text. llama.cpp's /completions
 * alias answers in its native shape, without "choices": read that as
 * llama.cpp. */
static enum token_kind classify_completions(const struct span *s, struct usage *u, struct classify_hint *h)
{
	const char *from = s->p;
	if (key_find(s, &from, KEY("choices")) == NULL && keyscan_find(s->p, s->end, KEY("content")))
		return classify_llamacpp(s, u, h);
	enum openai_extra extra;
	enum token_kind token = keys_kind(s, text_key, NKEYS(text_key), h, &extra);
	if (u)
		openai_read_extra(s, extra, u);
	return token;
}

static int name_is(const struct framer_event *ev, const char *lit)
{
	size_t n = strlen(lit);
	return ev->name_len == n && memcmp(ev->name, lit, n) == 0;
}

/* Anthropic names each event twice: the SSE `event:` field and "type". The
 * field is free to read, so it decides when present (the generic "message"
 * name says nothing and falls back to "type"). A content_block_delta is a
 * token when its delta holds non-empty text, thinking or partial_json: a
 * tool's input opens with an empty partial_json, and the signature closing
 * a thinking block is no text at all. */
static enum token_kind classify_anthropic(const struct framer_event *ev, const struct span *s, struct usage *u,
					  struct classify_hint *h)
{
	bool delta, start, mdelta;
	enum token_kind token = TOKEN_NONE;
	if (ev->name != NULL && ev->name_len > 0 && !name_is(ev, "message")) {
		delta = name_is(ev, "content_block_delta");
		start = name_is(ev, "message_start");
		mdelta = name_is(ev, "message_delta");
	} else {
		delta = type_is(s, KEY("content_block_delta"));
		start = !delta && type_is(s, KEY("message_start"));
		mdelta = !delta && !start && type_is(s, KEY("message_delta"));
	}
	if (delta)
		token = keys_kind(s, anthropic_keys, NKEYS(anthropic_keys), h, NULL);
	if (u && start)
		usage_anthropic_start(s, s->p, u);
	else if (u && mdelta)
		usage_anthropic_delta(s, s->p, u);
	return token;
}

/* TGI: {"token":{"id":..,"text":..,"logprob":..,"special":false},..}. A
 * special token (EOS and friends) is not text the user sees. */
static enum token_kind classify_tgi(const struct span *s, struct usage *u)
{
	bool token = false;
	const char *from = s->p;
	const char *v;
	while (!token && (v = key_find(s, &from, KEY("token"))) != NULL) {
		if (*v != '{')
			continue;
		struct span obj = { v, container_end(s, v) };
		const char *ofrom = obj.p;
		const char *sp = key_find(&obj, &ofrom, KEY("special"));
		token = !(sp && value_is_literal(&obj, sp, "true"));
	}
	if (u && any_object(s, KEY("details")))
		usage_tgi(s, s->p, u);
	return token ? TOKEN_ANSWER : TOKEN_NONE;
}

/* Ollama NDJSON: /api/generate streams "response" (and "thinking" for
 * reasoning models), /api/chat streams message.content / message.thinking
 * and whole tool calls in message.tool_calls. */
static enum token_kind classify_ollama(enum api_kind api, const struct span *s, struct usage *u,
				       struct classify_hint *h)
{
	enum token_kind token;
	if (api == API_OLLAMA_GENERATE)
		token = keys_kind(s, ollama_generate_keys, NKEYS(ollama_generate_keys), h, NULL);
	else
		token = keys_kind(s, ollama_chat_keys, NKEYS(ollama_chat_keys), h, NULL);
	if (u && (keyscan_find(s->p, s->end, KEY("eval_count")) != NULL ||
		  keyscan_find(s->p, s->end, KEY("prompt_eval_count")) != NULL))
		usage_ollama(s, s->p, u);
	return token;
}

/* ---- OpenAI Responses API ---------------------------------------------- */

/*
 * Every Responses event is named, twice: the SSE `event:` field and "type",
 * always equal. The name alone decides, from the tables below; nothing else
 * in the event is searched but the "delta" of a token event (it must be a
 * non-empty string) and, in the rare terminal event, the response's usage
 * and status. Unknown names (new tool events, vendor extensions such as
 * vLLM's reasoning_part.*) are lifecycle: no token.
 */

/* A model-output delta and what it carries. */
struct resp_name {
	const char *name;
	size_t len;
	enum token_kind kind;
};

#define RNAME(n) "response." n ".delta", sizeof("response." n ".delta") - 1

/* The deltas that carry model output (docs/metrics.md lists them with the
 * reasons). Not here, so not tokens: shell_call_output_content.delta (the
 * tool's output, not the model's) and image_generation_call.partial_image
 * (an image tool's intermediate picture). */
static const struct resp_name resp_token_names[] = {
	{ RNAME("output_text"), TOKEN_ANSWER },		  { RNAME("refusal"), TOKEN_ANSWER },
	{ RNAME("audio.transcript"), TOKEN_ANSWER },	  { RNAME("audio"), TOKEN_ANSWER },
	{ RNAME("reasoning_text"), TOKEN_REASONING },	  { RNAME("reasoning_summary_text"), TOKEN_REASONING },
	{ RNAME("function_call_arguments"), TOKEN_TOOL }, { RNAME("custom_tool_call_input"), TOKEN_TOOL },
	{ RNAME("mcp_call_arguments"), TOKEN_TOOL },	  { RNAME("code_interpreter_call_code"), TOKEN_TOOL },
	{ RNAME("shell_call_command"), TOKEN_TOOL },
};

enum resp_kind { RK_OTHER, RK_TOKEN, RK_COMPLETED, RK_INCOMPLETE, RK_FAILED };

static bool bytes_are(const char *p, size_t n, const char *lit, size_t litlen)
{
	return n == litlen && memcmp(p, lit, n) == 0;
}

#define LIT(s) s, sizeof(s) - 1

/* The kind of the event named [p, p+n), and for a token event what it
 * carries (*carries). Only names ending in ".delta" are looked up among the
 * token names, so a lifecycle event costs a few length compares. */
static enum resp_kind resp_kind_of(const char *p, size_t n, enum token_kind *carries)
{
	static const char suffix[] = ".delta";
	const size_t sl = sizeof(suffix) - 1;

	if (n > sl && memcmp(p + n - sl, suffix, sl) == 0) {
		for (size_t i = 0; i < NKEYS(resp_token_names); i++) {
			if (bytes_are(p, n, resp_token_names[i].name, resp_token_names[i].len)) {
				*carries = resp_token_names[i].kind;
				return RK_TOKEN;
			}
		}
		return RK_OTHER;
	}
	if (bytes_are(p, n, LIT("response.completed")))
		return RK_COMPLETED;
	if (bytes_are(p, n, LIT("response.incomplete")))
		return RK_INCOMPLETE;
	if (bytes_are(p, n, LIT("response.failed")) || bytes_are(p, n, LIT("error")))
		return RK_FAILED;
	return RK_OTHER;
}

/* The event's kind from "type" when it came without a usable `event:` name:
 * the top object's own "type" member, a plain string. */
static enum resp_kind resp_kind_from_type(const struct span *s, enum token_kind *carries)
{
	const char *v = member(s, s->p, KEY("type"));
	if (v == NULL || *v != '"')
		return RK_OTHER;
	const char *e = string_end(s, v);
	if (e == NULL || memchr(v + 1, '\\', (size_t)(e - v - 2)) != NULL)
		return RK_OTHER;
	return resp_kind_of(v + 1, (size_t)(e - v - 2), carries);
}

static void outcome_worsen(struct usage *u, enum resp_outcome o)
{
	if (o > u->outcome)
		u->outcome = o;
}

/* A Response object (a terminal event's "response", or a non-streamed
 * body): its usage, and what its status says of the ending. vLLM ends a
 * length-cut stream with response.completed whose status is "incomplete",
 * so the status is read, not only the event name. */
static void usage_responses(const struct span *s, const char *resp, struct usage *u)
{
	const char *usage = member(s, resp, KEY("usage"));
	take_count(s, usage, KEY("input_tokens"), &u->input_tokens);
	take_count(s, usage, KEY("output_tokens"), &u->output_tokens);
	const char *in = member(s, usage, KEY("input_tokens_details"));
	take_count(s, in, KEY("cached_tokens"), &u->cached_tokens);
	take_count(s, in, KEY("cache_write_tokens"), &u->cache_write_tokens);
	take_count(s, member(s, usage, KEY("output_tokens_details")), KEY("reasoning_tokens"), &u->reasoning_tokens);
	server_vllm(s, member(s, resp, KEY("metrics")), &u->server);
	const char *status = member(s, resp, KEY("status"));
	if (status && value_is_string(s, status, KEY("incomplete")))
		outcome_worsen(u, OUTCOME_INCOMPLETE);
	else if (status && value_is_string(s, status, KEY("failed")))
		outcome_worsen(u, OUTCOME_FAILED);
}

static const struct token_key delta_key[] = { { KEY("delta"), false, TOKEN_ANSWER } };

static enum token_kind classify_responses(const struct framer_event *ev, const struct span *s, struct usage *u,
					  struct classify_hint *h)
{
	enum token_kind carries = TOKEN_NONE;
	enum resp_kind k;
	if (ev->name != NULL && ev->name_len > 0 && !name_is(ev, "message"))
		k = resp_kind_of(ev->name, ev->name_len, &carries);
	else
		k = resp_kind_from_type(s, &carries);

	switch (k) {
	case RK_TOKEN: return keys_kind(s, delta_key, NKEYS(delta_key), h, NULL) != TOKEN_NONE ? carries : TOKEN_NONE;
	case RK_OTHER: return TOKEN_NONE;
	case RK_COMPLETED:
	case RK_INCOMPLETE:
	case RK_FAILED: break;
	}
	if (u == NULL)
		return TOKEN_NONE;
	if (k == RK_INCOMPLETE)
		outcome_worsen(u, OUTCOME_INCOMPLETE);
	else if (k == RK_FAILED)
		outcome_worsen(u, OUTCOME_FAILED);
	usage_responses(s, member(s, s->p, KEY("response")), u);
	return TOKEN_NONE;
}

/* ---- Gemini ---------------------------------------------------------------
 *
 * Every event (an SSE frame with ?alt=sse, else an element of the streamed
 * array) and the non-streamed body are one GenerateContentResponse:
 * candidates[].content.parts[] hold the output, usageMetadata the counts
 * (cumulative: each event repeats them), an "error" object an in-stream
 * failure. The parts are walked member by member, not searched for keys:
 * whether a part's text is a thought depends on a sibling member, and
 * "text" also names grounding segments outside the parts, which only the
 * walk tells apart. The walk reads each object once for all the members it
 * wants (gem_members, the semantics of member(): direct members, the last
 * of a repeated key) and skips strings with memchr, so an event costs a
 * few passes over its bytes, most of them vectorised. */

/* One past the closing quote of the string at p ('"'), or NULL when it is
 * cut: the first '"' after an even run of backslashes, as string_end()
 * finds it byte by byte. */
static const char *gem_string_end(const struct span *s, const char *p)
{
	const char *q = p + 1;
	for (;;) {
		const char *e = memchr(q, '"', (size_t)(s->end - q));
		if (e == NULL)
			return NULL;
		size_t bs = 0;
		while (e - bs > p + 1 && e[-(ptrdiff_t)bs - 1] == '\\')
			bs++;
		if (!(bs & 1))
			return e + 1;
		q = e + 1;
	}
}

/* One past the value at v, as value_end() (s->end when it is cut). */
static const char *gem_value_end(const struct span *s, const char *v)
{
	if (*v == '"') {
		const char *e = gem_string_end(s, v);
		return e ? e : s->end;
	}
	if (*v != '{' && *v != '[')
		return value_end(s, v);
	int depth = 0;
	for (const char *p = v; p < s->end;) {
		char c = *p;
		if (c == '"') {
			p = gem_string_end(s, p);
			if (p == NULL)
				return s->end;
			continue;
		}
		p++;
		if (c == '{' || c == '[')
			depth++;
		else if ((c == '}' || c == ']') && --depth == 0)
			return p;
	}
	return s->end;
}

struct gem_member {
	const char *qkey; /* quoted, as made by KEY() */
	size_t qlen;
	const char *v; /* out: the member's value, NULL when absent */
};

/* member() for several keys in one pass over the object at obj. */
static void gem_members(const struct span *s, const char *obj, struct gem_member *m, size_t n)
{
	for (size_t i = 0; i < n; i++)
		m[i].v = NULL;
	if (obj == NULL || obj >= s->end || *obj != '{')
		return;
	for (const char *p = skip_space(obj + 1, s->end); p < s->end && *p == '"';) {
		const char *kend = gem_string_end(s, p);
		if (kend == NULL)
			break;
		const char *v = skip_space(kend, s->end);
		if (v >= s->end || *v != ':')
			break;
		v = skip_space(v + 1, s->end);
		if (v >= s->end)
			break;
		for (size_t i = 0; i < n; i++)
			if ((size_t)(kend - p) == m[i].qlen && memcmp(p, m[i].qkey, m[i].qlen) == 0)
				m[i].v = v;
		p = skip_space(gem_value_end(s, v), s->end);
		if (p >= s->end || *p != ',')
			break;
		p = skip_space(p + 1, s->end);
	}
}

/* The next element of the array whose '[' (first) or last element is at
 * *at: its value, or NULL at the array's end (or a cut). */
static const char *array_next(const struct span *s, const char **at, bool first)
{
	const char *p = *at;
	if (first) {
		if (p == NULL || p >= s->end || *p != '[')
			return NULL;
		p = skip_space(p + 1, s->end);
	} else {
		p = skip_space(gem_value_end(s, p), s->end);
		if (p >= s->end || *p != ',')
			return NULL;
		p = skip_space(p + 1, s->end);
	}
	if (p >= s->end || *p == ']')
		return NULL;
	*at = p;
	return p;
}

/* What one part carries: non-empty text (a thought when "thought" is true),
 * a function call or code for the code-execution tool; TOKEN_NONE for
 * anything else (an empty text that only carries a thoughtSignature,
 * inline data, a function response, a code result). */
static enum token_kind gemini_part(const struct span *s, const char *part)
{
	struct gem_member m[] = { { KEY("text"), NULL },
				  { KEY("thought"), NULL },
				  { KEY("functionCall"), NULL },
				  { KEY("executableCode"), NULL } };
	gem_members(s, part, m, NKEYS(m));
	if (m[0].v && value_is_nonempty_string(s, m[0].v))
		return m[1].v && value_is_literal(s, m[1].v, "true") ? TOKEN_REASONING : TOKEN_ANSWER;
	if ((m[2].v && *m[2].v == '{') || (m[3].v && *m[3].v == '{'))
		return TOKEN_TOOL;
	return TOKEN_NONE;
}

/* input = promptTokenCount, which holds the cached content's tokens;
 * reasoning = thoughtsTokenCount, which candidatesTokenCount leaves out:
 * output is their sum, so that reasoning is a part of it as for every API.
 * proto3's JSON leaves zero counts out, so one of the two alone stands for
 * the other being 0. */
static void usage_gemini(const struct span *s, const char *um, struct usage *u)
{
	struct gem_member m[] = { { KEY("promptTokenCount"), NULL },
				  { KEY("cachedContentTokenCount"), NULL },
				  { KEY("candidatesTokenCount"), NULL },
				  { KEY("thoughtsTokenCount"), NULL } };
	int64_t cand = -1, thoughts = -1;

	if (um == NULL || *um != '{')
		return;
	gem_members(s, um, m, NKEYS(m));
	count_at(s, m[0].v, &u->input_tokens);
	count_at(s, m[1].v, &u->cached_tokens);
	count_at(s, m[2].v, &cand);
	count_at(s, m[3].v, &thoughts);
	if (thoughts >= 0)
		u->reasoning_tokens = thoughts;
	if (cand >= 0 || thoughts >= 0) {
		int64_t c = cand > 0 ? cand : 0, t = thoughts > 0 ? thoughts : 0;
		if (c <= INT64_MAX - t)
			u->output_tokens = c + t;
	}
}

/* One GenerateContentResponse at obj: its token kind (the best of its
 * parts, candidates[] and parts[] in order, by kind_rank) and, with u, its
 * usage and an "error" object. */
static enum token_kind gemini_response(const struct span *s, const char *obj, struct usage *u)
{
	struct gem_member m[] = { { KEY("candidates"), NULL }, { KEY("usageMetadata"), NULL }, { KEY("error"), NULL } };
	enum token_kind best = TOKEN_NONE;
	const char *ca, *cand;

	gem_members(s, obj, m, NKEYS(m));
	ca = m[0].v;
	for (bool first = true; best != TOKEN_ANSWER && (cand = array_next(s, &ca, first)) != NULL; first = false) {
		struct gem_member content = { KEY("content"), NULL }, parts = { KEY("parts"), NULL };
		gem_members(s, cand, &content, 1);
		gem_members(s, content.v, &parts, 1);
		const char *pa = parts.v, *part;
		for (bool pf = true; best != TOKEN_ANSWER && (part = array_next(s, &pa, pf)) != NULL; pf = false) {
			enum token_kind k = gemini_part(s, part);
			if (k != TOKEN_NONE && (best == TOKEN_NONE || kind_rank(k) < kind_rank(best)))
				best = k;
		}
	}
	if (u) {
		usage_gemini(s, m[1].v, u);
		if (m[2].v && *m[2].v == '{')
			outcome_worsen(u, OUTCOME_FAILED);
	}
	return best;
}

/* ---- AWS Bedrock ---------------------------------------------------------- */

/*
 * Bedrock's events come out of the event-stream framer (framer.h), named by
 * their `:event-type`, an exception by its type (ev->exception). Converse
 * streams one shape for every model (docs/dev/wire-formats.md, section (l));
 * InvokeModel streams the model family's own JSON, one `chunk` each, the
 * last with Bedrock's "amazon-bedrock-invocationMetrics". Every Bedrock
 * event may carry a "p" member of padding, which no rule looks at. Members
 * are read as a JSON parser would (member()), not by key search: the
 * events are small, and Converse's "text" sits at two depths.
 */

/* The whole prompt from a count that leaves out cache reads and writes
 * (Converse's inputTokens, Anthropic's input_tokens): the same
 * normalisation as usage_anthropic's. */
static void input_with_cache(struct usage *u, int64_t in)
{
	int64_t rd = u->cached_tokens > 0 ? u->cached_tokens : 0;
	int64_t wr = u->cache_write_tokens > 0 ? u->cache_write_tokens : 0;
	if (in >= 0 && rd <= INT64_MAX - wr && in <= INT64_MAX - rd - wr)
		u->input_tokens = in + rd + wr;
}

/* Converse's "usage": inputTokens leaves out cacheReadInputTokens and
 * cacheWriteInputTokens, as Anthropic's does. */
static void usage_converse(const struct span *s, const char *usage, struct usage *u)
{
	int64_t in = -1;
	if (usage == NULL)
		return;
	take_count(s, usage, KEY("inputTokens"), &in);
	take_count(s, usage, KEY("outputTokens"), &u->output_tokens);
	take_count(s, usage, KEY("cacheReadInputTokens"), &u->cached_tokens);
	take_count(s, usage, KEY("cacheWriteInputTokens"), &u->cache_write_tokens);
	input_with_cache(u, in);
}

/* Converse's "metrics": latencyMs, the whole call as Bedrock timed it. */
static void server_converse(const struct span *s, const char *metrics, struct server_timing *t)
{
	if (take_ms(s, metrics, KEY("latencyMs"), &t->inference_ns))
		t->source = SERVER_BEDROCK;
}

/* InvokeModel's "amazon-bedrock-invocationMetrics", on the last chunk:
 * the counts (inputTokenCount leaving out the cache counts, where the model
 * reports them) and Bedrock's own timings, integer ms. */
static void bedrock_invocation_metrics(const struct span *s, const char *m, struct usage *u)
{
	int64_t in = -1;
	if (m == NULL || *m != '{')
		return;
	take_count(s, m, KEY("outputTokenCount"), &u->output_tokens);
	take_count(s, m, KEY("cacheReadInputTokenCount"), &u->cached_tokens);
	take_count(s, m, KEY("cacheWriteInputTokenCount"), &u->cache_write_tokens);
	take_count(s, m, KEY("inputTokenCount"), &in);
	input_with_cache(u, in);
	bool any = take_ms(s, m, KEY("invocationLatency"), &u->server.inference_ns);
	any |= take_ms(s, m, KEY("firstByteLatency"), &u->server.first_byte_ns);
	if (any)
		u->server.source = SERVER_BEDROCK;
}

/* A Converse contentBlockDelta's "delta": answer text, a tool's input, or
 * reasoning (reasoningContent.text; its signature and redactedContent are
 * no text). */
static enum token_kind converse_delta(const struct span *s, const char *delta)
{
	const char *v = member(s, delta, KEY("text"));
	if (v && value_is_nonempty_string(s, v))
		return TOKEN_ANSWER;
	v = member(s, member(s, delta, KEY("toolUse")), KEY("input"));
	if (v && value_is_nonempty_string(s, v))
		return TOKEN_TOOL;
	v = member(s, member(s, delta, KEY("reasoningContent")), KEY("text"));
	if (v && value_is_nonempty_string(s, v))
		return TOKEN_REASONING;
	return TOKEN_NONE;
}

static enum token_kind classify_bedrock_converse(const struct framer_event *ev, const struct span *s, struct usage *u)
{
	if (ev->exception) {
		if (u)
			outcome_worsen(u, OUTCOME_FAILED);
		return TOKEN_NONE;
	}
	if (name_is(ev, "contentBlockDelta"))
		return converse_delta(s, member(s, s->p, KEY("delta")));
	if (u && name_is(ev, "metadata")) {
		usage_converse(s, member(s, s->p, KEY("usage")), u);
		server_converse(s, member(s, s->p, KEY("metrics")), &u->server);
	}
	return TOKEN_NONE;
}

/* The first element of the array at v, or NULL. */
static const char *first_element(const struct span *s, const char *v)
{
	if (v == NULL || *v != '[')
		return NULL;
	v = skip_space(v + 1, s->end);
	return v < s->end && *v != ']' ? v : NULL;
}

static bool member_has_text(const struct span *s, const char *obj, const char *qkey, size_t qlen)
{
	const char *v = member(s, obj, qkey, qlen);
	return v != NULL && value_is_nonempty_string(s, v);
}

/*
 * An InvokeModel chunk: the model family's own stream event, told apart by
 * its top members. Anthropic's Messages events ("type", read by the
 * Anthropic rules); Amazon Nova's Converse-shaped ones (contentBlockDelta,
 * metadata); Meta Llama's "generation"; Amazon Titan's "outputText";
 * Mistral's "outputs"[0].text; Cohere's "text". Then Bedrock's own metrics,
 * which win for the counts they hold.
 */
static enum token_kind classify_bedrock_invoke(const struct framer_event *ev, const struct span *s, struct usage *u,
					       struct classify_hint *h)
{
	const char *root = s->p, *v;
	enum token_kind token = TOKEN_NONE;

	if (ev->exception) {
		if (u)
			outcome_worsen(u, OUTCOME_FAILED);
		return TOKEN_NONE;
	}
	if (ev->name_len > 0 && !name_is(ev, "chunk"))
		return TOKEN_NONE;
	if ((v = member(s, root, KEY("type"))) != NULL && *v == '"') {
		struct framer_event inner = *ev;
		inner.name = NULL;
		inner.name_len = 0;
		token = classify_anthropic(&inner, s, u, h);
	} else if ((v = member(s, root, KEY("contentBlockDelta"))) != NULL) {
		token = converse_delta(s, member(s, v, KEY("delta")));
	} else if ((v = member(s, root, KEY("metadata"))) != NULL) {
		if (u)
			usage_converse(s, member(s, v, KEY("usage")), u);
	} else if (member(s, root, KEY("generation")) != NULL) {
		token = member_has_text(s, root, KEY("generation")) ? TOKEN_ANSWER : TOKEN_NONE;
		if (u) {
			take_count(s, root, KEY("prompt_token_count"), &u->input_tokens);
			take_count(s, root, KEY("generation_token_count"), &u->output_tokens);
		}
	} else if (member(s, root, KEY("outputText")) != NULL) {
		token = member_has_text(s, root, KEY("outputText")) ? TOKEN_ANSWER : TOKEN_NONE;
		if (u) {
			take_count(s, root, KEY("inputTextTokenCount"), &u->input_tokens);
			take_count(s, root, KEY("totalOutputTextTokenCount"), &u->output_tokens);
		}
	} else if ((v = first_element(s, member(s, root, KEY("outputs")))) != NULL) {
		token = member_has_text(s, v, KEY("text")) ? TOKEN_ANSWER : TOKEN_NONE;
	} else if (member_has_text(s, root, KEY("text"))) {
		token = TOKEN_ANSWER;
	}
	if (u)
		bedrock_invocation_metrics(s, member(s, root, KEY("amazon-bedrock-invocationMetrics")), u);
	return token;
}

/* A non-streamed InvokeModel body: the family's own answer. Anthropic's
 * and Nova's "usage" (their keys differ), Llama's and Titan's counts at the
 * top. */
static void usage_bedrock_invoke_body(const struct span *s, const char *obj, struct usage *u)
{
	const char *usage = member(s, obj, KEY("usage"));
	usage_anthropic(s, usage, true, u);
	usage_converse(s, usage, u);
	take_count(s, obj, KEY("prompt_token_count"), &u->input_tokens);
	take_count(s, obj, KEY("generation_token_count"), &u->output_tokens);
	take_count(s, obj, KEY("inputTextTokenCount"), &u->input_tokens);
}

enum token_kind classify_event(enum api_kind api, const struct framer_event *ev, struct usage *usage,
			       struct classify_hint *hint)
{
	if (ev == NULL || ev->data == NULL)
		return TOKEN_NONE;
	struct span s = { ev->data, ev->data + ev->data_len };
	/* An event-stream exception fails the response whatever its payload. */
	if (ev->exception && usage && (api == API_BEDROCK_CONVERSE || api == API_BEDROCK_INVOKE))
		outcome_worsen(usage, OUTCOME_FAILED);
	/* Every token-bearing shape is a JSON object; this also turns away
	 * `[DONE]` and empty data before any scan. From here s.p is the
	 * event's top object, where the usage rules start. */
	s.p = skip_space(s.p, s.end);
	if (s.p >= s.end || *s.p != '{')
		return TOKEN_NONE;

	switch (api) {
	case API_OPENAI_CHAT: return classify_openai_chat(&s, usage, hint);
	case API_OPENAI_COMPLETIONS: return classify_completions(&s, usage, hint);
	case API_ANTHROPIC: return classify_anthropic(ev, &s, usage, hint);
	case API_TGI: return classify_tgi(&s, usage);
	case API_LLAMACPP: return classify_llamacpp(&s, usage, hint);
	case API_OLLAMA_GENERATE:
	case API_OLLAMA_CHAT: return classify_ollama(api, &s, usage, hint);
	case API_OPENAI_RESPONSES: return classify_responses(ev, &s, usage, hint);
	case API_GEMINI:
	case API_GEMINI_STREAM: return gemini_response(&s, s.p, usage);
	case API_BEDROCK_CONVERSE: return classify_bedrock_converse(ev, &s, usage);
	case API_BEDROCK_INVOKE: return classify_bedrock_invoke(ev, &s, usage, hint);
	default: break; /* the one-answer APIs stream nothing */
	}
	return TOKEN_NONE;
}

/* ---- Same-shape events -------------------------------------------------
 *
 * classify_event() reads an event through the hits of quoted keys (every
 * key starts and ends with '"' and holds none inside), the bytes around a
 * hit (backslashes before, blanks and ':' after) and the first bytes of a
 * value. Take an event E0 of an API and path below, whose token text is
 * the string at the hint's key, and an event E1 that has E0's bytes
 * except in the holes: a string hole (the text's body, between the '"'
 * after the key's ':' and the first '"' no escape takes, closing_quote)
 * holds plain bytes (no '"', '\\', CR, LF) and escapes ('\\' and any byte
 * but CR and LF, '"' included), and after its last escaped '"' no bytes or
 * a byte no key name has (framer.h); a digits hole as many digits. Then:
 *
 *  - every '"' inside a string hole is escaped, so preceded by '\\'; the
 *    closing '"' of a hit follows a key name's byte, so it is never one
 *    of them. A hit with a quote inside the hole then opens at one and
 *    closes at the hole's own closing '"', its name the bytes after the
 *    hole's last escaped '"': which are no key name. A hit that opens
 *    before the hole and closes at or after its end has the text's own
 *    '"'s for quotes, `"TEXT"`, no key name either (a '\\' in it, or a
 *    byte no key name has). So no hit starts inside a hole or spans one
 *    (a digits hole holds no '"'), and E1's hits are E0's, at the same
 *    offsets up to the text and at the same distance from the end after
 *    it;
 *  - around each hit the bytes looked at are E0's, or judged the same: the
 *    backslash run before the text's closing '"' is even in both (a '\\'
 *    in a hole is an escape's, and only `\\\\` ends in one), blanks and
 *    ':' after a key are never in a hole (a hole is a value's body);
 *  - the only value that starts at a hole is the text's own string, and
 *    for it only "non-empty" is asked, true for both (its first byte is
 *    never '"');
 *  - a member walk (the usage read, when "usage" or "timings" is there)
 *    skips the text's string to the same closing '"' in both, by escape
 *    pairs (string_end) or backslash parity (closing_quote), which agree
 *    on a hole's bytes.
 *
 * So the paths taken below answer E1 as E0, give the hint E0's offset
 * (the text's key is before the string hole, and a digits hole keeps its
 * width) and touch usage as E0 did. Only paths that read no more than
 * that are armed: chat completions (the keys and scan_once(); usage only
 * when "usage" or "timings" is there, and an event that changed usage is
 * not armed), an Anthropic event named content_block_delta and a Responses
 * API token event by its SSE name (the name is part of the shape: keys_kind
 * at the hint, nothing else). Member walks (type without a name, usage
 * objects), which count brackets inside strings too, are never armed.
 *
 * E1 need not follow E0 straight: an event between them that cannot be
 * armed itself (text that is a key name, or ends in an escaped '"' and
 * a key name's bytes, an event of no tokens) leaves the shape armed when
 * it left the usage and the hint as E0 left them. Nothing above depends on the events between
 * but those two: usage, and the hint the search starts from (a probe that
 * can only confirm, so the kind does not depend on it, but the hint it
 * leaves can: a probe that confirms a later key keeps that key). So E1
 * then meets what it would right after E0, and is answered as there:
 * E0's kind and hint, which the shape carries in its tag.
 */
static bool string_hole(const struct span *s, const char *v, const char *data, struct framer_hole *h)
{
	if (v == NULL || v >= s->end || *v != '"')
		return false;
	const char *b = v + 1;
	const char *e = closing_quote(b, s->end);
	if (e == NULL || e == b)
		return false;
	*h = (struct framer_hole){ (uint32_t)(b - data), (uint32_t)(e - b), FRAMER_HOLE_STRING };
	return true;
}

/* The holes of an event just classified as `kind` with `hint`, 0 when it
 * may not be armed (the block above). */
static size_t shape_holes(enum api_kind api, const struct framer_event *ev, enum token_kind kind,
			  const struct classify_hint *hint, struct framer_hole *holes)
{
	const struct token_key *keys;
	size_t n;
	enum token_kind carries;

	if (kind == TOKEN_NONE || hint->rule == 0 || ev->data_len > UINT32_MAX)
		return 0;
	switch (api) {
	case API_OPENAI_CHAT: keys = openai_chat_keys, n = NKEYS(openai_chat_keys); break;
	case API_ANTHROPIC:
		if (ev->name == NULL || !name_is(ev, "content_block_delta"))
			return 0;
		keys = anthropic_keys, n = NKEYS(anthropic_keys);
		break;
	case API_OPENAI_RESPONSES:
		if (ev->name == NULL || ev->name_len == 0 || name_is(ev, "message") ||
		    resp_kind_of(ev->name, ev->name_len, &carries) != RK_TOKEN)
			return 0;
		keys = delta_key, n = NKEYS(delta_key);
		break;
	default: return 0;
	}
	if (hint->rule > n)
		return 0;
	struct span s = { ev->data, ev->data + ev->data_len };
	s.p = skip_space(s.p, s.end);
	const struct token_key *k = &keys[hint->rule - 1];
	const char *at = s.p + hint->at;
	if (k->array || hint->at >= (size_t)(s.end - s.p) || !key_sits_with_text(&s, at, k))
		return 0;
	struct framer_hole text;
	if (!string_hole(&s, key_value(&s, at, k->qlen), ev->data, &text))
		return 0;
	size_t m = 0;
	if (api == API_OPENAI_RESPONSES) {
		const char *from = s.p;
		const char *v = key_find(&s, &from, KEY("sequence_number"));
		const char *d = v;
		while (d && d < s.end && *d >= '0' && *d <= '9')
			d++;
		if (v && d > v && d < s.end && (size_t)(d - ev->data) <= text.off)
			holes[m++] =
				(struct framer_hole){ (uint32_t)(v - ev->data), (uint32_t)(d - v), FRAMER_HOLE_DIGITS };
	}
	holes[m++] = text;
	return m;
}

enum token_kind classify_event_armed(enum api_kind api, struct framer *f, const struct framer_event *ev,
				     struct usage *usage, struct classify_hint *hint)
{
	struct usage before = *usage;
	enum token_kind kind = classify_event(api, ev, usage, hint);
	struct framer_hole holes[FRAMER_SHAPE_HOLES];
	size_t n;
	bool same_usage = memcmp(&before, usage, sizeof(before)) == 0;
	if (same_usage && (n = shape_holes(api, ev, kind, hint, holes)) > 0 &&
	    framer_shape_arm(f, holes, n, (uint64_t)kind | (uint64_t)hint->rule << 8 | (uint64_t)hint->at << 32))
		return kind;
	/* not armed: the shape before holds while usage and hint are as it
	 * found and left them (above) */
	uint64_t tag = framer_shape_tag(f);
	if (!same_usage || hint->rule != (uint8_t)(tag >> 8) || hint->at != (uint32_t)(tag >> 32))
		framer_shape_clear(f);
	return kind;
}

void classify_body_tail(enum api_kind api, const char *tail, size_t len, struct usage *usage)
{
	static const char key[] = "\"usage\"";
	const size_t klen = sizeof(key) - 1;

	if (tail == NULL || usage == NULL || classify_inputs_key(api) == NULL || api == API_TEI_EMBED || len < klen)
		return;
	struct span s = { tail, tail + len };
	for (size_t i = len - klen + 1; i-- > 0;) {
		if (memcmp(tail + i, key, klen) != 0 || (i > 0 && tail[i - 1] == '\\'))
			continue;
		const char *p = skip_space(tail + i + klen, s.end);
		if (p >= s.end || *p != ':')
			continue;
		p = skip_space(p + 1, s.end);
		if (p >= s.end || *p != '{')
			continue;
		take_count(&s, p, KEY("prompt_tokens"), &usage->input_tokens);
		if (usage->input_tokens < 0)
			take_count(&s, p, KEY("total_tokens"), &usage->input_tokens);
		return;
	}
}

void classify_body(enum api_kind api, const char *body, size_t len, struct usage *usage)
{
	if (body == NULL || usage == NULL || api == API_UNKNOWN)
		return;
	struct span s = { body, body + len };
	const char *obj = skip_space(s.p, s.end);
	if (api == API_GEMINI || api == API_GEMINI_STREAM) {
		/* one response, or the stream's array of them (later wins) */
		const char *at = obj, *el;
		if (obj < s.end && *obj == '{')
			gemini_response(&s, obj, usage);
		for (bool first = true; (el = array_next(&s, &at, first)) != NULL; first = false)
			gemini_response(&s, el, usage);
		return;
	}
	/* TGI /generate has answered with a one-element list in some versions. */
	if (obj < s.end && *obj == '[')
		obj = skip_space(obj + 1, s.end);
	if (obj >= s.end || *obj != '{')
		return;

	switch (api) {
	case API_OPENAI_CHAT:
	case API_OPENAI_COMPLETIONS:
		if (member(&s, obj, KEY("usage")) == NULL && member(&s, obj, KEY("choices")) == NULL)
			usage_llamacpp(&s, obj, usage); /* llama.cpp's native /completions */
		else
			usage_openai(&s, obj, usage);
		server_openai(&s, obj, usage);
		break;
	case API_ANTHROPIC: usage_anthropic_delta(&s, obj, usage); break;
	case API_TGI: usage_tgi(&s, obj, usage); break;
	case API_LLAMACPP: usage_llamacpp(&s, obj, usage); break;
	case API_OLLAMA_GENERATE:
	case API_OLLAMA_CHAT: usage_ollama(&s, obj, usage); break;
	case API_OPENAI_RESPONSES: usage_responses(&s, obj, usage); break;
	case API_EMBEDDINGS:
	case API_RERANK:
	case API_SCORE:
	case API_CLASSIFY: usage_prompt_only(&s, obj, usage); break;
	case API_BEDROCK_CONVERSE:
		usage_converse(&s, member(&s, obj, KEY("usage")), usage);
		server_converse(&s, member(&s, obj, KEY("metrics")), &usage->server);
		break;
	case API_BEDROCK_INVOKE: usage_bedrock_invoke_body(&s, obj, usage); break;
	case API_TEI_EMBED:
	case API_GEMINI:
	case API_GEMINI_STREAM:
	case API_REALTIME:
	case API_UNKNOWN: break;
	}
}
