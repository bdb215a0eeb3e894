// Tests for dequantize_row() and the GGML type table.
//
// Reference comparisons read the cases written by tests/reference/dequant_reference.py (ctest
// fixture dequant_blocks) from STRATA_TEST_DATA_DIR/dequant/. Tolerance: none. Every value must be
// bit-identical to gguf-py's float32 result (signed zeros included), except that a NaN only has to
// meet a NaN (payloads may differ). Both sides evaluate the format formulas in the same float32
// order with one rounding per operation, so any difference is a bug (or an FMA-contracting build,
// which dequantize.cpp forbids).
#include "strata/model/dequantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "strata/model/ggml_types.h"

namespace strata::model {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> read_floats(const std::string& path) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

void put_f16(std::vector<uint8_t>& block, size_t offset, uint16_t bits) {
  std::memcpy(block.data() + offset, &bits, sizeof(bits));
}

// Distance in representable floats, for failure messages only.
int64_t ulp_distance(float a, float b) {
  auto ordered = [](float f) {
    const int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? static_cast<int64_t>(std::numeric_limits<int32_t>::min()) - i
                 : static_cast<int64_t>(i);
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Bit-exact comparison (NaN matches any NaN). Reports the first few mismatches and a count.
::testing::AssertionResult floats_identical(const std::vector<float>& actual,
                                            const std::vector<float>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  int64_t num_mismatches = 0;
  std::ostringstream details;
  for (size_t i = 0; i < actual.size(); ++i) {
    const float a = actual[i], e = expected[i];
    const bool same = (std::isnan(a) && std::isnan(e)) ||
                      std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(e);
    if (same) continue;
    if (num_mismatches++ < 8) {
      details << "\n  [" << i << "] got " << a << " (0x" << std::hex << std::bit_cast<uint32_t>(a)
              << "), expected " << e << " (0x" << std::bit_cast<uint32_t>(e) << std::dec
              << "), ulp distance " << ulp_distance(a, e);
    }
  }
  if (num_mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << num_mismatches << " of " << actual.size() << " values differ:" << details.str();
}

std::vector<float> dequantize_or_die(GgmlType type, const std::vector<uint8_t>& src,
                                     int64_t num_elements) {
  std::vector<float> out(static_cast<size_t>(num_elements), -12345.0f);
  const Status s = dequantize_row(type, src.data(), num_elements, out.data());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Against the gguf-py reference

struct ReferenceCase {
  std::string name;
  GgmlType type;
  std::string type_name;
  int64_t num_elements;
  int64_t num_bytes;
  std::string source;  // "synthetic" or "model"
  std::string bin_path;
  std::string f32_path;
};

struct ReferenceIndex {
  std::vector<ReferenceCase> cases;
  bool has_model = false;
};

std::string reference_dir() { return std::string(STRATA_TEST_DATA_DIR) + "/dequant"; }

ReferenceIndex load_index() {
  ReferenceIndex index;
  const std::string path = reference_dir() + "/index.json";
  std::ifstream in(path);
  if (!in.good()) {
    ADD_FAILURE() << "missing " << path
                  << "; run through ctest so the reference_dequant_blocks fixture runs first";
    return index;
  }
  const nlohmann::json j = nlohmann::json::parse(in);
  index.has_model = !j.at("model").is_null();
  for (const nlohmann::json& c : j.at("cases")) {
    index.cases.push_back(ReferenceCase{
        .name = c.at("name").get<std::string>(),
        .type = static_cast<GgmlType>(c.at("type_id").get<uint32_t>()),
        .type_name = c.at("type").get<std::string>(),
        .num_elements = c.at("num_elements").get<int64_t>(),
        .num_bytes = c.at("num_bytes").get<int64_t>(),
        .source = c.at("source").get<std::string>(),
        .bin_path = reference_dir() + "/" + c.at("bin").get<std::string>(),
        .f32_path = reference_dir() + "/" + c.at("f32").get<std::string>(),
    });
  }
  return index;
}

void check_case(const ReferenceCase& c) {
  SCOPED_TRACE(c.name + " (" + c.type_name + ")");
  EXPECT_EQ(ggml_type_name(c.type), c.type_name);
  const std::vector<uint8_t> src = read_bytes(c.bin_path);
  const std::vector<float> expected = read_floats(c.f32_path);
  ASSERT_EQ(static_cast<int64_t>(src.size()), c.num_bytes);
  ASSERT_EQ(static_cast<int64_t>(expected.size()), c.num_elements);
  const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(c.type));
  ASSERT_TRUE(info.has_value());
  ASSERT_EQ(c.num_bytes, c.num_elements / info->block_elements * info->block_bytes);
  EXPECT_TRUE(floats_identical(dequantize_or_die(c.type, src, c.num_elements), expected));
}

TEST(DequantizeReferenceTest, SyntheticBlocksMatchGgufPyForEverySupportedType) {
  const ReferenceIndex index = load_index();
  std::vector<std::string> covered;
  for (const ReferenceCase& c : index.cases) {
    if (c.source != "synthetic") continue;
    check_case(c);
    covered.push_back(c.type_name);
  }
  // Every type we claim to support must have a reference case.
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<GgmlTypeInfo> info = ggml_type_info(id);
    if (!info || !info->dequantize_supported) continue;
    EXPECT_NE(std::find(covered.begin(), covered.end(), std::string(info->name)), covered.end())
        << "no reference case for " << info->name;
  }
}

TEST(DequantizeReferenceTest, RealModelTensorsMatchGgufPy) {
  const ReferenceIndex index = load_index();
  if (!index.has_model) GTEST_SKIP() << "reference script found no model file";
  int num_cases = 0;
  for (const ReferenceCase& c : index.cases) {
    if (c.source != "model") continue;
    check_case(c);
    ++num_cases;
  }
  EXPECT_GE(num_cases, 2);
}

// The contract lets callers split a tensor at block boundaries (e.g. across threads) and pass
// unaligned source pointers; both must give the same values as one call.
TEST(DequantizeReferenceTest, SplitAtBlockBoundariesAndUnalignedSourceGiveSameResult) {
  const ReferenceIndex index = load_index();
  for (const ReferenceCase& c : index.cases) {
    if (c.source != "synthetic") continue;
    SCOPED_TRACE(c.name);
    const GgmlTypeInfo info = *ggml_type_info(static_cast<uint32_t>(c.type));
    const std::vector<uint8_t> src = read_bytes(c.bin_path);
    const std::vector<float> whole = dequantize_or_die(c.type, src, c.num_elements);

    std::vector<uint8_t> shifted(src.size() + 1);
    std::memcpy(shifted.data() + 1, src.data(), src.size());
    std::vector<float> pieces(whole.size());
    const int64_t num_blocks = c.num_elements / info.block_elements;
    const int64_t first_blocks = num_blocks / 3;
    ASSERT_TRUE(dequantize_row(c.type, shifted.data() + 1, first_blocks * info.block_elements,
                               pieces.data())
                    .ok());
    ASSERT_TRUE(dequantize_row(c.type, shifted.data() + 1 + first_blocks * info.block_bytes,
                               (num_blocks - first_blocks) * info.block_elements,
                               pieces.data() + first_blocks * info.block_elements)
                    .ok());
    EXPECT_TRUE(floats_identical(pieces, whole));
  }
}

// The 4-bit types as codes and per-32 maps (the form the quantized matmuls read) give gguf-py's
// values: scale * q + offset is the same affine map, rounded in another order (a few ulps).
TEST(DequantizeReferenceTest, Int4CodesReproduceGgufPyValues) {
  const ReferenceIndex index = load_index();
  int num_cases = 0;
  for (const ReferenceCase& c : index.cases) {
    if (!has_int4_codes(c.type)) continue;
    SCOPED_TRACE(c.name + " (" + c.type_name + ")");
    const std::vector<uint8_t> src = read_bytes(c.bin_path);
    const std::vector<float> expected = read_floats(c.f32_path);
    const int64_t n = c.num_elements;
    std::vector<uint8_t> codes(n, 255);
    std::vector<float> scale(n / kInt4CodeGroup), offset(n / kInt4CodeGroup);
    ASSERT_TRUE(
        decode_int4_codes(c.type, src.data(), n, codes.data(), scale.data(), offset.data()).ok());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_LT(codes[i], 16) << "element " << i;
      const int64_t g = i / kInt4CodeGroup;
      if (!std::isfinite(scale[g]) || !std::isfinite(offset[g])) continue;  // inf/NaN d cases
      const float y = scale[g] * static_cast<float>(codes[i]) + offset[g];
      const float tolerance = 4e-7f * (std::abs(scale[g]) * 16 + std::abs(offset[g]));
      ASSERT_NEAR(y, expected[i], tolerance) << "element " << i;
    }
    ++num_cases;
  }
  EXPECT_GE(num_cases, 3);  // Q4_0, Q4_1, Q4_K at least
}

TEST(DequantizeErrorTest, Int4CodesRefuseOtherTypes) {
  std::vector<uint8_t> block(34, 0);
  std::vector<uint8_t> codes(32);
  std::vector<float> scale(1), offset(1);
  const Status s = decode_int4_codes(GgmlType::kQ8_0, block.data(), 32, codes.data(), scale.data(),
                                     offset.data());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("Q8_0"), std::string::npos) << s.message();
  EXPECT_FALSE(has_int4_codes(GgmlType::kQ5_K));
  EXPECT_TRUE(has_int4_codes(GgmlType::kQ4_K));
}

// ---------------------------------------------------------------------------------------------
// Hand-computed blocks (independent of the reference script)

TEST(Fp16ToFloatTest, SpecialValues) {
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x3555), 0x1.554p-2f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0400), 0x1p-14f);         // smallest normal
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);         // smallest subnormal
  EXPECT_EQ(fp16_to_float(0x03ff), 1023 * 0x1p-24f);  // largest subnormal
  EXPECT_EQ(fp16_to_float(0x8001), -0x1p-24f);
  EXPECT_EQ(std::bit_cast<uint32_t>(fp16_to_float(0x0000)), 0x00000000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(fp16_to_float(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(fp16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7c01)));  // signalling-NaN pattern is still NaN
  EXPECT_TRUE(std::isnan(fp16_to_float(0xffff)));
}

TEST(Bf16ToFloatTest, SpecialValues) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc0a0), -5.0f);
  EXPECT_EQ(bf16_to_float(0x0001), 0x1p-133f);  // smallest subnormal
  EXPECT_EQ(std::bit_cast<uint32_t>(bf16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(bf16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7f81)));
}

constexpr uint16_t kF16Half = 0x3800;      // 0.5
constexpr uint16_t kF16MinusOne = 0xbc00;  // -1
constexpr uint16_t kF16Quarter = 0x3400;   // 0.25
constexpr uint16_t kF16One = 0x3c00;       // 1
constexpr uint16_t kF16Two = 0x4000;       // 2

TEST(DequantizeHandBuiltTest, Q4_1LowNibblesFirstThenHighNibbles) {
  // d = 0.5, m = -1; qs[j] = low nibble j, high nibble 15 - j.
  std::vector<uint8_t> block(20);
  put_f16(block, 0, kF16Half);
  put_f16(block, 2, kF16MinusOne);
  for (int j = 0; j < 16; ++j) block[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = dequantize_or_die(GgmlType::kQ4_1, block, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 1.0f) << j;
    EXPECT_EQ(y[16 + j], 0.5f * (15 - j) - 1.0f) << j;
  }
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[16], 6.5f);
}

TEST(DequantizeHandBuiltTest, Q4_0SubtractsEight) {
  std::vector<uint8_t> block(18);
  put_f16(block, 0, kF16Two);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = dequantize_or_die(GgmlType::kQ4_0, block, 32);
  EXPECT_EQ(y[0], -16.0f);
  EXPECT_EQ(y[8], 0.0f);
  EXPECT_EQ(y[15], 14.0f);
  EXPECT_EQ(y[16], 14.0f);
  EXPECT_EQ(y[31], -16.0f);
}

TEST(DequantizeHandBuiltTest, Q8_0IsSignedBytes) {
  std::vector<uint8_t> block(34);
  put_f16(block, 0, kF16Quarter);
  const int8_t q[4] = {-128, -1, 0, 127};
  for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(q[j % 4]);
  const std::vector<float> y = dequantize_or_die(GgmlType::kQ8_0, block, 32);
  EXPECT_EQ(y[0], -32.0f);
  EXPECT_EQ(y[1], -0.25f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 31.75f);
  EXPECT_EQ(y[31], 31.75f);
}

TEST(DequantizeHandBuiltTest, Q5_0And5_1TakeBitFourFromQh) {
  // Element j has 5-bit value q = j (elements 0..15: low nibble j, qh bit clear; elements 16..31:
  // high nibble j - 16, qh bit set), so q runs 0..31.
  std::vector<uint8_t> q5_0(22);
  put_f16(q5_0, 0, kF16One);
  const uint32_t qh = 0xffff0000u;
  std::memcpy(q5_0.data() + 2, &qh, 4);
  for (int j = 0; j < 16; ++j) q5_0[6 + j] = static_cast<uint8_t>(j | (j << 4));
  const std::vector<float> y0 = dequantize_or_die(GgmlType::kQ5_0, q5_0, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y0[j], static_cast<float>(j - 16)) << j;

  std::vector<uint8_t> q5_1(24);
  put_f16(q5_1, 0, kF16Half);
  put_f16(q5_1, 2, kF16MinusOne);
  std::memcpy(q5_1.data() + 4, &qh, 4);
  for (int j = 0; j < 16; ++j) q5_1[8 + j] = static_cast<uint8_t>(j | (j << 4));
  const std::vector<float> y1 = dequantize_or_die(GgmlType::kQ5_1, q5_1, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y1[j], 0.5f * j - 1.0f) << j;
}

// Packs eight 6-bit (scale, min) pairs the way the K-quant format stores them.
void pack_k_scales(const int (&sc)[8], const int (&mn)[8], uint8_t* out) {
  for (int s = 0; s < 4; ++s) {
    out[s] = static_cast<uint8_t>((sc[s] & 63) | ((sc[s + 4] >> 4) << 6));
    out[s + 4] = static_cast<uint8_t>((mn[s] & 63) | ((mn[s + 4] >> 4) << 6));
    out[s + 8] = static_cast<uint8_t>((sc[s + 4] & 15) | ((mn[s + 4] & 15) << 4));
  }
}

TEST(DequantizeHandBuiltTest, Q4_KSixBitScalesAndNibbleOrder) {
  // d = 1, dmin = 0.5; sub-block s has scale 63 - 7s and min 9s (values > 15 exercise the packed
  // high bits); element l of sub-block s has q = (l + s) % 16.
  const int sc[8] = {63, 56, 49, 42, 35, 28, 21, 14};
  const int mn[8] = {0, 9, 18, 27, 36, 45, 54, 63};
  std::vector<uint8_t> block(144);
  put_f16(block, 0, kF16One);
  put_f16(block, 2, kF16Half);
  pack_k_scales(sc, mn, block.data() + 4);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = (l + 2 * c) % 16, hi = (l + 2 * c + 1) % 16;
      block[16 + 32 * c + l] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
  const std::vector<float> y = dequantize_or_die(GgmlType::kQ4_K, block, 256);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const float expected = static_cast<float>(sc[s] * ((l + s) % 16)) - 0.5f * mn[s];
      EXPECT_EQ(y[32 * s + l], expected) << "sub-block " << s << " element " << l;
    }
  }
}

TEST(DequantizeHandBuiltTest, Q5_KHighBitPerSubBlock) {
  // Same scales as above; every low nibble is 1 and qh[l] has only bit s set for l == s, so
  // element l of sub-block s is q = 17 when l == s, else 1.
  const int sc[8] = {63, 56, 49, 42, 35, 28, 21, 14};
  const int mn[8] = {0, 9, 18, 27, 36, 45, 54, 63};
  std::vector<uint8_t> block(176);
  put_f16(block, 0, kF16One);
  put_f16(block, 2, kF16Half);
  pack_k_scales(sc, mn, block.data() + 4);
  for (int s = 0; s < 8; ++s) block[16 + s] = static_cast<uint8_t>(1u << s);
  for (int i = 0; i < 128; ++i) block[48 + i] = 0x11;
  const std::vector<float> y = dequantize_or_die(GgmlType::kQ5_K, block, 256);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int q = l == s ? 17 : 1;
      EXPECT_EQ(y[32 * s + l], static_cast<float>(sc[s] * q) - 0.5f * mn[s])
          << "sub-block " << s << " element " << l;
    }
  }
}

TEST(DequantizeHandBuiltTest, Q6_KGroupScalesAndBitPlanes) {
  // d = 0.5; scales[g] = g - 8 (signed). Element e = 128h + 32k + l gets 6-bit value
  // q = (e % 64), stored as ql/qh bit planes by the format's rule.
  std::vector<uint8_t> block(210);
  for (int g = 0; g < 16; ++g) block[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(g - 8));
  put_f16(block, 208, kF16Half);
  for (int e = 0; e < 256; ++e) {
    const int q = e % 64;
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t& ql = block[64 * h + l + (k % 2 == 1 ? 32 : 0)];
    ql |= static_cast<uint8_t>(k < 2 ? (q & 15) : (q & 15) << 4);
    block[128 + 32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
  }
  const std::vector<float> y = dequantize_or_die(GgmlType::kQ6_K, block, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.5f * static_cast<float>((e / 16 - 8) * (e % 64 - 32))) << e;
  }
}

TEST(DequantizeHandBuiltTest, PlainFloatTypes) {
  const std::vector<uint8_t> f16 = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x7c};
  const std::vector<float> y16 = dequantize_or_die(GgmlType::kF16, f16, 4);
  EXPECT_EQ(y16, (std::vector<float>{1.0f, -2.0f, 0x1p-24f, INFINITY}));
  const std::vector<uint8_t> bf16 = {0x80, 0x3f, 0xa0, 0xc0};
  EXPECT_EQ(dequantize_or_die(GgmlType::kBF16, bf16, 2), (std::vector<float>{1.0f, -5.0f}));
  std::vector<uint8_t> f32(8);
  const float values[2] = {3.5f, -0.0f};
  std::memcpy(f32.data(), values, 8);
  const std::vector<float> y32 = dequantize_or_die(GgmlType::kF32, f32, 2);
  EXPECT_EQ(y32[0], 3.5f);
  EXPECT_EQ(std::bit_cast<uint32_t>(y32[1]), 0x80000000u);
}

// ---------------------------------------------------------------------------------------------
// Errors and the type table

TEST(DequantizeErrorTest, PartialBlockIsInvalidArgumentAndLeavesOutputUntouched) {
  std::vector<uint8_t> src(2 * 20);
  std::vector<float> dst(64, 7.0f);
  const Status s = dequantize_row(GgmlType::kQ4_1, src.data(), 33, dst.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("Q4_1"), std::string::npos) << s.message();
  EXPECT_EQ(dst, std::vector<float>(64, 7.0f));
  EXPECT_EQ(dequantize_row(GgmlType::kQ6_K, src.data(), 32, dst.data()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(dequantize_row(GgmlType::kF16, src.data(), -2, dst.data()).code(),
            StatusCode::kInvalidArgument);
}

TEST(DequantizeErrorTest, ZeroElementsIsOk) {
  EXPECT_TRUE(dequantize_row(GgmlType::kQ4_K, nullptr, 0, nullptr).ok());
}

TEST(DequantizeErrorTest, UnsupportedTypeIsUnimplementedAndNamesIt) {
  std::vector<uint8_t> src(84);
  std::vector<float> dst(256);
  const Status s = dequantize_row(GgmlType::kQ2_K, src.data(), 256, dst.data());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
  EXPECT_NE(s.message().find("Q2_K"), std::string::npos) << s.message();

  const Status unknown = dequantize_row(static_cast<GgmlType>(99), src.data(), 32, dst.data());
  EXPECT_EQ(unknown.code(), StatusCode::kUnimplemented) << unknown.to_string();
  EXPECT_NE(unknown.message().find("99"), std::string::npos) << unknown.message();
}

TEST(GgmlTypesTest, GeometryMatchesGgml) {
  struct Expected {
    GgmlType type;
    std::string_view name;
    int64_t block_elements;
    int64_t block_bytes;
    bool supported;
  };
  const Expected table[] = {
      {GgmlType::kF32, "F32", 1, 4, true},       {GgmlType::kF16, "F16", 1, 2, true},
      {GgmlType::kQ4_0, "Q4_0", 32, 18, true},   {GgmlType::kQ4_1, "Q4_1", 32, 20, true},
      {GgmlType::kQ5_0, "Q5_0", 32, 22, true},   {GgmlType::kQ5_1, "Q5_1", 32, 24, true},
      {GgmlType::kQ8_0, "Q8_0", 32, 34, true},   {GgmlType::kQ8_1, "Q8_1", 32, 36, false},
      {GgmlType::kQ2_K, "Q2_K", 256, 84, false}, {GgmlType::kQ3_K, "Q3_K", 256, 110, false},
      {GgmlType::kQ4_K, "Q4_K", 256, 144, true}, {GgmlType::kQ5_K, "Q5_K", 256, 176, true},
      {GgmlType::kQ6_K, "Q6_K", 256, 210, true}, {GgmlType::kQ8_K, "Q8_K", 256, 292, false},
      {GgmlType::kBF16, "BF16", 1, 2, true},
  };
  for (const Expected& e : table) {
    const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(e.type));
    ASSERT_TRUE(info.has_value()) << e.name;
    EXPECT_EQ(info->name, e.name);
    EXPECT_EQ(ggml_type_name(e.type), e.name);
    EXPECT_EQ(info->block_elements, e.block_elements) << e.name;
    EXPECT_EQ(info->block_bytes, e.block_bytes) << e.name;
    EXPECT_EQ(info->dequantize_supported, e.supported) << e.name;
  }
  for (uint32_t id : {4u, 5u, 16u, 29u, 31u, 1000u}) EXPECT_FALSE(ggml_type_info(id)) << id;
  EXPECT_EQ(ggml_type_name(static_cast<GgmlType>(4)), "unknown");
}

TEST(GgmlTypesTest, SupportFlagAgreesWithDequantizeRow) {
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<GgmlTypeInfo> info = ggml_type_info(id);
    if (!info) continue;
    std::vector<uint8_t> src(static_cast<size_t>(info->block_bytes));
    std::vector<float> dst(static_cast<size_t>(info->block_elements));
    const Status s =
        dequantize_row(static_cast<GgmlType>(id), src.data(), info->block_elements, dst.data());
    EXPECT_EQ(s.ok(), info->dequantize_supported) << info->name << ": " << s.to_string();
    if (!info->dequantize_supported) {
      EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
    }
  }
}

}  // namespace
}  // namespace strata::model
