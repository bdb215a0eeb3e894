// Whole KV blocks to and from an integer page format (contract in ops.h, KvBlocksParams; the
// libtorch reference is kernels::aten::pack_kv_blocks / unpack_kv_blocks). One thread block per
// (block, K or V, head), i.e. one [block_size, head_dim] tile of one head.
//
// Pack, in two phases so that no two threads write one byte: (1) a thread per group reduces its
// min and max, rounds scale = (max - min) / (2^bits - 1) and zero = min to fp16 as the
// reference does, stores them and keeps their float values in shared memory; (2) a thread per
// output byte quantizes the byte's elements with their groups' parameters and packs them, the
// first element in the low bits. Unpack: the tile's parameters into shared memory, then a thread
// per element computes code * scale + zero in float32, rounded once per operation (no FMA) as
// the reference's two tensor ops are, and stores it in the blocks' dtype.

#include <cmath>
#include <cstdint>

#include "../common/dispatch.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ void store_element(void* base, int64_t i, float v, DType kind) {
  switch (kind) {
    case DType::kFloat16:
      static_cast<__half*>(base)[i] = __float2half_rn(v);
      break;
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

// The tile a thread block works on: its K or V coding, its elements and its bytes.
struct Tile {
  const KvTensorCoding* coding;
  int64_t element_base;      // of element (token 0, channel 0) in `blocks`
  unsigned char* region;     // this tensor's region in the block's row
  int64_t head;
  int64_t elements;          // block_size * head_dim
};

__device__ __forceinline__ Tile tile_of(const KvBlocksParams& p) {
  const int64_t tile = blockIdx.x;  // (block, kv, head), head fastest
  const int64_t head = tile % p.num_kv_heads;
  const int64_t kv = (tile / p.num_kv_heads) % 2;
  const int64_t block = tile / (2 * p.num_kv_heads);
  const KvTensorCoding* coding = kv == 0 ? &p.key : &p.value;
  const int64_t elements = p.block_size * p.head_dim;
  return {coding, ((block * 2 + kv) * p.num_kv_heads + head) * elements,
          p.bytes + block * p.block_bytes + coding->region_offset, head, elements};
}

// Group of element e (token-major within the tile).
__device__ __forceinline__ int64_t group_of(const KvTensorCoding& c, int64_t e, int64_t head_dim) {
  return c.per_channel ? e % head_dim : e / c.group_size;
}

__global__ void __launch_bounds__(kThreads) pack_kv_blocks_kernel(const KvBlocksParams p) {
  STRATA_DYNAMIC_SHARED(float, params, 16);  // [groups] scales, then [groups] zeros
  const Tile t = tile_of(p);
  const KvTensorCoding& c = *t.coding;
  const int64_t groups = c.groups_per_head;
  const float max_code = static_cast<float>((1 << c.bits) - 1);
  __half* scales = reinterpret_cast<__half*>(t.region + c.scales_offset) + t.head * groups;
  __half* zeros = reinterpret_cast<__half*>(t.region + c.zeros_offset) + t.head * groups;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    const int64_t count = c.per_channel ? p.block_size : c.group_size;
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t e = c.per_channel ? i * p.head_dim + g : g * c.group_size + i;
      const float x = load_element(p.blocks, t.element_base + e, p.kind);
      lo = fminf(lo, x);
      hi = fmaxf(hi, x);
    }
    const __half scale_h = __float2half_rn((hi - lo) / max_code);
    const __half zero_h = __float2half_rn(lo);
    scales[g] = scale_h;
    zeros[g] = zero_h;
    params[g] = __half2float(scale_h);
    params[groups + g] = __half2float(zero_h);
  }
  __syncthreads();
  const int per_byte = 8 / c.bits;
  const int64_t head_bytes = t.elements / per_byte;
  unsigned char* data = t.region + t.head * head_bytes;
  for (int64_t b = threadIdx.x; b < head_bytes; b += blockDim.x) {
    uint32_t byte = 0;
    for (int k = 0; k < per_byte; ++k) {
      const int64_t e = b * per_byte + k;
      const int64_t g = group_of(c, e, p.head_dim);
      const float scale = params[g], zero = params[groups + g];
      const float divisor = scale > 0.0f ? scale : 1.0f;
      const float x = load_element(p.blocks, t.element_base + e, p.kind);
      const float q = fminf(fmaxf(rintf((x - zero) / divisor), 0.0f), max_code);
      byte |= static_cast<uint32_t>(q) << (k * c.bits);
    }
    data[b] = static_cast<unsigned char>(byte);
  }
}

__global__ void __launch_bounds__(kThreads) unpack_kv_blocks_kernel(const KvBlocksParams p) {
  STRATA_DYNAMIC_SHARED(float, params, 16);
  const Tile t = tile_of(p);
  const KvTensorCoding& c = *t.coding;
  const int64_t groups = c.groups_per_head;
  const __half* scales = reinterpret_cast<const __half*>(t.region + c.scales_offset) + t.head * groups;
  const __half* zeros = reinterpret_cast<const __half*>(t.region + c.zeros_offset) + t.head * groups;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    params[g] = __half2float(scales[g]);
    params[groups + g] = __half2float(zeros[g]);
  }
  __syncthreads();
  const int per_byte = 8 / c.bits;
  const uint32_t mask = (1u << c.bits) - 1;
  const unsigned char* data = t.region + t.head * (t.elements / per_byte);
  for (int64_t e = threadIdx.x; e < t.elements; e += blockDim.x) {
    const uint32_t code = (static_cast<uint32_t>(data[e / per_byte]) >> ((e % per_byte) * c.bits)) & mask;
    const int64_t g = group_of(c, e, p.head_dim);
    const float x = __fadd_rn(__fmul_rn(static_cast<float>(code), params[g]), params[groups + g]);
    store_element(p.blocks, t.element_base + e, x, p.kind);
  }
}

size_t shared_bytes(const KvBlocksParams& p) {
  const int64_t groups =
      p.key.groups_per_head > p.value.groups_per_head ? p.key.groups_per_head : p.value.groups_per_head;
  return static_cast<size_t>(groups) * 2 * sizeof(float);
}

unsigned num_tiles(const KvBlocksParams& p) {
  return static_cast<unsigned>(p.num_blocks * 2 * p.num_kv_heads);
}

}  // namespace

void launch_pack_kv_blocks(const KvBlocksParams& params, cudaStream_t stream) {
  if (params.num_blocks == 0) return;
  launch_kernel(pack_kv_blocks_kernel, {num_tiles(params), kThreads, shared_bytes(params), stream},
                params);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

void launch_unpack_kv_blocks(const KvBlocksParams& params, cudaStream_t stream) {
  if (params.num_blocks == 0) return;
  launch_kernel(unpack_kv_blocks_kernel, {num_tiles(params), kThreads, shared_bytes(params), stream},
                params);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
