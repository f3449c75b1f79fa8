// FaultInjectionEnv: an Env for tests that behaves like a disk that can
// fail and a machine that can crash (LevelDB's db/fault_injection_test.cc is
// the model). It wraps another Env (normally Env::Default()) and
//   - remembers, per file it created, how much of it was synced, so that
//     DropUnsyncedData() can cut every such file back to what an fsync made
//     durable, as a power loss would (a torn write);
//   - fails on request: every Append after a byte budget, every Sync, every
//     rename, each with UNAVAILABLE ("injected ...");
//   - corrupts or truncates existing files (CorruptByte, Truncate).
// Thread-safe.
#ifndef GRPS_DAEMON_TESTING_FAULT_INJECTION_ENV_H_
#define GRPS_DAEMON_TESTING_FAULT_INJECTION_ENV_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/env.h"

namespace grps {

class FaultInjectionEnv final : public Env {
 public:
  explicit FaultInjectionEnv(Env* base) : base_(base) {}

  // Appends fail once this many more bytes have been written (-1: never).
  void FailWritesAfter(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void FailSyncs(bool fail) ABSL_LOCKS_EXCLUDED(mu_);
  void FailRenames(bool fail) ABSL_LOCKS_EXCLUDED(mu_);

  // Cuts every file this Env wrote back to its size at its last successful
  // Sync (0 if never synced). Files renamed since keep their new name.
  absl::Status DropUnsyncedData() ABSL_LOCKS_EXCLUDED(mu_);

  // Flips the bits of the byte at `offset` (negative: from the end).
  static absl::Status CorruptByte(const std::string& path, int64_t offset);
  static absl::Status Truncate(const std::string& path, uint64_t size);

  int syncs() const ABSL_LOCKS_EXCLUDED(mu_);

  // Env.
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return base_->ReadFile(path);
  }
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status SyncDir(const std::string& dir) override { return base_->SyncDir(dir); }
  absl::Status CreateDir(const std::string& dir) override { return base_->CreateDir(dir); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    return base_->ListDir(dir);
  }
  bool FileExists(const std::string& path) override { return base_->FileExists(path); }

 private:
  class File;
  struct FileState {
    uint64_t written = 0;
    uint64_t synced = 0;
  };
  // Called by File.
  absl::Status BeforeAppend(const std::string& path, size_t n) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status BeforeSync() ABSL_LOCKS_EXCLUDED(mu_);
  void Synced(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);

  Env* const base_;
  mutable absl::Mutex mu_;
  std::map<std::string, FileState> files_ ABSL_GUARDED_BY(mu_);
  int64_t write_budget_ ABSL_GUARDED_BY(mu_) = -1;
  bool fail_syncs_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_renames_ ABSL_GUARDED_BY(mu_) = false;
  int syncs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace grps

#endif  // GRPS_DAEMON_TESTING_FAULT_INJECTION_ENV_H_
