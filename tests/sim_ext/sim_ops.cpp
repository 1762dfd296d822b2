// torch.ops.flashattn_sim: the CUDA kernels' own source, compiled by g++ against the CPU shim
// (tests/cudasim), behind the same schemas, input checks, parameter setup, dispatch, grid and
// launch code as torch.ops.flashattn on CUDA. Tensors are CPU tensors and the kernels' "device"
// pointers are host pointers. Test-only; see build.py. The kernels themselves are instantiated
// in sim_kernels_fwd.cpp / sim_kernels_bwd.cpp, as inst/*.cu are for nvcc.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cuda/executor.h"
#include "cudasim.h"
#include "op_glue.h"
#include "schema.h"
#include "sdpa_impl.h"

namespace flashattn::cuda {
namespace {

struct Shim {
  static constexpr const char* kExecutorName = "CUDA (cudasim)";
  struct Guard {
    explicit Guard(const at::Device&) {}  // one "device": the CPU
  };
  static cudaStream_t stream(const at::Tensor&) { return nullptr; }
  // The shim gives a block whatever shared memory it declares; the GPU's limits are checked
  // by api.cu on hardware.
  static void check_smem_fits(int64_t /*needed_bytes*/, const at::Tensor& /*q*/) {}
  // The shim throws cudasim::SimError on any launch error; there is nothing left to check.
  static void check_launch() {}
  // A small GPU for the split-KV heuristic, so that num_splits = 0 splits small decode calls
  // here too.
  static int sm_count(const at::Tensor&) { return 8; }
};

// "forward", "reverse" or "random:SEED": the order warps run in between barriers.
void set_schedule(const std::string& schedule) {
  ::cudasim::set_schedule(::cudasim::parse_schedule(schedule));
}

// ATen's CUDA flash-attention ops that sdpa_impl.h replaces, whose schemas the sim repeats
// under flashattn_sim so the tests run the replacements on the shim with CPU tensors.
constexpr const char* kReplacedCudaOps[] = {
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward",
    "_flash_attention_forward_no_dropout_inplace"};

// An ATen op's schema as a definition in another namespace: "name(args) -> results".
std::string aten_schema_without_namespace(const char* name) {
  const std::string schema = c10::toString(
      c10::Dispatcher::singleton().findSchemaOrThrow((std::string("aten::") + name).c_str(), "")
          .schema());
  return schema.substr(schema.find("::") + 2);
}

// The shim's counters (tests/cudasim/README.md, "Counters"): tools/gpu_model.py reads them.
void counters_enable(bool on) { ::cudasim::enable_counters(on); }
void counters_reset() { ::cudasim::reset_counters(); }
std::string counters_json() { return ::cudasim::counters_json(); }

}  // namespace
}  // namespace flashattn::cuda

// The same schema strings as torch.ops.flashattn (csrc/schema.h), plus the shim's schedule
// switch and counters.
TORCH_LIBRARY(flashattn_sim, m) {
  m.def(flashattn::kFwdSchema);
  m.def(flashattn::kBwdSchema);
  m.def(flashattn::kFwdKvcacheSchema);
  m.def("set_schedule(str schedule) -> ()", &flashattn::cuda::set_schedule);
  for (const char* name : flashattn::cuda::kReplacedCudaOps)
    if (flashattn::aten_has_op(name))
      m.def(flashattn::cuda::aten_schema_without_namespace(name).c_str());
  m.def("counters_enable(bool on) -> ()", &flashattn::cuda::counters_enable);
  m.def("counters_reset() -> ()", &flashattn::cuda::counters_reset);
  m.def("counters_json() -> str", &flashattn::cuda::counters_json);
}

TORCH_LIBRARY_IMPL(flashattn_sim, CPU, m) {
  using SimExecutor = flashattn::cuda::CudaExecutor<flashattn::cuda::Shim>;
  flashattn::register_attention_ops<SimExecutor>(m);
  flashattn::register_cuda_sdpa_impl<SimExecutor>(m);
}
