// A model on disk: its configuration plus access to its weights by canonical name, dequantized
// to float32 in the layout the executor uses, whatever the file format.
//
// Canonical weight names follow GGUF: token_embd.weight, output_norm.weight, output.weight,
// blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,ffn_gate,ffn_up,ffn_down}.weight,
// blk.N.{attn_q,attn_k,attn_v}.bias. Shapes are given outermost first (torch order):
// a linear layer is [out_features, in_features], the embedding [vocab, hidden].
//
// Q and K projection rows are always in HF order, so RoPE rotates the pairs (i, i + head_dim/2):
// the GGUF `llama` converter interleaves them (pairs (2i, 2i+1)) and read_weight() undoes that
// permutation. See docs/decisions/0001-rope-pairing.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/common/status.h"
#include "strata/model/model_config.h"

namespace strata::model {

class GgufFile;

// A weight kept as 4-bit codes (model/dequantize.h decode_int4_codes): w[r, c] =
// scale[r, c / 32] * codes[r, c] + offset[r, c / 32], codes in [0, 16).
struct Int4Weight {
  int64_t rows = 0, cols = 0;  // cols is a multiple of 32
  std::vector<uint8_t> codes;  // [rows, cols]
  std::vector<float> scale;    // [rows, cols / 32]
  std::vector<float> offset;   // [rows, cols / 32]
};

class ModelSource {
 public:
  virtual ~ModelSource() = default;

  virtual const ModelConfig& config() const = 0;
  // File or directory the model came from.
  virtual const std::string& path() const = 0;
  virtual bool has_weight(const std::string& name) const = 0;
  // NOT_FOUND naming the model path and tensor if absent.
  virtual StatusOr<std::vector<int64_t>> weight_shape(const std::string& name) const = 0;
  // Writes the weight, dequantized, into dst (row-major, weight_shape() order).
  // REQUIRES dst.size() == product of weight_shape(name). Thread-safe.
  virtual Status read_weight(const std::string& name, std::span<float> dst) const = 0;
  // The weight as the file stores it when that is a 4-bit block type (GGUF Q4_0, Q4_1, Q4_K), rows
  // in read_weight()'s order; UNIMPLEMENTED for any other storage (dequantize it instead).
  virtual StatusOr<Int4Weight> read_weight_int4(const std::string& name) const = 0;
  // The stored element type ("Q4_K", "F32", "BF16", ...), for logs; "" if the weight is absent.
  virtual std::string weight_storage(const std::string& name) const = 0;

  // A digest of what the model computes, independent of where it lives: XXH3-64 over the GGUF
  // file (metadata and tensor data), or over config.json and the *.safetensors files in name
  // order. Equal for a moved or copied model; keys cached KV (the prefix cache and the store).
  virtual uint64_t content_fingerprint() const = 0;
  // The GGUF file behind this source, or nullptr for a HF directory.
  virtual const GgufFile* gguf() const = 0;
  // tokenizer.json of a HF directory; empty for GGUF (its tokenizer lives in the metadata).
  virtual std::string tokenizer_json_path() const = 0;
};

// Opens a `.gguf` file or a HF model directory (config.json + *.safetensors + tokenizer.json),
// reads and validates the configuration, and checks that every weight the architecture needs is
// present with the expected shape. Errors name the file, tensor and reason.
StatusOr<std::unique_ptr<ModelSource>> open_model_source(const std::string& path);

// Names and shapes every supported architecture needs (used by sources to validate).
struct ExpectedWeight {
  std::string name;
  std::vector<int64_t> shape;
  bool optional = false;  // e.g. output.weight when embeddings are tied
};
std::vector<ExpectedWeight> expected_weights(const ModelConfig& config);

}  // namespace strata::model
