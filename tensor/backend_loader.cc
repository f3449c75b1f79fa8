// CreateBackend: picks the CPU backend or loads the CUDA plugin at run time.
//
// No grps binary links the CUDA driver, the CUDA runtime or cuBLAS; they come
// in only through libgrps_cuda.so, which is opened here and only after the
// driver (libcuda.so.1) has opened. So every binary starts on a machine
// without a GPU, and `--backend=cuda` there fails with a FailedPrecondition
// that says why.
//
// Library handles are never closed: a backend the plugin created runs the
// plugin's code until it is destroyed, and may outlive any scope here.
// dlopen reference-counts repeated opens of the same library.

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tensor/backend.h"
#include "tensor/cuda/cuda_backend.h"

namespace grps {
namespace {

constexpr char kDriverLibrary[] = "libcuda.so.1";
constexpr char kPluginLibrary[] = "libgrps_cuda.so";
constexpr char kPluginPathVariable[] = "GRPS_CUDA_PLUGIN";

std::string DlError() {
  const char* error = dlerror();
  return error != nullptr ? error : "unknown dynamic loader error";
}

// The directory of the running executable, or "" if it cannot be read.
std::string ExecutableDir() {
  std::string path(4096, '\0');
  const ssize_t len = readlink("/proc/self/exe", path.data(), path.size());
  if (len <= 0 || static_cast<size_t>(len) >= path.size()) return "";
  path.resize(len);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

struct OpenedPlugin {
  void* handle;
  std::string name;  // how it was found, for messages
};

// Opens the plugin named by $GRPS_CUDA_PLUGIN if set, else the one beside the
// executable, else the one on the library path. A plugin that is found but
// fails to load (say, libcublas is missing) is reported as such, not skipped.
absl::StatusOr<OpenedPlugin> OpenPlugin() {
  const char* from_env = std::getenv(kPluginPathVariable);
  if (from_env != nullptr && from_env[0] != '\0') {
    void* handle = dlopen(from_env, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load the CUDA backend plugin ", from_env,
                       " named by ", kPluginPathVariable, ": ", DlError()));
    }
    return OpenedPlugin{handle, from_env};
  }
  const std::string dir = ExecutableDir();
  if (!dir.empty()) {
    const std::string beside = absl::StrCat(dir, "/", kPluginLibrary);
    if (access(beside.c_str(), F_OK) == 0) {
      void* handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot load the CUDA backend plugin ", beside, ": ", DlError()));
      }
      return OpenedPlugin{handle, beside};
    }
  }
  void* handle = dlopen(kPluginLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this build has no CUDA backend: ", kPluginLibrary,
        " is neither beside the executable",
        dir.empty() ? "" : absl::StrCat(" (", dir, ")"),
        " nor on the library path, and ", kPluginPathVariable,
        " is not set (", DlError(), ")"));
  }
  return OpenedPlugin{handle, kPluginLibrary};
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend() {
  // Checked first and separately: without a driver the plugin's CUDA runtime
  // could only report "insufficient driver", which says less.
  if (dlopen(kDriverLibrary, RTLD_NOW | RTLD_LOCAL) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend requested but no NVIDIA driver (", kDriverLibrary,
        ") could be loaded: ", DlError()));
  }
  absl::StatusOr<OpenedPlugin> plugin = OpenPlugin();
  if (!plugin.ok()) return plugin.status();

  dlerror();  // clear, so that a null from dlsym is told apart from an error
  auto entry = reinterpret_cast<CudaPluginEntry>(
      dlsym(plugin->handle, kCudaPluginEntryPoint));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(plugin->name, " is not a grps CUDA backend plugin: ",
                     DlError()));
  }
  char reason[1024] = {};
  Backend* backend = entry(reason, sizeof(reason));
  if (backend == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend requested but no usable CUDA device: ",
        reason[0] != '\0' ? reason : "the plugin gave no reason"));
  }
  return std::unique_ptr<Backend>(backend);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu:
      return CreateCpuBackend();
    case BackendKind::kCuda:
      return CreateCudaBackend();
    case BackendKind::kAuto: {
      // Falling back is the point of kAuto; callers that must know why CUDA
      // is not used ask for kCuda.
      absl::StatusOr<std::unique_ptr<Backend>> cuda = CreateCudaBackend();
      if (cuda.ok()) return cuda;
      return CreateCpuBackend();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown BackendKind ", static_cast<int>(kind)));
}

}  // namespace grps
