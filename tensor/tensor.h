// Tensor: a shape, a dtype and host memory that is either owned or borrowed.
#ifndef GRPS_TENSOR_TENSOR_H_
#define GRPS_TENSOR_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace grps {

// Row-major, contiguous. An owning tensor frees its memory when the last copy
// of it goes (copies share the buffer, like a shared_ptr); a view borrows
// memory that the caller keeps alive for as long as the view is used.
// Not thread-safe for concurrent mutation of the same elements.
class Tensor {
 public:
  Tensor() = default;  // empty: no elements, shape {}, kF32.

  // Owning, zero-filled, 64-byte aligned.
  static Tensor Zeros(std::vector<int64_t> shape, DType dtype = DType::kF32);
  // Non-owning view of `data`; *data must outlive the view.
  static Tensor View(void* data, std::vector<int64_t> shape,
                     DType dtype = DType::kF32);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  DType dtype() const { return dtype_; }
  int64_t num_elements() const { return num_elements_; }
  size_t num_bytes() const { return num_elements_ * DTypeSize(dtype_); }
  bool owns_data() const { return owner_ != nullptr; }

  void* data() { return data_; }
  const void* data() const { return data_; }
  // Typed access; dtype() must be kF32.
  float* f32();
  const float* f32() const;

  // A view of the same memory with another shape of equal element count.
  Tensor Reshaped(std::vector<int64_t> shape) const;
  // A view of `count` elements starting at element `offset` (a flat slice).
  Tensor Slice(int64_t offset, int64_t count) const;
  // An owning copy converted to `dtype`.
  Tensor ConvertedTo(DType dtype) const;

  // "[2, 3] f32".
  std::string DebugString() const;

 private:
  std::vector<int64_t> shape_;
  DType dtype_ = DType::kF32;
  int64_t num_elements_ = 0;
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
};

}  // namespace grps

#endif  // GRPS_TENSOR_TENSOR_H_
