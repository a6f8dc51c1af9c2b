/*
 * test_framer.c — the SSE / NDJSON framer against real stream shapes, cut at
 * every byte boundary, with every line end, and past its size bound. Split
 * runs also classify each event as it is delivered, as the proxy does, so
 * the token decisions and the usage read must not depend on the cuts either.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "bytes.h"

#include "classify.h"
#include "framer.h"

#define MAX_EVENTS 64

/* Feeds a string literal without its NUL. */
#define FEED(f, lit) framer_feed((f), (lit), sizeof(lit) - 1)

/* Copies of the events a framer delivered, in order. With `api` set, each
 * event is also classified in the callback, on the framer's own bytes, with
 * one hint and one usage for the whole stream (seen_start). */
struct seen {
	int n;
	char *name[MAX_EVENTS]; /* NULL when the event had none */
	char *data[MAX_EVENTS];
	size_t data_len[MAX_EVENTS];
	enum api_kind api;
	enum token_kind token[MAX_EVENTS];
	struct usage usage;
	struct classify_hint hint;
};

static void on_event(void *arg, const struct framer_event *ev)
{
	struct seen *s = arg;
	assert_true(s->n < MAX_EVENTS);
	assert_non_null(ev->data);
	if (ev->name == NULL)
		assert_int_equal(ev->name_len, 0);
	s->name[s->n] = ev->name ? dup_bytes(ev->name, ev->name_len) : NULL;
	s->data[s->n] = dup_bytes(ev->data, ev->data_len);
	s->data_len[s->n] = ev->data_len;
	if (s->api != API_UNKNOWN)
		s->token[s->n] = classify_event(s->api, ev, &s->usage, &s->hint);
	s->n++;
}

static void seen_clear(struct seen *s)
{
	for (int i = 0; i < s->n; i++) {
		free(s->name[i]);
		free(s->data[i]);
	}
	s->n = 0;
}

/* Empties `s` for a new stream classified as `api`. */
static void seen_start(struct seen *s, enum api_kind api)
{
	seen_clear(s);
	s->api = api;
	s->usage = USAGE_UNKNOWN;
	memset(&s->hint, 0, sizeof(s->hint));
}

static void assert_seen_equal(const struct seen *a, const struct seen *b)
{
	assert_int_equal(a->n, b->n);
	for (int i = 0; i < a->n; i++) {
		assert_copies_equal(a->name[i], b->name[i], a->data[i], a->data_len[i], b->data[i], b->data_len[i]);
		if (a->token[i] != b->token[i])
			fail_msg("event %d: token kind %d unsplit, %d split", i, a->token[i], b->token[i]);
	}
	assert_int_equal(a->usage.input_tokens, b->usage.input_tokens);
	assert_int_equal(a->usage.output_tokens, b->usage.output_tokens);
	assert_int_equal(a->usage.cached_tokens, b->usage.cached_tokens);
	assert_int_equal(a->usage.cache_write_tokens, b->usage.cache_write_tokens);
	assert_int_equal(a->usage.reasoning_tokens, b->usage.reasoning_tokens);
	assert_int_equal(a->usage.outcome, b->usage.outcome);
}

/* Frames `text` in one feed, then finishes. */
static void frame_all(enum framer_kind kind, size_t max_event, const char *text, struct seen *out)
{
	struct framer f;
	framer_init(&f, kind, max_event, on_event, out);
	framer_feed(&f, text, strlen(text));
	framer_finish(&f);
	framer_free(&f);
}

/* Frames `text` cut at the given offsets (ascending, inside the text). */
static void frame_cut(enum framer_kind kind, const char *text, const size_t *cuts, int ncuts, struct seen *out)
{
	struct framer f;
	size_t n = strlen(text), at = 0;
	framer_init(&f, kind, 0, on_event, out);
	for (int i = 0; i <= ncuts; i++) {
		size_t next = i < ncuts ? cuts[i] : n;
		/* Each slice gets its own heap copy, so ASan sees any read
		 * past a slice or of a slice kept after its feed. */
		char *slice = dup_bytes(text + at, next - at);
		framer_feed(&f, slice, next - at);
		free(slice);
		at = next;
	}
	framer_finish(&f);
	framer_free(&f);
}

/* ---- real streams ------------------------------------------------------ */

/* vLLM / OpenAI chat with stream_options.include_usage: role-only first
 * chunk, content, finish chunk, usage chunk with empty choices, [DONE]. */
static const char openai_chat_stream[] =
	"data: "
	"{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
	"\"logprobs\":null,\"finish_reason\":null}]}\n\n"
	"data: "
	"{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,"
	"\"finish_reason\":null}]}\n\n"
	"data: "
	"{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world "
	"\\u00e9\\\"\\n\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
	": keep-alive\n\n"
	"data: "
	"{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\","
	"\"stop_reason\":null}]}\n\n"
	"data: "
	"{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B-Instruct\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":15,\"completion_"
	"tokens\":3}}\n\n"
	"data: [DONE]\n\n";

/* Anthropic Messages: every event named, a ping in the middle. */
static const char anthropic_stream[] =
	"event: message_start\n"
	"data: "
	"{\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\","
	"\"content\":[],\"model\":\"claude-sonnet-4-20250514\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{"
	"\"input_tokens\":25,\"output_tokens\":1}}}\n\n"
	"event: content_block_start\n"
	"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
	"event: ping\n"
	"data: {\"type\": \"ping\"}\n\n"
	"event: content_block_delta\n"
	"data: "
	"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n"
	"event: content_block_delta\n"
	"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"}}\n\n"
	"event: content_block_stop\n"
	"data: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
	"event: message_delta\n"
	"data: "
	"{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{"
	"\"output_tokens\":15}}\n\n"
	"event: message_stop\n"
	"data: {\"type\":\"message_stop\"}\n\n";

/* Ollama /api/chat: NDJSON, final line with the counts, no final newline. */
static const char ollama_chat_stream[] =
	"{\"model\":\"llama3.2\",\"created_at\":\"2024-07-01T10:00:00.1Z\",\"message\":{\"role\":\"assistant\","
	"\"content\":\"The\"},\"done\":false}\n"
	"{\"model\":\"llama3.2\",\"created_at\":\"2024-07-01T10:00:00.2Z\",\"message\":{\"role\":\"assistant\","
	"\"content\":\" sky\"},\"done\":false}\n"
	"\n"
	"{\"model\":\"llama3.2\",\"created_at\":\"2024-07-01T10:00:00.3Z\",\"message\":{\"role\":\"assistant\","
	"\"content\":\"\"},\"done_reason\":\"stop\",\"done\":true,\"total_duration\":4883583458,\"load_duration\":"
	"1334875,\"prompt_eval_count\":26,\"prompt_eval_duration\":342546000,\"eval_count\":282,\"eval_duration\":"
	"4535599000}";

/* vLLM /v1/completions with include_usage: text chunks ("usage":null on
 * each), an empty-text finish chunk, the usage chunk, [DONE]. */
static const char openai_completions_stream[] =
	"data: "
	"{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B\",\"choices\":[{\"index\":0,\"text\":\" Paris\",\"logprobs\":null,\"finish_reason\":null,"
	"\"stop_reason\":null}],\"usage\":null}\n\n"
	"data: "
	"{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B\",\"choices\":[{\"index\":0,\"text\":\".\\n\",\"logprobs\":null,\"finish_reason\":null,"
	"\"stop_reason\":null}],\"usage\":null}\n\n"
	"data: "
	"{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B\",\"choices\":[{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\","
	"\"stop_reason\":null}],\"usage\":null}\n\n"
	"data: "
	"{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1718000000,\"model\":\"meta-llama/"
	"Llama-3.1-8B\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"total_tokens\":7,\"completion_tokens\":2}}"
	"\n\n"
	"data: [DONE]\n\n";

/* TGI /generate_stream: "data:" without a space, one token object per event;
 * the last token is special (EOS) and carries the details with the counts. */
static const char tgi_stream[] =
	"data:{\"index\":1,\"token\":{\"id\":9906,\"text\":\"Hello\",\"logprob\":-0.31,\"special\":false},"
	"\"generated_text\":null,\"details\":null}\n\n"
	"data:{\"index\":2,\"token\":{\"id\":1917,\"text\":\" world\",\"logprob\":-0.02,\"special\":false},"
	"\"generated_text\":null,\"details\":null}\n\n"
	"data:{\"index\":3,\"token\":{\"id\":128009,\"text\":\"<|eot_id|>\",\"logprob\":-0.01,\"special\":true},"
	"\"generated_text\":\"Hello world\",\"details\":{\"finish_reason\":\"eos_token\",\"generated_tokens\":3,"
	"\"seed\":null,\"input_length\":7}}\n\n";

/* llama.cpp /completion: partial results with running counts, then the
 * final one (empty content, stop) with settings and timings. */
static const char llamacpp_stream[] =
	"data: {\"index\":0,\"content\":\"Hello\",\"tokens\":[9906],\"stop\":false,\"id_slot\":-1,"
	"\"tokens_predicted\":1,\"tokens_evaluated\":6}\n\n"
	"data: {\"index\":0,\"content\":\" there\",\"tokens\":[1070],\"stop\":false,\"id_slot\":-1,"
	"\"tokens_predicted\":2,\"tokens_evaluated\":6}\n\n"
	"data: {\"index\":0,\"content\":\"\",\"tokens\":[],\"id_slot\":0,\"stop\":true,\"model\":\"qwen2.5-0.5b\","
	"\"tokens_predicted\":2,\"tokens_evaluated\":6,\"generation_settings\":{\"n_predict\":2,\"seed\":4294967295,"
	"\"temperature\":0.8,\"stop\":[]},\"prompt\":\"<|im_start|>user\\nHi<|im_end|>\",\"has_new_line\":false,"
	"\"truncated\":false,\"stop_type\":\"limit\",\"stopping_word\":\"\",\"tokens_cached\":7,\"timings\":{"
	"\"prompt_n\":6,\"prompt_ms\":12.5,\"prompt_per_token_ms\":2.08,\"prompt_per_second\":480.0,"
	"\"predicted_n\":2,\"predicted_ms\":21.0,\"predicted_per_token_ms\":10.5,\"predicted_per_second\":95.2}}\n\n";

/* Ollama /api/generate from a thinking model: thinking lines, response
 * lines, the final done line with context and counts. */
static const char ollama_generate_stream[] =
	"{\"model\":\"qwen3\",\"created_at\":\"2025-06-01T10:00:00.1Z\",\"response\":\"\",\"thinking\":\"Hm\","
	"\"done\":false}\n"
	"{\"model\":\"qwen3\",\"created_at\":\"2025-06-01T10:00:00.2Z\",\"response\":\"Blue\",\"done\":false}\n"
	"{\"model\":\"qwen3\",\"created_at\":\"2025-06-01T10:00:00.3Z\",\"response\":\".\",\"done\":false}\n"
	"{\"model\":\"qwen3\",\"created_at\":\"2025-06-01T10:00:00.4Z\",\"response\":\"\",\"done\":true,"
	"\"done_reason\":\"stop\",\"context\":[151644,872,198],\"total_duration\":512000000,\"load_duration\":"
	"2100000,\"prompt_eval_count\":11,\"prompt_eval_duration\":40000000,\"eval_count\":3,\"eval_duration\":"
	"300000000}\n";

/* The lifecycle events a Responses stream opens with, as the hosted API
 * sends them (RESPONSES_CREATED_DATA: the first one's data line alone, for
 * the stream without `event:` lines). */
#define RESPONSES_CREATED_DATA \
	"data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object" \
	"\":\"response\",\"created_at\":1751642570,\"status\":\"in_progress\",\"model\":\"gpt-4o\",\"output\"" \
	":[],\"usage\":null,\"error\":null,\"incomplete_details\":null}}\n"
#define RESPONSES_CREATED "event: response.created\n" RESPONSES_CREATED_DATA "\n"
#define RESPONSES_IN_PROGRESS \
	"event: response.in_progress\n" \
	"data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"obj" \
	"ect\":\"response\",\"created_at\":1751642570,\"status\":\"in_progress\",\"model\":\"gpt-4o\",\"outpu" \
	"t\":[],\"usage\":null,\"error\":null,\"incomplete_details\":null}}\n" \
	"\n"

/* OpenAI Responses API streams (docs/metrics.md): the hosted text sequence;
 * every model-output delta and the lifecycle events next to them, ended as
 * vLLM ends a length-cut stream (completed, status incomplete); the same
 * events without `event:` lines ("type" decides; in one it is the last
 * member); an `error` event then response.failed; response.incomplete. */
static const char responses_text_stream[] = RESPONSES_CREATED RESPONSES_IN_PROGRESS
	"event: response.output_item.added\n"
	"data: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\""
	"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]"
	"}}\n"
	"\n"
	"event: response.content_part.added\n"
	"data: {\"type\":\"response.content_part.added\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output"
	"_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[],"
	"\"logprobs\":[]}}\n"
	"\n"
	"event: response.output_text.delta\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"delta\":\"Hello\",\"logprobs\":[],\"obfuscation\":\"x7Qk\"}\n"
	"\n"
	"event: response.output_text.delta\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":5,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"delta\":\" \\\"delta\\\": {\\\"type\\\":\\\"response.completed\\\"}"
	"\",\"logprobs\":[],\"obfuscation\":\"Q\"}\n"
	"\n"
	"event: response.output_text.delta\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":6,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"delta\":\"\",\"logprobs\":[]}\n"
	"\n"
	"event: response.output_text.done\n"
	"data: {\"type\":\"response.output_text.done\",\"sequence_number\":7,\"item_id\":\"msg_1\",\"output_i"
	"ndex\":0,\"content_index\":0,\"text\":\"Hello there\",\"logprobs\":[]}\n"
	"\n"
	"event: response.content_part.done\n"
	"data: {\"type\":\"response.content_part.done\",\"sequence_number\":8,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"Hello there\",\"annotati"
	"ons\":[]}}\n"
	"\n"
	"event: response.output_item.done\n"
	"data: {\"type\":\"response.output_item.done\",\"sequence_number\":9,\"output_index\":0,\"item\":{\"i"
	"d\":\"msg_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\",\"content\":[{\"t"
	"ype\":\"output_text\",\"text\":\"Hello \\\"delta\\\":\\\"x\\\"\",\"annotations\":[]}]}}\n"
	"\n"
	"event: response.completed\n"
	"data: {\"type\":\"response.completed\",\"sequence_number\":10,\"response\":{\"id\":\"resp_1\",\"obje"
	"ct\":\"response\",\"created_at\":1751642570,\"status\":\"completed\",\"model\":\"gpt-4o\",\"output\""
	":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hello there\"}]}],\"usage"
	"\":{\"input_tokens\":36,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":87,\"output"
	"_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":123},\"error\":null,\"incomplete_details"
	"\":null}}\n"
	"\n";

static const char responses_all_deltas_stream[] = RESPONSES_CREATED
	"event: response.reasoning_text.delta\n"
	"data: {\"type\":\"response.reasoning_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"outp"
	"ut_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.reasoning_summary_text.delta\n"
	"data: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1"
	"\",\"output_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.output_text.delta\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.refusal.delta\n"
	"data: {\"type\":\"response.refusal.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_inde"
	"x\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.function_call_arguments.delta\n"
	"data: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":5,\"item_id\":\"msg_1"
	"\",\"output_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.custom_tool_call_input.delta\n"
	"data: {\"type\":\"response.custom_tool_call_input.delta\",\"sequence_number\":6,\"item_id\":\"msg_1"
	"\",\"output_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.mcp_call_arguments.delta\n"
	"data: {\"type\":\"response.mcp_call_arguments.delta\",\"sequence_number\":7,\"item_id\":\"msg_1\",\""
	"output_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.code_interpreter_call_code.delta\n"
	"data: {\"type\":\"response.code_interpreter_call_code.delta\",\"sequence_number\":8,\"item_id\":\"ms"
	"g_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.audio.transcript.delta\n"
	"data: {\"type\":\"response.audio.transcript.delta\",\"sequence_number\":9,\"item_id\":\"msg_1\",\"ou"
	"tput_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.audio.delta\n"
	"data: {\"type\":\"response.audio.delta\",\"sequence_number\":10,\"item_id\":\"msg_1\",\"output_index"
	"\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.shell_call_command.delta\n"
	"data: {\"type\":\"response.shell_call_command.delta\",\"sequence_number\":11,\"item_id\":\"msg_1\","
	"\"output_index\":0,\"content_index\":0,\"delta\":\"x1\"}\n"
	"\n"
	"event: response.queued\n"
	"data: {\"type\":\"response.queued\",\"sequence_number\":12,\"item_id\":\"msg_1\",\"output_index\":0,"
	"\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.reasoning_part.added\n"
	"data: {\"type\":\"response.reasoning_part.added\",\"sequence_number\":13,\"item_id\":\"msg_1\",\"out"
	"put_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.reasoning_summary_part.added\n"
	"data: {\"type\":\"response.reasoning_summary_part.added\",\"sequence_number\":14,\"item_id\":\"msg_1"
	"\",\"output_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.reasoning_text.done\n"
	"data: {\"type\":\"response.reasoning_text.done\",\"sequence_number\":15,\"item_id\":\"msg_1\",\"outp"
	"ut_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.reasoning_summary_text.done\n"
	"data: {\"type\":\"response.reasoning_summary_text.done\",\"sequence_number\":16,\"item_id\":\"msg_1"
	"\",\"output_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.function_call_arguments.done\n"
	"data: {\"type\":\"response.function_call_arguments.done\",\"sequence_number\":17,\"item_id\":\"msg_1"
	"\",\"output_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.output_text.annotation.added\n"
	"data: {\"type\":\"response.output_text.annotation.added\",\"sequence_number\":18,\"item_id\":\"msg_1"
	"\",\"output_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.web_search_call.searching\n"
	"data: {\"type\":\"response.web_search_call.searching\",\"sequence_number\":19,\"item_id\":\"msg_1\","
	"\"output_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.shell_call_output_content.delta\n"
	"data: {\"type\":\"response.shell_call_output_content.delta\",\"sequence_number\":20,\"item_id\":\"ms"
	"g_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.image_generation_call.partial_image\n"
	"data: {\"type\":\"response.image_generation_call.partial_image\",\"sequence_number\":21,\"item_id\":"
	"\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.audio.done\n"
	"data: {\"type\":\"response.audio.done\",\"sequence_number\":22,\"item_id\":\"msg_1\",\"output_index"
	"\":0,\"content_index\":0,\"delta\":\"not model output\"}\n"
	"\n"
	"event: response.completed\n"
	"data: {\"type\":\"response.completed\",\"sequence_number\":23,\"response\":{\"id\":\"resp_1\",\"obje"
	"ct\":\"response\",\"created_at\":1751642570,\"status\":\"incomplete\",\"model\":\"gpt-4o\",\"output"
	"\":[],\"usage\":{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens"
	"\":20,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":30},\"error\":null,\"incom"
	"plete_details\":null}}\n"
	"\n";

static const char responses_unnamed_stream[] = RESPONSES_CREATED_DATA
	"\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n"
	"\n"
	"data: {\"sequence_number\":2,\"delta\":\"!\",\"type\":\"response.output_text.delta\"}\n"
	"\n"
	"data: {\"type\":\"response.output_text.done\",\"sequence_number\":2,\"text\":\"Hi!\"}\n"
	"\n"
	"data: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"objec"
	"t\":\"response\",\"created_at\":1751642570,\"status\":\"completed\",\"model\":\"gpt-4o\",\"output\":"
	"[],\"usage\":{\"input_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":2,"
	"\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":7},\"error\":null,\"incomplete_d"
	"etails\":null}}\n"
	"\n";

static const char responses_failed_stream[] = RESPONSES_CREATED RESPONSES_IN_PROGRESS
	"event: error\n"
	"data: {\"type\":\"error\",\"sequence_number\":2,\"error\":{\"code\":\"unknown-error\",\"message\":\""
	"Foobar\",\"param\":null}}\n"
	"\n"
	"event: response.failed\n"
	"data: {\"type\":\"response.failed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_1\",\"object\""
	":\"response\",\"created_at\":1751642570,\"status\":\"failed\",\"model\":\"gpt-4o\",\"output\":[],\"u"
	"sage\":null,\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"incomplete_details\":null}}"
	"\n"
	"\n";

static const char responses_incomplete_stream[] = RESPONSES_CREATED
	"event: response.output_text.delta\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"delta\":\"Lorem\"}\n"
	"\n"
	"event: response.output_text.delta\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_"
	"index\":0,\"content_index\":0,\"delta\":\" ipsum\"}\n"
	"\n"
	"event: response.incomplete\n"
	"data: {\"type\":\"response.incomplete\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"obje"
	"ct\":\"response\",\"created_at\":1751642570,\"status\":\"incomplete\",\"model\":\"gpt-4o\",\"output"
	"\":[],\"usage\":{\"input_tokens\":7,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\""
	":2,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":9},\"error\":null,\"incomplet"
	"e_details\":{\"reason\":\"max_output_tokens\"}}}\n"
	"\n";

/* A reasoning chat stream (vLLM's reasoning parser): reasoning, then the
 * answer, then a tool call, and usage with its details. */
static const char chat_reasoning_stream[] =
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3\",\"choices\":[{\"index\":0,"
	"\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3\",\"choices\":[{\"index\":0,"
	"\"delta\":{\"reasoning_content\":\"Let\"},\"finish_reason\":null}]}\n\n"
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3\",\"choices\":[{\"index\":0,"
	"\"delta\":{\"reasoning_content\":\" me\"},\"finish_reason\":null}]}\n\n"
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3\",\"choices\":[{\"index\":0,"
	"\"delta\":{\"content\":null,\"reasoning\":\" think\"},\"finish_reason\":null}]}\n\n"
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3\",\"choices\":[{\"index\":0,"
	"\"delta\":{\"content\":\"Paris\"},\"finish_reason\":null}]}\n\n"
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3\",\"choices\":[{\"index\":0,"
	"\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
	"\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n"
	"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"qwen3\",\"choices\":[],\"usage\":{"
	"\"prompt_tokens\":1200,\"completion_tokens\":9,\"total_tokens\":1209,\"prompt_tokens_details\":{"
	"\"cached_tokens\":1024},\"completion_tokens_details\":{\"reasoning_tokens\":3}}}\n\n"
	"data: [DONE]\n\n";

/* Anthropic with a thinking block (and its signature), text, a tool call,
 * and cache reads and writes in usage. */
static const char anthropic_thinking_stream[] =
	"event: message_start\n"
	"data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\","
	"\"content\":[],\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":300,"
	"\"cache_read_input_tokens\":4096,\"output_tokens\":1}}}\n\n"
	"event: content_block_start\n"
	"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":"
	"\"\",\"signature\":\"\"}}\n\n"
	"event: content_block_delta\n"
	"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":"
	"\"Let me\"}}\n\n"
	"event: content_block_delta\n"
	"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":"
	"\" think\"}}\n\n"
	"event: content_block_delta\n"
	"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":"
	"\"EqoBCkgIARAB\"}}\n\n"
	"event: content_block_delta\n"
	"data: "
	"{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Paris\"}}\n\n"
	"event: content_block_delta\n"
	"data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\","
	"\"partial_json\":\"{\\\"city\\\"\"}}\n\n"
	"event: content_block_stop\n"
	"data: {\"type\":\"content_block_stop\",\"index\":2}\n\n"
	"event: message_delta\n"
	"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{"
	"\"input_tokens\":12,\"cache_creation_input_tokens\":300,\"cache_read_input_tokens\":4096,\"output_tokens\":"
	"40,\"output_tokens_details\":{\"thinking_tokens\":20}}}\n\n"
	"event: message_stop\n"
	"data: {\"type\":\"message_stop\"}\n\n";

/* Responses with reasoning, the answer and a function call. */
static const char responses_reasoning_stream[] =
	"event: response.reasoning_summary_text.delta\n"
	"data: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":1,\"item_id\":\"rs_1\","
	"\"output_index\":0,\"summary_index\":0,\"delta\":\"Think\"}\n\n"
	"event: response.reasoning_text.delta\n"
	"data: {\"type\":\"response.reasoning_text.delta\",\"sequence_number\":2,\"item_id\":\"rs_1\","
	"\"output_index\":0,\"content_index\":0,\"delta\":\"ing\"}\n\n"
	"event: response.output_text.delta\n"
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"item_id\":\"msg_1\","
	"\"output_index\":1,\"content_index\":0,\"delta\":\"Paris\"}\n\n"
	"event: response.function_call_arguments.delta\n"
	"data: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":4,\"item_id\":\"fc_1\","
	"\"output_index\":2,\"delta\":\"{}\"}\n\n"
	"event: response.output_item.done\n"
	"data: {\"type\":\"response.output_item.done\",\"sequence_number\":5,\"output_index\":2,\"item\":{}}\n\n"
	"event: response.completed\n"
	"data: {\"type\":\"response.completed\",\"sequence_number\":6,\"response\":{\"id\":\"r\",\"status\":"
	"\"completed\",\"usage\":{\"input_tokens\":2000,\"input_tokens_details\":{\"cached_tokens\":1024},"
	"\"output_tokens\":700,\"output_tokens_details\":{\"reasoning_tokens\":640},\"total_tokens\":2700}}}\n\n";

/* Rewrites every "\n" of `lf` as `eol`. */
/* Gemini (:streamGenerateContent), each element a whole
 * GenerateContentResponse, as the Gemini API writes the array: "[{" then
 * "\n,\r\n{" between elements and "\n]" at the end. A thought, two answer
 * chunks (text holding brackets, quotes and backslashes), then the empty
 * part that only carries the thought signature. usageMetadata repeats the
 * counts, cumulatively; thoughts are not in candidatesTokenCount. */
static const char gemini_array_stream[] =
	"[{\n  \"candidates\": [{\"content\": {\"parts\": [{\"text\": \"**Plan** [a] {b} \\\"c\\\" ]\", \"thought\": "
	"true}],"
	" \"role\": \"model\"}, \"index\": 0}],\n  \"usageMetadata\": {\"promptTokenCount\": 12, \"totalTokenCount\": "
	"20,"
	" \"thoughtsTokenCount\": 8},\n  \"modelVersion\": \"gemini-2.5-flash\", \"responseId\": \"r1\"\n}\n,\r\n"
	"{\n  \"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hello\"}], \"role\": \"model\"}, \"index\": "
	"0}],\n"
	"  \"usageMetadata\": {\"promptTokenCount\": 12, \"candidatesTokenCount\": 1, \"totalTokenCount\": 21,"
	" \"thoughtsTokenCount\": 8},\n  \"modelVersion\": \"gemini-2.5-flash\", \"responseId\": \"r1\"\n}\n,\r\n"
	"{\n  \"candidates\": [{\"content\": {\"parts\": [{\"text\": \" world \\\\\"}], \"role\": \"model\"},"
	" \"finishReason\": \"STOP\", \"index\": 0}],\n  \"usageMetadata\": {\"promptTokenCount\": 12,"
	" \"candidatesTokenCount\": 3, \"totalTokenCount\": 23, \"cachedContentTokenCount\": 4,"
	" \"thoughtsTokenCount\": 8},\n  \"modelVersion\": \"gemini-2.5-flash\", \"responseId\": \"r1\"\n}\n,\r\n"
	"{\n  \"candidates\": [{\"content\": {\"parts\": [{\"text\": \"\", \"thoughtSignature\": \"c2ln\"}],"
	" \"role\": \"model\"}, \"finishReason\": \"STOP\", \"index\": 0}],\n  \"usageMetadata\": "
	"{\"promptTokenCount\": 12,"
	" \"candidatesTokenCount\": 3, \"totalTokenCount\": 23, \"cachedContentTokenCount\": 4,"
	" \"thoughtsTokenCount\": 8}\n}\n]";

/* A function call, then an in-stream error element (the shape of a
 * google.rpc.Status, as a non-streamed error body has it). */
static const char gemini_tool_error_stream[] =
	"[{\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"name\": \"get_weather\", \"args\": "
	"{\"city\": \"Paris [FR]\"}}}], \"role\": \"model\"}, \"index\": 0}], \"usageMetadata\": "
	"{\"promptTokenCount\": 30,"
	" \"candidatesTokenCount\": 5, \"totalTokenCount\": 35}}\n,\r\n"
	"{\"error\": {\"code\": 503, \"message\": \"The model is overloaded.\", \"status\": \"UNAVAILABLE\"}}\n]";

/* The same responses as ?alt=sse sends them: one `data:` line each, no
 * event names, no [DONE]. */
static const char gemini_sse_stream[] =
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"hmm\",\"thought\": true}],\"role\": "
	"\"model\"},"
	"\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 7,\"totalTokenCount\": 9,\"thoughtsTokenCount\": 2},"
	"\"modelVersion\": \"gemini-2.5-pro\"}\n\n"
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hi\"}],\"role\": \"model\"},\"index\": 0}],"
	"\"usageMetadata\": {\"promptTokenCount\": 7,\"candidatesTokenCount\": 1,\"totalTokenCount\": 10,"
	"\"thoughtsTokenCount\": 2},\"modelVersion\": \"gemini-2.5-pro\"}\n\n"
	"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \" there\"}],\"role\": \"model\"},"
	"\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 7,"
	"\"candidatesTokenCount\": 2,\"totalTokenCount\": 11,\"thoughtsTokenCount\": 2},"
	"\"modelVersion\": \"gemini-2.5-pro\"}\n\n";

static char *with_line_ends(const char *lf, const char *eol)
{
	size_t n = strlen(lf), k = strlen(eol), lines = 0;
	for (size_t i = 0; i < n; i++)
		lines += lf[i] == '\n';
	char *out = malloc(n + lines * k + 1), *o = out;
	assert_non_null(out);
	for (size_t i = 0; i < n; i++) {
		if (lf[i] == '\n') {
			memcpy(o, eol, k);
			o += k;
		} else {
			*o++ = lf[i];
		}
	}
	*o = '\0';
	return out;
}

static void test_openai_stream_events(void **state)
{
	struct seen s = { 0 };
	frame_all(FRAMER_SSE, 0, openai_chat_stream, &s);
	assert_int_equal(s.n, 6); /* the comment is not an event */
	for (int i = 0; i < s.n; i++)
		assert_null(s.name[i]);
	assert_true(strncmp(s.data[0], "{\"id\":\"chatcmpl-1\"", 18) == 0);
	assert_non_null(strstr(s.data[1], "\"content\":\"Hello\""));
	assert_non_null(strstr(s.data[4], "\"choices\":[]"));
	assert_string_equal(s.data[5], "[DONE]");
	seen_clear(&s);
}

static void test_anthropic_stream_names(void **state)
{
	static const char *names[] = { "message_start",	      "content_block_start", "ping",
				       "content_block_delta", "content_block_delta", "content_block_stop",
				       "message_delta",	      "message_stop" };
	struct seen s = { 0 };
	frame_all(FRAMER_SSE, 0, anthropic_stream, &s);
	assert_int_equal(s.n, 8);
	for (int i = 0; i < 8; i++)
		assert_string_equal(s.name[i], names[i]);
	assert_string_equal(s.data[2], "{\"type\": \"ping\"}");
	assert_string_equal(s.data[7], "{\"type\":\"message_stop\"}");
	seen_clear(&s);
}

/* What an unsplit run of a stream must give: events, token-bearing ones
 * among them (and of those, reasoning and tool-call ones), and the usage
 * read. */
struct expect {
	int events, tokens;
	int64_t input, output;
	enum resp_outcome outcome;
	int reasoning, tools;
	int64_t cached, cache_write, reasoning_tokens;
};

/* Every single cut, then byte by byte, then pseudo-random slicings: the
 * events, the token decision on each (made in the callback, with one hint
 * for the stream) and the usage must be identical to the unsplit run, which
 * must give `want`. */
static void check_all_splits(enum framer_kind kind, enum api_kind api, const char *text, const struct expect *want)
{
	struct seen ref = { 0 }, got = { 0 };
	size_t n = strlen(text);
	seen_start(&ref, api);
	frame_all(kind, 0, text, &ref);
	int tokens = 0, reasoning = 0, tools = 0;
	for (int i = 0; i < ref.n; i++) {
		tokens += ref.token[i] != TOKEN_NONE;
		reasoning += ref.token[i] == TOKEN_REASONING;
		tools += ref.token[i] == TOKEN_TOOL;
	}
	assert_int_equal(ref.n, want->events);
	assert_int_equal(tokens, want->tokens);
	assert_int_equal(reasoning, want->reasoning);
	assert_int_equal(tools, want->tools);
	assert_int_equal(ref.usage.input_tokens, want->input);
	assert_int_equal(ref.usage.output_tokens, want->output);
	assert_int_equal(ref.usage.outcome, want->outcome);
	assert_int_equal(ref.usage.cached_tokens, want->cached);
	assert_int_equal(ref.usage.cache_write_tokens, want->cache_write);
	assert_int_equal(ref.usage.reasoning_tokens, want->reasoning_tokens);

	for (size_t cut = 1; cut < n; cut++) {
		seen_start(&got, api);
		frame_cut(kind, text, &cut, 1, &got);
		assert_seen_equal(&ref, &got);
	}

	size_t *cuts = malloc(n * sizeof(*cuts));
	assert_non_null(cuts);
	for (size_t i = 1; i < n; i++)
		cuts[i - 1] = i;
	seen_start(&got, api);
	frame_cut(kind, text, cuts, (int)(n - 1), &got);
	assert_seen_equal(&ref, &got);

	uint32_t rng = 12345;
	for (int round = 0; round < 300; round++) {
		int k = 0;
		for (size_t at = 0;;) {
			rng = rng * 1103515245u + 12345u;
			at += 1 + (rng >> 16) % 40;
			if (at >= n)
				break;
			cuts[k++] = at;
		}
		seen_start(&got, api);
		frame_cut(kind, text, cuts, k, &got);
		assert_seen_equal(&ref, &got);
	}
	free(cuts);
	seen_clear(&got);
	seen_clear(&ref);
}

/* The SSE streams, each with the API that reads it and what it holds. */
static const struct {
	const char *text;
	enum api_kind api;
	struct expect want;
} sse_streams[] = {
	{ openai_chat_stream, API_OPENAI_CHAT, { 6, 2, 12, 3, OUTCOME_NONE, 0, 0, -1, -1, -1 } },
	{ anthropic_stream, API_ANTHROPIC, { 8, 2, 25, 15, OUTCOME_NONE, 0, 0, -1, -1, -1 } },
	{ openai_completions_stream, API_OPENAI_COMPLETIONS, { 5, 2, 5, 2, OUTCOME_NONE, 0, 0, -1, -1, -1 } },
	{ tgi_stream, API_TGI, { 3, 2, 7, 3, OUTCOME_NONE, 0, 0, -1, -1, -1 } },
	{ llamacpp_stream, API_LLAMACPP, { 3, 2, 6, 2, OUTCOME_NONE, 0, 0, -1, -1, -1 } },
	{ responses_text_stream, API_OPENAI_RESPONSES, { 11, 2, 36, 87, OUTCOME_NONE, 0, 0, 0, -1, 0 } },
	{ responses_all_deltas_stream, API_OPENAI_RESPONSES, { 24, 11, 10, 20, OUTCOME_INCOMPLETE, 2, 5, 0, -1, 0 } },
	{ responses_unnamed_stream, API_OPENAI_RESPONSES, { 5, 2, 5, 2, OUTCOME_NONE, 0, 0, 0, -1, 0 } },
	{ responses_failed_stream, API_OPENAI_RESPONSES, { 4, 0, -1, -1, OUTCOME_FAILED, 0, 0, -1, -1, -1 } },
	{ responses_incomplete_stream, API_OPENAI_RESPONSES, { 4, 2, 7, 2, OUTCOME_INCOMPLETE, 0, 0, 0, -1, 0 } },
	{ chat_reasoning_stream, API_OPENAI_CHAT, { 8, 5, 1200, 9, OUTCOME_NONE, 3, 1, 1024, -1, 3 } },
	{ anthropic_thinking_stream, API_ANTHROPIC, { 10, 4, 12 + 300 + 4096, 40, OUTCOME_NONE, 2, 1, 4096, 300, 20 } },
	{ responses_reasoning_stream, API_OPENAI_RESPONSES, { 6, 4, 2000, 700, OUTCOME_NONE, 2, 1, 1024, -1, 640 } },
	{ gemini_sse_stream, API_GEMINI_STREAM, { 3, 3, 7, 4, OUTCOME_NONE, 1, 0, -1, -1, 2 } },
};

static void test_split_every_byte_sse(void **state)
{
	static const char *eols[] = { "\n", "\r\n", "\r" };
	for (int e = 0; e < 3; e++) {
		for (size_t i = 0; i < sizeof(sse_streams) / sizeof(sse_streams[0]); i++) {
			char *text = with_line_ends(sse_streams[i].text, eols[e]);
			check_all_splits(FRAMER_SSE, sse_streams[i].api, text, &sse_streams[i].want);
			free(text);
		}
	}
}

static void test_split_every_byte_ndjson(void **state)
{
	static const struct expect chat = { 3, 2, 26, 282, OUTCOME_NONE, 0, 0, -1, -1, -1 },
				   generate = { 4, 3, 11, 3, OUTCOME_NONE, 1, 0, -1, -1, -1 };
	static const char *eols[] = { "\n", "\r\n" };
	for (int e = 0; e < 2; e++) {
		char *text = with_line_ends(ollama_chat_stream, eols[e]);
		check_all_splits(FRAMER_NDJSON, API_OLLAMA_CHAT, text, &chat);
		free(text);
		text = with_line_ends(ollama_generate_stream, eols[e]);
		check_all_splits(FRAMER_NDJSON, API_OLLAMA_GENERATE, text, &generate);
		free(text);
	}
}

/* The same stream with LF, CRLF and CR line ends gives the same events. */
static void test_line_end_variants_agree(void **state)
{
	struct seen lf = { 0 }, other = { 0 };
	frame_all(FRAMER_SSE, 0, anthropic_stream, &lf);
	char *crlf = with_line_ends(anthropic_stream, "\r\n");
	char *cr = with_line_ends(anthropic_stream, "\r");
	frame_all(FRAMER_SSE, 0, crlf, &other);
	assert_seen_equal(&lf, &other);
	seen_clear(&other);
	frame_all(FRAMER_SSE, 0, cr, &other);
	assert_seen_equal(&lf, &other);
	seen_clear(&other);
	/* Mixed ends within one stream. */
	frame_all(FRAMER_SSE, 0, "data: a\r\ndata: b\rdata: c\n\r\n", &other);
	assert_int_equal(other.n, 1);
	assert_string_equal(other.data[0], "a\nb\nc");
	seen_clear(&other);
	free(crlf);
	free(cr);
	seen_clear(&lf);
}

/* A CR closing one feed and a LF opening the next are one line end, not a
 * line end plus a blank line (which would dispatch "a" early). */
static void test_cr_lf_across_feeds(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_SSE, 0, on_event, &s);
	FEED(&f, "data: a\r");
	FEED(&f, "\ndata: b\r");
	assert_int_equal(s.n, 0);
	FEED(&f, "\n");
	assert_int_equal(s.n, 0);
	FEED(&f, "\r\n");
	assert_int_equal(s.n, 1);
	assert_string_equal(s.data[0], "a\nb");
	/* A CR at the end of a feed followed by a non-LF: the CR alone ended
	 * the line, the next byte starts a new one. */
	FEED(&f, "data: c\r");
	FEED(&f, "\r");
	assert_int_equal(s.n, 2);
	assert_string_equal(s.data[1], "c");
	framer_free(&f);
	seen_clear(&s);
}

static void test_data_field_rules(void **state)
{
	struct seen s = { 0 };
	frame_all(FRAMER_SSE, 0,
		  "data:x\n\n"			  /* no space */
		  "data:  two\n\n"		  /* only one space is stripped */
		  "data\n\n"			  /* field without colon: empty data, still an event */
		  "data:\ndata:\n\n"		  /* two empty lines join to "\n" */
		  "data: a\ndata: b\ndata: c\n\n" /* multi-line */
		  "data: x: y\n\n",		  /* only the first colon splits */
		  &s);
	assert_int_equal(s.n, 6);
	assert_string_equal(s.data[0], "x");
	assert_string_equal(s.data[1], " two");
	assert_string_equal(s.data[2], "");
	assert_string_equal(s.data[3], "\n");
	assert_string_equal(s.data[4], "a\nb\nc");
	assert_string_equal(s.data[5], "x: y");
	seen_clear(&s);
}

static void test_event_names_and_other_fields(void **state)
{
	struct seen s = { 0 };
	frame_all(FRAMER_SSE, 0,
		  "id: 7\nretry: 3000\nevent: first\ndata: 1\n\n"
		  "data: 2\n\n"				/* the name does not leak into the next event */
		  "data: 3a\nevent: late\ndata: 3b\n\n" /* event after data */
		  "event: a\nevent: bb\ndata: 4\n\n"	/* the last event field wins */
		  "event: orphan\n\n"			/* no data: no event, and the name is dropped */
		  "data: 5\n\n"
		  "event:\ndata: 6\n\n"		      /* empty name reads as no name */
		  "Data: no\nDATA: no\nevent: x\n\n", /* field names are case-sensitive */
		  &s);
	assert_int_equal(s.n, 6);
	assert_string_equal(s.name[0], "first");
	assert_string_equal(s.data[0], "1");
	assert_null(s.name[1]);
	assert_string_equal(s.data[1], "2");
	assert_string_equal(s.name[2], "late");
	assert_string_equal(s.data[2], "3a\n3b");
	assert_string_equal(s.name[3], "bb");
	assert_string_equal(s.data[3], "4");
	assert_null(s.name[4]);
	assert_string_equal(s.data[4], "5");
	assert_null(s.name[5]);
	assert_string_equal(s.data[5], "6");
	seen_clear(&s);
}

static void test_comments(void **state)
{
	struct seen s = { 0 };
	frame_all(FRAMER_SSE, 0, ": ping\n\n:\n\n: data: not this\ndata: yes\n: between\ndata: too\n\n", &s);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.data[0], "yes\ntoo");
	seen_clear(&s);
}

/* An event over max_event is dropped and counted; the next one arrives. */
static void test_oversized_sse(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	char big[300];
	memset(big, 'x', sizeof(big));
	framer_init(&f, FRAMER_SSE, 64, on_event, &s);
	FEED(&f, "event: big\ndata: ");
	framer_feed(&f, big, sizeof(big));
	FEED(&f, "\ndata: more of the same event\n");
	FEED(&f, "\n");
	FEED(&f, "data: small\n\n");
	assert_int_equal(f.oversized, 1);
	assert_int_equal(s.n, 1);
	assert_null(s.name[0]); /* the dropped event's name did not survive */
	assert_string_equal(s.data[0], "small");
	/* Many data lines, each small, that add up past the bound. */
	for (int i = 0; i < 20; i++)
		FEED(&f, "data: 0123456789\n");
	FEED(&f, "\ndata: after\n\n");
	assert_int_equal(f.oversized, 2);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.data[1], "after");
	assert_true(f.cap <= 64);
	/* A comment of any length is not an event and is never buffered. */
	FEED(&f, ": ");
	framer_feed(&f, big, sizeof(big));
	FEED(&f, "\ndata: fine\n\n");
	assert_int_equal(f.oversized, 2);
	assert_int_equal(s.n, 3);
	assert_string_equal(s.data[2], "fine");
	assert_int_equal(f.events, 3);
	framer_free(&f);
	seen_clear(&s);
}

static void test_oversized_ndjson(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	char big[200];
	memset(big, '7', sizeof(big));
	framer_init(&f, FRAMER_NDJSON, 32, on_event, &s);
	FEED(&f, "{\"a\":1}\n[");
	framer_feed(&f, big, sizeof(big));
	FEED(&f, "]\n{\"b\":2}\n");
	assert_int_equal(f.oversized, 1);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.data[0], "{\"a\":1}");
	assert_string_equal(s.data[1], "{\"b\":2}");
	/* Oversized last line without newline: dropped by finish too. */
	framer_feed(&f, big, sizeof(big));
	framer_finish(&f);
	assert_int_equal(f.oversized, 2);
	assert_int_equal(s.n, 2);
	framer_free(&f);
	seen_clear(&s);
}

/* An event exactly at the bound fits; one byte more does not. */
static void test_oversized_boundary(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_NDJSON, 8, on_event, &s);
	FEED(&f, "12345678\n123456789\nabc\n");
	assert_int_equal(s.n, 2);
	assert_string_equal(s.data[0], "12345678");
	assert_string_equal(s.data[1], "abc");
	assert_int_equal(f.oversized, 1);
	framer_free(&f);
	seen_clear(&s);

	/* SSE bounds the stored line, field name included: "data: 12" is 8
	 * bytes. Whole events in one slice (framed in place) and the same
	 * bytes one at a time (framed in the buffer) agree. */
	static const char sse[] = "data: 12\n\ndata: 123\n\ndata:123\r\n\r\ndata: x\n\n";
	for (int bytewise = 0; bytewise < 2; bytewise++) {
		framer_init(&f, FRAMER_SSE, 8, on_event, &s);
		for (size_t at = 0, step = bytewise ? 1 : sizeof(sse) - 1; at < sizeof(sse) - 1; at += step)
			framer_feed(&f, sse + at, step);
		assert_int_equal(s.n, 3);
		assert_string_equal(s.data[0], "12");
		assert_string_equal(s.data[1], "123");
		assert_string_equal(s.data[2], "x");
		assert_int_equal(f.oversized, 1);
		framer_free(&f);
		seen_clear(&s);
	}
}

static void test_ndjson_lines(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_NDJSON, 0, on_event, &s);
	const char *text = "{\"a\":1}\r\n\n  \r\n{\"b\":\"x\\ry\"}\n{\"c\":\r3}\n{\"last\":true}";
	framer_feed(&f, text, strlen(text));
	assert_int_equal(s.n, 3);
	assert_string_equal(s.data[0], "{\"a\":1}"); /* CR stripped */
	assert_string_equal(s.data[1], "{\"b\":\"x\\ry\"}");
	assert_string_equal(s.data[2], "{\"c\":\r3}"); /* a lone CR ends no NDJSON line */
	assert_null(s.name[0]);
	framer_finish(&f);
	assert_int_equal(s.n, 4);
	assert_string_equal(s.data[3], "{\"last\":true}");
	framer_finish(&f); /* twice: nothing more */
	assert_int_equal(s.n, 4);
	assert_int_equal(f.events, 4);
	framer_free(&f);
	framer_free(&f); /* safe twice */
	seen_clear(&s);
}

static void test_ollama_stream(void **state)
{
	struct seen s = { 0 };
	frame_all(FRAMER_NDJSON, 0, ollama_chat_stream, &s);
	assert_int_equal(s.n, 3); /* the blank line is not an event; the last needs finish */
	assert_non_null(strstr(s.data[2], "\"eval_count\":282"));
	seen_clear(&s);
}

static void test_sse_finish_dispatches_pending(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_SSE, 0, on_event, &s);
	FEED(&f, "data: a\n\ndata: b");
	assert_int_equal(s.n, 1);
	framer_finish(&f);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.data[1], "b");
	FEED(&f, "event: e\ndata: c\n");
	framer_finish(&f);
	assert_int_equal(s.n, 3);
	assert_string_equal(s.name[2], "e");
	assert_string_equal(s.data[2], "c");
	framer_finish(&f);
	FEED(&f, ": only a comment");
	framer_finish(&f);
	assert_int_equal(s.n, 3);
	framer_free(&f);
	seen_clear(&s);
}

static void test_kind_none_is_noop(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_NONE, 0, on_event, &s);
	FEED(&f, "data: a\n\n");
	framer_finish(&f);
	assert_int_equal(s.n, 0);
	assert_null(f.buf);
	framer_free(&f);
	/* A zeroed framer can be freed. */
	struct framer z;
	memset(&z, 0, sizeof(z));
	framer_free(&z);
}

/* The buffer grows to the largest event and no further. */
static void test_buffer_stays_bounded(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_SSE, 1 << 20, on_event, &s);
	for (int i = 0; i < 2000; i++) {
		framer_feed(&f, openai_chat_stream, sizeof(openai_chat_stream) - 1);
		seen_clear(&s);
	}
	assert_true(f.cap <= 1024);
	assert_int_equal(f.events, 2000 * 6);
	framer_free(&f);
}

/* The streamed JSON array: every cut, byte by byte, random slicings. */
static void test_split_every_byte_json_array(void **state)
{
	static const struct expect text = { 4, 3, 12, 11, OUTCOME_NONE, 1, 0, 4, -1, 8 },
				   tool = { 2, 1, 30, 5, OUTCOME_FAILED, 0, 1, -1, -1, -1 };
	check_all_splits(FRAMER_JSON_ARRAY, API_GEMINI_STREAM, gemini_array_stream, &text);
	check_all_splits(FRAMER_JSON_ARRAY, API_GEMINI_STREAM, gemini_tool_error_stream, &tool);
}

static void test_json_array_elements(void **state)
{
	struct seen s = { 0 };
	/* strings with brackets and escapes, nesting, scalars, blanks
	 * everywhere; an element's bytes are exactly its own */
	frame_all(FRAMER_JSON_ARRAY, 0, " \r\n[ {\"a\":\"]}\\\\\"} , [1,[2]],\"x\\\"]\" ,42,true ,{}\n]\n", &s);
	assert_int_equal(s.n, 6);
	assert_string_equal(s.data[0], "{\"a\":\"]}\\\\\"}");
	assert_string_equal(s.data[1], "[1,[2]]");
	assert_string_equal(s.data[2], "\"x\\\"]\"");
	assert_string_equal(s.data[3], "42");
	assert_string_equal(s.data[4], "true");
	assert_string_equal(s.data[5], "{}");
	assert_null(s.name[0]);
	seen_clear(&s);
	/* a body that is no array (an error object) is one element; after
	 * the array closes, framing starts over */
	frame_all(FRAMER_JSON_ARRAY, 0, "{\"error\":{\"code\":500}}\n", &s);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.data[0], "{\"error\":{\"code\":500}}");
	seen_clear(&s);
	frame_all(FRAMER_JSON_ARRAY, 0, "[{\"a\":1}] [{\"b\":2}]", &s);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.data[1], "{\"b\":2}");
	seen_clear(&s);
	/* backslash runs before quotes, cut anywhere: \\\" is an escaped
	 * backslash then an escaped quote, \\\\" two escaped backslashes and
	 * the string's end */
	{
		const char *text = "[\"a\\\\\\\"]\\\\\\\\\",{\"k\":\"\\\\\\\\\"},\"\\\"\"]";
		size_t n = strlen(text);
		struct seen ref = { 0 }, got = { 0 };
		frame_all(FRAMER_JSON_ARRAY, 0, text, &ref);
		assert_int_equal(ref.n, 3);
		assert_string_equal(ref.data[0], "\"a\\\\\\\"]\\\\\\\\\"");
		assert_string_equal(ref.data[1], "{\"k\":\"\\\\\\\\\"}");
		assert_string_equal(ref.data[2], "\"\\\"\"");
		for (size_t cut = 1; cut < n; cut++) {
			frame_cut(FRAMER_JSON_ARRAY, text, &cut, 1, &got);
			assert_seen_equal(&ref, &got);
			seen_clear(&got);
		}
		size_t cuts[64];
		for (size_t i = 1; i < n; i++)
			cuts[i - 1] = i;
		frame_cut(FRAMER_JSON_ARRAY, text, cuts, (int)(n - 1), &got);
		assert_seen_equal(&ref, &got);
		seen_clear(&got);
		seen_clear(&ref);
	}
	/* empty arrays, nothing at all */
	frame_all(FRAMER_JSON_ARRAY, 0, "[]", &s);
	frame_all(FRAMER_JSON_ARRAY, 0, "[ \n ]", &s);
	frame_all(FRAMER_JSON_ARRAY, 0, "", &s);
	assert_int_equal(s.n, 0);
}

/* An element cut by the end of the body is no element; a number is whole
 * at the end. */
static void test_json_array_finish(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_JSON_ARRAY, 0, on_event, &s);
	FEED(&f, "[{\"a\":1},{\"b\":\"cut");
	assert_int_equal(s.n, 1);
	framer_finish(&f);
	assert_int_equal(s.n, 1);
	assert_int_equal(f.oversized, 0);
	/* the framer starts over after finish */
	FEED(&f, "[7");
	framer_finish(&f);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.data[1], "7");
	FEED(&f, "12");
	framer_finish(&f);
	assert_int_equal(s.n, 3);
	assert_string_equal(s.data[2], "12");
	framer_free(&f);
	seen_clear(&s);
}

/* An element over max_event is dropped, counted once, skipped to its
 * end; the next one is framed, whole in one slice or split. */
static void test_json_array_oversized(void **state)
{
	for (int split = 0; split < 2; split++) {
		struct seen s = { 0 };
		struct framer f;
		const char *text = "[{\"t\":\"0123456789abcdefghij]}\"},{\"u\":1},{\"v\":\"0123456789abcdefghij\"},{}]";
		framer_init(&f, FRAMER_JSON_ARRAY, 16, on_event, &s);
		if (split) {
			for (size_t i = 0; text[i]; i++)
				framer_feed(&f, text + i, 1);
		} else {
			framer_feed(&f, text, strlen(text));
		}
		framer_finish(&f);
		assert_int_equal(s.n, 2);
		assert_string_equal(s.data[0], "{\"u\":1}");
		assert_string_equal(s.data[1], "{}");
		assert_int_equal(f.oversized, 2);
		assert_true(f.cap <= 16);
		framer_free(&f);
		seen_clear(&s);
	}
	/* exactly max_event bytes fit */
	struct seen s = { 0 };
	frame_all(FRAMER_JSON_ARRAY, 7, "[{\"u\":1},{\"u\":12}]", &s);
	assert_int_equal(s.n, 1);
	seen_clear(&s);
}

/* A long stream keeps one small buffer, however it is cut. */
static void test_json_array_bounded(void **state)
{
	struct seen s = { 0 };
	struct framer f;
	framer_init(&f, FRAMER_JSON_ARRAY, 1 << 20, on_event, &s);
	FEED(&f, "[");
	for (int i = 0; i < 2000; i++) {
		const char el[] = "{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"tok\"}]}}]},\r\n";
		size_t cut = (size_t)(i % 40);
		framer_feed(&f, el, cut);
		framer_feed(&f, el + cut, sizeof(el) - 1 - cut);
		seen_clear(&s);
	}
	FEED(&f, "{}]");
	framer_finish(&f);
	assert_int_equal(f.events, 2001);
	assert_true(f.cap <= 512);
	framer_free(&f);
	seen_clear(&s);
}

static void test_content_types(void **state)
{
#define CT(s) framer_kind_for_content_type(s, strlen(s))
	assert_int_equal(CT("text/event-stream"), FRAMER_SSE);
	assert_int_equal(CT("text/event-stream; charset=utf-8"), FRAMER_SSE);
	assert_int_equal(CT("Text/Event-Stream;charset=UTF-8"), FRAMER_SSE);
	assert_int_equal(CT(" text/event-stream "), FRAMER_SSE);
	assert_int_equal(CT("application/x-ndjson"), FRAMER_NDJSON);
	assert_int_equal(CT("application/X-NDJSON; charset=utf-8"), FRAMER_NDJSON);
	assert_int_equal(CT("application/jsonl"), FRAMER_NDJSON);
	assert_int_equal(CT("application/json"), FRAMER_NONE);
	assert_int_equal(CT("text/event-streamx"), FRAMER_NONE);
	assert_int_equal(CT("text/event"), FRAMER_NONE);
	assert_int_equal(CT(""), FRAMER_NONE);
	assert_int_equal(framer_kind_for_content_type(NULL, 0), FRAMER_NONE);
	/* Length-bounded: bytes past len are not read. */
	assert_int_equal(framer_kind_for_content_type("text/event-streamXYZ", 17), FRAMER_SSE);
#undef CT
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_openai_stream_events),
		cmocka_unit_test(test_anthropic_stream_names),
		cmocka_unit_test(test_split_every_byte_sse),
		cmocka_unit_test(test_split_every_byte_ndjson),
		cmocka_unit_test(test_line_end_variants_agree),
		cmocka_unit_test(test_cr_lf_across_feeds),
		cmocka_unit_test(test_data_field_rules),
		cmocka_unit_test(test_event_names_and_other_fields),
		cmocka_unit_test(test_comments),
		cmocka_unit_test(test_oversized_sse),
		cmocka_unit_test(test_oversized_ndjson),
		cmocka_unit_test(test_oversized_boundary),
		cmocka_unit_test(test_ndjson_lines),
		cmocka_unit_test(test_ollama_stream),
		cmocka_unit_test(test_sse_finish_dispatches_pending),
		cmocka_unit_test(test_kind_none_is_noop),
		cmocka_unit_test(test_buffer_stays_bounded),
		cmocka_unit_test(test_content_types),
		cmocka_unit_test(test_split_every_byte_json_array),
		cmocka_unit_test(test_json_array_elements),
		cmocka_unit_test(test_json_array_finish),
		cmocka_unit_test(test_json_array_oversized),
		cmocka_unit_test(test_json_array_bounded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
