// A per-thread memo of the last few plans and the keys that made them, for
// the planners whose callers ask for the same problems over and over
// (fwd_plan_cache.cpp, bwd_plan_cache.cpp). Planning walks every registered
// kernel and formats its reasons; remembering the answer keeps that off the
// launch path.
#pragma once

#include <array>
#include <cstddef>

namespace ckfmha::runtime {

// Key needs ==; Plan is copied into a slot. Failed plans are not kept: their
// messages may depend on state the key does not hold, and the error path need
// not be fast.
template <class Key, class Plan, size_t Slots = 8>
class RecentPlans {
 public:
  // The plan remembered under `key`, else `make()`'s (kept when `found`
  // says it succeeded). The reference stays valid until the next call.
  template <class Make, class Found>
  Plan const& get(Key const& key, Make&& make, Found&& found) {
    for (auto const& slot : slots_) {
      if (slot.valid && slot.key == key) return slot.plan;
    }
    Slot& slot = slots_[next_];
    next_ = (next_ + 1) % Slots;
    slot.valid = false;
    slot.plan = make();
    if (found(slot.plan)) {
      slot.key = key;
      slot.valid = true;
    }
    return slot.plan;
  }

 private:
  struct Slot {
    bool valid = false;
    Key key{};
    Plan plan{};
  };
  std::array<Slot, Slots> slots_{};
  size_t next_ = 0;
};

}  // namespace ckfmha::runtime
