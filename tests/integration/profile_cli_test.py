#!/usr/bin/env python3
"""End-to-end test of `strata profile` (docs/adaptcache.md): it measures the default model's
prefill, the DRAM and an SSD tier (a real directory on this disk) and the KIVI codecs' decode
cost, copies the codecs' quality (and quality per task family) from a quality profile, and leaves
nothing in the tier's directory; the file it writes drives a deployment with AdaptCache on
(`strata generate` loads it); without qualities the same deployment refuses the file, naming the
missing codec, and one naming an unknown codec or another model (its weights' fingerprint); bad
flags fail with exit code 2.

usage: profile_cli_test.py --binary build/bin/strata --model MODEL.gguf
Prints "N passed, N failed" and exits non-zero on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from harness import check, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        ssd = os.path.join(tmp, "ssd")
        qualities = os.path.join(tmp, "qualities.json")
        with open(qualities, "w") as f:
            json.dump({"codecs": [{"name": "kivi-8", "quality": 0.9,
                                   "task_quality": {"chat": 0.95, "long-document": 0.85}},
                                  {"name": "kivi-4", "quality": 0.7,
                                   "task_quality": {"chat": 0.8, "long-document": 0.6}},
                                  {"name": "kivi-2", "quality": 0.3,
                                   "task_quality": {"chat": 0.4, "long-document": 0.1}},
                                  {"name": "layer-merge", "quality": 0.2,
                                   "task_quality": {"chat": 0.2, "long-document": 0.05}}]}, f)
        measured = os.path.join(tmp, "profile.json")
        bare = os.path.join(tmp, "bare.json")

        def profile(*extra):
            return subprocess.run(
                [args.binary, "profile", "--model", args.model, "--threads", "2",
                 "--set", f"kv_store.ssd_dir={ssd}", "--set", "kv_store.ssd_bytes=64MiB",
                 "--prefill-tokens", "128", "--copy-mib", "16", "--ssd-mib", "8", *extra],
                capture_output=True, text=True, timeout=600)

        def generate(profile_path):
            return subprocess.run(
                [args.binary, "generate", "--model", args.model, "--prompt", "Hello",
                 "--max-tokens", "2", "--set", "kv_store.dram_bytes=64MiB",
                 "--set", f"kv_store.ssd_dir={os.path.join(tmp, 'serve-ssd')}",
                 "--set", "kv_store.ssd_bytes=64MiB",
                 "--set", f"kv_store.adaptcache_profile={profile_path}",
                 "--set", "kv_store.adaptcache=true",
                 "--set", "kv_store.layer_pairing=minicache"],
                capture_output=True, text=True, timeout=600)

        def test_measures():
            r = profile("--output", measured, "--qualities", qualities)
            assert r.returncode == 0, r.stderr
            with open(measured) as f:
                p = json.load(f)
            assert 0 < p["prefill_seconds_per_token"] < 1, p
            assert [t["name"] for t in p["tiers"]] == ["dram", "ssd"], p["tiers"]
            for t in p["tiers"]:
                assert t["bandwidth"] > 1e6, t  # more than a MB/s
            assert 0 < p["tiers"][1]["latency_seconds"] < 1, p["tiers"][1]
            assert [c["name"] for c in p["codecs"]] == ["kivi-8", "kivi-4", "kivi-2",
                                                        "layer-merge"], p
            for c, q, d in zip(p["codecs"], (0.9, 0.7, 0.3, 0.2), (0.85, 0.6, 0.1, 0.05)):
                assert 0 < c["decode_seconds_per_byte"] < 1e-6, c
                assert c["quality"] == q, c
                assert c["task_quality"]["long-document"] == d, c
            assert p["device"] == "cpu" and p["source"].startswith("strata profile"), p
            assert len(p["model_fingerprint"]) == 16, p
            assert os.listdir(ssd) == [], os.listdir(ssd)  # its measurement file removed

        def test_a_deployment_loads_it():
            r = generate(measured)
            assert r.returncode == 0, r.stderr

        def test_without_qualities():
            r = profile("--output", bare)
            assert r.returncode == 0, r.stderr
            assert "no --qualities" in r.stderr, r.stderr
            r = generate(bare)
            assert r.returncode != 0 and "no quality for codec kivi-8" in r.stderr, r.stderr
            # A profile naming a codec the store does not have is refused, naming it.
            with open(measured) as f:
                p = json.load(f)
            p["codecs"].append({"name": "kivi-3", "quality": 0.5})
            unknown = os.path.join(tmp, "unknown.json")
            with open(unknown, "w") as f:
                json.dump(p, f)
            r = generate(unknown)
            assert r.returncode != 0 and "unknown codec 'kivi-3'" in r.stderr, r.stderr

        def test_another_models_profile():
            with open(measured) as f:
                p = json.load(f)
            p["model_fingerprint"] = "0123456789abcdef"
            other = os.path.join(tmp, "other.json")
            with open(other, "w") as f:
                json.dump(p, f)
            r = generate(other)
            assert r.returncode != 0 and "measured with another model" in r.stderr, r.stderr
            # One written before profiles named their model is taken, with a warning.
            del p["model_fingerprint"]
            with open(other, "w") as f:
                json.dump(p, f)
            r = generate(other)
            log = r.stdout + r.stderr  # (generate logs through spdlog's default logger)
            assert r.returncode == 0 and "names no model" in log, log

        def test_bad_flags():
            r = subprocess.run([args.binary, "profile", "--model", args.model],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 2 and "--output FILE is required" in r.stderr, r.stderr
            r = profile("--output", bare, "--prefill-tokens", "100000")
            assert r.returncode == 2 and "below the model's context" in r.stderr, r.stderr

        check("profile: measured numbers and copied qualities", test_measures)
        check("profile: a deployment with AdaptCache loads it", test_a_deployment_loads_it)
        check("profile: without qualities a deployment refuses it", test_without_qualities)
        check("profile: another model's profile is refused", test_another_models_profile)
        check("profile: bad flags", test_bad_flags)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
