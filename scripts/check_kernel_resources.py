#!/usr/bin/env python3
"""Static resource checks of the CUDA kernels (docs/kernels/static-checks.md). Stdlib only.

  check_kernel_resources.py [--budget FILE] [--sources DIR]... [--tool-dir DIR]... [--update]
                            [--list] BINARY...

BINARY: object files or static libraries with sm_XX cubins, e.g. build/kernels/libstrata_kernels.a
($<TARGET_FILE:strata_kernels>). Kernels are keyed by their demangled name without the return
type, the parameter list, `strata::kernels::` and anonymous namespaces, e.g.
`paged_attention_kernel<__half, 128>` (the parameters stay only where two kernels share a key).

Each violation prints one line starting with FAIL; the exit status is then 1:
  1. a kernel uses more registers or static shared memory than its budget on an arch listed in
     the budget's "archs" (archs the binary lacks are skipped with a note; archs beyond the list,
     e.g. of a local single-arch build, are not budgeted);
  2. a kernel has a stack frame or local memory, or LDL/STL (spill, local array) in its SASS;
  3. a kernel in the binary has no budget entry, or a budget entry names no kernel in the binary;
  4. a kernel marked "tensor_cores": true has no TENSOR_CORE_OPS instruction in its SASS;
  5. a __global__ function in a .cu/.cuh under --sources has no `__launch_bounds__(`.
--update rewrites the budget from the binary with the exact measured values (never rounded up, so
any growth is seen; "tensor_cores" and other extra fields are kept), then checks as usual.
Exit status: 0 pass, 1 violations, 2 usage or tool error.
"""
import argparse
from collections import Counter
import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ARCHS = ["sm_80", "sm_90"]
TENSOR_CORE_OPS = {"HMMA", "HGMMA", "IMMA", "IGMMA", "QMMA", "QGMMA", "BMMA", "BGMMA", "DMMA"}
BUDGET_COMMENT = [
    "Kernel resource budget checked by scripts/check_kernel_resources.py (ctest kernel_resources).",
    "EXACT measured values, not rounded up, so any growth fails: registers per thread and static",
    "shared bytes as cuobjdump reports them (on sm_90 often with 1 KiB the system reserves).",
    "Stack, local memory and spills must be 0 and have no budget. After a deliberate change run",
    "scripts/check_kernel_resources.py --update build/kernels/libstrata_kernels.a and review the",
    "diff. \"tensor_cores\": true makes the kernel's SASS need HMMA/HGMMA/IMMA/... instructions.",
    "See docs/kernels/static-checks.md.",
]


class ToolError(Exception):
    pass


def tool_dirs(extra):
    """Where NVIDIA's binary tools may be: given dirs, the toolkit, PATH, then pip wheels."""
    dirs = list(extra) + [os.path.join(os.environ[v], "bin")
                          for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    dirs += os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/cuda/bin"]
    for prefix in (sys.prefix, str(REPO / ".venv")):  # nvidia-cuda-* wheels, then triton's copy
        for sub in ("nvidia/cu13/bin", "nvidia/cuda_cuobjdump/bin", "triton/backends/nvidia/bin"):
            dirs += sorted(glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", sub)))
    return dirs


def find_tool(names, dirs):
    paths = (os.path.join(d, n) for d in dirs if d for n in names)
    return next((p for p in paths if os.path.isfile(p) and os.access(p, os.X_OK)), None)


def run(cmd, env=None, stdin=None):
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ToolError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[:999]}")
    return proc.stdout


def parse_resource_usage(text, usage):
    """cuobjdump --dump-resource-usage: `arch = sm_90`, `Function NAME:`, `REG:.. STACK:.. ...`."""
    arch = fn = None
    for line in text.splitlines():
        if m := re.match(r"\s*arch = (sm_\w+)", line):
            arch = m.group(1)
        elif m := re.match(r"\s*Function (\S+):\s*$", line):
            fn = m.group(1)
        elif fn and re.match(r"\s*REG:\d+", line):
            cur = usage.setdefault((fn, arch), {})
            for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line):
                cur[k] = max(cur.get(k, 0), int(v))  # a kernel in two objects: the larger
            fn = None


def parse_sass(text, sass):
    """cuobjdump -sass: per (kernel, arch) counts of LDL, STL and tensor-core instructions."""
    arch = fn = None
    for line in text.splitlines():
        if m := re.match(r"\s*(?:arch = |code for )(sm_\w+)", line):
            arch = m.group(1)
        elif m := re.match(r"\s*Function : (\S+)", line):
            fn = m.group(1)
            sass.setdefault((fn, arch), {"LDL": 0, "STL": 0, "TC": 0})
        elif fn and (m := re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", line)):
            ops = [t for t in m.group(1).split() if not t.startswith("@")]  # drop predicate
            base = ops[0].split(".")[0] if ops else ""
            if base in ("LDL", "STL"):
                sass[(fn, arch)][base] += 1
            elif base in TENSOR_CORE_OPS:
                sass[(fn, arch)]["TC"] += 1


def split_params(sig):
    """'void a::f<int>(int*, long)' -> ('a::f<int>', '(int*, long)'); no list -> (sig, '')."""
    if not sig.endswith(")"):
        return sig, ""
    depth = 0
    for i in range(len(sig) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(sig[i], 0)
        if depth == 0:
            return sig[:i], sig[i:]
    return sig, ""


def normalize(demangled):
    s = demangled.replace("(anonymous namespace)::", "").replace("strata::kernels::", "")
    s = re.sub(r"^void ", "", s.strip())
    return split_params(s)


def kernel_keys(mangled_names, demangler):
    """{mangled: budget key}; one demangler call, names on stdin."""
    names = sorted(mangled_names)
    out = run([demangler], stdin="\n".join(names) + "\n").splitlines()
    parts = {m: normalize(d) for m, d in zip(names, out)}
    count = Counter(name for name, _ in parts.values())
    return {m: (n if count[n] == 1 else n + p) for m, (n, p) in parts.items()}


COMMENT_OR_LITERAL = re.compile(
    r"//[^\n]*|/\*.*?\*/"  # comments
    r"|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])'", re.S)  # string and char literals
PREPROCESSOR_LINE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)


def blank(match):  # keeps newlines, so line numbers stay right
    return re.sub(r"[^\n]", " ", match.group(0))


def scan_launch_bounds(source_dirs):
    """FAIL lines for each __global__ function without __launch_bounds__( in its declaration."""
    fails = []
    files = sorted(p for d in source_dirs for ext in ("*.cu", "*.cuh") for p in Path(d).rglob(ext))
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        text = COMMENT_OR_LITERAL.sub(blank, text)
        for m in PREPROCESSOR_LINE.finditer(text):  # __global__ in a macro's replacement text
            d = re.match(r"\s*#\s*define\s+\w+(?:\([^)]*\))?(.*)", m.group(0), re.S)
            if d and re.search(r"\b__global__\b", d.group(1)):
                line = text.count("\n", 0, m.start()) + 1
                fails.append(f"FAIL {path}:{line}: __global__ inside a macro; the launch-bounds "
                             "check cannot see it (define the kernel outside a macro)")
        text = PREPROCESSOR_LINE.sub(blank, text)
        for m in re.finditer(r"\b__global__\b", text):
            start = max(text.rfind(c, 0, m.start()) for c in ";{}") + 1
            end, depth = m.end(), 0
            while end < len(text) and not (depth == 0 and text[end] in "{;"):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            decl = text[start:end]
            if re.search(r"\b__launch_bounds__\s*\(", decl):
                continue
            after = text[m.end():end]
            name = re.search(r"([A-Za-z_]\w*)\s*\(", after)
            line = text.count("\n", 0, m.start()) + 1
            fails.append(f"FAIL {path}:{line}: __global__ function "
                         f"{name.group(1) if name else '?'} has no __launch_bounds__(...)")
    return fails


def measure(binaries, dirs, cuobjdump, demangler):
    """{key: {arch: {registers, shared_bytes, stack, local, ldl, stl, tensor_ops}}}."""
    dirs = list(dirs)
    cuobjdump = cuobjdump or find_tool(["cuobjdump"], dirs)
    demangler = demangler or find_tool(["cu++filt", "c++filt"], dirs + ["/usr/bin"])
    if not cuobjdump or not demangler:
        raise ToolError("cuobjdump or a demangler (cu++filt, c++filt) not found; searched: "
                        + " ".join(d for d in dict.fromkeys(dirs) if d))
    env = dict(os.environ)  # cuobjdump -sass runs nvdisasm from PATH
    nvdisasm = find_tool(["nvdisasm"], [os.path.dirname(cuobjdump)] + dirs)
    if not nvdisasm:
        raise ToolError("nvdisasm (needed by cuobjdump -sass) not found")
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    usage, sass = {}, {}
    for binary in binaries:
        if not os.path.isfile(binary):
            raise ToolError(f"{binary}: no such file (build strata_kernels first)")
        parse_resource_usage(run([cuobjdump, "--dump-resource-usage", binary]), usage)
        parse_sass(run([cuobjdump, "-sass", binary], env=env), sass)
    keys = kernel_keys({fn for fn, _ in usage}, demangler)
    result = {}
    for (fn, arch), u in usage.items():
        s = sass.get((fn, arch), {"LDL": 0, "STL": 0, "TC": 0})
        result.setdefault(keys[fn], {})[arch] = {
            "registers": u.get("REG", 0), "shared_bytes": u.get("SHARED", 0),
            "stack": u.get("STACK", 0), "local": u.get("LOCAL", 0),
            "ldl": s["LDL"], "stl": s["STL"], "tensor_ops": s["TC"]}
    return result


def update_budget(path, budget, measured, archs):
    missing = [a for a in archs if not any(a in per for per in measured.values())]
    if missing:
        raise ToolError(f"--update needs code for {', '.join(missing)} in the binary "
                        f"(build with CMAKE_CUDA_ARCHITECTURES covering {' '.join(archs)})")
    old = budget.get("kernels", {})
    kernels = {}
    for key in sorted(measured):
        entry = {k: v for k, v in old.get(key, {}).items() if not k.startswith("sm_")}
        entry.setdefault("tensor_cores", False)
        for arch in archs:
            m = measured[key].get(arch)
            if m:
                entry[arch] = {"registers": m["registers"], "shared_bytes": m["shared_bytes"]}
        kernels[key] = entry
    for key in sorted(set(kernels) - set(old)):
        print(f"update: added {key}")
    for key in sorted(set(old) - set(kernels)):
        print(f"update: removed {key}")
    new = {"_comment": budget.get("_comment", BUDGET_COMMENT), "archs": archs, "kernels": kernels}
    text = re.sub(r"\{\n\s+([^{}\[\]]*?)\n\s+\}",  # one line per arch: {"registers": .., ..}
                  lambda m: "{" + " ".join(m.group(1).split()) + "}", json.dumps(new, indent=2))
    Path(path).write_text(text + "\n")
    return new


def check(budget, measured, budget_path):
    fails, notes = [], []
    archs = budget.get("archs", DEFAULT_ARCHS)
    present = {a for per in measured.values() for a in per}
    for arch in archs:
        if arch not in present:
            notes.append(f"note: the binary has no {arch} code; its budgets are not checked")
    entries = budget.get("kernels", {})
    for key in sorted(measured):
        entry = entries.get(key)
        if entry is None:
            fails.append(f"FAIL {key}: no budget entry in {budget_path} (add one: --update)")
        for arch in sorted(measured[key]):
            m = measured[key][arch]
            where = f"FAIL {arch} {key}:"
            for what, label in (("stack", "stack bytes"), ("local", "local bytes"),
                                ("stl", "STL (local store/spill) instructions"),
                                ("ldl", "LDL (local load/spill) instructions")):
                if m[what]:
                    fails.append(f"{where} {m[what]} {label}, must be 0")
            if entry is None or arch not in archs:
                continue
            b = entry.get(arch)
            if b is None:
                fails.append(f"{where} no {arch} budget in its entry")
                continue
            for what in ("registers", "shared_bytes"):
                if not isinstance(b.get(what), int):
                    fails.append(f"{where} its {arch} budget has no integer {what}")
                elif m[what] > b[what]:
                    fails.append(f"{where} {what} {m[what]} > budget {b[what]}")
                elif m[what] < b[what]:
                    notes.append(f"note: {arch} {key}: {what} {m[what]} < budget {b[what]} "
                                 "(tighten with --update)")
            if entry.get("tensor_cores") and not m["tensor_ops"]:
                fails.append(f"{where} marked tensor_cores but its SASS has no "
                             f"{'/'.join(sorted(TENSOR_CORE_OPS))} instruction")
    for key in sorted(set(entries) - set(measured)):
        fails.append(f"FAIL {key}: budget entry names a kernel not in the binary (remove it)")
    return fails, notes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binaries", nargs="+", help="object files or static libraries")
    ap.add_argument("--budget", default=str(REPO / "kernels" / "resource_budget.json"))
    ap.add_argument("--sources", action="append", help="dir of .cu/.cuh (default kernels/)")
    ap.add_argument("--tool-dir", action="append", default=[], help="dir with cuobjdump/nvdisasm")
    ap.add_argument("--cuobjdump", help="explicit cuobjdump path")
    ap.add_argument("--demangler", help="explicit cu++filt or c++filt path")
    ap.add_argument("--update", action="store_true", help="rewrite the budget from the binary")
    ap.add_argument("--list", action="store_true", help="print the measured values")
    args = ap.parse_args(argv)
    try:
        measured = measure(args.binaries, tool_dirs(args.tool_dir), args.cuobjdump, args.demangler)
        if not measured:
            raise ToolError(f"no kernels found in {' '.join(args.binaries)}")
        budget_path = Path(args.budget)
        budget = json.loads(budget_path.read_text()) if budget_path.exists() else {}
        if args.update:
            archs = budget.get("archs", DEFAULT_ARCHS)
            budget = update_budget(budget_path, budget, measured, archs)
        elif not budget_path.exists():
            raise ToolError(f"{budget_path}: no budget file (create it with --update)")
    except (ToolError, json.JSONDecodeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list:
        print("arch   regs shared stack local  ldl  stl   tc  kernel")
        for key in sorted(measured):
            for arch, m in sorted(measured[key].items()):
                print(f"{arch:6} {m['registers']:4} {m['shared_bytes']:6} {m['stack']:5} "
                      f"{m['local']:5} {m['ldl']:4} {m['stl']:4} {m['tensor_ops']:4}  {key}")
    fails, notes = check(budget, measured, budget_path)
    fails += scan_launch_bounds(args.sources or [str(REPO / "kernels")])
    for line in notes + fails:
        print(line)
    archs = sorted({a for per in measured.values() for a in per})
    print(f"kernel resources: {len(measured)} kernels on {' '.join(archs)}, "
          f"{len(fails)} violations")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
