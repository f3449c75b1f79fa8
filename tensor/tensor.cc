#include "tensor/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensor/host_memory.h"

namespace grps {

namespace {

// Shapes, offsets and dtypes reaching a Tensor were validated where they
// entered the process; a violation here is a bug in the caller.
void CheckOrDie(bool condition, const char* what) {
  grps::CheckOrDie(condition, "grps::Tensor", what);
}

int64_t CountElements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    CheckOrDie(d >= 0, "negative dimension");
    count *= d;
  }
  return count;
}

}  // namespace

Tensor Tensor::Zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.num_elements_ = CountElements(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  // A zero-element tensor still gets a (non-null) block so that it owns its
  // data like any other.
  void* data = AllocateAligned(t.num_bytes());
  std::memset(data, 0, t.num_bytes());
  t.data_ = data;
  t.owner_ = std::shared_ptr<void>(data, std::free);
  return t;
}

Tensor Tensor::View(void* data, std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.num_elements_ = CountElements(shape);
  CheckOrDie(data != nullptr || t.num_elements_ == 0, "view of null data");
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.data_ = data;
  return t;
}

float* Tensor::f32() {
  CheckOrDie(dtype_ == DType::kF32, "f32() on a tensor that is not f32");
  return static_cast<float*>(data_);
}

const float* Tensor::f32() const {
  CheckOrDie(dtype_ == DType::kF32, "f32() on a tensor that is not f32");
  return static_cast<const float*>(data_);
}

// Views made from an owning tensor share its ownership (owner_), so they stay
// valid even if they outlive the tensor they came from.
Tensor Tensor::Reshaped(std::vector<int64_t> shape) const {
  Tensor t = *this;
  CheckOrDie(CountElements(shape) == num_elements_,
             "Reshaped to a shape with another element count");
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::Slice(int64_t offset, int64_t count) const {
  CheckOrDie(offset >= 0 && count >= 0 && offset <= num_elements_ &&
                 count <= num_elements_ - offset,
             "Slice out of range");
  Tensor t = *this;
  t.shape_ = {count};
  t.num_elements_ = count;
  t.data_ = static_cast<char*>(data_) + offset * DTypeSize(dtype_);
  return t;
}

Tensor Tensor::ConvertedTo(DType dtype) const {
  Tensor t = Zeros(shape_, dtype);
  // Zeros({}) is a one-element scalar; the default-constructed tensor has
  // shape {} but no elements, so the count comes from this tensor.
  t.num_elements_ = num_elements_;
  if (num_elements_ > 0) {
    ConvertElements(data_, dtype_, t.data_, dtype, num_elements_);
  }
  return t;
}

std::string Tensor::DebugString() const {
  const std::string_view name = DTypeName(dtype_);
  // Debian's Abseil is built with its own string_view, not std's.
  return absl::StrCat("[", absl::StrJoin(shape_, ", "), "] ",
                      absl::string_view(name.data(), name.size()));
}

}  // namespace grps
