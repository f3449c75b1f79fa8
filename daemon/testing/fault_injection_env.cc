#include "daemon/testing/fault_injection_env.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace grps {

class FaultInjectionEnv::File final : public WritableFile {
 public:
  File(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  absl::Status Append(absl::string_view data) override {
    if (absl::Status s = env_->BeforeAppend(path_, data.size()); !s.ok()) return s;
    return base_->Append(data);
  }
  absl::Status Sync() override {
    if (absl::Status s = env_->BeforeSync(); !s.ok()) return s;
    if (absl::Status s = base_->Sync(); !s.ok()) return s;
    env_->Synced(path_);
    return absl::OkStatus();
  }
  absl::Status Close() override { return base_->Close(); }

 private:
  FaultInjectionEnv* const env_;
  const std::string path_;
  const std::unique_ptr<WritableFile> base_;
};

void FaultInjectionEnv::FailWritesAfter(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  write_budget_ = bytes;
}
void FaultInjectionEnv::FailSyncs(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_syncs_ = fail;
}
void FaultInjectionEnv::FailRenames(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_renames_ = fail;
}
int FaultInjectionEnv::syncs() const {
  absl::MutexLock lock(&mu_);
  return syncs_;
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<WritableFile>> base = base_->NewWritableFile(path);
  if (!base.ok()) return base.status();
  {
    absl::MutexLock lock(&mu_);
    files_[path] = FileState{};
  }
  return std::unique_ptr<WritableFile>(new File(this, path, std::move(*base)));
}

absl::Status FaultInjectionEnv::BeforeAppend(const std::string& path, size_t n) {
  absl::MutexLock lock(&mu_);
  if (write_budget_ >= 0) {
    if (static_cast<int64_t>(n) > write_budget_)
      return absl::UnavailableError(absl::StrCat("injected write failure on ", path));
    write_budget_ -= static_cast<int64_t>(n);
  }
  files_[path].written += n;
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::BeforeSync() {
  absl::MutexLock lock(&mu_);
  if (fail_syncs_) return absl::UnavailableError("injected fsync failure");
  return absl::OkStatus();
}

void FaultInjectionEnv::Synced(const std::string& path) {
  absl::MutexLock lock(&mu_);
  ++syncs_;
  FileState& f = files_[path];
  f.synced = f.written;
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  {
    absl::MutexLock lock(&mu_);
    if (fail_renames_)
      return absl::UnavailableError(absl::StrCat("injected rename failure on ", from));
  }
  if (absl::Status s = base_->RenameFile(from, to); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = files_.find(from);
  if (it != files_.end()) {
    files_[to] = it->second;
    files_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::RemoveFile(const std::string& path) {
  if (absl::Status s = base_->RemoveFile(path); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  files_.erase(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::DropUnsyncedData() {
  absl::MutexLock lock(&mu_);
  for (auto& [path, state] : files_) {
    if (state.synced == state.written || !base_->FileExists(path)) continue;
    if (absl::Status s = Truncate(path, state.synced); !s.ok()) return s;
    state.written = state.synced;
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::CorruptByte(const std::string& path, int64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(errno)));
  const off_t size = ::lseek(fd, 0, SEEK_END);
  const off_t at = offset < 0 ? size + offset : offset;
  unsigned char byte = 0;
  bool ok = at >= 0 && at < size && ::pread(fd, &byte, 1, at) == 1;
  byte ^= 0x5a;
  ok = ok && ::pwrite(fd, &byte, 1, at) == 1;
  ::close(fd);
  if (!ok) return absl::OutOfRangeError(absl::StrCat("cannot corrupt byte ", offset, " of ", path));
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::Truncate(const std::string& path, uint64_t size) {
  if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0)
    return absl::UnavailableError(absl::StrCat("cannot truncate ", path, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace grps
