// Side streams and their events per host thread and device (stream_fork.hpp).
#include "ckfmha/runtime/stream_fork.hpp"

#include <cuda_runtime.h>

#include <memory>
#include <vector>

namespace ckfmha::runtime {

namespace {

struct SidePool {
  SidePool() = default;
  SidePool(SidePool const&) = delete;
  SidePool& operator=(SidePool const&) = delete;

  int device = -1;
  cudaEvent_t forked = nullptr;  // recorded on the caller's stream
  cudaStream_t streams[kMaxSideStreams] = {};
  cudaEvent_t done[kMaxSideStreams] = {};  // recorded on each side stream

  // Work still queued when the thread exits completes: destroying a stream
  // or an event does not wait for it, and releases it after.
  ~SidePool() {
    for (int i = 0; i < kMaxSideStreams; ++i) {
      if (streams[i] != nullptr) cudaStreamDestroy(streams[i]);
      if (done[i] != nullptr) cudaEventDestroy(done[i]);
    }
    if (forked != nullptr) cudaEventDestroy(forked);
  }

  // Stream and event creation are not stream work, but global capture mode
  // would refuse them while any stream of the process captures: allow them
  // for this thread while they run.
  cudaError_t create() {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaEventCreateWithFlags(&forked, cudaEventDisableTiming);
    for (int i = 0; i < kMaxSideStreams && err == cudaSuccess; ++i) {
      // Non-blocking: no implicit ordering with the legacy default stream;
      // the events order them.
      err = cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking);
      if (err == cudaSuccess) err = cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming);
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    return err;
  }
};

thread_local std::vector<std::unique_ptr<SidePool>> t_pools;

int failed(cudaError_t err) { return -int(err); }

cudaError_t pool_for_current_device(SidePool** pool) {
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  for (auto& p : t_pools) {
    if (p->device == device) {
      *pool = p.get();
      return cudaSuccess;
    }
  }
  auto p = std::make_unique<SidePool>();
  p->device = device;
  if (cudaError_t err = p->create(); err != cudaSuccess) return err;
  *pool = p.get();
  t_pools.push_back(std::move(p));
  return cudaSuccess;
}

}  // namespace

int fork_streams(ckfmha_stream_t caller, int branches, StreamFork* fork) {
  SidePool* pool = nullptr;
  if (cudaError_t err = pool_for_current_device(&pool); err != cudaSuccess) return failed(err);
  fork->caller = caller;
  fork->count = branches < kMaxSideStreams ? branches : kMaxSideStreams;
  if (cudaError_t err = cudaEventRecord(pool->forked, cudaStream_t(caller)); err != cudaSuccess) {
    return failed(err);
  }
  for (int i = 0; i < fork->count; ++i) {
    fork->side[i] = pool->streams[i];
    if (cudaError_t err = cudaStreamWaitEvent(pool->streams[i], pool->forked, 0);
        err != cudaSuccess) {
      return failed(err);
    }
  }
  return 0;
}

int join_streams(StreamFork const& fork) {
  SidePool* pool = nullptr;
  if (cudaError_t err = pool_for_current_device(&pool); err != cudaSuccess) return failed(err);
  for (int i = 0; i < fork.count; ++i) {
    if (cudaError_t err = cudaEventRecord(pool->done[i], cudaStream_t(fork.side[i]));
        err != cudaSuccess) {
      return failed(err);
    }
    if (cudaError_t err = cudaStreamWaitEvent(cudaStream_t(fork.caller), pool->done[i], 0);
        err != cudaSuccess) {
      return failed(err);
    }
  }
  return 0;
}

}  // namespace ckfmha::runtime
