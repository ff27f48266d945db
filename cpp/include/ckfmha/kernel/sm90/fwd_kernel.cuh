// Forward attention on Hopper: TMA loads and wgmma, warp-specialized and
// persistent. Each CTA walks query tiles (128 or 192 rows of one head and
// sequence) unit by unit in PersistentTileOrder (fwd_tile_work.cuh):
//   producer warpgroup (fwd_ring.cuh): one thread issues TMA copies of each
//     tile's Q and of its K and V tiles into a ring of stages, in the order
//     the consumers read them; with fp8 inputs warps 1-3 write each V tile
//     transposed into the ring the consumers read (fwd_fp8.cuh); with an
//     elementwise bias warp 1's first thread copies each key tile's bias
//     into a ring of its own, or for a row-broadcast bias all of warp 1
//     reads each key tile's one row (fwd_bias_ring.cuh).
//   consumer warpgroups (two or three, 64 query rows each; fwd_mma.cuh):
//     S = Q K^T, the mask and online softmax, and O += P V, software-
//     pipelined by one key tile and taking turns on the tensor cores; then
//     the tile's LSE and O (fwd_epilogue.cuh).
#pragma once

#include "ckfmha/kernel/common/persistent_tile_order.cuh"
#include "ckfmha/kernel/common/shared_storage.cuh"
#include "ckfmha/kernel/params/fwd_params.h"
#include "ckfmha/kernel/sm90/fwd_epilogue.cuh"
#include "ckfmha/kernel/sm90/fwd_fp8.cuh"
#include "ckfmha/kernel/sm90/fwd_mma.cuh"
#include "ckfmha/kernel/sm90/fwd_ring.cuh"
#include "ckfmha/kernel/sm90/fwd_tile_work.cuh"
#include "ckfmha/kernel/sm90/fwd_traits.cuh"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

namespace ckfmha::kernel {

// `Fp8BlockScales`: the fp8 forward with per-block scales (p.fp8_block_scales,
// fwd_fp8.cuh), a kernel of its own so that per-tensor scales keep their
// loop as it was: sharing one loop with a run-time test per key tile cost
// them 10-14%, and one kernel holding both loops left d128's and d256's
// accumulators in local memory (NOTES 85).
// `Bias`: where an elementwise bias comes from (fwd_bias_ring.cuh): read
// into registers, or through the shared-memory ring as tiles or as one
// broadcast row a key tile, each likewise a kernel of its own: beside the
// register path in one kernel, both paths spilled more.
template <class Traits, bool Fp8BlockScales = false, BiasSource Bias = BiasSource::kRegisters>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_sm90_kernel(__grid_constant__ const FwdSm90Params<Traits> params) {
  using namespace cute;
  using Element = typename Traits::Element;  // O's
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using Storage = typename Traits::SharedStorage;
  using Work = Sm90TileWork<Traits>;
  FwdParams const& p = params.p;

  extern __shared__ char smem_raw[];
  Storage* storage = shared_storage_at_1024<Storage>(smem_raw);
  auto& bar = storage->bar;
  Tensor sQ = make_tensor(make_smem_ptr(storage->q.data()), typename Traits::SmemLayoutQRing{});
  Tensor sK = make_tensor(make_smem_ptr(storage->k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(storage->v.data()), typename Traits::SmemLayoutV{});
  Tensor sVt = make_tensor(make_smem_ptr(Traits::vt_data(storage)), typename Traits::SmemLayoutVt{});

  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  typename Traits::BiasRing* bias_ring = Traits::bias_ring(storage);
  if (threadIdx.x == 0) {
    fwd_sm90_init_barriers<Traits>(bar);
    if constexpr (Bias != BiasSource::kRegisters) fwd_sm90_init_bias_ring<Traits>(*bias_ring);
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer warpgroup
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if constexpr (Traits::kQkvFp8) {
      if (warp != 0) {
        fwd_sm90_transpose_v<Traits>(params, bar, sV, sVt, int(threadIdx.x) - 32);
        return;
      }
    }
    if constexpr (Bias == BiasSource::kTileRing) {
      if (warp == 1) {
        if (lane == 0) fwd_sm90_load_bias_tiles<Traits>(params, *bias_ring);
        return;
      }
    }
    if constexpr (Bias == BiasSource::kRowRing) {
      if (warp == 1) {
        fwd_sm90_load_bias_rows<Traits>(params, *bias_ring, lane);
        return;
      }
    }
    if (warp != 0 || lane != 0) return;
    fwd_sm90_load_tiles<Traits>(params, bar, sQ, sK, sV);
    return;
  }

  // ---- consumer warpgroups
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
  const int tid = int(threadIdx.x) - 128;
  FwdSm90Mma<Traits> mma(sQ, sK, sVt, tid);
  FwdSm90Accumulators<Traits> acc;
  FwdSm90Epilogue<Traits> epilogue(storage, mma.mma_pv, tid);

  const ConsumerTurns<Traits::kConsumerWarpgroups> turns{tid / 128};
  turns.start();

  int kv_count = 0;  // same counters as the producer's
  FwdBiasRingReader<Traits, Bias == BiasSource::kRowRing> bias_reader{bias_ring};
  int q_count = 0;
  Tensor out = acc.out();
  acc.softmax.reset();
  clear(acc.acc_o);
  // Inlined by force: with the feature paths ptxas otherwise made it a call
  // and kept the accumulators on the stack.
  for_each_tile(params.order, [&](QueryTile query_tile) __attribute__((always_inline)) {
    const Work work(p, query_tile);
    if (!work.has_rows()) return;
    const int n_tiles = work.n_tiles();
    const RingSlot q_slot = ring_slot_of<Traits::kQStages>(q_count);
    Barrier::wait(&bar.q_full[q_slot.stage], q_slot.phase);
    if (n_tiles == 0) {  // no key visible: a path of its own (store_empty_tile)
      Barrier::arrive(&bar.q_empty[q_slot.stage]);
      epilogue.store_empty_tile(p, work, mma.cO_rows_cols, acc);
      ++q_count;
      return;
    }
    if constexpr (Bias != BiasSource::kRegisters) {
      mma.template attend<Fp8BlockScales>(p, bar, turns, work, q_slot, kv_count, acc, out,
                                          &bias_reader);
    } else {
      mma.template attend<Fp8BlockScales>(p, bar, turns, work, q_slot, kv_count, acc, out);
    }
    kv_count += n_tiles;
    epilogue.template finish_softmax<Fp8BlockScales>(p, work, mma.cO_rows_cols, acc);
    // O's conversion and address are made here, between the epilogue's two
    // calls, where the kernel's own epilogue made them: made inside store_o,
    // they let the compiler fold the row offsets another way. Only the TMA
    // stores read tid: handed to the other paths, it changed the generated
    // code too (a test of threadIdx.x folded another way).
    Tensor rO = convert_fragment<Element>(acc.acc_o);
    Element* o_base = epilogue.o_rows(p, work);
    if constexpr (Traits::kOutputPath == Sm90OutputPath::kTmaStore) {
      epilogue.store_o(params, storage, work, mma.cO_rows_cols, rO, o_base, tid);
    } else {
      epilogue.store_o(params, storage, work, mma.cO_rows_cols, rO, o_base, 0);
    }
    ++q_count;
    clear(acc.acc_o);
    acc.softmax.reset();
  });
  // Shared memory must outlive the last stores' reads.
  if constexpr (Traits::kOutputPath == Sm90OutputPath::kTmaStore) {
    if (tid % 128 == 0) tma_store_wait<0>();
  }
}

}  // namespace ckfmha::kernel
