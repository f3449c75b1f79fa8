// CudaBackend's device, queues and memory: opening the device, the factory
// (CudaBackend::Create and the plugin's entry point grps_cuda_create_backend),
// allocation, the copies and the events. The ops that run kernels are in
// cuda_backend_ops.cu; the class and its contract in cuda_backend_internal.h.

#include "tensor/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "tensor/cuda/cuda_backend_internal.h"

namespace grps {
namespace {

std::string CudaErrorText(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorString(err);
}

// Device 0, its context created now, and its properties: so that a device
// that is missing, busy, prohibited, broken or of an architecture the
// plugin has no kernels for is reported here rather than at the first op.
bool OpenDevice(int device, cudaDeviceProp* prop, std::string* arch, std::string* error) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *error = CudaErrorText("cudaGetDeviceCount", err);
    return false;
  }
  if (count == 0) {
    *error = "no CUDA device is visible";
    return false;
  }
  // cudaFree(nullptr) creates the context.
  if ((err = cudaSetDevice(device)) != cudaSuccess ||
      (err = cudaFree(nullptr)) != cudaSuccess) {
    *error = CudaErrorText("initializing CUDA device 0", err);
    return false;
  }
  if ((err = cudaGetDeviceProperties(prop, device)) != cudaSuccess) {
    *error = CudaErrorText("cudaGetDeviceProperties", err);
    return false;
  }
  *arch = "sm_" + std::to_string(prop->major) + std::to_string(prop->minor);
  // The plugin carries code for the architectures it was built for (sm_90);
  // on any other device the kernels would fail at their first launch.
  cudaFuncAttributes attributes;
  if ((err = GetKernelAttributes(&attributes)) != cudaSuccess) {
    cudaGetLastError();  // clear, so that a later caller starts clean
    *error = "the CUDA backend has no kernels for " + std::string(prop->name) +
             " (" + *arch + "): " + cudaGetErrorString(err);
    return false;
  }
  return true;
}

}  // namespace

std::unique_ptr<CudaBackend> CudaBackend::Create(std::string* error) {
  constexpr int kDevice = 0;
  cudaDeviceProp prop;
  std::string arch;
  if (!OpenDevice(kDevice, &prop, &arch, error)) return nullptr;

  std::unique_ptr<CudaBackend> backend(new CudaBackend());
  backend->name_ = "cuda (" + std::string(prop.name) + ", " + arch + ")";
  // f32 units per multiprocessor: 64 up to sm_80, 128 on sm_86 and later
  // (sm_90 included). The peak clock is in kHz.
  int clock_khz = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, kDevice) ==
      cudaSuccess) {
    const int units =
        prop.major < 8 || (prop.major == 8 && prop.minor == 0) ? 64 : 128;
    backend->peak_gflops_ = 2.0 * units * prop.multiProcessorCount *
                            (clock_khz / 1e6);
  } else {
    cudaGetLastError();  // the peak stays unknown
  }
  backend->max_blocks_ = std::max(1, prop.multiProcessorCount *
                                         (prop.maxThreadsPerMultiProcessor /
                                          kThreads));
  if (!backend->CreateQueuesAndScratch(error)) return nullptr;
  return backend;
}

bool CudaBackend::CreateQueuesAndScratch(std::string* error) {
  cudaError_t err;
  if ((err = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess ||
      (err = cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking)) !=
          cudaSuccess) {
    *error = CudaErrorText("cudaStreamCreate", err);
    return false;
  }
  cublasStatus_t st = cublasCreate(&cublas_);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublas_ = nullptr;
    *error = std::string("cublasCreate: ") + cublasGetStatusString(st);
    return false;
  }
  if ((st = cublasSetStream(cublas_, stream_)) != CUBLAS_STATUS_SUCCESS) {
    *error = std::string("cublasSetStream: ") + cublasGetStatusString(st);
    return false;
  }
  if ((err = cudaMalloc(&partial_, kMaxReduceBlocks * sizeof(double))) != cudaSuccess ||
      (err = cudaMalloc(&sum_result_, sizeof(double))) != cudaSuccess ||
      (err = cudaMalloc(&loss_scalars_, sizeof(LossOutput))) != cudaSuccess ||
      (err = cudaMallocHost(&sync_loss_, sizeof(LossOutput))) != cudaSuccess) {
    *error = CudaErrorText("allocating the backend's scratch memory", err);
    return false;
  }
  return true;
}

// Errors are ignored here: a backend destroyed during process exit may find
// the runtime already unloading, and there is nothing left to protect.
CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  cudaFreeHost(sync_loss_);
  cudaFree(row_loss_);
  cudaFree(loss_scalars_);
  cudaFree(sum_result_);
  cudaFree(partial_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

// ---- memory ----

namespace {

// At least one byte, so that the result is never null; running out of memory
// is fatal, as for the CPU backend.
template <typename AllocateFn>
void* AllocateOrDie(AllocateFn allocate, const char* name, size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = allocate(&ptr, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    const std::string detail = std::to_string(bytes) + " bytes: " +
                               cudaGetErrorString(err);
    Die(name, detail.c_str(), __FILE__, __LINE__);
  }
  return ptr;
}

}  // namespace

void* CudaBackend::Allocate(size_t bytes) {
  return AllocateOrDie([](void** p, size_t n) { return cudaMalloc(p, n); },
                       "cudaMalloc", bytes);
}

// cudaFree waits for the device, so memory still used by enqueued ops is not
// released under them.
void CudaBackend::Free(void* ptr) { GRPS_CUDA_CHECK(cudaFree(ptr)); }

void CudaBackend::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  GRPS_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes,
                                  cudaMemcpyHostToDevice, stream_));
  GRPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  GRPS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes,
                                  cudaMemcpyDeviceToHost, stream_));
  GRPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const auto* d = static_cast<const char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (d < s + bytes && s < d + bytes) {
    // cudaMemcpy forbids overlap; go through a temporary (rare).
    void* tmp = Allocate(bytes);
    GRPS_CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice,
                                    stream_));
    GRPS_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice,
                                    stream_));
    Free(tmp);
    return;
  }
  GRPS_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::Synchronize() {
  GRPS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- host memory, the copy queue and events ----

void* CudaBackend::AllocateHost(size_t bytes) {
  return AllocateOrDie([](void** p, size_t n) { return cudaMallocHost(p, n); },
                       "cudaMallocHost", bytes);
}

void CudaBackend::FreeHost(void* ptr) { GRPS_CUDA_CHECK(cudaFreeHost(ptr)); }

void CudaBackend::CopyToDeviceAsync(void* dst, const void* host_src,
                                    size_t bytes) {
  if (bytes == 0) return;
  GRPS_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes,
                                  cudaMemcpyHostToDevice, copy_stream_));
}

void CudaBackend::CopyToHostAsync(void* host_dst, const void* src,
                                  size_t bytes) {
  if (bytes == 0) return;
  GRPS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes,
                                  cudaMemcpyDeviceToHost, copy_stream_));
}

namespace {

class CudaEvent : public BackendEvent {
 public:
  CudaEvent() {
    GRPS_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

const CudaEvent& AsCuda(const BackendEvent& event) {
  const auto* cuda = dynamic_cast<const CudaEvent*>(&event);
  GRPS_REQUIRE(cuda != nullptr, "an event of another backend");
  return *cuda;
}

}  // namespace

std::unique_ptr<BackendEvent> CudaBackend::CreateEvent() {
  return std::make_unique<CudaEvent>();
}

void CudaBackend::Record(Queue queue, BackendEvent* event) {
  GRPS_CUDA_CHECK(cudaEventRecord(AsCuda(*event).get(), StreamOf(queue)));
}

// Waiting on an event never recorded returns at once, as the contract says.
void CudaBackend::Wait(Queue queue, const BackendEvent& event) {
  GRPS_CUDA_CHECK(cudaStreamWaitEvent(StreamOf(queue), AsCuda(event).get(), 0));
}

void CudaBackend::WaitOnHost(const BackendEvent& event) {
  GRPS_CUDA_CHECK(cudaEventSynchronize(AsCuda(event).get()));
}

}  // namespace grps

extern "C" __attribute__((visibility("default"))) grps::Backend*
grps_cuda_create_backend(char* error, size_t error_len) {
  std::string reason;
  try {
    std::unique_ptr<grps::CudaBackend> backend =
        grps::CudaBackend::Create(&reason);
    if (backend != nullptr) return backend.release();
  } catch (const std::exception& e) {  // std::bad_alloc from std::string
    reason = e.what();
  }
  if (error != nullptr && error_len > 0) {
    std::snprintf(error, error_len, "%s", reason.c_str());
  }
  return nullptr;
}
