#include "ckfmha/runtime/split_choice.hpp"

#include "ckfmha/runtime/dispatcher.hpp"
#include "ckfmha/runtime/fwd_select.hpp"
#include "ckfmha/runtime/occupancy.hpp"

#include <algorithm>
#include <tuple>

namespace ckfmha::runtime {

namespace {

// Automatic split count, a wave model: S splits of `ctas` query-tile CTAs
// take about
//   ceil(ctas * S / slots) waves x (ceil(key_tiles / S) + 1) tile times,
// `slots` being the CTAs resident on the GPU at once and the +1 a CTA's
// prologue and partial write. The smallest S minimising that wins, never with
// fewer than kMinKeyTilesPerSplit key tiles per split (shorter splits cost
// more in partial traffic than they win) nor more than kAutoMaxSplits (the
// combine reads every split's LSE per row). fp16/bf16 grids of
// kUnsplitMinCtasPerSm or more a SM are not split at all.

// fp8 K/V CTAs pay more before their first tile (the query rescale, the
// tiles requested ahead), so their splits keep at least 64 keys, whatever the
// tile: 4 tiles of 16 keys, 2 of 32, 1 of 64. At b1-b4 (H100, 4k-32k keys,
// splits forced) the 32- and 64-key tiles ran fastest at 64 keys a split
// (b1 h32/4 4k: 16x32 d128 10.8 us at 64 splits against 13.1 at 32, 16x64
// d64 8.0 against 9.5), and 32 keys a split cost up to 1.33x (16x16 tile,
// b4 h32/4 4k d128 and b1 h32/32 4k d64, 128 splits against 64).
constexpr int64_t kMinFp8KeysPerSplit = 64;

// fp16/bf16 K/V: a grid of at least this many CTAs per SM runs unsplit. The
// split body is bound by bandwidth there, and splits add partial traffic and
// a combine pass (H100, d128, one split against the wave model's: b64 h32/4
// 1k keys, 256 CTAs, 48.1 us against 55.8 for 3 splits, cuDNN 48.1; b64
// h32/32 1k, 2048 CTAs, 342 against 352 for 2; NOTES 103). Below one CTA a
// SM the CTAs wait on their own loads, and splits pay (b16 h32/8 4k, 128
// CTAs: NOTES 41).
constexpr int64_t kUnsplitMinCtasPerSm = 1;

// CTAs of one split of `k`'s grid.
int64_t unsplit_ctas(ckfmha_fwd_problem const& p, ckfmha_kernel_entry const& k) {
  return ceil_div(packed_rows(p), k.tile_m) * p.nhead_k * p.batch;
}

// Whether `k`'s unsplit grid has at least kUnsplitMinCtasPerSm CTAs per SM,
// and so runs as one split (fp16/bf16 K/V).
bool fills_sms_unsplit(ckfmha_fwd_problem const& p, ckfmha_kernel_entry const& k,
                       PlanContext const& context) {
  return unsplit_ctas(p, k) >= kUnsplitMinCtasPerSm * std::max(context.num_sms, 1);
}

// Whether `k`'s unsplit grid also fits one wave of resident CTAs: the tile
// preference of find_split_kernel (one wave of a tile with less in flight per
// CTA beat two of the deeper one: b64 h32/8 1k d128, 512 CTAs, 16x32 89.1 us
// against 16x64 92.9).
bool runs_unsplit(ckfmha_fwd_problem const& p, ckfmha_kernel_entry const& k,
                  PlanContext const& context) {
  const int64_t sms = std::max(context.num_sms, 1);
  return fills_sms_unsplit(p, k, context) &&
         unsplit_ctas(p, k) <= sms * resident_ctas_per_sm(k, context);
}

// The most splits the wave model tries: each split keeps kMinKeyTilesPerSplit
// key tiles (kMinFp8KeysPerSplit keys for fp8 K/V) and the combine reads at
// most kAutoMaxSplits partials a row.
int64_t max_auto_splits(ckfmha_fwd_problem const& p, ckfmha_kernel_entry const& k) {
  const int64_t splits = k.kv_quant == CKFMHA_KV_QUANT_NONE
                             ? ceil_div(p.seqlen_k, k.tile_n) / kMinKeyTilesPerSplit
                             : p.seqlen_k / std::max<int64_t>(kMinFp8KeysPerSplit, k.tile_n);
  return std::clamp<int64_t>(splits, 1, kAutoMaxSplits);
}

// The occupancy calculator's resident CTAs of `k` on the live device, or 0
// (no live device of the plan's arch, or no query in the entry).
int measured_resident_ctas(ckfmha_kernel_entry const& k, PlanContext const& context) {
  if (!context.live_device || !arch_runs_on(k, context.device_arch)) return 0;
  return occupancy_resident_ctas(k);
}

// fp8 K/V is widened in shared memory by the CTA's own threads (one warp on
// the 16-row tiles), and that work, not the loads, sets the pace: the more
// CTAs at work at once, the faster, up to the resident slots. So fp8 tiles
// rank by the CTAs `k` keeps at work in one wave: its grid times the largest
// split count that still fits one wave (or the caller's count), at most every
// slot. Ties go to the longer key tile, which costs less work per key, then
// to the deeper loads (more byte stages): a grid too small to fill either
// tile's slots waits on each CTA's own loads. H100, fp8 over bf16 K/V tokens
// per second (NOTES 101): at d128, 16x16 with two byte stages (10 slots a SM)
// reads 1.87-1.91x at b16-b64 h32/8-h32/32 8k-32k where 16x16 with four (7
// slots) reads 1.71-1.78x and 16x32 (4 slots) 1.53-1.59x; at d64 the 16x16
// tiles read 1.75-1.94x where 16x64 reads 1.60-1.66x. At b1 h32/4 4k d64 (4
// CTAs of 64 splits) four byte stages read 0.82x against two's 0.73x.
int64_t fp8_busy_ctas(ckfmha_fwd_problem const& p, ckfmha_kernel_entry const& k,
                      PlanContext const& context) {
  const int64_t slots = int64_t(std::max(context.num_sms, 1)) * resident_ctas_per_sm(k, context);
  const int64_t ctas = unsplit_ctas(p, k);
  const int64_t fits_one_wave = slots / std::max<int64_t>(ctas, 1);
  const int64_t splits = p.num_splits > 0
                             ? int64_t(p.num_splits)
                             : std::clamp<int64_t>(fits_one_wave, 1, max_auto_splits(p, k));
  return std::min(ctas * splits, slots);
}

}  // namespace

// Among the fitting split kernels: SASS for this exact arch, then the smallest
// tile_m holding the packed rows (else the largest tile), then the narrowest
// mask kind, then generator order (the arch's first tile, the most bytes in
// flight per CTA). With the split count left to the planner, one exception:
// when that tile does not run the grid unsplit (runs_unsplit) but another
// tile of the same rows does (more CTAs resident per SM), the other tile runs
// it as one split, writing O directly with no combine. Smaller grids keep
// the first tile's deeper loads. fp8 K/V ranks its tiles otherwise: see
// fp8_busy_ctas.
// `family`: fwd_splitkv, or a paged family (same body, same preference).
bool find_split_kernel(std::vector<ckfmha_kernel_entry> const& kernels,
                       ckfmha_fwd_problem const& p, PlanContext const& context,
                       ckfmha_kernel_entry* out, ckfmha_family family) {
  const int device_arch = context.device_arch;
  const int64_t rows = packed_rows(p);
  const bool widened = p.kv_quant != CKFMHA_KV_QUANT_NONE;
  bool found = false;
  std::tuple<int, int, int64_t, int, int, int64_t, int> best{};
  for (auto const& k : kernels) {
    if (!same_shape(k, p, family) || !reject_reason(k, p, device_arch, family).empty()) {
      continue;
    }
    int64_t tile_fit = k.tile_m >= rows ? -int64_t(k.tile_m) : int64_t(k.tile_m) - (1 << 20);
    std::tuple<int, int, int64_t, int, int, int64_t, int> score{
        k.arch == device_arch, widened && k.tile_m >= rows,
        widened ? fp8_busy_ctas(p, k, context) : 0, widened ? k.tile_n : 0,
        widened ? k.stages : 0, tile_fit, mask_kind_preferred(k.mask, p.mask)};
    if (!found || score > best) {
      found = true;
      best = score;
      *out = k;
    }
  }
  if (!found || p.num_splits != 0 || widened) return found;
  // Another tile of the chosen one's rows that runs the grid unsplit.
  const ckfmha_kernel_entry chosen = *out;
  auto runs_it_unsplit = [&](ckfmha_kernel_entry const& k) {
    return k.family == chosen.family && k.arch == chosen.arch && k.mask == chosen.mask &&
           k.tile_m == chosen.tile_m && runs_unsplit(p, k, context) &&
           same_shape(k, p, family) && reject_reason(k, p, device_arch, family).empty();
  };
  if (runs_unsplit(p, chosen, context)) return true;
  for (auto const& k : kernels) {
    if (runs_it_unsplit(k)) {
      *out = k;
      break;
    }
  }
  return true;
}

int estimated_resident_ctas_per_sm(ckfmha_kernel_entry const& k, int device_arch) {
  // Shared memory per SM and resident threads per SM of each arch.
  const int64_t smem_per_sm = device_arch >= 90                       ? 228 * 1024
                              : device_arch == 80 || device_arch == 87 ? 164 * 1024
                                                                       : 100 * 1024;
  const int64_t threads_per_sm = device_arch == 86 || device_arch == 89 ? 1536 : 2048;
  const int64_t threads = int64_t(k.warps) * 32;
  const int64_t elem = 2;  // split-KV runs fp16/bf16
  // As the sm80 template lays it out: Q (O staged over it) and the K/V stages,
  // plus the 1 KiB the hardware reserves per CTA. fp8 K/V keeps twice the
  // stages of bytes, widened into one tile of K and V in elements.
  const int64_t kv_row = int64_t(k.tile_n) * (k.hdim_q + k.hdim_v);
  const int64_t kv_bytes = k.kv_quant == CKFMHA_KV_QUANT_NONE
                               ? elem * k.stages * kv_row
                               : 2 * int64_t(k.stages) * kv_row + elem * kv_row;
  const int64_t smem =
      elem * int64_t(k.tile_m) * std::max(k.hdim_q, k.hdim_v) + kv_bytes + 1024;
  const int64_t by_registers = 65536 / (threads * 256);
  int64_t resident = std::min({smem_per_sm / smem, threads_per_sm / threads, by_registers});
  return int(std::max<int64_t>(resident, 1));
}

int resident_ctas_per_sm(ckfmha_kernel_entry const& k, PlanContext const& context) {
  const int measured = measured_resident_ctas(k, context);
  return measured > 0 ? measured : estimated_resident_ctas_per_sm(k, context.device_arch);
}

int heuristic_num_splits(ckfmha_fwd_problem const& p, ckfmha_kernel_entry const& split,
                         PlanContext const& context) {
  // The tile-count model below does not see bandwidth: for a grid of a CTA
  // or more per SM it would trade waves for shorter ones, where the bytes set
  // the time. fp8 K/V is paced by its CTAs' own work instead
  // (fp8_busy_ctas): its splits fill the free slots of a wave too.
  if (split.kv_quant == CKFMHA_KV_QUANT_NONE && fills_sms_unsplit(p, split, context)) return 1;
  const int64_t ctas = unsplit_ctas(p, split);
  const int64_t slots = int64_t(std::max(context.num_sms, 1)) * resident_ctas_per_sm(split, context);
  const int64_t key_tiles = ceil_div(p.seqlen_k, split.tile_n);
  const int64_t max_splits = max_auto_splits(p, split);
  int64_t best = 1, best_time = INT64_MAX;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t time = ceil_div(ctas * s, slots) * (ceil_div(key_tiles, s) + 1);
    if (time < best_time) {
      best = s;
      best_time = time;
    }
  }
  return int(best);
}

std::string resident_ctas_text(ckfmha_kernel_entry const& k, PlanContext const& context) {
  const bool measured = measured_resident_ctas(k, context) > 0;
  return std::to_string(resident_ctas_per_sm(k, context)) + " resident CTAs per SM (" +
         (measured ? "occupancy of the compiled kernel" : "estimated at 256 registers a thread") +
         ")";
}

}  // namespace ckfmha::runtime
