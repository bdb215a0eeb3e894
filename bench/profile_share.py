#!/usr/bin/env python3
"""Share of CPU samples spent under given functions, from a call-graph profile.

Reads the text of `perf script -F tid,ip,sym` (a `perf record --call-graph dwarf` run) and
prints, for each NAME, the samples whose call stack holds a frame containing NAME: as a share
of all samples and of the samples under the --of frame (for instance the step thread's forward
pass). A sample counts once per NAME however many of its frames match.

    perf record -e cpu-clock -F 199 --call-graph dwarf,16384 -o run.data -- build/bin/strata ...
    perf script -i run.data --no-inline -F tid,ip,sym > run.txt
    bench/profile_share.py run.txt --of TorchExecutor::forward \\
        observe_attention AttentionObserver::after_pass PromptReducer::loop
"""

import argparse
import sys


def read_stacks(path):
    """Each sample's frames, leaf first: a header line, then one tab-indented line per frame."""
    stacks, frames = [], None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                if frames is not None:
                    stacks.append(frames)
                frames = None
            elif not line.startswith("\t"):
                frames = []
            elif frames is not None:
                parts = line.strip().split(None, 1)
                frames.append(parts[1] if len(parts) > 1 else parts[0])
    if frames is not None:
        stacks.append(frames)
    return stacks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("script", help="perf script -F tid,ip,sym output")
    parser.add_argument("names", nargs="+", help="frames to count samples under")
    parser.add_argument("--of", default=None, help="also report shares of the samples under it")
    args = parser.parse_args()
    stacks = read_stacks(args.script)
    if not stacks:
        sys.exit(f"{args.script}: no samples with call stacks")

    def under(name):
        return sum(1 for s in stacks if any(name in frame for frame in s))

    total = len(stacks)
    base = under(args.of) if args.of else 0
    print(f"samples: {total}" + (f", under {args.of}: {base}" if args.of else ""))
    either = sum(1 for s in stacks if any(n in frame for n in args.names for frame in s))
    for name, n in [(name, under(name)) for name in args.names] + [("(any of them)", either)]:
        line = f"{name}: {n} samples, {n / total:.2%} of all"
        if base:
            line += f", {n / base:.2%} of {args.of}'s"
        print(line)


if __name__ == "__main__":
    main()
