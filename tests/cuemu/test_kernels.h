// Small kernels that exercise the emulator itself (test_kernels.cu): correct ones whose results
// are known, and broken ones (a removed barrier, a missing lane, a race) it must catch. Every
// pointer is host memory (the emulator's device memory).
#pragma once

#include <cstdint>

namespace cuemu_test {

// out[i] = in[n - 1 - i] through shared memory, one block of n <= 1024 threads; with_barrier =
// false removes the __syncthreads between the shared write and read.
void reverse_block(float* out, const float* in, int n, bool with_barrier);

// Each of `lanes` threads of one warp shuffles with full mask 0xffffffff (lanes < 32: the others
// are missing); out[i] = value of lane i ^ 1.
void shuffle_xor_partial_warp(float* out, int lanes);

// Lanes 0..15 shuffle with mask 0x0000ffff, reading lane i ^ 16 (outside the mask).
void shuffle_outside_mask(float* out);

// 64 threads: thread t writes s[t], then reads s[(t + 32) % 64] (the other warp's slot) with no
// barrier: a race between warps.
void cross_warp_race(float* out);

// 64 threads; only the first warp reaches __syncthreads, the second returns.
void divergent_barrier(float* out);

// Warp collectives with known results: out[0..31] __shfl_sync(lane 5), [32..63] shfl_up by 3,
// [64..95] shfl_down by 3 within width 16, [96..127] ballot of odd lanes, [128] any(lane == 7),
// [129] all(lane < 32), [130] all(lane < 31).
void warp_semantics(uint32_t* out);

// Copies n <= 256 floats global -> shared with cp.async (16-byte chunks) and out[i] = 2 s[i];
// wait_before_read = false reads shared memory before cp.async.wait_group (a bug).
void async_copy_double(float* out, const float* in, int n, bool wait_before_read);

// A cp.async the PTX ISA forbids: mode 0 copies into global memory `dst`, mode 1 from a source
// 4 bytes off 16-byte alignment.
void bad_async_copy(float* dst, const float* src, int mode);

// out[i] = the static __shared__ value thread i reads without anyone writing it.
void read_unwritten_shared(float* out, int n);

// counter += 1 from every thread of `blocks` blocks of 128 threads.
void atomic_count(int* counter, int blocks);

// A thread calls __trap().
void trap_kernel();

// Launches with `threads` threads per block and `dynamic_shared` bytes, after raising the limit
// to `raise_to` bytes when raise_to > 0.
void launch_with(int threads, int dynamic_shared, int raise_to);

// D[16][8] = A[16][16] B[16][8] (row-major fp32 in/out, rounded to bf16 or fp16 on the way in)
// through ldmatrix (A, and B with .trans from a row-major [16][8] tile) and mma.m16n8k16.
void mma_16x8x16(float* d, const float* a, const float* b, bool bf16);

}  // namespace cuemu_test
