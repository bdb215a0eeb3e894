// KV page formats (kv/kv_format.h) and their CPU reference (kernels/kv_format_ops.h): byte
// layouts and packings computed by hand, and round trips over a grid of dtypes, groupings,
// head dims and block sizes against error bounds computed independently, group by group, in
// plain C++ from the input (not from the packed scales).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "strata/kernels/kv_format_ops.h"

namespace strata::kernels::aten {
namespace {

using kv::Grouping;
using kv::TensorFormat;

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return {c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel()};
}

TEST(KvFormatTest, LayoutsMatchTheirDescription) {
  // 2 heads, 16 tokens, head_dim 64.
  const kv::TensorLayout int4 = kv::tensor_layout({DType::kInt4, Grouping::kPerToken, 32}, 2, 16, 64);
  EXPECT_EQ(int4.data_bytes, 2 * 16 * 64 / 2);
  EXPECT_EQ(int4.groups_per_head, 16 * 64 / 32);
  EXPECT_EQ(int4.scales_offset, 1024);
  EXPECT_EQ(int4.scale_bytes, 2 * 32 * 2);
  EXPECT_EQ(int4.zeros_offset, 1024 + 128);
  EXPECT_EQ(int4.total_bytes, 1024 + 128 + 128);
  const kv::TensorLayout int2 = kv::tensor_layout({DType::kInt2, Grouping::kPerChannel}, 2, 16, 64);
  EXPECT_EQ(int2.data_bytes, 512);
  EXPECT_EQ(int2.groups_per_head, 64);
  EXPECT_EQ(int2.total_bytes, 512 + 256 + 256);
  const kv::TensorLayout fp8 = kv::tensor_layout({DType::kFloat8E4M3, Grouping::kPerToken, 64}, 2, 16, 64);
  EXPECT_EQ(fp8.zero_bytes, 0) << "fp8 is symmetric";
  EXPECT_EQ(fp8.total_bytes, 2048 + 2 * 16 * 2);
  const kv::TensorLayout fp8_tensor =
      kv::tensor_layout({DType::kFloat8E4M3, Grouping::kPerTensor, 0}, 2, 16, 64);
  EXPECT_EQ(fp8_tensor.total_bytes, 2048) << "the scale is fixed: none stored";
  EXPECT_EQ(kv::block_bytes(kv::KvFormat::plain(DType::kBFloat16), 2, 16, 64), 2 * 2 * 16 * 64 * 2);
  // K8V4 (LeanKV's significant tokens): one format per tensor.
  const kv::KvFormat k8v4{{DType::kInt8, Grouping::kPerToken, 64}, {DType::kInt4, Grouping::kPerToken, 64}};
  EXPECT_EQ(kv::format_name(k8v4), "k:int8/token64,v:int4/token64");
  EXPECT_EQ(kv::block_bytes(k8v4, 2, 16, 64), (2048 + 64 + 64) + (1024 + 64 + 64));
}

TEST(KvFormatTest, ValidateRefusesFormatsThatDoNotFit) {
  EXPECT_TRUE(kv::validate({DType::kInt4, Grouping::kPerToken, 32}, 64, 16).ok());
  EXPECT_FALSE(kv::validate({DType::kInt4, Grouping::kPerToken, 48}, 64, 16).ok());
  EXPECT_FALSE(kv::validate({DType::kInt8, Grouping::kNone, 0}, 64, 16).ok());
  EXPECT_FALSE(kv::validate({DType::kBFloat16, Grouping::kPerChannel, 0}, 64, 16).ok());
  EXPECT_FALSE(kv::validate({DType::kInt2, Grouping::kPerChannel, 0}, 2, 16).ok());
  EXPECT_TRUE(kv::validate({DType::kFloat8E4M3, Grouping::kPerTensor, 0}, 64, 16).ok());
  EXPECT_FALSE(kv::validate({DType::kInt8, Grouping::kPerTensor, 0}, 64, 16).ok());
}

// vLLM's uncalibrated fp8 KV cache: e4m3 with the scale fixed at 1. Every element within half a
// step of e4m3 (3 mantissa bits; subnormal steps of 2^-9 below 2^-6), saturating at 448.
TEST(KvFormatTest, Fp8PerTensorIsE4m3WithAFixedScale) {
  const TensorFormat f{DType::kFloat8E4M3, Grouping::kPerTensor, 0};
  StatusOr<kv::KvFormat> parsed = kv::parse_format("fp8/tensor");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->key, f);
  EXPECT_EQ(kv::format_name(f), "float8_e4m3/tensor");
  at::manual_seed(7);
  at::Tensor x = at::randn({2, 16, 64}) * 20;
  x.index_put_({0, 3, 7}, 1000.0f);   // beyond e4m3: saturates
  x.index_put_({1, 0, 0}, 0.001f);    // subnormal
  const at::Tensor packed = pack_kv(x, f);
  ASSERT_EQ(packed.numel(), 2 * 16 * 64);
  const at::Tensor y = unpack_kv(packed, f, 2, 16, 64);
  EXPECT_EQ(y[0][3][7].item<float>(), 448.0f);
  const at::Tensor inside = x.abs() <= 448;
  const at::Tensor bound = x.abs() * 0x1p-4 + 0x1p-10;
  EXPECT_TRUE(((y - x).abs() <= bound).logical_or(inside.logical_not()).all().item<bool>());
  EXPECT_GT((y - x).abs().sum().item<float>(), 0.0f);
}

// Packings worked out by hand: codes, their nibbles and crumbs, the fp16 scale and zero.
TEST(KvFormatTest, SubBytePackingIsLowBitsFirst) {
  // int4, one group of 4: min 0, max 15 -> scale 1, zero 0, codes 0 1 2 15.
  const at::Tensor x4 = at::tensor({0.0f, 1.0f, 2.0f, 15.0f}).reshape({1, 1, 4});
  std::vector<uint8_t> want(20, 0);
  want[0] = 0x10;  // codes 0, 1
  want[1] = 0xF2;  // codes 2, 15
  want[17] = 0x3C;  // scale 1.0 in fp16 (0x3C00, little endian) at offset 16; zero 0.0 at 18
  EXPECT_EQ(bytes_of(pack_kv(x4, {DType::kInt4, Grouping::kPerToken, 4})), want);
  // int2, one group of 4: min -1, max 2 -> scale 1, zero -1, codes 0 1 2 3 -> 0b11'10'01'00.
  const at::Tensor x2 = at::tensor({-1.0f, 0.0f, 1.0f, 2.0f}).reshape({1, 1, 4});
  std::vector<uint8_t> want2(20, 0);
  want2[0] = 0xE4;
  want2[17] = 0x3C;
  want2[18] = 0x00;
  want2[19] = 0xBC;  // zero -1.0 in fp16 (0xBC00)
  EXPECT_EQ(bytes_of(pack_kv(x2, {DType::kInt2, Grouping::kPerToken, 4})), want2);
  EXPECT_TRUE(unpack_kv(pack_kv(x2, {DType::kInt2, Grouping::kPerToken, 4}),
                        {DType::kInt2, Grouping::kPerToken, 4}, 1, 1, 4)
                  .equal(x2));
}

// The bf16 pool of today is the bf16 format: its pages hold exactly what the pool holds.
TEST(KvFormatTest, UnquantizedPagesAreThePoolElements) {
  const at::Tensor x = at::randn({3, 16, 64}, at::TensorOptions().dtype(at::kFloat));
  for (auto [dtype, type] : {std::pair{DType::kFloat32, at::kFloat}, std::pair{DType::kBFloat16, at::kBFloat16},
                             std::pair{DType::kFloat16, at::kHalf}}) {
    const at::Tensor packed = pack_kv(x, {dtype});
    EXPECT_EQ(bytes_of(packed), bytes_of(x.to(type).view(at::kByte).reshape({-1}))) << dtype_name(dtype);
    EXPECT_TRUE(unpack_kv(packed, {dtype}, 3, 16, 64).equal(x.to(type).to(at::kFloat)));
  }
}

using GridCase = std::tuple<DType, Grouping, int /*group*/, int /*head_dim*/, int /*block*/>;

class KvFormatRoundTrip : public ::testing::TestWithParam<GridCase> {};

TEST_P(KvFormatRoundTrip, StaysWithinTheFormatsErrorBound) {
  const auto [dtype, grouping, group, head_dim, block] = GetParam();
  const TensorFormat f{dtype, grouping, grouping == Grouping::kPerToken ? group : 0};
  ASSERT_TRUE(kv::validate(f, head_dim, block).ok());
  constexpr int kHeads = 3;
  at::manual_seed(head_dim * 31 + block);
  at::Tensor x = at::randn({kHeads, block, head_dim});
  x.index_put_({1, 0, 5}, 9.0f);  // outliers: KV has them
  x.index_put_({2, block - 1, head_dim - 1}, -7.5f);
  const at::Tensor packed = pack_kv(x, f);
  ASSERT_EQ(packed.numel(), kv::tensor_layout(f, kHeads, block, head_dim).total_bytes);
  const at::Tensor y = unpack_kv(packed, f, kHeads, block, head_dim);
  ASSERT_EQ(y.sizes(), x.sizes());

  // Bounds per element from its group's range, in plain C++.
  const float* xs = x.data_ptr<float>();
  const float* ys = y.data_ptr<float>();
  auto at_ = [&](int h, int t, int d) { return static_cast<int64_t>((h * block + t) * head_dim + d); };
  const int bits = dtype_bits(dtype);
  double total_error = 0;
  for (int h = 0; h < kHeads; ++h) {
    for (int t = 0; t < block; ++t) {
      for (int d = 0; d < head_dim; ++d) {
        const int64_t i = at_(h, t, d);
        // The group of element (h, t, d).
        float lo = xs[i], hi = xs[i];
        if (grouping == Grouping::kPerToken) {
          const int start = d / group * group;
          for (int e = start; e < start + group; ++e) {
            lo = std::min(lo, xs[at_(h, t, e)]);
            hi = std::max(hi, xs[at_(h, t, e)]);
          }
        } else if (grouping == Grouping::kPerChannel) {
          for (int u = 0; u < block; ++u) {
            lo = std::min(lo, xs[at_(h, u, d)]);
            hi = std::max(hi, xs[at_(h, u, d)]);
          }
        }
        const double amax = std::max(std::abs(lo), std::abs(hi));
        double bound = 0;
        switch (dtype) {
          case DType::kFloat32: bound = 0; break;
          case DType::kBFloat16: bound = std::abs(xs[i]) * 0x1p-8; break;
          case DType::kFloat16: bound = std::abs(xs[i]) * 0x1p-11 + 0x1p-24; break;
          case DType::kFloat8E4M3:  // 3 mantissa bits, subnormals below 2^-6 of the scale
            bound = std::abs(xs[i]) * 0x1p-4 + amax / 448 * 0x1p-9 + amax * 0x1p-10;
            break;
          default: {  // min-max: half a step, plus the fp16 rounding of scale and zero
            const double levels = (1 << bits) - 1;
            bound = (hi - lo) / levels * 0.5 * (1 + 0x1p-10) + ((hi - lo) + std::abs(lo)) * 0x1p-10;
          }
        }
        const double error = std::abs(static_cast<double>(ys[i]) - xs[i]);
        total_error += error;
        ASSERT_LE(error, bound + 1e-7) << format_name(f) << " element (" << h << ", " << t << ", "
                                       << d << "): " << xs[i] << " -> " << ys[i];
      }
    }
  }
  if (dtype_is_quantized(dtype)) {
    EXPECT_GT(total_error, 0) << "a quantized round trip that loses nothing is not quantizing";
  }
}

std::string grid_name(const ::testing::TestParamInfo<GridCase>& info) {
  const auto [dtype, grouping, group, head_dim, block] = info.param;
  std::string name = dtype_name(dtype);
  if (grouping == Grouping::kPerToken) name += "_token" + std::to_string(group);
  if (grouping == Grouping::kPerChannel) name += "_channel";
  return name + "_d" + std::to_string(head_dim) + "_b" + std::to_string(block);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, KvFormatRoundTrip,
    ::testing::Combine(::testing::Values(DType::kInt8, DType::kInt4, DType::kInt2,
                                         DType::kFloat8E4M3),
                       ::testing::Values(Grouping::kPerToken, Grouping::kPerChannel),
                       ::testing::Values(32), ::testing::Values(64, 128),
                       ::testing::Values(16, 32)),
    grid_name);

INSTANTIATE_TEST_SUITE_P(
    Unquantized, KvFormatRoundTrip,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                       ::testing::Values(Grouping::kNone), ::testing::Values(0),
                       ::testing::Values(64, 128), ::testing::Values(16)),
    grid_name);

// Many whole blocks at once (what the executor's pool reads and writes) are, block by block and
// byte for byte, pack_kv of the keys followed by pack_kv of the values; and the inverse.
TEST(KvFormatBlocks, ManyBlocksAreEachBlockPackedOnItsOwn) {
  const std::vector<kv::KvFormat> formats = {
      kv::KvFormat::plain(DType::kBFloat16),
      {{DType::kInt8, Grouping::kPerToken, 64}, {DType::kInt4, Grouping::kPerToken, 32}},
      {{DType::kInt4, Grouping::kPerChannel, 0}, {DType::kInt2, Grouping::kPerToken, 16}},
      {{DType::kFloat8E4M3, Grouping::kPerToken, 64},
       {DType::kFloat8E4M3, Grouping::kPerToken, 64}}};
  const int64_t n = 5, heads = 3, block = 16, dim = 64;
  for (const kv::KvFormat& f : formats) {
    const at::Tensor blocks = at::randn({n, 2, heads, block, dim});
    const at::Tensor packed = pack_kv_blocks(blocks, f);
    ASSERT_EQ(packed.size(1), kv::block_bytes(f, heads, block, dim)) << kv::format_name(f);
    const at::Tensor unpacked = unpack_kv_blocks(packed, f, heads, block, dim);
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor one =
          at::cat({pack_kv(blocks[i][0], f.key), pack_kv(blocks[i][1], f.value)});
      EXPECT_EQ(bytes_of(packed[i]), bytes_of(one)) << kv::format_name(f) << " block " << i;
      const int64_t key_bytes = kv::tensor_layout(f.key, heads, block, dim).total_bytes;
      const at::Tensor k = unpack_kv(one.slice(0, 0, key_bytes), f.key, heads, block, dim);
      const at::Tensor v = unpack_kv(one.slice(0, key_bytes), f.value, heads, block, dim);
      EXPECT_TRUE(at::equal(unpacked[i][0], k) && at::equal(unpacked[i][1], v))
          << kv::format_name(f) << " block " << i;
    }
  }
}

}  // namespace
}  // namespace strata::kernels::aten
