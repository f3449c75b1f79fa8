#include "tensor/tensor.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace grps {
namespace {

bool IsAligned64(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 64 == 0;
}

TEST(TensorTest, DefaultTensorIsEmptyF32) {
  Tensor t;
  EXPECT_EQ(t.num_elements(), 0);
  EXPECT_EQ(t.num_bytes(), 0u);
  EXPECT_EQ(t.rank(), 0u);
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_FALSE(t.owns_data());
  EXPECT_EQ(t.DebugString(), "[] f32");
}

TEST(TensorTest, ZerosIsZeroFilledAlignedAndOwning) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : {1, 3, 16, 17, 1000, 4097}) {
      Tensor t = Tensor::Zeros({n}, dtype);
      ASSERT_NE(t.data(), nullptr);
      EXPECT_TRUE(IsAligned64(t.data())) << n;
      EXPECT_TRUE(t.owns_data());
      EXPECT_EQ(t.num_elements(), n);
      EXPECT_EQ(t.num_bytes(), n * DTypeSize(dtype));
      const auto* bytes = static_cast<const unsigned char*>(t.data());
      for (size_t i = 0; i < t.num_bytes(); ++i) ASSERT_EQ(bytes[i], 0) << i;
    }
  }
}

TEST(TensorTest, ShapeAndElementCountFollowTheDimensions) {
  Tensor t = Tensor::Zeros({2, 3, 4});
  EXPECT_EQ(t.rank(), 3u);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(2), 4);
  EXPECT_EQ(t.num_elements(), 24);
  EXPECT_EQ(t.num_bytes(), 96u);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3, 4}));

  Tensor empty = Tensor::Zeros({5, 0});
  EXPECT_EQ(empty.num_elements(), 0);
  EXPECT_TRUE(empty.owns_data());
  EXPECT_NE(empty.data(), nullptr);

  Tensor scalar = Tensor::Zeros({});
  EXPECT_EQ(scalar.num_elements(), 1);
}

TEST(TensorTest, CopiesShareTheBuffer) {
  Tensor a = Tensor::Zeros({4});
  Tensor b = a;
  b.f32()[2] = 5.0f;
  EXPECT_EQ(a.f32()[2], 5.0f);
  EXPECT_EQ(a.data(), b.data());
}

TEST(TensorTest, BufferOutlivesTheOriginalWhileACopyRemains) {
  Tensor copy;
  {
    Tensor original = Tensor::Zeros({3});
    original.f32()[0] = 1.5f;
    copy = original;
  }
  EXPECT_TRUE(copy.owns_data());
  EXPECT_EQ(copy.f32()[0], 1.5f);
}

TEST(TensorTest, ViewBorrowsCallerMemory) {
  std::vector<float> storage = {1, 2, 3, 4, 5, 6};
  Tensor v = Tensor::View(storage.data(), {2, 3});
  EXPECT_FALSE(v.owns_data());
  EXPECT_EQ(v.data(), storage.data());
  v.f32()[4] = 50.0f;
  EXPECT_EQ(storage[4], 50.0f);
  storage[0] = -1.0f;
  EXPECT_EQ(v.f32()[0], -1.0f);
}

TEST(TensorTest, ReshapedSharesMemoryWithNewShape) {
  Tensor t = Tensor::Zeros({2, 6});
  Tensor r = t.Reshaped({3, 4});
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(r.data(), t.data());
  r.f32()[11] = 9.0f;
  EXPECT_EQ(t.f32()[11], 9.0f);
  EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 6}));  // original unchanged
}

TEST(TensorTest, ReshapedAndSliceOfAnOwningTensorKeepTheBufferAlive) {
  Tensor slice;
  Tensor reshaped;
  {
    Tensor t = Tensor::Zeros({8});
    for (int i = 0; i < 8; ++i) t.f32()[i] = static_cast<float>(i);
    slice = t.Slice(2, 3);
    reshaped = t.Reshaped({2, 4});
  }
  EXPECT_TRUE(slice.owns_data());
  EXPECT_TRUE(reshaped.owns_data());
  EXPECT_EQ(slice.f32()[0], 2.0f);
  EXPECT_EQ(reshaped.f32()[7], 7.0f);
}

TEST(TensorTest, SliceIsAFlatWindowAtTheElementOffset) {
  for (DType dtype : {DType::kF32, DType::kF16}) {
    Tensor t = Tensor::Zeros({4, 5}, dtype);
    Tensor s = t.Slice(7, 6);
    EXPECT_EQ(s.shape(), (std::vector<int64_t>{6}));
    EXPECT_EQ(s.num_elements(), 6);
    EXPECT_EQ(s.dtype(), dtype);
    EXPECT_EQ(static_cast<char*>(s.data()) - static_cast<char*>(t.data()),
              static_cast<ptrdiff_t>(7 * DTypeSize(dtype)));
  }
  Tensor t = Tensor::Zeros({10});
  Tensor s = t.Slice(3, 4);
  s.f32()[0] = 1.0f;
  EXPECT_EQ(t.f32()[3], 1.0f);
  EXPECT_EQ(t.Slice(10, 0).num_elements(), 0);  // empty slice at the end
  std::vector<float> storage(6);
  Tensor view_slice = Tensor::View(storage.data(), {6}).Slice(1, 2);
  EXPECT_FALSE(view_slice.owns_data());
  EXPECT_EQ(view_slice.f32(), storage.data() + 1);
}

TEST(TensorTest, ConvertedToMakesAnOwningConvertedCopy) {
  std::vector<float> storage = {1.0f, -0.5f, 65504.0f, 1e6f, 3.14159265f};
  Tensor src = Tensor::View(storage.data(), {5});
  Tensor half = src.ConvertedTo(DType::kF16);
  EXPECT_TRUE(half.owns_data());
  EXPECT_EQ(half.dtype(), DType::kF16);
  EXPECT_EQ(half.shape(), src.shape());
  EXPECT_EQ(half.num_bytes(), 10u);
  const auto* h = static_cast<const uint16_t*>(half.data());
  for (size_t i = 0; i < storage.size(); ++i) {
    EXPECT_EQ(h[i], FloatToHalf(storage[i])) << i;
  }
  Tensor back = half.ConvertedTo(DType::kF32);
  EXPECT_EQ(back.f32()[0], 1.0f);
  EXPECT_EQ(back.f32()[2], 65504.0f);
  EXPECT_EQ(back.f32()[4], HalfToFloat(FloatToHalf(3.14159265f)));

  Tensor same = src.ConvertedTo(DType::kF32);
  EXPECT_TRUE(same.owns_data());
  EXPECT_NE(same.data(), src.data());
  storage[0] = 42.0f;
  EXPECT_EQ(same.f32()[0], 1.0f);  // a copy, not a view
}

TEST(TensorTest, ConvertedToOfAnEmptyTensorIsEmpty) {
  Tensor empty;
  Tensor converted = empty.ConvertedTo(DType::kBF16);
  EXPECT_EQ(converted.num_elements(), 0);
  EXPECT_EQ(converted.num_bytes(), 0u);
  EXPECT_EQ(converted.dtype(), DType::kBF16);
}

TEST(TensorTest, DebugStringShowsShapeAndDType) {
  EXPECT_EQ(Tensor::Zeros({2, 3}).DebugString(), "[2, 3] f32");
  EXPECT_EQ(Tensor::Zeros({7}, DType::kBF16).DebugString(), "[7] bf16");
  EXPECT_EQ(Tensor::Zeros({1, 1, 4}, DType::kF16).DebugString(),
            "[1, 1, 4] f16");
}

using TensorDeathTest = ::testing::Test;

TEST_F(TensorDeathTest, ReshapedToAnotherElementCountAborts) {
  Tensor t = Tensor::Zeros({2, 3});
  EXPECT_DEATH(t.Reshaped({4, 2}), "element count");
}

TEST_F(TensorDeathTest, SliceOutOfRangeAborts) {
  Tensor t = Tensor::Zeros({10});
  EXPECT_DEATH(t.Slice(8, 3), "out of range");
  EXPECT_DEATH(t.Slice(-1, 1), "out of range");
  EXPECT_DEATH(t.Slice(11, 0), "out of range");
}

TEST_F(TensorDeathTest, F32AccessOnAHalfTensorAborts) {
  Tensor t = Tensor::Zeros({2}, DType::kF16);
  EXPECT_DEATH(t.f32(), "not f32");
}

TEST_F(TensorDeathTest, NegativeDimensionAborts) {
  EXPECT_DEATH(Tensor::Zeros({2, -1}), "negative dimension");
}

}  // namespace
}  // namespace grps
