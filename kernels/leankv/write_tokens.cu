// LeanKV's quantize-on-append (contract in ops.h, LeanKvWriteParams; the libtorch reference is
// kernels::aten::leankv_write_tokens): one warp per token. Each lane holds head_dim / 32
// consecutive elements of the token's key (then value), the warp reduces min and max, the fp16
// scale and zero are those of the reference (rounded before use), and each lane packs its codes
// and stores them where the page's chunked layout puts its bytes; lanes that hold half a byte
// (2-bit codes at head_dim 64) pair up through a shuffle (token_rows.cuh). Bit-identical to the
// reference.

#include <cstdint>

#include "../common/dispatch.cuh"
#include "token_rows.cuh"

namespace strata::kernels {
namespace {

using kv::leankv::PageSegments;

constexpr int kWarpsPerBlock = 4;

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    leankv_write_tokens_kernel(const LeanKvWriteParams p) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= p.num_tokens) return;  // whole warps leave together
  const PageSegments& seg = p.segments;
  unsigned char* page = p.pool + p.page[token] * p.page_bytes;
  const int slot = static_cast<int>(p.slot[token]);
  float x[D / 32];
  leankv_rows::gather_row<D>(p.key, token, p.kind, x);
  leankv_rows::store_row_bits<D>(p.bits.key, x, page, slot, seg.tokens, seg.key_data,
                                 seg.key_params);
  leankv_rows::gather_row<D>(p.value, token, p.kind, x);
  leankv_rows::store_row_bits<D>(p.bits.value, x, page, slot, seg.tokens, seg.value_data,
                                 seg.value_params);
  if (threadIdx.x % 32 == 0) {
    reinterpret_cast<float*>(page + seg.scores)[slot] = p.acc[token];
    reinterpret_cast<int32_t*>(page + seg.positions)[slot] = p.position[token];
  }
}

}  // namespace

void launch_leankv_write_tokens(const LeanKvWriteParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0) return;
  const unsigned blocks =
      static_cast<unsigned>((params.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
  STRATA_DISPATCH_HEAD_DIM(params.head_dim, [&] {
    launch_kernel(leankv_write_tokens_kernel<HEAD_DIM>, {blocks, kWarpsPerBlock * 32, 0, stream},
                  params);
  });
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
