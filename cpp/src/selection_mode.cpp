#include "ckfmha/runtime/selection_mode.hpp"

#include <cstdlib>
#include <string_view>

namespace ckfmha::runtime {

namespace {

// A thread's first plan reads CKFMHA_SELECTION; an unknown value is the
// hand rules (ckfmha.set_selection validates what Python passes).
ckfmha_selection from_environment() {
  const char* value = std::getenv("CKFMHA_SELECTION");
  std::string_view name = value ? value : "";
  if (name == "learned") return CKFMHA_SELECTION_LEARNED;
  if (name == "tuned") return CKFMHA_SELECTION_TUNED;
  return CKFMHA_SELECTION_HEURISTIC;
}

thread_local bool chosen = false;
thread_local ckfmha_selection mode = CKFMHA_SELECTION_HEURISTIC;

}  // namespace

ckfmha_selection current_selection() {
  if (!chosen) {
    mode = from_environment();
    chosen = true;
  }
  return mode;
}

void set_current_selection(ckfmha_selection selection) {
  mode = selection;
  chosen = true;
}

const char* selection_name(ckfmha_selection selection) {
  switch (selection) {
    case CKFMHA_SELECTION_LEARNED: return "learned";
    case CKFMHA_SELECTION_TUNED: return "tuned";
    default: return "heuristic";
  }
}

}  // namespace ckfmha::runtime
