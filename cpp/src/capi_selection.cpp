// The extern "C" surface of plan selection: the thread's mode, the learned
// cost model and the tuning table (see "plan selection" in ckfmha.h).
#include "ckfmha/ckfmha.h"

#include "ckfmha/runtime/capi_support.hpp"
#include "ckfmha/runtime/problem.hpp"
#include "ckfmha/runtime/registry.hpp"
#include "ckfmha/runtime/selection_mode.hpp"
#include "ckfmha/runtime/selection_model.hpp"
#include "ckfmha/runtime/status.hpp"
#include "ckfmha/runtime/tuning_table.hpp"

#include <fstream>
#include <memory>
#include <string>

using namespace ckfmha::runtime;

namespace {

int require_kernel(const char* kernel_name, ckfmha_family family) {
  if (int s = require(kernel_name != nullptr, "kernel_name is NULL")) return s;
  ckfmha_kernel_entry entry{};
  if (!Registry::instance().find(kernel_name, &entry)) {
    return fail(CKFMHA_ERROR_NOT_FOUND, std::string("no registered kernel named ") + kernel_name);
  }
  const bool fits = family == CKFMHA_FAMILY_BWD_DQ_DK_DV
                        ? entry.family == family
                        : entry.family == CKFMHA_FAMILY_FWD ||
                              entry.family == CKFMHA_FAMILY_FWD_SPLITKV;
  if (!fits) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                std::string("kernel ") + kernel_name + " is a " + family_name(entry.family) +
                    " kernel; tuning entries name " +
                    (family == CKFMHA_FAMILY_BWD_DQ_DK_DV ? "a bwd_dq_dk_dv kernel"
                                                          : "a fwd or fwd_splitkv kernel"));
  }
  return CKFMHA_SUCCESS;
}

}  // namespace

extern "C" {

int ckfmha_set_selection(ckfmha_selection mode) {
  if (mode != CKFMHA_SELECTION_HEURISTIC && mode != CKFMHA_SELECTION_LEARNED &&
      mode != CKFMHA_SELECTION_TUNED) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT,
                "selection " + std::to_string(int(mode)) +
                    " is not one of CKFMHA_SELECTION_HEURISTIC (0), _LEARNED (1), _TUNED (2)");
  }
  set_current_selection(mode);
  return succeed();
}

int ckfmha_get_selection(ckfmha_selection* mode) {
  if (int s = require(mode != nullptr, "mode is NULL")) return s;
  *mode = current_selection();
  return succeed();
}

int ckfmha_selection_model_load(const char* path) {
  if (int s = require(path != nullptr, "path is NULL")) return s;
  std::ifstream in(path);
  if (!in) return fail(CKFMHA_ERROR_NOT_FOUND, std::string("cannot read cost model ") + path);
  auto model = std::make_shared<SelectionModel>();
  if (auto error = parse_selection_model(in, model.get()); !error.empty()) {
    return fail(CKFMHA_ERROR_INVALID_ARGUMENT, std::string(path) + " " + error);
  }
  set_selection_model(std::move(model));
  return succeed();
}

int ckfmha_selection_model_info(char* buf, size_t buf_len, size_t* needed) {
  auto model = current_selection_model();
  return copy_text_out(model ? model->describe() : "none", buf, buf_len, needed);
}

int ckfmha_conv_selection_model_info(char* buf, size_t buf_len, size_t* needed) {
  auto model = current_conv_selection_model();
  return copy_text_out(model ? model->describe() : "none", buf, buf_len, needed);
}

int ckfmha_tuning_add_fwd(const ckfmha_fwd_problem* problem, const char* kernel_name,
                          int num_splits, float ms) {
  if (int s = checked(problem, check_fwd_problem)) return s;
  if (int s = require_kernel(kernel_name, CKFMHA_FAMILY_FWD)) return s;
  if (int s = require(num_splits >= 0, "num_splits must be >= 0")) return s;
  tuning_add(tuning_key(*problem), TunedPlan{kernel_name, num_splits, ms});
  return succeed();
}

int ckfmha_tuning_add_bwd(const ckfmha_bwd_problem* problem, const char* kernel_name,
                          float ms) {
  if (int s = checked(problem, check_bwd_problem)) return s;
  if (int s = require_kernel(kernel_name, CKFMHA_FAMILY_BWD_DQ_DK_DV)) return s;
  tuning_add(tuning_key(*problem), TunedPlan{kernel_name, 0, ms});
  return succeed();
}

int ckfmha_tuning_save(const char* path, int* entries) {
  if (int s = require(path != nullptr, "path is NULL")) return s;
  return tuning_save(path, entries);
}

int ckfmha_tuning_load(const char* path, int* entries) {
  if (int s = require(path != nullptr, "path is NULL")) return s;
  return tuning_load(path, entries);
}

int ckfmha_tuning_clear(void) {
  tuning_clear();
  return succeed();
}

}  // extern "C"
