// The sm_90a forward's tile order (csrc/cuda/hopper/fwd_sm90_tile_order.h), on the host.
//   hopper_tile_order_test bijection | work | sections
//   hopper_tile_order_test work_list natural|ordered SQ SK D CAUSAL BATCH HEADS
// bijection: over awkward lengths, splits 1 and 3, several heads and batches, causal (both
// alignments), local windows and neither, with the computed sections and forced small ones, every
// (query block, part, head, batch) of the grid is the tile of exactly one launch place, and a
// walk's place (fwd_sm90_tile_at) takes its grid CTA's tile, with as many places as tiles.
// work: in launch order, the key tiles of each CTA (KeyTiles, as the kernel counts them) never
// grow within a section for causal and one-edged windows: CTA by CTA within a query block, and
// query block by query block (from one block to the next, split-KV's parts may grow by one tile,
// and within one in the grid's own order, which a window whose ends agree keeps); a two-edged
// window starts at its heavier end.
// sections: the section sizes at the shapes (N = 1024 and 4096).
// work_list: the key tiles + 1 of every CTA in launch order, for tools/hopper_tile_order.py.
// Exit status: 0 = every check held ("ok: " lines), 1 = one failed (printed), 2 = bad arguments.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/hopper/fwd_sm90_config.h"
#include "cuda/hopper/fwd_sm90_tile_order.h"

namespace {

using flashattn::hopper::FwdSm90Params;
using flashattn::hopper::FwdSm90Tile;
using flashattn::hopper::FwdSm90TileOrder;
using flashattn::hopper::KeyTiles;

// The forward's query rows per CTA, at every head dim.
constexpr int kBlockM = flashattn::hopper::FwdSm90Config<128>::kBlockM;
static_assert(kBlockM == flashattn::hopper::FwdSm90Config<64>::kBlockM &&
              kBlockM == flashattn::hopper::FwdSm90Config<256>::kBlockM, "one kBlockM");
const int kLengths[] = {1, 7, 63, 65, 127, 129, 257};

enum class Mask { kNone, kCausal, kLocal };

struct Window {
  int left, right;
};
const Window kWindows[] = {{-1, 0}, {40, -1}, {-1, 3}, {100, 0}, {0, 130}, {200, 200}};

struct Case {
  Mask mask;
  int seqlen_q, seqlen_k, splits, heads, batch, head_group;
  bool top_left;
  Window window;
};

std::string describe(const Case& c, int section) {
  char text[200];
  std::snprintf(text, sizeof text, "mask %d Sq %d Sk %d splits %d heads %d batch %d top_left %d window (%d, %d) section %d",
                static_cast<int>(c.mask), c.seqlen_q, c.seqlen_k, c.splits, c.heads, c.batch,
                c.top_left ? 1 : 0, c.window.left, c.window.right, section);
  return text;
}

FwdSm90Params params_of(const Case& c) {
  FwdSm90Params p;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k;
  p.heads_q = c.heads;
  p.head_group = c.head_group;
  p.batch = c.batch;
  p.num_splits = c.splits;
  p.align_bottom_right = !c.top_left;
  p.window_left = c.window.left;
  p.window_right = c.window.right;
  return p;
}

// The kernel's order of this case, at its tile sizes.
template <int kHeadDim>
FwdSm90TileOrder order_of(const Case& c) {
  constexpr int N = flashattn::hopper::FwdSm90Config<kHeadDim>::kBlockN;
  const FwdSm90Params p = params_of(c);
  using flashattn::hopper::fwd_sm90_tile_order;
  if (c.mask == Mask::kCausal) return fwd_sm90_tile_order<true, false, kHeadDim, kBlockM, N>(p);
  if (c.mask == Mask::kLocal) return fwd_sm90_tile_order<false, true, kHeadDim, kBlockM, N>(p);
  return fwd_sm90_tile_order<false, false, kHeadDim, kBlockM, N>(p);
}

// Key tiles the kernel visits for this tile (its KeyTiles and keep_part).
template <int kHeadDim>
int key_tiles(const Case& c, const FwdSm90Tile& t) {
  constexpr int N = flashattn::hopper::FwdSm90Config<kHeadDim>::kBlockN;
  using flashattn::hopper::causal_diag_offset;
  using flashattn::hopper::key_window;
  const int offset = causal_diag_offset(!c.top_left, c.seqlen_q, c.seqlen_k);
  auto count = [&](auto tiles) {
    if (c.splits > 1) tiles.keep_part(t.split, c.splits);
    return tiles.n_blocks;
  };
  if (c.mask == Mask::kCausal)
    return count(KeyTiles<true, false, kBlockM, N>(t.m_block, c.seqlen_q, c.seqlen_k,
                                                   key_window<true, false>(offset, -1, 0)));
  if (c.mask == Mask::kLocal)
    return count(KeyTiles<false, true, kBlockM, N>(t.m_block, c.seqlen_q, c.seqlen_k,
                                                   key_window<false, true>(offset, c.window.left, c.window.right)));
  return count(KeyTiles<false, false, kBlockM, N>(t.m_block, c.seqlen_q, c.seqlen_k,
                                                  key_window<false, false>(offset, -1, -1)));
}

// The tiles of every launch place, in launch order (x fastest, then y, then z).
std::vector<FwdSm90Tile> launch_order(const FwdSm90TileOrder& o) {
  std::vector<FwdSm90Tile> tiles;
  for (int z = 0; z < o.batches; ++z)
    for (int y = 0; y < o.heads; ++y)
      for (int x = 0; x < o.m_blocks * o.splits; ++x) tiles.push_back(fwd_sm90_tile(o, x, y, z));
  return tiles;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  const int shapes[][3] = {{1, 1, 1}, {3, 1, 1}, {2, 2, 1}, {4, 3, 2}};  // heads, batch, head_group
  for (int sq : kLengths)
    for (int sk : kLengths)
      for (int splits : {1, 3})
        for (const auto& s : shapes) {
          all.push_back({Mask::kNone, sq, sk, splits, s[0], s[1], s[2], false, {-1, -1}});
          for (bool top_left : {false, true})
            all.push_back({Mask::kCausal, sq, sk, splits, s[0], s[1], s[2], top_left, {-1, 0}});
          for (const Window& w : kWindows)
            all.push_back({Mask::kLocal, sq, sk, splits, s[0], s[1], s[2], false, w});
        }
  return all;
}

// The orders a case is checked in: the kernel's, and the same with sections of 1, 2 and 3 pairs.
template <int kHeadDim>
std::vector<FwdSm90TileOrder> orders_of(const Case& c) {
  const FwdSm90TileOrder kernel = order_of<kHeadDim>(c);
  std::vector<FwdSm90TileOrder> orders = {kernel};
  for (int section : {1, 2, 3}) {
    FwdSm90TileOrder o = kernel;
    o.section = section;
    orders.push_back(o);
  }
  return orders;
}

template <int kHeadDim>
int check_bijection() {
  int checked = 0;
  for (const Case& c : cases()) {
    for (const FwdSm90TileOrder& o : orders_of<kHeadDim>(c)) {
      const int m_blocks = (c.seqlen_q + kBlockM - 1) / kBlockM;
      if (o.m_blocks != m_blocks || o.splits != c.splits || o.heads != c.heads || o.batches != c.batch) {
        std::printf("FAIL: the order's shape is not the grid's: %s\n", describe(c, o.section).c_str());
        return 1;
      }
      std::vector<int> seen(static_cast<size_t>(m_blocks) * c.splits * c.heads * c.batch, 0);
      for (const FwdSm90Tile& t : launch_order(o)) {
        if (t.m_block < 0 || t.m_block >= m_blocks || t.split < 0 || t.split >= c.splits || t.head < 0 ||
            t.head >= c.heads || t.batch < 0 || t.batch >= c.batch) {
          std::printf("FAIL: tile (%d, %d, %d, %d) outside the grid: %s\n", t.m_block, t.split, t.head, t.batch,
                      describe(c, o.section).c_str());
          return 1;
        }
        ++seen[((static_cast<size_t>(t.batch) * c.heads + t.head) * m_blocks + t.m_block) * c.splits + t.split];
      }
      for (int n : seen) {
        if (n != 1) {
          std::printf("FAIL: a tile taken %d times: %s\n", n, describe(c, o.section).c_str());
          return 1;
        }
      }
      // A walk's places (fwd_sm90_tile_at) are the grid's CTAs, place by place.
      const std::vector<FwdSm90Tile> grid = launch_order(o);
      if (flashattn::hopper::fwd_sm90_tile_places(o) != grid.size()) {
        std::printf("FAIL: %u places for %zu tiles: %s\n", flashattn::hopper::fwd_sm90_tile_places(o), grid.size(),
                    describe(c, o.section).c_str());
        return 1;
      }
      for (size_t place = 0; place < grid.size(); ++place) {
        const FwdSm90Tile t = flashattn::hopper::fwd_sm90_tile_at(o, static_cast<unsigned>(place));
        const FwdSm90Tile& g = grid[place];
        if (t.m_block != g.m_block || t.split != g.split || t.head != g.head || t.batch != g.batch) {
          std::printf("FAIL: place %zu takes tile (%d, %d, %d, %d), its grid CTA (%d, %d, %d, %d): %s\n", place,
                      t.m_block, t.split, t.head, t.batch, g.m_block, g.split, g.head, g.batch,
                      describe(c, o.section).c_str());
          return 1;
        }
      }
      ++checked;
    }
  }
  std::printf("ok: bijection d=%d, %d orders, every walk place its grid CTA\n", kHeadDim, checked);
  return 0;
}

// Whether a local window's work is monotone along the query blocks: one edge only.
bool one_edged(const Window& w) { return (w.left < 0) != (w.right < 0); }

template <int kHeadDim>
int check_work() {
  int checked = 0;
  for (const Case& c : cases()) {
    if (c.mask == Mask::kNone) continue;
    for (const FwdSm90TileOrder& o : orders_of<kHeadDim>(c)) {
      const std::vector<FwdSm90Tile> tiles = launch_order(o);
      const size_t per_section = static_cast<size_t>(o.section) * o.m_blocks * o.splits;
      for (size_t begin = 0; begin < tiles.size(); begin += per_section) {
        const size_t end = begin + per_section < tiles.size() ? begin + per_section : tiles.size();
        std::vector<int> work, block_work;  // per CTA; per query block, over the section
        for (size_t i = begin; i < end; ++i) {
          work.push_back(key_tiles<kHeadDim>(c, tiles[i]));
          if (i == begin || tiles[i].m_block != tiles[i - 1].m_block) block_work.push_back(0);
          block_work.back() += work.back();
        }
        const bool monotone = c.mask == Mask::kCausal || one_edged(c.window);
        for (size_t i = 1; monotone && i < work.size(); ++i) {
          const bool same_block = tiles[begin + i].m_block == tiles[begin + i - 1].m_block;
          if (work[i] > work[i - 1] && (c.splits == 1 || (same_block && o.direction != 0) || work[i] > work[i - 1] + 1)) {
            std::printf("FAIL: CTA %zu of a section visits %d key tiles, the one before it %d: %s\n", i,
                        work[i], work[i - 1], describe(c, o.section).c_str());
            return 1;
          }
        }
        for (size_t i = 1; monotone && i < block_work.size(); ++i) {
          if (block_work[i] > block_work[i - 1]) {
            std::printf("FAIL: query block %zu of a section visits %d key tiles, the one before it %d: %s\n", i,
                        block_work[i], block_work[i - 1], describe(c, o.section).c_str());
            return 1;
          }
        }
        if (block_work.front() < block_work.back()) {
          std::printf("FAIL: a section starts at its lighter end (%d < %d key tiles): %s\n", block_work.front(),
                      block_work.back(), describe(c, o.section).c_str());
          return 1;
        }
      }
      ++checked;
    }
  }
  std::printf("ok: work never grows in launch order, d=%d, %d orders\n", kHeadDim, checked);
  return 0;
}

// The sections at the shape (16k tokens, hidden 2048: B = 16k / N, Hq = 2048 / d).
int check_sections() {
  struct Expect {
    int seqlen, head_dim, head_group, section;
  };
  // K and V of one head: N x d x 2 tensors x 2 bytes; 32 MiB of them per section.
  const Expect expected[] = {{4096, 128, 1, 16}, {4096, 64, 1, 32}, {4096, 256, 1, 8}, {4096, 128, 4, 64},
                             {1024, 128, 1, 64}, {131072, 128, 1, 1}, {131072, 128, 8, 8}};
  for (const Expect& e : expected) {
    Case c{Mask::kCausal, e.seqlen, e.seqlen, 1, 2048 / e.head_dim, 16384 / e.seqlen, e.head_group, false, {-1, 0}};
    if (c.batch < 1) c.batch = 1;
    const FwdSm90TileOrder o = e.head_dim == 64    ? order_of<64>(c)
                               : e.head_dim == 128 ? order_of<128>(c)
                                                   : order_of<256>(c);
    if (o.section != e.section || o.direction != -1) {
      std::printf("FAIL: N %d d %d group %d: section %d direction %d, expected %d and -1\n", e.seqlen, e.head_dim,
                  e.head_group, o.section, o.direction, e.section);
      return 1;
    }
  }
  std::printf("ok: sections\n");
  return 0;
}

// key tiles + 1 per CTA in launch order (gpu_model's CTA weight), natural or the kernel's order.
template <int kHeadDim>
int work_list(bool ordered, const Case& c) {
  FwdSm90TileOrder o = order_of<kHeadDim>(c);
  if (!ordered) o.direction = 0;
  for (const FwdSm90Tile& t : launch_order(o)) std::printf("%d ", key_tiles<kHeadDim>(c, t) + 1);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "bijection") return check_bijection<128>() | check_bijection<256>();
  if (mode == "work") return check_work<128>() | check_work<256>();
  if (mode == "sections") return check_sections();
  if (mode == "work_list" && argc == 9) {
    const bool ordered = std::strcmp(argv[2], "ordered") == 0;
    const int d = std::atoi(argv[5]);
    const Case c{std::atoi(argv[6]) ? Mask::kCausal : Mask::kNone, std::atoi(argv[3]), std::atoi(argv[4]), 1,
                 std::atoi(argv[8]), std::atoi(argv[7]), 1, false, {-1, std::atoi(argv[6]) ? 0 : -1}};
    if (d == 64) return work_list<64>(ordered, c);
    if (d == 128) return work_list<128>(ordered, c);
    if (d == 256) return work_list<256>(ordered, c);
  }
  std::fprintf(stderr,
               "usage: %s bijection | work | sections | work_list natural|ordered SQ SK D CAUSAL BATCH HEADS\n",
               argv[0]);
  return 2;
}
