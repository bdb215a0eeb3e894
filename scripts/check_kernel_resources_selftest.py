#!/usr/bin/env python3
"""Self-test of scripts/check_kernel_resources.py (ctest kernel_resources_selftest). Stdlib only.

  check_kernel_resources_selftest.py [--nvcc PATH] [--tool-dir DIR]...

Compiles three tiny kernels for sm_80 and sm_90 with nvcc into a temporary directory (a WMMA kernel
that must show HMMA in its SASS, a plain kernel, and one with a local array) and runs the checker on
them with good and deliberately wrong budgets and sources, asserting its exit status and FAIL lines:
each check must pass on good input and fail, naming the kernel, on bad input. Also unit-tests the
name normalisation and the __launch_bounds__ scanner. Prints 'N passed, N failed'; exit 1 if any
failed.
"""
import argparse
import contextlib
import copy
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_kernel_resources as ckr  # noqa: E402

GOOD_CU = r"""
#include <mma.h>
namespace strata::kernels {
namespace {
// One warp multiplies two 16x16 half tiles on tensor cores (HMMA).
template <int N>
__global__ void __launch_bounds__(32) tc_kernel(float* out, const __half* a, const __half* b) {
  __shared__ __half sa[N * N], sb[N * N];
  for (int i = threadIdx.x; i < N * N; i += 32) { sa[i] = a[i]; sb[i] = b[i]; }
  __syncwarp();
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major> fa;
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half, nvcuda::wmma::col_major> fb;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
  nvcuda::wmma::fill_fragment(acc, 0.0f);
  nvcuda::wmma::load_matrix_sync(fa, sa, N);
  nvcuda::wmma::load_matrix_sync(fb, sb, N);
  nvcuda::wmma::mma_sync(acc, fa, fb, acc);
  nvcuda::wmma::store_matrix_sync(out, acc, N, nvcuda::wmma::mem_row_major);
}
__global__ void __launch_bounds__(64) plain_kernel(float* out, const float* x) {
  out[threadIdx.x] = x[threadIdx.x] * 2.0f;  // no tensor cores here
}
}  // namespace
void launch(float* o, const __half* a, const __half* b, const float* x) {
  tc_kernel<16><<<1, 32>>>(o, a, b);
  plain_kernel<<<1, 64>>>(o, x);
}
}  // namespace strata::kernels
"""

LOCAL_CU = r"""
namespace strata::kernels {
namespace {
__global__ void __launch_bounds__(32) local_kernel(float* o, const int* idx) {
  float buf[256];  // dynamically indexed: lives in local memory (stack frame, STL/LDL)
  for (int i = 0; i < 256; ++i) buf[i] = o[i * 32 + threadIdx.x];
  o[threadIdx.x] = buf[idx[threadIdx.x]] + buf[idx[threadIdx.x + 32]];
}
}  // namespace
void launch_local(float* o, const int* i) { local_kernel<<<1, 32>>>(o, i); }
}  // namespace strata::kernels
"""

BOUNDED_CU = """// __global__ in a comment is ignored; so is "__global__" in a string.
template <typename T>
__global__ void __launch_bounds__(256, 2)
    bounded(T* p) {}
__launch_bounds__(128) __global__ void bounded_first(float* p) {}
#ifndef __CUDACC__
#define __global__  // an emulator may define the keyword away; that is no kernel
#endif
"""
UNBOUNDED_CU = """template <typename T>
__global__ void unbounded_kernel(T* __restrict__ out,
                                 const T* x) {}
static __global__ void declared_kernel(float* p);
#define STRATA_KERNEL(name) \\
  __global__ void name(float* p)
"""


class Runner:
    def __init__(self):
        self.passed = self.failed = 0

    def expect(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}\n{detail}")


def run_checker(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = ckr.main(argv)
    return rc, out.getvalue()


def compile_cu(nvcc, src, obj):
    cmd = [nvcc, "-c", "-std=c++17", "-O3", "-x", "cu",
           "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
           str(src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)}\n{proc.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--tool-dir", action="append", default=[])
    args = ap.parse_args()
    t = Runner()

    # Name normalisation and the source scanner need no tools.
    t.expect("normalize strips namespaces, return type, params", ckr.normalize(
        "void strata::kernels::(anonymous namespace)::k<__half, 128>(strata::kernels::(anonymous "
        "namespace)::P)") == ("k<__half, 128>", "(P)"))
    t.expect("normalize keeps extern C names", ckr.normalize("my_kernel") == ("my_kernel", ""))

    with tempfile.TemporaryDirectory(prefix="kernel_resources_") as tmp:
        tmp = Path(tmp)
        (tmp / "src_ok").mkdir()
        (tmp / "src_ok" / "ok.cu").write_text(BOUNDED_CU)
        (tmp / "src_bad").mkdir()
        (tmp / "src_bad" / "bad.cuh").write_text(UNBOUNDED_CU)
        t.expect("scanner accepts bounded kernels", ckr.scan_launch_bounds([tmp / "src_ok"]) == [])
        fails = ckr.scan_launch_bounds([tmp / "src_bad"])
        t.expect("scanner names unbounded kernels and macro kernels, file:line",
                 len(fails) == 3 and "bad.cuh:5: __global__ inside a macro" in fails[0]
                 and "bad.cuh:2: __global__ function unbounded_kernel" in fails[1]
                 and "bad.cuh:4: __global__ function declared_kernel" in fails[2], "\n".join(fails))

        for name, text in (("good", GOOD_CU), ("local", LOCAL_CU)):
            (tmp / f"{name}.cu").write_text(text)
            compile_cu(args.nvcc, tmp / f"{name}.cu", tmp / f"{name}.o")
        common = [f"--tool-dir={d}" for d in args.tool_dir] + ["--sources", str(tmp / "src_ok")]
        budget = tmp / "budget.json"

        def check(name, data, want_rc, want_text, obj="good.o", sources=None):
            budget.write_text(json.dumps(data))
            argv = [str(tmp / obj), "--budget", str(budget)] + common
            if sources:
                argv += ["--sources", str(sources)]
            rc, out = run_checker(argv)
            t.expect(name, rc == want_rc and all(s in out for s in want_text), out)

        rc, out = run_checker([str(tmp / "good.o"), "--budget", str(budget), "--update", "--list"]
                              + common)
        t.expect("--update writes a passing budget", rc == 0 and budget.exists(), out)
        good = json.loads(budget.read_text())
        keys = sorted(good["kernels"])
        t.expect("budget keys are the short names", keys == ["plain_kernel", "tc_kernel<16>"], keys)
        if keys != ["plain_kernel", "tc_kernel<16>"]:
            return finish(t)
        tc = copy.deepcopy(good)
        tc["kernels"]["tc_kernel<16>"]["tensor_cores"] = True
        check("tensor_cores kernel with HMMA passes", tc, 0, ["0 violations"])
        bad = copy.deepcopy(tc)
        bad["kernels"]["plain_kernel"]["tensor_cores"] = True
        check("tensor_cores kernel without HMMA fails", bad, 1,
              ["FAIL sm_80 plain_kernel: marked tensor_cores", "FAIL sm_90 plain_kernel: marked"])
        bad = copy.deepcopy(good)
        bad["kernels"]["plain_kernel"]["sm_90"]["registers"] -= 1
        check("one register over budget fails", bad, 1, ["FAIL sm_90 plain_kernel: registers"])
        bad = copy.deepcopy(good)
        bad["kernels"]["tc_kernel<16>"]["sm_80"]["shared_bytes"] -= 16
        check("shared memory over budget fails", bad, 1, ["FAIL sm_80 tc_kernel<16>: shared_bytes"])
        bad = copy.deepcopy(good)
        del bad["kernels"]["plain_kernel"]
        check("kernel without budget entry fails", bad, 1, ["FAIL plain_kernel: no budget entry"])
        bad = copy.deepcopy(good)
        bad["kernels"]["gone_kernel"] = copy.deepcopy(good["kernels"]["plain_kernel"])
        check("stale budget entry fails", bad, 1, ["FAIL gone_kernel: budget entry names a kernel"])
        check("kernel without __launch_bounds__ fails", good, 1,
              ["bad.cuh:2: __global__ function unbounded_kernel has no __launch_bounds__"],
              sources=tmp / "src_bad")
        bad = copy.deepcopy(good)
        bad["archs"] = ["sm_80", "sm_90", "sm_100"]
        check("arch missing from the binary is skipped with a note", bad, 0,
              ["note: the binary has no sm_100 code"])
        budget.unlink()
        rc, out = run_checker([str(tmp / "local.o"), "--budget", str(budget), "--update"] + common)
        t.expect("local memory fails even right after --update", rc == 1 and all(
            s in out for s in ["FAIL sm_80 local_kernel:", "FAIL sm_90 local_kernel:",
                               "stack bytes, must be 0", "STL (local store"]), out)
        rc, out = run_checker([str(tmp / "missing.a"), "--budget", str(budget)] + common)
        t.expect("missing binary is a tool error (exit 2)", rc == 2, out)
    return finish(t)


def finish(t):
    print(f"kernel_resources selftest: {t.passed} passed, {t.failed} failed")
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main())
