#include "ckfmha/runtime/selection_mode.hpp"

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace ckfmha::runtime {

namespace {

// The process starts in the mode CKFMHA_SELECTION names; an unknown value is
// the hand rules (ckfmha.set_selection validates what Python passes).
ckfmha_selection from_environment() {
  const char* value = std::getenv("CKFMHA_SELECTION");
  std::string_view name = value ? value : "";
  if (name == "learned") return CKFMHA_SELECTION_LEARNED;
  if (name == "tuned") return CKFMHA_SELECTION_TUNED;
  return CKFMHA_SELECTION_HEURISTIC;
}

// One mode for the whole process, not per thread: frameworks launch the
// backward from their own worker threads (torch's autograd engine), which must
// plan as the thread that set the mode does.
std::atomic<int>& mode() {
  static std::atomic<int> value{int(from_environment())};
  return value;
}

}  // namespace

ckfmha_selection current_selection() {
  return ckfmha_selection(mode().load(std::memory_order_relaxed));
}

void set_current_selection(ckfmha_selection selection) {
  mode().store(int(selection), std::memory_order_relaxed);
}

const char* selection_name(ckfmha_selection selection) {
  switch (selection) {
    case CKFMHA_SELECTION_LEARNED: return "learned";
    case CKFMHA_SELECTION_TUNED: return "tuned";
    default: return "heuristic";
  }
}

}  // namespace ckfmha::runtime
