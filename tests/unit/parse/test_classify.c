/*
 * test_classify.c — token-bearing decisions and usage extraction for every
 * API, on event shapes as the servers send them. JSON is written with single
 * quotes for legibility; J() turns them into double quotes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "classify.h"
#include "quotes.h"

/* One hint per API, carried across every event of every test in this file:
 * whatever shape the last token event had, a hint must never change an
 * answer, only how fast it comes. */
static struct classify_hint hints[API_GEMINI_STREAM + 1];

/* Classifies `data` (taken as is) under the SSE event name `name`, once on
 * its own and once with the API's running hint; both must agree, usage
 * included. */
static enum token_kind tok_named(enum api_kind api, const char *name, const char *data, struct usage *u)
{
	struct framer_event ev = {
		.name = name,
		.name_len = name ? strlen(name) : 0,
		.data = data,
		.data_len = strlen(data),
	};
	/* Copy into an exact-size heap block, so that ASan catches a scan
	 * that reads one byte past the event. */
	char *copy = malloc(ev.data_len ? ev.data_len : 1);
	assert_non_null(copy);
	memcpy(copy, data, ev.data_len);
	ev.data = copy;
	struct usage hinted = u ? *u : USAGE_UNKNOWN;
	enum token_kind r = classify_event(api, &ev, u, NULL);
	assert_int_equal(classify_event(api, &ev, u ? &hinted : NULL, &hints[api]), r);
	if (u) {
		assert_int_equal(hinted.input_tokens, u->input_tokens);
		assert_int_equal(hinted.output_tokens, u->output_tokens);
		assert_int_equal(hinted.cached_tokens, u->cached_tokens);
		assert_int_equal(hinted.cache_write_tokens, u->cache_write_tokens);
		assert_int_equal(hinted.reasoning_tokens, u->reasoning_tokens);
		assert_int_equal(hinted.outcome, u->outcome);
		assert_memory_equal(&hinted.server, &u->server, sizeof(u->server));
	}
	free(copy);
	return r;
}

static enum token_kind tok(enum api_kind api, const char *data, struct usage *u)
{
	return tok_named(api, NULL, data, u);
}

#define OAI_HEAD \
	"{'id':'chatcmpl-8f3a','object':'chat.completion.chunk','created':1718000000,'model':'Qwen/" \
	"Qwen2.5-7B-Instruct',"

static void test_api_paths(void **state)
{
#define API(s) classify_api(s, strlen(s))
	assert_int_equal(API("/v1/chat/completions"), API_OPENAI_CHAT);
	assert_int_equal(API("/chat/completions"), API_OPENAI_CHAT);
	assert_int_equal(API("/v1/chat/completions/"), API_OPENAI_CHAT);
	assert_int_equal(API("/v1/completions"), API_OPENAI_COMPLETIONS);
	assert_int_equal(API("/completions"), API_OPENAI_COMPLETIONS);
	assert_int_equal(API("/completion"), API_LLAMACPP);
	assert_int_equal(API("/completion/"), API_LLAMACPP);
	assert_int_equal(API("/v1/messages"), API_ANTHROPIC);
	assert_int_equal(API("/generate_stream"), API_TGI);
	assert_int_equal(API("/generate"), API_TGI);
	assert_int_equal(API("/api/generate"), API_OLLAMA_GENERATE);
	assert_int_equal(API("/api/chat"), API_OLLAMA_CHAT);
	assert_int_equal(API("/api/chat/"), API_OLLAMA_CHAT);

	assert_int_equal(API("/v1/models"), API_UNKNOWN);
	assert_int_equal(API("/v1/chat/completions//"), API_UNKNOWN);
	assert_int_equal(API("/v1/chat/completionsx"), API_UNKNOWN);
	assert_int_equal(API("/prefix/v1/chat/completions"), API_UNKNOWN);
	assert_int_equal(API("/V1/MESSAGES"), API_UNKNOWN);
	assert_int_equal(API("/"), API_UNKNOWN);
	assert_int_equal(API(""), API_UNKNOWN);
	assert_int_equal(classify_api(NULL, 0), API_UNKNOWN);
	/* Length-bounded: the caller passes the path without its query. */
	assert_int_equal(classify_api("/api/chat?x=1", 9), API_OLLAMA_CHAT);
	assert_int_equal(API("/v1/responses"), API_OPENAI_RESPONSES);
	assert_int_equal(API("/responses"), API_OPENAI_RESPONSES);
	assert_int_equal(API("/v1/responses/"), API_OPENAI_RESPONSES);
	/* Retrieving or cancelling a stored response is not a generation. */
	assert_int_equal(API("/v1/responses/resp_1"), API_UNKNOWN);
	assert_int_equal(API("/v1/responses/resp_1/cancel"), API_UNKNOWN);
	assert_int_equal(API("/v1/embeddings"), API_EMBEDDINGS);
	assert_int_equal(API("/embeddings/"), API_EMBEDDINGS);
	assert_int_equal(API("/v1/rerank"), API_RERANK);
	assert_int_equal(API("/v2/rerank"), API_RERANK);
	assert_int_equal(API("/rerank"), API_RERANK);
	assert_int_equal(API("/v1/score"), API_SCORE);
	assert_int_equal(API("/classify"), API_CLASSIFY);
	assert_int_equal(API("/embed"), API_TEI_EMBED);
	assert_int_equal(API("/embed_sparse"), API_UNKNOWN);
#undef API
}

/* The batch APIs: prompt tokens from usage, total_tokens where that is all
 * there is, nothing from TEI's bare array, and the field of their inputs. */
static void test_batch_usage(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	const char *oai =
		"{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
		"\"embedding\":[0.1,-0.2]}],\"model\":\"m\",\"usage\":{\"prompt_tokens\":9,"
		"\"total_tokens\":9}}";
	classify_body(API_EMBEDDINGS, oai, strlen(oai), &u);
	assert_int_equal(u.input_tokens, 9);
	assert_int_equal(u.output_tokens, -1);
	u = USAGE_UNKNOWN;
	const char *rerank =
		"{\"id\":\"r\",\"usage\":{\"total_tokens\":31},\"results\":[{\"index\":0,"
		"\"relevance_score\":0.5,\"document\":{\"text\":\"usage\"}}]}";
	classify_body(API_RERANK, rerank, strlen(rerank), &u);
	assert_int_equal(u.input_tokens, 31);
	u = USAGE_UNKNOWN;
	const char *tei = "[[0.1,0.2],[0.3,0.4]]";
	classify_body(API_TEI_EMBED, tei, strlen(tei), &u);
	assert_int_equal(u.input_tokens, -1);
	const struct framer_event ev = { .data = oai, .data_len = strlen(oai) };
	assert_int_equal(classify_event(API_EMBEDDINGS, &ev, &u, NULL), TOKEN_NONE);
	assert_string_equal(classify_inputs_key(API_EMBEDDINGS), "input");
	assert_string_equal(classify_inputs_key(API_RERANK), "documents");
	assert_string_equal(classify_inputs_key(API_SCORE), "text_2");
	assert_string_equal(classify_inputs_key(API_TEI_EMBED), "inputs");
	assert_null(classify_inputs_key(API_OPENAI_CHAT));
	assert_string_equal(classify_inputs_alt_key(API_RERANK), "texts");
	assert_null(classify_inputs_alt_key(API_EMBEDDINGS));

	/* The tail of an answer too large to keep: the last usage object. */
	const char *tail =
		"0.25,-0.5]}],\"model\":\"m\",\"note\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":1}\","
		"\"usage\" : {\"prompt_tokens\":4096,\"total_tokens\":4096}}";
	u = USAGE_UNKNOWN;
	classify_body_tail(API_EMBEDDINGS, tail, strlen(tail), &u);
	assert_int_equal(u.input_tokens, 4096);
	u = USAGE_UNKNOWN;
	classify_body_tail(API_EMBEDDINGS, tail, strlen(tail) - 40, &u); /* cut before its usage */
	assert_int_equal(u.input_tokens, -1);
	u = USAGE_UNKNOWN;
	classify_body_tail(API_OPENAI_CHAT, tail, strlen(tail), &u); /* not a batch API */
	assert_int_equal(u.input_tokens, -1);
}

static void test_api_names(void **state)
{
	assert_string_equal(classify_api_name(API_UNKNOWN), "unknown");
	assert_string_equal(classify_api_name(API_OPENAI_CHAT), "openai-chat");
	assert_string_equal(classify_api_name(API_OPENAI_COMPLETIONS), "openai-completions");
	assert_string_equal(classify_api_name(API_ANTHROPIC), "anthropic");
	assert_string_equal(classify_api_name(API_TGI), "tgi");
	assert_string_equal(classify_api_name(API_LLAMACPP), "llamacpp");
	assert_string_equal(classify_api_name(API_OLLAMA_GENERATE), "ollama-generate");
	assert_string_equal(classify_api_name(API_OLLAMA_CHAT), "ollama-chat");
	assert_string_equal(classify_api_name(API_OPENAI_RESPONSES), "openai-responses");
	assert_string_equal(classify_api_name(API_EMBEDDINGS), "embeddings");
	assert_string_equal(classify_api_name(API_TEI_EMBED), "tei-embed");
	assert_string_equal(classify_api_name((enum api_kind)99), "unknown");
}

/* A vLLM chat stream with include_usage, event by event. */
static void test_openai_chat_stream(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	/* Role-only first chunk: not a token. */
	assert_false(tok(API_OPENAI_CHAT,
			 J(OAI_HEAD "'choices':[{'index':0,'delta':{'role':'assistant','content':''},'logprobs':null,'"
				    "finish_reason':null}]}"),
			 &u));
	assert_false(tok(API_OPENAI_CHAT,
			 J(OAI_HEAD "'choices':[{'index':0,'delta':{'role':'assistant'},'finish_reason':null}]}"), &u));
	assert_true(tok(
		API_OPENAI_CHAT,
		J(OAI_HEAD "'choices':[{'index':0,'delta':{'content':'Hello'},'logprobs':null,'finish_reason':null}]}"),
		&u));
	/* A newline alone is text. */
	assert_true(tok(API_OPENAI_CHAT,
			J(OAI_HEAD "'choices':[{'index':0,'delta':{'content':'\\n'},'finish_reason':null}]}"), &u));
	/* Finish-only chunk (vLLM adds stop_reason). */
	assert_false(
		tok(API_OPENAI_CHAT,
		    J(OAI_HEAD
		      "'choices':[{'index':0,'delta':{},'logprobs':null,'finish_reason':'stop','stop_reason':null}]}"),
		    &u));
	assert_false(tok(API_OPENAI_CHAT,
			 J(OAI_HEAD "'choices':[{'index':0,'delta':{'content':null},'finish_reason':'length'}]}"), &u));
	assert_int_equal(u.input_tokens, -1);
	assert_int_equal(u.output_tokens, -1);
	/* Usage-only chunk. */
	assert_false(tok(API_OPENAI_CHAT,
			 J(OAI_HEAD "'choices':[],'usage':{'prompt_tokens':31,'total_tokens':41,'completion_tokens':10,"
				    "'prompt_tokens_details':null}}"),
			 &u));
	assert_int_equal(u.input_tokens, 31);
	assert_int_equal(u.output_tokens, 10);
	assert_false(tok(API_OPENAI_CHAT, "[DONE]", &u));
	assert_int_equal(u.output_tokens, 10);
}

/* OpenAI sends "usage":null on every chunk with include_usage; vLLM's
 * continuous_usage_stats puts counts on every chunk: later values win. */
static void test_openai_chat_usage_variants(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_true(tok(API_OPENAI_CHAT,
			J("{'id':'chatcmpl-1','object':'chat.completion.chunk','created':1,'model':'gpt-4o-mini','"
			  "system_fingerprint':'fp_1','choices':[{'index':0,'delta':{'content':'Hi'},'logprobs':null,'"
			  "finish_reason':null}],'usage':null}"),
			&u));
	assert_int_equal(u.input_tokens, -1);
	assert_true(tok(API_OPENAI_CHAT,
			J(OAI_HEAD "'choices':[{'index':0,'delta':{'content':'A'}}],'usage':{'prompt_tokens':9,'total_"
				   "tokens':10,'completion_tokens':1}}"),
			&u));
	assert_int_equal(u.input_tokens, 9);
	assert_int_equal(u.output_tokens, 1);
	assert_true(tok(API_OPENAI_CHAT,
			J(OAI_HEAD "'choices':[{'index':0,'delta':{'content':'B'}}],'usage':{'prompt_tokens':9,'total_"
				   "tokens':11,'completion_tokens':2}}"),
			&u));
	assert_int_equal(u.output_tokens, 2);
	/* No usage pointer: still classified. */
	assert_true(tok(
		API_OPENAI_CHAT,
		J(OAI_HEAD
		  "'choices':[{'index':0,'delta':{'content':'C'}}],'usage':{'prompt_tokens':1,'completion_tokens':1}}"),
		NULL));
}

static void test_openai_chat_reasoning_and_tools(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	/* vLLM reasoning parser, old and new field names. */
	assert_true(tok(API_OPENAI_CHAT,
			J(OAI_HEAD
			  "'choices':[{'index':0,'delta':{'reasoning_content':'Let me think'},'finish_reason':null}]}"),
			&u));
	assert_true(tok(API_OPENAI_CHAT,
			J(OAI_HEAD "'choices':[{'index':0,'delta':{'reasoning':'Hmm'},'finish_reason':null}]}"), &u));
	assert_true(
		tok(API_OPENAI_CHAT,
		    J(OAI_HEAD
		      "'choices':[{'index':0,'delta':{'content':null,'reasoning_content':'x'},'finish_reason':null}]}"),
		    &u));
	assert_false(
		tok(API_OPENAI_CHAT,
		    J(OAI_HEAD
		      "'choices':[{'index':0,'delta':{'content':'','reasoning_content':null},'finish_reason':null}]}"),
		    &u));
	assert_false(tok(API_OPENAI_CHAT,
			 J(OAI_HEAD "'choices':[{'index':0,'delta':{'reasoning':''},'finish_reason':null}]}"), &u));
	/* Tool call: the header fragment with empty arguments counts too. */
	assert_true(
		tok(API_OPENAI_CHAT,
		    J(OAI_HEAD "'choices':[{'index':0,'delta':{'tool_calls':[{'id':'chatcmpl-tool-1','type':'function',"
			       "'index':0,'function':{'name':'get_weather','arguments':''}}]},'finish_reason':null}]}"),
		    &u));
	assert_true(tok(API_OPENAI_CHAT,
			J(OAI_HEAD "'choices':[{'index':0,'delta':{'tool_calls':[{'index':0,'function':{'arguments':'{"
				   "\\'city\\': \\''}}]},'finish_reason':null}]}"),
			&u));
	assert_false(tok(API_OPENAI_CHAT,
			 J(OAI_HEAD "'choices':[{'index':0,'delta':{'tool_calls':[]},'finish_reason':'tool_calls'}]}"),
			 &u));
	assert_false(tok(API_OPENAI_CHAT,
			 J(OAI_HEAD "'choices':[{'index':0,'delta':{'tool_calls':null},'finish_reason':null}]}"), &u));
}

/* Spacing a server may use, and logprobs.content (an array, not text). */
static void test_openai_chat_shapes(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_true(tok(API_OPENAI_CHAT, J("{'choices': [{'index': 0, 'delta': {'content': 'Hi'}}]}"), &u));
	assert_true(tok(API_OPENAI_CHAT, J("{'choices':[{'delta':{'content' :\n\t'Hi'}}]}"), &u));
	assert_false(tok(API_OPENAI_CHAT, J("{'choices': [{'index': 0, 'delta': {'content' : ''}}]}"), &u));
	assert_false(tok(API_OPENAI_CHAT,
			 J("{'choices':[{'index':0,'delta':{'content':''},'logprobs':{'content':[{'token':'Hi','"
			   "logprob':-0.1,'bytes':[72,105],'top_logprobs':[]}]},'finish_reason':null}]}"),
			 &u));
	assert_true(tok(API_OPENAI_CHAT,
			J("{'choices':[{'index':0,'delta':{'content':'Hi'},'logprobs':{'content':[{'token':'Hi','"
			  "logprob':-0.1}]},'finish_reason':null}]}"),
			&u));
	/* The word "content" as a value is not the key. */
	assert_false(tok(API_OPENAI_CHAT, J("{'choices':[{'delta':{'role':'content'},'finish_reason':null}]}"), &u));
	assert_false(tok(API_OPENAI_CHAT, "", &u));
	assert_false(tok(API_OPENAI_CHAT, "not json", &u));
	assert_false(tok(API_OPENAI_CHAT, J("{'content'"), &u));
	assert_false(tok(API_OPENAI_CHAT, J("{'content':"), &u));
	assert_false(tok(API_OPENAI_CHAT, J("{'content':'"), &u));
	assert_int_equal(u.input_tokens, -1);
}

/* Key-like text inside string values must not fool the scan. */
static void test_escaped_quotes_do_not_fool_scan(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	/* Empty delta.content; a later string value holds "content":"gotcha". */
	assert_false(tok(API_OPENAI_CHAT,
			 "{\"choices\":[{\"delta\":{\"content\":\"\"},\"finish_reason\":\"stop\",\"stop_reason\":\"say "
			 "\\\"content\\\":\\\"gotcha\\\"\"}]}",
			 &u));
	/* Same, with blanks after the colon and the key text first. */
	assert_false(tok(API_OPENAI_CHAT,
			 "{\"note\":\"{\\\"content\\\": \\\"x\\\", \\\"usage\\\": {\\\"prompt_tokens\\\": "
			 "5}}\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}",
			 &u));
	assert_int_equal(u.input_tokens, -1); /* nor the usage scan */
	/* A backslash right before the quote: an escaped backslash (even run)
	 * closes the string, an escaped quote (odd run) does not. */
	assert_false(tok(API_OPENAI_CHAT,
			 "{\"choices\":[{\"delta\":{\"content\":\"\"},\"x\":\"a\\\\\\\"content\\\":\\\"b\"}]}", &u));
	assert_true(tok(API_OPENAI_CHAT, "{\"choices\":[{\"delta\":{\"x\":\"C:\\\\\",\"content\":\"b\"}}]}", &u));
	/* The one place where "content" with both quotes can sit in a string:
	 * a key whose text ends in \"content, here with a non-empty value.
	 * Its opening quote is escaped; the backslash parity rules it out. */
	assert_false(tok(API_OPENAI_CHAT,
			 "{\"choices\":[{\"delta\":{\"content\":\"\"}}],\"say \\\"content\": \"gotcha\"}", &u));
	assert_false(tok(API_OLLAMA_GENERATE, "{\"response\":\"\",\"x\\\"response\":\"gotcha\"}", &u));
	/* ...and an even run is an escaped backslash: the quote is real. */
	assert_true(tok(API_OPENAI_CHAT, "{\"choices\":[{\"delta\":{\"x\":\"C:\\\\\",\"content\":\"b\"}}]}", &u));
	/* Real content that itself quotes an empty content key. */
	assert_true(tok(API_OPENAI_CHAT, "{\"choices\":[{\"delta\":{\"content\":\"\\\"content\\\":\\\"\\\"\"}}]}", &u));
	/* Content that is just an escaped quote is not empty. */
	assert_true(tok(API_OPENAI_CHAT, "{\"choices\":[{\"delta\":{\"content\":\"\\\"\"}}]}", &u));
	/* llama.cpp final event: the echoed prompt holds key-like text. */
	assert_false(tok(API_LLAMACPP,
			 "{\"content\":\"\",\"stop\":true,\"prompt\":\"Reply as "
			 "{\\\"content\\\":\\\"...\\\"}\",\"tokens_predicted\":3,\"tokens_evaluated\":8}",
			 &u));
	assert_int_equal(u.output_tokens, 3);
	/* TGI: "special":true inside the text of a non-special token. */
	assert_true(tok(API_TGI,
			"{\"index\":2,\"token\":{\"id\":9,\"text\":\"\\\"special\\\":true\",\"logprob\":-0.2,"
			"\"special\":false},\"generated_text\":null,\"details\":null}",
			&u));
	/* Anthropic without event names: a text delta quoting another type. */
	assert_true(tok(API_ANTHROPIC,
			"{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"
			"\"\\\"type\\\":\\\"message_start\\\"\"}}",
			&u));
	assert_false(tok(API_ANTHROPIC, "{\"type\":\"ping\",\"x\":\"\\\"type\\\":\\\"content_block_delta\\\"\"}", &u));
}

/* What the hint remembers, and that no hint, however placed, changes an
 * answer (tok() checks every call against the unhinted one). */
static void test_hint(void **state)
{
	struct classify_hint *h = &hints[API_OPENAI_CHAT];
	const char *ev;

	/* The hint follows the key that held the text. */
	*h = (struct classify_hint){ 0 };
	ev = J(OAI_HEAD "'choices':[{'index':0,'delta':{'content':'Hi'},'finish_reason':null}]}");
	assert_true(tok(API_OPENAI_CHAT, ev, NULL));
	assert_int_equal(h->rule, 1);
	assert_int_equal(h->at, strstr(ev, "\"content\"") - ev);
	ev = J(OAI_HEAD "'choices':[{'index':0,'delta':{'reasoning_content':'Hm'},'finish_reason':null}]}");
	assert_true(tok(API_OPENAI_CHAT, ev, NULL));
	assert_int_equal(h->rule, 4); /* answer keys first, then tool calls, then reasoning */
	assert_int_equal(h->at, strstr(ev, "\"reasoning_content\"") - ev);
	/* An event without text leaves it where it was. */
	assert_false(
		tok(API_OPENAI_CHAT, J(OAI_HEAD "'choices':[{'index':0,'delta':{},'finish_reason':'stop'}]}"), NULL));
	assert_int_equal(h->rule, 4);

	/* Placed past the event's end. */
	*h = (struct classify_hint){ 100000, 1 };
	assert_true(tok(API_OPENAI_CHAT, J("{'content':'x'}"), NULL));
	*h = (struct classify_hint){ 100000, 200 };
	assert_true(tok(API_OPENAI_CHAT, J("{'content':'x'}"), NULL));

	/* Placed on a key quoted inside a string value: the backslash before
	 * it still counts, so the probe does not confirm it. */
	ev = J("{'a':'say \\'content\\':\\'x\\'','content':''}");
	*h = (struct classify_hint){ (uint32_t)(strstr(ev, "\"content\\") - ev), 1 };
	assert_false(tok(API_OPENAI_CHAT, ev, NULL));

	/* Occurrences that overlap: the second "content" starts at the quote
	 * that ends the first. Not JSON, but both searches must see the same
	 * occurrences, so one that starts inside an earlier one is visited
	 * too, with a hint on it or not. */
	ev = J("{'x':'content'content':'hi'}");
	*h = (struct classify_hint){ 0 };
	assert_true(tok(API_OPENAI_CHAT, ev, NULL));
	*h = (struct classify_hint){ 13, 1 };
	assert_true(tok(API_OPENAI_CHAT, ev, NULL));
	(void)state;
}

static void test_openai_completions(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_true(tok(API_OPENAI_COMPLETIONS,
			J("{'id':'cmpl-b3','object':'text_completion','created':1718000000,'model':'meta-llama/"
			  "Llama-3.1-8B','choices':[{'index':0,'text':' "
			  "Paris','logprobs':null,'finish_reason':null,'stop_reason':null}]}"),
			&u));
	assert_false(tok(API_OPENAI_COMPLETIONS,
			 J("{'id':'cmpl-b3','object':'text_completion','created':1718000000,'model':'m','choices':[{'"
			   "index':0,'text':'','logprobs':null,'finish_reason':'length','stop_reason':null}]}"),
			 &u));
	/* logprobs has text_offset and tokens, which are not "text". */
	assert_false(tok(API_OPENAI_COMPLETIONS,
			 J("{'choices':[{'index':0,'text':'','logprobs':{'text_offset':[0],'token_logprobs':[-0.1],'"
			   "tokens':['x'],'top_logprobs':null},'finish_reason':'stop'}]}"),
			 &u));
	assert_false(tok(API_OPENAI_COMPLETIONS,
			 J("{'id':'cmpl-b3','object':'text_completion','created':1,'model':'m','choices':[],'usage':{'"
			   "prompt_tokens':5,'total_tokens':21,'completion_tokens':16}}"),
			 &u));
	assert_int_equal(u.input_tokens, 5);
	assert_int_equal(u.output_tokens, 16);
	assert_false(tok(API_OPENAI_COMPLETIONS, "[DONE]", &u));
	/* llama.cpp's /completions alias answers in its native shape. */
	struct usage l = USAGE_UNKNOWN;
	assert_true(
		tok(API_OPENAI_COMPLETIONS, J("{'index':0,'content':' Hi','tokens':[],'stop':false,'id_slot':0}"), &l));
	assert_false(tok(API_OPENAI_COMPLETIONS,
			 J("{'index':0,'content':'','stop':true,'tokens_predicted':4,'tokens_evaluated':6}"), &l));
	assert_int_equal(l.input_tokens, 6);
	assert_int_equal(l.output_tokens, 4);
}

/* Anthropic's event sequence, with and without SSE event names. */
static void test_anthropic_stream(void **state)
{
	static const struct {
		const char *name;
		const char *data;
		bool token;
	} seq[] = {
		{ "message_start",
		  "{'type':'message_start','message':{'id':'msg_01','type':'message','role':'assistant','content':[],'"
		  "model':'claude-sonnet-4-20250514','stop_reason':null,'stop_sequence':null,'usage':{'input_tokens':"
		  "472,'cache_creation_input_tokens':0,'cache_read_input_tokens':0,'output_tokens':2}}}",
		  false },
		{ "content_block_start",
		  "{'type':'content_block_start','index':0,'content_block':{'type':'thinking','thinking':''}}", false },
		{ "ping", "{'type': 'ping'}", false },
		{ "content_block_delta",
		  "{'type':'content_block_delta','index':0,'delta':{'type':'thinking_delta','thinking':'Let me'}}",
		  true },
		{ "content_block_delta",
		  "{'type':'content_block_delta','index':0,'delta':{'type':'signature_delta','signature':'EqQB'}}",
		  false },
		{ "content_block_stop", "{'type':'content_block_stop','index':0}", false },
		{ "content_block_start",
		  "{'type':'content_block_start','index':1,'content_block':{'type':'text','text':''}}", false },
		{ "content_block_delta",
		  "{'type':'content_block_delta','index':1,'delta':{'type':'text_delta','text':'Hello'}}", true },
		{ "content_block_stop", "{'type':'content_block_stop','index':1}", false },
		{ "content_block_start",
		  "{'type':'content_block_start','index':2,'content_block':{'type':'tool_use','id':'toolu_01','name':'"
		  "get_weather','input':{}}}",
		  false },
		/* A tool's input opens with an empty fragment: no content, no token. */
		{ "content_block_delta",
		  "{'type':'content_block_delta','index':2,'delta':{'type':'input_json_delta','partial_json':''}}",
		  false },
		{ "content_block_delta",
		  "{'type':'content_block_delta','index':2,'delta':{'type':'input_json_delta','partial_json':'{\\'"
		  "city\\''}}",
		  true },
		{ "content_block_stop", "{'type':'content_block_stop','index':2}", false },
		{ "message_delta",
		  "{'type':'message_delta','delta':{'stop_reason':'tool_use','stop_sequence':null},'usage':{'output_"
		  "tokens':89}}",
		  false },
		{ "message_stop", "{'type':'message_stop'}", false },
	};
	for (int named = 0; named < 2; named++) {
		struct usage u = USAGE_UNKNOWN;
		for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
			bool t = tok_named(API_ANTHROPIC, named ? seq[i].name : NULL, J(seq[i].data), &u);
			if (t != seq[i].token)
				fail_msg("event %zu (%s, named=%d): got %d", i, seq[i].name, named, t);
			if (i == 0) {
				assert_int_equal(u.input_tokens, 472);
				assert_int_equal(u.output_tokens, -1); /* message_start's 2 is a placeholder */
			}
		}
		assert_int_equal(u.input_tokens, 472);
		assert_int_equal(u.output_tokens, 89);
	}
	/* message_delta may carry input_tokens too (later values win). */
	struct usage u = USAGE_UNKNOWN;
	tok_named(API_ANTHROPIC, "message_delta",
		  J("{'type':'message_delta','delta':{'stop_reason':'end_turn','stop_sequence':null},'usage':{'input_"
		    "tokens':10,'cache_creation_input_tokens':0,'cache_read_input_tokens':0,'output_tokens':7}}"),
		  &u);
	assert_int_equal(u.input_tokens, 10);
	assert_int_equal(u.output_tokens, 7);
	/* Empty text, thinking or input is not a token; neither is a delta
	 * that holds no text at all (a citation). */
	assert_false(tok_named(API_ANTHROPIC, "content_block_delta",
			       J("{'type':'content_block_delta','index':0,'delta':{'type':'text_delta','text':''}}"),
			       NULL));
	assert_false(tok_named(
		API_ANTHROPIC, "content_block_delta",
		J("{'type':'content_block_delta','index':0,'delta':{'type':'thinking_delta','thinking':''}}"), NULL));
	assert_false(tok_named(API_ANTHROPIC, NULL,
			       J("{'type':'content_block_delta','index':0,'delta':{'type':'input_json_delta',"
				 "'partial_json':''}}"),
			       NULL));
	assert_false(
		tok_named(API_ANTHROPIC, "content_block_delta",
			  J("{'type':'content_block_delta','index':0,'delta':{'type':'citations_delta','citation':{"
			    "'type':'char_location','cited_text':'The sky is blue.','document_index':0,"
			    "'start_char_index':0,'end_char_index':16}}}"),
			  NULL));
	/* Text anywhere but in a content_block_delta is not a token. */
	assert_false(tok_named(
		API_ANTHROPIC, "content_block_start",
		J("{'type':'content_block_start','index':1,'content_block':{'type':'text','text':'Hi'}}"), NULL));
	/* The event name decides when present; a generic "message" does not. */
	assert_false(tok_named(API_ANTHROPIC, "ping", J("{'type':'content_block_delta'}"), NULL));
	assert_true(tok_named(API_ANTHROPIC, "message",
			      J("{'type':'content_block_delta','index':0,'delta':{'type':'text_delta','text':'x'}}"),
			      NULL));
	assert_false(tok_named(API_ANTHROPIC, "error",
			       J("{'type':'error','error':{'type':'overloaded_error','message':'Overloaded'}}"), NULL));
}

/* TGI /generate_stream: plain `data:` events with a token object. */
static void test_tgi_stream(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_true(tok(API_TGI,
			J("{'index':1,'token':{'id':22557,'text':'Hello','logprob':-0.48,'special':false},'generated_"
			  "text':null,'details':null}"),
			&u));
	assert_true(tok(API_TGI,
			J("{'index':2,'token':{'id':11,'text':',','logprob':-0.1,'special':false},'generated_text':"
			  "null,'details':null,'top_tokens':[{'id':2,'text':'</s>','logprob':-3.2,'special':true}]}"),
			&u));
	/* special first in the object, and a special token mid-stream. */
	assert_false(tok(API_TGI,
			 J("{'index':3,'token':{'special':true,'id':32000,'text':'<|im_start|>','logprob':0.0},'"
			   "generated_text':null,'details':null}"),
			 &u));
	assert_int_equal(u.output_tokens, -1);
	/* Final event: EOS is special; details carry the counts. */
	assert_false(tok(
		API_TGI,
		J("{'index':20,'token':{'id':2,'text':'</s>','logprob':-0.02,'special':true},'generated_text':'Hello, "
		  "world','details':{'finish_reason':'eos_token','generated_tokens':20,'seed':null,'input_length':7}}"),
		&u));
	assert_int_equal(u.output_tokens, 20);
	assert_int_equal(u.input_tokens, 7);
	/* Final event cut by max_new_tokens: a real token with the details. */
	struct usage v = USAGE_UNKNOWN;
	assert_true(tok(API_TGI,
			J("{'index':16,'token':{'id':13,'text':'.','logprob':-0.5,'special':false},'generated_text':'"
			  "abc.','details':{'finish_reason':'length','generated_tokens':16,'seed':null}}"),
			&v));
	assert_int_equal(v.output_tokens, 16);
	assert_int_equal(v.input_tokens, -1);
	/* No token object at all (an error event). */
	assert_false(tok(API_TGI, J("{'error':'Input validation error','error_type':'validation'}"), &v));
}

/* llama.cpp server /completion stream. */
static void test_llamacpp_stream(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_true(tok(API_LLAMACPP,
			J("{'index':0,'content':' "
			  "The','tokens':[578],'stop':false,'id_slot':0,'tokens_predicted':1,'tokens_evaluated':9}"),
			&u));
	assert_int_equal(u.output_tokens, 1); /* newer servers count as they go */
	assert_true(
		tok(API_LLAMACPP, J("{'content':' sky','stop':false,'id_slot':0,'multimodal':false,'index':0}"), &u));
	assert_false(tok(API_LLAMACPP, J("{'content':'','stop':false,'id_slot':0,'multimodal':false,'index':0}"), &u));
	/* Final event: empty content, counts at top level and in timings. */
	assert_false(tok(
		API_LLAMACPP,
		J("{'index':0,'content':'','tokens':[],'id_slot':0,'stop':true,'model':'gpt-3.5-turbo','tokens_"
		  "predicted':32,'tokens_evaluated':9,'generation_settings':{'n_predict':32,'temperature':0.8,'stop':[]"
		  "},'prompt':'<s> The "
		  "sky','has_new_line':false,'truncated':false,'stop_type':'limit','stopping_word':'','tokens_cached':"
		  "40,'timings':{'prompt_n':9,'prompt_ms':12.3,'prompt_per_token_ms':1.4,'prompt_per_second':731.7,'"
		  "predicted_n':32,'predicted_ms':301.2,'predicted_per_token_ms':9.4,'predicted_per_second':106.2}}"),
		&u));
	assert_int_equal(u.input_tokens, 9);
	assert_int_equal(u.output_tokens, 32);
	/* Only timings (timings_per_token): read from there. */
	struct usage v = USAGE_UNKNOWN;
	assert_true(tok(API_LLAMACPP,
			J("{'content':'x','stop':false,'timings':{'prompt_n':4,'prompt_ms':1.0,'predicted_n':2,'"
			  "predicted_ms':3.0}}"),
			&v));
	assert_int_equal(v.input_tokens, 4);
	assert_int_equal(v.output_tokens, 2);
}

static void test_ollama_generate(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_true(tok(API_OLLAMA_GENERATE,
			J("{'model':'llama3.2','created_at':'2024-07-01T10:00:00.123Z','response':'The','done':false}"),
			&u));
	assert_false(tok(API_OLLAMA_GENERATE,
			 J("{'model':'llama3.2','created_at':'2024-07-01T10:00:00.123Z','response':'','done':false}"),
			 &u));
	assert_true(tok(
		API_OLLAMA_GENERATE,
		J("{'model':'qwen3','created_at':'2025-06-01T10:00:00Z','response':'','thinking':'Okay','done':false}"),
		&u));
	assert_int_equal(u.output_tokens, -1);
	assert_false(tok(API_OLLAMA_GENERATE,
			 J("{'model':'llama3.2','created_at':'2024-07-01T10:00:01Z','response':'','done':true,'done_"
			   "reason':'stop','context':[128006,882,128007,271,1820],'total_duration':10706818083,'load_"
			   "duration':6338219291,'prompt_eval_count':26,'prompt_eval_duration':130079000,'eval_count':"
			   "259,'eval_duration':4232710000}"),
			 &u));
	assert_int_equal(u.input_tokens, 26);
	assert_int_equal(u.output_tokens, 259);
	/* A chat-shaped line is not generate's text. */
	assert_false(tok(API_OLLAMA_GENERATE, J("{'message':{'role':'assistant','content':'x'},'done':false}"), NULL));
}

static void test_ollama_chat(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_true(tok(API_OLLAMA_CHAT,
			J("{'model':'llama3.2','created_at':'2024-07-01T10:00:00.1Z','message':{'role':'assistant','"
			  "content':'The'},'done':false}"),
			&u));
	assert_true(tok(API_OLLAMA_CHAT,
			J("{'model':'qwen3','created_at':'2025-06-01T10:00:00Z','message':{'role':'assistant','content'"
			  ":'','thinking':'Hmm'},'done':false}"),
			&u));
	assert_true(tok(
		API_OLLAMA_CHAT,
		J("{'model':'llama3.2','created_at':'2024-07-01T10:00:00.2Z','message':{'role':'assistant','content':''"
		  ",'tool_calls':[{'function':{'name':'get_weather','arguments':{'city':'Paris'}}}]},'done':false}"),
		&u));
	assert_false(tok(API_OLLAMA_CHAT,
			 J("{'model':'llama3.2','created_at':'2024-07-01T10:00:00.3Z','message':{'role':'assistant','"
			   "content':''},'done':false}"),
			 &u));
	assert_false(tok(
		API_OLLAMA_CHAT,
		J("{'model':'llama3.2','created_at':'2024-07-01T10:00:00.4Z','message':{'role':'assistant','content':''"
		  "},'done_reason':'stop','done':true,'total_duration':4883583458,'load_duration':1334875,'prompt_eval_"
		  "count':26,'prompt_eval_duration':342546000,'eval_count':282,'eval_duration':4535599000}"),
		&u));
	assert_int_equal(u.input_tokens, 26);
	assert_int_equal(u.output_tokens, 282);
}

static void test_unknown_api(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	assert_false(tok(API_UNKNOWN,
			 J("{'choices':[{'delta':{'content':'x'}}],'usage':{'prompt_tokens':1,'completion_tokens':1}}"),
			 &u));
	assert_int_equal(u.input_tokens, -1);
	assert_false(classify_event(API_OPENAI_CHAT, NULL, &u, NULL));
}

static void body(enum api_kind api, const char *json, struct usage *u)
{
	*u = USAGE_UNKNOWN;
	classify_body(api, json, strlen(json), u);
}

/* Whole bodies, per API: the prompt and answer tokens (-1: not reported). */
static void test_bodies(void **state)
{
	static const struct {
		enum api_kind api;
		const char *json;
		int64_t in, out;
	} cases[] = {
		{ API_OPENAI_CHAT,
		  "{'id':'chatcmpl-1','object':'chat.completion','created':1,'model':'m','choices':[{'index':0,'"
		  "message':{"
		  "'role':'assistant','content':'Hi','tool_calls':[]},'logprobs':null,'finish_reason':'stop'}],'usage':"
		  "{'"
		  "prompt_tokens':14,'total_tokens':24,'completion_tokens':10,'prompt_tokens_details':null}}",
		  14, 10 },
		{ API_OPENAI_COMPLETIONS,
		  "{'id':'cmpl-1','object':'text_completion','created':1,'model':'m','choices':[{'index':0,'text':' "
		  "Hi','logprobs':null,'finish_reason':'length'}],'usage':{'prompt_tokens':3,'total_tokens':19,'"
		  "completion_tokens':16}}",
		  3, 16 },
		{ API_ANTHROPIC,
		  "{'id':'msg_01','type':'message','role':'assistant','model':'claude-sonnet-4-20250514','content':[{'"
		  "type':'text','text':'Hi'}],'stop_reason':'end_turn','stop_sequence':null,'usage':{'input_tokens':"
		  "2095,'"
		  "cache_creation_input_tokens':0,'cache_read_input_tokens':0,'output_tokens':503}}",
		  2095, 503 },
		{ API_TGI,
		  "{'generated_text':'Hi there','details':{'finish_reason':'length','generated_tokens':20,'seed':null,"
		  "'prefill':[],'tokens':[]}}",
		  -1, 20 },
		{ API_TGI,
		  "[{'generated_text':'Hi','details':{'finish_reason':'eos_token','generated_tokens':3,'seed':null}}]",
		  -1, 3 },
		{ API_LLAMACPP,
		  "{'index':0,'content':'Hi "
		  "there','tokens':[],'id_slot':0,'stop':true,'model':'m','tokens_predicted':12,"
		  "'tokens_evaluated':5,'timings':{'prompt_n':5,'predicted_n':12}}",
		  5, 12 },
		{ API_OPENAI_COMPLETIONS, "{'content':'Hi','stop':true,'tokens_predicted':2,'tokens_evaluated':4}", 4,
		  2 },
		{ API_OLLAMA_GENERATE,
		  "{'model':'llama3.2','created_at':'2024-07-01T10:00:00Z','response':'The sky is "
		  "blue.','done':true,'done_reason':'stop','context':[1,2,3],'total_duration':5043500667,'load_"
		  "duration':"
		  "5025959,'prompt_eval_count':26,'prompt_eval_duration':325953000,'eval_count':290,'eval_duration':"
		  "4709213000}",
		  26, 290 },
		{ API_OLLAMA_CHAT,
		  "{'model':'llama3.2','created_at':'2024-07-01T10:00:00Z','message':{'role':'assistant','content':'"
		  "Hello!"
		  "'},'done':true,'prompt_eval_count':9,'eval_count':4}",
		  9, 4 },
		/* Broken, empty or count-less bodies leave usage unknown. */
		{ API_OPENAI_CHAT, "{'usage':{'prompt_tokens':", -1, -1 },
		{ API_OPENAI_CHAT, "", -1, -1 },
		{ API_OPENAI_CHAT, "{'error':{'message':'bad','type':'invalid_request_error'}}", -1, -1 },
		{ API_OPENAI_CHAT, "{'usage':{'prompt_tokens':-3,'completion_tokens':'7'}}", -1, -1 },
		{ API_UNKNOWN, "{'usage':{'prompt_tokens':1,'completion_tokens':1}}", -1, -1 },
	};
	struct usage u;
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		body(cases[i].api, J(cases[i].json), &u);
		if (u.input_tokens != cases[i].in || u.output_tokens != cases[i].out)
			fail_msg("case %zu, %s: %lld in, %lld out; not %lld, %lld", i, cases[i].json,
				 (long long)u.input_tokens, (long long)u.output_tokens, (long long)cases[i].in,
				 (long long)cases[i].out);
	}
}

/* Responses API, event by event: the name decides (the `event:` field, or
 * "type" without one), a token delta needs a non-empty "delta" string, the
 * terminal events carry usage and the ending. */
#define RDELTA(t, d) \
	"{'type':'" t "','sequence_number':7,'item_id':'msg_1','output_index':0,'content_index':0,'delta':" d "}"

static void test_responses_stream(void **state)
{
	static const char *const token_types[] = {
		"response.output_text.delta",
		"response.refusal.delta",
		"response.reasoning_text.delta",
		"response.reasoning_summary_text.delta",
		"response.function_call_arguments.delta",
		"response.custom_tool_call_input.delta",
		"response.mcp_call_arguments.delta",
		"response.code_interpreter_call_code.delta",
		"response.audio.transcript.delta",
		"response.audio.delta",
		"response.shell_call_command.delta",
	};
	static const char *const other_types[] = {
		"response.created",
		"response.in_progress",
		"response.queued",
		"response.output_item.added",
		"response.content_part.added",
		"response.output_text.done",
		"response.content_part.done",
		"response.output_item.done",
		"response.reasoning_summary_part.added",
		"response.reasoning_part.added",
		"response.function_call_arguments.done",
		"response.output_text.annotation.added",
		"response.web_search_call.searching",
		"response.shell_call_output_content.delta",
		"response.image_generation_call.partial_image",
		"response.delta",
		"output_text.delta",
		"response.output_text.deltas",
		".delta",
	};
	struct usage u = USAGE_UNKNOWN;
	char buf[512];

	for (size_t i = 0; i < sizeof(token_types) / sizeof(token_types[0]); i++) {
		const char *t = token_types[i];
		snprintf(buf, sizeof(buf), J(RDELTA("%s", "'Hi'")), t);
		assert_true(tok_named(API_OPENAI_RESPONSES, t, buf, &u));
		assert_true(tok(API_OPENAI_RESPONSES, buf, &u)); /* by "type" */
		assert_true(tok_named(API_OPENAI_RESPONSES, "message", buf, &u));
		/* An empty delta is no output. */
		snprintf(buf, sizeof(buf), J(RDELTA("%s", "''")), t);
		assert_false(tok_named(API_OPENAI_RESPONSES, t, buf, &u));
		assert_false(tok(API_OPENAI_RESPONSES, buf, &u));
	}
	for (size_t i = 0; i < sizeof(other_types) / sizeof(other_types[0]); i++) {
		const char *t = other_types[i];
		snprintf(buf, sizeof(buf), J(RDELTA("%s", "'Hi'")), t);
		assert_false(tok_named(API_OPENAI_RESPONSES, t, buf, &u));
		assert_false(tok(API_OPENAI_RESPONSES, buf, &u));
	}
	assert_int_equal(u.input_tokens, -1);
	assert_int_equal(u.outcome, OUTCOME_NONE);

	/* The `event:` name decides over "type"; "type" is the top object's
	 * own member, wherever it stands, not one deeper down. */
	assert_false(tok_named(API_OPENAI_RESPONSES, "response.output_text.done",
			       J(RDELTA("response.output_text.delta", "'Hi'")), &u));
	assert_true(tok(API_OPENAI_RESPONSES,
			J("{'delta':'Hi','item':{'type':'x'},'type':'response.output_text.delta'}"), &u));
	assert_false(tok(API_OPENAI_RESPONSES, J("{'delta':'Hi','item':{'type':'response.output_text.delta'}}"), &u));
	assert_false(tok(API_OPENAI_RESPONSES, J("{'type':'response.output_text.d\\u0065lta','delta':'Hi'}"), &u));
	/* A delta whose text holds what looks like keys. */
	assert_true(tok_named(API_OPENAI_RESPONSES, "response.output_text.delta",
			      J("{'type':'response.output_text.delta','delta':'\\'delta\\':\\'\\''}"), &u));
	assert_false(tok_named(API_OPENAI_RESPONSES, "response.output_text.delta",
			       J("{'type':'response.output_text.delta','text':'\\'delta\\':\\'x\\'','delta':''}"), &u));
	assert_false(tok(API_OPENAI_RESPONSES, "[DONE]", &u));

	/* Usage from response.completed; a lifecycle event's usage is not read. */
	assert_false(
		tok_named(API_OPENAI_RESPONSES, "response.in_progress",
			  J("{'type':'response.in_progress','response':{'status':'in_progress','usage':{'input_tokens':"
			    "99,'output_tokens':99}}}"),
			  &u));
	assert_int_equal(u.input_tokens, -1);
	assert_false(tok_named(
		API_OPENAI_RESPONSES, "response.completed",
		J("{'type':'response.completed','sequence_number':12,'response':{'id':'resp_1','object':'response','"
		  "status':"
		  "'completed','output':[{'type':'message','content':[{'type':'output_text','text':'{\\'usage\\':{}}'}]"
		  "}],"
		  "'usage':{'input_tokens':36,'input_tokens_details':{'cached_tokens':0},'output_tokens':87,'output_"
		  "tokens_details':{'reasoning_tokens':0},'total_tokens':123}}}"),
		&u));
	assert_int_equal(u.input_tokens, 36);
	assert_int_equal(u.output_tokens, 87);
	assert_int_equal(u.outcome, OUTCOME_NONE);
	/* The output's text is skipped whole: escaped quotes with brackets
	 * between them, an escaped backslash right before the closing quote. */
	u = USAGE_UNKNOWN;
	assert_false(tok_named(API_OPENAI_RESPONSES, "response.completed",
			       J("{'type':'response.completed','response':{'output':[{'content':[{'text':'a \\'}]\\' "
				 "b\\\\'},{'text':'\\\\\\'{'}]}],'usage':{'input_tokens':4,'output_tokens':9}}}"),
			       &u));
	assert_int_equal(u.input_tokens, 4);
	assert_int_equal(u.output_tokens, 9);
	/* Without a name, from "type". */
	u = USAGE_UNKNOWN;
	assert_false(tok(API_OPENAI_RESPONSES,
			 J("{'type':'response.completed','response':{'status':'completed','usage':{'input_tokens':5,'"
			   "output_tokens':2}}}"),
			 &u));
	assert_int_equal(u.input_tokens, 5);
	assert_int_equal(u.output_tokens, 2);

	/* vLLM: a length-cut stream ends response.completed, status incomplete. */
	u = USAGE_UNKNOWN;
	tok_named(API_OPENAI_RESPONSES, "response.completed",
		  J("{'type':'response.completed','response':{'status':'incomplete','usage':{'input_tokens':5,'output_"
		    "tokens':16}}}"),
		  &u);
	assert_int_equal(u.outcome, OUTCOME_INCOMPLETE);
	assert_int_equal(u.output_tokens, 16);
	/* response.incomplete, whatever its status says. */
	u = USAGE_UNKNOWN;
	tok_named(API_OPENAI_RESPONSES, "response.incomplete",
		  J("{'type':'response.incomplete','response':{'incomplete_details':{'reason':'max_output_tokens'},"
		    "'usage':{'input_tokens':7,'output_tokens':3}}}"),
		  &u);
	assert_int_equal(u.outcome, OUTCOME_INCOMPLETE);
	assert_int_equal(u.input_tokens, 7);
	/* An error event (either shape), then response.failed with no usage:
	 * failed, and a failure is not undone by a later event. */
	u = USAGE_UNKNOWN;
	tok_named(API_OPENAI_RESPONSES, "error",
		  J("{'type':'error','sequence_number':2,'error':{'code':'unknown-error','message':'x','param':null}}"),
		  &u);
	assert_int_equal(u.outcome, OUTCOME_FAILED);
	u = USAGE_UNKNOWN;
	tok(API_OPENAI_RESPONSES, J("{'type':'error','code':'server_error','message':'x','param':null}"), &u);
	assert_int_equal(u.outcome, OUTCOME_FAILED);
	tok_named(API_OPENAI_RESPONSES, "response.failed",
		  J("{'type':'response.failed','response':{'status':'failed','error':{'code':'server_error'},'usage':"
		    "null}}"),
		  &u);
	assert_int_equal(u.outcome, OUTCOME_FAILED);
	assert_int_equal(u.input_tokens, -1);
	tok_named(API_OPENAI_RESPONSES, "response.incomplete", J("{'type':'response.incomplete','response':{}}"), &u);
	tok_named(API_OPENAI_RESPONSES, "response.completed",
		  J("{'type':'response.completed','response':{'status':'completed'}}"), &u);
	assert_int_equal(u.outcome, OUTCOME_FAILED);
	/* Other APIs have no outcome. */
	u = USAGE_UNKNOWN;
	tok_named(API_ANTHROPIC, "error", J("{'type':'error','error':{'type':'overloaded_error'}}"), &u);
	tok_named(API_OPENAI_CHAT, "response.failed", J("{'type':'response.failed','response':{'status':'failed'}}"),
		  &u);
	assert_int_equal(u.outcome, OUTCOME_NONE);
}
#undef RDELTA

/* Non-streamed Responses bodies: usage at the top, status for the ending. */
static void test_responses_bodies(void **state)
{
	struct usage u;
	body(API_OPENAI_RESPONSES,
	     J("{'id':'resp_1','object':'response','created_at':1,'status':'completed','model':'m','output':[{'type':"
	       "'message','id':'msg_1','status':'completed','role':'assistant','content':[{'type':'output_text','text':"
	       "'Hi \\'status\\':\\'failed\\'','annotations':[]}]}],'usage':{'input_tokens':12,'input_tokens_details':"
	       "{'cached_tokens':0},'output_tokens':34,'output_tokens_details':{'reasoning_tokens':0},'total_tokens':"
	       "46},'error':null,'incomplete_details':null}"),
	     &u);
	assert_int_equal(u.input_tokens, 12);
	assert_int_equal(u.output_tokens, 34);
	assert_int_equal(u.outcome, OUTCOME_NONE);
	body(API_OPENAI_RESPONSES,
	     J("{'id':'resp_1','object':'response','status':'incomplete','incomplete_details':{'reason':'max_output_"
	       "tokens'},'usage':{'input_tokens':3,'output_tokens':16}}"),
	     &u);
	assert_int_equal(u.output_tokens, 16);
	assert_int_equal(u.outcome, OUTCOME_INCOMPLETE);
	body(API_OPENAI_RESPONSES, J("{'id':'resp_1','object':'response','status':'failed','usage':null}"), &u);
	assert_int_equal(u.input_tokens, -1);
	assert_int_equal(u.outcome, OUTCOME_FAILED);
	/* A chat body's usage names are not the Responses ones. */
	body(API_OPENAI_RESPONSES, J("{'usage':{'prompt_tokens':1,'completion_tokens':1},'status':'done'}"), &u);
	assert_int_equal(u.input_tokens, -1);
	assert_int_equal(u.outcome, OUTCOME_NONE);
}

/* Counts are read member by member, as a JSON parser would give them: only
 * the object's own members, the last of a repeated key, integers only, and
 * strings (escapes, braces inside) skipped whole. */
static void test_usage_members(void **state)
{
	struct usage u;
	(void)state;
	/* a nested key of the same name is not the count */
	body(API_OPENAI_CHAT,
	     J("{'usage':{'details':{'prompt_tokens':99,'completion_tokens':98},'prompt_tokens':7,"
	       "'completion_tokens':8}}"),
	     &u);
	assert_int_equal(u.input_tokens, 7);
	assert_int_equal(u.output_tokens, 8);
	body(API_OPENAI_CHAT, J("{'choices':[],'usage':{'details':{'prompt_tokens':99}}}"), &u);
	assert_int_equal(u.input_tokens, -1);
	/* nor is a usage object inside something else */
	body(API_OPENAI_CHAT, J("{'choices':[{'usage':{'prompt_tokens':5,'completion_tokens':6}}]}"), &u);
	assert_int_equal(u.input_tokens, -1);
	assert_int_equal(u.output_tokens, -1);
	/* the last of a repeated key wins */
	body(API_OPENAI_CHAT, J("{'usage':{'prompt_tokens':1,'prompt_tokens':2,'completion_tokens':3}}"), &u);
	assert_int_equal(u.input_tokens, 2);
	/* strings with quotes, braces and commas are skipped whole */
	body(API_OPENAI_CHAT,
	     J("{'note':'a \\'}{,\\' b','usage':{'x':'}','y':[1,{'prompt_tokens':0}],'prompt_tokens':  12 ,"
	       "\n'completion_tokens'\t:\t13}}"),
	     &u);
	assert_int_equal(u.input_tokens, 12);
	assert_int_equal(u.output_tokens, 13);
	/* integers only: no fraction, no exponent, none below zero (-0 is 0),
	 * none past INT64_MAX */
	body(API_OPENAI_CHAT, J("{'usage':{'prompt_tokens':1.0,'completion_tokens':2e3}}"), &u);
	assert_int_equal(u.input_tokens, -1);
	assert_int_equal(u.output_tokens, -1);
	body(API_OPENAI_CHAT, J("{'usage':{'prompt_tokens':-0,'completion_tokens':9223372036854775807}}"), &u);
	assert_int_equal(u.input_tokens, 0);
	assert_int_equal(u.output_tokens, INT64_MAX);
	body(API_OPENAI_CHAT, J("{'usage':{'prompt_tokens':9223372036854775808,'completion_tokens':null}}"), &u);
	assert_int_equal(u.input_tokens, -1);
	assert_int_equal(u.output_tokens, -1);
	/* top-level counts only where the API puts them there */
	body(API_OLLAMA_CHAT, J("{'message':{'eval_count':5},'done':true,'prompt_eval_count':3}"), &u);
	assert_int_equal(u.input_tokens, 3);
	assert_int_equal(u.output_tokens, -1);
	/* and the same over a streamed event */
	u = USAGE_UNKNOWN;
	assert_false(tok(API_OPENAI_CHAT,
			 J("{'choices':[{'delta':{},'usage':{'prompt_tokens':5}}],'usage':{'prompt_tokens':4,"
			   "'completion_tokens':2}}"),
			 &u));
	assert_int_equal(u.input_tokens, 4);
	assert_int_equal(u.output_tokens, 2);
	/* a streamed usage chunk's members read in one walk of the chunk and
	 * one of usage: the last of a repeated usage, its details, and the
	 * server's timings and metrics beside it */
	u = USAGE_UNKNOWN;
	assert_false(tok(API_OPENAI_CHAT,
			 J("{'choices':[],'metrics':{'queue_time_ms':3},'usage':{'prompt_tokens':9},'usage':{"
			   "'prompt_tokens_details':{'cached_tokens':1,'cache_write_tokens':2},'prompt_tokens':6,"
			   "'completion_tokens_details':{'reasoning_tokens':4},'completion_tokens':5},"
			   "'timings':{'prompt_ms':1.5,'predicted_ms':2}}"),
			 &u));
	assert_int_equal(u.input_tokens, 6);
	assert_int_equal(u.output_tokens, 5);
	assert_int_equal(u.cached_tokens, 1);
	assert_int_equal(u.cache_write_tokens, 2);
	assert_int_equal(u.reasoning_tokens, 4);
	assert_int_equal(u.server.queue_ns, 3000000);
	assert_int_equal(u.server.prefill_ns, 1500000);
	assert_int_equal(u.server.decode_ns, 2000000);
	assert_int_equal(u.server.source, SERVER_VLLM);
	/* the strings walked over are skipped a word at a time: an escaped
	 * quote and backslash at each offset of a long id and choice text */
	for (int pad = 0; pad < 24; pad++) {
		char ev[512];
		snprintf(ev, sizeof(ev),
			 "{\"id\":\"%.*s\\\"\\\\%.*s\",\"choices\":[{\"text\":\"%.*s\\\"}{]\"}],"
			 "\"usage\":{\"note\":\"%.*s\\\\\",\"prompt_tokens\":%d,\"completion_tokens\":2}}",
			 pad, "abcdefghijklmnopqrstuvwxyz", 23 - pad, "ABCDEFGHIJKLMNOPQRSTUVWXYZ", pad,
			 "abcdefghijklmnopqrstuvwxyz", 23 - pad, "ABCDEFGHIJKLMNOPQRSTUVWXYZ", pad + 1);
		u = USAGE_UNKNOWN;
		assert_false(tok(API_OPENAI_CHAT, ev, &u));
		assert_int_equal(u.input_tokens, pad + 1);
		assert_int_equal(u.output_tokens, 2);
	}
	/* a usage object cut inside a string, right after a backslash: the
	 * members before it count, the walk ends there */
	u = USAGE_UNKNOWN;
	assert_false(tok(API_OPENAI_CHAT, "{\"usage\":{\"prompt_tokens\":5,\"x\":\"abcdefghijklmnop\\", &u));
	assert_int_equal(u.input_tokens, 5);
	assert_int_equal(u.output_tokens, -1);
}

/* ---- what an event carries: answer, reasoning or a tool call ----------- */

#define CHAT(delta) OAI_HEAD "'choices':[{'index':0,'delta':" delta ",'finish_reason':null}]}"

/* The kind of token an event carries, in order: the hint each leaves is
 * the next one's. */
static void test_kinds(void **state)
{
	static const struct {
		enum api_kind api;
		const char *json;
		enum token_kind kind;
	} cases[] = {
		{ API_OPENAI_CHAT, CHAT("{'content':'Paris'}"), TOKEN_ANSWER },
		{ API_OPENAI_CHAT, CHAT("{'reasoning_content':'Let me'}"), TOKEN_REASONING },
		{ API_OPENAI_CHAT, CHAT("{'reasoning':'Hmm'}"), TOKEN_REASONING },
		{ API_OPENAI_CHAT, CHAT("{'content':null,'reasoning_content':'x'}"), TOKEN_REASONING },
		{ API_OPENAI_CHAT, CHAT("{'content':'','reasoning':'x'}"), TOKEN_REASONING },
		{ API_OPENAI_CHAT,
		  CHAT("{'tool_calls':[{'index':0,'id':'call_1','type':'function','function':{'name':'f','arguments':''"
		       "}}]}"),
		  TOKEN_TOOL },
		/* A refusal is what the user sees: an answer. */
		{ API_OPENAI_CHAT, CHAT("{'refusal':'I cannot help with that'}"), TOKEN_ANSWER },
		{ API_OPENAI_CHAT, CHAT("{'content':null,'refusal':null}"), TOKEN_NONE },
		/* One event with both: the answer wins over a tool call, which wins
		 * over reasoning, whichever key comes first in the event. */
		{ API_OPENAI_CHAT, CHAT("{'reasoning_content':'a','content':'b'}"), TOKEN_ANSWER },
		{ API_OPENAI_CHAT, CHAT("{'reasoning':'a','tool_calls':[{'index':0}]}"), TOKEN_TOOL },
		{ API_OPENAI_CHAT, CHAT("{'tool_calls':[{'index':0}],'content':'b'}"), TOKEN_ANSWER },
		/* The hint sits on reasoning after these; the answer must still win. */
		{ API_OPENAI_CHAT, CHAT("{'reasoning_content':'a'}"), TOKEN_REASONING },
		{ API_OPENAI_CHAT, CHAT("{'reasoning_content':'a','content':'b'}"), TOKEN_ANSWER },
		{ API_OPENAI_CHAT, CHAT("{'reasoning_content':'a'}"), TOKEN_REASONING },
		{ API_OPENAI_CHAT, CHAT("{'reasoning_content':'a','tool_calls':[{'index':0}]}"), TOKEN_TOOL },
		/* Completions, TGI and llama.cpp only ever answer. */
		{ API_OPENAI_COMPLETIONS, "{'id':'c','choices':[{'index':0,'text':'Hi','finish_reason':null}]}",
		  TOKEN_ANSWER },
		{ API_LLAMACPP, "{'content':'Hi','stop':false}", TOKEN_ANSWER },
		{ API_TGI, "{'token':{'id':1,'text':'Hi','special':false}}", TOKEN_ANSWER },
		/* Ollama's thinking, content and tool calls, chat and generate. */
		{ API_OLLAMA_CHAT,
		  "{'model':'qwen3','message':{'role':'assistant','content':'','thinking':'Hmm'},'done':false}",
		  TOKEN_REASONING },
		{ API_OLLAMA_CHAT, "{'model':'qwen3','message':{'role':'assistant','content':'Paris'},'done':false}",
		  TOKEN_ANSWER },
		{ API_OLLAMA_CHAT,
		  "{'model':'qwen3','message':{'role':'assistant','content':'','tool_calls':[{'id':'c1','function':{"
		  "'index':0,'name':'f','arguments':{'city':'Paris'}}}]},'done':false}",
		  TOKEN_TOOL },
		{ API_OLLAMA_GENERATE, "{'model':'qwen3','response':'','thinking':'Okay','done':false}",
		  TOKEN_REASONING },
		{ API_OLLAMA_GENERATE, "{'model':'qwen3','response':'The','done':false}", TOKEN_ANSWER },
		{ API_OLLAMA_GENERATE,
		  "{'model':'qwen3','response':'','tool_calls':[{'function':{'name':'f','arguments':{}}}],'done':"
		  "false}",
		  TOKEN_TOOL },
	};
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		enum token_kind k = tok(cases[i].api, J(cases[i].json), NULL);
		if (k != cases[i].kind)
			fail_msg("case %zu, %s: kind %d, not %d", i, cases[i].json, k, cases[i].kind);
	}
}

static void test_kinds_anthropic(void **state)
{
	(void)state;
	for (int named = 0; named < 2; named++) {
		const char *n = named ? "content_block_delta" : NULL;
		assert_int_equal(
			tok_named(
				API_ANTHROPIC, n,
				J("{'type':'content_block_delta','index':0,'delta':{'type':'thinking_delta','thinking':"
				  "'Let me'}}"),
				NULL),
			TOKEN_REASONING);
		assert_int_equal(tok_named(API_ANTHROPIC, n,
					   J("{'type':'content_block_delta','index':1,'delta':{'type':'text_delta',"
					     "'text':'Paris'}}"),
					   NULL),
				 TOKEN_ANSWER);
		assert_int_equal(tok_named(API_ANTHROPIC, n,
					   J("{'type':'content_block_delta','index':2,'delta':{'type':'input_json_"
					     "delta','partial_json':'{\\'city\\''}}"),
					   NULL),
				 TOKEN_TOOL);
		/* The signature that closes a thinking block is no token. */
		assert_int_equal(tok_named(API_ANTHROPIC, n,
					   J("{'type':'content_block_delta','index':0,'delta':{'type':'signature_"
					     "delta','signature':'EqQBCkgIARAB'}}"),
					   NULL),
				 TOKEN_NONE);
	}
}

static void test_kinds_responses(void **state)
{
	static const struct {
		const char *type;
		enum token_kind kind;
	} kinds[] = {
		{ "response.output_text.delta", TOKEN_ANSWER },
		{ "response.refusal.delta", TOKEN_ANSWER },
		{ "response.audio.transcript.delta", TOKEN_ANSWER },
		{ "response.audio.delta", TOKEN_ANSWER },
		{ "response.reasoning_text.delta", TOKEN_REASONING },
		{ "response.reasoning_summary_text.delta", TOKEN_REASONING },
		{ "response.function_call_arguments.delta", TOKEN_TOOL },
		{ "response.custom_tool_call_input.delta", TOKEN_TOOL },
		{ "response.mcp_call_arguments.delta", TOKEN_TOOL },
		{ "response.code_interpreter_call_code.delta", TOKEN_TOOL },
		{ "response.shell_call_command.delta", TOKEN_TOOL },
	};
	char buf[512];
	(void)state;
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		snprintf(buf, sizeof(buf),
			 J("{'type':'%s','sequence_number':7,'item_id':'it_1','output_index':0,'delta':'x'}"),
			 kinds[i].type);
		if (tok_named(API_OPENAI_RESPONSES, kinds[i].type, buf, NULL) != kinds[i].kind ||
		    tok(API_OPENAI_RESPONSES, buf, NULL) != kinds[i].kind)
			fail_msg("%s: not kind %d", kinds[i].type, kinds[i].kind);
	}
}

#undef CHAT

/* ---- usage details: cached, cache-write and reasoning tokens ----------- */

static void assert_details(const struct usage *u, int64_t in, int64_t out, int64_t cached, int64_t write,
			   int64_t reasoning)
{
	assert_int_equal(u->input_tokens, in);
	assert_int_equal(u->output_tokens, out);
	assert_int_equal(u->cached_tokens, cached);
	assert_int_equal(u->cache_write_tokens, write);
	assert_int_equal(u->reasoning_tokens, reasoning);
}

/* Each from USAGE_UNKNOWN: an event (named `name`, or NULL) or a whole body. */
static void test_usage_details_openai(void **state)
{
	static const struct {
		enum api_kind api;
		bool is_body;
		const char *name, *json;
		int64_t in, out, cached, write, reasoning;
	} cases[] = {
		{ API_OPENAI_CHAT, false, NULL,
		  OAI_HEAD "'choices':[],'usage':{'prompt_tokens':1200,'completion_tokens':900,'total_tokens':2100,"
			   "'prompt_tokens_details':{'cached_tokens':1024},'completion_tokens_details':{'reasoning_"
			   "tokens':640}}}",
		  1200, 900, 1024, -1, 640 },
		{ API_OPENAI_CHAT, false, NULL,
		  OAI_HEAD "'choices':[],'usage':{'prompt_tokens':10,'completion_tokens':2,'prompt_tokens_details':"
			   "{'cached_tokens':0,'cache_write_tokens':8},'completion_tokens_details':null}}",
		  10, 2, 0, 8, -1 },
		/* SGLang puts reasoning_tokens at the top of usage. */
		{ API_OPENAI_CHAT, false, NULL,
		  OAI_HEAD "'choices':[],'usage':{'prompt_tokens':10,'completion_tokens':30,'reasoning_tokens':20,"
			   "'prompt_tokens_details':null}}",
		  10, 30, -1, -1, 20 },
		/* Non-streamed chat and completions bodies. */
		{ API_OPENAI_CHAT, true, NULL,
		  "{'id':'c','object':'chat.completion','choices':[],'usage':{'prompt_tokens':50,'completion_tokens':5,"
		  "'prompt_tokens_details':{'cached_tokens':32},'completion_tokens_details':{'reasoning_tokens':3}}}",
		  50, 5, 32, -1, 3 },
		{ API_OPENAI_COMPLETIONS, true, NULL,
		  "{'id':'c','choices':[],'usage':{'prompt_tokens':9,'completion_tokens':1,'prompt_tokens_details':{"
		  "'cached_tokens':4}}}",
		  9, 1, 4, -1, -1 },
		/* Responses: streamed terminal event and body. */
		{ API_OPENAI_RESPONSES, false, "response.completed",
		  "{'type':'response.completed','sequence_number':9,'response':{'id':'r','status':'completed',"
		  "'usage':{'input_tokens':2000,'input_tokens_details':{'cached_tokens':1024,'cache_write_tokens':"
		  "0},'output_tokens':700,'output_tokens_details':{'reasoning_tokens':640},'total_tokens':2700}}}",
		  2000, 700, 1024, 0, 640 },
		{ API_OPENAI_RESPONSES, true, NULL,
		  "{'id':'r','status':'completed','usage':{'input_tokens':36,'input_tokens_details':{'cached_tokens':"
		  "0},'output_tokens':87,'output_tokens_details':{'reasoning_tokens':12}}}",
		  36, 87, 0, -1, 12 },
		/* llama.cpp native: timings.prompt_n is the uncached part, cache_n
		 * the cached one; tokens_evaluated (the whole prompt) wins. */
		{ API_LLAMACPP, true, NULL,
		  "{'content':'Hi','stop':true,'timings':{'prompt_n':5,'cache_n':40,'predicted_n':3}}", 45, 3, 40, -1,
		  -1 },
		{ API_LLAMACPP, true, NULL,
		  "{'content':'Hi','stop':true,'tokens_evaluated':47,'tokens_predicted':3,'timings':{'prompt_n':7,"
		  "'cache_n':40,'predicted_n':3}}",
		  47, 3, 40, -1, -1 },
	};
	struct usage u = USAGE_UNKNOWN;
	(void)state;
	/* Not reported is -1, not 0. */
	assert_details(&u, -1, -1, -1, -1, -1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		print_message("case %zu\n", i);
		u = USAGE_UNKNOWN;
		if (cases[i].is_body)
			body(cases[i].api, J(cases[i].json), &u);
		else
			tok_named(cases[i].api, cases[i].name, J(cases[i].json), &u);
		assert_details(&u, cases[i].in, cases[i].out, cases[i].cached, cases[i].write, cases[i].reasoning);
	}
}

/* Anthropic's input_tokens leaves out cache reads and writes: prompt
 * tokens are normalised to the whole prompt, as every other API means. */
static void test_usage_details_anthropic(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	(void)state;
	tok_named(API_ANTHROPIC, "message_start",
		  J("{'type':'message_start','message':{'id':'msg_1','type':'message','role':'assistant','content':"
		    "[],'usage':{'input_tokens':12,'cache_creation_input_tokens':100,'cache_read_input_tokens':41203,"
		    "'output_tokens':1}}}"),
		  &u);
	assert_details(&u, 12 + 100 + 41203, -1, 41203, 100, -1);
	tok_named(API_ANTHROPIC, "message_delta",
		  J("{'type':'message_delta','delta':{'stop_reason':'end_turn'},'usage':{'output_tokens':210,"
		    "'output_tokens_details':{'thinking_tokens':150}}}"),
		  &u);
	assert_details(&u, 12 + 100 + 41203, 210, 41203, 100, 150);
	/* A message_delta that repeats the counts (cumulative) changes nothing. */
	tok_named(API_ANTHROPIC, "message_delta",
		  J("{'type':'message_delta','delta':{'stop_reason':'end_turn'},'usage':{'input_tokens':12,"
		    "'cache_creation_input_tokens':100,'cache_read_input_tokens':41203,'output_tokens':210}}"),
		  &u);
	assert_details(&u, 12 + 100 + 41203, 210, 41203, 100, 150);
	/* Without cache fields: input as it is, caching not reported. */
	u = USAGE_UNKNOWN;
	tok_named(API_ANTHROPIC, "message_start",
		  J("{'type':'message_start','message':{'usage':{'input_tokens':472,'output_tokens':1}}}"), &u);
	assert_details(&u, 472, -1, -1, -1, -1);
	/* The non-streamed body. */
	body(API_ANTHROPIC,
	     J("{'id':'msg_01','type':'message','content':[],'usage':{'input_tokens':2095,'cache_creation_input_"
	       "tokens':0,'cache_read_input_tokens':1000,'output_tokens':503}}"),
	     &u);
	assert_details(&u, 3095, 503, 1000, 0, -1);
}

#define CHAT_DELTA(d) OAI_HEAD "'choices':[{'index':0,'delta':" d ",'logprobs':null,'finish_reason':null}]}"

/* Puts the chat hint on a lone reasoning_content, as a reasoning stream
 * leaves it, so that the next event takes the hinted path: the probe
 * finds the reasoning key and one pass must prove that nothing ranked
 * before it holds text. */
static void prime_reasoning(void)
{
	struct classify_hint *h = &hints[API_OPENAI_CHAT];
	*h = (struct classify_hint){ 0 };
	assert_int_equal(tok(API_OPENAI_CHAT, J(CHAT_DELTA("{'reasoning_content':'Hm'}")), NULL), TOKEN_REASONING);
	assert_int_equal(h->rule, 4);
}

/* Each event classified after prime_reasoning(); tok() checks it against
 * the unhinted answer too. */
static enum token_kind after_reasoning(const char *data, struct usage *u)
{
	prime_reasoning();
	return tok(API_OPENAI_CHAT, data, u);
}

/* The hinted reasoning path: the one pass over the answer and tool keys
 * (and usage, timings) must find any of them that holds text, wherever
 * it sits, and nothing that only looks like one. */
static void test_reasoning_fast_path(void **state)
{
	struct usage u = USAGE_UNKNOWN;

	/* The shapes the engines send: vLLM's lone key, SGLang's nulls. */
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x'}")), &u), TOKEN_REASONING);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'role':null,'content':null,'reasoning_content':'x',"
						      "'tool_calls':null}")),
					 &u),
			 TOKEN_REASONING);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'content':'','reasoning_content':'x','tool_calls':[]}")), &u),
			 TOKEN_REASONING);
	/* Reasoning then content in one delta, and content first (the
	 * reasoning key then sits past the hint's offset). */
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x','content':'y'}")), &u), TOKEN_ANSWER);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'content':'y','reasoning_content':'x'}")), &u), TOKEN_ANSWER);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x','content' :\n 'y'}")), &u),
			 TOKEN_ANSWER);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x','refusal':'no'}")), &u), TOKEN_ANSWER);
	/* A tool call beside reasoning, after it and before it. */
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x','tool_calls':[{'index':0,"
						      "'function':{'arguments':'{'}}]}")),
					 &u),
			 TOKEN_TOOL);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'tool_calls':[{'index':0}],'reasoning_content':'x'}")), &u),
			 TOKEN_TOOL);
	/* Text keys outside the delta count too: the pass covers the event. */
	assert_int_equal(after_reasoning(J("{'content':'y','id':'chatcmpl-8f3a','object':'chat.completion.chunk',"
					   "'created':1718000000,'model':'Qwen/Qwen2.5-7B-Instruct','choices':[{"
					   "'index':0,'delta':{'reasoning_content':'x'}}]}"),
					 &u),
			 TOKEN_ANSWER);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x'}") "   "), &u), TOKEN_REASONING);
	/* Keys inside strings: quoted in the reasoning text, as a value, and
	 * a key whose own text ends in \"content. */
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'say \\'content\\':\\'y\\''}")), &u),
			 TOKEN_REASONING);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x','role':'content'}")), &u),
			 TOKEN_REASONING);
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'x','a\\'content':'y'}")), &u),
			 TOKEN_REASONING);
	/* ...and an escaped backslash before a real key's quote. */
	assert_int_equal(after_reasoning(J(CHAT_DELTA("{'reasoning_content':'C:\\\\\\\\','content':'y'}")), &u),
			 TOKEN_ANSWER);
	/* logprobs.content is an array, not text. */
	assert_int_equal(after_reasoning(J(OAI_HEAD "'choices':[{'index':0,'delta':{'reasoning_content':'x'},"
						    "'logprobs':{'content':[{'token':'x','logprob':-0.1}]}}]}"),
					 &u),
			 TOKEN_REASONING);
	assert_int_equal(u.input_tokens, -1);

	/* Usage and timings found in the same pass, on a reasoning chunk. */
	assert_int_equal(after_reasoning(J(OAI_HEAD "'choices':[{'index':0,'delta':{'reasoning_content':'x'}}],"
						    "'usage':{'prompt_tokens':5,'completion_tokens':7}}"),
					 &u),
			 TOKEN_REASONING);
	assert_int_equal(u.input_tokens, 5);
	assert_int_equal(u.output_tokens, 7);
	assert_int_equal(after_reasoning(J(OAI_HEAD "'choices':[{'index':0,'delta':{'reasoning_content':'x'}}],"
						    "'usage':null,'timings':{'prompt_ms':12.5,'predicted_ms':40}}"),
					 &u),
			 TOKEN_REASONING);
	assert_int_equal(u.server.source, SERVER_LLAMACPP);
	assert_int_equal(u.server.prefill_ns, 12500000);
	assert_int_equal(u.server.decode_ns, 40000000);
	/* A "usage" key inside a string is no usage object. */
	u = USAGE_UNKNOWN;
	assert_int_equal(
		after_reasoning(J(CHAT_DELTA("{'reasoning_content':'\\'usage\\':{\\'prompt_tokens\\':9}'}")), &u),
		TOKEN_REASONING);
	assert_int_equal(u.input_tokens, -1);
	(void)state;
}

/* The hint's probe where the key sits right at the hinted offset but
 * holds no text there: the search must go on past it, as without the
 * shortcut. */
static void test_hint_probe_in_place(void **state)
{
	struct classify_hint *h = &hints[API_OPENAI_CHAT];
	const char *ev = J("{'content':'','x':1,'content':'late'}");
	*h = (struct classify_hint){ 1, 1 };
	assert_int_equal(tok(API_OPENAI_CHAT, ev, NULL), TOKEN_ANSWER);
	assert_int_equal(h->at, strstr(ev + 2, "\"content\"") - ev);
	/* In place, but inside a string (odd backslashes before it). */
	ev = J("{'a':'\\'content\\':\\'x\\'','content':''}");
	*h = (struct classify_hint){ (uint32_t)(strstr(ev, "\\\"content") - ev + 1), 1 };
	assert_int_equal(tok(API_OPENAI_CHAT, ev, NULL), TOKEN_NONE);
	(void)state;
}

/* Gemini's paths: Google AI and Vertex AI, the model in the path. */
static void test_gemini_paths(void **state)
{
#define API(s) classify_api(s, strlen(s))
	assert_int_equal(API("/v1beta/models/gemini-2.5-flash:generateContent"), API_GEMINI);
	assert_int_equal(API("/v1beta/models/gemini-2.5-flash:streamGenerateContent"), API_GEMINI_STREAM);
	assert_int_equal(API("/v1/models/gemini-2.0-flash-001:streamGenerateContent"), API_GEMINI_STREAM);
	assert_int_equal(API("/v1alpha/models/gemini-2.5-pro:generateContent"), API_GEMINI);
	assert_int_equal(API("/v1/projects/my-proj/locations/us-central1/publishers/google/models/"
			     "gemini-2.5-pro:generateContent"),
			 API_GEMINI);
	assert_int_equal(API("/v1beta1/projects/p/locations/global/publishers/google/models/"
			     "gemini-2.5-flash:streamGenerateContent"),
			 API_GEMINI_STREAM);
	/* the query is not the caller's path: ?alt=sse is cut before */
	assert_int_equal(classify_api("/v1beta/models/m:streamGenerateContent?alt=sse", 38), API_GEMINI_STREAM);
	/* other methods, other publishers, malformed paths */
	assert_int_equal(API("/v1beta/models/gemini-2.5-flash:countTokens"), API_UNKNOWN);
	assert_int_equal(API("/v1beta/models/gemini-2.5-flash:embedContent"), API_UNKNOWN);
	assert_int_equal(API("/v1beta/models/gemini-2.5-flash"), API_UNKNOWN);
	assert_int_equal(API("/v1beta/models/:generateContent"), API_UNKNOWN);
	assert_int_equal(API("/v1beta/models/a/b:generateContent"), API_UNKNOWN);
	assert_int_equal(API("/v1beta/models/a:b:generateContent"), API_UNKNOWN);
	assert_int_equal(API("/v2/models/m:generateContent"), API_UNKNOWN);
	assert_int_equal(API("/x/v1beta/models/m:generateContent"), API_UNKNOWN);
	assert_int_equal(API("/v1/projects/p/locations/l/publishers/anthropic/models/claude:generateContent"),
			 API_UNKNOWN);
	assert_int_equal(API("/v1/projects//locations/l/publishers/google/models/m:generateContent"), API_UNKNOWN);
	assert_int_equal(API("/v1/projects/p/locations/l/publishers/google/models/m:generateContentx"), API_UNKNOWN);
	assert_int_equal(API(":generateContent"), API_UNKNOWN);
	assert_string_equal(classify_api_name(API_GEMINI), "gemini");
	assert_string_equal(classify_api_name(API_GEMINI_STREAM), "gemini");
	assert_true(classify_streams_json_array(API_GEMINI_STREAM));
	assert_false(classify_streams_json_array(API_GEMINI));
	assert_false(classify_streams_json_array(API_OPENAI_CHAT));
	assert_null(classify_inputs_key(API_GEMINI));

	const char *m;
	const char *v = "/v1/projects/p/locations/l/publishers/google/models/gemini-2.5-pro:streamGenerateContent";
	assert_int_equal(classify_path_model(API_GEMINI_STREAM, v, strlen(v), &m), 14);
	assert_memory_equal(m, "gemini-2.5-pro", 14);
	const char *g = "/v1beta/models/gemini-2.5-flash:generateContent/";
	assert_int_equal(classify_path_model(API_GEMINI, g, strlen(g), &m), 16);
	assert_memory_equal(m, "gemini-2.5-flash", 16);
	/* the API must be the path's; no model for other APIs */
	assert_int_equal(classify_path_model(API_GEMINI_STREAM, g, strlen(g), &m), 0);
	assert_null(m);
	assert_int_equal(classify_path_model(API_OPENAI_CHAT, g, strlen(g), &m), 0);
	const char *odd = "/v1beta/models/a\"b:generateContent";
	assert_int_equal(API(odd), API_GEMINI);
	assert_int_equal(classify_path_model(API_GEMINI, odd, strlen(odd), &m), 0);
#undef API
}

/* Real-shaped Gemini responses: thoughts are reasoning, text the answer,
 * a function call a tool call; the usage of usageMetadata. */
static void test_gemini_events(void **state)
{
	struct usage u = USAGE_UNKNOWN;
	const enum api_kind a = API_GEMINI_STREAM;
	assert_int_equal(tok(a,
			     J("{'candidates': [{'content': {'parts': [{'text': '**Weighing** the options','thought': "
			       "true}],'role': 'model'},'index': 0}],'usageMetadata': {'promptTokenCount': 9,"
			       "'totalTokenCount': 109,'promptTokensDetails': [{'modality': 'TEXT','tokenCount': 9}],"
			       "'thoughtsTokenCount': 100},'modelVersion': 'gemini-2.5-flash','responseId': 'x1'}"),
			     &u),
			 TOKEN_REASONING);
	assert_int_equal(u.input_tokens, 9);
	assert_int_equal(u.output_tokens, 100);
	assert_int_equal(u.reasoning_tokens, 100);
	assert_int_equal(u.cached_tokens, -1);
	/* thought false is an answer; a thought and an answer part: answer */
	assert_int_equal(tok(a, J("{'candidates':[{'content':{'parts':[{'text':'A','thought':false}]}}]}"), &u),
			 TOKEN_ANSWER);
	assert_int_equal(
		tok(a, J("{'candidates':[{'content':{'parts':[{'text':'t','thought':true},{'text':'A'}]}}]}"), &u),
		TOKEN_ANSWER);
	assert_int_equal(tok(a,
			     J("{'candidates': [{'content': {'parts': [{'text': 'The answer is 4.'}],'role': 'model'},"
			       "'finishReason': 'STOP','index': 0}],'usageMetadata': {'promptTokenCount': 9,"
			       "'candidatesTokenCount': 6,'totalTokenCount': 115,'cachedContentTokenCount': 4,"
			       "'thoughtsTokenCount': 100},'modelVersion': 'gemini-2.5-flash'}"),
			     &u),
			 TOKEN_ANSWER);
	assert_int_equal(u.input_tokens, 9);
	assert_int_equal(u.output_tokens, 106);
	assert_int_equal(u.reasoning_tokens, 100);
	assert_int_equal(u.cached_tokens, 4);
	assert_int_equal(u.outcome, OUTCOME_NONE);

	/* tool calls: functionCall, executableCode */
	assert_int_equal(tok(a,
			     J("{'candidates':[{'content':{'parts':[{'functionCall':{'name':'get_weather','args':"
			       "{'location':'Boston'}},'thoughtSignature':'CiQB'}],'role':'model'},'finishReason':"
			       "'STOP'}]}"),
			     NULL),
			 TOKEN_TOOL);
	assert_int_equal(tok(a,
			     J("{'candidates':[{'content':{'parts':[{'executableCode':{'language':'PYTHON','code':"
			       "'print(1)'}}]}}]}"),
			     NULL),
			 TOKEN_TOOL);
	/* no tokens: the empty text with the signature, a function response,
	 * a text that is no string, "text" elsewhere than in a part, usage
	 * alone, a candidate without content (blocked) */
	assert_int_equal(
		tok(a, J("{'candidates':[{'content':{'parts':[{'text':'','thoughtSignature':'c2ln'}]}}]}"), NULL),
		TOKEN_NONE);
	assert_int_equal(
		tok(a,
		    J("{'candidates':[{'content':{'parts':[{'codeExecutionResult':{'outcome':'OUTCOME_OK','output':"
		      "'1'}}]}}]}"),
		    NULL),
		TOKEN_NONE);
	assert_int_equal(tok(a, J("{'candidates':[{'content':{'parts':[{'text':7}]}}]}"), NULL), TOKEN_NONE);
	assert_int_equal(tok(a, J("{'text':'x','candidates':[{'text':'y','content':{'text':'z','parts':[]}}]}"), NULL),
			 TOKEN_NONE);
	assert_int_equal(tok(a, J("{'candidates':[{'finishReason':'SAFETY','index':0}]}"), NULL), TOKEN_NONE);
	/* text that merely looks like a part inside a string */
	assert_int_equal(tok(a,
			     J("{'candidates':[{'content':{'parts':[{'inlineData':{'mimeType':'text/plain','data':"
			       "'{\\'text\\':\\'x\\'}'}}]}}]}"),
			     NULL),
			 TOKEN_NONE);
	/* the second candidate counts too */
	assert_int_equal(tok(a,
			     J("{'candidates':[{'content':{'parts':[{'text':''}]}},{'content':{'parts':[{'text':"
			       "'b'}]},'index':1}]}"),
			     NULL),
			 TOKEN_ANSWER);
	/* the same rules for the non-streamed method, under SSE */
	assert_int_equal(tok(API_GEMINI, J("{'candidates':[{'content':{'parts':[{'text':'A'}]}}]}"), NULL),
			 TOKEN_ANSWER);

	/* thoughts only (no candidates count: proto3 leaves a 0 out) */
	u = USAGE_UNKNOWN;
	tok(a, J("{'usageMetadata':{'promptTokenCount':3,'thoughtsTokenCount':5}}"), &u);
	assert_int_equal(u.output_tokens, 5);
	assert_int_equal(u.reasoning_tokens, 5);
	/* no thoughts: reasoning stays unknown */
	u = USAGE_UNKNOWN;
	tok(a, J("{'usageMetadata':{'promptTokenCount':3,'candidatesTokenCount':2,'totalTokenCount':5}}"), &u);
	assert_int_equal(u.output_tokens, 2);
	assert_int_equal(u.reasoning_tokens, -1);
	/* only a member of the top object's usageMetadata counts */
	u = USAGE_UNKNOWN;
	tok(a, J("{'x':{'usageMetadata':{'promptTokenCount':3}},'usageMetadata':null}"), &u);
	assert_int_equal(u.input_tokens, -1);

	/* an in-stream error */
	u = USAGE_UNKNOWN;
	assert_int_equal(tok(a,
			     J("{'error': {'code': 500,'message': 'An internal error has occurred.','status': "
			       "'INTERNAL'}}"),
			     &u),
			 TOKEN_NONE);
	assert_int_equal(u.outcome, OUTCOME_FAILED);
	u = USAGE_UNKNOWN;
	tok(a, J("{'error':null,'candidates':[]}"), &u);
	assert_int_equal(u.outcome, OUTCOME_NONE);
}

static void test_gemini_bodies(void **state)
{
	struct usage u;
	body(API_GEMINI,
	     J("{'candidates': [{'content': {'parts': [{'text': 'Hi there'}],'role': 'model'},'finishReason': 'STOP',"
	       "'avgLogprobs': -0.1}],'usageMetadata': {'promptTokenCount': 5,'candidatesTokenCount': 2,"
	       "'totalTokenCount': 27,'thoughtsTokenCount': 20},'modelVersion': 'gemini-2.5-flash','responseId': 'r'}"),
	     &u);
	assert_int_equal(u.input_tokens, 5);
	assert_int_equal(u.output_tokens, 22);
	assert_int_equal(u.reasoning_tokens, 20);
	/* a streamed array read whole (not framed): the last counts win */
	body(API_GEMINI_STREAM,
	     J("[{'usageMetadata':{'promptTokenCount':5,'candidatesTokenCount':1}},\r\n{'usageMetadata':{"
	       "'promptTokenCount':5,'candidatesTokenCount':4,'cachedContentTokenCount':2}}]"),
	     &u);
	assert_int_equal(u.input_tokens, 5);
	assert_int_equal(u.output_tokens, 4);
	assert_int_equal(u.cached_tokens, 2);
	body(API_GEMINI, J("{'error':{'code':429,'status':'RESOURCE_EXHAUSTED'}}"), &u);
	assert_int_equal(u.outcome, OUTCOME_FAILED);
}

/* gen_ai.response.model: what each API's answer names, from bytes shaped
 * as the APIs send them (docs/dev/wire-formats.md). */
static const char *resp_model(enum api_kind api, const char *json)
{
	static char out[128];
	strcpy(out, "untouched");
	return classify_resp_model(api, json, strlen(json), out, sizeof(out)) ? out : NULL;
}

static void test_resp_model(void **state)
{
	(void)state;
	/* OpenAI: a top-level model in every chunk and body */
	assert_string_equal(resp_model(API_OPENAI_CHAT, J("{'id':'c1','object':'chat.completion.chunk','created':1,"
							  "'model':'gpt-4o-2024-08-06','choices':[]}")),
			    "gpt-4o-2024-08-06");
	/* Anthropic: message_start's message */
	assert_string_equal(resp_model(API_ANTHROPIC, J("{'type':'message_start','message':{'id':'msg_1','type':"
							"'message','role':'assistant','model':'claude-sonnet-4-5',"
							"'content':[]}}")),
			    "claude-sonnet-4-5");
	/* Gemini: modelVersion, after the candidates (whose role is the value "model") */
	const char *gemini =
		J("{'candidates': [{'content': {'parts': [{'text': 'Hi'}],'role': 'model'},"
		  "'finishReason': 'STOP','index': 0}],'usageMetadata': {'promptTokenCount': 5,"
		  "'candidatesTokenCount': 1,'totalTokenCount': 6},'modelVersion': 'gemini-2.5-flash',"
		  "'responseId': 'mBx3aNbPJ9'}");
	assert_string_equal(resp_model(API_GEMINI_STREAM, gemini), "gemini-2.5-flash");
	assert_string_equal(resp_model(API_GEMINI, gemini), "gemini-2.5-flash");
	/* a function call's args are an object: a "modelVersion" there is not the answer's */
	assert_string_equal(resp_model(API_GEMINI, J("{'candidates': [{'content': {'parts': [{'functionCall': "
						     "{'name': 'pick','args': {'modelVersion': 'v0'}}}],'role': "
						     "'model'}}],'modelVersion': 'gemini-2.5-pro'}")),
			    "gemini-2.5-pro");
	/* the part of a body kept at its end: from inside a string, modelVersion still read */
	assert_string_equal(resp_model(API_GEMINI, J("e long answer.'}],'role': 'model'}}],'modelVersion': "
						     "'gemini-2.0-flash-001'}")),
			    "gemini-2.0-flash-001");
	assert_null(resp_model(API_GEMINI, J("{'candidates': [{'content': {'parts': [{'text': 'Hi'}],'role': "
					     "'model'}}]}")));
	/* Bedrock InvokeModel: the model family's own JSON, Anthropic's with its model */
	assert_string_equal(resp_model(API_BEDROCK_INVOKE,
				       J("{'type':'message_start','message':{'id':'msg_bdrk_01','type':'message',"
					 "'role':'assistant','model':'claude-3-haiku-20240307','content':[]}}")),
			    "claude-3-haiku-20240307");
	assert_null(resp_model(API_BEDROCK_INVOKE, J("{'generation':'Hi','prompt_token_count':5}"))); /* Llama */
	/* Bedrock Converse names no model; a tool's input object is not one */
	assert_null(resp_model(API_BEDROCK_CONVERSE, J("{'output':{'message':{'role':'assistant','content':[{"
						       "'toolUse':{'toolUseId':'t1','name':'pick','input':"
						       "{'model':'x'}}}]}},'stopReason':'tool_use'}")));
	/* "model" as a value, not a key, is passed over */
	assert_string_equal(resp_model(API_OLLAMA_CHAT, J("{'role':'model','model':'qwen3'}")), "qwen3");
	/* not plain visible ASCII, escaped, empty or too long: none, out untouched */
	char out[8] = "same";
	assert_false(classify_resp_model(API_OPENAI_CHAT, J("{'model':'12345678'}"), 20, out, sizeof(out)));
	assert_string_equal(out, "same");
	assert_true(classify_resp_model(API_OPENAI_CHAT, J("{'model':'1234567'}"), 19, out, sizeof(out)));
	assert_string_equal(out, "1234567");
	assert_null(resp_model(API_OPENAI_CHAT, J("{'model':'a\\u00e9'}")));
	assert_null(resp_model(API_OPENAI_CHAT, J("{'model':'a b'}")));
	assert_null(resp_model(API_OPENAI_CHAT, J("{'model':''}")));
	assert_null(resp_model(API_OPENAI_CHAT, J("{'model':'unterminated")));
	assert_null(resp_model(API_OPENAI_CHAT, J("{'model':")));
	/* where a body names it: Gemini's at its end */
	assert_true(classify_resp_model_at_end(API_GEMINI));
	assert_false(classify_resp_model_at_end(API_OPENAI_CHAT));
	assert_false(classify_resp_model_at_end(API_BEDROCK_INVOKE));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_api_paths),
		cmocka_unit_test(test_usage_members),
		cmocka_unit_test(test_api_names),
		cmocka_unit_test(test_batch_usage),
		cmocka_unit_test(test_openai_chat_stream),
		cmocka_unit_test(test_openai_chat_usage_variants),
		cmocka_unit_test(test_openai_chat_reasoning_and_tools),
		cmocka_unit_test(test_openai_chat_shapes),
		cmocka_unit_test(test_escaped_quotes_do_not_fool_scan),
		cmocka_unit_test(test_hint),
		cmocka_unit_test(test_openai_completions),
		cmocka_unit_test(test_anthropic_stream),
		cmocka_unit_test(test_tgi_stream),
		cmocka_unit_test(test_llamacpp_stream),
		cmocka_unit_test(test_ollama_generate),
		cmocka_unit_test(test_ollama_chat),
		cmocka_unit_test(test_unknown_api),
		cmocka_unit_test(test_bodies),
		cmocka_unit_test(test_responses_stream),
		cmocka_unit_test(test_responses_bodies),
		cmocka_unit_test(test_kinds),
		cmocka_unit_test(test_kinds_anthropic),
		cmocka_unit_test(test_kinds_responses),
		cmocka_unit_test(test_usage_details_openai),
		cmocka_unit_test(test_usage_details_anthropic),
		cmocka_unit_test(test_reasoning_fast_path),
		cmocka_unit_test(test_hint_probe_in_place),
		cmocka_unit_test(test_gemini_paths),
		cmocka_unit_test(test_gemini_events),
		cmocka_unit_test(test_gemini_bodies),
		cmocka_unit_test(test_resp_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
