#!/usr/bin/env python3
"""Writes codec qualities per task family into an AdaptCache profile (docs/adaptcache.md,
decision 11): each run of build/bench/codec_quality_bench (its JSON output, one family) sets
task_quality[family] of every codec the profile lists to that codec's mean --metric.

  task_quality_profile.py --profile IN.json --out OUT.json [--metric agreement|f1] RUN.json...

agreement (default): the share of the uncompressed model's answer tokens whose argmax the codec
keeps under teacher forcing; f1: token F1 of the codec's own greedy answer against it. A codec the
profile lists but a run lacks is an error (the server needs every listed codec for every family).
Stdlib only.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="codec_quality_bench outputs, one family each")
    ap.add_argument("--profile", required=True, help="the profile to start from")
    ap.add_argument("--out", required=True)
    ap.add_argument("--metric", choices=("agreement", "f1"), default="agreement")
    args = ap.parse_args()
    profile = json.load(open(args.profile))
    sources = profile.setdefault("task_quality_source", {})
    for path in args.runs:
        run = json.load(open(path))
        family, means = run["family"], run["means"]
        for codec in profile["codecs"]:
            if codec["name"] not in means:
                sys.exit(f"{path}: no {codec['name']} (the profile lists it)")
            codec.setdefault("task_quality", {})[family] = round(means[codec["name"]][args.metric], 4)
        sources[family] = f"{path} ({run['entries']} entries, {args.metric})"
    with open(args.out, "w") as out:
        json.dump(profile, out, indent=2)
        out.write("\n")


if __name__ == "__main__":
    main()
