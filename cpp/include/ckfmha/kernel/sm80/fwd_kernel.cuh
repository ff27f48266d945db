// Forward attention on the sm80 tensor-core path (cp.async + ldmatrix +
// mma.sync), one CTA per (query tile, head, batch or sequence).
//
// Per key tile, with K and V each single-buffered in shared memory (Stages 1):
//   wait K -> start loading V -> S = Q K^T -> logit transforms, mask -> wait V
//   -> start loading the next K -> online softmax -> dropout -> O += P V
// so each load runs under a GEMM or the softmax. With two stages:
//   wait K, V -> start loading the next K and V into the other stage -> S, mask,
//   softmax, dropout, O += P V
// so a tile's loads have the whole previous tile to land. Key tiles are visited from
// the last to the first: the ragged end of the sequence and the causal
// diagonal, the tiles needing a mask, come first.
//
// With Traits::kSplitKv the same body is the fwd_splitkv kernel: a CTA per
// (query tile, split, K/V head, batch), GQA heads packed into the tile rows,
// keys limited to the split's range and fp32 partials written to the
// workspace instead of O and LSE, or O and LSE themselves when there is one
// split (common/splitkv_rows.cuh). With Traits::kPagedKv as
// well it is fwd_pagedkv (batch mode) or batch_prefill (group mode queries):
// key tiles are gathered through a page table (common/paged_kv.cuh); kVColMajor then
// means vLLM's "vectorized" pages, V loaded as V^T. With Traits::kKvFp8 the
// split body reads e4m3 K/V (common/fp8_kv.cuh): byte tiles in 2 x Stages
// stages, each widened into one fp16 K and V tile for fp16 products (bf16
// queries rescaled into fp16 once per CTA), the K scale folded into the
// softmax scale and the V scale into the output's normalisation.
#pragma once

#include "ckfmha/kernel/common/attention_mask.cuh"
#include "ckfmha/kernel/common/fp8_kv.cuh"
#include "ckfmha/kernel/common/fragment_layout.cuh"
#include "ckfmha/kernel/common/gemm_pieces.cuh"
#include "ckfmha/kernel/common/logit_transform.cuh"
#include "ckfmha/kernel/common/online_softmax.cuh"
#include "ckfmha/kernel/common/paged_kv.cuh"
#include "ckfmha/kernel/common/philox_dropout.cuh"
#include "ckfmha/kernel/common/sequence_slice.cuh"
#include "ckfmha/kernel/common/splitkv_rows.cuh"
#include "ckfmha/kernel/common/tile_copy.cuh"
#include "ckfmha/kernel/params/fwd_params.h"

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>

namespace ckfmha::kernel {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinCtasPerSm)
    fwd_sm80_kernel(__grid_constant__ const FwdParams p) {
  using namespace cute;
  using Element = typename Traits::Element;
  using MmaElement = typename Traits::MmaElement;  // Element, or fp16 for fp8 K/V
  using TileQ = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimQK>>;
  using TileO = Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimV>>;
  using TileK = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimQK>>;
  using TileV = Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>;
  using TileS = Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr bool kGroup = Traits::kIsGroupMode;
  using Transform = LogitTransform<Element, Traits::kBias, Traits::kHasSoftcap>;

  constexpr bool kSplit = Traits::kSplitKv;
  constexpr bool kPaged = Traits::kPagedKv;
  constexpr bool kFp8 = Traits::kKvFp8;
  const int tid = threadIdx.x;
  // Split-KV: blockIdx.y is a K/V head (its query heads are packed into the
  // rows) and blockIdx.x = split * query tiles + query tile.
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int m_blocks = kSplit ? int(gridDim.x) / p.num_splits : int(gridDim.x);
  const int split = kSplit ? int(blockIdx.x) / m_blocks : 0;
  // Under a causal mask later query tiles see more keys: launching them first
  // leaves the short tiles to fill the tail of the grid.
  const int m_block = kSplit ? int(blockIdx.x) % m_blocks
                      : Traits::kMask == MaskMode::kCausal ? m_blocks - 1 - int(blockIdx.x)
                                                           : int(blockIdx.x);
  const int m_begin = m_block * kBlockM;
  PagedKeys keys{};
  const SequenceSlice seq = [&] {
    if constexpr (kPaged) {
      return locate_paged_sequence<kGroup>(p, batch, &keys);
    } else {
      return locate_sequence<kGroup>(p, batch);
    }
  }();
  const int group = kSplit ? p.head_group : 1;
  const PackedRows rows{m_begin, group, head * group};
  // Group mode sizes the grid for the longest sequence; skipped sequences
  // keep whatever their outputs held.
  if (seq.skip || m_begin >= seq.seqlen_q * group) return;

  const int head_k = kSplit ? head : head / p.head_group;
  const int64_t q_origin = kGroup ? seq.q_token0 * p.q_row_stride : batch * p.q_batch_stride;
  const int64_t o_origin = kGroup ? seq.q_token0 * p.o_row_stride : batch * p.o_batch_stride;
  // Paged caches are addressed per key row from the page table, from head 0.
  const int64_t k_origin = kPaged   ? 0
                           : kGroup ? seq.k_token0 * p.k_row_stride
                                    : batch * p.k_batch_stride;
  // Column-major V keeps tokens contiguous: its token stride is 1.
  const int64_t v_token_stride = Traits::kVColMajor ? 1 : p.v_row_stride;
  const int64_t v_origin = kPaged   ? 0
                           : kGroup ? seq.k_token0 * v_token_stride
                                    : batch * p.v_batch_stride;

  auto const* q_seq = static_cast<Element const*>(p.q) + q_origin;
  auto const* q_base = q_seq + head * p.q_head_stride + m_begin * p.q_row_stride;
  auto const* k_base = static_cast<Element const*>(p.k) + k_origin + head_k * p.k_head_stride;
  auto const* v_base = static_cast<Element const*>(p.v) + v_origin + head_k * p.v_head_stride;
  auto* o_base = static_cast<Element*>(p.o) + o_origin + head * p.o_head_stride +
                 m_begin * p.o_row_stride;
  // fp8 K/V: the same rows, one byte per element.
  auto const* k_bytes = static_cast<uint8_t const*>(p.k) + k_origin + head_k * p.k_head_stride;
  auto const* v_bytes = static_cast<uint8_t const*>(p.v) + v_origin + head_k * p.v_head_stride;

  Tensor gQ = make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(p.q_row_stride, _1{}));
  Tensor gO = make_tensor(make_gmem_ptr(o_base), TileO{}, make_stride(p.o_row_stride, _1{}));
  auto key_tile = [](Element const* base, int64_t row_stride, auto tile_shape) {
    return make_tensor(make_gmem_ptr(base), tile_shape, make_stride(row_stride, _1{}));
  };
  // A thread's slice of key tile n: its slice of tile 0 moved n tiles down, so
  // the per-row address arithmetic is done once, not once per tile.
  auto key_tile_slice = [](auto const& tile0_slice, int64_t row_stride, int n_block) {
    return make_tensor(tile0_slice.data() + int64_t(n_block) * kBlockN * row_stride,
                       tile0_slice.layout());
  };

  extern __shared__ __align__(128) char smem_bytes[];
  auto* smem = reinterpret_cast<Element*>(smem_bytes);
  Tensor sQ = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQ{});
  Tensor sO = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutO{});
  // Q as the products read it: in place, converted first where the types differ.
  Tensor sQ_mma = make_tensor(make_smem_ptr(reinterpret_cast<MmaElement*>(smem_bytes)),
                              typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(
      make_smem_ptr(reinterpret_cast<MmaElement*>(smem_bytes + Traits::kSmemQOBytes)),
      typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(sK.data() + Traits::kElementKvStages * Traits::kSmemKElems,
                          typename Traits::SmemLayoutV{});
  // fp8 K/V byte stages, after the element tiles: K then V in each.
  uint8_t* fp8_stages = reinterpret_cast<uint8_t*>(
      smem_bytes + Traits::kSmemQOBytes +
      Traits::kElementKvStages * (Traits::kSmemKElems + Traits::kSmemVElems) *
          int(sizeof(MmaElement)));
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
  using TileVt = Shape<Int<Traits::kHeadDimV>, Int<kBlockN>>;

  // ---- global -> shared
  typename Traits::RowsQK::Load qk_load;
  typename Traits::RowsV::Load v_load;
  auto qk_load_thr = qk_load.get_thread_slice(tid);
  auto v_load_thr = v_load.get_thread_slice(tid);
  Tensor tQsQ = qk_load_thr.partition_D(sQ);
  Tensor tKsK = qk_load_thr.partition_D(sK);
  Tensor tVsV = v_load_thr.partition_D(sV);
  Tensor tQcQ = qk_load_thr.partition_S(make_identity_tensor(TileQ{}));
  Tensor tKcK = qk_load_thr.partition_S(make_identity_tensor(TileK{}));
  Tensor tVcV = v_load_thr.partition_S(make_identity_tensor(TileV{}));
  constexpr int kKElems = Traits::kSmemKElems;
  constexpr int kVElems = Traits::kSmemVElems;
  Tensor tKgK0 = qk_load_thr.partition_S(key_tile(k_base, p.k_row_stride, TileK{}));
  Tensor tVgV0 = v_load_thr.partition_S(key_tile(v_base, p.v_row_stride, TileV{}));
  // Ragged: the tile may reach past seqlen_k, so rows are predicated. Only the
  // last key tile can, and it is the first one visited: every load issued
  // inside the main loop is for a whole tile and skips the predicates.
  auto load_k = [&](int n_block, int stage, auto ragged) {
    Tensor src = key_tile_slice(tKgK0, p.k_row_stride, n_block);
    Tensor dst = in_stage(tKsK, stage, kKElems);
    if constexpr (decltype(ragged)::value) {
      load_rows(qk_load, src, dst, tKcK, seq.seqlen_k - n_block * kBlockN);
    } else {
      copy(qk_load, src, dst);
    }
  };
  typename Traits::RowsVt::Load vt_load;
  auto vt_load_thr = vt_load.get_thread_slice(tid);
  // Column-major V tiles start at multiples of kBlockN keys and each thread's
  // vectors at multiples of the vector width, so one check of this CTA's base
  // and the head-dim stride says whether every cp.async source is 16-byte
  // aligned (a sequence start, a view or an odd stride can break it).
  constexpr int kVtVec = Traits::RowsVt::kVecElems;
  const bool v_vectors_aligned = Traits::kVColMajor &&
                                 reinterpret_cast<uintptr_t>(v_base) % 16 == 0 &&
                                 p.v_row_stride % kVtVec == 0;
  auto load_v = [&](int n_block, int stage, auto ragged) {
    if constexpr (Traits::kVColMajor) {
      // Rows are head-dim channels (v_row_stride is then the head-dim
      // stride); this tile's keys start n_block * kBlockN columns in.
      Tensor gVt = make_tensor(make_gmem_ptr(v_base + int64_t(n_block) * kBlockN), TileVt{},
                               make_stride(p.v_row_stride, _1{}));
      Tensor tVtsVt = in_stage(vt_load_thr.partition_D(sVt), stage, kVElems);
      load_cols(vt_load, vt_load_thr.partition_S(gVt), tVtsVt,
                vt_load_thr.partition_S(make_identity_tensor(TileVt{})),
                seq.seqlen_k - n_block * kBlockN, v_vectors_aligned);
    } else {
      Tensor dst = in_stage(tVsV, stage, kVElems);
      Tensor src = key_tile_slice(tVgV0, p.v_row_stride, n_block);
      if constexpr (decltype(ragged)::value) {
        load_rows(v_load, src, dst, tVcV, seq.seqlen_k - n_block * kBlockN);
      } else {
        copy(v_load, src, dst);
      }
    }
  };

  // fp8 K/V: one key tile's byte rows into a byte stage. Rows past the
  // sequence (ragged tiles), or on pages outside the pool, are zero-filled and
  // their addresses clamped, as in load_paged_kv.
  auto load_fp8_kv = [&](int n_block, int stage, auto ragged) __attribute__((always_inline)) {
    constexpr bool kRagged = decltype(ragged)::value;
    uint8_t* k_stage = fp8_stages + stage * Traits::kFp8StageBytes;
    uint8_t* v_stage = k_stage + kBlockN * Traits::kHeadDimQK;
    const int n_begin = n_block * kBlockN;
    auto row_source = [&](int row) __attribute__((always_inline)) {
      const int token = n_begin + row;
      const bool in_seq = !kRagged || token < seq.seqlen_k;
      if constexpr (kPaged) {
        const int32_t id = in_seq ? keys.page_id(token) : 0;
        const bool read = in_seq && page_in_pool(id, p);
        if (in_seq && !read) report_device_error(p.errors, &DeviceErrors::page_id, keys.batch);
        const int64_t page =
            min(static_cast<uint32_t>(id), static_cast<uint32_t>(p.num_pages) - 1u);
        const int64_t slot = keys.slot(token);
        return cute::make_tuple(k_bytes + page * p.k_batch_stride + slot * p.k_row_stride,
                                v_bytes + page * p.v_batch_stride + slot * p.v_row_stride, read);
      } else {
        const int64_t clamped = in_seq ? token : 0;
        return cute::make_tuple(k_bytes + clamped * p.k_row_stride,
                                v_bytes + clamped * p.v_row_stride, in_seq);
      }
    };
    load_fp8_kv_tiles<Traits::kThreads, kBlockN, Traits::kHeadDimQK, Traits::kHeadDimV>(
        k_stage, v_stage, row_source, tid);
  };
  // Widens the byte stage of a landed tile into the element K and V tiles
  // (one element tile each: the plans' offsets hold for every key tile).
  using WidenK = Fp8WidenPlan<Traits::kThreads, kBlockN, Traits::kHeadDimQK>;
  using WidenV = Fp8WidenPlan<Traits::kThreads, kBlockN, Traits::kHeadDimV>;
  using WidenPlans = std::conditional_t<kFp8, cute::tuple<WidenK, WidenV>, cute::tuple<>>;
  const WidenPlans widen_plans = [&]() {
    if constexpr (kFp8) {
      return WidenPlans{WidenK(sK, tid), WidenV(sV, tid)};
    } else {
      return WidenPlans{};
    }
  }();
  auto widen_fp8_kv = [&](int stage) __attribute__((always_inline)) {
    if constexpr (kFp8) {
      const uint32_t k_stage = cute::cast_smem_ptr_to_uint(fp8_stages) +
                               uint32_t(stage * Traits::kFp8StageBytes);
      const uint32_t v_stage = k_stage + uint32_t(kBlockN * Traits::kHeadDimQK);
      widen_fp8_tile(k_stage, cute::cast_smem_ptr_to_uint(&sK(0, 0)), cute::get<0>(widen_plans));
      widen_fp8_tile(v_stage, cute::cast_smem_ptr_to_uint(&sV(0, 0)), cute::get<1>(widen_plans));
    }
  };

  // K and V of one key tile into one stage (double-buffered pipelines).
  // Forced inline (so is process_tile): a call left out of line keeps every
  // local it captures in stack memory.
  auto load_kv = [&](int n_block, int stage, auto ragged) __attribute__((always_inline)) {
    if constexpr (kFp8) {
      load_fp8_kv(n_block, stage, ragged);
    } else if constexpr (kPaged && Traits::kVColMajor) {
      Tensor k_dst = in_stage(tKsK, stage, kKElems);
      Tensor vt_dst = in_stage(vt_load_thr.partition_D(sVt), stage, kVElems);
      load_vectorized_paged_kv<decltype(ragged)::value>(
          k_dst, tKcK, vt_dst, vt_load_thr.partition_S(make_identity_tensor(TileVt{})), keys,
          k_base, v_base, p, n_block * kBlockN, seq.seqlen_k);
    } else if constexpr (kPaged) {
      Tensor k_dst = in_stage(tKsK, stage, kKElems);
      Tensor v_dst = in_stage(tVsV, stage, kVElems);
      load_paged_kv<decltype(ragged)::value>(k_dst, v_dst, tKcK, keys, k_base, v_base, p,
                                             n_block * kBlockN, seq.seqlen_k);
    } else {
      load_k(n_block, stage, ragged);
      load_v(n_block, stage, ragged);
    }
  };

  // ---- shared -> registers and the MMAs
  typename Traits::TiledMma tiled_mma;
  auto mma_thr = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = mma_thr.partition_fragment_A(sQ_mma);
  Tensor tSrK = mma_thr.partition_fragment_B(sK);
  Tensor tOrVt = mma_thr.partition_fragment_B(sVt);
  Tensor acc_o = partition_fragment_C(tiled_mma, TileO{});

  auto q_s2r = make_tiled_copy_A(typename Traits::SmemLoadAtom{}, tiled_mma);
  auto q_s2r_thr = q_s2r.get_thread_slice(tid);
  Tensor tSsQ = q_s2r_thr.partition_S(sQ_mma);
  Tensor tSrQ_view = q_s2r_thr.retile_D(tSrQ);
  auto k_s2r = make_tiled_copy_B(typename Traits::SmemLoadAtom{}, tiled_mma);
  auto k_s2r_thr = k_s2r.get_thread_slice(tid);
  Tensor tSsK = k_s2r_thr.partition_S(sK);
  Tensor tSrK_view = k_s2r_thr.retile_D(tSrK);
  auto v_s2r = make_tiled_copy_B(typename Traits::SmemLoadAtomVt{}, tiled_mma);
  auto v_s2r_thr = v_s2r.get_thread_slice(tid);
  Tensor tOsVt = v_s2r_thr.partition_S(sVt);
  Tensor tOrVt_view = v_s2r_thr.retile_D(tOrVt);

  Tensor cS = mma_thr.partition_C(make_identity_tensor(TileS{}));
  Tensor cS_rows_cols = make_tensor(cS.data(), accum_as_rows_cols(cS.layout()));
  Tensor out = make_tensor(acc_o.data(), accum_as_rows_cols(acc_o.layout()));
  constexpr int kRows = decltype(size<0>(out))::value;

  // ---- per-sequence features
  const auto mask = AttentionMask<Traits::kMask>::for_sequence(p, seq.seqlen_q, seq.seqlen_k);
  const Transform transform =
      Transform::for_sequence(p, seq.seqlen_q, seq.seqlen_k, batch, head);
  PhiloxDropout dropout{};
  if constexpr (Traits::kHasDropout) {
    dropout = PhiloxDropout::for_sequence(p, seq.seqlen_q, seq.seqlen_k, batch, head);
  }
  // fp8 K/V: the dequantisation scales of this K/V head.
  float k_descale = 1.f, v_descale = 1.f;
  if constexpr (kFp8) {
    k_descale = kv_scale(p.k_scale_ptr, p.k_scale, p.kv_scale_per_head, head_k);
    v_descale = kv_scale(p.v_scale_ptr, p.v_scale, p.kv_scale_per_head, head_k);
  }

  // Query positions the tile's rows cover: mask bounds per tile use these.
  const int q_first = kSplit ? rows.first_query() : m_begin;
  // (Packed tiles past the last query hold padding rows: leave them out.)
  const int q_count = kSplit ? min(rows.query_count(kBlockM), seq.seqlen_q - q_first) : kBlockM;
  int n_first, n_last;
  mask.key_block_range(q_first, q_count, kBlockN, &n_first, &n_last);
  if constexpr (kSplit) {
    clip_to_split(split, p.num_splits, seq.seqlen_k, kBlockN, &n_first, &n_last);
    load_packed_rows(tQsQ, tQcQ, rows, q_seq, p.q_head_stride, p.q_row_stride, seq.seqlen_q);
  } else {
    load_rows(qk_load, qk_load_thr.partition_S(gQ), tQsQ, tQcQ, seq.seqlen_q - m_begin);
  }
  if (n_last > n_first) {
    if constexpr (Traits::kDoubleBuffered || kFp8) {
      load_kv(n_last - 1, 0, std::true_type{});
    } else {
      load_k(n_last - 1, 0, std::true_type{});
    }
  }
  cp_async_fence();
  // fp8 K/V keeps kFp8Stages - 1 tiles in flight: the next ones are requested
  // now, one commit group each (empty past the first tile) so that every
  // tile's group is the same count back from the newest.
  if constexpr (kFp8) {
    CUTE_UNROLL
    for (int ahead = 1; ahead < Traits::kFp8Stages - 1; ++ahead) {
      if (n_last - 1 - ahead >= n_first) load_kv(n_last - 1 - ahead, ahead, std::false_type{});
      cp_async_fence();
    }
  }

  // fp8 K/V with bf16 queries: Q lands with the first tile (group 0) and is
  // rescaled into fp16 before any product; the scale comes back out with K's.
  if constexpr (!std::is_same_v<Element, MmaElement>) {
    cp_async_wait<Traits::kFp8Stages - 2>();
    __syncthreads();
    k_descale *= queries_to_half<Traits::kThreads, Traits::kBlockM * Traits::kHeadDimQK>(
        smem, reinterpret_cast<float*>(raw_pointer_cast(sK.data())), tid);
  }
  // Transformed scores are already log2-domain logits. Without a transform the
  // K scale joins the softmax scale (scores are linear in K); with one it
  // multiplies the raw scores before it.
  const float exp2_scale = Transform::kActive ? 1.f : p.scale_log2 * k_descale;

  clear(acc_o);
  OnlineSoftmax<kRows> softmax;
  softmax.reset();

  // One key tile; NeedsMask is a compile-time switch so the tiles inside
  // every bound (most of them) carry no per-element mask selects: ptxas
  // if-converts a run-time branch around the mask into predicated code.
  // Forced inline like load_kv.
  auto process_tile = [&](int n_block, auto needs_mask) __attribute__((always_inline)) {
    constexpr bool kNeedsMask = decltype(needs_mask)::value;
    const int n_begin = n_block * kBlockN;
    // Tiles alternate between the two stages, the first one in stage 0 (fp8:
    // cycle through the byte stages).
    const int visited = n_last - 1 - n_block;
    const int stage = kFp8                      ? visited % Traits::kFp8Stages
                      : Traits::kDoubleBuffered ? visited & 1
                                                : 0;
    // The stage the products read: fp8 K/V is widened into one element tile.
    const int mma_stage = kFp8 ? 0 : stage;
    Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});
    clear(acc_s);

    if constexpr (kFp8) {
      // This tile's group is kFp8Stages - 2 behind the newest. After the
      // barrier every warp has widened the previous tile's bytes (before the
      // previous tile's second barrier) and used its element tiles, so that
      // byte stage takes the tile kFp8Stages - 1 ahead.
      cp_async_wait<Traits::kFp8Stages - 2>();
      __syncthreads();
      const int ahead = n_block - (Traits::kFp8Stages - 1);
      if (ahead >= n_first) {
        load_kv(ahead, (visited + Traits::kFp8Stages - 1) % Traits::kFp8Stages,
                std::false_type{});
      }
      cp_async_fence();
      // The products wait for every thread's share of the widened tiles.
      widen_fp8_kv(stage);
      __syncthreads();
    } else {
      cp_async_wait<0>();
      // Double-buffered: this tile's K and V landed, and every warp is done with
      // the other stage, so the next tile may load into it now. Single-buffered:
      // K landed and every warp is done with the previous V.
      __syncthreads();
      if constexpr (Traits::kDoubleBuffered) {
        if (n_block > n_first) {
          load_kv(n_block - 1, stage ^ 1, std::false_type{});
          cp_async_fence();
        }
      } else {
        load_v(n_block, 0, needs_mask);  // the tile itself: ragged only if masked
        cp_async_fence();
      }
    }

    gemm_smem_smem(tiled_mma, acc_s, tSrQ, tSrQ_view, tSsQ, q_s2r, tSrK, tSrK_view,
                   in_stage(tSsK, mma_stage, kKElems), k_s2r);
    if constexpr (kFp8 && Transform::kActive) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= k_descale;
    }
    Tensor scores = make_tensor(acc_s.data(), accum_as_rows_cols(acc_s.layout()));
    if constexpr (Transform::kActive) transform.apply(scores, cS_rows_cols, m_begin, n_begin);
    if constexpr (kNeedsMask && kSplit) {
      mask.apply_rows(scores, cS_rows_cols, [&](int r) { return rows.query(r); }, n_begin);
    } else if constexpr (kNeedsMask) {
      mask.apply(scores, cS_rows_cols, m_begin, n_begin);
    }

    if constexpr (!Traits::kDoubleBuffered && !kFp8) {
      cp_async_wait<0>();
      __syncthreads();  // V tile landed; every warp is done with this K
      if (n_block > n_first) {
        load_k(n_block - 1, 0, std::false_type{});
        cp_async_fence();
      }
    }

    if (n_block == n_last - 1) {
      softmax.template update<true>(scores, out, exp2_scale);
    } else {
      softmax.template update<false>(scores, out, exp2_scale);
    }
    if constexpr (Traits::kHasDropout) dropout.apply(scores, cS_rows_cols, m_begin, n_begin);
    Tensor probs = convert_fragment<MmaElement>(acc_s);
    Tensor tOrP = make_tensor(probs.data(), accum_as_operand_a(probs.layout()));
    gemm_regs_smem(tiled_mma, acc_o, tOrP, tOrVt, tOrVt_view,
                   in_stage(tOsVt, mma_stage, kVElems), v_s2r);
  };

  auto tile_needs_mask = [&](int n_block) {
    return mask.tile_needs_mask(q_first, n_block * kBlockN, q_count, kBlockN);
  };
  // Walking backwards, the tiles that cross the end of the keys or the causal
  // diagonal come first, then tiles inside every bound; only a window's left
  // bound makes the last tiles need the mask again.
  int n_block = n_last - 1;
  for (; n_block >= n_first && tile_needs_mask(n_block); --n_block) {
    process_tile(n_block, std::true_type{});
  }
  for (; n_block >= n_first && !tile_needs_mask(n_block); --n_block) {
    process_tile(n_block, std::false_type{});
  }
  if constexpr (Traits::kMask == MaskMode::kWindow) {
    for (; n_block >= n_first; --n_block) process_tile(n_block, std::true_type{});
  }

  // ---- epilogue
  float lse[kRows];
  constexpr float kLog2e = 1.4426950408889634f;
  const float sink_log2 = Traits::kHasSink ? p.sink[head] * kLog2e : 0.f;
  // The V scale multiplies O like the dropout rescale (never both: split-KV has no dropout).
  const float rescale = Traits::kHasDropout ? p.dropout_rescale : v_descale;
  softmax.template finalize<Traits::kHasSink>(out, exp2_scale, sink_log2, rescale, lse);

  if constexpr (kSplit) {
    Tensor cO = mma_thr.partition_C(make_identity_tensor(TileO{}));
    Tensor cO_rows_cols = make_tensor(cO.data(), accum_as_rows_cols(cO.layout()));
    if (p.num_splits == 1) {
      float* lse_seq = nullptr;
      if constexpr (Traits::kHasLse) {
        if (p.lse != nullptr) {
          lse_seq = p.lse + (kGroup ? seq.q_token0 : batch * p.lse_batch_stride);
        }
      }
      store_packed_output(p, out, cO_rows_cols, lse, rows, static_cast<Element*>(p.o) + o_origin,
                          lse_seq, seq.seqlen_q);
    } else {
      store_split_partials<Traits::kHeadDimV>(p, out, cO_rows_cols, lse, rows, split, batch,
                                              seq.seqlen_q);
    }
    cp_async_wait<0>();  // with no visible key the Q load may still be in flight
  } else {
    if constexpr (Traits::kHasLse) {
      if (p.lse != nullptr) {
        Tensor cO = mma_thr.partition_C(make_identity_tensor(TileO{}));
        Tensor cO_rows_cols = make_tensor(cO.data(), accum_as_rows_cols(cO.layout()));
        float* lse_out = p.lse + (kGroup ? seq.q_token0 : batch * p.lse_batch_stride) +
                         head * p.lse_head_stride;
        if (get<1>(cO_rows_cols(0, 0)) == 0) {  // one lane of each quad owns the row
          CUTE_UNROLL
          for (int i = 0; i < kRows; ++i) {
            int row = m_begin + get<0>(cO_rows_cols(i, 0));
            if (row < seq.seqlen_q) lse_out[row] = lse[i];
          }
        }
      }
    }

    // Stage O through shared memory (over Q) so global stores are 16 bytes wide.
    Tensor rO = convert_fragment<Element>(acc_o);
    auto o_r2s = make_tiled_copy_C(typename Traits::SmemStoreAtom{}, tiled_mma);
    auto o_r2s_thr = o_r2s.get_thread_slice(tid);
    Tensor tOrO = o_r2s_thr.retile_S(rO);
    Tensor tOsO = o_r2s_thr.partition_D(sO);
    cp_async_wait<0>();  // with no visible key the Q load may still be in flight
    __syncthreads();
    copy(o_r2s, tOrO, tOsO);
    __syncthreads();

    typename Traits::RowsV::Store o_store;
    auto o_store_thr = o_store.get_thread_slice(tid);
    Tensor tOgO = o_store_thr.partition_D(gO);
    Tensor tOcO = o_store_thr.partition_S(make_identity_tensor(TileO{}));
    store_rows(o_store, o_store_thr.partition_S(sO), tOgO, tOcO, seq.seqlen_q - m_begin);
  }
}

}  // namespace ckfmha::kernel
