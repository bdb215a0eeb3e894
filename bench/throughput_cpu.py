#!/usr/bin/env python3
"""Output tokens/s against concurrency: Strata's engine beside HF transformers, same machine.

Strata: bench/engine_throughput_bench (continuous batching, paged KV), in-process.
HF: model.generate on a batch of the same prompts (all the same length, so no padding), greedy,
the same number of new tokens (EOS suppressed with min_new_tokens), fp32, same thread count.

usage (after scripts/build.sh):
  .venv/bin/python bench/throughput_cpu.py --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out docs/results/cpu-throughput-smollm2.md
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def main():
    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--binary", type=Path, default=root / "build" / "bench" / "engine_throughput_bench")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--text", type=Path,
                        default=root.parent / "shared" / "data" / "ppl" / "wikitext-2-raw-v1_test.raw")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "strata.json"
        subprocess.run([str(args.binary), "--model", str(args.model), "--text", str(args.text),
                        "--concurrency", args.concurrency, "--prompt-tokens", str(args.prompt_tokens),
                        "--output-tokens", str(args.output_tokens), "--threads", str(args.threads),
                        "--json", str(result)], check=True)
        strata = {r["concurrency"]: r["output_tokens_per_s"] for r in json.loads(result.read_text())}

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(args.model.parent), gguf_file=args.model.name)
    model = AutoModelForCausalLM.from_pretrained(str(args.model.parent), gguf_file=args.model.name,
                                                 dtype=torch.float32).eval()
    ids = tokenizer.encode(args.text.read_text(encoding="utf-8")[:400000])
    with torch.inference_mode():  # warm-up: the first generate call pays one-time setup costs
        model.generate(torch.tensor([ids[:args.prompt_tokens]]), do_sample=False, max_new_tokens=4,
                       pad_token_id=0)
    rows = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        prompts = [ids[(i * 997) % (len(ids) - args.prompt_tokens):][:args.prompt_tokens] for i in range(c)]
        batch = torch.tensor(prompts)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(batch, attention_mask=torch.ones_like(batch), do_sample=False,
                           max_new_tokens=args.output_tokens, min_new_tokens=args.output_tokens,
                           pad_token_id=0)
        hf = c * args.output_tokens / (time.perf_counter() - start)
        row = {"concurrency": c, "strata_tok_s": strata[c], "hf_tok_s": hf, "ratio": strata[c] / hf}
        rows.append(row)
        print(json.dumps(row), flush=True)

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2))
        lines = [
            "# Output throughput against concurrency (CPU): Strata engine vs HF transformers",
            "",
            f"Model `{args.model.name}` (fp32), {args.threads} threads, prompts of "
            f"{args.prompt_tokens} WikiText-2 tokens, {args.output_tokens} greedy output tokens each; "
            f"torch {torch.__version__}, transformers {transformers.__version__}. Strata runs the "
            "requests through its engine (continuous batching, paged KV); HF runs them as one "
            "`generate` batch. Ratio > 1: Strata is faster.",
            "",
            "| concurrency | Strata output tok/s | HF output tok/s | ratio |",
            "|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(f"| {r['concurrency']} | {r['strata_tok_s']:.1f} | {r['hf_tok_s']:.1f} | "
                         f"{r['ratio']:.2f} |")
        lines += ["", "Reproduce:", "```", ".venv/bin/python " + " ".join(sys.argv), "```", ""]
        args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
