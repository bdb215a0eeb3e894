// Every inline-PTX instruction the kernels use, behind one C++ function each, with a functional
// model under the CPU block emulator (tests/cuemu): cp.async (asynchronous global -> shared
// copies in commit groups), ldmatrix and mma.sync (tensor cores). Register fragment layouts are
// those of the PTX ISA ("Matrix Fragments for mma.m16n8k16", "ldmatrix"); the emulator's model
// of them is tested against an independent matmul in tests/cuemu.
#pragma once

#include <cstdint>

#include "cuda_compat.cuh"

namespace strata::kernels::ptx {

// 16-byte global -> shared copy that bypasses L1 (cp.async.cg); zero-fills the destination when
// !valid (the source is then not read). Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
#if defined(STRATA_CUEMU)
  ::cuemu::cp_async(smem_dst, gmem_src, 16, valid ? 16 : 0);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
#endif
}

// Closes the calling thread's open cp.async copies into a group.
__device__ __forceinline__ void cp_async_commit() {
#if defined(STRATA_CUEMU)
  ::cuemu::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of the calling thread's committed groups are in flight. Other threads'
// copies need a barrier after this to be visible.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(STRATA_CUEMU)
  ::cuemu::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lanes 8i..8i+7 give the row addresses (16 bytes each,
// shared memory) of 8x8 b16 matrix i; lane l receives in r[i] the two elements of row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (lower column in the low half).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
#if defined(STRATA_CUEMU)
  ::cuemu::ldmatrix_x4(r, smem_row, false);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// The same with .trans: lane l receives row 2 (l % 4) and 2 (l % 4) + 1, column l / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
#if defined(STRATA_CUEMU)
  ::cuemu::ldmatrix_x4(r, smem_row, true);
#else
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// d = a b + c for a 16x16 A (row-major fragment), 16x8 B (column-major fragment) and 16x8 fp32
// C/D: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32. With g = lane / 4 and
// t = lane % 4, each 32-bit register holds two consecutive-column (A) / consecutive-row (B)
// elements: a[0] = A[g][2t..], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..];
// b[0] = B[2t..][g], b[1] = B[2t+8..][g]; c/d[0,1] = C[g][2t, 2t+1], c/d[2,3] = C[g+8][2t, 2t+1].
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2], const float (&c)[4]) {
#if defined(STRATA_CUEMU)
  ::cuemu::mma_m16n8k16(d, a, b, c, /*bf16=*/true);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2], const float (&c)[4]) {
#if defined(STRATA_CUEMU)
  ::cuemu::mma_m16n8k16(d, a, b, c, /*bf16=*/false);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#endif
}

}  // namespace strata::kernels::ptx
