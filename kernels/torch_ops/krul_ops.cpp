#include "strata/kernels/krul_ops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace strata::kernels::aten {

at::Tensor krul_attention_rows(const at::Tensor& q, const at::Tensor& k, int64_t start,
                               double scale, int64_t stride) {
  const int64_t r = q.size(0), heads = q.size(1), kv_heads = k.size(1), end = k.size(0);
  const int64_t group = heads / kv_heads;
  TORCH_CHECK(group * kv_heads == heads, "query heads ", heads, " not a multiple of KV heads ",
              kv_heads);
  TORCH_CHECK(stride >= 1 && start >= 0 && start + (r - 1) * stride < end, "rows from ", start,
              " every ", stride, " (", r, " of them) beyond ", end, " keys");
  // [kv_heads, group * r, d] x [kv_heads, d, end] -> [heads, r, end], the scale on the queries
  // (r x d values rather than r x end).
  const at::Tensor qh =
      q.to(at::kFloat).mul(scale).permute({1, 0, 2}).reshape({kv_heads, group * r, -1});
  const at::Tensor kt = k.to(at::kFloat).permute({1, 2, 0});
  const at::Tensor logits = at::bmm(qh, kt).reshape({heads, r, end});
  // A decode row (the one row at the last key) sees every key: no mask to build.
  if (start == end - 1) return at::softmax(logits, -1);
  const at::Tensor positions =
      at::arange(start, start + r * stride, stride, q.options().dtype(at::kLong)).unsqueeze(1);
  const at::Tensor keys = at::arange(end, q.options().dtype(at::kLong));
  return at::softmax(logits.masked_fill(keys > positions, -INFINITY), -1);
}

at::Tensor krul_token_mass(const at::Tensor& rows, int64_t num_kv_heads) {
  const int64_t layers = rows.size(0), t = rows.size(3);
  // [layers, kv heads, group * r, t] summed over the group's heads and the rows.
  return rows.to(at::kFloat).reshape({layers, num_kv_heads, -1, t}).sum(2).permute({2, 0, 1});
}

void krul_accumulate(const at::Tensor& rows, const at::Tensor& lengths,
                     kv::krul::AttentionStats& stats) {
  const int64_t layers = rows.size(0), heads = rows.size(1), r = rows.size(2), t = rows.size(3);
  TORCH_CHECK(layers == stats.num_layers && heads == stats.num_heads, "rows of ", layers, "x",
              heads, " for statistics of ", stats.num_layers, "x", stats.num_heads);
  if (r == 0) return;
  // Each row's edge: its first and last e = max(1, floor(length / 10)) positions.
  const at::Tensor len = lengths.to(rows.device(), at::kLong).unsqueeze(1);  // [r, 1]
  const at::Tensor edge = at::clamp_min(at::floor_divide(len, 10), 1);
  const at::Tensor pos = at::arange(t, len.options());
  const at::Tensor mask = ((pos < edge) | ((pos >= len - edge) & (pos < len))).to(at::kFloat);
  // [layers * heads, r * t] x [r * t]: a matrix-vector product, no temporary of the rows' size
  const at::Tensor mass =
      at::mv(rows.to(at::kFloat).reshape({layers * heads, r * t}), mask.reshape({-1}))
          .reshape({layers, heads})
          .sum(1)
          .to(at::kDouble)
          .cpu();  // [layers]
  const double* m = mass.data_ptr<double>();
  for (int64_t l = 0; l < layers; ++l) {
    stats.edge_mass[static_cast<size_t>(l)] += m[l];
    stats.observed[static_cast<size_t>(l)] += heads * r;
  }
  if (stats.num_kv_heads > 0) {
    const at::Tensor received = krul_token_mass(rows, stats.num_kv_heads).contiguous().cpu();
    stats.add_token_mass({received.data_ptr<float>(), static_cast<size_t>(received.numel())});
  }
  // Per head, the Gram matrix of the layers' flattened rows, [heads, layers, layers], in float32
  // (BLAS: float64 was 25x slower on the CPU) over rows centred on their mean across layers:
  // distances do not move, and the norms shrink to the scale of the distances, so
  // ||a||^2 + ||b||^2 - 2 a.b cancels little.
  at::Tensor flat = rows.permute({1, 0, 2, 3}).reshape({heads, layers, r * t}).to(at::kFloat);
  flat = flat - flat.mean(1, /*keepdim=*/true);
  const at::Tensor gram = at::bmm(flat, flat.transpose(1, 2)).to(at::kDouble);
  const at::Tensor norms = gram.diagonal(0, 1, 2);  // [heads, layers]
  const at::Tensor sq = at::clamp_min(norms.unsqueeze(2) + norms.unsqueeze(1) - 2 * gram, 0.0)
                            .permute({1, 2, 0})
                            .contiguous()
                            .cpu();
  const double* s = sq.data_ptr<double>();  // [layers (i), layers (j), heads]
  for (int64_t i = 0; i < layers; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      for (int64_t h = 0; h < heads; ++h) {
        stats.squared_at(static_cast<int32_t>(i), static_cast<int32_t>(j),
                         static_cast<int32_t>(h)) += s[(i * layers + j) * heads + h];
      }
    }
  }
}

void krul_accumulate_rows(const at::Tensor& rows, const at::Tensor& lengths, at::Tensor& squared,
                          at::Tensor& edge_mass) {
  const int64_t seqs = rows.size(0), layers = rows.size(1), heads = rows.size(2);
  TORCH_CHECK(rows.dim() == 4 &&
                  squared.sizes() == at::IntArrayRef({seqs, layers, layers, heads, 2}) &&
                  edge_mass.sizes() == at::IntArrayRef({seqs, layers, 2}),
              "krul_accumulate_rows: rows ", rows.sizes(), ", squared ", squared.sizes(),
              ", edge_mass ", edge_mass.sizes());
  const at::Tensor lens = lengths.to(at::kCPU, at::kLong);
  const at::Tensor lower = at::ones({layers, layers}, rows.options().dtype(at::kBool)).tril(-1);
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t len = lens[s].item<int64_t>();
    TORCH_CHECK(len >= 1 && len <= rows.size(3), "krul_accumulate_rows: length ", len);
    const at::Tensor r = rows[s].narrow(2, 0, len).to(at::kDouble);  // [layers, heads, len]
    const at::Tensor d = r.unsqueeze(1) - r.unsqueeze(0);            // [i, j, heads, len]
    const at::Tensor sq = (d * d).sum(-1);                           // [i, j, heads]
    squared[s].select(-1, 0).add_((sq * lower.unsqueeze(-1)).to(at::kFloat));
    const int64_t e = std::max<int64_t>(1, len / 10);
    const at::Tensor pos = at::arange(len, r.options().dtype(at::kLong));
    const at::Tensor edge = ((pos < e) | (pos >= len - e)).to(at::kDouble);
    edge_mass[s].select(-1, 0).add_((r * edge).sum({1, 2}).to(at::kFloat));
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> krul_merge(const at::Tensor& a,
                                                                      const at::Tensor& b, double t,
                                                                      double retain,
                                                                      int64_t max_retained,
                                                                      int64_t group) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.dim() == 3, "krul_merge: a ", a.sizes(), ", b ",
              b.sizes());
  const int64_t n = a.size(0), heads = a.size(1), d = a.size(2);
  if (group <= 0) group = std::max<int64_t>(n, 1);
  TORCH_CHECK(n % group == 0, "krul_merge: ", n, " tokens in groups of ", group);
  const at::Tensor af = a.to(at::kFloat), bf = b.to(at::kFloat);
  const at::Tensor ma = at::linalg_vector_norm(af, 2, {-1}),
                   mb = at::linalg_vector_norm(bf, 2, {-1});
  // A zero vector has no direction: it takes the other's (its magnitude 0 restores it exactly).
  const at::Tensor ua = af / ma.clamp_min(1e-30).unsqueeze(-1);
  const at::Tensor ub = bf / mb.clamp_min(1e-30).unsqueeze(-1);
  const at::Tensor cos = (ua * ub).sum(-1).clamp(-1.0, 1.0);
  const at::Tensor omega = at::acos(cos);  // [n, heads]
  const at::Tensor sin = at::sin(omega);
  // SLERP; where the angle is ~0 (or pi), the normalized linear interpolation.
  const at::Tensor small = sin.abs() < 1e-6;
  const at::Tensor wa =
      at::where(small, at::full_like(sin, 1.0 - t), at::sin((1.0 - t) * omega) / sin);
  const at::Tensor wb = at::where(small, at::full_like(sin, t), at::sin(t * omega) / sin);
  at::Tensor e = wa.unsqueeze(-1) * ua + wb.unsqueeze(-1) * ub;
  e = e / at::linalg_vector_norm(e, 2, {-1}, true).clamp_min(1e-30);
  // Retention per group of tokens: [groups, group * heads].
  const at::Tensor dist = (omega / M_PI).reshape({n / group, group * heads});
  at::Tensor keep = at::zeros_like(dist, dist.options().dtype(at::kBool));
  if (retain > 0 && dist.numel() > 0) {
    const at::Tensor lo = std::get<0>(dist.min(1, true)), hi = std::get<0>(dist.max(1, true));
    keep = dist > lo + (1.0 - retain) * (hi - lo);
    if (max_retained >= 0 && max_retained < dist.size(1)) {
      const at::Tensor widest =
          std::get<1>(at::topk(at::where(keep, dist, at::full_like(dist, -1.0)), max_retained, 1));
      keep = keep & at::zeros_like(keep).scatter_(1, widest, true);
    }
  }
  const at::Tensor retained = keep.reshape({-1}).nonzero().reshape({-1});
  const at::Tensor originals = at::stack(
      {a.reshape({-1, d}).index_select(0, retained), b.reshape({-1, d}).index_select(0, retained)});
  return {e.to(a.scalar_type()), at::stack({ma, mb}), retained, originals};
}

at::Tensor krul_unmerge(const at::Tensor& direction, const at::Tensor& magnitude,
                        const at::Tensor& retained, const at::Tensor& originals) {
  const int64_t d = direction.size(-1);
  const at::Tensor e = direction.to(at::kFloat).unsqueeze(0);  // [1, n, heads, d]
  at::Tensor out = (magnitude.to(at::kFloat).unsqueeze(-1) * e).to(direction.scalar_type());
  if (retained.numel() > 0) {
    at::Tensor flat = out.view({2, -1, d});
    flat.index_copy_(1, retained, originals.to(direction.scalar_type()));
  }
  return out;
}

namespace {

// Each layer's role in `pairs`: deep_pair[l] is the pair whose deep layer l is (-1: none) and
// shallow[l] whether l is a pair's shallow layer (its data is stored at its deep layer's place).
struct PairRoles {
  std::vector<int64_t> deep_pair;
  std::vector<bool> shallow;
};

PairRoles pair_roles(int64_t layers, const std::vector<kv::krul::LayerPair>& pairs) {
  PairRoles roles{std::vector<int64_t>(static_cast<size_t>(layers), -1),
                  std::vector<bool>(static_cast<size_t>(layers), false)};
  for (size_t i = 0; i < pairs.size(); ++i) {
    const kv::krul::LayerPair& p = pairs[i];
    TORCH_CHECK(p.shallow >= 0 && p.shallow < p.deep && p.deep < layers, "layer pair (", p.shallow,
                ", ", p.deep, ") of ", layers, " layers");
    const auto shallow = static_cast<size_t>(p.shallow), deep = static_cast<size_t>(p.deep);
    TORCH_CHECK(roles.deep_pair[shallow] < 0 && !roles.shallow[shallow] &&
                    roles.deep_pair[deep] < 0 && !roles.shallow[deep],
                "layer pair (", p.shallow, ", ", p.deep, ") overlaps another");
    roles.deep_pair[deep] = static_cast<int64_t>(i);
    roles.shallow[shallow] = true;
  }
  return roles;
}

// Bytes of one tensor per chunk: x [n, ...] -> uint8 [n, bytes].
at::Tensor as_bytes(const at::Tensor& x) {
  return x.contiguous().view({x.size(0), -1}).view(at::kByte);
}

}  // namespace

int64_t krul_merged_chunk_bytes(const kv::krul::MergedForm& form, int64_t layers,
                                int64_t num_kv_heads, int64_t block, int64_t d,
                                int64_t element_bytes) {
  const int64_t layer = 2 * num_kv_heads * block * d * element_bytes;
  const int64_t per_tensor =
      2 * block * num_kv_heads * 4 + form.retained * 4 + 2 * form.retained * d * element_bytes;
  return (layers - form.pairs) * layer + form.pairs * 2 * per_tensor;
}

at::Tensor krul_merge_chunks(const at::Tensor& chunks, const kv::krul::MergedForm& form,
                             const std::vector<kv::krul::LayerPair>& pairs) {
  TORCH_CHECK(chunks.dim() == 6 && chunks.size(2) == 2, "krul_merge_chunks: chunks ",
              chunks.sizes());
  TORCH_CHECK(std::ssize(pairs) == form.pairs, "krul_merge_chunks: ", pairs.size(),
              " pairs for a form of ", form.pairs);
  const int64_t n = chunks.size(0), layers = chunks.size(1), heads = chunks.size(3);
  const int64_t block = chunks.size(4), d = chunks.size(5), r = form.retained;
  const PairRoles roles = pair_roles(layers, pairs);
  const auto long_opts = chunks.options().dtype(at::kLong);
  std::vector<at::Tensor> parts;
  for (int64_t l = 0; l < layers; ++l) {
    if (roles.shallow[static_cast<size_t>(l)]) continue;
    const int64_t pair = roles.deep_pair[static_cast<size_t>(l)];
    if (pair < 0) {
      parts.push_back(as_bytes(chunks.select(1, l)));
      continue;
    }
    const kv::krul::LayerPair& p = pairs[static_cast<size_t>(pair)];
    at::Tensor direction = at::empty_like(chunks.select(1, l));  // [n, 2, heads, block, d]
    std::vector<at::Tensor> side;
    for (int64_t kv = 0; kv < 2; ++kv) {
      // [n, heads, block, d] -> tokens [n * block, heads, d], retention judged per chunk.
      const auto tokens = [&](int64_t layer) {
        return chunks.select(1, layer).select(1, kv).permute({0, 2, 1, 3}).reshape({-1, heads, d});
      };
      auto [e, m, retained, originals] =
          krul_merge(tokens(p.shallow), tokens(p.deep), form.slerp_t, form.retain, r, block);
      direction.select(1, kv).copy_(e.view({n, block, heads, d}).permute({0, 2, 1, 3}));
      side.push_back(as_bytes(m.view({2, n, block, heads}).transpose(0, 1)));
      // Chunk c's retained vectors, ascending, in slots [0, count) of its r.
      const int64_t per_chunk = block * heads;
      const at::Tensor chunk = at::floor_divide(retained, per_chunk);
      const at::Tensor first =
          at::cumsum(at::bincount(chunk, {}, n), 0) - at::bincount(chunk, {}, n);
      const at::Tensor slot =
          at::arange(retained.numel(), long_opts) - first.index_select(0, chunk);
      at::Tensor index = at::full({n, r}, -1, long_opts);
      at::Tensor kept = at::zeros({n, 2, r, d}, chunks.options());
      if (retained.numel() > 0) {
        index.index_put_({chunk, slot}, retained - chunk * per_chunk);
        kept.permute({0, 2, 1, 3}).index_put_({chunk, slot}, originals.transpose(0, 1));
      }
      side.push_back(as_bytes(index.to(at::kInt)));
      side.push_back(as_bytes(kept));
    }
    parts.push_back(as_bytes(direction));
    parts.insert(parts.end(), side.begin(), side.end());
  }
  return at::cat(parts, 1);
}

at::Tensor krul_unmerge_chunks(const at::Tensor& merged, const kv::krul::MergedForm& form,
                               const std::vector<kv::krul::LayerPair>& pairs, int64_t layers,
                               int64_t num_kv_heads, int64_t block, int64_t d,
                               c10::ScalarType dtype, int64_t layer_begin, int64_t layer_end) {
  if (layer_end < 0) layer_end = layers;
  TORCH_CHECK(0 <= layer_begin && layer_begin <= layer_end && layer_end <= layers,
              "krul_unmerge_chunks: layers [", layer_begin, ", ", layer_end, ") of ", layers);
  const auto wanted = [&](int64_t l) { return layer_begin <= l && l < layer_end; };
  const int64_t n = merged.size(0), heads = num_kv_heads, r = form.retained;
  const int64_t es = static_cast<int64_t>(c10::elementSize(dtype));
  TORCH_CHECK(std::ssize(pairs) == form.pairs, "krul_unmerge_chunks: ", pairs.size(),
              " pairs for a form of ", form.pairs);
  TORCH_CHECK(merged.dim() == 2 &&
                  merged.size(1) == krul_merged_chunk_bytes(form, layers, heads, block, d, es),
              "krul_unmerge_chunks: ", merged.sizes(), " is not the merged form of ", layers,
              " layers");
  const PairRoles roles = pair_roles(layers, pairs);
  int64_t offset = 0;
  // The next `bytes` of every chunk as `type` [n, ...].
  const auto field = [&](int64_t bytes, c10::ScalarType type) {
    at::Tensor f = merged.narrow(1, offset, bytes).contiguous().view(type);
    offset += bytes;
    return f;
  };
  const int64_t layer_bytes = 2 * heads * block * d * es;
  const int64_t side_bytes = 2 * block * heads * 4 + r * 4 + 2 * r * d * es;  // per K or V
  at::Tensor out =
      at::empty({n, layer_end - layer_begin, 2, heads, block, d}, merged.options().dtype(dtype));
  for (int64_t l = 0; l < layers; ++l) {
    if (roles.shallow[static_cast<size_t>(l)]) continue;
    const int64_t pair = roles.deep_pair[static_cast<size_t>(l)];
    const kv::krul::LayerPair* p = pair < 0 ? nullptr : &pairs[static_cast<size_t>(pair)];
    if (!wanted(l) && (p == nullptr || !wanted(p->shallow))) {  // the data of layers not asked for
      offset += layer_bytes + (p == nullptr ? 0 : 2 * side_bytes);
      continue;
    }
    const at::Tensor stored = field(layer_bytes, dtype).view({n, 2, heads, block, d});
    if (p == nullptr) {
      out.select(1, l - layer_begin).copy_(stored);
      continue;
    }
    for (int64_t kv = 0; kv < 2; ++kv) {
      const at::Tensor m = field(2 * block * heads * 4, at::kFloat).view({n, 2, block, heads});
      const at::Tensor index = field(r * 4, at::kInt).to(at::kLong);  // [n, r]
      const at::Tensor kept = field(2 * r * d * es, dtype).view({n, 2, r, d});
      // As one merge of n * block tokens: chunk c's token t is token c * block + t.
      const at::Tensor valid = (index >= 0).nonzero();  // [m, 2]: chunk, slot
      const at::Tensor chunk = valid.select(1, 0), slot = valid.select(1, 1);
      const at::Tensor retained = index.index({chunk, slot}) + chunk * block * heads;
      const at::Tensor originals = kept.permute({0, 2, 1, 3}).index({chunk, slot}).transpose(0, 1);
      const at::Tensor direction =
          stored.select(1, kv).permute({0, 2, 1, 3}).reshape({n * block, heads, d});
      const at::Tensor both =
          krul_unmerge(direction, m.transpose(0, 1).reshape({2, n * block, heads}),
                       retained.view({-1}), originals.reshape({2, -1, d}));
      const at::Tensor layers_kv = both.view({2, n, block, heads, d}).permute({0, 1, 3, 2, 4});
      if (wanted(p->shallow)) {
        out.select(1, p->shallow - layer_begin).select(1, kv).copy_(layers_kv[0]);
      }
      if (wanted(p->deep)) out.select(1, p->deep - layer_begin).select(1, kv).copy_(layers_kv[1]);
    }
  }
  return out;
}

at::Tensor h2o_keep_chunks(const at::Tensor& chunks, const at::Tensor& mass, int64_t kept) {
  TORCH_CHECK(chunks.dim() == 6 && chunks.size(2) == 2, "h2o_keep_chunks: chunks ", chunks.sizes());
  const int64_t n = chunks.size(0), layers = chunks.size(1), heads = chunks.size(3);
  const int64_t block = chunks.size(4), d = chunks.size(5);
  TORCH_CHECK(kept >= 1 && kept <= n, "h2o_keep_chunks: ", kept, " of ", n, " chunks");
  TORCH_CHECK(mass.dim() == 3 && mass.size(1) == layers && mass.size(2) == heads,
              "h2o_keep_chunks: mass ", mass.sizes(), " for ", layers, " layers, ", heads,
              " KV heads");
  const int64_t total = n * block, keep = kept * block, recent = keep / 2;
  // [layers, heads, total]: each (layer, head)'s received attention, 0 where none was observed.
  at::Tensor score = at::zeros({total, layers, heads}, mass.options().dtype(at::kFloat));
  const int64_t observed = std::min(total, mass.size(0));
  score.narrow(0, 0, observed).copy_(mass.narrow(0, 0, observed));
  score = score.permute({1, 2, 0});
  const at::Tensor heavy =
      std::get<1>(at::topk(score.narrow(2, 0, total - recent), keep - recent, /*dim=*/2));
  const at::Tensor window =
      at::arange(total - recent, total, heavy.options()).expand({layers, heads, recent});
  const at::Tensor index = std::get<0>(at::sort(at::cat({heavy, window}, 2), 2));  // [L, H, keep]
  // [layers, 2, heads, total, d]: the tokens of every chunk in order.
  const at::Tensor tokens =
      chunks.permute({1, 2, 3, 0, 4, 5}).reshape({layers, 2, heads, total, d});
  const at::Tensor picked = tokens.gather(
      3, index.to(chunks.device()).unsqueeze(1).unsqueeze(4).expand({layers, 2, heads, keep, d}));
  return picked.view({layers, 2, heads, kept, block, d}).permute({3, 0, 1, 2, 4, 5}).contiguous();
}

}  // namespace strata::kernels::aten
