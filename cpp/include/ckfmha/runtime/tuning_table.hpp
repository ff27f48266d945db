// The tuning table: the fastest plan timed (python -m ckfmha tune) for exact
// problems on one GPU, preferred by the "tuned" selection. Entries are keyed
// by the fields that decide a plan's speed: kind, dtype, mode, batch, heads,
// lengths, head dims, mask and, in group mode, the packed token counts. A
// table file names the library version, CUDA driver and device it was timed
// with; loading refuses one that differs.
#pragma once

#include "ckfmha/ckfmha.h"

#include <string>

namespace ckfmha::runtime {

struct TunedPlan {
  std::string kernel;  // fwd, fwd_splitkv or bwd_dq_dk_dv kernel name
  int num_splits = 0;  // forward: 0 one stage, n >= 1 split-KV with n splits
  float ms = 0;        // what it measured
};

std::string tuning_key(ckfmha_fwd_problem const& problem);
std::string tuning_key(ckfmha_bwd_problem const& problem);

void tuning_add(std::string const& key, TunedPlan const& plan);
bool tuning_find(std::string const& key, TunedPlan* plan);
void tuning_clear();

// Status-returning file operations (messages name the file and the line).
int tuning_save(const char* path, int* entries);
int tuning_load(const char* path, int* entries);

}  // namespace ckfmha::runtime
