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
import collections
import json
import math
import os
import string
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from harness import check, free_port, scratch_dir, summary

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


# ../shared/data beside the project root.
DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"


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


def squad_f1(prediction, gold):
    """SQuAD's token F1, written out independently of the C++ scorer."""
    def words(text):
        text = "".join(c for c in text.lower() if c not in string.punctuation)
        return [w for w in text.split() if w not in ("a", "an", "the")]
    p, g = words(prediction), words(gold)
    common = sum((collections.Counter(p) & collections.Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def hf_window_nlls(model_path, text, context_len, stride, max_windows):
    """Strided-window NLL sums of `text` from HF transformers running the same GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    directory, name = os.path.dirname(model_path), os.path.basename(model_path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                 dtype=torch.float32).eval()
    ids = tokenizer.encode(text, add_special_tokens=False)
    nlls, scored_until = [], 1
    for begin in range(0, len(ids), stride):
        if len(nlls) == max_windows or scored_until >= len(ids):
            break
        end = min(begin + context_len, len(ids))
        window = torch.tensor([ids[begin:end]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=window).logits[0].float(), dim=-1)
        first = max(scored_until, begin + 1)
        targets = torch.tensor(ids[first:end])
        nlls.append(-float(logprobs[first - begin - 1:end - begin - 1].gather(
            1, targets[:, None]).sum()))
        scored_until = end
    return nlls


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    work = scratch_dir("strata-bench-test-")
    sharegpt = os.path.join(work, "conversations.json")
    with open(sharegpt, "w") as f:
        json.dump(SHAREGPT, f)
    # Real text for perplexity: 3,000 characters of WikiText-2.
    wiki = (DATA_DIR / "ppl" / "wikitext-2-raw-v1_test.raw").read_text(encoding="utf-8")
    wiki_excerpt = wiki[30000:33000]
    excerpt = os.path.join(work, "wiki.txt")
    with open(excerpt, "w", encoding="utf-8") as f:
        f.write(wiki_excerpt)

    def bench(*flags, expect_rc=0):
        command = [args.binary, "bench", *flags]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == expect_rc, (
            f"{' '.join(command)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def saved(name):
        with open(os.path.join(work, name)) as f:
            return json.load(f)

    # Dequantized weights here and in the in-process runs whose scores are held to HF's or to
    # each other's within 0.1%: quantized matmuls round their bfloat16 inputs and outputs
    # differently for other batch shapes (docs/quantized-weights.md).
    exact_weights = ["--weights", "dequantize"]
    http_port, grpc_port = free_port(), free_port()
    server = subprocess.Popen(
        [args.binary, "serve", "--model", args.model, "--http-port", str(http_port),
         "--grpc-port", str(grpc_port), "--set", "kv_store.dram_bytes=256MiB", *exact_weights],
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
                         "3", "--seed", "1", "--save-result", "--result-dir", "/nonexistent",
                         "--result-filename", os.path.join(work, "new", "random.json"),
                         "--disable-tqdm")
            assert "Serving Benchmark Result" in done.stdout, done.stdout
            # An absolute file name ignores --result-dir, and its directory is created (vLLM).
            result = saved("new/random.json")
            assert result["completed"] == 6 and result["failed"] == 0, result["errors"]
            assert result["output_lens"] == [8] * 6, "random prompts ignore EOS"
            assert result["backend"] == "openai" and result["max_concurrency"] == 3
            assert result["request_rate"] == "inf"
            check_statistics(result)

        def test_serve_sharegpt_over_grpc():
            bench("serve", "--backend", "grpc", "--base-url", f"127.0.0.1:{grpc_port}",
                  "--tokenizer", args.model, "--dataset-name", "sharegpt", "--dataset-path",
                  sharegpt, "--num-prompts", "2", "--request-rate", "20", "--seed", "3",
                  "--save-result", "--result-dir", os.path.join(work, "made"),
                  "--result-filename", "sharegpt.json", "--disable-tqdm")
            result = saved("made/sharegpt.json")  # a relative name goes under --result-dir
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

        def test_ppl_matches_hf_over_http_grpc_and_in_process():
            # Three overlapping windows, scored by Strata three ways and by HF.
            window = ["--dataset-path", excerpt, "--context-len", "256", "--stride", "128",
                      "--num-prompts", "3", "--disable-tqdm", "--save-result", "--result-dir",
                      work]
            bench("ppl", "--base-url", base, "--tokenizer", args.model, *window,
                  "--result-filename", "ppl_http.json")
            bench("ppl", "--backend", "grpc", "--base-url", f"127.0.0.1:{grpc_port}",
                  "--tokenizer", args.model, *window, "--result-filename", "ppl_grpc.json")
            bench("offline", "--workload", "ppl", "--model", args.model, *window, *exact_weights,
                  "--result-filename", "ppl_offline.json")
            expected = hf_window_nlls(args.model, wiki_excerpt, 256, 128, 3)
            assert len(expected) == 3
            for name in ("ppl_http.json", "ppl_grpc.json", "ppl_offline.json"):
                result = saved(name)
                assert result["task"] == "ppl" and result["num_windows"] == 3, result
                ours = [w["nll"] for w in result["windows"]]
                for a, b in zip(ours, expected):
                    assert abs(a - b) <= 1e-3 * abs(b), (name, ours, expected)
                scored = sum(w["scored_tokens"] for w in result["windows"])
                assert scored == result["num_scored_tokens"] == 255 + 128 + 128, result
                hf_ppl = math.exp(sum(expected) / scored)
                assert abs(result["perplexity"] - hf_ppl) <= 1e-3 * hf_ppl, (name, hf_ppl, result)

        def test_longqa_scores_answers():
            data = os.path.join(work, "qa.jsonl")
            with open(data, "w") as f:
                f.write(json.dumps({"content": "The meeting was chaired by Ann. Bob took notes.",
                                    "question": "Who chaired the meeting?",
                                    "options": ["A. Bob", "B. Ann", "C. Carl", "D. Dora"],
                                    "answer": "B"}) + "\n")
                f.write('{"content": "cut off\n')  # BAMBOO ships a few broken lines
                f.write(json.dumps({"content": "Answer the question based on the document.\n\n"
                                               "Document:\nThe bridge opened in 1964.\n\n"
                                               "Question:\nwhen did the bridge open\n",
                                    "answer": "1964"}) + "\n")
            done = bench("longqa", "--base-url", base, "--tokenizer", args.model,
                         "--dataset-path", data, "--max-output-len", "12", "--disable-tqdm",
                         "--save-result", "--result-dir", work, "--result-filename", "qa.json")
            assert "skipped 1 lines" in done.stderr, done.stderr
            assert "Long-document QA" in done.stdout, done.stdout
            result = saved("qa.json")
            assert result["completed"] == 2 and result["num_multiple_choice"] == 1, result
            for item in result["items"]:
                expected = max(squad_f1(item["prediction"], gold) for gold in item["answers"])
                close(item["f1"], expected, item["id"])
            close(result["f1"], sum(i["f1"] for i in result["items"]) / 2, "mean f1")
            letter = result["items"][0]["prediction"].strip().lstrip("(")[:1]
            assert result["exact_match"] == (1.0 if letter == "B" else 0.0), result["items"][0]
            assert result["items"][1]["exact_match"] is None
            # Time per output token after the first, of the answers of two tokens or more.
            tpots = []
            for item in result["items"]:
                assert 1 <= item["output_len"] <= 12, item
                if item["output_len"] > 1:
                    assert item["tpot_ms"] > 0, item
                    tpots.append(item["tpot_ms"])
                else:
                    assert "tpot_ms" not in item, item
            if tpots:
                close(result["mean_tpot_ms"], sum(tpots) / len(tpots), "mean tpot")
            else:
                assert result["mean_tpot_ms"] is None, result

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

        def test_compare_warm_store():
            # Each run gets an empty SSD tier unless --warm-store: then the second run loads the
            # prompts the first stored (its DRAM tier is empty at start, so from the SSD): 4
            # blocks of 16 tokens of each.
            def compare(name, *extra, expect_rc=0):
                out = os.path.join(work, name)
                done = bench("compare", "--model", args.model, "--dataset-name", "random",
                             "--random-input-len", "64", "--random-output-len", "2",
                             "--num-prompts", "2", "--max-concurrency", "1",
                             "--set", "kv_cache.enable_prefix_caching=false",
                             "--set", "kv_store.dram_bytes=64MiB", "--set",
                             "kv_store.ssd_bytes=256MiB", *extra, "--variant", "first",
                             "--variant", "second", "--output-dir", out, "--no-plots",
                             "--disable-tqdm", expect_rc=expect_rc)
                if expect_rc != 0:
                    return done
                with open(os.path.join(out, "compare.json")) as f:
                    return [r["result"]["tier_hit_tokens"]["ssd"] for r in json.load(f)["runs"]]
            ssd = os.path.join(work, "warm-kv")
            assert compare("cold", "--set", f"kv_store.ssd_dir={ssd}") == [0, 0]
            assert not os.path.exists(os.path.join(ssd, "compare-first@inf"))
            assert compare("warm", "--warm-store", "--set", f"kv_store.ssd_dir={ssd}") == [0, 128]
            assert os.path.exists(os.path.join(ssd, "index.journal")), os.listdir(ssd)
            done = compare("no-dir", "--warm-store", "--set", "kv_store.ssd_bytes=0",
                           expect_rc=2)
            assert "--warm-store: variant first has no kv_store.ssd_dir" in done.stderr, done.stderr

        check("serve: random prompts over OpenAI HTTP", test_serve_random_over_http)
        def test_compare_perplexity_across_variants():
            # The KV block size and the prefill chunking change how the prompt is computed,
            # not what it scores. The output directory's parents are created first.
            out = os.path.join(work, "nested", "compare_ppl")
            bench("compare", "--model", args.model, "--workload", "ppl", "--dataset-path",
                  excerpt, "--context-len", "200", "--num-prompts", "2", *exact_weights,
                  "--variant", "default",
                  "--variant",
                  "small:kv_cache.block_size_tokens=4,scheduler.max_num_batched_tokens=64",
                  # A value with a comma: an item without '=' continues the previous value.
                  "--variant", "k8v8:kv_cache.page_format=k:int8/token64,v:int8/token64",
                  "--peer", f"served={base}", "--output-dir", out, "--disable-tqdm")
            with open(os.path.join(out, "compare.json")) as f:
                runs = json.load(f)["runs"]
            assert [r["variant"] for r in runs] == ["default", "small", "k8v8", "served"], runs
            ppl = {r["variant"]: r["result"]["perplexity"] for r in runs}
            exact = [ppl["default"], ppl["small"], ppl["served"]]
            assert max(exact) - min(exact) <= 1e-3 * min(exact), ppl
            # int8 pages change the scores a little, not nothing and not much.
            assert ppl["k8v8"] != ppl["default"], ppl
            assert abs(ppl["k8v8"] - ppl["default"]) <= 0.02 * ppl["default"], ppl
            table = open(os.path.join(out, "compare.md")).read()
            assert "| perplexity |" in table and table.count("| small |") == 1, table
            # An output directory that cannot exist fails before anything runs.
            blocked = os.path.join(work, "compare_ppl_file")
            open(blocked, "w").close()
            started = time.monotonic()
            done = bench("compare", "--model", args.model, "--workload", "ppl", "--dataset-path",
                         excerpt, "--num-prompts", "2", "--variant", "default",
                         "--output-dir", os.path.join(blocked, "out"), "--disable-tqdm",
                         expect_rc=1)
            assert "cannot create" in done.stderr, done.stderr
            assert "loading" not in done.stderr, done.stderr
            assert time.monotonic() - started < 60

        check("compare: engine variants and a peer server", test_compare_variants_and_a_peer)
        check("compare: --warm-store shares the SSD tier", test_compare_warm_store)
        check("ppl: equals HF over HTTP, gRPC and in process",
              test_ppl_matches_hf_over_http_grpc_and_in_process)
        check("longqa: answers scored", test_longqa_scores_answers)
        check("compare: perplexity across variants and a peer",
              test_compare_perplexity_across_variants)
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
        # Without --result-filename: {backend}-{rate or task}-{model}-{date}.json.
        named = os.path.join(work, "named")
        os.mkdir(named)
        bench("offline", "--model", args.model, "--dataset-name", "random", "--random-input-len",
              "8", "--random-output-len", "2", "--num-prompts", "1", "--max-concurrency", "1",
              "--save-result", "--result-dir", named, "--disable-tqdm")
        bench("offline", "--model", args.model, "--workload", "ppl", "--dataset-path", excerpt,
              "--context-len", "64", "--num-prompts", "1", "--save-result", "--result-dir",
              named, "--disable-tqdm")
        names = sorted(os.listdir(named))
        assert len(names) == 2, names
        assert names[0].startswith("offline-inf") and "-concurrency1-" in names[0], names
        assert names[1].startswith("offline-ppl-") and names[1].endswith(".json"), names
        with open(os.path.join(named, names[1])) as f:
            assert json.load(f)["task"] == "ppl"

    check("offline: the in-process engine", test_offline)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
