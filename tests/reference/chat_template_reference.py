#!/usr/bin/env python3
"""Expected renderings for the Jinja chat-template tests (tests/unit/tokenizer/jinja_test.cpp and
chat_template_test.cpp), computed with transformers' own renderer (render_jinja_template: Jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls and its globals).

Templates: every tests/data/chat_templates/*.jinja (the templates popular models ship on the Hub),
Strata's fallback templates (src/tokenizer/templates/*.jinja) and the GGUF model's own. Each is
rendered over conversations with and without tools, tool calls and tool results, with
add_generation_prompt off and on; a template that raises records the error instead.
strftime_now() is pinned to NOW so the C++ side can render the same dates.

Writes OUT_DIR/chat_templates/cases.json:
  {"now": unix seconds,
   "templates": [{"name", "source", "bos", "eos",
                  "cases": [{"messages", "tools"?, "kwargs", "add_generation_prompt",
                             "rendered" | "error"}]}],
   "snippets": [{"source", "context", "rendered" | "error"}]}
"""

import argparse
import datetime
import glob
import json
import os

import gguf
import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

NOW = 1764000000  # 2025-11-24, pinned for strftime_now()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# bos/eos texts per family (only their presence in the output matters to the comparison).
SPECIAL_TOKENS = [
    ("Llama-2", "<s>", "</s>"), ("Llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("llama3", "<|begin_of_text|>", "<|eot_id|>"), ("firefunction", "<|begin_of_text|>", "<|eot_id|>"),
    ("functionary", "<|begin_of_text|>", "<|eot_id|>"), ("Hermes", "<|begin_of_text|>", "<|im_end|>"),
    ("Mistral", "<s>", "</s>"), ("mistral", "<s>", "</s>"), ("gemma", "<bos>", "<eos>"),
    ("Phi-3", "<s>", "<|endoftext|>"), ("DeepSeek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("Cohere", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"), ("granite", "<|end_of_text|>", "<|end_of_text|>"),
    ("GLM", "[gMASK]<sop>", "<|endoftext|>"), ("Kimi", "[BOS]", "[EOS]"),
    ("gpt-oss", "<|startoftext|>", "<|return|>"),
]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                   "required": ["query"]}}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


# Tool-call ids are 9 alphanumerics, the only form Mistral's templates accept (they raise on any
# other), so their [TOOL_CALLS] and [TOOL_RESULTS] turns are compared, not only agreed errors.
def tool_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hi there"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"},
     {"role": "assistant", "content": "Red."}],
    [{"role": "user", "content": "  spaced out \n\n"}, {"role": "assistant", "content": "\tanswer  "},
     {"role": "user", "content": "\u3000ideographic\u00a0 你好 😀 é\nline two"}],
    [{"role": "user", "content": "Say <|im_end|> and [INST] literally {{ not jinja }}."}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "user", "content": ""}],
]

TOOL_CONVERSATIONS = [
    [{"role": "user", "content": "What's the weather in Paris?"}],
    [{"role": "system", "content": "You can call tools."},
     {"role": "user", "content": "What's the weather in Paris?"},
     {"role": "assistant", "content": "",
      "tool_calls": [tool_call("call00001", "get_weather", {"city": "Paris", "unit": "celsius"})]},
     {"role": "tool", "tool_call_id": "call00001", "name": "get_weather",
      "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
     {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
     {"role": "user", "content": "And in Rome and Oslo?"}],
    [{"role": "user", "content": "Weather in Rome and Oslo?"},
     {"role": "assistant", "content": None,
      "tool_calls": [tool_call("call00002", "get_weather", {"city": "Rome"}),
                     tool_call("call00003", "get_weather", {"city": "Oslo"})]},
     {"role": "tool", "tool_call_id": "call00002", "name": "get_weather", "content": "25"},
     {"role": "tool", "tool_call_id": "call00003", "name": "get_weather", "content": "3"}],
]

KWARG_VARIANTS = [{}, {"enable_thinking": False}]

# Small templates over the interpreter's semantics, each rendered with its context.
SNIPPETS = [
    ("{{ 1/2 }}|{{ 7//2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2**10 }}|{{ 1e16 }}|{{ 0.0001 }}|{{ 1e-5 }}|"
     "{{ 3.0 }}|{{ 0.1 + 0.2 }}|{{ 10 / 4 }}|{{ 1.5e300 * 10 }}", {}),
    ("{{ d }}|{{ l }}|{{ t }}|{{ none }}|{{ true }}|{{ 'it''s' }}|{{ (1,) }}",
     {"d": {"a": 1, "b": [1, 2.5, None, True, "x'y", 'q"'], "c": {"n": "é\n\t\x01"}},
      "l": ["a", 1], "t": "plain"}),
    ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|"
     "{{ d | tojson(separators=(',', ':')) }}|{{ [] | tojson }}|{{ {} | tojson(indent=2) }}",
     {"d": {"z": 1, "a": "é<\"\\\n\u2028", "m": [1.0, 2.5e-7, None, False, {"k": []}]}}),
    ("{% for k, v in d.items() %}{{ loop.index }}/{{ loop.length }} {{ k }}={{ v }}"
     "{% if not loop.last %}, {% endif %}{% endfor %}", {"d": {"b": 2, "a": 1, "c": 3}}),
    ("{% for x in xs if x > 1 %}{{ loop.index0 }}:{{ x }}{{ loop.previtem }}{{ loop.nextitem }}"
     "{{ loop.cycle('a', 'b') }};{% else %}empty{% endfor %}", {"xs": [3, 1, 2, 5]}),
    ("{% for x in xs %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}"
     "{{ x }}{% endfor %}|{% for x in [] %}no{% else %}else{% endfor %}", {"xs": [0, 1, 2, 3, 4]}),
    ("{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}[{{ x }}]"
     "{% set ns = namespace(total=0, seen=[]) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}"
     "{% endfor %}{{ ns.total }}{% if true %}{% set y = 3 %}{% endif %}{{ y }}", {}),
    ("{%- macro f(a, b=2) -%}[{{ a }}{{ b }}{{ varargs }}{{ kwargs }}]{%- endmacro -%}"
     "{{ f(1) }}{{ f(1, 3, 4) }}{{ f(1, c=5) }}{{ f(b=7, a=0) }}", {}),
    ("{{ '%s-%d-%r-%5.2f%%' % ('a', 3, 'q', 2.5) }} {{ '%(x)s!' % {'x': 1} }} "
     "{{ 'x{}y{a}{{}}'.format(1, a=2) }}{{ '{0}{1}{0}'.format('p', 'q') }} {{ '%s' | format(9) }}", {}),
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' ab') }}|{{ s | trim }}|"
     "{{ s.split() }}|{{ s.split(' ', 1) }}|{{ s.rsplit(None, 1) }}|{{ 'a,b,,c'.split(',') }}|"
     "{{ 'a,b,c'.rsplit(',', 1) }}|{{ s.upper() }}{{ s.lower() }}|{{ s.title() }}|{{ s | capitalize }}|"
     "{{ s.startswith(' a') }}{{ s.endswith(('x', 'b  ')) }}|{{ s.find('b') }}{{ s.count(' ') }}|"
     "{{ s.replace(' ', '_', 2) }}|{{ s | replace('a', 'A') }}|{{ 'l1\\nl2\\r\\n'.splitlines() }}|"
     "{{ 'abc'.removeprefix('a') }}{{ '42'.isdigit() }}",
     {"s": "  a Big  b  "}),
    ("{{ 'abcdef'[1:] }}{{ 'abcdef'[:-2] }}{{ 'abcdef'[::2] }}{{ 'abcdef'[::-1] }}{{ [1,2,3][-1] }}"
     "{{ xs[1:3] }}{{ xs[5] is defined }}{{ 'héllo'[1] }}{{ 'héllo' | length }}", {"xs": [1, 2, 3, 4]}),
    ("{{ x | default('d') }}{{ none | default('d') }}{{ none | default('d', true) }}{{ '' | d('e', true) }}"
     "{{ missing is defined }}{{ missing is undefined }}{{ missing }}{{ [] is iterable }}"
     "{{ 'a' is sequence }}{{ {} is mapping }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}"
     "{{ 1.0 is float }}{{ true is boolean }}{{ none is none }}{{ 'a' is string }}{{ 3 is odd }}"
     "{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'abc' is lower }}{{ f is callable }}",
     {"f": None}),
    ("{{ [3, 1, 2] | sort }}{{ ['b', 'A', 'c'] | sort }}{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}"
     "{{ {'b': 1, 'a': 2} | dictsort }}{{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}"
     "{{ 'abc' | list }}{{ 1 in [1] }}{{ 'a' in 'abc' }}{{ 'k' in {'k': 1} }}{{ 2 not in [1] }}"
     "{{ [1, 2, 2, 3] | unique | list }}{{ [1, 5, 2] | max }}{{ [1, 5, 2] | min }}{{ [1, 2] | sum }}"
     "{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [1, 2] | reverse | list }}{{ 'abc' | reverse }}"
     "{{ -3 | abs }}{{ 2.567 | round(2) }}{{ 2.5 | round }}{{ '3' | int + 1 }}{{ 'x' | int }}"
     "{{ '2.5' | float }}{{ 7 | float }}{{ 'a b  c' | wordcount }}", {}),
    ("{{ users | selectattr('admin') | map(attribute='name') | join(', ') }}|"
     "{{ users | rejectattr('admin') | map(attribute='name') | list }}|"
     "{{ users | selectattr('name', 'equalto', 'bo') | list | length }}|"
     "{{ [1, 0, 2] | select | list }}{{ [1, 2, 3] | select('odd') | list }}"
     "{{ [1, 2, 3] | reject('odd') | list }}|{{ [1, 2] | map('string') | join('-') }}|"
     "{{ users | map(attribute='age', default=0) | list }}|{{ users | sort(attribute='name') | "
     "map(attribute='name') | join }}|{{ users | items if false else 'x' }}",
     {"users": [{"name": "bo", "admin": True, "age": 3}, {"name": "al", "admin": False}]}),
    ("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(3, blank=true) }}"
     "|{{ 'Hello World-wide (yes)' | title }}|{{ '<a&b>' | e }}|{{ 'x' ~ 1 ~ none ~ [1] }}"
     "|{{ 'ab' * 3 }}{{ [1] * 2 }}{{ [1] + [2] }}{{ 'a' + 'b' }}|{{ range(3) | list }}{{ range(1, 7, 2) | list }}"
     "|{{ 'x' if false }}|{{ 'y' if true else 'n' }}|{{ 1 and 2 }}{{ 0 or 'z' }}{{ not 0 }}"
     "|{{ dict(a=1, b=2) }}|{{ (1 < 2) and (2 <= 2) and (3 > 2) and (3 >= 4 or 1 != 2) }}", {}),
    ("{{ raise_exception('boom: ' ~ x) }}", {"x": 1}),
    ("{{ x.y }}", {}),
    ("{{ d.items }}{{ xs.append(1) }}", {"d": {"items": 1}, "xs": []}),
    ("{% for m in messages %}{{ m['role'] | upper }}: {{ m.content | trim }}{{ '\\n' }}{% endfor %}"
     "{%- if add_generation_prompt %}ASSISTANT:{% endif %}",
     {"messages": [{"role": "user", "content": " hi "}], "add_generation_prompt": True}),
    ("  {% if true %}\n    kept\n  {% endif %}\n{# c #}\n  {%+ if true %}x{% endif %}\n"
     "{%- if true -%}  y  {%- endif -%}  \n{{- ' z ' -}}  \n{% raw %}{{ raw }}{% endraw %}\n"
     "{% set block %}\n inner {{ 1 }}\n{% endset %}[{{ block }}]{% filter upper %}up{% endfilter %}", {}),
    ("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
     "{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}", {}),
    ("{{ strftime_now('%Y-%m-%d %d %b %Y %B %H') }}", {}),
    ("{% set x = 1 %}{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}"
     "{{ 'a' 'b' }}{{ 1_000 }}{{ 1 if 1 is sameas 1 }}{{ l[0].k.0 }}", {"l": [{"k": "xyz"}]}),
]


def render_case(source, messages, tools, agp, bos, eos, kwargs):
    try:
        rendered, _ = render_jinja_template(conversations=[messages], tools=tools,
                                            chat_template=source, add_generation_prompt=agp,
                                            bos_token=bos, eos_token=eos, **kwargs)
        return {"rendered": rendered[0]}
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, AttributeError,
            KeyError, IndexError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def special_tokens(name):
    for marker, bos, eos in SPECIAL_TOKENS:
        if marker in name:
            return bos, eos
    return "<s>", "</s>"


def template_entry(name, source, bos, eos):
    _compile_jinja_template(source).globals["strftime_now"] = (
        lambda fmt: datetime.datetime.fromtimestamp(NOW).strftime(fmt))
    cases = []
    for messages in CONVERSATIONS:
        for agp in (False, True):
            case = {"messages": messages, "kwargs": {}, "add_generation_prompt": agp}
            case.update(render_case(source, messages, None, agp, bos, eos, {}))
            cases.append(case)
    for messages in TOOL_CONVERSATIONS:
        for kwargs in KWARG_VARIANTS:
            for tools in (None, TOOLS):
                case = {"messages": messages, "kwargs": kwargs, "add_generation_prompt": True}
                if tools:
                    case["tools"] = tools
                case.update(render_case(source, messages, tools, True, bos, eos, kwargs))
                cases.append(case)
    return {"name": name, "source": source, "bos": bos, "eos": eos, "cases": cases}


def render_snippet(source, context):
    env = _compile_jinja_template(source)
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.fromtimestamp(NOW).strftime(fmt)
    try:
        return {"rendered": env.render(**context)}
    except (jinja2.exceptions.TemplateError, jinja2.exceptions.SecurityError, TypeError,
            ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()

    templates = []
    reader = gguf.GGUFReader(args.model)
    field = reader.fields.get("tokenizer.chat_template")
    if field is not None:
        templates.append(template_entry("gguf", field.contents(), "<|im_start|>", "<|im_end|>"))
    for path in sorted(glob.glob(os.path.join(ROOT, "src/tokenizer/templates/*.jinja"))):
        name = "fallback-" + os.path.basename(path)[:-len(".jinja")]
        with open(path, encoding="utf-8") as f:
            templates.append(template_entry(name, f.read(), *special_tokens(name)))
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/data/chat_templates/*.jinja"))):
        name = os.path.basename(path)[:-len(".jinja")]
        with open(path, encoding="utf-8") as f:
            templates.append(template_entry(name, f.read(), *special_tokens(name)))
    snippets = []
    for source, context in SNIPPETS:
        snippets.append({"source": source, "context": context, **render_snippet(source, context)})

    out = os.path.join(args.out_dir, "chat_templates")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"now": NOW, "templates": templates, "snippets": snippets}, f,
                  ensure_ascii=False, indent=1)
    rendered = sum("rendered" in c for t in templates for c in t["cases"])
    total = sum(len(t["cases"]) for t in templates)
    print(f"wrote {len(templates)} templates ({rendered} of {total} cases render), "
          f"{len(snippets)} snippets to {out}")


if __name__ == "__main__":
    main()
