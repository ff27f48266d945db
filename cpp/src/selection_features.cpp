#include "ckfmha/runtime/selection_features.hpp"

#include <algorithm>
#include <cmath>
#include <string_view>

namespace ckfmha::runtime {

namespace {
// The mean length of a group-mode problem's sequences, or the longest when the
// token count is not given (or in batch mode).
double mean_length(ckfmha_mode mode, int64_t total, int64_t batch, int64_t longest) {
  if (mode != CKFMHA_MODE_GROUP || total <= 0 || batch <= 0) return double(longest);
  return std::min(double(total) / double(batch), double(longest));
}
}  // namespace

CostShape cost_shape(ckfmha_fwd_problem const& p) {
  return {p.batch, p.nhead_q, p.nhead_k, p.seqlen_q, p.seqlen_k,
          p.hdim_q, p.hdim_v, p.mask != CKFMHA_MASK_NONE,
          mean_length(p.mode, p.total_q, p.batch, p.seqlen_q),
          mean_length(p.mode, p.total_k, p.batch, p.seqlen_k)};
}

CostShape cost_shape(ckfmha_bwd_problem const& p) {
  return {p.batch, p.nhead_q, p.nhead_k, p.seqlen_q, p.seqlen_k,
          p.hdim_q, p.hdim_v, p.mask != CKFMHA_MASK_NONE,
          double(p.seqlen_q), double(p.seqlen_k)};
}

Features candidate_features(CostShape const& s, ckfmha_kernel_entry const& k, int num_splits,
                            int num_sms) {
  const bool split = k.family == CKFMHA_FAMILY_FWD_SPLITKV;
  const double splits = split ? std::max(num_splits, 1) : 0.0;
  const double group = double(s.nhead_q) / double(std::max<int64_t>(s.nhead_k, 1));
  // Split kernels pack a K/V head's query heads into one tile's rows.
  const double rows = split ? double(s.seqlen_q) * group : double(s.seqlen_q);
  const double heads = split ? double(s.nhead_k) : double(s.nhead_q);
  const double tile_m = std::max(k.tile_m, 1), tile_n = std::max(k.tile_n, 1);
  const double query_tiles = std::ceil(rows / tile_m);
  const double ctas = query_tiles * heads * double(s.batch) * std::max(splits, 1.0);
  const double key_tiles =
      std::ceil(std::ceil(double(s.seqlen_k) / tile_n) / std::max(splits, 1.0));
  const double work = double(s.batch) * double(s.nhead_q) * s.mean_seqlen_q * s.mean_seqlen_k *
                      double(s.hdim_q + s.hdim_v) * (s.masked ? 0.5 : 1.0);
  Features f{};
  int i = 0;
  f[i++] = std::log2(double(s.batch));
  f[i++] = double(s.nhead_q);
  f[i++] = group;
  f[i++] = std::log2(double(s.seqlen_q));
  f[i++] = std::log2(double(s.seqlen_k));
  f[i++] = double(s.hdim_q);
  f[i++] = double(s.hdim_v);
  f[i++] = s.masked ? 1.0 : 0.0;
  f[i++] = std::string_view(k.pipeline ? k.pipeline : "") == "sm90_tma_wgmma" ? 1.0 : 0.0;
  f[i++] = split ? 1.0 : 0.0;
  f[i++] = splits;
  f[i++] = tile_m;
  f[i++] = tile_n;
  f[i++] = double(k.warps);
  f[i++] = double(k.stages);
  f[i++] = std::log2(ctas);
  f[i++] = ctas / double(std::max(num_sms, 1));
  f[i++] = std::log2(key_tiles);
  f[i++] = (query_tiles * tile_m - rows) / (query_tiles * tile_m);
  f[i++] = std::log2(work);
  // How full the grid sized by the longest sequence is: 1 in batch mode.
  f[i++] = s.mean_seqlen_q / double(std::max<int64_t>(s.seqlen_q, 1));
  return f;
}

}  // namespace ckfmha::runtime
