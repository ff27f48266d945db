// Independent launches of one call run concurrently on side streams: the
// caller's stream forks onto them (each waits for what the caller queued
// before) and joins them again before the call returns, so that the call
// stays one ordered step on the caller's stream. Under stream capture the
// side streams join the capture through the same events, and the graph
// gets parallel branches.
//
// The side streams and events belong to the calling host thread and the
// current device, created on first use: two threads forking at once never
// re-record each other's events.
#pragma once

#include "ckfmha/ckfmha.h"

namespace ckfmha::runtime {

constexpr int kMaxSideStreams = 7;

struct StreamFork {
  ckfmha_stream_t caller = nullptr;
  ckfmha_stream_t side[kMaxSideStreams] = {};
  int count = 0;
};

// Forks `branches` side streams (at most kMaxSideStreams) off `caller`.
// Returns 0 or a negated cudaError_t, as kernel launchers do.
int fork_streams(ckfmha_stream_t caller, int branches, StreamFork* fork);

// The caller's stream waits for everything queued on the fork's side streams.
int join_streams(StreamFork const& fork);

}  // namespace ckfmha::runtime
