// Tests for GgufFile: metadata and tensor-info parsing of files built byte by byte
// (gguf_test_writer.h), and the Status of every structural error. Every failing open() must return
// a Status whose message names the file, never crash or allocate what the file cannot hold.
#include "strata/model/gguf_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "gguf_test_writer.h"
#include "strata/model/ggml_types.h"

namespace strata::model {
namespace {

using test_util::GgufValueType;
using test_util::GgufWriter;
using test_util::kTypeF32;
using test_util::kTypeQ4_1;
using test_util::kTypeQ4_K;
using test_util::kTypeQ8_0;
using test_util::status_is;
using test_util::TempDir;

// Bytes 0, 1, 2, ... offset by `seed`, so each tensor's data is recognisable.
std::vector<uint8_t> pattern(size_t num_bytes, uint8_t seed) {
  std::vector<uint8_t> out(num_bytes);
  for (size_t i = 0; i < num_bytes; ++i) out[i] = static_cast<uint8_t>(seed + i * 7);
  return out;
}

class GgufFileTest : public ::testing::Test {
 protected:
  // Writes `writer` to a file in the temp dir and opens it.
  StatusOr<std::unique_ptr<GgufFile>> open(const GgufWriter& writer,
                                           const std::string& name = "model.gguf") {
    path_ = dir_.file(name);
    test_util::write_file(path_, writer.bytes());
    return GgufFile::open(path_);
  }
  // Opens `writer`'s file and checks it fails with `code`, naming the file and every part.
  ::testing::AssertionResult fails_with(const GgufWriter& writer, StatusCode code,
                                        std::initializer_list<std::string> parts) {
    StatusOr<std::unique_ptr<GgufFile>> file = open(writer);
    if (file.ok()) return ::testing::AssertionFailure() << "open() succeeded";
    ::testing::AssertionResult r = status_is(file.status(), code, parts);
    if (!r) return r;
    return status_is(file.status(), code, {path_});
  }

  TempDir dir_;
  std::string path_;
};

// A small valid file with metadata of several kinds and two tensors; used by the truncation test.
GgufWriter small_valid_file() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 2);
  w.add_f32("llama.rope.freq_base", 10000.0f);
  w.add_bool("flag", true);
  w.add_string_array("tokens", {"a", "bc", ""});
  w.add_array<int32_t>("ids", GgufValueType::kI32, {1, -2, 3});
  w.add_bool_array("bits", {true, false});
  w.add_tensor("a", {8}, kTypeF32, pattern(32, 1));
  w.add_tensor("b", {32, 1}, kTypeQ4_1, pattern(20, 2));
  return w;
}

// ---------------------------------------------------------------------------------------------
// Metadata

TEST_F(GgufFileTest, MetadataOfEveryValueTypeRoundTrips) {
  GgufWriter w;
  w.add_u8("u8", 200);
  w.add_i8("i8", -5);
  w.add_u16("u16", 60000);
  w.add_i16("i16", -30000);
  w.add_u32("u32", 4000000000u);
  w.add_i32("i32", -2000000000);
  w.add_u64("u64", static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));  // largest legal
  w.add_i64("i64", std::numeric_limits<int64_t>::min());
  w.add_f32("f32", 1.5f);
  w.add_f64("f64", -2.25);
  w.add_bool("yes", true);
  w.add_bool("no", false);
  w.add_string("str", "h\xC3\xA9llo");
  w.add_string("empty", "");
  w.add_string_array("str_arr", {"a", "", "ccc"});
  w.add_array<int32_t>("i32_arr", GgufValueType::kI32, {1, -2, 3});
  w.add_array<uint8_t>("u8_arr", GgufValueType::kU8, {255, 0});
  w.add_array<uint64_t>("u64_arr", GgufValueType::kU64, {uint64_t{1} << 40});
  w.add_array<int16_t>("i16_arr", GgufValueType::kI16, {-7});
  w.add_array<float>("f32_arr", GgufValueType::kF32, {0.5f, -1.0f});
  w.add_array<double>("f64_arr", GgufValueType::kF64, {1e300});
  w.add_bool_array("bool_arr", {true, false, true});
  w.add_array<int32_t>("empty_arr", GgufValueType::kI32, {});
  auto file = open(w);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const GgufFile& f = **file;

  EXPECT_EQ(f.metadata().size(), 23u);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());

  // get_int accepts every integer width, signed and unsigned.
  EXPECT_EQ(f.get_int("u8").value(), 200);
  EXPECT_EQ(f.get_int("i8").value(), -5);
  EXPECT_EQ(f.get_int("u16").value(), 60000);
  EXPECT_EQ(f.get_int("i16").value(), -30000);
  EXPECT_EQ(f.get_int("u32").value(), 4000000000LL);
  EXPECT_EQ(f.get_int("i32").value(), -2000000000);
  EXPECT_EQ(f.get_int("u64").value(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(f.get_int("i64").value(), std::numeric_limits<int64_t>::min());
  // get_float accepts floats of both widths and integers.
  EXPECT_EQ(f.get_float("f32").value(), 1.5);
  EXPECT_EQ(f.get_float("f64").value(), -2.25);
  EXPECT_EQ(f.get_float("i16").value(), -30000.0);
  EXPECT_TRUE(f.get_bool("yes").value());
  EXPECT_FALSE(f.get_bool("no").value());
  EXPECT_EQ(f.get_string("str").value(), "h\xC3\xA9llo");
  EXPECT_EQ(f.get_string("empty").value(), "");

  EXPECT_EQ(*f.get_string_array("str_arr").value(), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*f.get_int_array("i32_arr").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f.get_int_array("u8_arr").value(), (std::vector<int64_t>{255, 0}));
  EXPECT_EQ(*f.get_int_array("u64_arr").value(), (std::vector<int64_t>{int64_t{1} << 40}));
  EXPECT_EQ(*f.get_int_array("i16_arr").value(), (std::vector<int64_t>{-7}));
  EXPECT_EQ(*f.get_float_array("f32_arr").value(), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(*f.get_float_array("f64_arr").value(), (std::vector<double>{1e300}));
  EXPECT_TRUE(f.get_int_array("empty_arr").value()->empty());
  const auto& bools = std::get<std::vector<bool>>(f.metadata().at("bool_arr"));
  EXPECT_EQ(bools, (std::vector<bool>{true, false, true}));

  EXPECT_TRUE(f.has_key("u8"));
  EXPECT_FALSE(f.has_key("u9"));
}

TEST_F(GgufFileTest, WrongTypeIsInvalidArgumentAndMissingIsNotFoundBothNamingKeyAndFile) {
  GgufWriter w;
  w.add_string("s", "text");
  w.add_u32("n", 7);
  w.add_f32("x", 0.5f);
  w.add_bool("b", true);
  w.add_string_array("sa", {"a"});
  w.add_array<int32_t>("ia", GgufValueType::kI32, {1});
  auto file = open(w);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const GgufFile& f = **file;

  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  EXPECT_TRUE(status_is(f.get_int("s").status(), kInvalid, {"'s'", path_}));
  EXPECT_TRUE(status_is(f.get_int("x").status(), kInvalid, {"'x'", path_}));
  EXPECT_TRUE(status_is(f.get_int("b").status(), kInvalid, {"'b'", path_}));
  EXPECT_TRUE(status_is(f.get_string("n").status(), kInvalid, {"'n'", path_}));
  EXPECT_TRUE(status_is(f.get_float("s").status(), kInvalid, {"'s'", path_}));
  EXPECT_TRUE(status_is(f.get_bool("n").status(), kInvalid, {"'n'", path_}));
  EXPECT_TRUE(status_is(f.get_string_array("ia").status(), kInvalid, {"'ia'", path_}));
  EXPECT_TRUE(status_is(f.get_int_array("sa").status(), kInvalid, {"'sa'", path_}));
  EXPECT_TRUE(status_is(f.get_float_array("ia").status(), kInvalid, {"'ia'", path_}));
  EXPECT_TRUE(status_is(f.get_int_array("n").status(), kInvalid, {"'n'", path_}));

  const StatusCode kMissing = StatusCode::kNotFound;
  EXPECT_TRUE(status_is(f.get_int("absent.key").status(), kMissing, {"absent.key", path_}));
  EXPECT_TRUE(status_is(f.get_string("absent.key").status(), kMissing, {"absent.key", path_}));
  EXPECT_TRUE(status_is(f.get_float("absent.key").status(), kMissing, {"absent.key", path_}));
  EXPECT_TRUE(status_is(f.get_bool("absent.key").status(), kMissing, {"absent.key", path_}));
  EXPECT_TRUE(status_is(f.get_string_array("absent.key").status(), kMissing, {"absent.key"}));
}

// ---------------------------------------------------------------------------------------------
// Tensors

TEST_F(GgufFileTest, TensorInfosOffsetsSizesAndData) {
  GgufWriter w;
  w.add_string("general.name", "t");
  const std::vector<uint8_t> f32_data = pattern(4 * 3 * 4, 10);     // 4 x 3 floats
  const std::vector<uint8_t> q4_1_data = pattern(2 * 2 * 20, 20);   // 2 rows of 2 blocks
  const std::vector<uint8_t> q8_0_data = pattern(3 * 34, 30);       // 3 rows of 1 block
  const std::vector<uint8_t> q4_k_data = pattern(2 * 144, 40);      // 2 rows of 1 super-block
  const uint64_t off_f32 = w.add_tensor("f32", {4, 3}, kTypeF32, f32_data);
  const uint64_t off_q4_1 = w.add_tensor("q4_1", {64, 2}, kTypeQ4_1, q4_1_data);
  const uint64_t off_q8_0 = w.add_tensor("q8_0", {32, 3}, kTypeQ8_0, q8_0_data);
  const uint64_t off_q4_k = w.add_tensor("q4_k", {256, 1, 2}, kTypeQ4_K, q4_k_data);
  auto file = open(w);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const GgufFile& f = **file;
  ASSERT_EQ(f.tensors().size(), 4u);

  struct Expected {
    const char* name;
    std::vector<int64_t> dims;
    GgmlType type;
    uint64_t offset;
    uint64_t size_bytes;
    int64_t num_elements;
    const std::vector<uint8_t>* data;
  };
  const Expected expected[] = {
      {"f32", {4, 3}, GgmlType::kF32, off_f32, 48, 12, &f32_data},
      {"q4_1", {64, 2}, GgmlType::kQ4_1, off_q4_1, 80, 128, &q4_1_data},
      {"q8_0", {32, 3}, GgmlType::kQ8_0, off_q8_0, 102, 96, &q8_0_data},
      {"q4_k", {256, 1, 2}, GgmlType::kQ4_K, off_q4_k, 288, 512, &q4_k_data},
  };
  // Offsets are laid out back to back with padding to 32 (the default alignment).
  EXPECT_EQ(off_f32, 0u);
  EXPECT_EQ(off_q4_1, 64u);
  EXPECT_EQ(off_q8_0, 160u);
  EXPECT_EQ(off_q4_k, 288u);
  for (size_t i = 0; i < std::size(expected); ++i) {
    const Expected& e = expected[i];
    SCOPED_TRACE(e.name);
    const GgufTensorInfo& info = f.tensors()[i];  // file order is kept
    EXPECT_EQ(info.name, e.name);
    EXPECT_EQ(info.dims, e.dims);
    EXPECT_EQ(info.type, e.type);
    EXPECT_EQ(info.offset_bytes, e.offset);
    EXPECT_EQ(info.size_bytes, e.size_bytes);
    EXPECT_EQ(info.num_elements, e.num_elements);
    EXPECT_EQ(f.find_tensor(e.name), &info);
    const uint8_t* data = f.tensor_data(info);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 32, 0u);  // the mapping is page-aligned
    EXPECT_EQ(std::memcmp(data, e.data->data(), e.data->size()), 0);
  }
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
}

TEST_F(GgufFileTest, GeneralAlignmentIsHonoured) {
  // Grow a padding key until the header ends where rounding up to 32 and to 64 differ, so a
  // reader that ignored general.alignment would look for the data in the wrong place.
  for (size_t pad = 0; pad < 64; ++pad) {
    GgufWriter w;
    w.set_alignment(64);
    w.add_u32("general.alignment", 64);
    w.add_string("pad", std::string(pad, 'p'));
    const std::vector<uint8_t> a = pattern(40, 3);
    const std::vector<uint8_t> b = pattern(16, 4);
    w.add_tensor("a", {10}, kTypeF32, a);
    const uint64_t off_b = w.add_tensor("b", {4}, kTypeF32, b);
    const uint64_t header = w.header_size_bytes();
    if ((header + 31) / 32 * 32 == (header + 63) / 64 * 64) continue;

    ASSERT_EQ(off_b, 64u);
    auto file = open(w);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    const GgufFile& f = **file;
    EXPECT_EQ(f.alignment(), 64u);
    const GgufTensorInfo* ta = f.find_tensor("a");
    const GgufTensorInfo* tb = f.find_tensor("b");
    ASSERT_NE(ta, nullptr);
    ASSERT_NE(tb, nullptr);
    EXPECT_EQ(tb->offset_bytes, 64u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.tensor_data(*ta)) % 64, 0u);
    EXPECT_EQ(std::memcmp(f.tensor_data(*ta), a.data(), a.size()), 0);
    EXPECT_EQ(std::memcmp(f.tensor_data(*tb), b.data(), b.size()), 0);
    return;
  }
  FAIL() << "no padding length separated 32- from 64-byte alignment";
}

TEST_F(GgufFileTest, OffsetAlignedTo32ButNotToDeclaredAlignmentIsRejected) {
  GgufWriter w;
  w.add_u32("general.alignment", 64);
  w.add_tensor_info("t", {8}, kTypeF32, 32);
  w.append_data(std::vector<uint8_t>(128, 0));
  EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'t'", "offset 32", "64"}));
}

TEST_F(GgufFileTest, Versions2And3AreAccepted) {
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w(version);
    w.add_u32("k", 1);
    w.add_tensor("t", {4}, kTypeF32, pattern(16, 0));
    auto file = open(w);
    ASSERT_TRUE(file.ok()) << "version " << version << ": " << file.status().to_string();
    EXPECT_EQ((*file)->version(), version);
    EXPECT_EQ((*file)->get_int("k").value(), 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Header errors

TEST_F(GgufFileTest, BadMagicIsInvalidArgument) {
  GgufWriter w;
  w.set_magic(0x46554746);  // "FGUF"
  EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"magic"}));
}

TEST_F(GgufFileTest, Versions1And4AreUnimplemented) {
  for (uint32_t version : {1u, 4u}) {
    GgufWriter w(version);
    w.add_u32("k", 1);
    EXPECT_TRUE(fails_with(w, StatusCode::kUnimplemented, {"version " + std::to_string(version)}));
  }
}

TEST_F(GgufFileTest, MissingAndEmptyFiles) {
  const std::string missing = dir_.file("does_not_exist.gguf");
  auto file = GgufFile::open(missing);
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(status_is(file.status(), StatusCode::kNotFound, {missing}));

  path_ = dir_.file("empty.gguf");
  test_util::write_file(path_, {});
  file = GgufFile::open(path_);
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(status_is(file.status(), StatusCode::kDataLoss, {path_}));
}

TEST_F(GgufFileTest, EveryTruncationIsDataLossNamingTheFile) {
  const std::vector<uint8_t> full = small_valid_file().bytes();
  const std::string path = dir_.file("truncated.gguf");
  {
    test_util::write_file(path, full);
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file.ok()) << "the untruncated file must be valid: " << file.status().to_string();
  }
  for (size_t length = 0; length < full.size(); ++length) {
    SCOPED_TRACE("prefix of " + std::to_string(length) + " of " + std::to_string(full.size()) +
                 " bytes");
    test_util::write_file(path, std::vector<uint8_t>(full.begin(), full.begin() + length));
    auto file = GgufFile::open(path);
    ASSERT_FALSE(file.ok());
    EXPECT_TRUE(status_is(file.status(), StatusCode::kDataLoss, {path}));
  }
}

TEST_F(GgufFileTest, AbsurdHeaderCountsAreRejectedWithoutAllocating) {
  {
    GgufWriter w;
    w.set_num_kv(uint64_t{1} << 60);
    EXPECT_TRUE(fails_with(w, StatusCode::kDataLoss, {"exceed the file size"}));
  }
  {
    GgufWriter w;
    w.set_num_tensors(uint64_t{1} << 62);
    EXPECT_TRUE(fails_with(w, StatusCode::kDataLoss, {"exceed the file size"}));
  }
}

// ---------------------------------------------------------------------------------------------
// Metadata errors

TEST_F(GgufFileTest, AbsurdArrayCountsAreRejectedWithoutAllocating) {
  struct Case {
    GgufValueType elem_type;
    uint64_t count;
  };
  for (const Case& c : {Case{GgufValueType::kU8, uint64_t{1} << 60},
                        Case{GgufValueType::kString, uint64_t{1} << 60},
                        Case{GgufValueType::kI64, uint64_t{1} << 61},
                        Case{GgufValueType::kBool, ~uint64_t{0}},
                        Case{GgufValueType::kF32, uint64_t{1} << 62}}) {
    SCOPED_TRACE("element type " + std::to_string(static_cast<uint32_t>(c.elem_type)));
    test_util::ByteWriter payload;
    payload.put<uint32_t>(static_cast<uint32_t>(c.elem_type));
    payload.put<uint64_t>(c.count);
    payload.put<uint64_t>(0);  // a few bytes of "elements"
    GgufWriter w;
    w.add_raw_kv("huge.array", static_cast<uint32_t>(GgufValueType::kArray), payload.bytes());
    EXPECT_TRUE(fails_with(w, StatusCode::kDataLoss, {"'huge.array'", std::to_string(c.count)}));
  }
}

TEST_F(GgufFileTest, AbsurdStringLengthIsDataLoss) {
  test_util::ByteWriter payload;
  payload.put<uint64_t>(uint64_t{1} << 60);
  payload.put<uint64_t>(0);
  GgufWriter w;
  w.add_raw_kv("long.string", static_cast<uint32_t>(GgufValueType::kString), payload.bytes());
  EXPECT_TRUE(fails_with(w, StatusCode::kDataLoss, {"'long.string'", "truncated"}));
}

TEST_F(GgufFileTest, Uint64AboveInt64MaxIsRejectedNamingTheKey) {
  {
    GgufWriter w;
    w.add_u64("too.big", static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1);
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'too.big'", "9223372036854775808"}));
  }
  {
    GgufWriter w;
    w.add_array<uint64_t>("too.big.array", GgufValueType::kU64, {1, ~uint64_t{0}});
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'too.big.array'"}));
  }
}

TEST_F(GgufFileTest, DuplicateKeyIsRejected) {
  GgufWriter w;
  w.add_u32("dup.key", 1);
  w.add_string("dup.key", "again");
  EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"duplicate", "'dup.key'"}));
}

TEST_F(GgufFileTest, MalformedValuesAreRejectedNamingTheKey) {
  {
    GgufWriter w;
    w.add_raw_kv("bad.type", 13, {0, 0, 0, 0});
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'bad.type'", "13"}));
  }
  {
    GgufWriter w;
    w.add_raw_kv("bad.bool", static_cast<uint32_t>(GgufValueType::kBool), {2});
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'bad.bool'"}));
  }
  {
    // Arrays of arrays are not supported.
    test_util::ByteWriter payload;
    payload.put<uint32_t>(static_cast<uint32_t>(GgufValueType::kArray));
    payload.put<uint64_t>(0);
    GgufWriter w;
    w.add_raw_kv("nested", static_cast<uint32_t>(GgufValueType::kArray), payload.bytes());
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'nested'"}));
  }
}

TEST_F(GgufFileTest, AlignmentMustBeAPositivePowerOfTwoInteger) {
  for (uint32_t alignment : {0u, 48u, 3u}) {
    SCOPED_TRACE(alignment);
    GgufWriter w;
    w.add_u32("general.alignment", alignment);
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"general.alignment"}));
  }
  GgufWriter w;
  w.add_string("general.alignment", "32");
  EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"general.alignment"}));
  // Powers of two other than 32 are fine, including 1.
  GgufWriter one;
  one.set_alignment(1);
  one.add_u32("general.alignment", 1);
  one.add_tensor("t", {3}, kTypeF32, pattern(12, 9));
  auto file = open(one);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ((*file)->alignment(), 1u);
  EXPECT_EQ(std::memcmp((*file)->tensor_data((*file)->tensors()[0]), pattern(12, 9).data(), 12), 0);
}

// ---------------------------------------------------------------------------------------------
// Tensor errors

TEST_F(GgufFileTest, TensorDataPastTheEndIsDataLossNamingTheTensor) {
  {
    GgufWriter w;
    w.add_tensor("ok", {8}, kTypeF32, pattern(32, 0));
    std::vector<uint8_t> short_data = pattern(79, 1);  // Q4_1 [64, 2] needs 80 bytes
    w.add_tensor("cut.weight", {64, 2}, kTypeQ4_1, short_data);
    EXPECT_TRUE(fails_with(w, StatusCode::kDataLoss, {"'cut.weight'", "beyond the end"}));
  }
  {
    // Offsets near 2^64 must not wrap around.
    GgufWriter w;
    w.add_tensor_info("far.weight", {8}, kTypeF32, ~uint64_t{0} - 31);
    w.append_data(pattern(64, 0));
    EXPECT_TRUE(fails_with(w, StatusCode::kDataLoss, {"'far.weight'"}));
  }
}

TEST_F(GgufFileTest, UnknownGgmlTypeIsUnimplementedNamingTheTensor) {
  for (uint32_t type_id : {4u, 99u, 0xFFFFFFFFu}) {
    SCOPED_TRACE(type_id);
    GgufWriter w;
    w.add_tensor("odd.weight", {32}, type_id, pattern(128, 0));
    EXPECT_TRUE(fails_with(w, StatusCode::kUnimplemented,
                           {"'odd.weight'", "type id " + std::to_string(type_id)}));
  }
}

TEST_F(GgufFileTest, MisalignedOffsetIsInvalidArgument) {
  GgufWriter w;
  w.add_tensor_info("mis.weight", {4}, kTypeF32, 16);
  w.append_data(pattern(64, 0));
  EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'mis.weight'", "aligned"}));
}

TEST_F(GgufFileTest, RowLengthNotAMultipleOfTheBlockSizeIsInvalidArgument) {
  {
    GgufWriter w;
    w.add_tensor_info("rows.weight", {48, 2}, kTypeQ4_1, 0);
    w.append_data(pattern(128, 0));
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'rows.weight'", "48", "Q4_1"}));
  }
  {
    // 512 elements in total, but rows of 128: not whole Q4_K super-blocks.
    GgufWriter w;
    w.add_tensor_info("k.weight", {128, 4}, kTypeQ4_K, 0);
    w.append_data(pattern(288, 0));
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'k.weight'", "Q4_K", "256"}));
  }
}

TEST_F(GgufFileTest, ZeroOrMoreThanFourDimsAreInvalidArgument) {
  {
    GgufWriter w;
    w.add_tensor_info("scalar", {}, kTypeF32, 0);
    w.append_data(pattern(32, 0));
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'scalar'", "0 dimensions"}));
  }
  {
    GgufWriter w;
    w.add_tensor_info("five.d", {1, 1, 1, 1, 1}, kTypeF32, 0);
    w.append_data(pattern(32, 0));
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'five.d'", "5 dimensions"}));
  }
  {
    GgufWriter w;
    w.add_tensor("four.d", {1, 2, 1, 2}, kTypeF32, pattern(16, 0));
    auto file = open(w);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    EXPECT_EQ((*file)->tensors()[0].dims, (std::vector<int64_t>{1, 2, 1, 2}));
  }
}

TEST_F(GgufFileTest, ZeroNegativeOrOverflowingDimensionsAreInvalidArgument) {
  const std::vector<std::vector<uint64_t>> bad_dims = {
      {0}, {4, 0}, {~uint64_t{0}}, {uint64_t{1} << 32, uint64_t{1} << 32}};
  for (const auto& dims : bad_dims) {
    GgufWriter w;
    w.add_tensor_info("dims.weight", dims, kTypeF32, 0);
    w.append_data(pattern(64, 0));
    EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"'dims.weight'", "dimension"}));
  }
}

TEST_F(GgufFileTest, DuplicateTensorNameIsInvalidArgument) {
  GgufWriter w;
  w.add_tensor("twice.weight", {4}, kTypeF32, pattern(16, 0));
  w.add_tensor("twice.weight", {4}, kTypeF32, pattern(16, 1));
  EXPECT_TRUE(fails_with(w, StatusCode::kInvalidArgument, {"duplicate", "'twice.weight'"}));
}

}  // namespace
}  // namespace strata::model
