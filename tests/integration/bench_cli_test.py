#!/usr/bin/env python3
"""End-to-end test of `strata bench` against a real `strata serve` and the in-process engine.

Starts the server on loopback with the default model and runs the benchmark CLI as a user would:
`serve` over OpenAI HTTP (random prompts) and over gRPC (a ShareGPT file), `multiturn` over chat
completions, `offline`, and `compare` (two engine variants and the server as a peer, two rates,
with its table and PNG plots). Each saved result is checked independently: the summary statistics are
recomputed with numpy from the per-request lists in the same file, ShareGPT prompt lengths are
recounted with HF transformers' tokenizer of the same GGUF, output lengths match what was asked
(ignore_eos), and vLLM's field names are all present. Also: an unreachable server and a malformed
data file fail with a clear message and exit code, and --help documents the flags.

usage: bench_cli_test.py --binary build/bin/strata --model MODEL.gguf
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

RESULTS = {"passed": 0, "failed": 0}

# The keys `vllm bench serve --save-result` writes (percentile keys for the defaults we use).
VLLM_KEYS = [
    "date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
    "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
    "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
    "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "generated_texts",
    "errors",
] + [f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
     for stat in ("mean", "median", "std", "p99")]

# Short real-looking conversations in ShareGPT format (the second starts mid-conversation, as
# V3 split segments do; the third has no reply and is not a single-turn sample).
SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "Can you explain what a hash table is, in two sentences?"},
        {"from": "gpt", "value": "A hash table stores key-value pairs in an array. A hash "
                                 "function maps each key to the slot where its value lives."},
        {"from": "human", "value": "What happens when two keys land in the same slot?"},
        {"from": "gpt", "value": "That is a collision; chaining keeps a list per slot and open "
                                 "addressing probes for another free slot."},
        {"from": "human", "value": "Which one is faster in practice?"},
        {"from": "gpt", "value": "Open addressing is usually faster thanks to cache locality."}]},
    {"id": "b_1", "conversations": [
        {"from": "gpt", "value": "(the end of an earlier segment)"},
        {"from": "human", "value": "Write a haiku about the sea at night, please."},
        {"from": "gpt", "value": "Dark waves fold and hiss, / the moon spills silver coins "
                                 "there, / the tide keeps its count."},
        {"from": "human", "value": "Now one about the mountains in winter."},
        {"from": "gpt", "value": "White peaks hold their breath, / pines bow under heavy snow, / "
                                 "silence fills the pass."}]},
    {"id": "c", "conversations": [
        {"from": "human", "value": "List three uses of the Python zip function."}]},
]


def check(name, fn):
    try:
        fn()
        RESULTS["passed"] += 1
        print(f"PASS {name}", flush=True)
    except Exception:  # noqa: BLE001 - report every failure and go on
        RESULTS["failed"] += 1
        print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def close(a, b, what):
    assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), f"{what}: {a} != {b}"


def check_statistics(result):
    """Recomputes the summary statistics from the per-request lists in the same result."""
    ttfts = [t * 1000 for t, e in zip(result["ttfts"], result["errors"]) if not e]
    close(result["mean_ttft_ms"], np.mean(ttfts), "mean_ttft_ms")
    close(result["median_ttft_ms"], np.median(ttfts), "median_ttft_ms")
    close(result["std_ttft_ms"], np.std(ttfts), "std_ttft_ms")
    for p in (50, 90, 99):
        close(result[f"p{p}_ttft_ms"], np.percentile(ttfts, p), f"p{p}_ttft_ms")
    itls = [g * 1000 for gaps in result["itls"] for g in gaps]
    close(result["mean_itl_ms"], np.mean(itls), "mean_itl_ms")
    close(result["p90_itl_ms"], np.percentile(itls, 90), "p90_itl_ms")
    assert result["total_output_tokens"] == sum(result["output_lens"])
    close(result["output_throughput"], result["total_output_tokens"] / result["duration"],
          "output_throughput")
    for key in VLLM_KEYS:
        assert key in result, f"missing vLLM field {key}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="strata_bench_test_")
    sharegpt = os.path.join(work, "conversations.json")
    with open(sharegpt, "w") as f:
        json.dump(SHAREGPT, f)

    def bench(*flags, expect_rc=0):
        command = [args.binary, "bench", *flags]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == expect_rc, (
            f"{' '.join(command)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def saved(name):
        with open(os.path.join(work, name)) as f:
            return json.load(f)

    http_port, grpc_port = free_port(), free_port()
    server = subprocess.Popen(
        [args.binary, "serve", "--model", args.model, "--http-port", str(http_port),
         "--grpc-port", str(grpc_port), "--set", "kv_store.dram_bytes=256MiB"],
        stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            line = server.stdout.readline()
            assert line and time.time() < deadline, "the server did not start"
            if line.startswith("http_port="):
                break
        base = f"http://127.0.0.1:{http_port}"

        def test_serve_random_over_http():
            done = bench("serve", "--base-url", base, "--tokenizer", args.model,
                         "--dataset-name", "random", "--random-input-len", "32",
                         "--random-output-len", "8", "--num-prompts", "6", "--max-concurrency",
                         "3", "--seed", "1", "--save-result", "--result-dir", work,
                         "--result-filename", "random.json", "--disable-tqdm")
            assert "Serving Benchmark Result" in done.stdout, done.stdout
            result = saved("random.json")
            assert result["completed"] == 6 and result["failed"] == 0, result["errors"]
            assert result["output_lens"] == [8] * 6, "random prompts ignore EOS"
            assert result["backend"] == "openai" and result["max_concurrency"] == 3
            assert result["request_rate"] == "inf"
            check_statistics(result)

        def test_serve_sharegpt_over_grpc():
            bench("serve", "--backend", "grpc", "--base-url", f"127.0.0.1:{grpc_port}",
                  "--tokenizer", args.model, "--dataset-name", "sharegpt", "--dataset-path",
                  sharegpt, "--num-prompts", "2", "--request-rate", "20", "--seed", "3",
                  "--save-result", "--result-dir", work, "--result-filename", "sharegpt.json",
                  "--disable-tqdm")
            result = saved("sharegpt.json")
            assert result["completed"] == 2, result["errors"]
            check_statistics(result)
            # Prompt lengths recounted by an independent tokenizer of the same GGUF.
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(
                os.path.dirname(args.model), gguf_file=os.path.basename(args.model))
            expected = sorted(len(tokenizer.encode(c["conversations"][i]["value"],
                                                   add_special_tokens=False))
                              for c, i in ((SHAREGPT[0], 0), (SHAREGPT[1], 1)))
            assert sorted(result["input_lens"]) == expected, (result["input_lens"], expected)

        def test_multiturn_reports_turns_and_tier_hits():
            bench("multiturn", "--base-url", base, "--tokenizer", args.model, "--dataset-path",
                  sharegpt, "--num-prompts", "2", "--max-output-len", "6", "--think-time",
                  "0.05", "--request-rate", "10", "--save-result", "--result-dir", work,
                  "--result-filename", "multiturn.json", "--disable-tqdm")
            result = saved("multiturn.json")
            # Conversation a has 3 user turns, b has 2.
            assert result["completed"] == 5 and result["failed"] == 0, result["errors"]
            assert [t["requests"] for t in result["turns"]] == [2, 2, 1], result["turns"]
            for turn in result["turns"][1:]:
                assert turn["mean_cached_prompt_tokens"] > 0, "later turns reuse the history"
            assert result["tier_hit_tokens"]["gpu"] >= result["cached_prompt_tokens"] > 0
            check_statistics(result)

        def test_unreachable_server_and_bad_data_fail_clearly():
            done = bench("serve", "--base-url", f"http://127.0.0.1:{free_port()}",
                         "--tokenizer", args.model, "--num-prompts", "1", expect_rc=1)
            assert "cannot reach" in done.stderr, done.stderr
            bad = os.path.join(work, "bad.json")
            with open(bad, "w") as f:
                f.write('[{"id": "x", "conversations": [{"from": "human"}]}]')
            done = bench("serve", "--base-url", base, "--tokenizer", args.model,
                         "--dataset-name", "sharegpt", "--dataset-path", bad, expect_rc=2)
            assert "bad.json: record 0" in done.stderr, done.stderr
            done = bench("serve", "--backend", "grpc", "--base-url", f"127.0.0.1:{free_port()}",
                         "--tokenizer", args.model, "--num-prompts", "1", expect_rc=1)
            assert "cannot reach a Strata gRPC server" in done.stderr, done.stderr
            done = bench("serve", "--request-rate", "-1", "--tokenizer", args.model,
                         "--base-url", base, expect_rc=2)
            assert "--request-rate" in done.stderr, done.stderr
            done = bench("serve", "--goodput", "ttft", "--tokenizer", args.model, "--base-url",
                         base, "--num-prompts", "1", expect_rc=2)
            assert "--goodput" in done.stderr, done.stderr
            done = bench("serve", "--tokenizer", os.path.join(work, "missing.gguf"),
                         "--base-url", base, expect_rc=1)
            assert "missing.gguf" in done.stderr, done.stderr
            help_text = bench("--help").stdout
            for flag in ("--base-url", "--dataset-name", "--request-rate", "--max-concurrency",
                         "--save-result", "--goodput", "--think-time"):
                assert flag in help_text, flag

        def test_compare_variants_and_a_peer():
            out = os.path.join(work, "compare")
            done = bench("compare", "--model", args.model, "--dataset-name", "random",
                         "--random-input-len", "16", "--random-output-len", "3", "--num-prompts",
                         "3", "--variant", "recompute:kv_cache.enable_prefix_caching=false",
                         "--variant", "default", "--peer", f"served={base}",
                         "--request-rates", "20,50", "--output-dir", out, "--disable-tqdm")
            with open(os.path.join(out, "compare.json")) as f:
                compare = json.load(f)
            runs = [(r["variant"], r["request_rate"]) for r in compare["runs"]]
            assert runs == [(v, rate) for v in ("recompute", "default", "served")
                            for rate in (20.0, 50.0)], runs
            for run in compare["runs"]:
                assert run["result"]["completed"] == 3, run["result"]["errors"]
                assert run["result"]["output_lens"] == [3] * 3
                check_statistics(run["result"])
            assert compare["runs"][0]["overrides"] == {"kv_cache.enable_prefix_caching": "false"}
            assert compare["runs"][4]["kind"] == "peer"
            table = open(os.path.join(out, "compare.md")).read()
            assert table.count("| recompute |") == 2 and table.count("| served |") == 2, table
            assert "| recompute |" in done.stdout
            for png in ("ttft_cdf.png", "throughput_vs_rate.png"):
                with open(os.path.join(out, png), "rb") as f:
                    assert f.read(8) == b"\x89PNG\r\n\x1a\n", png

        check("serve: random prompts over OpenAI HTTP", test_serve_random_over_http)
        check("compare: engine variants and a peer server", test_compare_variants_and_a_peer)
        check("serve: ShareGPT over gRPC", test_serve_sharegpt_over_grpc)
        check("multiturn: TTFT by turn and tier hits", test_multiturn_reports_turns_and_tier_hits)
        check("unreachable server and bad data fail clearly",
              test_unreachable_server_and_bad_data_fail_clearly)
    finally:
        server.kill()
        server.wait()

    def test_offline():
        bench("offline", "--model", args.model, "--dataset-name", "random", "--random-input-len",
              "16", "--random-output-len", "4", "--num-prompts", "3", "--save-result",
              "--result-dir", work, "--result-filename", "offline.json", "--disable-tqdm")
        result = saved("offline.json")
        assert result["completed"] == 3 and result["output_lens"] == [4] * 3, result
        assert result["backend"] == "offline"
        check_statistics(result)

    check("offline: the in-process engine", test_offline)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
