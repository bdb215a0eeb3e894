// LeanKV's decode step on the CPU (cpu_ops.h), with the contracts of kernels::aten's
// leankv_decode_attention and leankv_settle_plan (leankv_ops.h): each token's quantized key and
// value, accumulator and position are read in place in its page (kv/leankv_page_format.h)
// instead of gathered through index tensors into copies first.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "strata/kernels/cpu_ops.h"
#include "strata/kernels/leankv_ops.h"
#include "strata/kv/leankv_page_format.h"

namespace strata::kernels::cpu {
namespace {

using kv::leankv::PageFormat;
using kv::leankv::PageSegments;
using kv::leankv::Precision;

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof(bits));
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// `bytes` packed elements of `Bits` bits each (the first in the low bits) -> scale * q + zero.
template <int Bits>
void dequantize_bytes(const uint8_t* in, int64_t bytes, float scale, float zero, float* out) {
  constexpr int kPerByte = 8 / Bits;
  constexpr unsigned kMask = (1u << Bits) - 1;
#pragma omp simd
  for (int64_t b = 0; b < bytes; ++b) {
    const unsigned byte = in[b];
    for (int i = 0; i < kPerByte; ++i) {
      out[b * kPerByte + i] = scale * static_cast<float>((byte >> (i * Bits)) & kMask) + zero;
    }
  }
}

// Token `slot`'s `d` elements of a chunked data segment (chunk c of every token together),
// dequantized into out with the token's fp16 scale and zero.
void dequantize_token(const uint8_t* page, int64_t data, int64_t chunk, int64_t params,
                      int32_t tokens, int32_t bits, int64_t slot, int64_t d, float* out) {
  const float scale = half_at(page + params + slot * 4);
  const float zero = half_at(page + params + slot * 4 + 2);
  const int64_t per_byte = 8 / bits, chunks = d / per_byte / chunk;
  for (int64_t c = 0; c < chunks; ++c) {
    const uint8_t* in = page + data + (c * tokens + slot) * chunk;
    float* to = out + c * chunk * per_byte;
    switch (bits) {
      case 8:
        dequantize_bytes<8>(in, chunk, scale, zero, to);
        break;
      case 4:
        dequantize_bytes<4>(in, chunk, scale, zero, to);
        break;
      default:
        dequantize_bytes<2>(in, chunk, scale, zero, to);
        break;
    }
  }
}

// The page holding token i of an entry's tier p: high tokens fill the entry's table from the
// left, low ones from the right (leankv_token_slots' rule); its slot is i % tokens_per_page(p).
template <typename Byte>
Byte* page_of(Byte* pages, const PageFormat& format, const int32_t* entry_table, int64_t width,
              Precision p, int64_t i) {
  const int64_t per_page = format.tokens_per_page(p);
  const int64_t column = p == Precision::kHigh ? i / per_page : width - 1 - i / per_page;
  return pages + entry_table[column] * format.page_bytes();
}

template <typename T>
void leankv_attention(at::Tensor& out, const at::Tensor& q, at::Tensor& pool,
                      const PageFormat& format, const at::Tensor& tables,
                      const at::Tensor& token_counts, const at::Tensor& entries,
                      const at::Tensor& window, const at::Tensor& window_lens,
                      at::Tensor& window_acc, double scale) {
  const int64_t num_seqs = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = entries.size(1), group = heads / kv_heads, capacity = window.size(3);
  const int64_t width = tables.size(1);
  const int32_t* table = tables.data_ptr<int32_t>();
  const int32_t* counts = token_counts.data_ptr<int32_t>();
  const int32_t* entry_of = entries.data_ptr<int32_t>();
  const int32_t* lens = window_lens.data_ptr<int32_t>();
  uint8_t* pages = pool.data_ptr<uint8_t>();
  const T* q_data = q.data_ptr<T>();
  const T* window_data = window.data_ptr<T>();
  float* window_scores = window_acc.data_ptr<float>();
  T* out_data = out.data_ptr<T>();
  const float scale_f = static_cast<float>(scale);
  at::parallel_for(0, num_seqs * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> keys, values, scores, received, query(d), acc(d);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t s = row / kv_heads, h = row % kv_heads, e = entry_of[row];
      const int64_t stored[2] = {counts[2 * e], counts[2 * e + 1]};
      const int64_t in_window = lens[s], n = stored[0] + stored[1] + in_window;
      keys.resize(n * d);
      values.resize(n * d);
      scores.resize(n);
      received.assign(n, 0.0f);
      // The row's tokens in the reference's order: high, low (dequantized), then the window.
      const int32_t* entry_table = table + e * width;
      int64_t t = 0;
      for (const Precision p : {Precision::kHigh, Precision::kLow}) {
        const PageSegments& seg = format.segments(p);
        const kv::leankv::PrecisionBits& bits = format.bits(p);
        for (int64_t i = 0; i < stored[static_cast<int>(p)]; ++i, ++t) {
          const uint8_t* page = page_of(pages, format, entry_table, width, p, i);
          const int64_t slot = i % seg.tokens;
          dequantize_token(page, seg.key_data, seg.key_chunk, seg.key_params, seg.tokens, bits.key,
                           slot, d, keys.data() + t * d);
          dequantize_token(page, seg.value_data, seg.value_chunk, seg.value_params, seg.tokens,
                           bits.value, slot, d, values.data() + t * d);
        }
      }
      const T* window_k = window_data + ((s * 2 + 0) * kv_heads + h) * capacity * d;
      const T* window_v = window_data + ((s * 2 + 1) * kv_heads + h) * capacity * d;
      for (int64_t i = 0; i < in_window * d; ++i) {
        keys[t * d + i] = static_cast<float>(window_k[i]);
        values[t * d + i] = static_cast<float>(window_v[i]);
      }
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = h * group + g;
        const T* q_row = q_data + (s * heads + head) * d;
        for (int64_t i = 0; i < d; ++i) query[i] = static_cast<float>(q_row[i]);
        float max_score = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* k = keys.data() + j * d;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < d; ++i) dot += query[i] * k[i];
          scores[j] = dot * scale_f;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float p = scores[j] / sum;
          received[j] = std::max(received[j], p);
          const float* v = values.data() + j * d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) acc[i] += p * v[i];
        }
        T* o = out_data + (s * heads + head) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = static_cast<T>(acc[i]);
      }
      // Each token's accumulator grows by the most any of the group's heads gave it.
      t = 0;
      for (const Precision p : {Precision::kHigh, Precision::kLow}) {
        const PageSegments& seg = format.segments(p);
        for (int64_t i = 0; i < stored[static_cast<int>(p)]; ++i, ++t) {
          uint8_t* score =
              page_of(pages, format, entry_table, width, p, i) + seg.scores + (i % seg.tokens) * 4;
          float value;
          std::memcpy(&value, score, sizeof(value));
          value += received[t];
          std::memcpy(score, &value, sizeof(value));
        }
      }
      float* window_row = window_scores + row * capacity;
      for (int64_t i = 0; i < in_window; ++i) window_row[i] += received[t + i];
    }
  });
}

}  // namespace

at::Tensor leankv_decode_attention(const at::Tensor& q, at::Tensor& pool, const PageFormat& format,
                                   const at::Tensor& tables, const at::Tensor& token_counts,
                                   const at::Tensor& entries, const at::Tensor& window,
                                   const at::Tensor& window_lens, at::Tensor& window_acc,
                                   double scale) {
  at::Tensor out = at::empty(q.sizes(), q.options());
  const at::ScalarType dtype = q.scalar_type();
  if (dtype == at::kFloat) {
    leankv_attention<float>(out, q, pool, format, tables, token_counts, entries, window,
                            window_lens, window_acc, scale);
  } else if (dtype == at::kBFloat16) {
    leankv_attention<c10::BFloat16>(out, q, pool, format, tables, token_counts, entries, window,
                                    window_lens, window_acc, scale);
  } else {
    leankv_attention<c10::Half>(out, q, pool, format, tables, token_counts, entries, window,
                                window_lens, window_acc, scale);
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> leankv_settle_plan(
    const at::Tensor& pool, const PageFormat& format, const at::Tensor& tables,
    const at::Tensor& token_counts, const at::Tensor& entries, const at::Tensor& lengths,
    const at::Tensor& candidate, const kv::leankv::Thresholds& thresholds) {
  const int64_t m = entries.size(0), width = tables.size(1);
  const int32_t* table = tables.data_ptr<int32_t>();
  const int32_t* stored = token_counts.data_ptr<int32_t>();
  const int32_t* entry_of = entries.data_ptr<int32_t>();
  const int64_t* length = lengths.data_ptr<int64_t>();
  const uint8_t* pages = pool.data_ptr<uint8_t>();
  at::Tensor counts = at::empty({m, 2}, lengths.options());
  int64_t* count = counts.data_ptr<int64_t>();
  int64_t total[2] = {0, 0};
  for (int64_t i = 0; i < m; ++i) {
    for (int p = 0; p < 2; ++p) {
      count[2 * i + p] = stored[2 * entry_of[i] + p];
      total[p] += count[2 * i + p];
    }
  }
  // Each stored token's score, acc / (length - 1 - position) in float32, read in place.
  at::Tensor scores[2];
  for (const Precision p : {Precision::kHigh, Precision::kLow}) {
    const int t = static_cast<int>(p);
    const PageSegments& seg = format.segments(p);
    scores[t] = at::empty({total[t]}, lengths.options().dtype(at::kFloat));
    float* score = scores[t].data_ptr<float>();
    for (int64_t i = 0; i < m; ++i) {
      const int64_t e = entry_of[i];
      for (int64_t j = 0; j < count[2 * i + t]; ++j) {
        const uint8_t* page = page_of(pages, format, table + e * width, width, p, j);
        const int64_t slot = j % seg.tokens;
        float acc;
        int32_t position;
        std::memcpy(&acc, page + seg.scores + slot * 4, sizeof(acc));
        std::memcpy(&position, page + seg.positions + slot * 4, sizeof(position));
        *score++ = acc / static_cast<float>(length[i] - 1 - position);
      }
    }
  }
  return aten::leankv_settle_actions(format, counts, scores, lengths, candidate, thresholds);
}

}  // namespace strata::kernels::cpu
