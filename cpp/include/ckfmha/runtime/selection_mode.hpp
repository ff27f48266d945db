// Which source decides automatic plans in this process: the hand rules, the
// learned cost model, or the tuning table (ckfmha_selection in ckfmha.h).
#pragma once

#include "ckfmha/ckfmha.h"

namespace ckfmha::runtime {

ckfmha_selection current_selection();
void set_current_selection(ckfmha_selection mode);
const char* selection_name(ckfmha_selection mode);

}  // namespace ckfmha::runtime
