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
  // By default a small sm_80 for the plan: 8 SMs, so that num_splits = 0 splits small decode
  // calls here too, and the shim's own shared-memory ceiling (cudasim refuses more than sm_90's
  // 227 KB), so the plan's check refuses nothing the GPU builds would run. set_device makes it
  // a compute capability 9.0 device, opted in to the Hopper forward or not.
  static DeviceProps& device() {
    static DeviceProps props{8, 0, /*sm_count=*/8, max_smem_bytes(Arch::kSm90)};
    return props;
  }
  static DeviceProps props(const at::Tensor&) { return device(); }
  // The shim throws cudasim::SimError on any launch error; there is nothing left to check.
  static void check_launch() {}
};

// "forward", "reverse" or "random:SEED": the order warps run in between barriers.
void set_schedule(const std::string& schedule) {
  ::cudasim::set_schedule(::cudasim::parse_schedule(schedule));
}

// When the shim's bulk and tensor copies land (tests/cudasim/README.md): "lazy", "eager",
// "random", or "" for the schedule's default (random under random:SEED, else lazy).
void set_copy_completion(const std::string& completion) {
  if (completion.empty()) {
    ::cudasim::clear_copy_completion();
  } else {
    ::cudasim::set_copy_completion(::cudasim::parse_copy_completion(completion));
  }
}

// torch.ops.flashattn_sim.set_device: the compute capability the shim's executor plans for and
// whether FLASHATTN_CUDA_HOPPER=1 is taken as set (DeviceProps::hopper_fwd); the library's
// executor reads that variable once (api.cu), the shim takes it from here so a test can switch.
void set_device(int64_t cc_major, int64_t cc_minor, bool hopper_fwd) {
  DeviceProps& device = Shim::device();
  device.cc_major = static_cast<int>(cc_major);
  device.cc_minor = static_cast<int>(cc_minor);
  device.hopper_fwd = hopper_fwd;
}

// torch.ops.flashattn_sim.parse_hopper_opt_in: FLASHATTN_CUDA_HOPPER's parser (plan_fwd_sm90.h)
// on a value (None: unset).
bool parse_hopper_opt_in_op(std::optional<std::string> value) {
  const char* text = value ? value->c_str() : nullptr;
  const std::optional<bool> opted_in = parse_hopper_opt_in(text);
  TORCH_CHECK_VALUE(opted_in.has_value(), hopper_opt_in_error(text));
  return *opted_in;
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

using SimExecutor = CudaExecutor<Shim>;

// torch.ops.flashattn_sim.plan_fwd / plan_bwd: the plan (plan_fwd.h, plan_bwd.h) that the
// executor makes for the same arguments as fwd, on a device given by cc_major, cc_minor,
// sm_count and smem_optin_bytes, as JSON (tests/test_cudasim_plan.py).
const char* family_name(KernelFamily family) {
  switch (family) {
    case KernelFamily::kTensorCore:
      return "tensor_core";
    case KernelFamily::kSimt:
      return "simt";
    case KernelFamily::kRows:
      return "rows";
  }
  return "?";
}

const char* arch_name(Arch arch) { return arch == Arch::kSm90 ? "sm90" : "sm80"; }

const char* bwd_kernel_name(BwdKernel kernel) {
  switch (kernel) {
    case BwdKernel::kDotDoO:
      return "dot_do_o";
    case BwdKernel::kDkdv:
      return "dkdv";
    case BwdKernel::kDq:
      return "dq";
    case BwdKernel::kConvertDq:
      return "convert_dq";
  }
  return "?";
}

std::string json_dim3(const dim3& d) {
  return "[" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) +
         "]";
}

std::string json_bool(bool b) { return b ? "true" : "false"; }

// The fields both plans have.
std::string kernels_json(const KernelChoice& k, Arch device_arch, int smem_limit_bytes,
                         int arch_smem_bytes, bool empty) {
  return std::string("\"family\": \"") + family_name(k.family) + "\", \"arch\": \"" +
         arch_name(k.arch) + "\", \"device_arch\": \"" + arch_name(device_arch) +
         "\", \"head_dim_tile\": " + std::to_string(k.head_dim_tile) +
         ", \"head_dim_v_tile\": " + std::to_string(k.head_dim_v_tile) +
         ", \"smem_limit_bytes\": " + std::to_string(smem_limit_bytes) +
         ", \"arch_smem_bytes\": " + std::to_string(arch_smem_bytes) +
         ", \"empty\": " + json_bool(empty);
}

DeviceProps read_device(const OpArguments& args) {
  return {static_cast<int>(args["cc_major"].toInt()), static_cast<int>(args["cc_minor"].toInt()),
          static_cast<int>(args["sm_count"].toInt()),
          static_cast<int>(args["smem_optin_bytes"].toInt()), args["hopper_fwd"].toBool()};
}

void plan_fwd_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpArguments args(op, stack);
  AttnInputs in = read_attn_inputs(args);
  in.num_splits = args["num_splits"].toInt();
  auto [out, lse] = check_and_alloc_fwd(in, SimExecutor::limits());
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  const AttnParams params = make_fwd_params(in, out, lse, mask_blocks);
  const DeviceProps device = read_device(args);
  FwdPlan plan;
  if (is_fp8(in)) {  // the executor's FP8 path (executor.h run_fwd_fp8)
    const std::string refusal = fp8_fwd_refusal(params, device);
    TORCH_CHECK(refusal.empty(), refusal);
    plan = plan_fwd_fp8(params, device);
  } else {
    plan = plan_fwd(params, element_type(in.q.scalar_type()), device);
  }
  const AttnParams& p = plan.params;
  const std::string json =
      "{" +
      kernels_json(plan.kernels, plan.device_arch, plan.smem_limit_bytes, plan.arch_smem_bytes,
                   plan.empty) +
      ", \"fp8\": " + json_bool(plan.fp8) +
      ", \"one_m_tile\": " + json_bool(plan.one_m_tile) +
      ", \"packed_heads\": " + std::to_string(p.packed_heads) +
      ", \"seqlen_q\": " + std::to_string(p.seqlen_q) +
      ", \"heads_q\": " + std::to_string(p.heads_q) +
      ", \"num_splits\": " + std::to_string(p.num_splits) +
      ", \"block_rows\": " + std::to_string(plan.shape.block_rows) +
      ", \"grid\": " + json_dim3(plan.grid) + ", \"block\": " + json_dim3(plan.block) +
      ", \"smem_bytes\": " + std::to_string(plan.shape.smem_bytes) +
      ", \"split_scratch_floats\": " + std::to_string(plan.split_scratch_floats) +
      ", \"fill_split_scratch\": " + json_bool(plan.fill_split_scratch) +
      ", \"merges\": " + json_bool(plan.merges()) +
      ", \"tile_counter\": " + json_bool(fwd_plan_takes_tile_counter(plan, device.sm_count)) + "}";
  args.set_results(json);
}

void plan_bwd_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpArguments args(op, stack);
  const AttnInputs in = read_attn_inputs(args);
  auto [out, lse] = check_and_alloc_fwd(in, SimExecutor::limits());
  const BwdInputs grads{at::empty_like(out), out, lse, std::nullopt,
                        args["grads_fp32"].toBool()};
  auto [dq, dk, dv] = check_and_alloc_bwd(in, grads, SimExecutor::limits());
  const at::Tensor mask_blocks = mask_blocks_of(in.attn_mask);
  const BwdPlan plan =
      plan_bwd(make_bwd_params(in, grads, dq, dk, dv, mask_blocks, at::Tensor()),
               element_type(in.q.scalar_type()), read_device(args));
  std::string steps;
  for (const BwdStep& step : plan.steps) {
    steps += std::string(steps.empty() ? "" : ", ") + "{\"kernel\": \"" +
             bwd_kernel_name(step.kernel) + "\", \"family\": \"" + family_name(step.family) +
             "\", \"grid\": " + json_dim3(step.grid) + ", \"block\": " +
             json_dim3(step.block) + ", \"smem_bytes\": " + std::to_string(step.smem_bytes) +
             "}";
  }
  const std::string json =
      "{" +
      kernels_json(plan.kernels, plan.device_arch, plan.smem_limit_bytes, plan.arch_smem_bytes,
                   plan.empty) +
      ", \"dq_accum\": " + json_bool(plan.dq_accum) +
      ", \"workspace_floats\": " + std::to_string(plan.workspace_floats) +
      ", \"smem_bytes\": " + std::to_string(plan.smem_bytes) + ", \"steps\": [" + steps +
      "]}";
  args.set_results(json);
}

// torch.ops.flashattn_sim.fwd_split: fwd with num_splits (fwd_kvcache's argument; fwd itself
// has none), so that the tests run split-KV on calls fwd_kvcache does not take (varlen batches,
// attn_mask, top-left alignment; the FP8 forward's among them).
void fwd_split_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpArguments args(op, stack);
  AttnInputs in = read_attn_inputs(args);
  in.num_splits = args["num_splits"].toInt();
  run_fwd_op<SimExecutor>(args, in);
}

// fwd's schema renamed, with the device's properties after its arguments.
std::string plan_schema(const char* name, const char* extra) {
  return std::string(name) + "(" FLASHATTN_ATTN_ARGUMENTS + extra +
         ", int cc_major=8, int cc_minor=0, int sm_count=8, int smem_optin_bytes=" +
         std::to_string(max_smem_bytes(Arch::kSm80)) + ", bool hopper_fwd=False) -> str";
}

}  // namespace
}  // namespace flashattn::cuda

// The same schema strings as torch.ops.flashattn (csrc/schema.h), plus the shim's schedule
// switch and counters.
TORCH_LIBRARY(flashattn_sim, m) {
  m.def(flashattn::kFwdSchema);
  m.def(flashattn::kBwdSchema);
  m.def(flashattn::kFwdKvcacheSchema);
  m.def("set_schedule(str schedule) -> ()", &flashattn::cuda::set_schedule);
  m.def("set_copy_completion(str completion) -> ()", &flashattn::cuda::set_copy_completion);
  m.def("set_device(int cc_major, int cc_minor, bool hopper_fwd) -> ()",
        &flashattn::cuda::set_device);
  m.def("parse_hopper_opt_in(str? value) -> bool", &flashattn::cuda::parse_hopper_opt_in_op);
  for (const char* name : flashattn::cuda::kReplacedCudaOps)
    if (flashattn::aten_has_op(name))
      m.def(flashattn::cuda::aten_schema_without_namespace(name).c_str());
  m.def("counters_enable(bool on) -> ()", &flashattn::cuda::counters_enable);
  m.def("counters_reset() -> ()", &flashattn::cuda::counters_reset);
  m.def("counters_json() -> str", &flashattn::cuda::counters_json);
  m.def(flashattn::cuda::plan_schema("plan_fwd", ", int num_splits=1").c_str());
  m.def(flashattn::cuda::plan_schema("plan_bwd", ", bool grads_fp32=False").c_str());
  m.def("fwd_split(" FLASHATTN_ATTN_ARGUMENTS ", int num_splits=1) -> (Tensor out, Tensor lse)");
}

TORCH_LIBRARY_IMPL(flashattn_sim, CPU, m) {
  using flashattn::cuda::SimExecutor;
  flashattn::register_attention_ops<SimExecutor>(m);
  flashattn::register_cuda_sdpa_impl<SimExecutor>(m);
  m.impl("plan_fwd",
         torch::CppFunction::makeFromBoxedFunction<&flashattn::cuda::plan_fwd_op>());
  m.impl("plan_bwd",
         torch::CppFunction::makeFromBoxedFunction<&flashattn::cuda::plan_bwd_op>());
  m.impl("fwd_split",
         torch::CppFunction::makeFromBoxedFunction<&flashattn::cuda::fwd_split_op>());
}
