"""TTFT of a resumed conversation turn by where its history's KV comes from, one request at a time.

Starts a redis-server and four `strata serve` processes of one model (prefix caching off, so the
device pool never serves a later turn):
  recompute  no KV store
  dram       its own DRAM tier (the turn before ran on it)
  ssd        a DRAM tier that keeps 90% free (room for one turn's save), so stored turns move to
             its SSD tier at once (128 MiB, over the ranks)
  remote     Redis only; the turn before ran on the `dram` server, which wrote it through to Redis
For each ShareGPT conversation (the first user message, the model's greedy reply, the next user
message), runs turn 1 on `dram` and `ssd`, waits until both stored it, then sends turn 2 to each
server and measures the time to its first streamed token at the client (gRPC), with the prompt
tokens the server reports as not computed and the tier they came from. With --tensor-parallel N
every server runs N CPU ranks, each rank's KV store holding its own heads
(docs/tensor-parallelism.md); a load some rank cannot serve fails on all and recomputes (counted
as load failures in the summary).

usage: .venv/bin/python bench/remote_tier_ttft.py --binary build/bin/strata \
           --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \
           --dataset ../shared/data/sharegpt/sharegpt_v3_sample1000.json.xz --conversations 20 \
           --output docs/results/cpu-remote-tier/resumed-turn.json
"""
import argparse
import json
import lzma
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from harness import Redis, free_port, scratch_dir  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--min-chars", type=int, default=1500, help="of the first user message")
    parser.add_argument("--reply-tokens", type=int, default=64)
    parser.add_argument("--tensor-parallel", type=int, default=1,
                        help="ranks per server (CPU processes over Gloo)")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    work = scratch_dir("strata-remote-ttft-")
    proto = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "proto")
    subprocess.run(["protoc", f"--proto_path={proto}", f"--python_out={work}",
                    os.path.join(proto, "strata/v1/generation.proto")], check=True)
    sys.path.insert(0, work)
    from strata.v1 import generation_pb2 as pb  # noqa: E402

    processes = []
    redis = Redis()

    def serve(name, *overrides):
        grpc_port, http_port = free_port(), free_port()
        config = os.path.join(work, f"{name}.yaml")
        with open(config, "w") as f:
            f.write(f"model:\n  path: {args.model}\nserver:\n  grpc_port: {grpc_port}\n"
                    f"  http_port: {http_port}\n")
        command = [args.binary, "serve", "--config", config,
                   "--set", "kv_cache.enable_prefix_caching=false"]
        if args.tensor_parallel > 1:
            command += ["--set", f"devices.tensor_parallel_size={args.tensor_parallel}",
                        "--set", "devices.device=cpu"]
        for o in overrides:
            command += ["--set", o]
        p = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        processes.append(p)
        assert p.stdout.readline().startswith("grpc_port=")
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        grpc.channel_ready_future(channel).result(timeout=120)
        call = channel.unary_stream("/strata.v1.Generation/Chat",
                                    request_serializer=pb.ChatRequest.SerializeToString,
                                    response_deserializer=pb.GenerateResponse.FromString)
        return {"name": name, "call": call, "http": http_port}

    remote = f"kv_store.remote_address=127.0.0.1:{redis.port}"
    ssd_dir = os.path.join(work, "ssd")
    servers = {
        "recompute": serve("recompute"),
        "dram": serve("dram", "kv_store.dram_bytes=512MiB", remote),
        # (A rank's chunk holds its KV heads: with more ranks, less DRAM keeps a turn from
        # fitting in the 10% it leaves for saves.)
        "ssd": serve("ssd", f"kv_store.dram_bytes={128 // args.tensor_parallel}MiB",
                     "kv_store.dram_reserve_fraction=0.9",
                     f"kv_store.ssd_dir={ssd_dir}", "kv_store.ssd_bytes=2GiB"),
        "remote": serve("remote", "kv_store.dram_bytes=512MiB", remote),
    }

    def metric(server, key):
        text = urllib.request.urlopen(f"http://127.0.0.1:{server['http']}/metrics",
                                      timeout=30).read().decode()
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    last_counts = [None]

    def written_by_every_rank():
        """Each rank's chunk keys (one layout tag per rank) are there in equal numbers, as they
        were at the last call."""
        counts = redis.chunks_per_layout()
        settled = (len(counts) == args.tensor_parallel and len(set(counts.values())) == 1 and
                   counts == last_counts[0])
        last_counts[0] = counts
        return settled

    def chat(server, messages, max_tokens):
        request = pb.ChatRequest(sampling=pb.SamplingParams(temperature=0, max_tokens=max_tokens))
        for role, content in messages:
            request.messages.add(role=role, content=content)
        start = time.perf_counter()
        first, text, last = None, "", None
        for r in server["call"](request, timeout=600):
            if first is None and r.token_ids:
                first = time.perf_counter() - start
            text += r.text
            last = r
        return text, first * 1000, last.usage

    conversations = []
    for c in json.load(lzma.open(args.dataset)):
        turns = [t for t in c["conversations"] if t["from"] in ("human", "gpt")]
        humans = [t["value"] for t in turns if t["from"] == "human"]
        if len(humans) >= 2 and len(humans[0]) >= args.min_chars and len(humans[1]) < 400:
            conversations.append((humans[0][:6000], humans[1]))
        if len(conversations) == args.conversations:
            break

    rows = []
    try:
        for i, (first, second) in enumerate(conversations):
            written = metric(servers["dram"], 'strata_kv_store_chunks{tier="remote"}')
            on_ssd = metric(servers["ssd"], 'strata_kv_store_chunks{tier="ssd"}')
            reply, _, _ = chat(servers["dram"], [("user", first)], args.reply_tokens)
            chat(servers["ssd"], [("user", first)], args.reply_tokens)
            deadline = time.time() + 60
            while (metric(servers["dram"], 'strata_kv_store_chunks{tier="remote"}') <= written or
                   metric(servers["ssd"], 'strata_kv_store_chunks{tier="ssd"}') <= on_ssd):
                assert time.time() < deadline, (
                    "turn 1 was not stored",
                    metric(servers["dram"], 'strata_kv_store_chunks{tier="remote"}'), written,
                    metric(servers["ssd"], 'strata_kv_store_chunks{tier="ssd"}'), on_ssd)
                time.sleep(0.05)
            # The metrics are rank 0's: every rank writes its keys on its own time. Until all
            # have, a replica reading the conversation would fail its load on every rank.
            while args.tensor_parallel > 1 and not written_by_every_rank():
                assert time.time() < deadline, "turn 1 was not written through by every rank"
                time.sleep(0.2)
            messages = [("user", first), ("assistant", reply), ("user", second)]
            row = {"conversation": i}
            for name in ("recompute", "dram", "ssd", "remote"):
                _, ttft, usage = chat(servers[name], messages, 1)
                row[name] = {"ttft_ms": ttft, "prompt_tokens": usage.prompt_tokens,
                             "cached_tokens": usage.cached_prompt_tokens,
                             "tier": usage.cached_tier}
            rows.append(row)
            print(json.dumps(row), flush=True)
        failures = {name: metric(server, "strata_kv_store_load_failures_total")
                    for name, server in servers.items()}
    finally:
        for p in processes:
            p.kill()
            p.wait()
        redis.stop()

    summary = {}
    recompute = statistics.mean(r["recompute"]["ttft_ms"] for r in rows)
    dram = statistics.mean(r["dram"]["ttft_ms"] for r in rows)
    for name in ("recompute", "dram", "ssd", "remote"):
        ttfts = [r[name]["ttft_ms"] for r in rows]
        summary[name] = {
            "mean_ttft_ms": statistics.mean(ttfts), "median_ttft_ms": statistics.median(ttfts),
            # against recomputing (the limit without a store) and the local DRAM tier (the best
            # a tier can do on this machine), measured in the same run
            "speedup_vs_recompute": recompute / statistics.mean(ttfts),
            "ttft_vs_dram": statistics.mean(ttfts) / dram,
            "cached_share": sum(r[name]["cached_tokens"] for r in rows) /
                            sum(r[name]["prompt_tokens"] for r in rows),
            "tiers": sorted({r[name]["tier"] for r in rows}),
            "load_failures": failures[name]}
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
              "tensor_parallel": args.tensor_parallel,
              "mean_prompt_tokens": statistics.mean(r["recompute"]["prompt_tokens"] for r in rows),
              "summary": summary, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
