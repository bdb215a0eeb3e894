#!/usr/bin/env python3
"""What structured outputs cost per decoded token: streams the same prompts from a running server
with and without a JSON Schema response_format (greedy, one request at a time) and reports the
time per output token of each, the grammar's share of the decode step
(1 - TPOT_plain / TPOT_schema), and the first (cold: schema compiled, masks computed) against
the repeated (warm: masks cached) requests.

usage: bench/structured_outputs_bench.py --base-url http://127.0.0.1:8000 [--repeats 3] [--out F]
Run it alone on the machine (timings).
"""
import argparse
import json
import statistics
import sys
import time
import os

import openai

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from structured_outputs_test import CASES  # noqa: E402


def tpot(client, model, prompt, max_tokens, response_format):
    kwargs = {"response_format": response_format} if response_format else {}
    stamps = []
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], temperature=0,
        max_tokens=max_tokens, stream=True, stream_options={"include_usage": True}, **kwargs)
    tokens = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    if len(stamps) < 2 or tokens < 2:
        return None
    return (stamps[-1] - stamps[0]) / (tokens - 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    rows = []
    for prompt, schema in CASES:
        fmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": schema}}
        plain = [tpot(client, model, prompt + " Answer in JSON.", args.max_tokens, None)
                 for _ in range(args.repeats)]
        cold = tpot(client, model, prompt, args.max_tokens, fmt)
        warm = [tpot(client, model, prompt, args.max_tokens, fmt) for _ in range(args.repeats)]
        plain = [t for t in plain if t]
        warm = [t for t in warm if t]
        if not plain or not warm or not cold:
            continue
        rows.append({"prompt": prompt, "tpot_plain_ms": 1e3 * statistics.median(plain),
                     "tpot_schema_cold_ms": 1e3 * cold,
                     "tpot_schema_warm_ms": 1e3 * statistics.median(warm)})
        r = rows[-1]
        print(f"{prompt:40s} plain {r['tpot_plain_ms']:6.2f} ms  schema cold "
              f"{r['tpot_schema_cold_ms']:6.2f} ms  warm {r['tpot_schema_warm_ms']:6.2f} ms",
              flush=True)
    plain = statistics.mean(r["tpot_plain_ms"] for r in rows)
    cold = statistics.mean(r["tpot_schema_cold_ms"] for r in rows)
    warm = statistics.mean(r["tpot_schema_warm_ms"] for r in rows)
    summary = {"model": model, "cases": len(rows), "tpot_plain_ms": plain,
               "tpot_schema_cold_ms": cold, "tpot_schema_warm_ms": warm,
               "grammar_share_cold": 1 - plain / cold, "grammar_share_warm": 1 - plain / warm,
               "rows": rows}
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
