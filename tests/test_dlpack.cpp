// Tests of DLPack interchange (src/core/dlpack.cpp) and of the TensorView helpers
// (src/core/tensor.cpp). Nothing is dereferenced: data pointers may be fake.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ditops/dlpack.h"
#include "ditops/tensor.h"

namespace {

using ditops::Device;
using ditops::DeviceKind;
using ditops::DType;
using ditops::TensorView;

constexpr DType kAllDTypes[] = {DType::f32,    DType::f16,       DType::bf16, DType::f8e4m3fn, DType::f8e5m2,
                                DType::fp4e2m1x2, DType::u8,     DType::i32,  DType::i64};

void* fake(uintptr_t a) { return reinterpret_cast<void*>(a); }

void expect_same(const TensorView& a, const TensorView& b) {
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.device, b.device);
  ASSERT_EQ(a.rank, b.rank);
  for (int i = 0; i < a.rank; ++i) {
    EXPECT_EQ(a.shape[i], b.shape[i]) << "dim " << i;
    EXPECT_EQ(a.strides[i], b.strides[i]) << "dim " << i;
  }
}

TensorView round_trip(const TensorView& v) {
  DLManagedTensorVersioned* m = ditops::to_dlpack_versioned(v);
  EXPECT_EQ(m->version.major, 1u);
  EXPECT_EQ(m->flags, 0u);
  EXPECT_EQ(m->dl_tensor.byte_offset, 0u);
  TensorView back = ditops::from_dlpack(*m, /*writable=*/true);
  TensorView back_plain = ditops::from_dlpack(m->dl_tensor);
  expect_same(back, back_plain);
  m->deleter(m);
  return back;
}

// ------------------------------------------------------------------ round trips

TEST(DLPack, RoundTripEveryDTypeCpuAndCuda) {
  for (DType dtype : kAllDTypes) {
    for (Device device : {Device{DeviceKind::cpu, 0}, Device{DeviceKind::cuda, 0}, Device{DeviceKind::cuda, 3}}) {
      SCOPED_TRACE(std::string(ditops::dtype_name(dtype)) + " on " + ditops::device_name(device));
      TensorView v = TensorView::contiguous(fake(0x7f0000001000), dtype, device, {3, 5, 7});
      v.strides[0] = 64;  // non-compact
      v.strides[1] = 8;
      expect_same(round_trip(v), v);
    }
  }
}

TEST(DLPack, DTypeCodes) {
  const DLDataType f32 = ditops::to_dlpack_dtype(DType::f32);
  EXPECT_EQ(f32.code, kDLFloat);
  EXPECT_EQ(f32.bits, 32);
  EXPECT_EQ(f32.lanes, 1);
  const DLDataType bf16 = ditops::to_dlpack_dtype(DType::bf16);
  EXPECT_EQ(bf16.code, kDLBfloat);
  EXPECT_EQ(bf16.bits, 16);
  const DLDataType fp4 = ditops::to_dlpack_dtype(DType::fp4e2m1x2);
  EXPECT_EQ(fp4.code, kDLFloat4_e2m1fn);
  EXPECT_EQ(fp4.bits, 4);
  EXPECT_EQ(fp4.lanes, 2);
  const DLDataType u8 = ditops::to_dlpack_dtype(DType::u8);
  EXPECT_EQ(u8.code, kDLUInt);
  EXPECT_EQ(u8.bits, 8);
  const DLDataType i64 = ditops::to_dlpack_dtype(DType::i64);
  EXPECT_EQ(i64.code, kDLInt);
  EXPECT_EQ(i64.bits, 64);
  // Every dtype's bit width (times lanes) matches its element size.
  for (DType dtype : kAllDTypes) {
    const DLDataType t = ditops::to_dlpack_dtype(dtype);
    EXPECT_EQ(static_cast<size_t>(t.bits) * t.lanes, 8 * ditops::dtype_size(dtype)) << ditops::dtype_name(dtype);
  }
}

TEST(DLPack, RankZeroAndEight) {
  TensorView scalar = TensorView::contiguous(fake(0x2000), DType::f32, {DeviceKind::cpu, 0}, {});
  EXPECT_EQ(scalar.rank, 0);
  EXPECT_EQ(scalar.numel(), 1);
  expect_same(round_trip(scalar), scalar);

  TensorView r8 = TensorView::contiguous(fake(0x2000), DType::bf16, {DeviceKind::cuda, 1},
                                         {2, 1, 3, 1, 2, 2, 1, 5});
  EXPECT_EQ(r8.rank, 8);
  const TensorView back = round_trip(r8);
  expect_same(back, r8);
  EXPECT_EQ(back.numel(), 120);
}

TEST(DLPack, NullStridesMeanCompactRowMajor) {
  int64_t shape[] = {2, 3, 4};
  DLTensor t{};
  t.data = fake(0x3000);
  t.device = {kDLCPU, 0};
  t.ndim = 3;
  t.dtype = {kDLFloat, 16, 1};
  t.shape = shape;
  t.strides = nullptr;
  const TensorView v = ditops::from_dlpack(t);
  EXPECT_EQ(v.dtype, DType::f16);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_TRUE(v.is_contiguous());
}

TEST(DLPack, ByteOffsetFoldedIntoData) {
  int64_t shape[] = {4};
  int64_t strides[] = {1};
  DLTensor t{};
  t.data = fake(0x4000);
  t.device = {kDLCUDA, 2};
  t.ndim = 1;
  t.dtype = {kDLBfloat, 16, 1};
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 96;
  const TensorView v = ditops::from_dlpack(t);
  EXPECT_EQ(v.data, fake(0x4000 + 96));
  EXPECT_EQ(v.device, (Device{DeviceKind::cuda, 2}));
}

TEST(DLPack, DeviceTypes) {
  int64_t shape[] = {4};
  DLTensor t{};
  t.data = fake(0x4000);
  t.ndim = 1;
  t.dtype = {kDLInt, 32, 1};
  t.shape = shape;
  t.device = {kDLCUDAHost, 0};
  EXPECT_EQ(ditops::from_dlpack(t).device, (Device{DeviceKind::cpu, 0}));
  t.device = {kDLCUDAManaged, 1};
  EXPECT_EQ(ditops::from_dlpack(t).device, (Device{DeviceKind::cuda, 1}));
  t.device = {7 /* kDLVulkan */, 0};
  try {
    ditops::from_dlpack(t);
    FAIL() << "unsupported device accepted";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported device type 7"), std::string::npos) << e.what();
  }
}

TEST(DLPack, UnsupportedDTypeThrows) {
  int64_t shape[] = {4};
  DLTensor t{};
  t.data = fake(0x4000);
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.shape = shape;
  t.dtype = {kDLFloat, 64, 1};
  try {
    ditops::from_dlpack(t);
    FAIL() << "f64 accepted";
  } catch (const ditops::Error& e) {
    // The dtype by name, its codes and what is taken.
    EXPECT_NE(std::string(e.what()).find("unsupported dtype float64 (DLPack code 2, bits 64, lanes 1); the dtypes "
                                         "ditops takes: f32, f16, bf16, f8e4m3fn, f8e5m2, fp4e2m1x2, u8, i32, i64"),
              std::string::npos) << e.what();
  }
  t.dtype = {kDLFloat, 32, 4};  // vector lanes
  try {
    ditops::from_dlpack(t);
    FAIL() << "f32x4 accepted";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype float32x4 (DLPack code 2, bits 32, lanes 4)"),
              std::string::npos) << e.what();
  }
  t.dtype = {5, 64, 1};  // complex64, as numpy exports it
  try {
    ditops::from_dlpack(t);
    FAIL() << "complex64 accepted";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype complex64 (DLPack code 5"), std::string::npos) << e.what();
  }
  t.dtype = {kDLInt, 16, 1};
  EXPECT_THROW(ditops::from_dlpack(t), ditops::Error);
  t.dtype = {kDLUInt, 32, 1};
  EXPECT_THROW(ditops::from_dlpack(t), ditops::Error);
  t.dtype = {kDLBfloat, 32, 1};
  EXPECT_THROW(ditops::from_dlpack(t), ditops::Error);
}

TEST(DLPack, Fp4Forms) {
  int64_t shape[] = {4, 8};
  DLTensor t{};
  t.data = fake(0x4000);
  t.device = {kDLCUDA, 0};
  t.ndim = 2;
  t.shape = shape;
  t.dtype = {kDLFloat4_e2m1fn, 4, 2};
  EXPECT_EQ(ditops::from_dlpack(t).dtype, DType::fp4e2m1x2);
  t.dtype = {kDLFloat4_e2m1fn, 8, 1};
  EXPECT_EQ(ditops::from_dlpack(t).dtype, DType::fp4e2m1x2);
  EXPECT_EQ(ditops::from_dlpack(t).shape[1], 8);
  // Other lane counts of the 8-bit and 4-bit float types are not ours.
  for (DLDataType bad : {DLDataType{kDLFloat4_e2m1fn, 4, 1}, DLDataType{kDLFloat4_e2m1fn, 8, 2},
                         DLDataType{kDLFloat8_e4m3fn, 8, 2}, DLDataType{kDLFloat8_e5m2, 8, 4}}) {
    t.dtype = bad;
    EXPECT_THROW(ditops::from_dlpack(t), ditops::Error) << int(bad.code) << "/" << int(bad.bits) << "x" << bad.lanes;
  }
}

TEST(DLPack, RankAboveEightThrows) {
  int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  DLTensor t{};
  t.data = fake(0x4000);
  t.device = {kDLCPU, 0};
  t.ndim = 9;
  t.shape = shape;
  t.dtype = {kDLFloat, 32, 1};
  try {
    ditops::from_dlpack(t);
    FAIL() << "rank 9 accepted";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 9"), std::string::npos) << e.what();
  }
  t.ndim = -1;
  EXPECT_THROW(ditops::from_dlpack(t), ditops::Error);
  EXPECT_THROW(TensorView::contiguous(nullptr, DType::f32, {}, {1, 1, 1, 1, 1, 1, 1, 1, 1}), ditops::Error);
}

TEST(DLPack, ReadOnlyFlag) {
  TensorView v = TensorView::contiguous(fake(0x5000), DType::f16, {DeviceKind::cuda, 0}, {8});
  DLManagedTensorVersioned* m = ditops::to_dlpack_versioned(v);
  m->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  EXPECT_NO_THROW(ditops::from_dlpack(*m));  // reading is fine
  EXPECT_NO_THROW(ditops::from_dlpack(*m, /*writable=*/false));
  try {
    ditops::from_dlpack(*m, /*writable=*/true);
    ADD_FAILURE() << "read-only tensor accepted for writing";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("read-only"), std::string::npos) << e.what();
  }
  m->deleter(m);
}

TEST(DLPack, MajorVersionTwoThrows) {
  TensorView v = TensorView::contiguous(fake(0x5000), DType::f16, {DeviceKind::cpu, 0}, {8});
  DLManagedTensorVersioned* m = ditops::to_dlpack_versioned(v);
  m->version.major = 2;
  try {
    ditops::from_dlpack(*m);
    ADD_FAILURE() << "major version 2 accepted";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find("major version 2"), std::string::npos) << e.what();
  }
  m->version.major = 0;
  EXPECT_THROW(ditops::from_dlpack(*m), ditops::Error);
  m->version = {1, 3};  // a newer minor is fine
  EXPECT_NO_THROW(ditops::from_dlpack(*m));
  m->deleter(m);
}

TEST(DLPack, ManagedTensorOwnsShapeAndStrides) {
  std::vector<DLManagedTensorVersioned*> all;
  for (int i = 0; i < 64; ++i) {
    TensorView v = TensorView::contiguous(fake(0x6000 + 16 * i), DType::u8, {DeviceKind::cpu, 0}, {4, i + 1});
    DLManagedTensorVersioned* m = ditops::to_dlpack_versioned(v);
    // Independent of the view: changing the view afterwards does not change the managed tensor.
    v.shape[1] = 999;
    ASSERT_NE(m->deleter, nullptr);
    ASSERT_NE(m->dl_tensor.shape, nullptr);
    ASSERT_NE(m->dl_tensor.strides, nullptr);
    EXPECT_EQ(m->dl_tensor.shape[1], i + 1);
    EXPECT_EQ(m->dl_tensor.strides[0], i + 1);
    EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
    all.push_back(m);
  }
  for (DLManagedTensorVersioned* m : all) m->deleter(m);
}

// ------------------------------------------------------------------ TensorView helpers

TEST(DLPack, TensorViewContiguousNumelSpan) {
  const TensorView v = TensorView::contiguous(fake(0x1000), DType::bf16, {DeviceKind::cuda, 0}, {4, 3, 8});
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.strides[0], 24);
  EXPECT_EQ(v.strides[1], 8);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_EQ(v.numel(), 96);
  EXPECT_EQ(v.size(-1), 8);
  EXPECT_EQ(v.stride(-3), 24);
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.span_bytes(), 96 * 2);
  EXPECT_EQ(v.ptr<char>(), static_cast<char*>(fake(0x1000)));

  TensorView strided = v;
  strided.strides[0] = 40;  // padded tokens
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_EQ(strided.span_bytes(), (3 * 40 + 2 * 8 + 7 + 1) * 2);

  const TensorView empty = TensorView::contiguous(fake(0x1000), DType::f32, {}, {4, 0, 8});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.span_bytes(), 0);

  const TensorView fp4 = TensorView::contiguous(fake(0x1000), DType::fp4e2m1x2, {}, {16, 32});
  EXPECT_EQ(fp4.span_bytes(), 16 * 32);  // counts bytes
}

TEST(DLPack, TensorViewIsContiguousIgnoresExtentOne) {
  TensorView v = TensorView::contiguous(fake(0x1000), DType::f32, {}, {4, 1, 8});
  v.strides[1] = 12345;
  EXPECT_TRUE(v.is_contiguous());
  v.strides[1] = 8;
  v.strides[0] = 16;
  EXPECT_FALSE(v.is_contiguous());
  TensorView t = TensorView::contiguous(fake(0x1000), DType::f32, {}, {3, 4});
  std::swap(t.strides[0], t.strides[1]);  // transposed
  EXPECT_FALSE(t.is_contiguous());
}

TEST(DLPack, TensorViewDescribe) {
  const TensorView v =
      TensorView::contiguous(fake(0x1000), DType::bf16, {DeviceKind::cuda, 0}, {4608, 24, 128});
  EXPECT_EQ(v.describe(), "bf16[4608, 24, 128] strides (3072, 128, 1) on cuda:0");
  const TensorView s = TensorView::contiguous(fake(0x1000), DType::i64, {}, {});
  EXPECT_EQ(s.describe(), "i64[] strides () on cpu");
}

TEST(DLPack, DTypeNamesRoundTrip) {
  for (DType dtype : kAllDTypes) {
    DType back = DType::f32;
    const std::string name = ditops::dtype_name(dtype);
    EXPECT_NE(name, "?");
    ASSERT_TRUE(ditops::parse_dtype(name, &back)) << name;
    EXPECT_EQ(back, dtype) << name;
  }
  DType d;
  EXPECT_TRUE(ditops::parse_dtype("bfloat16", &d));
  EXPECT_EQ(d, DType::bf16);
  EXPECT_TRUE(ditops::parse_dtype("half", &d));
  EXPECT_EQ(d, DType::f16);
  EXPECT_FALSE(ditops::parse_dtype("f64", &d));
  EXPECT_FALSE(ditops::parse_dtype("", &d));
  EXPECT_EQ(ditops::dtype_size(DType::f32), 4u);
  EXPECT_EQ(ditops::dtype_size(DType::bf16), 2u);
  EXPECT_EQ(ditops::dtype_size(DType::fp4e2m1x2), 1u);
  EXPECT_EQ(ditops::dtype_size(DType::i64), 8u);
}

TEST(DLPack, DeviceNames) {
  EXPECT_EQ(ditops::device_name({DeviceKind::cpu, 0}), "cpu");
  EXPECT_EQ(ditops::device_name({DeviceKind::cuda, 0}), "cuda:0");
  EXPECT_EQ(ditops::device_name({DeviceKind::cuda, 7}), "cuda:7");
  EXPECT_NE((Device{DeviceKind::cuda, 0}), (Device{DeviceKind::cuda, 1}));
  EXPECT_EQ((Device{DeviceKind::cpu, 0}), (Device{}));
}

// ------------------------------------------------------------------ hostile tensors (issue 22)

// Throws ditops::Error whose message contains `part`.
void expect_refused(const DLTensor& t, const std::string& part) {
  try {
    ditops::from_dlpack(t);
    ADD_FAILURE() << "accepted; expected an error containing '" << part << "'";
  } catch (const ditops::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

struct Hostile {
  int64_t shape[ditops::kMaxRank] = {2, 3};
  int64_t strides[ditops::kMaxRank] = {3, 1};
  DLTensor t{};
  Hostile() {
    t.data = fake(0x4000);
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
    t.strides = strides;
  }
};

TEST(DLPackHostile, NullDataWithElementsIsRefused) {
  Hostile h;
  h.t.data = nullptr;
  expect_refused(h.t, "from_dlpack: data is NULL but the tensor has 6 elements");
  h.t.byte_offset = 64;  // an offset from NULL is not an address either
  expect_refused(h.t, "data is NULL");
  h.shape[1] = 0;  // no elements: nothing is addressed, NULL is fine
  h.t.byte_offset = 0;
  EXPECT_EQ(ditops::from_dlpack(h.t).numel(), 0);
}

TEST(DLPackHostile, AbsurdOrWrappingByteOffsetIsRefused) {
  Hostile h;
  h.t.byte_offset = uint64_t{1} << 62;
  expect_refused(h.t, "byte_offset 4611686018427387904 is larger than any allocation");
  h.t.byte_offset = ~uint64_t{0};
  expect_refused(h.t, "is larger than any allocation");
  h.t.byte_offset = 64;
  h.t.data = fake(~uintptr_t{0} - 16);  // data + byte_offset wraps
  expect_refused(h.t, "wrap around the address space");
  h.t.byte_offset = 0;  // the last element would wrap
  expect_refused(h.t, "wrap around the address space");
  h.t.data = fake(8);  // a negative stride reaching below address 0
  h.strides[0] = -3;
  expect_refused(h.t, "wrap around the address space");
  h.t.data = fake(0x4000);
  EXPECT_NO_THROW(ditops::from_dlpack(h.t));
}

TEST(DLPackHostile, NegativeShapeNamesTheDim) {
  Hostile h;
  h.shape[1] = -3;
  expect_refused(h.t, "shape[1] must be >= 0 but is -3");
}

TEST(DLPackHostile, RankOutsideTheRangeIsRefused) {
  Hostile h;
  for (int32_t ndim : {-1, 9, 1 << 30, INT32_MIN}) {
    h.t.ndim = ndim;
    expect_refused(h.t, "rank " + std::to_string(ndim) + " is outside [0, 8]");
  }
  h.t.ndim = 2;
  h.t.shape = nullptr;
  expect_refused(h.t, "shape is NULL for rank 2");
}

TEST(DLPackHostile, StridesWhoseSpanOverflowsAreRefused) {
  Hostile h;
  h.strides[0] = int64_t{1} << 62;
  expect_refused(h.t, "address more than 2^63 bytes");
  h.strides[0] = INT64_MIN;
  expect_refused(h.t, "address more than 2^63 bytes");
  h.strides[0] = int64_t{1} << 50;  // fits int64, but no allocation is that large
  expect_refused(h.t, "more than any allocation (2^48)");
  h.shape[0] = int64_t{1} << 40;  // numel overflow with broadcast strides
  h.shape[1] = int64_t{1} << 40;
  h.strides[0] = h.strides[1] = 0;
  expect_refused(h.t, "address more than 2^63 bytes");
  // Compact strides of a huge shape overflow too.
  h.t.strides = nullptr;
  h.shape[0] = h.shape[1] = int64_t{1} << 33;
  expect_refused(h.t, "address more than 2^63 bytes");
}

TEST(DLPackHostile, NegativeCudaDeviceIdIsRefused) {
  Hostile h;
  h.t.device = {kDLCUDA, -1};
  expect_refused(h.t, "device_id must be >= 0 but is -1");
}

TEST(DLPackHostile, OddDTypesAreRefused) {
  Hostile h;
  for (DLDataType d : {DLDataType{kDLFloat, 0, 1}, DLDataType{kDLFloat, 32, 0}, DLDataType{kDLFloat, 32, 4},
                       DLDataType{255, 8, 1}, DLDataType{kDLInt, 7, 1}}) {
    h.t.dtype = d;
    expect_refused(h.t, "unsupported dtype");
  }
}

}  // namespace
