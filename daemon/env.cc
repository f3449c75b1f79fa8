#include "daemon/env.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace grps {
namespace {

absl::Status IoError(absl::string_view what, const std::string& path, int err) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { Close().IgnoreError(); }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = ::write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoError("cannot write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    if (::fsync(fd_) != 0) return IoError("cannot fsync", path_, errno);
    return absl::OkStatus();
  }
  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return IoError("cannot close", path_, errno);
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return IoError("cannot create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError("cannot open", path, errno);
    std::string out;
    char buf[1 << 16];
    while (true) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        ::close(fd);
        return IoError("cannot read", path, err);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return IoError("cannot rename", absl::StrCat(from, " to ", to), errno);
    return absl::OkStatus();
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return IoError("cannot remove", path, errno);
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoError("cannot open folder", dir, errno);
    const bool ok = ::fsync(fd) == 0;
    const int err = errno;
    ::close(fd);
    if (!ok) return IoError("cannot fsync folder", dir, err);
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& dir) override {
    if (dir.empty()) return absl::OkStatus();
    std::string partial;
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      partial = dir.substr(0, pos);
      if (partial.empty() || partial == "/") continue;
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
        return IoError("cannot create folder", partial, errno);
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return IoError("cannot create folder", dir, errno);
    if (!S_ISDIR(st.st_mode))
      return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a folder"));
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return IoError("cannot list", dir, errno);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    return names;
  }

  bool FileExists(const std::string& path) override {
    return ::access(path.c_str(), F_OK) == 0;
  }
};

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv;
  return env;
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::Status WriteFileAtomically(Env* env, const std::string& path,
                                 absl::string_view contents) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter++);
  auto fail = [&](const absl::Status& s) {
    if (env->FileExists(tmp)) env->RemoveFile(tmp).IgnoreError();
    return absl::Status(s.code(), absl::StrCat("writing ", path, ": ", s.message()));
  };
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(tmp);
  if (!file.ok()) return fail(file.status());
  if (absl::Status s = (*file)->Append(contents); !s.ok()) return fail(s);
  if (absl::Status s = (*file)->Sync(); !s.ok()) return fail(s);
  if (absl::Status s = (*file)->Close(); !s.ok()) return fail(s);
  file->reset();
  if (absl::Status s = env->RenameFile(tmp, path); !s.ok()) return fail(s);
  if (absl::Status s = env->SyncDir(Dirname(path)); !s.ok())
    return absl::Status(s.code(), absl::StrCat("writing ", path, ": ", s.message()));
  return absl::OkStatus();
}

absl::Status CreateWritableDir(Env* env, const std::string& dir) {
  if (absl::Status s = env->CreateDir(dir); !s.ok()) return s;
  const std::string probe = JoinPath(dir, absl::StrCat(".grps-write-check.", ::getpid()));
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(probe);
  if (!file.ok()) return file.status();
  absl::Status written = (*file)->Append("grps");
  written.Update((*file)->Close());
  file->reset();
  written.Update(env->RemoveFile(probe));
  return written;
}

}  // namespace grps
