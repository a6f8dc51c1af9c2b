/*
 * sim_request.c — what the body of a generation request asks for, read in
 * each API's own field names: the prompt's text (its length gives the
 * prompt tokens; its prefixes are what --prefix-cache remembers), the
 * output limit, the reasoning asked for, the tool a tool call calls.
 */
#include "sim_api.h"

#include <event2/buffer.h>
#include <jansson.h>

#include <string.h>

/* Appends the text of a message content (a string, or an array of parts)
 * to `text`: the prompt's text, whose length gives the prompt tokens and
 * whose prefixes the --prefix-cache model remembers. */
static void content_text(const json_t *c, struct evbuffer *text)
{
	size_t i;
	json_t *part;

	if (json_is_string(c)) {
		evbuffer_add(text, json_string_value(c), json_string_length(c));
		return;
	}
	if (!json_is_array(c))
		return;
	json_array_foreach (c, i, part) {
		if (json_is_object(part))
			part = json_object_get(part, "text");
		if (json_is_string(part))
			evbuffer_add(text, json_string_value(part), json_string_length(part));
	}
}

static void messages_text(const json_t *msgs, struct evbuffer *text)
{
	size_t i;
	json_t *m;

	if (!json_is_array(msgs))
		return;
	json_array_foreach (msgs, i, m)
		content_text(json_object_get(m, "content"), text);
}

void prompt_text(enum sim_endpoint ep, const json_t *req, struct evbuffer *text)
{
	switch (ep) {
	case EP_CHAT:
	case EP_OLLAMA_CHAT: messages_text(json_object_get(req, "messages"), text); break;
	case EP_MESSAGES:
		content_text(json_object_get(req, "system"), text);
		messages_text(json_object_get(req, "messages"), text);
		break;
	case EP_COMPLETIONS: content_text(json_object_get(req, "prompt"), text); break;
	case EP_RESPONSES: {
		/* "input" is a string, or a list of message items (content a
		 * string or parts) and parts; "instructions" a string. */
		const json_t *in = json_object_get(req, "input");
		content_text(json_object_get(req, "instructions"), text);
		content_text(in, text);
		messages_text(in, text);
		break;
	}
	case EP_OLLAMA_GENERATE:
		content_text(json_object_get(req, "system"), text);
		content_text(json_object_get(req, "prompt"), text);
		break;
	case EP_LLAMACPP: content_text(json_object_get(req, "prompt"), text); break;
	case EP_TGI:
	case EP_TGI_STREAM: content_text(json_object_get(req, "inputs"), text); break;
	case EP_GEMINI:
	case EP_GEMINI_STREAM: {
		/* systemInstruction.parts[].text, contents[].parts[].text */
		const json_t *c = json_object_get(req, "contents"), *m;
		size_t i;
		content_text(json_object_get(json_object_get(req, "systemInstruction"), "parts"), text);
		if (json_is_array(c))
			json_array_foreach (c, i, m)
				content_text(json_object_get(m, "parts"), text);
		break;
	}
	case EP_BEDROCK_CONVERSE: /* system and content: lists of {"text"} blocks */
	case EP_BEDROCK_INVOKE:
		content_text(json_object_get(req, "system"), text);
		messages_text(json_object_get(req, "messages"), text);
		break;
	}
}

/*
 * The request's own output limit. Returns 0 and sets *limit (-1 when the
 * request sets none), or -1 with *why for a limit no server would accept.
 */
int output_limit(enum sim_endpoint ep, const json_t *req, int64_t *limit, const char **why)
{
	const json_t *v = NULL;

	*limit = -1;
	switch (ep) {
	case EP_CHAT:
		v = json_object_get(req, "max_completion_tokens");
		if (v == NULL || json_is_null(v))
			v = json_object_get(req, "max_tokens");
		break;
	case EP_COMPLETIONS:
	case EP_MESSAGES: v = json_object_get(req, "max_tokens"); break;
	case EP_RESPONSES: v = json_object_get(req, "max_output_tokens"); break;
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE:
		v = json_object_get(json_object_get(req, "options"), "num_predict");
		/* Ollama: a negative num_predict means "until the model stops". */
		if (json_is_integer(v) && json_integer_value(v) < 0)
			return 0;
		break;
	case EP_LLAMACPP:
		v = json_object_get(req, "n_predict");
		/* llama.cpp: -1 is "no limit" */
		if (json_is_integer(v) && json_integer_value(v) < 0)
			return 0;
		break;
	case EP_TGI:
	case EP_TGI_STREAM: v = json_object_get(json_object_get(req, "parameters"), "max_new_tokens"); break;
	case EP_GEMINI:
	case EP_GEMINI_STREAM: v = json_object_get(json_object_get(req, "generationConfig"), "maxOutputTokens"); break;
	case EP_BEDROCK_CONVERSE: v = json_object_get(json_object_get(req, "inferenceConfig"), "maxTokens"); break;
	case EP_BEDROCK_INVOKE: v = json_object_get(req, "max_tokens"); break;
	}
	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0) {
		*why = "max_tokens must be a non-negative integer";
		return -1;
	}
	*limit = json_integer_value(v);
	return 0;
}

/* Reasoning tokens when a request asks for reasoning without a count. */
#define SIM_REASONING_DEFAULT 32

/* An effort level as reasoning tokens: -1 when v says nothing. */
static int64_t effort_tokens(const json_t *v)
{
	static const struct {
		const char *name;
		int64_t tokens;
	} levels[] = {
		{ "none", 0 }, { "minimal", 8 }, { "low", 16 }, { "medium", 32 }, { "high", 64 }, { "xhigh", 128 },
	};

	if (json_is_true(v))
		return SIM_REASONING_DEFAULT;
	if (json_is_false(v))
		return 0;
	if (!json_is_string(v))
		return -1;
	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
		if (strcmp(json_string_value(v), levels[i].name) == 0)
			return levels[i].tokens;
	}
	return SIM_REASONING_DEFAULT;
}

/*
 * What the request's own fields say about reasoning: -1 nothing, 0 off,
 * else a number of tokens. Chat `reasoning_effort`; Responses
 * `reasoning.effort` (a `reasoning` object without one: the default);
 * Anthropic `thinking.type` "enabled" (at most `budget_tokens`) or
 * "disabled"; Ollama `think` (true, false or a level).
 */
int64_t request_reasoning(enum sim_endpoint ep, const json_t *req)
{
	const json_t *o, *v;

	switch (ep) {
	case EP_CHAT: return effort_tokens(json_object_get(req, "reasoning_effort"));
	case EP_RESPONSES:
		o = json_object_get(req, "reasoning");
		if (!json_is_object(o))
			return -1;
		v = json_object_get(o, "effort");
		return v == NULL || json_is_null(v) ? SIM_REASONING_DEFAULT : effort_tokens(v);
	case EP_BEDROCK_CONVERSE: /* Claude's thinking, passed through additionalModelRequestFields */
	case EP_BEDROCK_INVOKE:
	case EP_MESSAGES: {
		const char *type;

		o = json_object_get(req, "thinking");
		if (o == NULL)
			o = json_object_get(json_object_get(req, "additionalModelRequestFields"), "thinking");
		type = json_string_value(json_object_get(o, "type"));
		if (type == NULL)
			return -1;
		if (strcmp(type, "disabled") == 0)
			return 0;
		v = json_object_get(o, "budget_tokens");
		if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < SIM_REASONING_DEFAULT)
			return json_integer_value(v);
		return SIM_REASONING_DEFAULT;
	}
	case EP_OLLAMA_CHAT:
	case EP_OLLAMA_GENERATE: return effort_tokens(json_object_get(req, "think"));
	case EP_GEMINI:
	case EP_GEMINI_STREAM: {
		/* generationConfig.thinkingConfig.thinkingBudget: 0 off, -1
		 * dynamic (the default), else at most that many */
		o = json_object_get(json_object_get(req, "generationConfig"), "thinkingConfig");
		if (!json_is_object(o))
			return -1;
		v = json_object_get(o, "thinkingBudget");
		if (json_is_integer(v) && json_integer_value(v) == 0)
			return 0;
		if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < SIM_REASONING_DEFAULT)
			return json_integer_value(v);
		return SIM_REASONING_DEFAULT;
	}
	case EP_COMPLETIONS:
	case EP_LLAMACPP:
	case EP_TGI:
	case EP_TGI_STREAM: return 0; /* no field carries reasoning */
	}
	return -1;
}

/*
 * The tool a tool-call answer calls, or NULL when the request offers none
 * (or says "none"): the one `tool_choice` names, else the first of `tools`,
 * else "sim_tool" (a tool call forced by x-sim-tool-call or --tool-calls).
 */
const char *request_tool(enum sim_endpoint ep, const json_t *req)
{
	const json_t *tools = json_object_get(req, "tools"), *choice = json_object_get(req, "tool_choice"), *t0;
	const char *name;

	if (!json_is_array(tools) || json_array_size(tools) == 0)
		return NULL;
	if (json_is_string(choice) && strcmp(json_string_value(choice), "none") == 0)
		return NULL;
	if (json_is_object(choice)) {
		const char *type = json_string_value(json_object_get(choice, "type"));

		if (type != NULL && strcmp(type, "none") == 0)
			return NULL;
		/* chat {"type":"function","function":{"name"}}; Responses and
		 * Anthropic {"type":"function"|"tool","name"} */
		name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
		if (name == NULL)
			name = json_string_value(json_object_get(choice, "name"));
		if (name != NULL && *name != '\0')
			return name;
	}
	t0 = json_array_get(tools, 0);
	if (ep == EP_GEMINI || ep == EP_GEMINI_STREAM) /* tools[0].functionDeclarations[0].name */
		t0 = json_array_get(json_object_get(t0, "functionDeclarations"), 0);
	name = json_string_value(json_object_get(json_object_get(t0, "function"), "name")); /* chat, Ollama */
	if (name == NULL)
		name = json_string_value(json_object_get(t0, "name")); /* Responses, Anthropic */
	return name != NULL && *name != '\0' ? name : "sim_tool";
}

bool endpoint_has_tools(enum sim_endpoint ep)
{
	return ep == EP_CHAT || ep == EP_RESPONSES || ep == EP_MESSAGES || ep == EP_OLLAMA_CHAT || ep == EP_GEMINI ||
	       ep == EP_GEMINI_STREAM;
}
