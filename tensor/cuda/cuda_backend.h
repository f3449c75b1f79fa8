// The contract between the CUDA backend plugin (libgrps_cuda.so, built from
// cuda_backend.cu and cuda_backend_ops.cu) and its loader
// (tensor/backend_loader.cc).
//
// No grps binary links the CUDA driver or runtime. The loader dlopens the
// plugin only after libcuda.so.1 has opened, looks up the entry point below by
// name, and calls it once per backend it creates. The plugin links the CUDA
// runtime statically and cuBLAS dynamically (found through its RPATH).
#ifndef GRPS_TENSOR_CUDA_CUDA_BACKEND_H_
#define GRPS_TENSOR_CUDA_CUDA_BACKEND_H_

#include <cstddef>

#include "tensor/backend.h"

namespace grps {

// The symbol the loader looks up with dlsym.
inline constexpr char kCudaPluginEntryPoint[] = "grps_cuda_create_backend";

// Returns a new CUDA backend on the first visible device (choose it with
// CUDA_VISIBLE_DEVICES), owned by the caller and deleted through Backend's
// virtual destructor. Returns nullptr when no usable device exists (runtime or
// driver error, no device, a device this plugin has no kernels for) and
// writes the reason, NUL-terminated and truncated to error_len bytes, into
// *error. Never aborts for those reasons. Thread-safe.
using CudaPluginEntry = Backend* (*)(char* error, size_t error_len);

}  // namespace grps

extern "C" grps::Backend* grps_cuda_create_backend(char* error,
                                                   size_t error_len);

#endif  // GRPS_TENSOR_CUDA_CUDA_BACKEND_H_
