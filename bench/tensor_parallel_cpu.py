"""Throughput and TPOT at tensor parallelism 1, 2 and 4 on the CPU (Gloo), with the share of
each forward pass that rank 0 spends in collectives.

Writes a random-weight Llama GGUF large enough for the split to matter (default: 6 layers,
hidden 2048, 16 query and 4 KV heads of 128, MLP 5632, vocabulary 32000: 401 M parameters, F16
on disk, float32 in memory), serves it with `strata serve --set devices.tensor_parallel_size=N`
(ranks get the machine's cores divided among them), and runs `strata bench serve` (random
prompts, fixed output length) at each concurrency. The collective share is the growth of
strata_tensor_parallel_collective_seconds_total over strata_forward_seconds_total on /metrics
during the run.

usage: .venv/bin/python bench/tensor_parallel_cpu.py --binary build/bin/strata \
           --output docs/results/cpu-tensor-parallel/summary.json
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from harness import free_port, scratch_dir  # noqa: E402


def write_random_llama(path, layers, hidden, heads, kv_heads, ffn, vocab):
    import gguf

    rng = np.random.default_rng(0)
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    # A byte-level vocabulary with one merge, so the engine can build a tokenizer for it.
    tokens = [bytes([b]).decode("latin-1") for b in range(256)] + ["ab"] + [
        f"tok{i}" for i in range(vocab - 257)]
    w.add_token_list(tokens)
    w.add_token_types([1] * vocab)
    w.add_token_merges(["a b"])

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(
            np.float16)

    def norm():
        return np.ones(hidden, dtype=np.float32)

    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    for l in range(layers):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", norm())
        w.add_tensor(p + "attn_q.weight", mat(heads * head_dim, hidden))
        w.add_tensor(p + "attn_k.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_v.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_output.weight", mat(hidden, heads * head_dim))
        w.add_tensor(p + "ffn_norm.weight", norm())
        w.add_tensor(p + "ffn_gate.weight", mat(ffn, hidden))
        w.add_tensor(p + "ffn_up.weight", mat(ffn, hidden))
        w.add_tensor(p + "ffn_down.weight", mat(hidden, ffn))
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", mat(vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    params = layers * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim +
                       3 * hidden * ffn) + 2 * vocab * hidden
    return params


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--tp", default="1,2,4")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    out_dir = Path(args.output).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(scratch_dir("strata-tp-bench-"))
    model = work / "random-llama.gguf"
    params = write_random_llama(model, args.layers, args.hidden, args.heads, args.kv_heads,
                                args.ffn, args.vocab)
    print(f"model: {params / 1e6:.0f} M parameters at {model}", flush=True)
    rows = []
    for tp in [int(t) for t in args.tp.split(",")]:
        port = free_port()
        server = subprocess.Popen(
            [args.binary, "serve", "--model", str(model), "--weights", "dequantize",
             "--grpc-port", "0", "--http-port", str(port),
             "--set", f"devices.tensor_parallel_size={tp}", "--set", "devices.device=cpu",
             "--set", "kv_cache.max_context_tokens=1024"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = server.stdout.readline()
            assert line.startswith("http_port="), line
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                forward0 = metric(port, "strata_forward_seconds_total")
                collective0 = metric(port, "strata_tensor_parallel_collective_seconds_total")
                name = f"tp{tp}-c{concurrency}.json"
                started = time.monotonic()
                subprocess.run(
                    [args.binary, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
                     "--dataset-name", "random", "--random-input-len", str(args.input_len),
                     "--random-output-len", str(args.output_len), "--num-prompts",
                     str(args.num_prompts), "--max-concurrency", str(concurrency),
                     "--tokenizer", str(model), "--save-result", "--result-dir", str(out_dir),
                     "--result-filename", name, "--disable-tqdm"],
                    check=True, stdout=subprocess.DEVNULL)
                result = json.loads((out_dir / name).read_text())
                forward = metric(port, "strata_forward_seconds_total") - forward0
                collective = (metric(port, "strata_tensor_parallel_collective_seconds_total") -
                              collective0)
                row = {"tp": tp, "concurrency": concurrency,
                       "output_throughput": result["output_throughput"],
                       "mean_tpot_ms": result["mean_tpot_ms"],
                       "mean_ttft_ms": result["mean_ttft_ms"],
                       "collective_share": collective / forward if forward > 0 else 0.0,
                       "wall_s": time.monotonic() - started}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            server.terminate()
            server.wait(timeout=120)
    summary = {"model": {"parameters": params, "layers": args.layers, "hidden": args.hidden,
                         "heads": args.heads, "kv_heads": args.kv_heads, "ffn": args.ffn,
                         "vocab": args.vocab, "weights": "float32 (dequantized from F16)"},
               "workload": {"num_prompts": args.num_prompts, "input_len": args.input_len,
                            "output_len": args.output_len},
               "cores": os.cpu_count(), "rows": rows}
    Path(args.output).write_text(json.dumps(summary, indent=1) + "\n")
    print("| TP | concurrency | output tok/s | TPOT ms | TTFT ms | collectives / forward |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tp']} | {r['concurrency']} | {r['output_throughput']:.2f} | "
              f"{r['mean_tpot_ms']:.1f} | {r['mean_ttft_ms']:.0f} | "
              f"{100 * r['collective_share']:.1f}% |")


if __name__ == "__main__":
    main()
