#include "fuzz/memory_env.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace grps {
namespace {

// "a/b/c" -> "a/b"; "c" -> "".
std::string Parent(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? std::string()
                                          : std::string(path.substr(0, slash));
}

// The name of `path` if it is directly inside `dir`.
bool DirectChild(absl::string_view dir, absl::string_view path, std::string* name) {
  if (path.size() <= dir.size() + 1 || path.substr(0, dir.size()) != dir ||
      path[dir.size()] != '/')
    return false;
  absl::string_view rest = path.substr(dir.size() + 1);
  if (rest.find('/') != absl::string_view::npos) return false;
  *name = std::string(rest);
  return true;
}

}  // namespace

class MemoryEnv::File final : public WritableFile {
 public:
  File(MemoryEnv* env, std::string path) : env_(env), path_(std::move(path)) {}
  absl::Status Append(absl::string_view data) override {
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    env_->AppendTo(path_, data);
    return absl::OkStatus();
  }
  absl::Status Sync() override { return absl::OkStatus(); }
  absl::Status Close() override {
    closed_ = true;
    return absl::OkStatus();
  }

 private:
  MemoryEnv* const env_;
  const std::string path_;
  bool closed_ = false;
};

absl::StatusOr<std::unique_ptr<WritableFile>> MemoryEnv::NewWritableFile(
    const std::string& path) {
  absl::MutexLock lock(&mu_);
  files_[path].clear();
  AddDirsLocked(Parent(path));
  return std::unique_ptr<WritableFile>(new File(this, path));
}

void MemoryEnv::AppendTo(const std::string& path, absl::string_view data) {
  absl::MutexLock lock(&mu_);
  files_[path].append(data.data(), data.size());
}

absl::StatusOr<std::string> MemoryEnv::ReadFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  return it->second;
}

absl::Status MemoryEnv::RenameFile(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(from);
  if (it == files_.end())
    return absl::NotFoundError(absl::StrCat("cannot rename ", from, ": no such file"));
  std::string contents = std::move(it->second);
  files_.erase(it);
  files_[to] = std::move(contents);
  AddDirsLocked(Parent(to));
  return absl::OkStatus();
}

absl::Status MemoryEnv::RemoveFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (files_.erase(path) == 0)
    return absl::NotFoundError(absl::StrCat("cannot remove ", path, ": no such file"));
  return absl::OkStatus();
}

absl::Status MemoryEnv::CreateDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  AddDirsLocked(dir);
  return absl::OkStatus();
}

void MemoryEnv::AddDirsLocked(const std::string& path) {
  for (std::string d = path; !d.empty() && dirs_.insert(d).second; d = Parent(d)) {
  }
}

absl::StatusOr<std::vector<std::string>> MemoryEnv::ListDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (dirs_.count(dir) == 0)
    return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": no such folder"));
  std::vector<std::string> names;
  std::string name;
  for (const auto& [path, contents] : files_)
    if (DirectChild(dir, path, &name)) names.push_back(name);
  for (const std::string& d : dirs_)
    if (DirectChild(dir, d, &name)) names.push_back(name);
  return names;
}

bool MemoryEnv::FileExists(const std::string& path) {
  absl::MutexLock lock(&mu_);
  return files_.count(path) > 0 || dirs_.count(path) > 0;
}

size_t MemoryEnv::TotalBytes() const {
  absl::MutexLock lock(&mu_);
  size_t total = 0;
  for (const auto& [path, contents] : files_) total += contents.size();
  return total;
}

}  // namespace grps
