// tokenizer.json loading (BPE, Unigram, normalizers, pre-tokenizers, added tokens), on arbitrary
// files; a tokenizer that loads must encode and decode without faults.
#include <cstddef>
#include <cstdint>

#include "fuzz_file.h"
#include "strata/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tokenizer =
      strata::tokenizer::Tokenizer::from_tokenizer_json(strata::fuzz::as_file(data, size));
  if (!tokenizer.ok()) return 0;
  const auto ids =
      (*tokenizer)->encode("Hello, world! 123 h\xc3\xa9llo \xe4\xbd\xa0\xe5\xa5\xbd", true);
  (void)(*tokenizer)->decode(ids, false);
  return 0;
}
