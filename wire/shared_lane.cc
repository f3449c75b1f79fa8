#include "wire/shared_lane.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace grps {
namespace {

// The header: magic, then the nonce; the rest of kLaneHeaderBytes is zero.
constexpr char kMagic[8] = {'g', 'r', 'p', 's', 'l', 'a', 'n', 'e'};
// The memfd's name, as /proc/<pid>/fd/<fd> shows it ("/memfd:NAME (deleted)").
constexpr char kMemfdName[] = "grps-lane";
constexpr unsigned kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

uint64_t RandomNonce() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// Closes `fd` when it goes out of scope unless released.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<LaneSegment>> LaneSegment::Create(uint64_t value_bytes) {
  if (value_bytes > kMaxLaneBytes - kLaneHeaderBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("a lane of ", value_bytes, " bytes is larger than ", kMaxLaneBytes));
  const uint64_t size = kLaneHeaderBytes + value_bytes;
  const int fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return absl::UnimplementedError(Errno("memfd_create (a sealable memfd)"));
  FdCloser closer(fd);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return absl::InternalError(Errno("ftruncate"));
  if (fcntl(fd, F_ADD_SEALS, kRequiredSeals) != 0)
    return absl::UnimplementedError(Errno("sealing the lane"));
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return absl::InternalError(Errno("mmap"));
  // Touch every page now: the first push should not pay the page faults.
  std::memset(base, 0, size);
  const uint64_t nonce = RandomNonce();
  std::memcpy(base, kMagic, sizeof(kMagic));
  std::memcpy(static_cast<char*>(base) + sizeof(kMagic), &nonce, sizeof(nonce));
  return std::shared_ptr<LaneSegment>(
      new LaneSegment(closer.release(), static_cast<char*>(base), size, nonce));
}

LaneSegment::~LaneSegment() {
  munmap(base_, size_);
  close(fd_);
}

v1::SharedLane LaneSegment::Ref() const {
  v1::SharedLane ref;
  ref.set_pid(static_cast<uint32_t>(getpid()));
  ref.set_fd(fd_);
  ref.set_size(size_);
  ref.set_nonce(nonce_);
  return ref;
}

absl::StatusOr<std::shared_ptr<MappedLane>> MappedLane::Open(const v1::SharedLane& ref) {
  if (ref.size() < kLaneHeaderBytes || ref.size() > kMaxLaneBytes || ref.fd() < 0 ||
      ref.pid() == 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "lane of pid ", ref.pid(), " fd ", ref.fd(), " size ", ref.size(), " is malformed"));
  const std::string path = absl::StrCat("/proc/", ref.pid(), "/fd/", ref.fd());
  const std::string what = absl::StrCat("lane ", path);
  // Another network namespace is another host, even where the PID
  // namespace is shared (test hosts made with `ip netns`): no lane.
  struct stat ours, theirs;
  if (stat("/proc/self/ns/net", &ours) != 0 ||
      stat(absl::StrCat("/proc/", ref.pid(), "/ns/net").c_str(), &theirs) != 0)
    return absl::FailedPreconditionError(Errno(absl::StrCat(what, ": network namespace").c_str()));
  if (ours.st_ino != theirs.st_ino || ours.st_dev != theirs.st_dev)
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the worker is in another network namespace"));
  // Only a grps memfd is opened at all: never a device, a FIFO or a file
  // of the process that the name might lead to.
  char target[128] = {};
  const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
  if (n < 0) return absl::FailedPreconditionError(Errno(what.c_str()));
  if (!absl::StartsWith(absl::string_view(target, n), absl::StrCat("/memfd:", kMemfdName)))
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is not a grps lane (", absl::string_view(target, n), ")"));
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return absl::FailedPreconditionError(Errno(what.c_str()));
  FdCloser closer(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::FailedPreconditionError(Errno(what.c_str()));
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != ref.size())
    return absl::FailedPreconditionError(absl::StrCat(
        what, " has ", st.st_size, " bytes, not the ", ref.size(), " the push names"));
  // Sealed against shrinking: no later ftruncate by the worker can make a
  // read or write of this mapping fault (SIGBUS).
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (static_cast<unsigned>(seals) & kRequiredSeals) != kRequiredSeals)
    return absl::FailedPreconditionError(absl::StrCat(what, " is not sealed against resizing"));
  void* base = mmap(nullptr, ref.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return absl::FailedPreconditionError(Errno(what.c_str()));
  std::shared_ptr<MappedLane> lane(new MappedLane(ref, static_cast<char*>(base)));
  uint64_t nonce;
  std::memcpy(&nonce, lane->base_ + sizeof(kMagic), sizeof(nonce));
  if (std::memcmp(lane->base_, kMagic, sizeof(kMagic)) != 0 || nonce != ref.nonce())
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is another lane (its nonce differs)"));
  return lane;
}

MappedLane::~MappedLane() { munmap(base_, size_); }

bool MappedLane::Names(const v1::SharedLane& ref) const {
  return ref.pid() == pid_ && ref.fd() == fd_ && ref.size() == size_ && ref.nonce() == nonce_;
}

absl::StatusOr<char*> MappedLane::At(uint64_t offset, uint64_t bytes) const {
  if (!LaneSpanWithin(offset, bytes, kLaneHeaderBytes, size_))
    return absl::InvalidArgumentError(absl::StrCat(
        bytes, " bytes at offset ", offset, " are outside the lane's values [",
        kLaneHeaderBytes, ", ", size_, ")"));
  (void)writes_.load(std::memory_order_acquire);
  return base_ + offset;
}

absl::StatusOr<std::shared_ptr<MappedLane>> LaneTable::Get(uint32_t rank,
                                                           const v1::SharedLane& ref) {
  {
    absl::MutexLock lock(&mu_);
    auto it = by_rank_.find(rank);
    if (it != by_rank_.end() && it->second->Names(ref)) return it->second;
  }
  // Mapped outside the lock (a lane may be large); calls that name the same
  // new lane at once all get the mapping the first of them stored, so the
  // shard holds one lane per worker (a doorbell opened on a second mapping
  // of the same lane would replace the first and miss what was rung there).
  absl::StatusOr<std::shared_ptr<MappedLane>> lane = MappedLane::Open(ref);
  if (!lane.ok()) return lane.status();
  absl::MutexLock lock(&mu_);
  std::shared_ptr<MappedLane>& current = by_rank_[rank];
  if (current == nullptr || !current->Names(ref)) current = *lane;
  return current;
}

bool LaneTable::IsCurrent(uint32_t rank, const MappedLane* lane) const {
  absl::MutexLock lock(&mu_);
  auto it = by_rank_.find(rank);
  return it != by_rank_.end() && it->second.get() == lane;
}

}  // namespace grps
