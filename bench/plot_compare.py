#!/usr/bin/env python3
"""Plots of a `strata bench compare` result (compare.json): TTFT CDF per variant, TTFT by turn
index (multi-turn workloads) and output throughput against request rate (several rates).

usage: plot_compare.py DIR   (reads DIR/compare.json, writes DIR/*.png)
Run by `strata bench compare` with the project's Python (.venv has matplotlib).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def save(fig, ax, title, path):
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    out_dir = sys.argv[1]
    with open(os.path.join(out_dir, "compare.json")) as f:
        runs = json.load(f)["runs"]
    names = sorted({r["variant"] for r in runs}, key=[r["variant"] for r in runs].index)
    rates = sorted({str(r["request_rate"]) for r in runs})
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ttfts = sorted(t * 1000 for t, e in zip(run["result"]["ttfts"], run["result"]["errors"])
                       if not e)
        if not ttfts:
            continue
        label = run["variant"] if len(rates) == 1 else f"{run['variant']} @ {run['request_rate']}/s"
        ax.step(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post",
                label=label)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of requests")
    save(fig, ax, "TTFT CDF", os.path.join(out_dir, "ttft_cdf.png"))
    written.append("ttft_cdf.png")

    if any("turns" in r["result"] for r in runs):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for run in runs:
            turns = run["result"].get("turns", [])
            label = run["variant"] if len(rates) == 1 else f"{run['variant']} @ {run['request_rate']}/s"
            ax.plot([t["turn"] for t in turns], [t["mean_ttft_ms"] for t in turns], marker="o",
                    label=label)
        ax.set_xlabel("turn")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("mean TTFT (ms)")
        save(fig, ax, "TTFT by turn", os.path.join(out_dir, "ttft_by_turn.png"))
        written.append("ttft_by_turn.png")

    numeric = [r for r in runs if isinstance(r["request_rate"], (int, float))]
    if len({r["request_rate"] for r in numeric}) > 1:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name in names:
            points = sorted((r["request_rate"], r["result"]["output_throughput"])
                            for r in numeric if r["variant"] == name)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("output tokens/s")
        save(fig, ax, "Throughput vs request rate", os.path.join(out_dir, "throughput_vs_rate.png"))
        written.append("throughput_vs_rate.png")
    print(" ".join(os.path.join(out_dir, w) for w in written))


if __name__ == "__main__":
    main()
