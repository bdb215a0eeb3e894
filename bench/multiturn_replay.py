#!/usr/bin/env python3
"""Multi-turn replay of real ShareGPT conversations against `strata serve` over gRPC, once per
KV configuration, reporting time to first token (TTFT) by turn index and where each turn's
history came from (CachedAttention's end-to-end comparison, on whatever device the server uses).

Configurations (each a fresh server, the same workload and seed):
  recompute             no prefix cache, no store: every turn recomputes its whole history (RE)
  prefix-cache          the device pool's prefix cache only (the paper's "HBM-only")
  store-lru             + host DRAM and SSD tiers with LRU eviction and no prefetching
  cachedattention       + DRAM and SSD tiers with scheduler-aware prefetching and eviction
  dram-ssd-lru          the store's tiers without the prefix cache, LRU (every reuse is a load)
  dram-ssd-cachedattention   likewise, scheduler-aware
The last two show the store's tiers when the device pool cannot keep the conversations (on a
CPU the pool is at least one full context, which holds a small replay's conversations).

Workload: --conversations ShareGPT conversations (the first of the file with at least two human
turns), at most --max-turns human turns each, user messages cut to --max-user-chars. They arrive
as a Poisson process (--rate per second); each turn is sent when the previous answer is complete,
after --think-seconds. The history is the server-side session: the user's recorded messages and
the model's own greedy answers (--max-tokens each), so stored KV always matches the history.
TTFT is measured by the client from sending the turn to its first streamed token.

usage (from the repository root, after scripts/build.sh):
  /usr/bin/python3 bench/multiturn_replay.py --binary build/bin/strata \\
      --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --sharegpt ../shared/data/sharegpt/sharegpt_v3_sample1000.json.xz \\
      --out docs/results/cpu-multiturn-smollm2.md
Writes the Markdown table to --out and the raw numbers next to it as .json.
"""
import argparse
import json
import lzma
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc

CONFIGS = {
    "recompute": ["kv_cache.enable_prefix_caching=false"],
    "prefix-cache": [],
    "store-lru": ["kv_store.eviction_policy=lru"],
    "cachedattention": ["kv_store.eviction_policy=scheduler_aware"],
    "dram-ssd-lru": ["kv_cache.enable_prefix_caching=false", "kv_store.eviction_policy=lru"],
    "dram-ssd-cachedattention": ["kv_cache.enable_prefix_caching=false",
                                 "kv_store.eviction_policy=scheduler_aware"],
}
STORE_CONFIGS = {"store-lru", "cachedattention", "dram-ssd-lru", "dram-ssd-cachedattention"}


def load_conversations(path, count, max_turns, max_user_chars):
    records = json.load(lzma.open(path, "rt", encoding="utf-8"))
    out = []
    for record in records:
        turns = [m["value"][:max_user_chars] for m in record["conversations"]
                 if m["from"] == "human" and m["value"].strip()]
        if len(turns) >= 2:
            out.append(turns[:max_turns])
        if len(out) == count:
            break
    return out


def free_ports(n):
    ports = []
    for _ in range(n):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    return ports


def start_server(args, settings, work_dir):
    grpc_port, http_port = free_ports(2)
    command = [args.binary, "serve", "--model", args.model, "--device", args.device,
               "--grpc-port", str(grpc_port), "--http-port", str(http_port),
               "--set", f"kv_cache.cache_bytes={args.kv_cache}"]
    for s in settings + args.server_set:
        command += ["--set", s]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True)
    lines = [process.stdout.readline(), process.stdout.readline()]
    if not (lines[0].startswith("grpc_port=") and lines[1].startswith("http_port=")):
        process.kill()
        sys.exit(f"server did not start: {' '.join(command)}")
    return process, grpc_port, http_port


def metrics(http_port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read()
    values = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def replay(args, pb, name, conversations):
    work_dir = tempfile.mkdtemp(prefix="strata_replay_")
    settings = list(CONFIGS[name])
    if name in STORE_CONFIGS:
        settings += [f"kv_store.dram_bytes={args.dram}", f"kv_store.ssd_dir={work_dir}/kv",
                     f"kv_store.ssd_bytes={args.ssd}", "kv_store.ssd_file_bytes=256MiB"]
    server, grpc_port, http_port = start_server(args, settings, work_dir)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    grpc.channel_ready_future(channel).result(timeout=60)
    chat = channel.unary_stream("/strata.v1.Generation/Chat",
                                request_serializer=pb.ChatRequest.SerializeToString,
                                response_deserializer=pb.GenerateResponse.FromString)
    rng = random.Random(args.seed)
    arrivals, t = [], 0.0
    for _ in conversations:
        t += rng.expovariate(args.rate)
        arrivals.append(t)
    turns, lock = [], threading.Lock()
    start = time.monotonic()

    def run(index, messages):
        time.sleep(max(0.0, arrivals[index] - (time.monotonic() - start)))
        session = f"conversation-{index}"
        for turn_index, message in enumerate(messages):
            request = pb.ChatRequest(session_id=session, message=pb.ChatMessage(
                role="user", content=message), sampling=pb.SamplingParams(
                    temperature=0, max_tokens=args.max_tokens))
            sent = time.monotonic()
            first = None
            usage = None
            for response in chat(request, timeout=600):
                if first is None and (response.text or response.token_ids):
                    first = time.monotonic()
                if response.HasField("usage"):
                    usage = response.usage
            with lock:
                turns.append({"conversation": index, "turn": turn_index,
                              "ttft_s": (first or time.monotonic()) - sent,
                              "prompt_tokens": usage.prompt_tokens,
                              "cached_tokens": usage.cached_prompt_tokens,
                              "cached_tier": usage.cached_tier})
            time.sleep(rng.expovariate(1.0 / args.think_seconds) if args.think_seconds else 0)

    threads = [threading.Thread(target=run, args=(i, m)) for i, m in enumerate(conversations)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - start
    final = metrics(http_port)
    server.terminate()
    server.wait(timeout=60)
    shutil.rmtree(work_dir, ignore_errors=True)
    return {"config": name, "settings": settings, "wall_s": wall, "turns": turns,
            "metrics": {k: v for k, v in final.items() if k.startswith("strata_kv_")
                        or k.startswith("strata_prefix_cache")}}


def summarize(run, max_turns):
    later = [t for t in run["turns"] if t["turn"] > 0]
    history_tokens = sum(t["prompt_tokens"] for t in later)
    by_tier = {}
    for t in later:
        by_tier[t["cached_tier"] or "none"] = by_tier.get(t["cached_tier"] or "none", 0) + 1
    ttft = {}
    for k in range(max_turns):
        values = [t["ttft_s"] for t in run["turns"] if t["turn"] == k]
        if values:
            ttft[k] = (statistics.mean(values), statistics.median(values), len(values))
    return {"later_turns": len(later),
            "cached_token_share": sum(t["cached_tokens"] for t in later) / max(1, history_tokens),
            "turns_by_tier": by_tier,
            "ttft_by_turn": ttft,
            "mean_ttft_later_s": statistics.mean(t["ttft_s"] for t in later) if later else 0}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--sharegpt", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--configs", default="recompute,prefix-cache,store-lru,cachedattention")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-user-chars", type=int, default=1200)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--think-seconds", type=float, default=2.0)
    parser.add_argument("--kv-cache", default="400MiB", help="device KV pool (kv_cache.cache_bytes)")
    parser.add_argument("--dram", default="48MiB", help="store DRAM tier (kv_store.dram_bytes)")
    parser.add_argument("--ssd", default="1GiB", help="store SSD tier (kv_store.ssd_bytes)")
    parser.add_argument("--server-set", action="append", default=[],
                        help="extra SECTION.KEY=VALUE for every server, e.g. scheduler.max_num_seqs=8")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    proto_dir = Path(__file__).resolve().parent.parent / "proto"
    out_dir = tempfile.mkdtemp()
    subprocess.run(["protoc", f"--proto_path={proto_dir}", f"--python_out={out_dir}",
                    str(proto_dir / "strata/v1/generation.proto")], check=True)
    sys.path.insert(0, out_dir)
    from strata.v1 import generation_pb2 as pb  # noqa: E402

    conversations = load_conversations(args.sharegpt, args.conversations, args.max_turns,
                                       args.max_user_chars)
    runs = []
    for name in args.configs.split(","):
        print(f"replaying {len(conversations)} conversations with {name}...", file=sys.stderr)
        runs.append(replay(args, pb, name, conversations))
    summaries = {run["config"]: summarize(run, args.max_turns) for run in runs}
    base = summaries.get("recompute")

    lines = ["# Multi-turn replay of ShareGPT conversations", "",
             f"Command: `/usr/bin/python3 bench/multiturn_replay.py {' '.join(sys.argv[1:])}`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, device {args.device}; "
             f"model {Path(args.model).name}; {len(conversations)} conversations, "
             f"{sum(len(c) for c in conversations)} turns, Poisson arrivals {args.rate}/s, "
             f"think time {args.think_seconds} s, {args.max_tokens} greedy tokens per answer; "
             f"device pool {args.kv_cache}, store DRAM {args.dram}, SSD {args.ssd}"
             + (f"; {', '.join(args.server_set)}" if args.server_set else "") + ".", "",
             "Later turns (turn index >= 1): where their cached history came from, share of "
             "their prompt tokens not recomputed, and mean TTFT (ratio to recompute).", "",
             "| config | later turns | gpu | dram | ssd | none | cached token share "
             "| mean TTFT (s) | vs recompute |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summaries.items():
        tiers = s["turns_by_tier"]
        ratio = (s["mean_ttft_later_s"] / base["mean_ttft_later_s"]) if base else float("nan")
        lines.append(f"| {name} | {s['later_turns']} | {tiers.get('gpu', 0)} | "
                     f"{tiers.get('dram', 0)} | {tiers.get('ssd', 0)} | {tiers.get('none', 0)} | "
                     f"{s['cached_token_share']:.2f} | {s['mean_ttft_later_s']:.3f} | {ratio:.2f} |")
    lines += ["", "Mean (median) TTFT in seconds by turn index:", "",
              "| config | " + " | ".join(f"turn {k}" for k in range(args.max_turns)) + " |",
              "|---|" + "---|" * args.max_turns]
    for name, s in summaries.items():
        cells = []
        for k in range(args.max_turns):
            if k in s["ttft_by_turn"]:
                mean, median, n = s["ttft_by_turn"][k]
                cells.append(f"{mean:.3f} ({median:.3f}, n={n})")
            else:
                cells.append("-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"args": vars(args), "summaries": summaries, "runs": runs}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
