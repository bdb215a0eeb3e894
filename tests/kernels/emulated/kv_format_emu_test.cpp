// Whole KV blocks to and from integer page formats (kernels/kv_format/pack_blocks.cu) under the
// emulator against the libtorch reference (kernels::aten::pack_kv_blocks / unpack_kv_blocks),
// every schedule: packed bytes bit-identical, unpacked values equal to the reference's float32
// rounded to the blocks' dtype. Grid: float32 / fp16 / bf16 x head_dim 64 / 128 x block 16 / 32
// tokens x KIVI at 8, 4 and 2 bits (per-channel keys, per-token values in groups of 32) and the
// transposed mix (per-token 4-bit keys in groups of 64, per-channel 2-bit values); blocks with a
// constant channel and a constant token (scale 0) and with large values.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <tuple>

#include "emulated_test_util.h"
#include "kernel_tolerance.h"
#include "launch_params.h"
#include "strata/kernels/kv_format_ops.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using Params = std::tuple<at::ScalarType, int64_t, int64_t, std::string>;

class KvFormatEmuTest : public ::testing::TestWithParam<Params> {
 protected:
  static constexpr int64_t kBlocks = 3, kHeads = 2;

  kv::KvFormat format() const { return kv::parse_format(std::get<3>(GetParam())).value(); }

  at::Tensor blocks() const {
    const auto [dtype, head_dim, block_size, name] = GetParam();
    at::manual_seed(head_dim + block_size + static_cast<int>(name.size()));
    at::Tensor x = at::randn({kBlocks, 2, kHeads, block_size, head_dim});
    x[0][0][1].select(1, 5).fill_(0.75);  // a constant key channel
    x[1][1][0][3].fill_(-2.0);            // a constant value token
    x[2].mul_(300);                       // large values
    return x.to(dtype);
  }
};

TEST_P(KvFormatEmuTest, PackIsBitIdenticalToTheReference) {
  const kv::KvFormat f = format();
  at::Tensor x = blocks();
  ASSERT_TRUE(kv::validate(f.key, x.size(4), x.size(3)).ok());
  const at::Tensor expected = aten::pack_kv_blocks(x, f);
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor bytes = at::full_like(expected, 0xA5);
        launch_pack_kv_blocks(kv_blocks_params(x, bytes, f), nullptr);
        return bytes;
      },
      expected, 0.0, 0.0);
}

TEST_P(KvFormatEmuTest, UnpackEqualsTheReference) {
  const kv::KvFormat f = format();
  const at::Tensor x = blocks();
  at::Tensor bytes = aten::pack_kv_blocks(x, f);
  const at::Tensor expected =
      aten::unpack_kv_blocks(bytes, f, x.size(2), x.size(3), x.size(4)).to(x.scalar_type());
  testing::expect_schedule_invariant_match(
      [&] {
        at::Tensor out = at::full_like(x, 7.0);
        launch_unpack_kv_blocks(kv_blocks_params(out, bytes, f), nullptr);
        return out;
      },
      expected, 0.0, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, KvFormatEmuTest,
    ::testing::Combine(::testing::Values(at::kFloat, at::kHalf, at::kBFloat16),
                       ::testing::Values<int64_t>(64, 128), ::testing::Values<int64_t>(16, 32),
                       ::testing::Values("k:int8/channel,v:int8/token32",
                                         "k:int4/channel,v:int4/token32",
                                         "k:int2/channel,v:int2/token32",
                                         "k:int4/token64,v:int2/channel")),
    [](const auto& info) {
      std::string name = std::get<3>(info.param);
      for (char& ch : name) {
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return testing::dtype_label(std::get<0>(info.param)) + "_d" +
             std::to_string(std::get<1>(info.param)) + "_b" +
             std::to_string(std::get<2>(info.param)) + "_" + name;
    });

}  // namespace
}  // namespace strata::kernels
