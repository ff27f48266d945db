// Pieces every C API translation unit shares: text copied out to a caller's
// buffer, the arch a call plans for, and the NULL checks of argument pointers.
#pragma once

#include "ckfmha/ckfmha.h"
#include "ckfmha/runtime/device.hpp"
#include "ckfmha/runtime/status.hpp"

#include <cstring>
#include <initializer_list>
#include <string>

namespace ckfmha::runtime {

// Copies `text` and its terminator into buf; `needed` (if given) gets the
// size either way, so callers can ask first with a NULL buffer.
inline int copy_text_out(std::string const& text, char* buf, size_t buf_len, size_t* needed) {
  if (needed) *needed = text.size() + 1;
  if (buf == nullptr || buf_len < text.size() + 1) {
    return fail(CKFMHA_ERROR_BUFFER_TOO_SMALL, "buffer of " + std::to_string(buf_len) +
                                                   " bytes is too small; " +
                                                   std::to_string(text.size() + 1) + " needed");
  }
  std::memcpy(buf, text.c_str(), text.size() + 1);
  return succeed();
}

// `arch` itself, or the current device's when it is negative.
inline int resolve_arch(int arch, int* resolved) {
  if (arch >= 0) {
    *resolved = arch;
    return CKFMHA_SUCCESS;
  }
  return current_device_arch(resolved);
}

// A pointer the problem's features make necessary, and what to say when NULL.
struct RequiredPointer {
  bool needed;
  const void* ptr;
  const char* message;
};

// Fails with the first needed pointer that is NULL, so a kernel never
// dereferences one.
inline int require_pointers(std::initializer_list<RequiredPointer> pointers) {
  for (RequiredPointer const& pointer : pointers) {
    if (pointer.needed && pointer.ptr == nullptr) {
      return fail(CKFMHA_ERROR_INVALID_ARGUMENT, pointer.message);
    }
  }
  return CKFMHA_SUCCESS;
}

}  // namespace ckfmha::runtime
