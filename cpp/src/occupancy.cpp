#include "ckfmha/runtime/occupancy.hpp"

#include "ckfmha/runtime/device.hpp"

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace ckfmha::runtime {

int occupancy_resident_ctas(ckfmha_kernel_entry const& k) {
  if (k.resident_ctas == nullptr) return 0;
  int device = 0;
  if (current_device(&device) != CKFMHA_SUCCESS) return 0;
  // Plans are cached per thread, so this runs on a plan's first use; the
  // calculator's answer depends only on the kernel and the device.
  static std::mutex mutex;
  static std::map<std::pair<int, ckfmha_resident_ctas_fn>, int> counts;
  const auto key = std::make_pair(device, k.resident_ctas);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts.find(key);
  if (it != counts.end()) return it->second;
  int32_t ctas = 0;
  if (k.resident_ctas(&ctas) != 0) return 0;  // not remembered: a later plan asks again
  counts.emplace(key, int(ctas));
  return int(ctas);
}

}  // namespace ckfmha::runtime
