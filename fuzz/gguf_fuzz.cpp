// The GGUF reader and the tokenizers built from GGUF metadata, on arbitrary files.
#include <cstddef>
#include <cstdint>

#include "fuzz_file.h"
#include "strata/model/gguf_file.h"
#include "strata/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = strata::model::GgufFile::open(strata::fuzz::as_file(data, size));
  if (!file.ok()) return 0;
  auto tokenizer = strata::tokenizer::Tokenizer::from_gguf(**file);
  if (tokenizer.ok()) {
    const auto ids = (*tokenizer)->encode("Hello, world! 123 héllo", false);
    (void)(*tokenizer)->decode(ids, false);
  }
  return 0;
}
