#include "strata/kernels/cpu_ops.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

namespace strata::kernels::cpu {
namespace {

// Rows per parallel task: a decode step's few rows run inline, a prefill chunk splits.
constexpr int64_t kGrainRows = 32;

template <typename T>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  const int64_t hidden = x.size(1);
  const int64_t x_stride = x.stride(0);
  const T* x_data = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  const float eps_f = static_cast<float>(eps);
  at::parallel_for(0, x.size(0), kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* in = x_data + r * x_stride;
      T* o = out_data + r * hidden;
      float sum = 0.0f;
      for (int64_t i = 0; i < hidden; ++i) {
        const float v = static_cast<float>(in[i]);
        sum += v * v;
      }
      const float inv = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + eps_f);
      for (int64_t i = 0; i < hidden; ++i) {
        const T normed = static_cast<T>(static_cast<float>(in[i]) * inv);
        o[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed));
      }
    }
  });
}

// x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1], each product and the sum
// rounded to T as ATen's elementwise ops round them.
template <typename T>
void rotary_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                 at::Tensor& out) {
  const int64_t num_heads = x.size(1), dim = x.size(2), half = dim / 2;
  const T* x_data = x.data_ptr<T>();
  const T* cos_data = cos.data_ptr<T>();
  const T* sin_data = sin.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  auto term = [](T a, T b) {
    return static_cast<float>(static_cast<T>(static_cast<float>(a) * static_cast<float>(b)));
  };
  at::parallel_for(0, x.size(0), kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos_data + t * cos.stride(0);
      const T* s = sin_data + t * sin.stride(0);
      for (int64_t h = 0; h < num_heads; ++h) {
        const T* in = x_data + t * x.stride(0) + h * x.stride(1);
        T* o = out_data + (t * num_heads + h) * dim;
        for (int64_t i = 0; i < half; ++i) {
          const T a = in[i], b = in[i + half];
          o[i] = static_cast<T>(term(a, c[i]) + term(static_cast<T>(-static_cast<float>(b)), s[i]));
          o[i + half] = static_cast<T>(term(b, c[i + half]) + term(a, s[i + half]));
        }
      }
    }
  });
}

// Vector loops for the attention over one block of `rows` cached tokens ([rows, dim] floats,
// contiguous), compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time by the CPU
// (target_clones); `omp simd` lets the sums reassociate into lanes. ThreadSanitizer instruments
// the ifunc resolvers target_clones generates, which run during relocation before its runtime
// is up (every binary crashed at load): its builds keep the baseline version only.
#if defined(__SANITIZE_THREAD__)
#define STRATA_VECTOR_CLONES
#else
#define STRATA_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
// scores[r] = scale * <q, k[r]>
STRATA_VECTOR_CLONES void block_scores(const float* q, const float* k, int64_t rows, int64_t dim,
                                       float scale, float* scores) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* k_row = k + r * dim;
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < dim; ++i) acc += q[i] * k_row[i];
    scores[r] = acc * scale;
  }
}

// out += sum_r p[r] * v[r]
STRATA_VECTOR_CLONES void block_values(const float* p, const float* v, int64_t rows, int64_t dim,
                                       float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* v_row = v + r * dim;
    const float w = p[r];
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) out[i] += w * v_row[i];
  }
}

// `n` elements of T as float32: `src` itself for float, else converted into `buffer`.
template <typename T>
const float* as_float(const T* src, int64_t n, float* buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    for (int64_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(src[i]);
    return buffer;
  }
}

// One task per (sequence, KV head): the group's query heads score every cached token block by
// block in the order the sequence's block table lists them, then softmax and the value sum, in
// float32. A block's rows of one head are contiguous in the pool ([B, D] at stride D).
template <typename T>
void decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
                      const at::Tensor& block_tables, const at::Tensor& seq_lens,
                      const at::Tensor& cu_q_lens, double scale, at::Tensor* probs) {
  const int64_t num_seqs = seq_lens.size(0), num_heads = q.size(1), dim = q.size(2);
  const int64_t num_kv_heads = kv_cache.size(2), block_size = kv_cache.size(3);
  const int64_t group = num_heads / num_kv_heads;
  const auto lens = seq_lens.accessor<int32_t, 1>();
  const auto cu = cu_q_lens.accessor<int32_t, 1>();
  const auto tables = block_tables.accessor<int32_t, 2>();
  const T* cache = kv_cache.data_ptr<T>();
  const T* q_data = q.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  float* probs_data = probs != nullptr ? probs->data_ptr<float>() : nullptr;
  const int64_t probs_row = probs != nullptr ? probs->size(2) : 0;
  const float scale_f = static_cast<float>(scale);
  at::parallel_for(0, num_seqs * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, query(dim), buffer(block_size * dim), acc(dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / num_kv_heads, kv_head = task % num_kv_heads;
      if (cu[s + 1] - cu[s] != 1) continue;  // no query this step
      const int64_t ctx = lens[s], token = cu[s];
      scores.resize(ctx);
      // Rows [first, first + rows) of K (which 0) or V (1) for this head, as floats.
      auto block_rows = [&](int64_t which, int64_t first, int64_t rows) {
        const T* rows_data = cache + tables[s][first / block_size] * kv_cache.stride(0) +
                             which * kv_cache.stride(1) + kv_head * kv_cache.stride(2);
        return as_float(rows_data, rows * dim, buffer.data());
      };
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = kv_head * group + g;
        const T* q_row = q_data + token * q.stride(0) + head * q.stride(1);
        for (int64_t i = 0; i < dim; ++i) query[i] = static_cast<float>(q_row[i]);
        for (int64_t first = 0; first < ctx; first += block_size) {
          const int64_t rows = std::min(block_size, ctx - first);
          block_scores(query.data(), block_rows(0, first, rows), rows, dim, scale_f,
                       scores.data() + first);
        }
        const float max_score = *std::max_element(scores.begin(), scores.end());
        float sum = 0.0f;
        for (int64_t t = 0; t < ctx; ++t) {
          scores[t] = std::exp(scores[t] - max_score);
          sum += scores[t];
        }
        for (int64_t t = 0; t < ctx; ++t) scores[t] /= sum;
        if (probs_data != nullptr) {
          std::copy(scores.begin(), scores.begin() + ctx,
                    probs_data + (s * num_heads + head) * probs_row);
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t first = 0; first < ctx; first += block_size) {
          const int64_t rows = std::min(block_size, ctx - first);
          block_values(scores.data() + first, block_rows(1, first, rows), rows, dim, acc.data());
        }
        T* o = out_data + (token * num_heads + head) * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = static_cast<T>(acc[i]);
      }
    }
  });
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  const at::Tensor w = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "cpu_rms_norm",
                                  [&] { rms_norm_rows<scalar_t>(x, w, eps, out); });
  return out;
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "cpu_rotary",
                                  [&] { rotary_rows<scalar_t>(x, cos, sin, out); });
  return out;
}

void reshape_and_cache(at::Tensor& kv_cache, const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& slot_mapping) {
  const int64_t num_tokens = key.size(0), num_kv_heads = key.size(1);
  const int64_t block_size = kv_cache.size(3);
  const int64_t capacity = kv_cache.size(0) * block_size;
  const at::Tensor slots_t = slot_mapping.contiguous();
  const int64_t* slots = slots_t.data_ptr<int64_t>();
  for (int64_t t = 0; t < num_tokens; ++t) {  // all checked before anything is written
    TORCH_CHECK(slots[t] < capacity, "slot ", slots[t], " is outside the pool of ",
                kv_cache.size(0), " blocks x ", block_size, " slots");
  }
  const int64_t elem = static_cast<int64_t>(kv_cache.element_size());
  const size_t row_bytes = static_cast<size_t>(kv_cache.size(4) * elem);
  auto* cache = static_cast<char*>(kv_cache.data_ptr());
  for (int64_t which = 0; which < 2; ++which) {
    const at::Tensor& src = which == 0 ? key : value;
    const auto* src_data = static_cast<const char*>(src.data_ptr());
    for (int64_t t = 0; t < num_tokens; ++t) {
      if (slots[t] < 0) continue;
      const int64_t block = slots[t] / block_size, offset = slots[t] % block_size;
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        char* dst = cache + (block * kv_cache.stride(0) + which * kv_cache.stride(1) +
                             h * kv_cache.stride(2) + offset * kv_cache.stride(3)) *
                                elem;
        std::memcpy(dst, src_data + (t * src.stride(0) + h * src.stride(1)) * elem, row_bytes);
      }
    }
  }
}

void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            const at::Tensor& cu_q_lens, double scale, at::Tensor* probs) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "cpu_decode_attention",
                                  [&] {
                                    decode_attention<scalar_t>(out, q, kv_cache, block_tables,
                                                               seq_lens, cu_q_lens, scale, probs);
                                  });
}

void freekv_recall(const at::Tensor& chunks, const at::Tensor& items, at::Tensor& cache_k,
                   at::Tensor& cache_v, const at::Tensor& from_k, const at::Tensor& from_v) {
  const int64_t p = cache_k.size(1), heads = cache_k.size(2);
  const int64_t row = cache_k.size(3) * cache_k.element_size();  // bytes of one token of a head
  auto* dst_k = static_cast<std::byte*>(cache_k.data_ptr());
  auto* dst_v = static_cast<std::byte*>(cache_v.data_ptr());
  const auto* chunk = static_cast<const std::byte*>(chunks.data_ptr());
  const auto* src_k = static_cast<const std::byte*>(from_k.data_ptr());
  const auto* src_v = static_cast<const std::byte*>(from_v.data_ptr());
  const int32_t* item = items.data_ptr<int32_t>();
  // Byte offsets: NHD [slot, t, m, :]; a chunk [c, kv, t, :].
  auto nhd = [&](int64_t slot, int64_t t, int64_t m) { return ((slot * p + t) * heads + m) * row; };
  auto hnd = [&](int64_t c, int64_t kv, int64_t t) { return ((c * 2 + kv) * p + t) * row; };
  for (int64_t i = 0; i < items.size(0); ++i) {
    const int64_t m = item[3 * i], slot = item[3 * i + 1], source = item[3 * i + 2];
    for (int64_t t = 0; t < p; ++t) {
      if (source >= 0) {
        std::memcpy(dst_k + nhd(slot, t, m), chunk + hnd(source, 0, t), row);
        std::memcpy(dst_v + nhd(slot, t, m), chunk + hnd(source, 1, t), row);
      } else {
        std::memcpy(dst_k + nhd(slot, t, m), src_k + nhd(-source - 1, t, m), row);
        std::memcpy(dst_v + nhd(slot, t, m), src_v + nhd(-source - 1, t, m), row);
      }
    }
  }
}

}  // namespace strata::kernels::cpu
