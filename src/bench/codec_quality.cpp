#include "strata/bench/codec_quality.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kv_experiment.h"
#include "strata/executor/executor.h"
#include "strata/kv/kv_format.h"
#include "strata/store/item_codecs.h"
#include "strata/store/store_config.h"

namespace strata::bench {
namespace {

// The history as one codec restores it: the chunks a load reads and the tokens they hold.
struct Restored {
  Chunks chunks;
  std::optional<kv::KvFormat> encoding;
  std::vector<TokenId> tokens;
  int64_t stored_chunk_bytes = 0;  // as stored, where the chunks loaded are restored ones
};

// Log-probabilities of one row of logits, in double.
std::vector<double> log_softmax(const float* row, int64_t vocab) {
  const float max = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v] - max));
  const double log_sum = std::log(sum) + max;
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[static_cast<size_t>(v)] = row[v] - log_sum;
  return out;
}

int64_t argmax(std::span<const double> row) {
  return std::max_element(row.begin(), row.end()) - row.begin();
}

}  // namespace

StatusOr<CodecQualityResult> measure_codec_quality(executor::Executor& executor,
                                                   std::span<const TokenId> history,
                                                   std::span<const TokenId> prompt,
                                                   const CodecQualityOptions& options) {
  Experiment x(executor);
  const int64_t b = x.block(), h = std::ssize(history), p = std::ssize(prompt);
  const int64_t n = h / b;
  if (h % b != 0 || n < 2 || p < 1 || options.answer_tokens < 1) {
    return invalid_argument_error("codec quality: a history of " + std::to_string(h) +
                                  " tokens (a multiple of " + std::to_string(b) +
                                  ", >= 2 blocks), a prompt of " + std::to_string(p) +
                                  " (>= 1) and answer_tokens >= 1 are needed");
  }
  const int64_t vocab = executor.config().vocab_size;
  CodecQualityResult result;
  result.history_tokens = h;
  result.prompt_tokens = p;

  const std::vector<TokenId> history_ids(history.begin(), history.end());
  STRATA_RETURN_IF_ERROR(x.kv().add_sequence(SeqId{1}, history_ids, ""));
  Chunks saved = x.chunks(n);
  STRATA_RETURN_IF_ERROR(x.run(SeqId{1}, h, executor::LogitsMode::kNone, {}, &saved).status());
  x.kv().free(SeqId{1});

  // Every codec's restored history, "none" first.
  std::vector<std::pair<std::string, Restored>> restored;
  restored.push_back({"none", {saved, std::nullopt, history_ids, 0}});
  for (const store::KnownItemCodec& codec : store::kItemCodecs) {
    // H2O chooses by the attention a served turn observed, which this experiment does not run.
    if (codec.heavy_hitters) continue;
    Restored r;
    if (codec.kivi_bits > 0) {
      r.encoding = kv::kivi_format(codec.kivi_bits);
      r.chunks = Chunks(static_cast<size_t>(n),
                        std::vector<std::byte>(executor.kv_chunk_bytes(*r.encoding)));
      std::vector<const std::byte*> in;
      std::vector<std::byte*> out;
      for (int64_t i = 0; i < n; ++i) {
        in.push_back(saved[static_cast<size_t>(i)].data());
        out.push_back(r.chunks[static_cast<size_t>(i)].data());
      }
      STRATA_RETURN_IF_ERROR(executor.transcode_kv_chunks(std::nullopt, r.encoding, in, out));
      r.tokens = history_ids;
    } else if (codec.layer_merge) {
      // Merged and restored as the store does, with MiniCache's pairs (the deepest adjacent
      // layers) at the deployment defaults' share: Krul's pairs come from the attention a served
      // turn observed, which this experiment does not run.
      const store::StoreConfig defaults;
      const kv::KvGeometry& g = executor.kv_geometry();
      const kv::krul::MergedForm form =
          kv::krul::merged_form(defaults.layer_share, defaults.merge_retain, g.num_layers,
                                int64_t{g.num_kv_heads} * g.block_size_tokens);
      const std::vector<kv::krul::LayerPair> pairs =
          kv::krul::adjacent_pairs(g.num_layers - 2 * form.pairs, g.num_layers - 1);
      Chunks merged(static_cast<size_t>(n),
                    std::vector<std::byte>(executor.kv_chunk_bytes(form)));
      r.chunks = Chunks(static_cast<size_t>(n), std::vector<std::byte>(executor.kv_chunk_bytes()));
      std::vector<const std::byte*> in, merged_in;
      std::vector<std::byte*> merged_out, out;
      for (int64_t i = 0; i < n; ++i) {
        in.push_back(saved[static_cast<size_t>(i)].data());
        merged_out.push_back(merged[static_cast<size_t>(i)].data());
        merged_in.push_back(merged[static_cast<size_t>(i)].data());
        out.push_back(r.chunks[static_cast<size_t>(i)].data());
      }
      STRATA_RETURN_IF_ERROR(executor.merge_kv_chunks(form, pairs, in, merged_out));
      STRATA_RETURN_IF_ERROR(executor.unmerge_kv_chunks(
          form, pairs, merged_in, out, 0, static_cast<int32_t>(executor.config().num_layers)));
      r.stored_chunk_bytes = executor.kv_chunk_bytes(form);
      r.tokens = history_ids;
    } else {
      // Chunk 0 (the sinks) and the most recent chunks (the window), as the store keeps them.
      const int64_t kept = store::kept_chunks(codec.keep_fraction, n);
      r.chunks.push_back(saved[0]);
      r.tokens.assign(history.begin(), history.begin() + b);
      for (int64_t i = n - kept + 1; i < n; ++i) {
        r.chunks.push_back(saved[static_cast<size_t>(i)]);
        r.tokens.insert(r.tokens.end(), history.begin() + i * b, history.begin() + (i + 1) * b);
      }
    }
    restored.push_back({std::string(codec.name), std::move(r)});
  }

  SeqId next{2};
  // A sequence of the restored history and `tail`, its history loaded: the sequence's id.
  auto start = [&](const Restored& r, std::span<const TokenId> tail) -> StatusOr<SeqId> {
    const SeqId seq = next;
    next = SeqId{next.value + 1};
    std::vector<TokenId> tokens = r.tokens;
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    STRATA_RETURN_IF_ERROR(x.kv().add_sequence(seq, std::move(tokens), ""));
    x.kv().set_external_prefix(seq, std::ssize(r.chunks), /*exact=*/false);
    return seq;
  };
  auto loads_of = [](SeqId seq, const Restored& r) {
    std::vector<executor::KvLoad> loads(1);
    loads[0] = {seq, 0, {}, r.encoding};
    for (const auto& c : r.chunks) loads[0].chunks.push_back(c.data());
    return loads;
  };

  std::vector<TokenId> reference;                   // "none"'s answer
  std::vector<std::vector<double>> reference_rows;  // its log-probabilities, teacher forced
  for (auto& [name, r] : restored) {
    CodecQuality q;
    q.codec = name;
    const int64_t chunk_bytes =
        r.stored_chunk_bytes > 0 ? r.stored_chunk_bytes : std::ssize(r.chunks[0]);
    q.stored_share = static_cast<double>(std::ssize(r.chunks) * chunk_bytes) /
                     static_cast<double>(n * executor.kv_chunk_bytes());
    q.dropped_tokens = h - std::ssize(r.tokens);

    // The greedy answer.
    STRATA_ASSIGN_OR_RETURN(const SeqId seq, start(r, prompt));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> logits,
                            x.run(seq, p, executor::LogitsMode::kLast, loads_of(seq, r)));
    for (;;) {
      const auto token =
          static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      q.answer.push_back(token);
      if (token == options.eos || std::ssize(q.answer) == options.answer_tokens) break;
      x.kv().append_tokens(seq, std::span(&token, 1));
      STRATA_ASSIGN_OR_RETURN(logits, x.run(seq, 1, executor::LogitsMode::kLast));
    }
    x.kv().free(seq);
    if (reference.empty()) reference = q.answer;

    // The reference answer, teacher forced: the prompt's last row predicts its first token, the
    // answer's rows the rest.
    std::vector<TokenId> tail(prompt.begin(), prompt.end());
    tail.insert(tail.end(), reference.begin(), reference.end() - 1);
    STRATA_ASSIGN_OR_RETURN(const SeqId forced, start(r, tail));
    STRATA_ASSIGN_OR_RETURN(std::vector<float> first,
                            x.run(forced, p, executor::LogitsMode::kLast, loads_of(forced, r)));
    std::vector<float> rest;
    if (reference.size() > 1) {
      STRATA_ASSIGN_OR_RETURN(rest,
                              x.run(forced, std::ssize(reference) - 1, executor::LogitsMode::kAll));
    }
    x.kv().free(forced);
    std::vector<std::vector<double>> rows = {log_softmax(first.data(), vocab)};
    for (size_t i = 0; i + 1 < reference.size(); ++i) {
      rows.push_back(log_softmax(rest.data() + i * static_cast<size_t>(vocab), vocab));
    }
    if (reference_rows.empty()) reference_rows = rows;
    int64_t agree = 0;
    double kl = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (argmax(rows[i]) == argmax(reference_rows[i])) ++agree;
      for (int64_t v = 0; v < vocab; ++v) {
        const double ref = reference_rows[i][static_cast<size_t>(v)];
        kl += std::exp(ref) * (ref - rows[i][static_cast<size_t>(v)]);
      }
    }
    q.agreement = static_cast<double>(agree) / static_cast<double>(rows.size());
    q.kl = kl / static_cast<double>(rows.size());
    result.codecs.push_back(std::move(q));
  }
  return result;
}

}  // namespace strata::bench
