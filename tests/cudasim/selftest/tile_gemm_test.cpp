// Runs tile_gemm_kernel (one variant, named on the command line) on the shim and compares it
// with a scalar reference. Inputs are small integers, so every product and sum is exact in
// f16/f32 and the comparison is exact.
//   tile_gemm_test VARIANT VALID_ROWS
// Exit status: 0 = matches, 1 = wrong results, 3 = the shim raised SimError (printed).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/launch.cuh"
#include "tile_gemm_kernel.cuh"

using namespace tile_gemm;

namespace {

struct Problem {
  int valid_rows;
  std::vector<__half> a, bt, w;  // exact sizes: a tail over-read leaves the heap block
  std::vector<float> c, d, row_max;
};

std::vector<__half> random_small_ints(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(-2, 2);
  std::vector<__half> v(n);
  for (auto& x : v) x = __float2half_rn(static_cast<float>(dist(rng)));
  return v;
}

template <PlantedBug kBug>
void run(Problem& p) {
  auto kernel = &tile_gemm_kernel<kBug>;
  FLASHATTN_LAUNCH_KERNEL(kernel, dim3(1), dim3(kThreads), kSmemBytes, cudaStream_t{}, p.a.data(),
                          p.bt.data(), p.w.data(), p.c.data(), p.d.data(), p.row_max.data(),
                          p.valid_rows);
}

int check(const Problem& p) {
  int wrong = 0;
  for (int i = 0; i < p.valid_rows; ++i) {
    float s[kCols], expected_max = -INFINITY;
    for (int j = 0; j < kCols; ++j) {
      s[j] = 0.f;
      for (int k = 0; k < kDepth; ++k) {
        s[j] += __half2float(p.a[i * kDepth + k]) * __half2float(p.bt[j * kDepth + k]);
      }
      expected_max = std::fmax(expected_max, s[j]);
      wrong += !(p.c[i * kCols + j] == s[j]);
    }
    for (int j = 0; j < kCols; ++j) {
      float d = 0.f;
      for (int k = 0; k < kCols; ++k) d += s[k] * __half2float(p.w[k * kCols + j]);
      wrong += !(p.d[i * kCols + j] == d);
    }
    wrong += !(p.row_max[i] == expected_max);
  }
  std::printf("%d of %d outputs differ from the reference\n", wrong, p.valid_rows * (2 * kCols + 1));
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s VARIANT VALID_ROWS\n", argv[0]);
    return 64;
  }
  const std::string variant = argv[1];
  Problem p;
  p.valid_rows = std::atoi(argv[2]);
  std::mt19937 rng(1234);
  p.a = random_small_ints(static_cast<size_t>(p.valid_rows) * kDepth, rng);
  p.bt = random_small_ints(kCols * kDepth, rng);
  p.w = random_small_ints(kCols * kCols, rng);
  p.c.assign(static_cast<size_t>(p.valid_rows) * kCols, NAN);  // poison: unwritten shows up
  p.d = p.c;
  p.row_max.assign(p.valid_rows, NAN);
  try {
    if (variant == "correct") run<PlantedBug::None>(p);
    else if (variant == "missing_sync_before_reuse") run<PlantedBug::MissingSyncBeforeReuse>(p);
    else if (variant == "missing_sync_before_store") run<PlantedBug::MissingSyncBeforeStore>(p);
    else if (variant == "missing_wait") run<PlantedBug::MissingWait>(p);
    else if (variant == "wrong_shuffle_xor") run<PlantedBug::WrongShuffleXor>(p);
    else if (variant == "missing_trans") run<PlantedBug::MissingTrans>(p);
    else if (variant == "tail_overread") run<PlantedBug::TailOverread>(p);
    else {
      std::fprintf(stderr, "unknown variant %s\n", variant.c_str());
      return 64;
    }
  } catch (const cudasim::SimError& e) {
    std::fprintf(stderr, "SimError: %s\n", e.what());
    return 3;
  }
  return check(p);
}
