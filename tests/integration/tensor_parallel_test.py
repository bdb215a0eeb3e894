#!/usr/bin/env python3
"""Tensor parallelism on the CPU over Gloo, end to end through `strata serve`.

`strata serve` with devices.tensor_parallel_size N starts its other ranks itself. Checks:
  - greedy completions at TP=2 and TP=4 equal TP=1's, token for token, for the default model and
    for a random-weight qwen2 model whose heads divide unevenly (6 query heads, 3 KV heads: at
    TP=2 the ranks hold 1 and 2 KV heads, at TP=4 KV heads are replicated; the vocabulary and the
    MLP split unevenly too);
  - with the KV store on (prefix caching off, so the second turn's history is loaded from the
    store's DRAM tier), a resumed conversation at TP=2 and TP=4 loads its history (no rank failed
    to load it) and answers as TP=1, rank 0's store holding its own KV heads only (a third of a
    TP=1 chunk: it holds 1 of SmolLM2's 3 KV heads), every rank's store reporting the same
    chunks in /metrics with bytes in proportion to its KV heads, and every rank writing an SSD
    directory of its own;
  - after a restart from the SSD tier with one rank's directory emptied, the lookup is cut to what
    every rank holds (nothing is loaded); with that rank's data corrupt (its journal intact) the
    load fails on every rank; either way the turn recomputes and answers as TP=1;
  - two TP=2 replicas sharing a real redis-server as their remote tier: a conversation started
    on one resumes on the other, every rank loading its own heads' KV from its keys in Redis,
    and answers as TP=1;
  - two "machines" (nodes: 2 on loopback, a TCP store at master_address:master_port): the
    node-1 process joins node 0's front door and the output equals TP=1;
  - a rank killed: the server exits non-zero within a bounded time;
  - a rank that hangs (SIGSTOP) while a request runs: the request fails (no output presented as
    complete) and the server exits non-zero within the collective timeout and a margin; likewise
    when it hangs while the server is idle.
Weights are dequantized (float32) so that TP=1 and TP=N differ only in summation order.

usage: tensor_parallel_test.py --binary build/bin/strata --model MODEL.gguf
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness import Redis, check, free_port, scratch_dir, summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from model_reference import write_tiny_qwen2_gguf  # noqa: E402

EXIT_BOUND_S = 15  # a dead rank: the server is gone within this
HANG_TIMEOUT_S = 3  # devices.collective_timeout_seconds of the hang checks


class Server:
    """A `strata serve` process (rank 0 of its group) on an HTTP port."""

    def __init__(self, binary, model, tp, *overrides):
        self.port = free_port()
        command = [binary, "serve", "--model", str(model), "--weights", "dequantize",
                   "--grpc-port", "0", "--http-port", str(self.port),
                   "--set", f"devices.tensor_parallel_size={tp}", "--set", "devices.device=cpu"]
        for o in overrides:
            command += ["--set", o]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        line = self.process.stdout.readline()
        assert line.startswith("http_port="), (line, self.process.stderr.read()[-3000:])

    def ranks(self):
        """The rank processes this server started (its children)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(p) for p in children.read_text().split()]

    def post(self, path, body, timeout=300):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def metric(self, name, labels=""):
        """The value of one sample of /metrics (labels as written there, e.g. 'tier="dram"')."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            text = r.read().decode()
        key = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[-1])
        raise AssertionError(f"no {key} in /metrics")

    def complete(self, prompt, max_tokens=24):
        reply = self.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens,
                                              "temperature": 0, "ignore_eos": True})
        return reply["choices"][0]["text"]

    def chat(self, messages, max_tokens=24):
        reply = self.post("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens,
                                                   "temperature": 0})
        return reply["choices"][0]["message"]["content"], reply["usage"]

    def exit_code_within(self, seconds):
        try:
            return self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.process.stderr.close()


def greedy_outputs(binary, model, tp, prompts):
    server = Server(binary, model, tp)
    try:
        outputs = [server.complete(p) for p in prompts]
    finally:
        server.stop()
    assert server.process.returncode == 0, ("orderly stop", tp, server.process.returncode)
    return outputs


def check_equal_to_tp1(binary, model, prompts):
    reference = greedy_outputs(binary, model, 1, prompts)
    assert all(reference), reference
    for tp in (2, 4):
        outputs = greedy_outputs(binary, model, tp, prompts)
        assert outputs == reference, (tp, outputs, reference)


FIRST_TURN = [{"role": "user", "content": "Name three rivers of Europe."}]


def second_turn(reply):
    return FIRST_TURN + [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "Which one is the longest?"}]


@functools.cache
def tp1_conversation(binary, model):
    """The conversation's first reply and its second turn's answer at TP=1, recomputed (no store)."""
    server = Server(binary, model, 1)
    try:
        reply, _ = server.chat(FIRST_TURN)
        resumed, _ = server.chat(second_turn(reply))
    finally:
        server.stop()
    return reply, resumed


def check_resumed_conversation(binary, model):
    answers, chunk_bytes = {}, {}
    for tp in (1, 2, 4):
        ssd = scratch_dir(f"strata-tp{tp}-")
        store = ["kv_store.dram_bytes=256MiB", "kv_cache.enable_prefix_caching=false",
                 f"kv_store.ssd_dir={ssd}", "kv_store.ssd_bytes=256MiB"]
        server = Server(binary, model, tp, *store)
        try:
            reply, _ = server.chat(FIRST_TURN)
            resumed, usage = server.chat(second_turn(reply))
            cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            assert cached >= 16, ("the history was not loaded from the store", tp, usage)
            failures = server.metric("strata_kv_store_load_failures_total")
            assert failures == 0, ("a rank could not load the history", tp, failures)
            chunks = server.metric("strata_kv_store_chunks", 'tier="dram"')
            chunk_bytes[tp] = server.metric("strata_kv_store_raw_bytes", 'tier="dram"') / chunks
            answers[tp] = (reply, resumed)
            if tp > 1:
                check_rank_stores(server, tp, chunks)
        finally:
            server.stop()
        if tp > 1:
            for rank in range(tp):
                files = list((Path(ssd) / f"tp{tp}-rank{rank}").iterdir())
                assert files, ("rank", rank, "wrote no SSD directory of its own", tp)
    assert answers[2] == answers[1] and answers[4] == answers[1], answers
    # SmolLM2 has 3 KV heads: rank 0 holds one of them at TP=2 and at TP=4.
    assert chunk_bytes[2] * 3 == chunk_bytes[1] and chunk_bytes[4] * 3 == chunk_bytes[1], chunk_bytes


def check_rank_stores(server, tp, chunks):
    """Every rank's store, as /metrics reports it (the other ranks every few seconds), holds the
    conversation's chunks, each of its own KV heads: SmolLM2's 3 KV heads are 1 and 2 per rank at
    TP=2, one per rank at TP=4."""
    heads = {2: [1, 2], 4: [1, 1, 1, 1]}[tp]
    deadline = time.time() + 15
    while True:
        try:
            held = [server.metric("strata_kv_store_rank_chunks", f'rank="{r}",tier="dram"')
                    for r in range(tp)]
            if held == [chunks] * tp:
                break
        except AssertionError:  # not reported yet
            held = None
        assert time.time() < deadline, ("every rank's store", tp, held, chunks)
        time.sleep(0.5)
    used = [server.metric("strata_kv_store_rank_used_bytes", f'rank="{r}",tier="dram"')
            for r in range(tp)]
    assert [u / heads[r] for r, u in enumerate(used)] == [used[0]] * tp, (tp, used)


def check_rank_lost_item(binary, model):
    """After a restart from the SSD tiers, rank 1 lost the conversation (its directory emptied):
    every rank's lookup is cut to what all hold, nothing is loaded, the turn recomputes. Or rank
    1's copy is corrupt (its journal still lists it): the load fails on every rank, counted once,
    and the turn recomputes. Either way the answer is TP=1's."""
    reply, reference = tp1_conversation(binary, model)
    ssd = Path(scratch_dir("strata-tp2-lost-"))
    saved = ssd / "saved"
    store = ["kv_store.dram_bytes=256MiB", "kv_cache.enable_prefix_caching=false",
             f"kv_store.ssd_dir={saved}", "kv_store.ssd_bytes=256MiB"]
    server = Server(binary, model, 2, *store)
    try:
        assert server.chat(FIRST_TURN)[0] == reply
    finally:
        server.stop()  # a clean stop writes the DRAM items to the SSD tiers

    def lose(directory):
        shutil.rmtree(directory)
        directory.mkdir()

    def corrupt(directory):
        for data in directory.glob("data-*.bin"):
            with open(data, "r+b") as f:
                f.write(os.urandom(data.stat().st_size))

    for name, damage, failures, cached in (("lost", lose, 0, 0), ("corrupt", corrupt, 1, None)):
        copy = ssd / name
        shutil.copytree(saved, copy)
        damage(copy / "tp2-rank1")
        store[2] = f"kv_store.ssd_dir={copy}"
        server = Server(binary, model, 2, *store)
        try:
            resumed, usage = server.chat(second_turn(reply))
            got = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            assert cached is None or got == cached, (name, "loaded", usage)
            failed = server.metric("strata_kv_store_load_failures_total")
            assert failed == failures, (name, "load failures", failed)
            assert resumed == reference, (name, resumed, reference)
        finally:
            server.stop()


def check_replicas_share_redis(binary, model):
    reply, reference = tp1_conversation(binary, model)
    redis = Redis()
    replica = ["kv_store.dram_bytes=256MiB", "kv_cache.enable_prefix_caching=false",
               f"kv_store.remote_address=127.0.0.1:{redis.port}"]
    a, b = Server(binary, model, 2, *replica), None
    try:
        assert a.chat(FIRST_TURN)[0] == reply
        # Write-through is asynchronous on every rank: wait until both ranks' keys are there
        # and have stopped growing.
        deadline, last = time.time() + 30, None
        while time.time() < deadline:
            counts = redis.chunks_per_layout()
            if len(counts) == 2 and len(set(counts.values())) == 1 and counts == last:
                break
            last = counts
            time.sleep(1)
        assert len(last) == 2 and len(set(last.values())) == 1, ("each rank's keys", last)
        b = Server(binary, model, 2, *replica)
        resumed, usage = b.chat(second_turn(reply))
        cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        assert cached >= 16, ("the history was not loaded from Redis", usage)
        assert b.metric("strata_kv_store_hits_total", 'tier="remote"') >= 1
        assert b.metric("strata_kv_store_load_failures_total") == 0, "a rank lacked its keys"
        assert resumed == reference, (resumed, reference)
    finally:
        a.stop()
        if b is not None:
            b.stop()
        redis.stop()


def check_two_nodes(binary, model, prompts):
    reference = greedy_outputs(binary, model, 1, prompts)
    port = free_port()
    nodes = ["devices.nodes=2", "devices.master_address=127.0.0.1", f"devices.master_port={port}"]
    # Node 1 first: it waits for node 0's store; node 0 serves once both have joined.
    node1 = subprocess.Popen(
        [binary, "serve", "--model", str(model), "--weights", "dequantize", "--grpc-port", "0",
         "--http-port", "0", "--set", "devices.tensor_parallel_size=2", "--set",
         "devices.device=cpu", "--set", "devices.node_rank=1"] + sum([["--set", n] for n in nodes],
                                                                      []),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server = None
    try:
        server = Server(binary, model, 2, "devices.node_rank=0", *nodes)
        assert server.ranks() == [], "a one-rank node starts no other process"
        outputs = [server.complete(p) for p in prompts]
        assert outputs == reference, (outputs, reference)
        server.stop()
        assert server.process.returncode == 0, server.process.returncode
        assert node1.wait(timeout=60) == 0, node1.stderr.read()[-2000:]
    finally:
        if server:
            server.stop()
        if node1.poll() is None:
            node1.kill()
            node1.wait()
        node1.stderr.close()


def check_killed_rank(binary, model):
    server = Server(binary, model, 2)
    try:
        assert server.complete("hello") is not None
        (rank,) = server.ranks()
        os.kill(rank, signal.SIGKILL)
        started = time.monotonic()
        code = server.exit_code_within(EXIT_BOUND_S)
        assert code not in (None, 0), ("server still up or exited 0", code)
        print(f"  killed rank: server exited {code} after {time.monotonic() - started:.1f} s")
    finally:
        server.stop()


def check_hung_rank(binary, model, during_request):
    """SIGSTOPs the other rank, idle or before a request: the server must fail the request (no
    output presented as complete) and exit non-zero within the collective timeout and a margin."""
    server = Server(binary, model, 2, f"devices.collective_timeout_seconds={HANG_TIMEOUT_S}")
    rank = None
    try:
        (rank,) = server.ranks()
        os.kill(rank, signal.SIGSTOP)
        started = time.monotonic()
        if during_request:
            completed = None
            try:
                reply = server.post("/v1/completions", {"prompt": "hello", "max_tokens": 64,
                                                        "temperature": 0, "ignore_eos": True},
                                    timeout=EXIT_BOUND_S + HANG_TIMEOUT_S)
                completed = reply["choices"][0].get("finish_reason")
            except (urllib.error.URLError, ConnectionError, OSError):
                pass  # the server failed the request or went away: neither presents it complete
            assert completed in (None, "error"), ("a request completed on a hung group", completed)
        code = server.exit_code_within(EXIT_BOUND_S + HANG_TIMEOUT_S)
        assert code not in (None, 0), ("server still up or exited 0", code)
        print(f"  hung rank ({'request' if during_request else 'idle'}): server exited {code} "
              f"after {time.monotonic() - started:.1f} s")
    finally:
        if rank is not None:
            try:
                os.kill(rank, signal.SIGKILL)
            except ProcessLookupError:
                pass
        server.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        uneven = Path(tmp) / "uneven_qwen2.gguf"
        write_tiny_qwen2_gguf(uneven, layers=2, heads=6, kv_heads=3, head_dim=16, ffn=160,
                              vocab=322)
        smollm_prompts = ["The capital of France is", "def fibonacci(n):\n    ",
                          "Once upon a time, in a small village,"]
        check("default model: TP=2 and TP=4 equal TP=1",
              lambda: check_equal_to_tp1(args.binary, args.model, smollm_prompts))
        uneven_prompts = ["ab" * 5, "tok7 tok9 hello world", "x" * 40]
        check("uneven heads (KV-head replication): TP=2 and TP=4 equal TP=1",
              lambda: check_equal_to_tp1(args.binary, uneven, uneven_prompts))
        check("KV store on: a resumed conversation at TP=2/4 loads its history and equals TP=1",
              lambda: check_resumed_conversation(args.binary, args.model))
        check("a rank that lost or corrupted the stored conversation: recomputed, equal to TP=1",
              lambda: check_rank_lost_item(args.binary, args.model))
        check("two TP=2 replicas sharing Redis: a conversation resumes on the other, equal to TP=1",
              lambda: check_replicas_share_redis(args.binary, args.model))
        check("two nodes over a TCP rendezvous: equal to TP=1",
              lambda: check_two_nodes(args.binary, uneven, uneven_prompts))
        check("a killed rank: the server exits non-zero",
              lambda: check_killed_rank(args.binary, uneven))
        check("a rank hung during a request: the request fails, the server exits non-zero",
              lambda: check_hung_rank(args.binary, uneven, during_request=True))
        check("a rank hung while idle: the server exits non-zero",
              lambda: check_hung_rank(args.binary, uneven, during_request=False))
    return summary()


if __name__ == "__main__":
    sys.exit(main())
