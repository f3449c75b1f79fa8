// MemoryEnv: an Env (daemon/env.h) whose files live in memory, so that the
// coordinator fuzz target can let the service write manifests and its state
// file, and read them back, without touching the disk, and start every input
// from an empty file system.
//
// Paths are plain strings: a file is "<dir>/<name>"; a folder exists once
// CreateDir named it or a file was written in it. No fault is ever injected
// (daemon/testing/fault_injection_env.h does that for the real file system).
//
// Thread-safe: the coordinator writes manifests on a thread of its own.
#ifndef GRPS_FUZZ_MEMORY_ENV_H_
#define GRPS_FUZZ_MEMORY_ENV_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/env.h"

namespace grps {

class MemoryEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> ReadFile(const std::string& path) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RenameFile(const std::string& from, const std::string& to) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RemoveFile(const std::string& path) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status SyncDir(const std::string& dir) override { return absl::OkStatus(); }
  absl::Status CreateDir(const std::string& dir) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override
      ABSL_LOCKS_EXCLUDED(mu_);
  bool FileExists(const std::string& path) override ABSL_LOCKS_EXCLUDED(mu_);

  // Total bytes of every file, for a target that bounds what inputs write.
  size_t TotalBytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class File;
  void AppendTo(const std::string& path, absl::string_view data) ABSL_LOCKS_EXCLUDED(mu_);
  void AddDirsLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace grps

#endif  // GRPS_FUZZ_MEMORY_ENV_H_
