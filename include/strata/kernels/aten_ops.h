// The libtorch implementations of Strata's custom ops (kernels/torch_ops.h), for any device:
// what the CPU runs, what CUDA falls back to when the start-up self-check finds a custom kernel
// wrong or the configuration asks for libtorch (executor.kernels: torch), and the reference the
// self-check compares the custom kernels with. No argument checks: torch_ops.cpp checks first.
#pragma once

#include <cstdint>

namespace at {
class Tensor;
}

namespace strata::kernels::aten {

// Contracts as in torch_ops.h.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Gathers each sequence's K/V from its blocks, then SDPA per sequence. seq_lens and cu_q_lens
// must be host (CPU) tensors; the others on one device. Writes out [num_tokens, heads, dim].
void paged_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     const at::Tensor& cu_q_lens, double scale);

// Throws c10::Error when a slot lies outside the pool (reads the largest slot on the host).
void reshape_and_cache(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& slot_mapping);

// The attention each key receives from a chunk of m queries at positions [start, start + m) of
// one sequence (LeanKV's prompt significance, H2O's heavy-hitter scores; no custom kernel):
// q [m, H, D] and keys [start + m, Hkv, D] after RoPE (H a multiple of Hkv), causal softmax of
// q k^T * scale per query head. Returns float32 [H, start + m]: received[h, p] = sum over the
// chunk's queries j with start + j > p of A_h[j, p] (a token's own query excluded). Computed a
// bounded number of query rows at a time, never the whole m x (start + m) at once.
at::Tensor attention_received(const at::Tensor& q, const at::Tensor& keys, int64_t start,
                              double scale);

}  // namespace strata::kernels::aten
