// Shared-memory plumbing for the Hopper kernels: placing the storage struct
// in dynamic shared memory, and a register-to-shared store that stays a
// shared-memory instruction through CuTe's swizzled pointers.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

namespace ckfmha::kernel {

// The kernel's storage at the first 1024-byte boundary of dynamic shared
// memory (which is only 16-byte aligned; swizzled TMA and wgmma tiles need
// 1024). The pad is computed from the shared-window address and added to
// the shared array itself: rounding the generic address as an integer would
// leave a pointer the compiler no longer knows is shared, and every access
// outside TMA and wgmma would become a generic LD/ST.
template <class Storage>
__device__ __forceinline__ Storage* shared_storage_at_1024(char* smem_raw) {
  const uint32_t shared_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  return reinterpret_cast<Storage*>(smem_raw + ((1024u - (shared_addr & 1023u)) & 1023u));
}

// Eight bytes from registers to shared memory as st.shared. CuTe's
// UniversalCopy through a swizzled smem pointer goes through an integer
// address and compiles to a generic store.
struct SharedStore64 {
  using SRegisters = uint64_t[1];
  using DRegisters = uint64_t[1];
  CUTE_HOST_DEVICE static void copy(uint64_t const& src, uint64_t& smem_dst) {
#if defined(__CUDA_ARCH__)
    asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(cute::cast_smem_ptr_to_uint(&smem_dst)),
                 "l"(src));
#endif
  }
};

}  // namespace ckfmha::kernel

namespace cute {

// One thread stores one 64-bit value: the same thread-value map as an
// eight-byte UniversalCopy.
template <>
struct Copy_Traits<ckfmha::kernel::SharedStore64> {
  using ThrID = Layout<_1>;
  using SrcLayout = Layout<Shape<_1, _64>>;
  using DstLayout = Layout<Shape<_1, _64>>;
  using RefLayout = SrcLayout;
};

}  // namespace cute
