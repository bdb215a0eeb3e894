// Compares the tokenizer with HF `tokenizers` on the strings written by
// tests/reference/tokenizer_reference.py, for the default model's GGUF and for tokenizer.json
// files built from the same vocabulary (SmolLM2, Llama-3 and Qwen2 pre-tokenizers).
#include "strata/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "strata/model/gguf_file.h"

namespace strata::tokenizer {
namespace {

using nlohmann::json;

const std::string kDataDir = std::string(STRATA_TEST_DATA_DIR) + "/tokenizer";

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << path << " (run the reference_tokenizer fixture)";
  std::ostringstream contents;
  contents << in.rdbuf();
  return json::parse(contents.str());
}

struct Reference {
  std::vector<std::string> strings;
  json variants;  // name -> {ids, decoded, decoded_skip_special, ids_with_bos}
};

const Reference& reference() {
  static const Reference kReference = [] {
    json root = read_json(kDataDir + "/cases.json");
    return Reference{root["strings"].get<std::vector<std::string>>(), root["variants"]};
  }();
  return kReference;
}

StatusOr<std::unique_ptr<Tokenizer>> load_gguf(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto file, model::GgufFile::open(path));
  return Tokenizer::from_gguf(*file);
}

std::unique_ptr<Tokenizer> must_load_gguf(const std::string& path) {
  auto tokenizer = load_gguf(path);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

std::unique_ptr<Tokenizer> must_load_json(const std::string& path) {
  auto tokenizer = Tokenizer::from_tokenizer_json(path);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// Printable form of a test string for failure messages.
std::string escaped(std::string_view s, size_t limit = 160) {
  std::string out;
  for (char c : s.substr(0, limit)) {
    const auto u = static_cast<unsigned char>(c);
    if (u == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  return s.size() > limit ? out + "..." : out;
}

std::string ids_string(const std::vector<TokenId>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) out += std::to_string(ids[i]) + " ";
  return ids.size() > 40 ? out + "..." : out;
}

// Independent UTF-8 validator (the one in src/ is under test elsewhere).
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? b : b & (0xFF >> (n + 1));
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Encodes every reference string and compares with HF's ids; returns the number that agree.
size_t expect_matches_hf(const Tokenizer& tokenizer, const std::string& variant) {
  const Reference& ref = reference();
  const json& expected = ref.variants.at(variant).at("ids");
  EXPECT_EQ(expected.size(), ref.strings.size());
  size_t num_agree = 0;
  int num_reported = 0;
  for (size_t i = 0; i < ref.strings.size(); ++i) {
    const auto want = expected[i].get<std::vector<TokenId>>();
    const auto got = tokenizer.encode(ref.strings[i], /*add_bos=*/false);
    if (got == want) {
      ++num_agree;
    } else if (num_reported++ < 5) {
      ADD_FAILURE() << variant << " string #" << i << " \"" << escaped(ref.strings[i])
                    << "\"\n  HF:   " << ids_string(want) << "\n  ours: " << ids_string(got);
    }
  }
  EXPECT_EQ(num_agree, ref.strings.size()) << variant;
  std::cout << "[" << variant << "] " << num_agree << "/" << ref.strings.size()
            << " strings encode exactly as HF\n";
  return num_agree;
}

TEST(TokenizerReferenceTest, HasEnoughStrings) { EXPECT_GE(reference().strings.size(), 2000u); }

TEST(TokenizerReferenceTest, SmolLMFromGgufMatchesHf) {
  auto tokenizer = must_load_gguf(STRATA_TEST_MODEL);
  ASSERT_NE(tokenizer, nullptr);
  expect_matches_hf(*tokenizer, "smollm");
}

TEST(TokenizerReferenceTest, SmolLMFromTokenizerJsonMatchesHf) {
  auto tokenizer = must_load_json(kDataDir + "/smollm/tokenizer.json");
  ASSERT_NE(tokenizer, nullptr);
  expect_matches_hf(*tokenizer, "smollm");
}

TEST(TokenizerReferenceTest, Llama3PreTokenizerMatchesHf) {
  for (auto& tokenizer : {must_load_gguf(kDataDir + "/llama3/model.gguf"),
                          must_load_json(kDataDir + "/llama3/tokenizer.json")}) {
    ASSERT_NE(tokenizer, nullptr);
    expect_matches_hf(*tokenizer, "llama3");
    // HF's post-processor prepends BOS; so does encode(add_bos = true).
    EXPECT_TRUE(tokenizer->add_bos_by_default());
    const json& with_bos = reference().variants.at("llama3").at("ids_with_bos");
    for (size_t i = 0; i < with_bos.size(); ++i) {
      EXPECT_EQ(tokenizer->encode(reference().strings[i], /*add_bos=*/true),
                with_bos[i].get<std::vector<TokenId>>())
          << "string #" << i;
    }
  }
}

TEST(TokenizerReferenceTest, Qwen2PreTokenizerMatchesHf) {
  for (auto& tokenizer : {must_load_gguf(kDataDir + "/qwen2/model.gguf"),
                          must_load_json(kDataDir + "/qwen2/tokenizer.json")}) {
    ASSERT_NE(tokenizer, nullptr);
    expect_matches_hf(*tokenizer, "qwen2");
    EXPECT_FALSE(tokenizer->add_bos_by_default());
  }
}

// SentencePiece BPE in a GGUF (tokenizer.ggml.model = llama, Llama 2's settings), against the
// sentencepiece library itself on every corpus string: ids, and the text of decode().
TEST(TokenizerReferenceTest, SentencePieceGgufMatchesSentencePiece) {
  auto tokenizer = must_load_gguf(kDataDir + "/spm/model.gguf");
  ASSERT_NE(tokenizer, nullptr);
  expect_matches_hf(*tokenizer, "spm");
  // ... and HF's tokenizers on the same model (its tokenizer.json form).
  expect_matches_hf(*tokenizer, "spm_bpe_json");
  EXPECT_TRUE(tokenizer->add_bos_by_default());
  EXPECT_EQ(tokenizer->bos_id(), 1);
  const json& spm = reference().variants.at("spm");
  size_t decoded_agree = 0;
  for (size_t i = 0; i < reference().strings.size(); ++i) {
    const std::vector<TokenId> ids = spm["ids"][i].get<std::vector<TokenId>>();
    // SentencePiece drops the dummy prefix's space when decoding; our decode keeps every byte.
    std::string text = tokenizer->decode(ids, /*skip_special=*/true);
    if (!text.empty() && text[0] == ' ') text.erase(0, 1);
    decoded_agree += text == spm["decoded"][i].get<std::string>();
  }
  EXPECT_EQ(decoded_agree, reference().strings.size());
  // Special tokens written in text are matched; the text after them gets the "▁" prefix again.
  const std::vector<TokenId> ids = tokenizer->encode("</s>hello", false);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(std::vector<TokenId>(ids.begin() + 1, ids.end()), tokenizer->encode("hello", false));
}

// SentencePiece models as HF tokenizer.json files (its converter's form): BPE with byte fallback
// and Unigram, against HF's tokenizers on every corpus string.
TEST(TokenizerReferenceTest, SentencePieceTokenizerJsonMatchesHf) {
  for (const char* variant : {"spm_bpe_json", "spm_unigram_json"}) {
    auto tokenizer = must_load_json(kDataDir + "/" + variant + "/tokenizer.json");
    ASSERT_NE(tokenizer, nullptr) << variant;
    expect_matches_hf(*tokenizer, variant);
  }
}

// tokenizer.json normalizers: real Qwen2 directories normalize with NFC; a Sequence of NFD and
// NFKC covers the compatibility forms.
TEST(TokenizerReferenceTest, UnicodeNormalizersMatchHf) {
  for (const char* variant : {"qwen2_nfc", "qwen2_nfkc"}) {
    auto tokenizer = must_load_json(kDataDir + "/" + variant + "/tokenizer.json");
    ASSERT_NE(tokenizer, nullptr);
    expect_matches_hf(*tokenizer, variant);
  }
  // Normalization changes what the plain Qwen2 tokenizer would produce on these strings.
  auto plain = must_load_json(kDataDir + "/qwen2/tokenizer.json");
  auto nfkc = must_load_json(kDataDir + "/qwen2_nfkc/tokenizer.json");
  EXPECT_NE(plain->encode("\ufb01ne", false), nfkc->encode("\ufb01ne", false));
  EXPECT_EQ(nfkc->encode("\ufb01ne", false), plain->encode("fine", false));
}

// Added tokens with lstrip/rstrip, normalized ones (second matching pass), non-byte-level text.
TEST(TokenizerReferenceTest, ExtraAddedTokensMatchHf) {
  auto tokenizer = must_load_json(kDataDir + "/added/tokenizer.json");
  ASSERT_NE(tokenizer, nullptr);
  expect_matches_hf(*tokenizer, "added");
  const Reference& ref = reference();
  const json& added = ref.variants.at("added");
  int num_failures = 0;
  for (size_t i = 0; i < ref.strings.size() && num_failures < 5; ++i) {
    const auto ids = added["ids"][i].get<std::vector<TokenId>>();
    for (bool skip_special : {false, true}) {
      const std::string want =
          added[skip_special ? "decoded_skip_special" : "decoded"][i].get<std::string>();
      if (tokenizer->decode(ids, skip_special) != want) {
        ++num_failures;
        ADD_FAILURE() << "string #" << i << " skip_special=" << skip_special << " \""
                      << escaped(ref.strings[i]) << "\": \""
                      << escaped(tokenizer->decode(ids, skip_special)) << "\" vs HF \""
                      << escaped(want) << "\"";
      }
    }
  }
  EXPECT_EQ(num_failures, 0);
}

TEST(TokenizerReferenceTest, DecodeMatchesHf) {
  auto tokenizer = must_load_gguf(STRATA_TEST_MODEL);
  ASSERT_NE(tokenizer, nullptr);
  const Reference& ref = reference();
  const json& smollm = ref.variants.at("smollm");
  int num_failures = 0;
  for (size_t i = 0; i < ref.strings.size() && num_failures < 5; ++i) {
    const auto ids = smollm["ids"][i].get<std::vector<TokenId>>();
    const std::string want = smollm["decoded"][i].get<std::string>();
    const std::string want_skip = smollm["decoded_skip_special"][i].get<std::string>();
    const bool ok = tokenizer->decode(ids, /*skip_special=*/false) == want &&
                    tokenizer->decode(ids, /*skip_special=*/true) == want_skip &&
                    tokenizer->decode(tokenizer->encode(ref.strings[i], false), false) == want;
    // Byte-level BPE without a normalizer is lossless for valid UTF-8.
    const bool round_trip = want == ref.strings[i];
    if (!ok || !round_trip) {
      ++num_failures;
      ADD_FAILURE() << "string #" << i << " \"" << escaped(ref.strings[i]) << "\" decode \""
                    << escaped(tokenizer->decode(ids, false)) << "\" round trip " << round_trip;
    }
  }
  EXPECT_EQ(num_failures, 0);
}

TEST(TokenizerReferenceTest, StreamDecoderConcatenatesToDecodeWithValidChunks) {
  auto tokenizer = must_load_gguf(STRATA_TEST_MODEL);
  ASSERT_NE(tokenizer, nullptr);
  const Reference& ref = reference();
  const json& smollm = ref.variants.at("smollm");
  int num_failures = 0;
  size_t num_held_back = 0;  // pushes that returned less than the token's bytes
  for (size_t i = 0; i < ref.strings.size() && num_failures < 5; ++i) {
    const auto ids = smollm["ids"][i].get<std::vector<TokenId>>();
    for (bool skip_special : {false, true}) {
      StreamDecoder decoder(*tokenizer, skip_special);
      std::string text;
      bool chunks_valid = true;
      for (TokenId id : ids) {
        const std::string chunk = decoder.push(id);
        chunks_valid = chunks_valid && valid_utf8(chunk);
        if (chunk.size() < tokenizer->token_bytes(id).size()) ++num_held_back;
        text += chunk;
      }
      const std::string rest = decoder.flush();
      chunks_valid = chunks_valid && valid_utf8(rest);
      text += rest;
      const std::string want =
          smollm[skip_special ? "decoded_skip_special" : "decoded"][i].get<std::string>();
      if (text != want || !chunks_valid) {
        ++num_failures;
        ADD_FAILURE() << "string #" << i << " skip_special=" << skip_special << " \""
                      << escaped(ref.strings[i]) << "\" chunks valid " << chunks_valid;
      }
    }
  }
  EXPECT_EQ(num_failures, 0);
  EXPECT_GT(num_held_back, 0u) << "the strings should split some characters across tokens";
}

class SmolLMTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = must_load_gguf(STRATA_TEST_MODEL).release(); }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(tokenizer_, nullptr); }
  static const Tokenizer* tokenizer_;
};
const Tokenizer* SmolLMTokenizerTest::tokenizer_ = nullptr;

TEST_F(SmolLMTokenizerTest, Metadata) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), std::optional<TokenId>(1));
  EXPECT_EQ(t.eos_id(), std::optional<TokenId>(2));
  EXPECT_FALSE(t.add_bos_by_default());
  EXPECT_EQ(t.stop_ids(), (std::vector<TokenId>{0, 2}));  // <|endoftext|>, <|im_end|>
  EXPECT_TRUE(t.is_special(1));
  EXPECT_FALSE(t.is_special(100));
  EXPECT_FALSE(t.is_special(-1));
  EXPECT_FALSE(t.is_special(49152));
  EXPECT_EQ(t.token_to_id("<|im_start|>"), std::optional<TokenId>(1));
  const auto the = t.token_to_id("\xC4\xA0the");  // "Ġthe"
  ASSERT_TRUE(the.has_value());
  EXPECT_EQ(t.token_bytes(*the), " the");
  EXPECT_EQ(t.token_to_id("no such token text"), std::nullopt);
  EXPECT_EQ(t.chat_template_source().rfind("{% for message in messages %}", 0), 0u);
  EXPECT_EQ(t.encode("Hello", /*add_bos=*/true).front(), 1);
}

TEST_F(SmolLMTokenizerTest, DecodeSkipsOutOfRangeIds) {
  const Tokenizer& t = *tokenizer_;
  const auto ids = t.encode("hello", false);
  std::vector<TokenId> noisy = {-1, 49152, 1 << 30};
  noisy.insert(noisy.end(), ids.begin(), ids.end());
  EXPECT_EQ(t.decode(noisy, false), "hello");
  StreamDecoder decoder(t);
  EXPECT_EQ(decoder.push(-7), "");
  EXPECT_EQ(decoder.push(49152), "");
}

TEST_F(SmolLMTokenizerTest, InvalidUtf8InputIsReplacedFirst) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.encode("a\xFF"
                     "b\xE2\x82",
                     false),
            t.encode("a\xEF\xBF\xBD"
                     "b\xEF\xBF\xBD",
                     false));
}

TEST_F(SmolLMTokenizerTest, StreamDecoderHoldsBackAndReplaces) {
  const Tokenizer& t = *tokenizer_;
  // Single-byte tokens: 0xF0 0x9F 0x98 0x80 is U+1F600 spread over four tokens.
  const auto byte_token = [&](const char* chars) { return *t.token_to_id(chars); };
  const TokenId f0 = byte_token("\xC3\xB0");   // 'ð' = byte 0xF0
  const TokenId x9f = byte_token("\xC5\x81");  // 'Ł' = byte 0x9F
  const TokenId x98 = byte_token("\xC4\xBA");  // 'ĺ' = byte 0x98
  const TokenId x80 = byte_token("\xC4\xA2");  // 'Ģ' = byte 0x80
  EXPECT_EQ(t.token_bytes(f0), "\xF0");
  EXPECT_EQ(t.token_bytes(x9f), "\x9F");
  StreamDecoder decoder(t);
  EXPECT_EQ(decoder.push(f0), "");
  EXPECT_EQ(decoder.push(x9f), "");
  EXPECT_EQ(decoder.push(x98), "");
  EXPECT_EQ(decoder.push(x80), "\xF0\x9F\x98\x80");
  // A sequence broken by a non-continuation byte is replaced as soon as that is known.
  const TokenId a = *t.token_to_id("a");
  EXPECT_EQ(decoder.push(f0), "");
  EXPECT_EQ(decoder.push(a),
            "\xEF\xBF\xBD"
            "a");
  // An incomplete tail becomes U+FFFD at flush().
  EXPECT_EQ(decoder.push(f0), "");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(decoder.flush(), "");
  EXPECT_EQ(t.decode(std::vector<TokenId>{f0, a, f0}, false),
            "\xEF\xBF\xBD"
            "a\xEF\xBF\xBD");
  // Special tokens are dropped by default and kept on request.
  StreamDecoder keep(t, /*skip_special=*/false);
  EXPECT_EQ(keep.push(1), "<|im_start|>");
  EXPECT_EQ(decoder.push(1), "");
}

TEST_F(SmolLMTokenizerTest, AddedTokensAreMatchedInText) {
  const Tokenizer& t = *tokenizer_;
  const auto ids = t.encode("<|im_start|>user\nhi<|im_end|>", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\nhi");
}

TEST_F(SmolLMTokenizerTest, LargeInputsRoundTrip) {
  const Tokenizer& t = *tokenizer_;
  std::string big;
  for (int i = 0; i < 20000; ++i) big += "word" + std::to_string(i) + (i % 7 ? " " : "\n\t  ");
  big += std::string(100000, ' ') + std::string(100000, 'z') + "\xF0\x9F\x98\x80";
  const auto ids = t.encode(big, false);
  EXPECT_EQ(t.decode(ids, false), big);
}

TEST_F(SmolLMTokenizerTest, ConcurrentEncodeIsConsistent) {
  const Tokenizer& t = *tokenizer_;
  const Reference& ref = reference();
  std::vector<std::vector<TokenId>> expected;
  for (size_t i = 0; i < 200; ++i) expected.push_back(t.encode(ref.strings[i], false));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = 0; i < 200; ++i) {
        if (t.encode(ref.strings[i], false) != expected[i]) ++mismatches[w];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// ---- Error paths ---------------------------------------------------------------------------

void expect_error(const StatusOr<std::unique_ptr<Tokenizer>>& result, StatusCode code,
                  const std::string& needle) {
  ASSERT_FALSE(result.ok()) << "expected " << status_code_name(code) << " mentioning " << needle;
  EXPECT_EQ(result.status().code(), code) << result.status().to_string();
  EXPECT_NE(result.status().message().find(needle), std::string::npos)
      << result.status().to_string();
}

TEST(TokenizerErrorTest, GgufErrorsAreClear) {
  const std::string dir = kDataDir + "/errors/";
  auto ok = load_gguf(dir + "ok.gguf");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ((*ok)->encode("hello", false), std::vector<TokenId>{*(*ok)->token_to_id("hello")});
  expect_error(load_gguf(dir + "unknown_pre.gguf"), StatusCode::kUnimplemented, "no-such-pre");
  expect_error(load_gguf(dir + "bert_model.gguf"), StatusCode::kUnimplemented, "'bert'");
  // A SentencePiece model needs its scores.
  expect_error(load_gguf(dir + "llama_model.gguf"), StatusCode::kInvalidArgument,
               "tokenizer.ggml.scores");
  expect_error(load_gguf(dir + "missing_merges.gguf"), StatusCode::kInvalidArgument,
               "tokenizer.ggml.merges");
  expect_error(load_gguf(dir + "bad_merge.gguf"), StatusCode::kInvalidArgument, "'x zz'");
}

class TokenizerJsonErrorTest : public ::testing::Test {
 protected:
  // Writes `root` as tokenizer.json into a fresh directory and loads it.
  StatusOr<std::unique_ptr<Tokenizer>> load(const json& root) {
    const auto dir = std::filesystem::path(kDataDir) / "json_errors" /
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir);
    const auto path = (dir / "tokenizer.json").string();
    std::ofstream(path) << root.dump();
    return Tokenizer::from_tokenizer_json(path);
  }
  static const json& base() {
    static const json kBase = read_json(kDataDir + "/smollm/tokenizer.json");
    return kBase;
  }
};

TEST_F(TokenizerJsonErrorTest, UnsupportedModelType) {
  json root = base();
  root["model"]["type"] = "WordPiece";
  expect_error(load(root), StatusCode::kUnimplemented, "WordPiece");
}

TEST_F(TokenizerJsonErrorTest, SentencePieceFormsWeDoNotRun) {
  json root = base();
  root["model"] = {
      {"type", "Unigram"},
      {"vocab", json::array({json::array({"\u2581a", -1.0}), json::array({"b", -2.0})})},
      {"unk_id", 0}};
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}};
  expect_error(load(root), StatusCode::kUnimplemented, "prepend_scheme 'first'");
  root["pre_tokenizer"] = nullptr;
  expect_error(load(root), StatusCode::kUnimplemented, "escaping");
  root["model"]["vocab"] = json::array({json::array({"\u2581a"})});
  expect_error(load(root), StatusCode::kInvalidArgument, "[piece, score]");
}

TEST_F(TokenizerJsonErrorTest, UnsupportedNormalizer) {
  json root = base();
  root["normalizer"] = {{"type", "Lowercase"}};
  expect_error(load(root), StatusCode::kUnimplemented, "normalizer 'Lowercase'");
  root["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", {{{"type", "NFC"}}, {{"type", "Prepend"}, {"prepend", "_"}}}}};
  expect_error(load(root), StatusCode::kUnimplemented, "normalizer 'Prepend'");
}

TEST_F(TokenizerJsonErrorTest, UnsupportedPreTokenizers) {
  json root = base();
  root["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  expect_error(load(root), StatusCode::kUnimplemented, "Metaspace");
  root["pre_tokenizer"] = {{"type", "Split"},
                           {"pattern", {{"Regex", "\\s+"}}},
                           {"behavior", "Removed"},
                           {"invert", false}};
  expect_error(load(root), StatusCode::kUnimplemented, "Removed");
  root["pre_tokenizer"] = nullptr;
  expect_error(load(root), StatusCode::kUnimplemented, "ByteLevel");
}

TEST_F(TokenizerJsonErrorTest, MissingMergeTokenAndBadJson) {
  json root = base();
  root["model"]["merges"].push_back(json::array({"q", "nonexistent"}));
  expect_error(load(root), StatusCode::kInvalidArgument, "nonexistent");
  root = base();
  root["model"].erase("merges");
  expect_error(load(root), StatusCode::kInvalidArgument, "merges");
  expect_error(Tokenizer::from_tokenizer_json(kDataDir + "/no/such/tokenizer.json"),
               StatusCode::kNotFound, "no/such");
  const auto path = kDataDir + "/json_errors/garbage.json";
  std::filesystem::create_directories(kDataDir + "/json_errors");
  std::ofstream(path) << "{not json";
  expect_error(Tokenizer::from_tokenizer_json(path), StatusCode::kInvalidArgument, "JSON");
}

TEST_F(TokenizerJsonErrorTest, WrongJsonTypesAreInvalidArgument) {
  json root = base();
  root["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", 7}};
  expect_error(load(root), StatusCode::kInvalidArgument, "malformed");
  root = base();
  root["added_tokens"][0]["id"] = -3;
  expect_error(load(root), StatusCode::kInvalidArgument, "lacks id");
}

TEST_F(TokenizerJsonErrorTest, PostProcessorAddingEosIsRejected) {
  json root = base();
  root["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "<|im_end|>"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens",
       {{"<|im_end|>", {{"id", "<|im_end|>"}, {"ids", {2}}, {"tokens", {"<|im_end|>"}}}}}}};
  expect_error(load(root), StatusCode::kUnimplemented, "TemplateProcessing");
}

TEST(TokenizerJsonTest, ConfigBesideTokenizerJsonIsRead) {
  auto tokenizer = Tokenizer::from_tokenizer_json(kDataDir + "/smollm/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ((*tokenizer)->bos_id(), std::optional<TokenId>(1));
  EXPECT_EQ((*tokenizer)->eos_id(), std::optional<TokenId>(2));
  EXPECT_FALSE((*tokenizer)->add_bos_by_default());
  EXPECT_EQ((*tokenizer)->stop_ids(), (std::vector<TokenId>{0, 2}));
  auto gguf = must_load_gguf(STRATA_TEST_MODEL);
  ASSERT_NE(gguf, nullptr);
  EXPECT_EQ((*tokenizer)->chat_template_source(), gguf->chat_template_source());
  EXPECT_EQ((*tokenizer)->vocab_size(), gguf->vocab_size());
}

}  // namespace
}  // namespace strata::tokenizer
