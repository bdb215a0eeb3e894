#!/usr/bin/env python3
"""Checks the CUDA kernel sources against the rules that let them run under the CPU block
emulator (docs/kernels/emulator.md), and that every kernel launch ran under it.

Rules, for every .cu/.cuh file under --kernels:
  - no triple-chevron launch (kernel<<<...>>>): launches go through launch_kernel
    (kernels/common/cuda_compat.cuh, the one place that spells both), which the emulator
    replaces;
  - no `extern __shared__`: dynamic shared memory is declared with STRATA_DYNAMIC_SHARED;
  - no inline assembly outside kernels/common/ptx.cuh, whose instructions have emulator models;
  - every __global__ function is launched by name at some launch_kernel(...) site.
Coverage, with --launch-logs DIR: every __global__ function of kernels/ was launched under the
emulator by some test. The emulator tests write CUEMU_LAUNCH_LOG files ("<object file> <offset>"
per kernel launched); the offsets are resolved to function names with nm. A kernel whose emulator
test is missing, or skips it, fails the check.
Exit status 0 when everything holds; otherwise 1, with one line per problem.
"""

import argparse
import pathlib
import re
import subprocess
import sys

LAUNCH_RE = re.compile(r"\blaunch_kernel\s*\(\s*([A-Za-z_]\w*)")


def strip_comments(text):
    """Blanks out // and /* */ comments, keeping line numbers."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def skip_parens(text, i):
    """Offset just past the balanced parenthesis group that opens at or after offset i."""
    i = text.index("(", i)
    depth = 0
    while True:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            return i


def global_functions(text):
    """(name, offset) of every __global__ function: the identifier before its parameter list,
    after `void` and an optional __launch_bounds__(...)."""
    for m in re.finditer(r"\b__global__\b", text):
        i = m.end()
        while True:
            word = re.match(r"\s*([A-Za-z_]\w*)", text[i:])
            if word is None:
                break
            i += word.end()
            if word.group(1) == "__launch_bounds__":
                i = skip_parens(text, i)
            elif word.group(1) != "void":
                yield word.group(1), m.start()
                break


def check_sources(kernels_dir):
    problems, kernels, sites = [], {}, []
    for path in sorted(kernels_dir.rglob("*")):
        if path.suffix not in (".cu", ".cuh"):
            continue
        rel = path.relative_to(kernels_dir.parent)
        text = strip_comments(path.read_text())
        portability_header = path.name == "cuda_compat.cuh"  # defines the replacements
        for m in re.finditer(r"<<<", text if not portability_header else ""):
            problems.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: triple-chevron "
                            "launch; use launch_kernel (kernels/common/cuda_compat.cuh)")
        for m in re.finditer(r"\bextern\s+__shared__", text if not portability_header else ""):
            problems.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: extern __shared__; "
                            "use STRATA_DYNAMIC_SHARED")
        if path.name != "ptx.cuh":
            for m in re.finditer(r"\basm\b", text):
                problems.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: inline "
                                "assembly outside kernels/common/ptx.cuh")
        for name, offset in global_functions(text):
            kernels.setdefault(name, f"{rel}:{text.count(chr(10), 0, offset) + 1}")
        for m in LAUNCH_RE.finditer(text if not portability_header else ""):
            sites.append((m.group(1), f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"))
    launched = {name for name, _ in sites}
    for name, where in sorted(kernels.items()):
        if name not in launched:
            problems.append(f"{where}: __global__ {name} is never launched with launch_kernel")
    return problems, kernels, sites


def launched_names(log_dir):
    """Base names (no namespace, template arguments or parameters) of the functions the emulator
    logs in log_dir name."""
    offsets = {}
    for log in sorted(log_dir.glob("*.txt")):
        for line in log.read_text().splitlines():
            obj, _, offset = line.rpartition(" ")
            if obj:
                offsets.setdefault(obj, set()).add(int(offset, 16))
    names = set()
    for obj, wanted in offsets.items():
        out = subprocess.run(["nm", "-C", "--defined-only", obj], check=True, text=True,
                             capture_output=True).stdout
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and int(parts[0], 16) in wanted:
                name = parts[2].replace("(anonymous namespace)", "anonymous")
                name = re.sub(r"\(.*", "", name)           # parameters
                name = re.sub(r"<.*", "", name)             # template arguments
                names.add(name.rsplit("::", 1)[-1])
    return names


def check_coverage(kernels, log_dir):
    names = launched_names(log_dir)
    if not names:
        return [f"{log_dir}: no launch logs (run the emulator tests first: ctest -L emulator)"]
    return [f"{where}: __global__ {name} ran in no emulator test"
            for name, where in sorted(kernels.items()) if name not in names]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", type=pathlib.Path, required=True,
                        help="the kernels/ source folder")
    parser.add_argument("--launch-logs", type=pathlib.Path,
                        help="folder of the emulator tests' CUEMU_LAUNCH_LOG files")
    args = parser.parse_args()
    problems, kernels, sites = check_sources(args.kernels)
    if args.launch_logs is not None:
        problems += check_coverage(kernels, args.launch_logs)
    for p in problems:
        print(p)
    if not problems:
        print(f"ok: {len(kernels)} kernels, {len(sites)} launch sites"
              + (", every kernel ran under the emulator" if args.launch_logs else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
