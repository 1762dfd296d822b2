// Maps the input dtype to the C++ input type and the type the kernels compute in: fp64 stays
// fp64 (gradcheck), everything else is computed in fp32 and rounded once on store.
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "../params.h"

namespace flashattn::cpu {

template <typename In>
using compute_t = std::conditional_t<std::is_same_v<In, double>, double, float>;

// The softmax scale and softcap in the compute type T (fp64 keeps every bit of the caller's).
template <typename T>
T softmax_scale(const AttnParams& p) {
  return std::is_same_v<T, double> ? static_cast<T>(p.scale_fp64) : static_cast<T>(p.scale);
}
template <typename T>
T softcap(const AttnParams& p) {
  return std::is_same_v<T, double> ? static_cast<T>(p.softcap_fp64) : static_cast<T>(p.softcap);
}

template <typename In>
struct DtypeTag {
  using type = In;
};

// Calls fn(DtypeTag<In>{}) for the C++ type In of dtype.
template <typename Fn>
void dispatch_input_dtype(c10::ScalarType dtype, const Fn& fn) {
  switch (dtype) {
    case c10::ScalarType::Float: return fn(DtypeTag<float>{});
    case c10::ScalarType::Double: return fn(DtypeTag<double>{});
    case c10::ScalarType::Half: return fn(DtypeTag<c10::Half>{});
    case c10::ScalarType::BFloat16: return fn(DtypeTag<c10::BFloat16>{});
    default: TORCH_CHECK(false, "flashattn: the CPU kernels do not support dtype ", dtype);
  }
}

}  // namespace flashattn::cpu
