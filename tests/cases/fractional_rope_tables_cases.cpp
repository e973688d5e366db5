// fractional_rope_tables' cases: LTX-2's tables (the video self-attention's: coords [1, 3, 6144, 2]
// bounds, F = 4096 // 6 = 682, W = 2048: two padding columns; the audio's and the cross-modal
// attentions' one axis, F = 1024, W = 1024), at full size (large: where a device compares them) and
// scaled down for the CPU; the interleaved layout; positions given as [B, A, P]; coords of any
// strides (the temporal axis sliced from the video coords, a batch of 2 from a repeat); odd widths
// (the element-store path); large angles; empty calls; refusals.
//
// The reference takes cos and sin in double rounded to fp32 where CUDA's cosf and sinf are within 2
// ulp of that. The oracle (below): the fp32 steps as exact roundings of doubles
// (testing_oracle::round_f32), cos and sin in long double, rounded to fp32: the reference's values
// exactly (the long double and double results round to the same float but for a double's rounding
// straddling a float midpoint, which the bound of one ulp absorbs).
#include <cmath>
#include <string>
#include <vector>

#include "op_test_driver.h"
#include "rounding_oracle.h"

namespace ditops::optest {
namespace {

using Options = std::vector<std::pair<std::string, std::string>>;
const Options kVideo = {{"max_pos0", "20"}, {"max_pos1", "2048"}, {"max_pos2", "2048"}, {"layout", "split"}};

struct Fr {
  int64_t B = 1, A = 3, P = 33, F = 682, W = 2048;
  bool bounds = true;
  Options options = kVideo;
};

OpCase fr_case(const std::string& name, CaseKind kind, const Fr& s, uint32_t seed) {
  OpCase c{.op = "fractional_rope_tables", .name = name, .kind = kind, .seed = seed};
  std::vector<int64_t> cs = {s.B, s.A, s.P};
  if (s.bounds) cs.push_back(2);
  TensorCase coords{"coords", DType::f32, cs};
  coords.fill = Fill::positive(0.0, 400.0);  // pixel-space bounds and seconds: 0 to about 1600
  TensorCase freqs{"freqs", DType::f32, {s.F}};
  freqs.fill = Fill::positive(1.5707964, 3000.0);  // pi / 2 up to theta * pi / 2
  c.tensors = {coords, freqs, TensorCase{"cos", DType::f32, {s.B, s.P, s.W}},
               TensorCase{"sin", DType::f32, {s.B, s.P, s.W}}};
  c.options = s.options;
  // CUDA's cosf and sinf against double's rounded: 2 ulps, compared at 2^-10 below it
  c.tolerance = {2.0, 0x1p-10, 0.3, 64};
  c.large = s.B * s.P * s.W > (int64_t{1} << 20);
  return c;
}

Options with(Options o, const std::string& name, const std::string& value) {
  for (auto& [n, v] : o)
    if (n == name) v = value;
  return o;
}

std::vector<OpCase> make() {
  std::vector<OpCase> out;
  uint32_t seed = 1;
  // LTX-2 at 6144 video tokens: the video tables (3 axes), then the one-axis tables of the audio and
  // the cross-modal attentions (base_num_frames only); scaled down to 33 positions.
  for (int64_t P : {int64_t{6144}, int64_t{33}}) {
    Fr video;
    video.P = P;
    out.push_back(fr_case("video_" + std::to_string(P), CaseKind::model, video, seed++));
    Fr one_axis;
    one_axis.A = 1;
    one_axis.P = P;
    one_axis.F = 1024;
    one_axis.W = 1024;
    out.push_back(fr_case("one_axis_" + std::to_string(P), CaseKind::model, one_axis, seed++));
  }
  // The interleaved layout (each value twice; padding dim % 6 = 4 columns at a width of 4096).
  {
    Fr s;
    s.W = 4096;
    s.options = with(kVideo, "layout", "interleaved");
    out.push_back(fr_case("video_interleaved_33", CaseKind::odd, s, seed++));
  }
  // Positions given directly ([B, A, P]), a batch of two, no padding, padding of one column.
  {
    Fr s;
    s.bounds = false;
    out.push_back(fr_case("positions", CaseKind::odd, s, seed++));
    s.bounds = true;
    s.B = 2;
    s.P = 7;
    out.push_back(fr_case("batch_2", CaseKind::odd, s, seed++));
    s.B = 1;
    s.F = 8;
    s.W = 24;
    out.push_back(fr_case("no_pad", CaseKind::odd, s, seed++));
    s.W = 25;  // the element-store path
    out.push_back(fr_case("odd_width", CaseKind::odd, s, seed++));
    s.W = 3;
    s.F = 1;
    out.push_back(fr_case("one_unit", CaseKind::odd, s, seed++));
  }
  // coords of any strides: the temporal axis of the video coords ([1, 1, P, 2] of a [1, 3, P, 2]),
  // a batch repeated by expand (stride 0), bounds stored axis-last-but-one ([B, A, 2, P] transposed).
  {
    Fr s;
    s.A = 1;
    s.F = 16;
    s.W = 16;
    OpCase c = fr_case("temporal_axis_slice", CaseKind::view, s, seed++);
    c.tensors[0].strides = {3 * 33 * 2, 33 * 2, 2, 1};
    out.push_back(c);
    s.B = 2;
    c = fr_case("batch_expanded", CaseKind::strided, s, seed++);
    c.tensors[0].strides = {0, 33 * 2, 2, 1};
    out.push_back(c);
    s.B = 1;
    s.A = 3;
    s.F = 4;
    c = fr_case("bounds_transposed", CaseKind::strided, s, seed++);
    c.tensors[0].strides = {3 * 2 * 33, 2 * 33, 1, 33};
    out.push_back(c);
  }
  // Other base sizes (the audio module's base_num_frames alone), large positions (angles past 1e5:
  // cosf's long reduction).
  {
    Fr s;
    s.options = {{"max_pos0", "7"}, {"max_pos1", "3"}, {"max_pos2", "1"}, {"layout", "split"}};
    s.F = 20;
    s.W = 64;
    out.push_back(fr_case("small_bases", CaseKind::odd, s, seed++));
    OpCase c = fr_case("large_angles", CaseKind::odd, s, seed++);
    c.tensors[0].fill = Fill::positive(1000.0, 30000.0);
    out.push_back(c);
  }
  // Empty: no positions, no batch.
  {
    Fr s;
    s.P = 0;
    out.push_back(fr_case("empty", CaseKind::empty, s, seed++));
    s.P = 4;
    s.B = 0;
    out.push_back(fr_case("empty_batch", CaseKind::empty, s, seed++));
  }
  // Refusals: nothing written.
  Fr small;
  small.P = 4;
  small.F = 4;
  small.W = 16;
  auto invalid = [&](const std::string& name, std::vector<std::string> fragments, auto edit) {
    OpCase c = fr_case(name, CaseKind::invalid, small, seed++);
    edit(c);
    c.invalid = std::move(fragments);
    out.push_back(c);
  };
  invalid("coords_rank_2", {"coords must be [B, A, P, 2] (bounds) or [B, A, P] (positions) but is"},
          [](OpCase& c) { c.tensors[0].shape = {3, 4}; });
  invalid("bound_dim_3", {"coords.shape[3] must equal 2", "but is 3"},
          [](OpCase& c) { c.tensors[0].shape = {1, 3, 4, 3}; });
  invalid("four_axes", {"coords.shape[1] must be 1 to 3", "but is 4"},
          [](OpCase& c) { c.tensors[0].shape = {1, 4, 4, 2}; });
  invalid("max_pos_zero", {"max_pos1 must be > 0", "but is 0"},
          [](OpCase& c) { c.options = with(kVideo, "max_pos1", "0"); });
  invalid("cos_positions_wrong", {"cos must be [B, P, W] = [1, 4, W]", "but is"},
          [](OpCase& c) { c.tensors[2].shape = {1, 5, 16}; });
  invalid("too_narrow", {"cos.shape[2] must be >= 12 (A F = 3 x 4) but is 11"},
          [](OpCase& c) { c.tensors[2].shape = c.tensors[3].shape = {1, 4, 11}; });
  invalid("sin_width_differs", {"sin.shape[2] must equal cos.shape[2]=16 but is 20"},
          [](OpCase& c) { c.tensors[3].shape = {1, 4, 20}; });
  invalid("cos_bf16", {"cos.dtype must be f32", "bf16"}, [](OpCase& c) { c.tensors[2].dtype = DType::bf16; });
  invalid("coords_f16", {"coords.dtype must be f32", "f16"}, [](OpCase& c) { c.tensors[0].dtype = DType::f16; });
  invalid("freqs_strided", {"freqs"}, [](OpCase& c) { c.tensors[1].strides = {2}; });
  {
    OpCase c = fr_case("sin_over_cos", CaseKind::aliased, small, seed++);
    c.tensors[3].storage = "cos";
    c.invalid = {"cos overlaps sin in memory"};
    out.push_back(c);
  }
  // Every model case again with coords one element off, and without PDL.
  Variants v;
  v.misalign = {"coords"};
  v.options = {{{{"use_pdl", "false"}}, "nopdl"}};
  add_variants(out, v);
  return out;
}

const CaseSet kCases("fractional_rope_tables", make);

// The fp32 steps as exact roundings, cos and sin in long double rounded to fp32; pad columns 1 and 0.
void fractional_rope_oracle(OracleIo& io) {
  using testing_oracle::round_f32;
  const int coords = io.id("coords"), freqs = io.id("freqs"), cos_t = io.id("cos"), sin_t = io.id("sin");
  const auto& cs = io.shape(coords);
  const bool bounds = cs.size() == 4;
  const int64_t B = cs[0], A = cs[1], P = cs[2], F = io.shape(freqs)[0], W = io.shape(cos_t)[2];
  const bool interleaved = io.option("layout") == "interleaved";
  const int64_t pad = W - (interleaved ? 2 : 1) * A * F;
  const double max_pos[3] = {io.number("max_pos0"), io.number("max_pos1"), io.number("max_pos2")};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t j = 0; j < W; ++j) {
        const int64_t at = (b * P + p) * W + j;
        if (j < pad) {
          io.expect(cos_t, at, 1.0, 0.0);
          io.expect(sin_t, at, 0.0, 0.0);
          continue;
        }
        const int64_t jj = interleaved ? (j - pad) / 2 : j - pad, k = jj / A, a = jj % A;
        const int64_t base = ((b * A + a) * P + p) * (bounds ? 2 : 1);
        const double mid = bounds ? round_f32(round_f32(io.in(coords, base) + io.in(coords, base + 1)) * 0.5)
                                  : io.in(coords, base);
        const double v = round_f32(round_f32(mid * round_f32(1.0 / max_pos[a])) * 2.0 - 1.0);
        const long double x = static_cast<long double>(round_f32(v * io.in(freqs, k)));
        const double c = round_f32(static_cast<double>(std::cos(x))), s = round_f32(static_cast<double>(std::sin(x)));
        const double ulp_c = std::ldexp(1.0, std::ilogb(std::fmax(std::fabs(c), 0x1p-126)) - 23);
        const double ulp_s = std::ldexp(1.0, std::ilogb(std::fmax(std::fabs(s), 0x1p-126)) - 23);
        io.expect(cos_t, at, c, ulp_c);
        io.expect(sin_t, at, s, ulp_s);
      }
}

const Oracle kFractionalRope{.name = "the fp32 steps rounded exactly, cos and sin in long double, within an fp32 ulp",
                             .expect = fractional_rope_oracle};
const OracleSet kOracles("fractional_rope_tables", kFractionalRope);

}  // namespace
}  // namespace ditops::optest
