#!/usr/bin/env python3
"""End-to-end CPU benchmark: Strata against HF transformers on the same model, prompt and threads.

For each prompt length, both engines run the same token ids (real text from WikiText-2): one
prefill of the whole prompt, then greedy decoding of --decode-tokens tokens one at a time with a
KV cache. Reported: prefill tokens/s and decode tokens/s of each, and Strata / HF ratios
(> 1 means Strata is faster). Each measurement is the median of --repeats runs.

usage (from the repository root, after scripts/build.sh):
  .venv/bin/python bench/e2e_cpu.py --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out docs/results/cpu-e2e-smollm2.md
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def strata_run(binary, model, ids, decode_tokens, threads):
    cmd = [str(binary), "generate", "--model", str(model), "--device", "cpu", "--dtype",
           "float32", "--threads", str(threads), "--prompt-ids", ",".join(map(str, ids)),
           "--max-tokens", str(decode_tokens + 1), "--ignore-eos", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    timing = json.loads(out)["timing"]
    return timing["prefill_tokens_per_s"], timing["decode_tokens_per_s"]


def hf_run(model, ids, decode_tokens):
    input_ids = torch.tensor([ids])
    with torch.inference_mode():
        start = time.perf_counter()
        out = model(input_ids=input_ids, use_cache=True)
        prefill_s = time.perf_counter() - start
        past = out.past_key_values
        token = out.logits[0, -1].argmax().view(1, 1)
        start = time.perf_counter()
        for _ in range(decode_tokens):
            out = model(input_ids=token, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = out.logits[0, -1].argmax().view(1, 1)
        decode_s = time.perf_counter() - start
    return len(ids) / prefill_s, decode_tokens / decode_s


def main():
    root = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--binary", type=Path, default=root / "build" / "bin" / "strata")
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path,
                        default=root.parent / "shared" / "data" / "ppl" / "wikitext-2-raw-v1_test.raw")
    parser.add_argument("--out", type=Path, help="write a markdown report here (and .json beside)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers

    torch.set_num_threads(args.threads)
    model_dir, model_file = str(args.model.parent), args.model.name
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file,
                                                 dtype=torch.float32).eval()
    text_ids = tokenizer.encode(args.data.read_text(encoding="utf-8")[:200000])

    rows = []
    for length in args.prompt_lengths:
        ids = text_ids[1000:1000 + length]
        ours = [strata_run(args.binary, args.model, ids, args.decode_tokens, args.threads)
                for _ in range(args.repeats)]
        theirs = [hf_run(model, ids, args.decode_tokens) for _ in range(args.repeats)]
        row = {
            "prompt_tokens": length,
            "decode_tokens": args.decode_tokens,
            "strata_prefill_tok_s": statistics.median(o[0] for o in ours),
            "strata_decode_tok_s": statistics.median(o[1] for o in ours),
            "hf_prefill_tok_s": statistics.median(t[0] for t in theirs),
            "hf_decode_tok_s": statistics.median(t[1] for t in theirs),
        }
        row["prefill_ratio"] = row["strata_prefill_tok_s"] / row["hf_prefill_tok_s"]
        row["decode_ratio"] = row["strata_decode_tok_s"] / row["hf_decode_tok_s"]
        rows.append(row)
        print(json.dumps(row))

    if args.out:
        env = {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
               "torch": torch.__version__, "transformers": transformers.__version__,
               "model": str(args.model.name)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"env": env, "rows": rows}, indent=2))
        lines = [
            "# End-to-end CPU: Strata vs HF transformers",
            "",
            f"Model `{env['model']}` (fp32 compute, weights dequantized from the GGUF by each engine), "
            f"{args.threads} threads, torch {env['torch']}, transformers {env['transformers']}. "
            f"Median of {args.repeats} runs; greedy decoding of {args.decode_tokens} tokens after "
            "one prefill of the prompt (WikiText-2 text). Ratio > 1: Strata is faster.",
            "",
            "| prompt tokens | Strata prefill tok/s | HF prefill tok/s | ratio | "
            "Strata decode tok/s | HF decode tok/s | ratio |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['prompt_tokens']} | {r['strata_prefill_tok_s']:.0f} | "
                f"{r['hf_prefill_tok_s']:.0f} | {r['prefill_ratio']:.2f} | "
                f"{r['strata_decode_tok_s']:.1f} | {r['hf_decode_tok_s']:.1f} | "
                f"{r['decode_ratio']:.2f} |")
        lines += ["", "Reproduce:", "```", ".venv/bin/python " + " ".join(sys.argv), "```", ""]
        args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
