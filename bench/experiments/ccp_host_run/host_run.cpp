// The device code of kernels/causal_conv3d_cat_pad.cuh run on the host (a check without a GPU,
// not part of the library or of ctest): each warp of a grid as 32 threads (shim.h), every load
// checked to be aligned and to meet x or cache, every 16-byte store to lie in out, and out against
// a cat-then-pad reference, byte for byte, with each byte of out stored at most once by a 16-byte
// store and nothing outside out written. Every kernel (the one ccp_path picks, and for unaligned
// rows of 16 bytes or more the others of parts, general and chunks that serve the call too), both
// index widths, grids of 1 x 32
// and 3 x 64 threads. Prints one line per run and the loads against the source
// granules. Built by run.sh.
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "causal_conv3d_cat_pad.cuh"

using namespace ditops;

namespace host_run {
const unsigned char *x_begin, *x_end, *cache_begin, *cache_end;
unsigned char *out_begin, *out_end;
std::vector<std::atomic<int>>* stores;
std::atomic<long long> loads;
bool load_ok(const void* p, int n) {
  if (p == &ccp_detail::ccp_zero_granule) return true;
  ++loads;
  const auto* a = static_cast<const unsigned char*>(p);
  return (a < x_end && a + n > x_begin) || (cache_begin && a < cache_end && a + n > cache_begin);
}
bool store_ok(void* p, int n) {
  auto* a = static_cast<unsigned char*>(p);
  if (a < out_begin || a + n > out_end) return false;
  for (int i = 0; i < n; ++i) ++(*stores)[a - out_begin + i];
  return true;
}
}  // namespace host_run

struct Case {
  long long B, C, T, H, W, ct;  // ct < 0: no cache
  long long wl, wr, ht, hb, dl, dr;
  int es;
  bool channels_last;
  int offset;  // elements every pointer lies past 16 bytes
  int x_offset = -1, cache_offset = -1;  // x's and cache's own (-1: offset)
};

template <int kBytes, int kPath, bool kIndex64>
void launch(const CausalConv3dCatPadParams& p, unsigned grid, unsigned block) {
  gridDim.x = grid;
  blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned w = 0; w < block / 32; ++w) {
      std::barrier<> meet(32);
      host_run::Warp warp{&meet, {}};
      std::vector<std::thread> lanes;
      for (int l = 0; l < 32; ++l)
        lanes.emplace_back([&, l] {
          host_run::warp = &warp;
          host_run::lane = l;
          threadIdx.x = w * 32 + l;
          blockIdx.x = b;
          causal_conv3d_cat_pad<kBytes, kPath, false, kIndex64>(p);
        });
      for (auto& t : lanes) t.join();
    }
}

const char* path_name(int path) {
  return path == kCcpAligned ? "aligned" : path == kCcpParts ? "parts" : path == kCcpChunks ? "chunks" : "general";
}

// "" or what went wrong; *path_out the kernel run: ccp_path's where `other` < 0, else `other`
// (parts, general or chunks), -1 where that is ccp_path's own, the call is aligned or its rows are
// under 16 bytes, or (chunks) ccp_chunks_fit fails: nothing run.
std::string run(const Case& c, bool index64, int other, unsigned grid, unsigned block, std::mt19937& rng,
                int* path_out, long long* loads, long long* granules) {
  const long long ct = c.ct < 0 ? 0 : c.ct;
  const long long To = c.T + c.dl + c.dr, Ho = c.H + c.ht + c.hb, Wo = c.W + c.wl + c.wr;
  const long long nx = c.B * c.C * c.T * c.H * c.W, nc = c.B * c.C * ct * c.H * c.W, no = c.B * c.C * To * Ho * Wo;
  const int es = c.es;
  std::vector<unsigned char> xs((nx + 64) * es + 64), cs((nc + 64) * es + 64), os((no + 64) * es + 64, 0xA5);
  for (auto& v : xs) v = static_cast<unsigned char>(rng());
  for (auto& v : cs) v = static_cast<unsigned char>(rng());
  auto on16 = [](std::vector<unsigned char>& v) {
    return v.data() + (16 - (reinterpret_cast<uintptr_t>(v.data()) & 15)) % 16 + 16;
  };
  unsigned char* x = on16(xs) + (c.x_offset < 0 ? c.offset : c.x_offset) * es;
  unsigned char* cache = on16(cs) + (c.cache_offset < 0 ? c.offset : c.cache_offset) * es;
  unsigned char* out = on16(os) + c.offset * es;
  auto at = [&](long long b, long long ch, long long t, long long h, long long w, long long T_, long long H_,
                long long W_) {  // storage offset in elements
    return c.channels_last ? (((b * T_ + t) * H_ + h) * W_ + w) * c.C + ch : (((b * c.C + ch) * T_ + t) * H_ + h) * W_ + w;
  };
  std::vector<unsigned char> want(no * es, 0);
  for (long long b = 0; b < c.B; ++b)
    for (long long ch = 0; ch < c.C; ++ch)
      for (long long t = 0; t < To; ++t)
        for (long long h = 0; h < Ho; ++h)
          for (long long w = 0; w < Wo; ++w) {
            const long long st = t - (c.dl - ct), ih = h - c.ht, iw = w - c.wl;
            if (st < 0 || st >= ct + c.T || ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
            const unsigned char* s = st < ct ? cache + at(b, ch, st, ih, iw, ct, c.H, c.W) * es
                                             : x + at(b, ch, st - ct, ih, iw, c.T, c.H, c.W) * es;
            std::memcpy(&want[at(b, ch, t, h, w, To, Ho, Wo) * es], s, es);
          }
  if (no == 0) return "";
  // The row model, as the op fills it.
  CausalConv3dCatPadParams p{};
  const long long inner = (c.channels_last ? c.C : 1) * es;
  p.x = x;
  p.cache = ct > 0 ? cache : nullptr;
  p.out = out;
  p.row_bytes = Wo * inner, p.head_bytes = c.wl * inner, p.run_bytes = c.W * inner;
  p.rows_out = Ho, p.frames_out = To, p.src_rows = c.H, p.x_frames = c.T, p.cache_frames = ct;
  p.frame_offset = c.dl - ct, p.row_offset = c.ht;
  ccp_finish_params(p, (c.channels_last ? c.B : c.B * c.C) * To * Ho, index64);
  int path = ccp_path(p);
  if (other >= 0 && (other == path || path == kCcpAligned || p.row_bytes < kCcpPartsMinRowBytes ||
                     (other == kCcpChunks && !ccp_chunks_fit(p)))) {
    *path_out = -1;
    return "";
  }
  if (other >= 0) path = other;
  *path_out = path;
  std::vector<std::atomic<int>> stores(no * es);
  host_run::x_begin = x, host_run::x_end = x + nx * es;
  host_run::cache_begin = p.cache ? cache : nullptr, host_run::cache_end = cache + nc * es;
  host_run::out_begin = out, host_run::out_end = out + no * es;
  host_run::stores = &stores;
  host_run::loads = 0;
  auto go = [&](auto bytes) {
    constexpr int kB = decltype(bytes)::value;
    auto with = [&](auto k) {
      constexpr int kP = decltype(k)::value;
      if (index64) launch<kB, kP, true>(p, grid, block);
      else launch<kB, kP, false>(p, grid, block);
    };
    if (path == kCcpAligned) with(std::integral_constant<int, kCcpAligned>{});
    else if (path == kCcpParts) with(std::integral_constant<int, kCcpParts>{});
    else if (path == kCcpChunks) with(std::integral_constant<int, kCcpChunks>{});
    else with(std::integral_constant<int, kCcpGeneral>{});
  };
  if (es == 2) go(std::integral_constant<int, 2>{});
  else go(std::integral_constant<int, 4>{});
  *loads = host_run::loads;
  *granules = (nx * es + 15) / 16 + (nc * es + 15) / 16;
  for (long long i = 0; i < no * es; ++i)
    if (out[i] != want[i]) return "byte " + std::to_string(i) + " of out differs";
  for (long long i = 0; i < no * es; ++i)
    if (stores[i] > 1) return "byte " + std::to_string(i) + " stored " + std::to_string(int(stores[i])) + " times";
  for (const unsigned char* q = os.data(); q < os.data() + os.size(); ++q)
    if ((q < out || q >= out + no * es) && *q != 0xA5) return "a byte outside out was written";
  return "";
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  std::vector<Case> cases;
  for (int es : {2, 4})
    for (bool cl : {false, true})
      for (int off : {0, 1, 3}) {
        const long long w16 = 16 / es;
        for (const Case& s : std::vector<Case>{
                 {1, 16, 1, 7, 13, 1, 1, 1, 1, 1, 1, 0}, {1, 8, 2, 15, 26, 2, 1, 1, 1, 1, 2, 0},
                 {1, 3, 5, 7, 9, 3, 2, 1, 0, 3, 4, 2},   {2, 5, 3, 4, 7, -1, 1, 2, 1, 0, 2, 0},
                 {1, 7, 1, 3, 3, 2, 3, 0, 2, 2, 5, 1},   {2, 1, 2, 3, 5, 1, 1, 1, 1, 1, 1, 0},
                 {1, 2, 2, 1, 1, 2, 0, 7, 0, 0, 2, 3},   {1, 33, 2, 17, 61, 1, 3, 2, 1, 1, 1, 0},
                 {1, 16, 1, 8, 64, 0, 8, 8, 0, 0, 0, 0}, {1, 4, 2, 6, 52, 2, 1, 1, 1, 1, 2, 0},
                 {1, 2, 2, 6, 104, 1, 1, 1, 1, 1, 1, 0}, {1, 2, 2, 3, 640, 2, 1, 1, 1, 1, 2, 0},
                 {2, 5, 3, 4, 7, -1, 0, 0, 0, 0, 0, 0},  {1, 9, 3, 2, 11, 0, 1, 1, 1, 1, 0, 0},
                 {1, 16, 2, 3, 8, 2, 0, 0, 0, 0, 2, 0},  {1, 8, 2, 3, 5, 1, 0, 0, 1, 0, 1, 0},
                 {2, cl ? w16 : 5, 3, 1, cl ? 1 : w16, 1, 0, 0, 0, 0, 2, 1},  // 16-byte rows, frames of a row
                 {1, 4, 3, 6, 13, 2, 1, 2, 0, 0, 2, 0},  // frames back to back
                 {2, 3, 2, 5, 3, 1, 0, 1, 0, 0, 1, 1},   // rows under 16 bytes
                 {1, 8, 3, 40, 9, 2, 1, 1, 1, 1, 3, 1},
                 // The chunks kernel: runs of 64 bytes and more, pads adding 4 or 8 bytes.
                 {1, 3, 2, 5, 64 / es, 1, 1, 1, 0, 0, 1, 0},   // runs of one chunk, frames back to back
                 {2, 3, 3, 4, 40, 2, 2, 0, 0, 1, 2, 1},        // pads (2, 0)
                 {1, 3, 2, 7, 33, 1, 0, 2, 1, 0, 1, 0},        // pads (0, 2), odd W
                 {1, 2, 2, 3, 52 / (es / 2), -1, 1, 1, 1, 1, 1, 1}}) {  // no cache
          Case v = s;
          v.es = es, v.channels_last = cl, v.offset = off;
          cases.push_back(v);
        }
      }
  // Long NCTHW rows (W = 640, pads 1 and 1: runs of 1280 and 2560 bytes, the chunks kernel at
  // SGLang's width), out, x and cache each at its own phase, no cache or 0 to 2 cache frames.
  for (int es : {2, 4})
    for (long long ct : {-1LL, 0LL, 1LL, 2LL})
      for (auto [o, xo, co] : {std::array{0, 0, 0}, std::array{0, 1, 3}, std::array{1, 0, 2}, std::array{3, 2, 0},
                               std::array{2, 3, 1}})
        cases.push_back({1, 2, 2, 3, 640, ct, 1, 1, 1, 1, ct < 0 ? 1 : ct + (o & 1), 0, es, false, o, xo, co});
  cases.push_back({1, 3, 0, 3, 5, 2, 1, 1, 1, 1, 3, 1, 2, false, 0});  // T = 0
  cases.push_back({1, 3, 2, 0, 5, 1, 1, 1, 1, 1, 1, 0, 2, false, 0});  // H = 0
  cases.push_back({1, 3, 2, 4, 0, 1, 1, 1, 1, 1, 1, 0, 2, false, 0});  // W = 0
  std::mt19937 rng(1);
  int runs = 0, failures = 0;
  for (const Case& c : cases)
    for (int other : {-1, kCcpParts, kCcpGeneral, kCcpChunks})
      for (bool index64 : {false, true})
        for (auto [grid, block] : {std::pair{3u, 64u}, std::pair{1u, 32u}}) {
          int path = -1;
          long long loads = 0, granules = 0;
          const std::string why = run(c, index64, other, grid, block, rng, &path, &loads, &granules);
          if (path < 0) continue;
          ++runs;
          failures += !why.empty();
          std::printf("%s [%lld,%lld,%lld,%lld,%lld] ct%lld pad(%lld,%lld,%lld,%lld,%lld,%lld) %d-byte off %d %s%s grid %ux%u: "
                      "%s (%lld loads, %lld source granules)%s\n",
                      c.channels_last ? "channels-last" : "NCTHW", c.B, c.C, c.T, c.H, c.W, c.ct, c.wl, c.wr, c.ht, c.hb,
                      c.dl, c.dr, c.es, c.offset, path_name(path), index64 ? " index64" : "", grid, block,
                      why.empty() ? "ok" : why.c_str(), loads, granules,
                      c.x_offset < 0 ? "" : (" x off " + std::to_string(c.x_offset) + " cache off " +
                                             std::to_string(c.cache_offset)).c_str());
        }
  std::printf("%d runs, %d failures\n", runs, failures);
  return failures != 0;
}
