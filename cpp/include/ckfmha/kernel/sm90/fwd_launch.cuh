// Host-side launcher for one Hopper forward instance: builds the TMA
// descriptors for this problem's tensors and launches fwd_sm90_kernel.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/kernel/common/launch.cuh"
#include "ckfmha/kernel/params/fwd_params_from_problem.h"
#include "ckfmha/kernel/sm90/fwd_kernel.cuh"
#include "ckfmha/kernel/sm90/fwd_traits.cuh"
#include "ckfmha/kernel_entry.h"

#include <algorithm>
#include <array>


namespace ckfmha::kernel {

// (rows, head dim, heads, batch) view of a [batch, heads, rows, dim] tensor
// with arbitrary strides (BHSD, BSHD, ...); the head dim is contiguous.
template <class Traits>
typename Traits::GmemTensor gmem_view(void const* data, int rows, int hdim, int heads, int batch,
                                      std::array<int64_t, 3> const& stride) {
  using Element = typename Traits::InputElement;
  return cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(data)),
                           cute::make_shape(rows, hdim, heads, batch),
                           cute::make_stride(stride[2], cute::_1{}, stride[1], stride[0]));
}

template <class Traits>
int launch_fwd_sm90(void const* problem, void const* args,
    ckfmha_launch_context const* context, ckfmha_stream_t stream) {
  using namespace cute;
  auto const& pr = *static_cast<ckfmha_fwd_problem const*>(problem);
  auto const& ar = *static_cast<ckfmha_fwd_args const*>(args);
  constexpr bool kGroup = Traits::kIsGroupMode;
  // Group mode: one view over the packed tokens (its "batch" stride is any
  // legal value: the view has a single batch). The runtime checked that
  // total_q/total_k are given and fit the descriptor's 32-bit coordinates.
  const int rows_q = kGroup ? int(pr.total_q) : pr.seqlen_q;
  const int rows_k = kGroup ? int(pr.total_k) : pr.seqlen_k;
  const int views = kGroup ? 1 : pr.batch;
  auto view_strides = [&](int64_t const(&stride)[3], int rows) {
    return std::array<int64_t, 3>{kGroup ? stride[2] * rows : stride[0], stride[1], stride[2]};
  };
  auto q_stride = view_strides(pr.q_stride, rows_q);
  auto k_stride = view_strides(pr.k_stride, rows_k);
  auto v_stride = view_strides(pr.v_stride, rows_k);
  Sm90TileOrder<Traits> order{(pr.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, pr.nhead_q,
                              pr.batch};
  int sms = 0;
  if (int err = current_device_sms(&sms); err != 0) return err;
  // The bias ring's descriptor (fwd_bias_ring.cuh), where the bias fits TMA:
  // a (rows, keys, heads, batch) view whose broadcast axes have size 1 (TMA
  // takes no zero stride; the kernel reads index 0 there). A row-broadcast
  // bias takes the ring's row mode, which reads without a descriptor.
  typename Traits::TmaBias tma_bias{};
  BiasSource bias_source = BiasSource::kRegisters;
  if constexpr (Traits::kBiasRowsOnly) {
    // The runtime's checks send these kernels row-broadcast biases only.
    if (!bias_rows_broadcast(ar.bias, pr.bias_stride)) return -int(cudaErrorNotSupported);
    bias_source = BiasSource::kRowRing;
  } else if constexpr (Traits::kBiasStages > 0) {
    using Element = typename Traits::Element;
    if (bias_rows_broadcast(ar.bias, pr.bias_stride)) bias_source = BiasSource::kRowRing;
    if (bias_fits_tma<Element>(ar.bias, pr.bias_stride)) {
      bias_source = BiasSource::kTileRing;
      const int64_t plane = pr.bias_stride[2] * pr.seqlen_q;  // any legal stride of a unit axis
      const bool per_head = pr.bias_stride[1] != 0, per_batch = pr.bias_stride[0] != 0;
      tma_bias = make_tma_copy(
          SM90_TMA_LOAD{},
          make_tensor(make_gmem_ptr(static_cast<Element const*>(ar.bias)),
                      make_shape(pr.seqlen_q, pr.seqlen_k, per_head ? pr.nhead_q : 1,
                                 per_batch ? pr.batch : 1),
                      make_stride(pr.bias_stride[2], _1{}, per_head ? pr.bias_stride[1] : plane,
                                  per_batch ? pr.bias_stride[0] : plane)),
          take<0, 2>(typename Traits::SmemLayoutBiasRing{}),
          Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>{}, _1{});
    }
  }
  // Encoding a descriptor reads only host memory; a bad tensor shows up as a
  // launch error, which the caller reports.
  FwdSm90Params<Traits> params{
      make_fwd_params(pr, ar, context),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem_view<Traits>(ar.q, rows_q, pr.hdim_q, pr.nhead_q, views, q_stride),
                    typename Traits::SmemLayoutQ{},
                    Shape<Int<Traits::kBlockM>, Int<Traits::kHeadDimQK>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem_view<Traits>(ar.k, rows_k, pr.hdim_q, pr.nhead_k, views, k_stride),
                    take<0, 2>(typename Traits::SmemLayoutK{}),
                    Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimQK>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{},
                    gmem_view<Traits>(ar.v, rows_k, pr.hdim_v, pr.nhead_k, views, v_stride),
                    take<0, 2>(typename Traits::SmemLayoutV{}),
                    Shape<Int<Traits::kBlockN>, Int<Traits::kHeadDimV>>{}, _1{}),
      make_tma_copy(SM90_TMA_STORE{},
                    make_tensor(make_gmem_ptr(static_cast<typename Traits::Element*>(ar.o)),
                                make_shape(rows_q, pr.hdim_v, pr.nhead_q, views),
                                make_stride(pr.o_stride[2], _1{}, pr.o_stride[1],
                                            kGroup ? pr.o_stride[2] * rows_q : pr.o_stride[0])),
                    typename Traits::SmemLayoutOChunk{},
                    Shape<Int<Traits::kRowsPerWarpgroup>, Int<Traits::kOChunkCols>>{}, _1{}),
      order,
      rows_q,
      rows_k,
      tma_bias,
  };
  // One CTA per SM (each takes all of an SM's shared memory), never more
  // CTAs than units of work.
  dim3 grid(std::min(order.num_units(), sms));
  if constexpr (Traits::kQkvFp8) {
    if (pr.fp8_block_scales) {
      return launch_kernel(&fwd_sm90_kernel<Traits, true>, grid, Traits::kThreads,
                           Traits::kSmemBytes, stream, params);
    }
  }
  if constexpr (Traits::kBiasRowsOnly) {
    return launch_kernel(&fwd_sm90_kernel<Traits, false, BiasSource::kRowRing>, grid,
                         Traits::kThreads, Traits::kSmemBytes, stream, params);
  } else {
    if constexpr (Traits::kBiasStages > 0) {
      if (bias_source == BiasSource::kTileRing) {
        return launch_kernel(&fwd_sm90_kernel<Traits, false, BiasSource::kTileRing>, grid,
                             Traits::kThreads, Traits::kSmemBytes, stream, params);
      }
      if (bias_source == BiasSource::kRowRing) {
        return launch_kernel(&fwd_sm90_kernel<Traits, false, BiasSource::kRowRing>, grid,
                             Traits::kThreads, Traits::kSmemBytes, stream, params);
      }
    }
    return launch_kernel(&fwd_sm90_kernel<Traits>, grid, Traits::kThreads, Traits::kSmemBytes,
                         stream, params);
  }
}

}  // namespace ckfmha::kernel
