#!/usr/bin/env python3
"""AdaptCache's measures from a `strata bench compare --workload multiturn` run, or a `--workload
longqa --interleave-documents` one (the long-document workload), (docs/adaptcache.md).

  adaptcache_report.py COMPARE_JSON --reference VARIANT [--plot FILE] [--profile-out FILE
                       --prefill-seconds-per-token S --dram-bandwidth B --ssd-bandwidth B
                       [--merge-profile FILE]]

Per variant, over the later turns (turn >= 2, the ones that reuse stored KV; for longqa, the
questions after each document's first, L-Eval ids FILE:LINE.Q with Q > 0):
  quality     mean token F1 of each answer against the reference variant's answer to the same
              request (AdaptCache's quality: similarity to the uncompressed KV's answer, digest
              §2.3; SQuAD-style F1 over lower-cased whitespace tokens); first turns, which reuse
              nothing, are reported too as a check of the comparison (1.0 unless batching changed
              a greedy choice)
  delay       mean TTFT of the later turns (ms), and its ratio to the reference's (< 1: faster)
  DRAM hits   tokens loaded from DRAM / tokens loaded from the store (DRAM + SSD)
  cached      tokens served from any KV tier / later-turn prompt tokens
  codec mix   re-encodings into each codec over the run (in-process runs)
--profile-out writes the store's profile file (kv_store.adaptcache_profile): each variant named
after a codec (kivi-8, kivi-4, kivi-2, streaming-0.5, streaming-0.25, streaming-0.1, layer-merge:
Krul's, with kv_store.layer_pairing) gives that
codec's quality, and AdaptCache chooses among those codecs; bandwidths and the prefill time per token
are given on the command line (measured on the same machine, see docs/results/);
--merge-profile adds the codecs of an earlier profile that this run did not measure.
Stdlib only, except matplotlib for --plot.
"""
import argparse
import collections
import json
import sys

CODECS = ("kivi-8", "kivi-4", "kivi-2", "streaming-0.5", "streaming-0.25", "streaming-0.1",
          "layer-merge")


def f1(prediction, reference):
    p, r = prediction.lower().split(), reference.lower().split()
    if not p and not r:
        return 1.0
    common = sum((collections.Counter(p) & collections.Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(r)
    return 2 * precision * recall / (precision + recall)


def mean(values):
    return sum(values) / len(values) if values else float("nan")


def per_request(result):
    """(turn numbers, answers, prompt lengths, TTFTs in ms, errors) of a multiturn or longqa run."""
    if result.get("task") == "longqa":
        items = result["items"]
        turns = [int(item["id"].rsplit(".", 1)[1]) + 1 if "." in item["id"] else 1 for item in items]
        return (turns, [item["prediction"] for item in items], [item["prompt_len"] for item in items],
                [item.get("ttft_ms", 0) for item in items], result["errors"])
    return (result["request_turns"], result["generated_texts"], result["input_lens"],
            [t * 1000 for t in result["ttfts"]], result["errors"])


def measures(result, reference):
    turns, texts, prompt_lens, ttfts, errors = per_request(result)
    ref_texts = per_request(reference)[1]
    later = [i for i, t in enumerate(turns) if t >= 2]
    first = [i for i, t in enumerate(turns) if t == 1]
    hits = result.get("tier_hit_tokens") or {}
    loaded = hits.get("dram", 0) + hits.get("ssd", 0)
    later_prompt = sum(prompt_lens[i] for i in later)
    counters = result.get("store_counters") or {}
    return {
        "quality": mean([f1(texts[i], ref_texts[i]) for i in later]),
        "first_turn_quality": mean([f1(texts[i], ref_texts[i]) for i in first]),
        "delay_ms": mean([ttfts[i] for i in later if not errors[i]]),
        "dram_hit_rate": hits.get("dram", 0) / loaded if loaded else float("nan"),
        "cached_share": sum(hits.values()) / later_prompt if later_prompt else float("nan"),
        "transcodes": counters.get("transcodes", 0),
        # re-encodings into each codec (in-process runs record them): the policy's codec mix
        "codec_mix": ", ".join(f"{k[len('transcodes_'):]} {v:.0f}" for k, v in counters.items()
                               if k.startswith("transcodes_") and v > 0) or "-",
        "later_turns": len(later),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("compare_json")
    ap.add_argument("--reference", required=True, help="the uncompressed variant's name")
    ap.add_argument("--plot")
    ap.add_argument("--profile-out")
    ap.add_argument("--prefill-seconds-per-token", type=float)
    ap.add_argument("--dram-bandwidth", type=float, help="bytes/s, DRAM to the device")
    ap.add_argument("--ssd-bandwidth", type=float, help="bytes/s, SSD to the device")
    ap.add_argument("--merge-profile", help="an earlier profile whose other codecs are kept")
    args = ap.parse_args()
    runs = json.load(open(args.compare_json))["runs"]
    by_variant = {r["variant"]: r["result"] for r in runs}
    if args.reference not in by_variant:
        sys.exit(f"no variant {args.reference!r}; variants: {', '.join(by_variant)}")
    reference = by_variant[args.reference]
    rows = {name: measures(result, reference) for name, result in by_variant.items()}
    ref = args.reference
    print(f"| variant | quality (F1 vs {ref}) | first turns F1 | mean TTFT turns >= 2 (ms) | "
          f"TTFT / {ref} | DRAM hit rate | cached share | transcodes | codec mix |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m in rows.items():
        ratio = m["delay_ms"] / rows[ref]["delay_ms"]
        print(f"| {name} | {m['quality']:.3f} | {m['first_turn_quality']:.3f} | {m['delay_ms']:,.0f} | "
              f"{ratio:.2f} | {m['dram_hit_rate']:.2f} | {m['cached_share']:.2f} | {m['transcodes']:.0f} | "
              f"{m['codec_mix']} |")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, m in rows.items():
            ax.scatter(m["delay_ms"], m["quality"])
            ax.annotate(name, (m["delay_ms"], m["quality"]), fontsize=7)
        ax.set_xlabel("mean TTFT of later turns (ms)")
        ax.set_ylabel(f"answer F1 against {args.reference}")
        ax.set_title("quality against delay per policy")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    if args.profile_out:
        if None in (args.prefill_seconds_per_token, args.dram_bandwidth, args.ssd_bandwidth):
            sys.exit("--profile-out needs --prefill-seconds-per-token, --dram-bandwidth, --ssd-bandwidth")
        codecs = [{"name": c, "quality": round(rows[c]["quality"], 4)} for c in CODECS if c in rows]
        if args.merge_profile:
            measured = {c["name"] for c in codecs}
            earlier = json.load(open(args.merge_profile))["codecs"]
            codecs += [c for c in earlier if c["name"] not in measured]
            codecs.sort(key=lambda c: CODECS.index(c["name"]))
        if not codecs:
            sys.exit(f"--profile-out needs variants named after codecs ({', '.join(CODECS)})")
        profile = {
            "source": args.compare_json + (f" + {args.merge_profile}" if args.merge_profile else ""),
            "prefill_seconds_per_token": args.prefill_seconds_per_token,
            "tiers": [{"name": "dram", "bandwidth": args.dram_bandwidth, "latency_seconds": 0},
                      {"name": "ssd", "bandwidth": args.ssd_bandwidth, "latency_seconds": 0}],
            "codecs": codecs,
        }
        with open(args.profile_out, "w") as out:
            json.dump(profile, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
