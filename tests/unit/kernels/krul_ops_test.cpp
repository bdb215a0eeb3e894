// Krul's libtorch operations (kernels/krul_ops.h): attention rows, the split statistics against
// an offline computation over whole attention matrices, MiniCache's merge, and the store's merged
// form of whole chunks against the merge of each chunk's pairs one by one; H2O's stored form
// against a plain selection per layer and KV head.
#include "strata/kernels/krul_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace strata::kernels::aten {
namespace {

using kv::krul::AttentionStats;

// The causal attention matrix of a whole sequence, plainly: [heads, s, s].
at::Tensor full_attention(const at::Tensor& q, const at::Tensor& k, double scale) {
  const int64_t s = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  const at::Tensor kr = k.repeat_interleave(heads / kv_heads, 1);  // [s, heads, d]
  const at::Tensor logits = at::einsum("qhd,khd->hqk", {q, kr}).mul(scale);
  const at::Tensor mask = at::ones({s, s}, at::kBool).triu(1);
  return at::softmax(logits.masked_fill(mask, -INFINITY), -1);
}

TEST(KrulOpsTest, AttentionRowsAreTheCausalSoftmaxRows) {
  at::manual_seed(1);
  const at::Tensor q = at::randn({20, 6, 16}), k = at::randn({20, 2, 16});
  const at::Tensor full = full_attention(q, k, 0.25);
  const at::Tensor rows = krul_attention_rows(q.slice(0, 7, 12), k.slice(0, 0, 15), 7, 0.25);
  ASSERT_EQ(rows.sizes(), (std::vector<int64_t>{6, 5, 15}));
  EXPECT_TRUE(at::allclose(rows, full.slice(1, 7, 12).slice(2, 0, 15), 1e-5, 1e-6));
  EXPECT_EQ(rows.slice(1, 0, 1).slice(2, 8, 15).abs().sum().item<float>(), 0.0f);
  // Every third row from 4 (rows 4, 7, 10, 13), over the keys up to 14.
  const at::Tensor strided =
      krul_attention_rows(q.slice(0, 4, 14, 3), k.slice(0, 0, 14), 4, 0.25, /*stride=*/3);
  ASSERT_EQ(strided.sizes(), (std::vector<int64_t>{6, 4, 14}));
  EXPECT_TRUE(at::allclose(strided, full.slice(1, 4, 14, 3).slice(2, 0, 14), 1e-5, 1e-6));
}

// Offline statistics from whole matrices A [layers, heads, s, s] (in double): what the split
// accumulation must equal.
AttentionStats offline(const at::Tensor& A) {
  const int64_t layers = A.size(0), heads = A.size(1), s = A.size(2);
  AttentionStats st(static_cast<int32_t>(layers), static_cast<int32_t>(heads));
  const at::Tensor a = A.to(at::kDouble);
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t r = 0; r < s; ++r) {
      const int64_t len = r + 1, e = std::max<int64_t>(1, len / 10);
      for (int64_t c = 0; c < len; ++c) {
        if (c < e || c >= len - e)
          st.edge_mass[l] += a[l].select(1, r).select(1, c).sum().item<double>();
      }
    }
    st.observed[l] = heads * s;
    for (int64_t j = 0; j < l; ++j) {
      for (int64_t h = 0; h < heads; ++h) {
        st.squared_at(static_cast<int32_t>(l), static_cast<int32_t>(j), static_cast<int32_t>(h)) =
            (a[l][h] - a[j][h]).pow(2).sum().item<double>();
      }
    }
  }
  return st;
}

TEST(KrulOpsTest, SplitStatisticsEqualTheOfflineComputation) {
  at::manual_seed(2);
  const int64_t layers = 5, heads = 4, kv_heads = 2, d = 8, s = 37, prompt = 23;
  // Layers that resemble each other to various degrees, so distances differ and matter.
  const at::Tensor base_q = at::randn({s, heads, d}), base_k = at::randn({s, kv_heads, d});
  std::vector<at::Tensor> qs, ks, full;
  for (int64_t l = 0; l < layers; ++l) {
    const double noise = 0.2 * static_cast<double>(l);
    qs.push_back(base_q + noise * at::randn({s, heads, d}));
    ks.push_back(base_k + noise * at::randn({s, kv_heads, d}));
    full.push_back(full_attention(qs.back(), ks.back(), 0.35));
  }
  const AttentionStats want = offline(at::stack(full));

  // Prompt rows in blocks of 5, over the prompt's keys; then one decode row per step over the
  // keys so far: the engine's two paths.
  AttentionStats prefill(layers, heads), decode(layers, heads);
  for (int64_t start = 0; start < prompt; start += 5) {
    const int64_t r = std::min<int64_t>(5, prompt - start);
    std::vector<at::Tensor> rows;
    for (int64_t l = 0; l < layers; ++l) {
      rows.push_back(krul_attention_rows(qs[l].slice(0, start, start + r),
                                         ks[l].slice(0, 0, prompt), start, 0.35));
    }
    krul_accumulate(at::stack(rows), at::arange(start + 1, start + r + 1, at::kLong), prefill);
  }
  for (int64_t p = prompt; p < s; ++p) {
    std::vector<at::Tensor> rows;
    for (int64_t l = 0; l < layers; ++l) {
      rows.push_back(
          krul_attention_rows(qs[l].slice(0, p, p + 1), ks[l].slice(0, 0, p + 1), p, 0.35));
    }
    krul_accumulate(at::stack(rows), at::full({1}, p + 1, at::kLong), decode);
  }
  prefill.add(decode);
  for (int32_t i = 0; i < layers; ++i) {
    EXPECT_NEAR(prefill.edge_share(i), want.edge_share(i), 1e-6) << "layer " << i;
    for (int32_t j = 0; j < i; ++j) {
      for (int32_t h = 0; h < heads; ++h) {
        const double w = want.squared_at(i, j, h);
        EXPECT_NEAR(prefill.squared_at(i, j, h), w, 1e-4 * w + 1e-9)
            << i << "," << j << " head " << h;
      }
    }
  }
  // The same pairs from both.
  const std::vector<bool> all(layers, true);
  const auto a = kv::krul::select_pairs(prefill, all, 0.8),
             b = kv::krul::select_pairs(want, all, 0.8);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].shallow, b[i].shallow);
    EXPECT_EQ(a[i].deep, b[i].deep);
  }
  // Nearer layers are nearer: the noise grows with depth.
  EXPECT_LT(want.distance(1, 0), want.distance(4, 0));
}

TEST(KrulOpsTest, MergeKeepsMagnitudesAndRestoresRetainedPairsExactly) {
  at::manual_seed(3);
  const at::Tensor a = at::randn({50, 3, 32});
  const at::Tensor b = a + 0.3 * at::randn({50, 3, 32});
  {  // identical layers: lossless whatever t
    auto [e, m, kept, orig] = krul_merge(a, a, 0.6, 0.0);
    const at::Tensor back = krul_unmerge(e, m, kept, orig);
    EXPECT_TRUE(at::allclose(back[0], a, 1e-4, 1e-5));
    EXPECT_TRUE(at::allclose(back[1], a, 1e-4, 1e-5));
    EXPECT_EQ(kept.numel(), 0);
  }
  auto [e, m, kept, orig] = krul_merge(a, b, 0.6, 0.05);
  const at::Tensor back = krul_unmerge(e, m, kept, orig);
  // magnitudes exact, directions shared
  EXPECT_TRUE(at::allclose(at::linalg_vector_norm(back, 2, {-1}), at::stack({a, b}).norm(2, -1),
                           1e-4, 1e-5));
  // retained pairs: the farthest angles, restored bit for bit
  ASSERT_GT(kept.numel(), 0);
  ASSERT_LT(kept.numel(), 50 * 3);
  const at::Tensor fa = a.reshape({-1, 32}), fb = b.reshape({-1, 32});
  EXPECT_TRUE(at::equal(back[0].reshape({-1, 32}).index_select(0, kept), fa.index_select(0, kept)));
  EXPECT_TRUE(at::equal(back[1].reshape({-1, 32}).index_select(0, kept), fb.index_select(0, kept)));
  const at::Tensor angle = at::acos(at::cosine_similarity(fa, fb, 1).clamp(-1, 1));
  const at::Tensor mask = at::zeros({150}, at::kBool).index_fill(0, kept, true);
  EXPECT_GT(angle.masked_select(mask).min().item<float>(),
            angle.masked_select(~mask).max().item<float>());
  // the merge error is that of the angle: each restored vector sits between the two directions
  const at::Tensor err_a = (back[0] - a).norm(2, -1) / a.norm(2, -1);
  EXPECT_LT(err_a.max().item<float>(), 0.6f);
  // t = 0: the shallow layer's direction, so it comes back exactly
  auto [e0, m0, k0, o0] = krul_merge(a, b, 0.0, 0.0);
  EXPECT_TRUE(at::allclose(krul_unmerge(e0, m0, k0, o0)[0], a, 1e-4, 1e-5));
  // bf16 in, bf16 out
  auto [eb, mb, kb, ob] = krul_merge(a.to(at::kBFloat16), b.to(at::kBFloat16), 0.6, 0.05);
  EXPECT_EQ(krul_unmerge(eb, mb, kb, ob).scalar_type(), at::kBFloat16);
}

TEST(KrulOpsTest, MaxRetainedKeepsTheWidestPerGroup) {
  at::manual_seed(4);
  const at::Tensor a = at::randn({32, 3, 16});
  const at::Tensor b = at::randn({32, 3, 16});  // unrelated: wide angles everywhere
  auto [e, m, all, o] = krul_merge(a, b, 0.6, 0.5, -1, 16);
  auto [e2, m2, capped, o2] = krul_merge(a, b, 0.6, 0.5, 2, 16);
  // Two groups of 16 tokens x 3 heads: at most 2 each, a subset of the uncapped choice.
  ASSERT_EQ(capped.numel(), 4);
  EXPECT_LT(capped[1].item<int64_t>(), 48);
  EXPECT_GE(capped[2].item<int64_t>(), 48);
  const at::Tensor angle =
      at::acos(at::cosine_similarity(a.reshape({-1, 16}), b.reshape({-1, 16}), 1).clamp(-1, 1));
  for (int64_t g = 0; g < 2; ++g) {
    const at::Tensor in_group = all.masked_select((all >= g * 48) & (all < (g + 1) * 48));
    const at::Tensor kept = capped.slice(0, 2 * g, 2 * g + 2);
    EXPECT_GT(in_group.numel(), 2);
    // the two kept are the widest of the group's candidates
    const at::Tensor top = std::get<0>(at::topk(angle.index_select(0, in_group), 2));
    EXPECT_TRUE(at::allclose(std::get<0>(at::sort(angle.index_select(0, kept), 0, true)), top));
  }
  auto [e0, m0, none, o0] = krul_merge(a, b, 0.6, 0.5, 0, 16);
  EXPECT_EQ(none.numel(), 0);
}

// The merged form of whole chunks [n, layers, 2, heads, block, d] restores what merging each
// chunk's pairs one at a time restores, exactly, in every dtype.
TEST(KrulOpsTest, MergedChunksRestoreWhatEachPairsMergeRestores) {
  at::manual_seed(5);
  const int64_t n = 3, layers = 6, heads = 2, block = 8, d = 16;
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor chunks = at::randn({n, layers, 2, heads, block, d});
    chunks.select(1, 4).copy_(chunks.select(1, 1) + 0.2 * at::randn_like(chunks.select(1, 1)));
    chunks = chunks.to(dtype);
    const std::vector<kv::krul::LayerPair> pairs = {{3, 5, 0.0}, {1, 4, 0.0}};
    const kv::krul::MergedForm form{.pairs = 2, .retained = 3, .slerp_t = 0.6, .retain = 0.3};
    const at::Tensor merged = krul_merge_chunks(chunks, form, pairs);
    const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
    ASSERT_EQ(merged.sizes(), (std::vector<int64_t>{
                                  n, krul_merged_chunk_bytes(form, layers, heads, block, d, es)}));
    EXPECT_LT(merged.size(1), layers * 2 * heads * block * d * es);
    const at::Tensor back =
        krul_unmerge_chunks(merged, form, pairs, layers, heads, block, d, dtype);
    ASSERT_EQ(back.sizes(), chunks.sizes());
    // unpaired layers as they were
    for (int64_t l : {0, 2}) EXPECT_TRUE(at::equal(back.select(1, l), chunks.select(1, l)));
    for (int64_t c = 0; c < n; ++c) {
      for (const kv::krul::LayerPair& p : pairs) {
        for (int64_t kv = 0; kv < 2; ++kv) {
          const auto tokens = [&](int64_t l) {
            return chunks[c][l][kv].permute({1, 0, 2}).contiguous();  // [block, heads, d]
          };
          auto [e, m, kept, orig] = krul_merge(tokens(p.shallow), tokens(p.deep), 0.6, 0.3, 3);
          EXPECT_LE(kept.numel(), 3);
          const at::Tensor want = krul_unmerge(e, m, kept, orig);  // [2, block, heads, d]
          EXPECT_TRUE(at::equal(back[c][p.shallow][kv], want[0].permute({1, 0, 2})))
              << "chunk " << c << " layer " << p.shallow;
          EXPECT_TRUE(at::equal(back[c][p.deep][kv], want[1].permute({1, 0, 2})))
              << "chunk " << c << " layer " << p.deep;
        }
      }
    }
    // the pair of near layers restores closely, the unrelated pair does not
    const auto error = [&](int64_t l) {
      return ((back.select(1, l).to(at::kFloat) - chunks.select(1, l).to(at::kFloat)).norm() /
              chunks.select(1, l).to(at::kFloat).norm())
          .item<double>();
    };
    EXPECT_LT(error(4), 0.2);
    EXPECT_GT(error(5), 0.3);
  }
  // Identical layers: lossless; no pairs: the chunks' own bytes.
  const at::Tensor same =
      at::randn({2, 4, 2, 2, 8, 16}).select(1, 0).unsqueeze(1).repeat({1, 4, 1, 1, 1, 1});
  const kv::krul::MergedForm two{.pairs = 2, .retained = 0, .slerp_t = 0.6, .retain = 0.05};
  const at::Tensor restored =
      krul_unmerge_chunks(krul_merge_chunks(same, two, {{0, 1, 0.0}, {2, 3, 0.0}}), two,
                          {{0, 1, 0.0}, {2, 3, 0.0}}, 4, 2, 8, 16, at::kFloat);
  EXPECT_TRUE(at::allclose(restored, same, 1e-5, 1e-5));
  const kv::krul::MergedForm zero{.pairs = 0, .retained = 0, .slerp_t = 0.6, .retain = 0.05};
  const at::Tensor raw = krul_merge_chunks(same, zero, {});
  EXPECT_TRUE(at::equal(raw, same.contiguous().view({2, -1}).view(at::kByte)));
  // Pairs that overlap or run past the layers are refused.
  EXPECT_THROW(krul_merge_chunks(same, two, {{0, 1, 0.0}, {1, 2, 0.0}}), c10::Error);
  EXPECT_THROW(krul_merge_chunks(same, two, {{2, 4, 0.0}, {0, 1, 0.0}}), c10::Error);
  EXPECT_THROW(krul_unmerge_chunks(raw, two, {{0, 1, 0.0}, {2, 3, 0.0}}, 4, 2, 8, 16, at::kFloat),
               c10::Error);
}

// Random chunks of seven layers with pairs (4, 6) and (0, 3) merged: their merged form, its
// whole restoring, and the form's bytes of a layer and of a pair's side data.
struct SevenMergedLayers {
  static constexpr int64_t n = 2, layers = 7, heads = 2, block = 8, d = 16;
  explicit SevenMergedLayers(c10::ScalarType dtype)
      : chunks(at::randn({n, layers, 2, heads, block, d}).to(dtype)),
        merged(krul_merge_chunks(chunks, form, pairs)),
        whole(krul_unmerge_chunks(merged, form, pairs, layers, heads, block, d, dtype)),
        layer_bytes(2 * heads * block * d * static_cast<int64_t>(c10::elementSize(dtype))),
        pair_bytes((merged.size(1) - (layers - form.pairs) * layer_bytes) / form.pairs) {}

  const at::Tensor chunks;
  const std::vector<kv::krul::LayerPair> pairs = {{4, 6, 0.0}, {0, 3, 0.0}};
  const kv::krul::MergedForm form{.pairs = 2, .retained = 3, .slerp_t = 0.6, .retain = 0.3};
  const at::Tensor merged, whole;
  const int64_t layer_bytes, pair_bytes;
};

// A stored suffix of merged chunks (docs/krul.md decision 12): with the bytes before
// merged_layer_offset(f) zeroed, unmerging restores every layer from f on exactly as the whole
// chunk does, also a pair whose shallow layer lies before f (its data is at its deep layer's
// place), for every f, and the form lays its pieces out where the offsets say.
TEST(KrulOpsTest, ASuffixOfMergedChunksRestoresTheLayersItKeeps) {
  at::manual_seed(7);
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const SevenMergedLayers c(dtype);
    const std::vector<kv::krul::LayerPair>& pairs = c.pairs;
    const kv::krul::MergedForm& form = c.form;
    const at::Tensor &chunks = c.chunks, &merged = c.merged, &whole = c.whole;
    const int64_t n = c.n, layers = c.layers, heads = c.heads, block = c.block, d = c.d;
    const int64_t layer_bytes = c.layer_bytes, pair_bytes = c.pair_bytes;
    // Unpaired layer 1 sits after layer 0's nothing: at offset 0; layer 5 after 1, 2, 3 (with
    // its pair's bytes) and 4's nothing.
    EXPECT_EQ(kv::krul::merged_layer_offset(pairs, 1, layer_bytes, pair_bytes), 0);
    EXPECT_EQ(kv::krul::merged_layer_offset(pairs, 5, layer_bytes, pair_bytes),
              3 * layer_bytes + pair_bytes);
    EXPECT_EQ(kv::krul::merged_layer_offset(pairs, layers, layer_bytes, pair_bytes),
              merged.size(1));
    EXPECT_TRUE(at::equal(merged.narrow(1, 0, layer_bytes),
                          chunks.select(1, 1).contiguous().view({n, -1}).view(at::kByte)));
    for (int32_t f = 1; f < layers; ++f) {
      const int64_t offset = kv::krul::merged_layer_offset(pairs, f, layer_bytes, pair_bytes);
      at::Tensor suffix = merged.clone();
      suffix.narrow(1, 0, offset).zero_();
      const at::Tensor back =
          krul_unmerge_chunks(suffix, form, pairs, layers, heads, block, d, dtype);
      EXPECT_TRUE(at::equal(back.narrow(1, f, layers - f), whole.narrow(1, f, layers - f)))
          << "from layer " << f;
      // Layer 0's pair (0, 3) is restored whole while layer 3 is kept.
      if (f <= 3) EXPECT_TRUE(at::equal(back.select(1, 0), whole.select(1, 0))) << f;
      EXPECT_FALSE(back.isnan().any().item<bool>()) << "zeros restore zeros, from layer " << f;
    }
  }
}

// Layers [b, e) of merged chunks restore as the whole chunks' restoring does, from only the bytes
// they are restored from (KvStore::layer_offset's places; a pair's shallow layer its deep
// layer's): every other byte is poisoned (0xff: NaN values, and retained indices of -1, the
// empty slot, which drop the retained vectors if read), for every range.
TEST(KrulOpsTest, ARangeOfLayersRestoresFromItsOwnBytesOnly) {
  at::manual_seed(9);
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const SevenMergedLayers c(dtype);
    const std::vector<kv::krul::LayerPair>& pairs = c.pairs;
    const kv::krul::MergedForm& form = c.form;
    const at::Tensor &merged = c.merged, &whole = c.whole;
    const int64_t layers = c.layers, heads = c.heads, block = c.block, d = c.d;
    const int64_t layer_bytes = c.layer_bytes, pair_bytes = c.pair_bytes;
    const auto place = [&](int32_t l) {
      return kv::krul::merged_layer_offset(pairs, l, layer_bytes, pair_bytes);
    };
    for (int32_t b = 0; b < layers; ++b) {
      for (int32_t e = b + 1; e <= layers; ++e) {
        // Kept: the places of layers [b, e) and of the deep layers of pairs starting in it.
        at::Tensor poisoned = at::full_like(merged, 0xff);
        const auto keep = [&](int32_t from, int32_t to) {
          poisoned.narrow(1, place(from), place(to) - place(from))
              .copy_(merged.narrow(1, place(from), place(to) - place(from)));
        };
        keep(b, e);
        for (const kv::krul::LayerPair& p : pairs) {
          if (p.shallow >= b && p.shallow < e && p.deep >= e) keep(p.deep, p.deep + 1);
        }
        const at::Tensor back =
            krul_unmerge_chunks(poisoned, form, pairs, layers, heads, block, d, dtype, b, e);
        EXPECT_TRUE(at::equal(back, whole.narrow(1, b, e - b)))
            << "layers [" << b << ", " << e << ")";
      }
    }
    EXPECT_THROW(krul_unmerge_chunks(merged, form, pairs, layers, heads, block, d, dtype, 3, 8),
                 c10::Error);
  }
}

TEST(KrulOpsTest, H2oKeepsTheRecentHalfAndTheHeaviestOthersInOrder) {
  constexpr int64_t kChunks = 5, kLayers = 3, kHeads = 2, kBlock = 4, kDim = 3, kKept = 3;
  constexpr int64_t kTotal = kChunks * kBlock, kKeep = kKept * kBlock, kRecent = kKeep / 2;
  at::manual_seed(5);
  // Every value names its token, so the output shows which tokens were kept.
  const at::Tensor chunks = at::randn({kChunks, kLayers, 2, kHeads, kBlock, kDim});
  // Masses for the first 12 tokens only: tokens 12 and 13, candidates too, were never observed (0).
  const at::Tensor mass = at::rand({12, kLayers, kHeads});
  const at::Tensor got = h2o_keep_chunks(chunks, mass, kKept);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{kKept, kLayers, 2, kHeads, kBlock, kDim}));
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t h = 0; h < kHeads; ++h) {
      // The reference: the heaviest kKeep - kRecent of tokens [0, kTotal - kRecent), then the
      // window, sorted by position.
      std::vector<int64_t> order(kTotal - kRecent);
      std::iota(order.begin(), order.end(), 0);
      const auto score = [&](int64_t t) { return t < 12 ? mass[t][l][h].item<float>() : 0.0F; };
      std::sort(order.begin(), order.end(),
                [&](int64_t a, int64_t b) { return score(a) > score(b); });
      std::vector<int64_t> kept(order.begin(), order.begin() + (kKeep - kRecent));
      for (int64_t t = kTotal - kRecent; t < kTotal; ++t) kept.push_back(t);
      std::sort(kept.begin(), kept.end());
      for (int64_t j = 0; j < kKeep; ++j) {
        const int64_t t = kept[static_cast<size_t>(j)];
        for (int64_t kv = 0; kv < 2; ++kv) {
          EXPECT_TRUE(at::equal(got[j / kBlock][l][kv][h][j % kBlock],
                                chunks[t / kBlock][l][kv][h][t % kBlock]))
              << "layer " << l << " head " << h << " kept token " << j << " (token " << t << ")";
        }
      }
    }
  }
  // All chunks kept: every token, in order.
  EXPECT_TRUE(at::equal(h2o_keep_chunks(chunks, mass, kChunks), chunks));
}

}  // namespace
}  // namespace strata::kernels::aten
