// Writes the new K/V of a forward pass into the paged KV pool (contract in ops.h). One CTA per
// token; its threads copy the token's K and V rows of every kv head, in 16-byte units when
// every pointer and stride allows (the common case), element by element otherwise.

#include <cstdint>

#include "../common/dispatch.cuh"

namespace strata::kernels {
namespace {

// ReshapeAndCacheParams with pointers as bytes and strides counted in copy units of type U.
struct CopyParams {
  unsigned char* kv_cache;
  const unsigned char* key;
  const unsigned char* value;
  const int64_t* slot_mapping;
  int64_t key_stride_token, key_stride_head;
  int64_t value_stride_token, value_stride_head;
  int64_t kv_stride_block, kv_stride_kv, kv_stride_head, kv_stride_token;
  int64_t block_size;
  int num_kv_heads;
  int units_per_row;  // head_dim in units of U
};

constexpr int kMaxThreads = 256;

template <typename U>
__global__ void __launch_bounds__(kMaxThreads) reshape_and_cache_kernel(const CopyParams p) {
  const int64_t token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0) return;  // padding token: nothing to write
  const int64_t block = slot / p.block_size;
  const int64_t offset = slot % p.block_size;
  U* dst_base = reinterpret_cast<U*>(p.kv_cache) + block * p.kv_stride_block +
                offset * p.kv_stride_token;
  const U* key = reinterpret_cast<const U*>(p.key) + token * p.key_stride_token;
  const U* value = reinterpret_cast<const U*>(p.value) + token * p.value_stride_token;
  const int per_tensor = p.num_kv_heads * p.units_per_row;
  for (int i = threadIdx.x; i < 2 * per_tensor; i += blockDim.x) {
    const int which = i / per_tensor;  // 0: K, 1: V
    const int rem = i - which * per_tensor;
    const int head = rem / p.units_per_row;
    const int unit = rem - head * p.units_per_row;
    const U* src = which == 0 ? key + head * p.key_stride_head : value + head * p.value_stride_head;
    dst_base[which * p.kv_stride_kv + head * p.kv_stride_head + unit] = src[unit];
  }
}

template <typename U>
void launch_copy(const ReshapeAndCacheParams& params, cudaStream_t stream) {
  const int64_t unit_elems = static_cast<int64_t>(sizeof(U)) / params.elem_size_bytes;
  CopyParams cp{};
  cp.kv_cache = static_cast<unsigned char*>(params.kv_cache);
  cp.key = static_cast<const unsigned char*>(params.key);
  cp.value = static_cast<const unsigned char*>(params.value);
  cp.slot_mapping = params.slot_mapping;
  cp.key_stride_token = params.key_stride_token / unit_elems;
  cp.key_stride_head = params.key_stride_head / unit_elems;
  cp.value_stride_token = params.value_stride_token / unit_elems;
  cp.value_stride_head = params.value_stride_head / unit_elems;
  cp.kv_stride_block = params.kv_stride_block / unit_elems;
  cp.kv_stride_kv = params.kv_stride_kv / unit_elems;
  cp.kv_stride_head = params.kv_stride_head / unit_elems;
  cp.kv_stride_token = params.kv_stride_token / unit_elems;
  cp.block_size = params.block_size;
  cp.num_kv_heads = static_cast<int>(params.num_kv_heads);
  cp.units_per_row = static_cast<int>(params.head_dim / unit_elems);
  const int64_t work = 2 * params.num_kv_heads * cp.units_per_row;
  const int threads =
      work >= kMaxThreads ? kMaxThreads : static_cast<int>((work + 31) / 32 * 32);
  launch_kernel(reshape_and_cache_kernel<U>,
                {static_cast<unsigned>(params.num_tokens), static_cast<unsigned>(threads), 0,
                 stream},
                cp);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

// True when every pointer and stride (in bytes) is a multiple of 16, so 16-byte units work.
bool vector_copy_ok(const ReshapeAndCacheParams& p) {
  const int64_t e = p.elem_size_bytes;
  const int64_t sizes[] = {p.head_dim * e,         p.key_stride_token * e, p.key_stride_head * e,
                           p.value_stride_token * e, p.value_stride_head * e,
                           p.kv_stride_block * e,  p.kv_stride_kv * e,     p.kv_stride_head * e,
                           p.kv_stride_token * e};
  for (int64_t v : sizes) {
    if (v % 16 != 0) return false;
  }
  const uintptr_t ptrs[] = {reinterpret_cast<uintptr_t>(p.kv_cache),
                            reinterpret_cast<uintptr_t>(p.key),
                            reinterpret_cast<uintptr_t>(p.value)};
  for (uintptr_t v : ptrs) {
    if (v % 16 != 0) return false;
  }
  return true;
}

}  // namespace

void launch_reshape_and_cache(const ReshapeAndCacheParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0 || params.num_kv_heads == 0 || params.head_dim == 0) return;
  if (params.block_size <= 0 || params.num_tokens >= (int64_t{1} << 31) ||
      (params.elem_size_bytes != 2 && params.elem_size_bytes != 4)) {
    std::fprintf(stderr,
                 "%s:%d: launch_reshape_and_cache: bad block_size %lld, num_tokens %lld or "
                 "element size %lld\n",
                 __FILE__, __LINE__, static_cast<long long>(params.block_size),
                 static_cast<long long>(params.num_tokens),
                 static_cast<long long>(params.elem_size_bytes));
    std::abort();
  }
  if (vector_copy_ok(params)) {
    launch_copy<uint4>(params, stream);
    return;
  }
  if (params.elem_size_bytes == 2) {
    launch_copy<uint16_t>(params, stream);
  } else {
    launch_copy<uint32_t>(params, stream);
  }
}

}  // namespace strata::kernels
