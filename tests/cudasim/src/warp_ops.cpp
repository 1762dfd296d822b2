// Shuffles, votes and __syncwarp, with the lane arithmetic of PTX shfl.sync.
#include "collective.h"

namespace cudasim::detail {
namespace {

const char* shuffle_name(ShuffleMode mode) {
  switch (mode) {
    case ShuffleMode::Idx: return "__shfl_sync";
    case ShuffleMode::Up: return "__shfl_up_sync";
    case ShuffleMode::Down: return "__shfl_down_sync";
    case ShuffleMode::Xor: return "__shfl_xor_sync";
  }
  return "?";
}

// PTX shfl.sync: the CUDA intrinsics pass c = ((32 - width) << 8) | clamp, where clamp is 0 for
// .up and 31 otherwise. A lane whose source falls outside its width-segment reads its own value
// (.up/.down), or may read an earlier segment but not a later one (.bfly).
unsigned source_lane(ShuffleMode mode, unsigned lane, int lane_arg, int width) {
  const unsigned segmask = static_cast<unsigned>(kWarpSize - width) & 31u;
  const unsigned b = static_cast<unsigned>(lane_arg) & 31u;
  const unsigned clamp = mode == ShuffleMode::Up ? 0u : 31u;
  const int max_lane = static_cast<int>((lane & segmask) | (clamp & ~segmask));
  const int min_lane = static_cast<int>(lane & segmask);
  int source = 0;
  bool in_range = false;
  switch (mode) {
    case ShuffleMode::Up:
      source = static_cast<int>(lane) - static_cast<int>(b);
      in_range = source >= max_lane;
      break;
    case ShuffleMode::Down:
      source = static_cast<int>(lane + b);
      in_range = source <= max_lane;
      break;
    case ShuffleMode::Xor:
      source = static_cast<int>(lane ^ b);
      in_range = source <= max_lane;
      break;
    case ShuffleMode::Idx:
      source = min_lane | static_cast<int>(b & ~segmask);
      in_range = source <= max_lane;
      break;
  }
  return in_range ? static_cast<unsigned>(source) : lane;
}

bool valid_width(int width) { return width >= 1 && width <= 32 && (width & (width - 1)) == 0; }

}  // namespace

uint64_t shuffle(ShuffleMode mode, unsigned mask, uint64_t bits, int lane_arg, int width,
                 const char* file, int line) {
  const CollectiveCall call{shuffle_name(mode), Site{file, line}, mask, false};
  if (!valid_width(width)) {
    fail(call.site, std::string(call.op) + " with width " + std::to_string(width) +
                        ": width must be a power of 2 in [1, 32]");
  }
  SimThread& self = current_thread(call.op);
  self.mailbox.value = bits;
  self.mailbox.lane_arg = lane_arg;
  self.mailbox.width = width;
  rendezvous(call, [&](SimThread* const* lanes, uint32_t lanes_in) {
    for (unsigned lane = 0; lane < kWarpSize; ++lane) {
      if (!(lanes_in >> lane & 1u)) continue;
      const LaneMailbox& in = lanes[lane]->mailbox;
      const unsigned source = source_lane(mode, lane, in.lane_arg, in.width);
      if (!(lanes_in >> source & 1u)) {
        fail(call.site, std::string(call.op) + ": lane " + std::to_string(lane) + " reads lane " +
                            std::to_string(source) + ", which is not in mask " + hex(lanes_in) +
                            " (the value would be undefined)",
             lanes[lane]);
      }
    }
    count_shuffle(active_block(call.op));
    // Read every operand before writing any result: a lane's result overwrites nothing it feeds.
    uint64_t results[kWarpSize] = {};
    for (unsigned lane = 0; lane < kWarpSize; ++lane) {
      if (!(lanes_in >> lane & 1u)) continue;
      const LaneMailbox& in = lanes[lane]->mailbox;
      results[lane] = lanes[source_lane(mode, lane, in.lane_arg, in.width)]->mailbox.value;
    }
    for (unsigned lane = 0; lane < kWarpSize; ++lane) {
      if (lanes_in >> lane & 1u) lanes[lane]->mailbox.result = results[lane];
    }
  });
  return self.mailbox.result;
}

unsigned vote(VoteMode mode, unsigned mask, bool predicate, const char* file, int line) {
  const char* op = mode == VoteMode::Ballot ? "__ballot_sync"
                   : mode == VoteMode::Any  ? "__any_sync"
                                            : "__all_sync";
  SimThread& self = current_thread(op);
  self.mailbox.predicate = predicate;
  rendezvous(CollectiveCall{op, Site{file, line}, mask, false},
             [&](SimThread* const* lanes, uint32_t lanes_in) {
               uint32_t ballot = 0;
               for (unsigned lane = 0; lane < kWarpSize; ++lane) {
                 if ((lanes_in >> lane & 1u) && lanes[lane]->mailbox.predicate) ballot |= 1u << lane;
               }
               const uint64_t result = mode == VoteMode::Ballot ? ballot
                                       : mode == VoteMode::Any  ? (ballot != 0)
                                                                : (ballot == lanes_in);
               for (unsigned lane = 0; lane < kWarpSize; ++lane) {
                 if (lanes_in >> lane & 1u) lanes[lane]->mailbox.result = result;
               }
             });
  return static_cast<unsigned>(self.mailbox.result);
}

void syncwarp(unsigned mask, const char* file, int line) {
  rendezvous(CollectiveCall{"__syncwarp", Site{file, line}, mask, false},
             [](SimThread* const*, uint32_t) {});
}

}  // namespace cudasim::detail

namespace cudasim::detail {

void red_add_f32x2(float* address, float a, float b, const char* file, int line) {
  const Site site{file, line};
  current_thread("red.global.add.v2.f32");
  if (reinterpret_cast<uintptr_t>(address) % (2 * sizeof(float)) != 0)
    fail(site, "red.global.add.v2.f32: address " + format_address(address) +
                   " is not 8-byte aligned");
  if (counting_on()) count_access(Access::Atomic, address, 2 * sizeof(float), file, line);
  address[0] += a;
  address[1] += b;
}

}  // namespace cudasim::detail
