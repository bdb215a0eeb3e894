// Krul's decode-row statistics (contract in ops.h, KrulRowsParams; the libtorch reference is
// kernels::aten::krul_accumulate, docs/krul.md): each step's attention row of every layer of a
// sequence adds to its per-head squared distances between layers and its per-layer I-R mass,
// after which the rows are dropped (the paper's GPU path, with a preallocated row buffer instead
// of freeing each step).
//
// One thread block per (sequence, item): items [0, pairs * heads) are a pair of layers (i > j)
// and a head, whose block sums (a - b)^2 over the row's positions; items [pairs * heads,
// + layers) are a layer, whose block sums its rows' probability on the first and last
// max(1, floor(len / 10)) positions over every head. Each output element has one owner block,
// which adds its float32 sum to a compensated (Kahan) float32 accumulator: no atomics, no double
// precision, and the result does not depend on the order blocks run in.

#include <cstdint>

#include "../common/dispatch.cuh"

namespace strata::kernels {
namespace {

constexpr int kThreads = 256;

// Kahan summation into acc = {sum, compensation}: the running total is sum - compensation.
__device__ __forceinline__ void add_compensated(float* acc, float x) {
  const float y = x - acc[1];
  const float t = acc[0] + y;
  acc[1] = (t - acc[0]) - y;
  acc[0] = t;
}

// The pair (i, j), i > j, of index `pair` in the order (1, 0), (2, 0), (2, 1), (3, 0), ...
__device__ __forceinline__ void pair_of(int64_t pair, int64_t* i, int64_t* j) {
  int64_t deep = 1;
  while (deep * (deep + 1) / 2 <= pair) ++deep;
  *i = deep;
  *j = pair - deep * (deep - 1) / 2;
}

__global__ void __launch_bounds__(kThreads) krul_accumulate_rows_kernel(const KrulRowsParams p) {
  const int64_t layers = p.num_layers, heads = p.num_heads;
  const int64_t pair_items = layers * (layers - 1) / 2 * heads;
  const int64_t per_seq = pair_items + layers;
  const int64_t seq = blockIdx.x / per_seq, item = blockIdx.x % per_seq;
  const int64_t length = p.lengths[seq];
  const float* rows = p.rows + seq * layers * heads * p.row_stride;
  float sum = 0.0f;
  if (item < pair_items) {
    int64_t i = 0, j = 0;
    pair_of(item / heads, &i, &j);
    const int64_t h = item % heads;
    const float* a = rows + (i * heads + h) * p.row_stride;
    const float* b = rows + (j * heads + h) * p.row_stride;
    for (int64_t c = threadIdx.x; c < length; c += blockDim.x) {
      const float d = a[c] - b[c];
      sum += d * d;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0)
      add_compensated(p.squared + 2 * (((seq * layers + i) * layers + j) * heads + h), sum);
  } else {
    const int64_t l = item - pair_items;
    const int64_t edge = length / 10 > 1 ? length / 10 : 1;
    // Positions [0, edge) and [max(edge, length - edge), length): each once.
    const int64_t recent = length - edge > edge ? length - edge : edge;
    const int64_t count = edge + (length - recent);
    for (int64_t k = threadIdx.x; k < count * heads; k += blockDim.x) {
      const int64_t h = k / count, e = k % count;
      const int64_t c = e < edge ? e : recent + (e - edge);
      sum += rows[(l * heads + h) * p.row_stride + c];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) add_compensated(p.edge_mass + 2 * (seq * layers + l), sum);
  }
}

}  // namespace

void launch_krul_accumulate_rows(const KrulRowsParams& params, cudaStream_t stream) {
  if (params.num_seqs == 0 || params.num_layers == 0) return;
  const int64_t per_seq =
      params.num_layers * (params.num_layers - 1) / 2 * params.num_heads + params.num_layers;
  launch_kernel(krul_accumulate_rows_kernel,
                {static_cast<unsigned>(params.num_seqs * per_seq), kThreads, 0, stream}, params);
  STRATA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace strata::kernels
