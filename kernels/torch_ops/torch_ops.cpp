#include "strata/kernels/torch_ops.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <initializer_list>

#include "launch_params.h"
#include "self_check.h"
#include "strata/kernels/aten_ops.h"
#include "strata/kernels/cpu_ops.h"
#include "strata/kernels/freekv_ops.h"
#include "strata/kernels/krul_ops.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

// `t` has `like`'s dtype and device.
void check_like(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(),
              ", expected ", like.scalar_type());
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), ", expected ",
              like.device());
}

void check_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// Strata's kernel serves CUDA tensors unless the caller asks for libtorch.
bool use_strata(const at::Tensor& t, KernelBackend backend) {
  TORCH_CHECK(t.is_cpu() || t.is_cuda(), "supported devices are CPU and CUDA, got ", t.device());
  return t.is_cuda() && backend == KernelBackend::kStrata;
}

// Strata's CPU loop (cpu_ops.h) serves CPU tensors whose innermost dimensions are contiguous,
// unless the caller asks for libtorch.
bool use_cpu_kernel(KernelBackend backend, std::initializer_list<const at::Tensor*> tensors) {
  if (backend != KernelBackend::kStrata) return false;
  for (const at::Tensor* t : tensors) {
    if (!t->is_cpu() || t->stride(t->dim() - 1) != 1) return false;
  }
  return true;
}

// FreeKV's selection and attention kernels: CUDA float16/bfloat16, head_dim 64 or 128, groups of
// at most 8 query heads over `kv_heads`.
bool freekv_kernel_serves(const at::Tensor& q, int64_t kv_heads, KernelBackend backend) {
  const int64_t heads = q.size(0), d = q.size(1);
  return use_strata(q, backend) &&
         (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) &&
         (d == 64 || d == 128) && kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= 8;
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                    KernelBackend backend) {
  check_like(weight, "weight", x);
  TORCH_CHECK(x.dim() == 2, "x must be [num_rows, hidden], got ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), "weight must be [", x.size(1),
              "], got ", weight.sizes());
  if (use_cpu_kernel(backend, {&x, &weight})) return cpu::rms_norm(x, weight, eps);
  if (!use_strata(x, backend)) return aten::rms_norm(x, weight, eps);
  check_contiguous(x, "x");
  check_contiguous(weight, "weight");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  launch_rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), x.size(0), x.size(1),
                  static_cast<float>(eps), dtype_of(x),
                  c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  return out;
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        KernelBackend backend) {
  check_like(cos, "cos", x);
  check_like(sin, "sin", x);
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0,
              "x must be [num_tokens, num_heads, even head_dim], got ", x.sizes());
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == x.size(0) && cos.size(1) == x.size(2),
              "cos must be [", x.size(0), ", ", x.size(2), "], got ", cos.sizes());
  TORCH_CHECK(sin.sizes() == cos.sizes(), "sin must match cos, got ", sin.sizes());
  if (use_cpu_kernel(backend, {&x, &cos, &sin})) return cpu::apply_rotary(x, cos, sin);
  if (!use_strata(x, backend)) return aten::apply_rotary(x, cos, sin);
  check_contiguous(x, "x");
  check_contiguous(cos, "cos");
  check_contiguous(sin, "sin");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);
  launch_rotary(out.data_ptr(), x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.size(0), x.size(1),
                x.size(2), dtype_of(x), c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  return out;
}

// ---- Paged attention and the KV-cache write ---------------------------------------------------
namespace {

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

void check_index_tensor(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.device() == q.device(), name, " is on ", t.device(), ", expected q's device ",
              q.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// Strides (in elements) and the base pointer must allow 16-byte vector access.
void check_vector_aligned(const at::Tensor& t, const char* name, int64_t dims_to_check) {
  const int64_t elems_per_16b = 16 / static_cast<int64_t>(t.element_size());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name,
              " must be 16-byte aligned");
  for (int64_t d = 0; d < dims_to_check; ++d) {
    TORCH_CHECK(t.stride(d) % elems_per_16b == 0, name, " stride ", d, " (", t.stride(d),
                ") must be a multiple of ", elems_per_16b, " elements");
  }
}

// Shape, dtype and device checks shared by the CPU and CUDA paths of paged_attention.
void check_paged_attention_args(const at::Tensor& q, const at::Tensor& kv_cache,
                                const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                const at::Tensor& cu_q_lens, int64_t max_q_len) {
  TORCH_CHECK(q.dim() == 3, "q must be [num_tokens, num_heads, head_dim], got ", q.sizes());
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(1) == 2,
              "kv_cache must be [num_blocks, 2, num_kv_heads, block_size, head_dim], got ",
              kv_cache.sizes());
  TORCH_CHECK(kv_cache.size(4) == q.size(2), "kv_cache head_dim ", kv_cache.size(4),
              " does not match q head_dim ", q.size(2));
  TORCH_CHECK(kv_cache.size(2) > 0 && q.size(1) % kv_cache.size(2) == 0, "num_heads ", q.size(1),
              " must be a multiple of num_kv_heads ", kv_cache.size(2));
  TORCH_CHECK(is_power_of_two(kv_cache.size(3)),
              "block_size (kv_cache dim 3) must be a power "
              "of two, got ",
              kv_cache.size(3));
  TORCH_CHECK(kv_cache.scalar_type() == q.scalar_type(), "kv_cache has dtype ",
              kv_cache.scalar_type(), ", expected q's dtype ", q.scalar_type());
  TORCH_CHECK(kv_cache.device() == q.device(), "kv_cache is on ", kv_cache.device(),
              ", expected q's device ", q.device());
  check_index_tensor(block_tables, "block_tables", q);
  check_index_tensor(seq_lens, "seq_lens", q);
  check_index_tensor(cu_q_lens, "cu_q_lens", q);
  TORCH_CHECK(seq_lens.dim() == 1, "seq_lens must be [num_seqs], got ", seq_lens.sizes());
  const int64_t num_seqs = seq_lens.size(0);
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == num_seqs,
              "block_tables must be [num_seqs = ", num_seqs, ", max_blocks_per_seq], got ",
              block_tables.sizes());
  TORCH_CHECK(cu_q_lens.dim() == 1 && cu_q_lens.size(0) == num_seqs + 1,
              "cu_q_lens must be [num_seqs + 1 = ", num_seqs + 1, "], got ", cu_q_lens.sizes());
  TORCH_CHECK(num_seqs > 0 || q.size(0) == 0, "q has ", q.size(0),
              " tokens but there are no "
              "sequences");
  TORCH_CHECK(max_q_len >= 1 || q.size(0) == 0, "max_q_len must be >= 1, got ", max_q_len);
}

// Value checks of the CPU path (the CUDA path cannot read device values without a sync).
void check_paged_attention_values(const at::Tensor& q, const at::Tensor& kv_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                  const at::Tensor& cu_q_lens, int64_t max_q_len) {
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t block_size = kv_cache.size(3);
  const int64_t num_blocks = kv_cache.size(0);
  const auto cu = cu_q_lens.accessor<int32_t, 1>();
  const auto lens = seq_lens.accessor<int32_t, 1>();
  const auto table = block_tables.accessor<int32_t, 2>();
  TORCH_CHECK(cu[0] == 0 && cu[num_seqs] == q.size(0), "cu_q_lens must run from 0 to num_tokens ",
              q.size(0), ", got ", cu[0], " .. ", cu[num_seqs]);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = cu[s + 1] - cu[s];
    TORCH_CHECK(q_len >= 0, "cu_q_lens must be non-decreasing (sequence ", s, ")");
    TORCH_CHECK(q_len <= max_q_len, "sequence ", s, " has q_len ", q_len, " > max_q_len ",
                max_q_len);
    TORCH_CHECK(lens[s] >= q_len, "sequence ", s, " has seq_len ", lens[s], " < q_len ", q_len,
                " (seq_lens include the new tokens)");
    const int64_t blocks_needed = (lens[s] + block_size - 1) / block_size;
    TORCH_CHECK(blocks_needed <= block_tables.size(1), "sequence ", s, " needs ", blocks_needed,
                " blocks but block_tables has ", block_tables.size(1), " columns");
    for (int64_t j = 0; j < blocks_needed; ++j) {
      TORCH_CHECK(table[s][j] >= 0 && table[s][j] < num_blocks, "block_tables[", s, "][", j,
                  "] = ", table[s][j], " is not a block of the pool (", num_blocks, " blocks)");
    }
  }
}

void paged_attention_cuda(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
                          const at::Tensor& block_tables, const at::Tensor& seq_lens,
                          const at::Tensor& cu_q_lens, int64_t max_q_len, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "paged_attention on CUDA supports float16 and bfloat16, got ", q.scalar_type());
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128,
              "paged_attention on CUDA supports head_dim 64 and 128, got ", q.size(2));
  TORCH_CHECK(q.stride(2) == 1, "q's last dimension must be contiguous");
  TORCH_CHECK(kv_cache.stride(4) == 1, "kv_cache's last dimension must be contiguous");
  check_vector_aligned(q, "q", 2);
  check_vector_aligned(kv_cache, "kv_cache", 4);
  TORCH_CHECK(kv_cache.size(2) <= 65535, "num_kv_heads must be <= 65535");
  const c10::cuda::CUDAGuard guard(q.device());
  PagedAttentionParams params =
      paged_attention_params(out, q, kv_cache, block_tables, seq_lens, cu_q_lens, max_q_len, scale);
  at::Tensor workspace;
  const size_t workspace_bytes = paged_attention_workspace_bytes(params);
  if (workspace_bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, q.options().dtype(at::kByte));
    params.workspace = workspace.data_ptr();
    params.workspace_bytes = workspace_bytes;
  }
  // The workspace goes back to the caching allocator when this returns; the allocator orders
  // its reuse after the kernels on this stream.
  launch_paged_attention(params, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
}

}  // namespace

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& kv_cache,
                           const at::Tensor& block_tables, const at::Tensor& seq_lens,
                           const at::Tensor& cu_q_lens, int64_t max_q_len, double scale,
                           KernelBackend backend, at::Tensor* probs) {
  check_paged_attention_args(q, kv_cache, block_tables, seq_lens, cu_q_lens, max_q_len);
  at::Tensor out = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  if (probs != nullptr) *probs = at::Tensor();
  if (q.size(0) == 0) return out;
  if (q.is_cpu()) {
    TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kHalf ||
                    q.scalar_type() == at::kBFloat16,
                "paged_attention on CPU supports float32, float16 and bfloat16, got ",
                q.scalar_type());
    check_paged_attention_values(q, kv_cache, block_tables, seq_lens, cu_q_lens, max_q_len);
    // The CPU kernel reads a block's rows of one head as one [B, D] array.
    if (max_q_len == 1 && use_cpu_kernel(backend, {&q, &kv_cache}) &&
        kv_cache.stride(3) == kv_cache.size(4)) {
      if (probs != nullptr) {
        *probs = at::empty({seq_lens.size(0), q.size(1), seq_lens.max().item<int32_t>()},
                           q.options().dtype(at::kFloat));
      }
      cpu::paged_decode_attention(out, q, kv_cache, block_tables, seq_lens, cu_q_lens, scale,
                                  probs);
    } else {
      aten::paged_attention(out, q, kv_cache, block_tables, seq_lens, cu_q_lens, scale);
    }
  } else if (use_strata(q, backend) && q.scalar_type() != at::kFloat) {
    paged_attention_cuda(out, q, kv_cache, block_tables, seq_lens, cu_q_lens, max_q_len, scale);
  } else {
    // libtorch on CUDA: asked for, or float32 (a reference dtype the kernel does not cover).
    // Reading the lengths on the host costs a sync.
    aten::paged_attention(out, q, kv_cache, block_tables, seq_lens.cpu(), cu_q_lens.cpu(), scale);
  }
  return out;
}

void reshape_and_cache(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& slot_mapping, KernelBackend backend) {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(1) == 2,
              "kv_cache must be [num_blocks, 2, num_kv_heads, block_size, head_dim], got ",
              kv_cache.sizes());
  const int64_t num_kv_heads = kv_cache.size(2);
  const int64_t head_dim = kv_cache.size(4);
  TORCH_CHECK(key.dim() == 3 && key.size(1) == num_kv_heads && key.size(2) == head_dim,
              "key must be [num_tokens, num_kv_heads = ", num_kv_heads, ", head_dim = ", head_dim,
              "], got ", key.sizes());
  TORCH_CHECK(value.sizes() == key.sizes(), "value must match key ", key.sizes(), ", got ",
              value.sizes());
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0),
              "slot_mapping must be [num_tokens = ", key.size(0), "], got ", slot_mapping.sizes());
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "slot_mapping must be int64, got ",
              slot_mapping.scalar_type());
  for (const auto& [t, name] : {std::pair{&key, "key"}, std::pair{&value, "value"},
                                std::pair{&slot_mapping, "slot_mapping"}}) {
    TORCH_CHECK(t->device() == kv_cache.device(), name, " is on ", t->device(),
                ", expected kv_cache's device ", kv_cache.device());
  }
  TORCH_CHECK(
      key.scalar_type() == kv_cache.scalar_type() && value.scalar_type() == kv_cache.scalar_type(),
      "key/value have dtype ", key.scalar_type(), "/", value.scalar_type(),
      ", expected kv_cache's dtype ", kv_cache.scalar_type());
  if (key.size(0) == 0) return;
  if (use_cpu_kernel(backend, {&kv_cache, &key, &value})) {
    cpu::reshape_and_cache(kv_cache, key, value, slot_mapping);
    return;
  }
  if (!use_strata(kv_cache, backend)) {
    aten::reshape_and_cache(kv_cache, key, value, slot_mapping);
    return;
  }
  TORCH_CHECK(kv_cache.scalar_type() == at::kFloat || kv_cache.scalar_type() == at::kHalf ||
                  kv_cache.scalar_type() == at::kBFloat16,
              "reshape_and_cache supports float32, float16 and bfloat16, got ",
              kv_cache.scalar_type());
  TORCH_CHECK(kv_cache.stride(4) == 1 && key.stride(2) == 1 && value.stride(2) == 1,
              "the last dimension of kv_cache, key and value must be contiguous");
  TORCH_CHECK(slot_mapping.is_contiguous(), "slot_mapping must be contiguous");
  const c10::cuda::CUDAGuard guard(kv_cache.device());
  launch_reshape_and_cache(reshape_and_cache_params(kv_cache, key, value, slot_mapping),
                           c10::cuda::getCurrentCUDAStream(kv_cache.get_device()).stream());
}

at::Tensor unpack_kv_blocks(const at::Tensor& bytes, const kv::KvFormat& format,
                            int64_t num_kv_heads, int64_t block_size, int64_t head_dim,
                            at::ScalarType dtype, KernelBackend backend) {
  TORCH_CHECK(bytes.dim() == 2 && bytes.scalar_type() == at::kByte &&
                  bytes.size(1) == kv::block_bytes(format, num_kv_heads, block_size, head_dim),
              "bytes must be [n, ", kv::block_bytes(format, num_kv_heads, block_size, head_dim),
              "] uint8 for ", kv::format_name(format), ", got ", bytes.sizes(), " ",
              bytes.scalar_type());
  for (const kv::TensorFormat& f : {format.key, format.value}) {
    const Status valid = kv::validate(f, head_dim, block_size);
    TORCH_CHECK(valid.ok(), valid.message());
  }
  auto integer = [](const kv::TensorFormat& f) {
    return f.dtype == DType::kInt8 || f.dtype == DType::kInt4 || f.dtype == DType::kInt2;
  };
  if (!use_strata(bytes, backend) || !integer(format.key) || !integer(format.value)) {
    return aten::unpack_kv_blocks(bytes, format, num_kv_heads, block_size, head_dim).to(dtype);
  }
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "unpack_kv_blocks writes float32, float16 or bfloat16, got ", dtype);
  check_contiguous(bytes, "bytes");
  at::Tensor blocks = at::empty({bytes.size(0), 2, num_kv_heads, block_size, head_dim},
                                bytes.options().dtype(dtype));
  at::Tensor in = bytes;
  const c10::cuda::CUDAGuard guard(bytes.device());
  launch_unpack_kv_blocks(kv_blocks_params(blocks, in, format),
                          c10::cuda::getCurrentCUDAStream(bytes.get_device()).stream());
  return blocks;
}

at::Tensor pack_kv_blocks(const at::Tensor& blocks, const kv::KvFormat& format,
                          KernelBackend backend) {
  TORCH_CHECK(blocks.dim() == 5 && blocks.size(1) == 2,
              "blocks must be [n, 2, num_kv_heads, block_size, head_dim], got ", blocks.sizes());
  const int64_t heads = blocks.size(2), block_size = blocks.size(3), head_dim = blocks.size(4);
  for (const kv::TensorFormat& f : {format.key, format.value}) {
    const Status valid = kv::validate(f, head_dim, block_size);
    TORCH_CHECK(valid.ok(), valid.message());
  }
  auto integer = [](const kv::TensorFormat& f) {
    return f.dtype == DType::kInt8 || f.dtype == DType::kInt4 || f.dtype == DType::kInt2;
  };
  const at::ScalarType dtype = blocks.scalar_type();
  if (!use_strata(blocks, backend) || !integer(format.key) || !integer(format.value) ||
      (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)) {
    return aten::pack_kv_blocks(blocks, format);
  }
  at::Tensor in = blocks.contiguous();
  at::Tensor bytes =
      at::empty({blocks.size(0), kv::block_bytes(format, heads, block_size, head_dim)},
                blocks.options().dtype(at::kByte));
  const c10::cuda::CUDAGuard guard(blocks.device());
  launch_pack_kv_blocks(kv_blocks_params(in, bytes, format),
                        c10::cuda::getCurrentCUDAStream(blocks.get_device()).stream());
  return bytes;
}

at::Tensor freekv_select(const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                         int64_t top_k, double scale, KernelBackend backend) {
  check_like(kmin, "kmin", q);
  check_like(kmax, "kmax", q);
  TORCH_CHECK(
      q.dim() == 2 && kmin.dim() == 3 && kmin.size(2) == q.size(1) && kmax.sizes() == kmin.sizes(),
      "freekv_select: q must be [n_q, d] and kmin, kmax [n_page, n_kv, d], got ", q.sizes(), ", ",
      kmin.sizes(), ", ", kmax.sizes());
  TORCH_CHECK(kmin.size(1) > 0 && q.size(0) % kmin.size(1) == 0, "freekv_select: ", q.size(0),
              " query heads over ", kmin.size(1), " KV heads");
  const int64_t k = std::min(top_k, kmin.size(0));
  if (k <= 0 || !freekv_kernel_serves(q, kmin.size(1), backend)) {
    return aten::freekv_select(q, kmin, kmax, top_k, scale);
  }
  check_contiguous(q, "q");
  check_contiguous(kmin, "kmin");
  check_contiguous(kmax, "kmax");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor scores = at::empty({kmin.size(1), kmin.size(0)}, q.options().dtype(at::kFloat));
  at::Tensor selected = at::empty({kmin.size(1), k}, q.options().dtype(at::kLong));
  FreeKvSelectParams params = freekv_select_params(scores, selected, q, kmin, kmax, scale);
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(freekv_select_workspace_bytes(params) / sizeof(float))},
                scores.options());
  params.workspace = workspace.data_ptr<float>();
  launch_freekv_select(params, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  return selected;
}

void freekv_offload(const at::Tensor& rows_k, const at::Tensor& rows_v, at::Tensor& page,
                    at::Tensor& kmin, at::Tensor& kmax, KernelBackend backend) {
  check_like(rows_v, "rows_v", rows_k);
  check_like(page, "page", rows_k);
  check_like(kmin, "kmin", rows_k);
  check_like(kmax, "kmax", rows_k);
  const bool contiguous = rows_k.is_contiguous() && rows_v.is_contiguous() &&
                          page.is_contiguous() && kmin.is_contiguous() && kmax.is_contiguous();
  const at::ScalarType dtype = rows_k.scalar_type();
  const bool float_type = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
  if (!use_strata(rows_k, backend) || !contiguous || !float_type) {
    aten::freekv_offload(rows_k, rows_v, page, kmin, kmax);
    return;
  }
  aten::check_freekv_offload(rows_k, rows_v, page, kmin, kmax);
  const c10::cuda::CUDAGuard guard(rows_k.device());
  launch_freekv_offload(freekv_offload_params(rows_k, rows_v, page, kmin, kmax),
                        c10::cuda::getCurrentCUDAStream(rows_k.get_device()).stream());
}

void freekv_recall(const at::Tensor& chunks, const at::Tensor& items, at::Tensor& cache_k,
                   at::Tensor& cache_v, const at::Tensor& from_k, const at::Tensor& from_v,
                   KernelBackend backend) {
  check_like(cache_k, "cache_k", chunks);
  check_like(cache_v, "cache_v", chunks);
  check_like(from_k, "from_k", chunks);
  check_like(from_v, "from_v", chunks);
  TORCH_CHECK(items.scalar_type() == at::kInt && items.device() == chunks.device(),
              "freekv_recall: items must be int32 on ", chunks.device(), ", got ",
              items.scalar_type(), " on ", items.device());
  aten::check_freekv_recall(chunks, items, cache_k, cache_v, from_k, from_v);
  const bool contiguous = chunks.is_contiguous() && items.is_contiguous() &&
                          cache_k.is_contiguous() && cache_v.is_contiguous() &&
                          from_k.is_contiguous() && from_v.is_contiguous();
  if (contiguous && use_cpu_kernel(backend, {&chunks, &items, &cache_k, &cache_v})) {
    const int32_t* item = items.data_ptr<int32_t>();
    for (int64_t i = 0; i < items.size(0); ++i) {
      const int64_t m = item[3 * i], slot = item[3 * i + 1], source = item[3 * i + 2];
      TORCH_CHECK(m >= 0 && m < cache_k.size(2) && slot >= 0 && slot < cache_k.size(0) &&
                      source >= -from_k.size(0) && source < chunks.size(0),
                  "freekv_recall: item ", i, " {", m, ", ", slot, ", ", source,
                  "} is outside the tensors");
    }
    cpu::freekv_recall(chunks, items, cache_k, cache_v, from_k, from_v);
    return;
  }
  if (!use_strata(chunks, backend) || !contiguous ||
      cache_k.size(3) * cache_k.element_size() % 16 != 0) {
    aten::freekv_recall(chunks, items, cache_k, cache_v, from_k, from_v);
    return;
  }
  check_vector_aligned(chunks, "chunks", 0);
  check_vector_aligned(cache_k, "cache_k", 0);
  check_vector_aligned(cache_v, "cache_v", 0);
  check_vector_aligned(from_k, "from_k", 0);
  check_vector_aligned(from_v, "from_v", 0);
  const c10::cuda::CUDAGuard guard(chunks.device());
  launch_freekv_recall(freekv_recall_params(chunks, items, cache_k, cache_v, from_k, from_v),
                       c10::cuda::getCurrentCUDAStream(chunks.get_device()).stream());
}

at::Tensor freekv_attention(const at::Tensor& q, const at::Tensor& resident_k,
                            const at::Tensor& resident_v, const at::Tensor& cache_k,
                            const at::Tensor& cache_v, const at::Tensor& slots, double scale,
                            KernelBackend backend) {
  check_like(resident_k, "resident_k", q);
  check_like(resident_v, "resident_v", q);
  check_like(cache_k, "cache_k", q);
  check_like(cache_v, "cache_v", q);
  TORCH_CHECK(q.dim() == 2 && resident_k.dim() == 3 && cache_k.dim() == 4 &&
                  resident_v.sizes() == resident_k.sizes() && cache_v.sizes() == cache_k.sizes() &&
                  resident_k.size(2) == q.size(1) && cache_k.size(2) == resident_k.size(1) &&
                  cache_k.size(3) == q.size(1) && slots.dim() == 1 &&
                  slots.size(0) == resident_k.size(1),
              "freekv_attention: q ", q.sizes(), ", resident ", resident_k.sizes(), ", cache ",
              cache_k.sizes(), ", slots ", slots.sizes());
  const bool contiguous = q.is_contiguous() && resident_k.is_contiguous() &&
                          resident_v.is_contiguous() && cache_k.is_contiguous() &&
                          cache_v.is_contiguous();
  if (!freekv_kernel_serves(q, resident_k.size(1), backend) || !contiguous) {
    return aten::freekv_attention(q, resident_k, resident_v, cache_k, cache_v, slots, scale);
  }
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.device() == q.device(),
              "freekv_attention: slots must be int64 on ", q.device());
  check_vector_aligned(resident_k, "resident_k", 0);
  check_vector_aligned(resident_v, "resident_v", 0);
  check_vector_aligned(cache_k, "cache_k", 0);
  check_vector_aligned(cache_v, "cache_v", 0);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty_like(q);
  const at::Tensor counts = slots.contiguous();
  FreeKvAttentionParams params =
      freekv_attention_params(out, q, resident_k, resident_v, cache_k, cache_v, counts, scale);
  at::Tensor workspace =
      at::empty({static_cast<int64_t>(freekv_attention_workspace_bytes(params) / sizeof(float))},
                q.options().dtype(at::kFloat));
  params.workspace = workspace.data_ptr<float>();
  launch_freekv_attention(params, c10::cuda::getCurrentCUDAStream(q.get_device()).stream());
  return out;
}

void krul_accumulate_rows(const at::Tensor& rows, const at::Tensor& lengths, at::Tensor& squared,
                          at::Tensor& edge_mass, KernelBackend backend) {
  const bool contiguous = rows.is_contiguous() && lengths.is_contiguous() &&
                          squared.is_contiguous() && edge_mass.is_contiguous();
  if (!use_strata(rows, backend) || !contiguous || rows.scalar_type() != at::kFloat) {
    aten::krul_accumulate_rows(rows, lengths, squared, edge_mass);
    return;
  }
  const c10::cuda::CUDAGuard guard(rows.device());
  launch_krul_accumulate_rows(krul_rows_params(rows, lengths, squared, edge_mass),
                              c10::cuda::getCurrentCUDAStream(rows.get_device()).stream());
}

KernelOpTable torch_ops_table(KernelBackend backend) {
  KernelOpTable t;
  t.rms_norm = [backend](const at::Tensor& x, const at::Tensor& w, double eps) {
    return rms_norm(x, w, eps, backend);
  };
  t.apply_rotary = [backend](const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    return apply_rotary(x, cos, sin, backend);
  };
  t.paged_attention = [backend](const at::Tensor& q, const at::Tensor& kv, const at::Tensor& tables,
                                const at::Tensor& lens, const at::Tensor& cu, int64_t max_q_len,
                                double scale) {
    return paged_attention(q, kv, tables, lens, cu, max_q_len, scale, backend);
  };
  t.reshape_and_cache = [backend](at::Tensor& kv, const at::Tensor& key, const at::Tensor& value,
                                  const at::Tensor& slots) {
    reshape_and_cache(kv, key, value, slots, backend);
  };
  t.unpack_kv_blocks = [backend](const at::Tensor& bytes, const kv::KvFormat& format, int64_t h,
                                 int64_t b, int64_t d, at::ScalarType dtype) {
    return unpack_kv_blocks(bytes, format, h, b, d, dtype, backend);
  };
  t.pack_kv_blocks = [backend](const at::Tensor& blocks, const kv::KvFormat& format) {
    return pack_kv_blocks(blocks, format, backend);
  };
  t.freekv_select = [backend](const at::Tensor& q, const at::Tensor& kmin, const at::Tensor& kmax,
                              int64_t top_k, double scale) {
    return freekv_select(q, kmin, kmax, top_k, scale, backend);
  };
  t.freekv_offload = [backend](const at::Tensor& rows_k, const at::Tensor& rows_v, at::Tensor& page,
                               at::Tensor& kmin, at::Tensor& kmax) {
    freekv_offload(rows_k, rows_v, page, kmin, kmax, backend);
  };
  t.freekv_recall = [backend](const at::Tensor& chunks, const at::Tensor& items,
                              at::Tensor& cache_k, at::Tensor& cache_v, const at::Tensor& from_k,
                              const at::Tensor& from_v) {
    freekv_recall(chunks, items, cache_k, cache_v, from_k, from_v, backend);
  };
  t.freekv_attention = [backend](const at::Tensor& q, const at::Tensor& rk, const at::Tensor& rv,
                                 const at::Tensor& ck, const at::Tensor& cv,
                                 const at::Tensor& slots, double scale) {
    return freekv_attention(q, rk, rv, ck, cv, slots, scale, backend);
  };
  t.krul_accumulate_rows = [backend](const at::Tensor& rows, const at::Tensor& lengths,
                                     at::Tensor& squared, at::Tensor& edge_mass) {
    krul_accumulate_rows(rows, lengths, squared, edge_mass, backend);
  };
  t.leankv_pages = [backend](LeanKvPageOp op, at::Tensor& ring, at::Tensor& counters,
                             at::Tensor& tables, at::Tensor& counts, const at::Tensor& entries,
                             const at::Tensor& amounts) {
    leankv_pages(op, ring, counters, tables, counts, entries, amounts, backend);
  };
  t.leankv_write_tokens = [backend](at::Tensor& pool, const kv::leankv::PageFormat& format,
                                    kv::leankv::Precision precision, const at::Tensor& page,
                                    const at::Tensor& slot, const at::Tensor& key,
                                    const at::Tensor& value, const at::Tensor& acc,
                                    const at::Tensor& position) {
    leankv_write_tokens(pool, format, precision, page, slot, key, value, acc, position, backend);
  };
  t.leankv_decode_attention =
      [backend](const at::Tensor& q, at::Tensor& pool, const kv::leankv::PageFormat& format,
                const at::Tensor& tables, const at::Tensor& token_counts, const at::Tensor& entries,
                const at::Tensor& window, const at::Tensor& window_lens, at::Tensor& window_acc,
                int64_t max_tokens, double scale) {
        return leankv_decode_attention(q, pool, format, tables, token_counts, entries, window,
                                       window_lens, window_acc, max_tokens, scale, backend);
      };
  t.leankv_settle_plan = [backend](const at::Tensor& pool, const kv::leankv::PageFormat& format,
                                   const at::Tensor& tables, const at::Tensor& token_counts,
                                   const at::Tensor& entries, const at::Tensor& lengths,
                                   const at::Tensor& candidate,
                                   const kv::leankv::Thresholds& thresholds) {
    return leankv_settle_plan(pool, format, tables, token_counts, entries, lengths, candidate,
                              thresholds, backend);
  };
  t.leankv_settle_apply = [backend](at::Tensor& pool, const kv::leankv::PageFormat& format,
                                    const at::Tensor& tables, at::Tensor& token_counts,
                                    const at::Tensor& entries, const at::Tensor& actions,
                                    const at::Tensor& key, const at::Tensor& value,
                                    const at::Tensor& acc, const at::Tensor& position) {
    leankv_settle_apply(pool, format, tables, token_counts, entries, actions, key, value, acc,
                        position, backend);
  };
  return t;
}

}  // namespace strata::kernels
