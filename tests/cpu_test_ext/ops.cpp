// torch.ops.flashattn_test: the test-only ops, in an extension the tests build (build.py), never
// in the shipped library. Each 16-bit tile kernel called directly (tests/test_cpu_gemm_16bit.py),
// the CPU features and the kernel choice they make (tests/test_cpu_16bit_products.py), the
// kernels' product counters; and the CPU attention ops (fwd, bwd, fwd_kvcache, the schemas of
// torch.ops.flashattn) run by this extension's own build of csrc/cpu/fwd.cpp and bwd.cpp with
// FLASHATTN_TEST_COUNTERS, which keeps how many heads' packed operands the last call held at once
// (tests/test_memory.py). Everything else the kernels call comes from the shipped flashattn._C,
// which the extension links against. Not an API: names and arguments may change.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "cpu/executor.h"
#include "cpu/gemm_avx512_16bit.h"
#include "cpu/kernels.h"
#include "cpu/panels16.h"
#include "cpu/row_products.h"
#include "cpu/tile_gemm.h"
#include "schema.h"

#ifndef FLASHATTN_TEST_COUNTERS
#error "tests/cpu_test_ext builds with -DFLASHATTN_TEST_COUNTERS (build.py)"
#endif

namespace flashattn::cpu {
namespace {

Gemm16Kernel kernel_named(const std::string& name) {
  for (int k = 0; k < kNumGemm16Kernels; ++k)
    if (name == gemm16_kernel_name(static_cast<Gemm16Kernel>(k)))
      return static_cast<Gemm16Kernel>(k);
  TORCH_CHECK(false, "flashattn: no 16-bit tile kernel named '", name, "'");
}

void check_16bit(c10::ScalarType dtype) {
  TORCH_CHECK(dtype == c10::kBFloat16 || dtype == c10::kHalf,
              "flashattn: the 16-bit tile products take bfloat16 or float16, not ", dtype);
}

// c[M, N] (+)= a[M, K] · B with `kernel`, B given as `b`: for rowmajor [K, ldb], else packed for
// the kernel (pack_vnni2 below). a and c row-major with a contiguous last dim.
void gemm16(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const std::string& name,
            bool accumulate) {
  check_16bit(a.scalar_type());
  TORCH_CHECK(b.scalar_type() == a.scalar_type() && c.scalar_type() == at::kFloat &&
                  a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && a.size(0) == c.size(0) &&
                  a.stride(1) == 1 && b.is_contiguous() && c.stride(1) == 1,
              "flashattn: gemm16 takes a [M, K] and c [M, N] (fp32) row-major, b contiguous");
  const Gemm16Kernel kernel = kernel_named(name);
  const char* why_not = "";
  TORCH_CHECK(gemm16_kernel_runs(kernel, cpu_16bit_features(a.scalar_type()), a.scalar_type(),
                                 &why_not),
              "flashattn: the ", name, " kernel needs ", why_not, ", which this CPU lacks");
  const int64_t M = a.size(0), K = a.size(1), N = c.size(1);
  const bool packed = kernel != Gemm16Kernel::kRowMajor;
  // Packed: [ceil(K/2), 2·ldb]; row-major: [K, ldb].
  const int64_t ldb = packed ? b.size(1) / 2 : b.size(1);
  TORCH_CHECK(ldb >= N && b.size(0) == (packed ? (K + 1) / 2 : K),
              "flashattn: gemm16: b has the wrong shape for K = ", K, ", N = ", N);
  // oneDNN's AMX brgemm on an odd K ran into an illegal instruction (SIGILL) on an AMX-BF16
  // Xeon; the kernels only ever give it whole row pairs (panels16.h pads K to even).
  TORCH_CHECK(kernel != Gemm16Kernel::kAmx || K % 2 == 0,
              "flashattn: gemm16: the amx kernel takes an even K (its VNNI panels hold row "
              "pairs), got K = ", K);
  dispatch_input_dtype(a.scalar_type(), [&](auto tag) {
    using In = typename decltype(tag)::type;
    if constexpr (std::is_same_v<In, c10::BFloat16> || std::is_same_v<In, c10::Half>) {
      tile_gemm_16bit(kernel, M, N, K, a.data_ptr<In>(), a.stride(0), b.data_ptr<In>(), ldb,
                      c.data_ptr<float>(), c.stride(0), accumulate);
      if (kernel == Gemm16Kernel::kAmx) at::native::cpublas::brgemm_release(true);
    }
  });
}

// b [K, N] (16-bit, contiguous) in VNNI-2 order with pair-row stride 2·ldb: [ceil(K/2), 2·ldb].
at::Tensor pack_vnni2(const at::Tensor& b, int64_t ldb) {
  check_16bit(b.scalar_type());
  TORCH_CHECK(b.dim() == 2 && b.is_contiguous() && ldb >= b.size(1),
              "flashattn: pack_vnni2 takes a contiguous [K, N] and ldb >= N");
  const int64_t K = b.size(0), N = b.size(1);
  at::Tensor out = at::full({(K + 1) / 2, 2 * ldb}, -1.0, b.options());  // padding stays -1
  avx512::pack_vnni2(reinterpret_cast<const uint16_t*>(b.data_ptr()), N, K, N,
                     reinterpret_cast<uint16_t*>(out.data_ptr()), ldb);
  return out;
}

// This CPU's features as the choices see them, for dtype.
std::tuple<bool, bool, bool, bool, bool, bool> features_of(c10::ScalarType dtype) {
  check_16bit(dtype);
  const Cpu16BitFeatures f = cpu_16bit_features(dtype);
  return {f.amx, f.avx512, f.avx512_bf16, f.avx512_fp16, f.dot_outruns_fma, f.dot_outruns_fp32};
}

// The default choices on a CPU with the given features: (kernel name, 16-bit products by
// default).
std::tuple<std::string, bool> choice_for(bool amx, bool avx512, bool avx512_bf16,
                                         bool avx512_fp16, bool dot_outruns_fma,
                                         bool dot_outruns_fp32, c10::ScalarType dtype) {
  check_16bit(dtype);
  const Cpu16BitFeatures f{amx, avx512, avx512_bf16, avx512_fp16, dot_outruns_fma,
                           dot_outruns_fp32};
  return {gemm16_kernel_name(default_gemm16_kernel(f)), default_16bit_products(f, dtype)};
}

// The timings behind dot_outruns_fma / dot_outruns_fp32 (panels16.h), in seconds per product:
// (bf16 dot, bf16 fma, fp32 brgemm); all 0 where they are not timed (no AVX512-BF16, or AMX).
std::tuple<double, double, double> hot_tile_seconds_of() {
  const Cpu16BitFeatures f = cpu_16bit_features(c10::kBFloat16);
  if (!(f.avx512_bf16 && f.avx512 && !f.amx)) return {0.0, 0.0, 0.0};
  const HotTileSeconds& s = hot_tile_seconds();
  return {s.bf16_dot, s.bf16_fma, s.fp32};
}

int64_t products_run(const std::string& name) {
  return gemm16_products[static_cast<int>(kernel_named(name))].load();
}

}  // namespace
}  // namespace flashattn::cpu

TORCH_LIBRARY(flashattn_test, m) {
  using namespace flashattn::cpu;
  m.def(flashattn::kFwdSchema);
  m.def(flashattn::kBwdSchema);
  m.def(flashattn::kFwdKvcacheSchema);
  m.def("cpu_gemm16(Tensor a, Tensor b, Tensor(a!) c, str kernel, bool accumulate) -> ()",
        &gemm16);
  m.def("cpu_pack_vnni2(Tensor b, int ldb) -> Tensor", &pack_vnni2);
  m.def("cpu_16bit_features(ScalarType dtype) -> (bool, bool, bool, bool, bool, bool)",
        &features_of);
  m.def("cpu_16bit_choice(bool amx, bool avx512, bool avx512_bf16, bool avx512_fp16, "
        "bool dot_outruns_fma, bool dot_outruns_fp32, ScalarType dtype) -> (str, bool)",
        &choice_for);
  m.def("cpu_16bit_products_run(str kernel) -> int", &products_run);
  m.def("cpu_bf16_row_products_run() -> int", &bf16_row_products_run);
  m.def("cpu_bf16_query_lanes_run() -> int", &bf16_query_lanes_run);
  m.def("cpu_16bit_hot_tile_seconds() -> (float, float, float)", &hot_tile_seconds_of);
  m.def("cpu_fwd_packed_heads_peak() -> int", &fwd_packed_heads_peak);
  m.def("cpu_bwd_packed_heads_peak() -> int", &bwd_packed_heads_peak);
}

TORCH_LIBRARY_IMPL(flashattn_test, CPU, m) {
  flashattn::register_attention_ops<flashattn::cpu::CpuExecutor>(m);
}
