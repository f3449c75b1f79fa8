// Env: the file operations grps needs, behind an interface so that tests can
// inject faults (LevelDB's Env and db/fault_injection_test.cc are the model).
// Every file a grps process writes for someone else to read (port files,
// checkpoints, manifests, the coordinator's state) goes through
// WriteFileAtomically, so a reader never sees a partial file.
//
// Errors are returned as absl::Status naming the path and the errno text:
// NOT_FOUND for a missing file or folder, UNAVAILABLE for any other I/O
// failure (a full disk or a failed fsync may pass; the caller retries or
// reports), never a crash.
//
// Thread safety: Env::Default() and its files may be used from any thread;
// one WritableFile is used by one thread at a time.
#ifndef GRPS_DAEMON_ENV_H_
#define GRPS_DAEMON_ENV_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grps {

// A file being written. Data appended is not durable until Sync() returns OK.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual absl::Status Append(absl::string_view data) = 0;
  virtual absl::Status Sync() = 0;   // fsync
  virtual absl::Status Close() = 0;  // idempotent; the destructor closes too
};

class Env {
 public:
  virtual ~Env() = default;

  // The real file system (POSIX). Never deleted.
  static Env* Default();

  // Creates or truncates `path`.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // The whole file.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // rename(2): atomic replacement of `to`.
  virtual absl::Status RenameFile(const std::string& from,
                                  const std::string& to) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // fsync of a folder, so that a rename or a new entry in it is durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // mkdir -p; OK when it exists.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // Names (not paths) of the entries of `dir`, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) = 0;
  virtual bool FileExists(const std::string& path) = 0;
};

// Writes `contents` to `path` so that a reader sees either the old file or
// the whole new one, and the new one survives a crash once this returns OK:
// a temporary file beside `path` (unique per process and call), append,
// fsync, close, rename over `path`, fsync of the folder. On any failure the
// temporary file is removed, `path` is untouched, and the status names the
// step that failed.
absl::Status WriteFileAtomically(Env* env, const std::string& path,
                                 absl::string_view contents);

// `dir` made (mkdir -p) and a file written in it and removed: OK when this
// process can write there, else the status names the step that failed. For
// a daemon's folders at its start, not at the first checkpoint.
absl::Status CreateWritableDir(Env* env, const std::string& dir);

// "<dir>/<name>" (one slash).
std::string JoinPath(absl::string_view dir, absl::string_view name);

}  // namespace grps

#endif  // GRPS_DAEMON_ENV_H_
