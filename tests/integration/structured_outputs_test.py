#!/usr/bin/env python3
"""Structured outputs end to end with the official `openai` client: every reply to a varied set of
JSON Schemas (objects, enums, unions, nested and top-level arrays, anyOf, $defs recursion,
prefixItems, Unicode), sampled greedily and at temperature 1, parses and validates against its
schema with Python's `jsonschema`; json_object replies are objects; forced tool calls
(tool_choice named and "required", streamed and not) call the tool with arguments that validate.
The server runs the default model with Qwen2.5's chat template, which renders tools (Hermes
<tool_call> format); two more servers run Llama 3.1's template (JSON calls) and Mistral Nemo's
([TOOL_CALLS]), whose forced calls come back parsed in their family's format and whose call ids
the template then accepts in the next turn.

usage: structured_outputs_test.py --binary build/bin/strata --model MODEL.gguf
"""
import argparse
import json
import os
import re
import sys

import jsonschema
import openai

from harness import check, summary
from http_server_test import QWEN_TEMPLATE, SERVED_NAME, WEATHER_TOOL, Server, expect_api_error

SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40}},
                   "required": ["query"], "additionalProperties": False}}}

# (prompt, schema)
CASES = [
    ("Describe a person.", {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                       "email": {"type": "string", "maxLength": 30}},
        "required": ["name", "age"], "additionalProperties": False}),
    ("Report the job status.", {
        "type": "object",
        "properties": {"status": {"enum": ["ok", "error"]}, "retry": {"type": "boolean"},
                       "reason": {"type": ["string", "null"], "maxLength": 20}},
        "required": ["status", "retry", "reason"], "additionalProperties": False}),
    ("Give up to three points on a line.", {
        "type": "object",
        "properties": {"points": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"], "additionalProperties": False}}},
        "required": ["points"], "additionalProperties": False}),
    ("List a few small numbers.", {"type": "array", "items": {"type": "integer"},
                                   "minItems": 2, "maxItems": 5}),
    ("Pick an animal.", {"anyOf": [
        {"type": "object", "properties": {"cat": {"const": True}}, "required": ["cat"],
         "additionalProperties": False},
        {"type": "object", "properties": {"dog": {"type": "string", "maxLength": 10}},
         "required": ["dog"], "additionalProperties": False}]}),
    ("Give a version tag.", {"type": "array", "prefixItems": [{"const": "v1"}, {"type": "integer"}],
                             "items": False}),
    ("Name a city.", {"type": "string", "minLength": 3, "maxLength": 12}),
    ("Price a coffee.", {
        "type": "object",
        "properties": {"price": {"type": "number"}, "currency": {"enum": ["EUR", "USD"]}},
        "required": ["price", "currency"], "additionalProperties": False}),
    ("Say hello in Chinese.", {
        "type": "object", "properties": {"greeting": {"type": "string", "maxLength": 15}},
        "required": ["greeting"], "additionalProperties": False}),
    ("Draw a tiny tree.", {
        "$defs": {
            "leaf": {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"],
                     "additionalProperties": False},
            "node": {"type": "object", "properties": {
                "v": {"type": "integer"},
                "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/leaf"}}},
                "required": ["v", "kids"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}),
]
# A recursive schema has no bound on depth: a model may nest until max_tokens (finish_reason
# "length", as with any engine); whatever ends with "stop" validates.
RECURSIVE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"},
    "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
SAMPLINGS = [{"temperature": 0}, {"temperature": 1, "seed": 1}, {"temperature": 1, "seed": 2}]
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "chat_templates")
# (family, template, the call ids the server gives (Mistral's templates require 9 alphanumerics),
#  what the model writes for a call of `search`, as its logprobs' tokens show)
TOOL_FORMATS = [
    ("llama3_json", os.path.join(TEMPLATES, "meta-llama-Llama-3.1-8B-Instruct.jinja"),
     r"call_[A-Za-z0-9]{24}", r'\{"name": "search", "parameters": \{.*\}\}'),
    ("mistral", os.path.join(TEMPLATES, "mistralai-Mistral-Nemo-Instruct-2407.jinja"),
     r"[A-Za-z0-9]{9}", r'\[TOOL_CALLS\]\[\{"name": "search", "arguments": \{.*\}\}\]'),
]


def check_tool_call_format(binary, model, family, template, id_pattern, written_pattern):
    """Forced tool calls on a server running `template`: the grammar writes the call in the
    family's format and the server parses it back into tool_calls, whole and streamed; the call
    and its result then render in the next turn (Mistral's template raises on other ids)."""
    messages = [{"role": "user", "content": "What's the weather in Oslo?"}]
    tools = [WEATHER_TOOL, SEARCH_TOOL]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    named = {"type": "function", "function": {"name": "search"}}

    def test():
        server = Server(binary, model, ["--chat-template-file", template])
        try:
            run(server.client())
        finally:
            server.stop()

    def run(client):
        def create(**kwargs):
            return client.chat.completions.create(model=SERVED_NAME, messages=messages,
                                                  tools=tools, temperature=0, max_tokens=200,
                                                  **kwargs)

        calls = []
        for tool_choice in (named, "required"):
            choice = create(tool_choice=tool_choice, logprobs=True).choices[0]
            assert choice.finish_reason == "tool_calls", (family, tool_choice, choice)
            if tool_choice == named:
                written = "".join(t.token for t in choice.logprobs.content)
                assert re.match(written_pattern, written), (family, written)
            assert not choice.message.content, (family, choice.message)
            (call,) = choice.message.tool_calls
            assert re.fullmatch(id_pattern, call.id), (family, call.id)
            assert call.type == "function"
            if tool_choice == named:
                assert call.function.name == "search", (family, call)
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
            calls.append(call)
        names, ids, arguments, finish = [], [], "", None
        for chunk in create(tool_choice=named, stream=True):
            if not chunk.choices:
                continue
            finish = chunk.choices[0].finish_reason or finish
            assert not chunk.choices[0].delta.content, (family, chunk)
            for call in chunk.choices[0].delta.tool_calls or []:
                if call.function.name:
                    names.append(call.function.name)
                if call.id:
                    ids.append(call.id)
                arguments += call.function.arguments or ""
        assert names == ["search"] and finish == "tool_calls", (family, names, finish)
        assert len(ids) == 1 and re.fullmatch(id_pattern, ids[0]), (family, ids)
        assert json.loads(arguments) == json.loads(calls[0].function.arguments), (family, arguments)
        # The next turn: the call as the client sends it back, and its result.
        call = calls[0]
        follow_up = messages + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "{\"results\": []}"}]
        r = client.chat.completions.create(model=SERVED_NAME, messages=follow_up, tools=tools,
                                           temperature=0, max_tokens=4)
        assert r.choices[0].finish_reason in ("length", "stop", "tool_calls"), (family, r)

    check(f"forced tool calls in the {family} format", test)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    server = Server(args.binary, args.model, ["--chat-template-file", QWEN_TEMPLATE])
    client = server.client()

    def create(**kwargs):
        kwargs.setdefault("max_tokens", 300)
        return client.chat.completions.create(model=SERVED_NAME, **kwargs)

    def test_json_schema_replies_parse_and_validate():
        replies = 0
        for prompt, schema in CASES:
            jsonschema.Draft202012Validator.check_schema(schema)
            for sampling in SAMPLINGS:
                r = create(messages=[{"role": "user", "content": prompt}], response_format={
                    "type": "json_schema", "json_schema": {"name": "t", "schema": schema,
                                                           "strict": True}}, **sampling)
                choice = r.choices[0]
                assert choice.finish_reason == "stop", (prompt, sampling, choice)
                value = json.loads(choice.message.content)
                jsonschema.validate(value, schema)
                replies += 1
        assert replies == len(CASES) * len(SAMPLINGS)
        for sampling in SAMPLINGS:
            r = create(messages=[{"role": "user", "content": "Draw a tree."}], response_format={
                "type": "json_schema", "json_schema": {"name": "t", "schema": RECURSIVE}},
                **sampling)
            if r.choices[0].finish_reason == "stop":
                jsonschema.validate(json.loads(r.choices[0].message.content), RECURSIVE)

    def test_json_schema_streamed_equals_whole():
        prompt, schema = CASES[0]
        kwargs = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                  "response_format": {"type": "json_schema",
                                      "json_schema": {"name": "t", "schema": schema}}}
        whole = create(**kwargs).choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in create(stream=True, **kwargs)
                           if c.choices)
        assert streamed == whole, (streamed, whole)

    def test_json_object_replies_are_objects():
        for sampling in SAMPLINGS:
            r = create(messages=[{"role": "user", "content": "Describe the weather."}],
                       response_format={"type": "json_object"}, **sampling)
            assert r.choices[0].finish_reason == "stop", r.choices[0]
            assert isinstance(json.loads(r.choices[0].message.content), dict)

    def test_forced_tool_calls():
        messages = [{"role": "user", "content": "What's the weather in Oslo?"}]
        tools = [WEATHER_TOOL, SEARCH_TOOL]
        named = {"type": "function", "function": {"name": "search"}}
        for sampling in SAMPLINGS:
            r = create(messages=messages, tools=tools, tool_choice=named, **sampling)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls", choice
            (call,) = choice.message.tool_calls
            assert call.function.name == "search" and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments),
                                SEARCH_TOOL["function"]["parameters"])
            r = create(messages=messages, tools=tools, tool_choice="required", **sampling)
            (call,) = r.choices[0].message.tool_calls
            by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])
        names, arguments = [], ""
        for chunk in create(messages=messages, tools=tools, tool_choice=named, temperature=0,
                            stream=True):
            for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                names.append(call.function.name)
                arguments += call.function.arguments or ""
        assert names == ["search"], names
        json.loads(arguments)

    def test_schemas_we_cannot_enforce_are_400():
        for schema, param in (({"type": "string", "pattern": "^a"}, "response_format"),
                              ({"type": "integer", "minimum": 3}, "response_format")):
            expect_api_error(lambda: create(
                messages=[{"role": "user", "content": "x"}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "t", "schema": schema}}),
                openai.BadRequestError, 400, param)

    try:
        check("json_schema replies parse and validate", test_json_schema_replies_parse_and_validate)
        check("json_schema streamed equals whole", test_json_schema_streamed_equals_whole)
        check("json_object replies are objects", test_json_object_replies_are_objects)
        check("forced tool calls", test_forced_tool_calls)
        check("schemas we cannot enforce are 400", test_schemas_we_cannot_enforce_are_400)
    finally:
        server.stop()
    for tool_format in TOOL_FORMATS:
        check_tool_call_format(args.binary, args.model, *tool_format)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
