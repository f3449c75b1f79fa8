// grps-delay-relay: a TCP relay that adds a fixed latency, for end-to-end
// tests on kernels without `tc netem` (test/e2e_multihost_test.sh). It
// accepts connections on --listen, opens one to --target for each, and
// forwards the bytes of both directions, holding every chunk it reads for
// --delay_us before writing it on. Put it in front of a listening daemon and
// make the clients dial it: each request/response through it then takes
// 2 x delay_us longer, as `netem delay` of delay_us on both hosts' egress
// would make it.
//
// Each direction of a connection has a reader thread, which timestamps what
// it reads, and a writer thread, which writes each chunk once its time has
// come: order is kept, and the delay adds no throughput limit of its own
// (the reader goes on reading while the writer waits). What is held per
// direction is capped at kMaxHeldBytes (the reader then waits, and TCP's flow
// control slows the sender). An end of stream is passed on as a half-close
// after the same delay; a failed write ends that direction. IPv4 literals only.
// Logs each connection's byte counts on stderr when it ends; runs until
// killed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, listen, "", "IPv4 address:port to accept connections on (required)");
ABSL_FLAG(std::string, target, "", "IPv4 address:port to forward each connection to (required)");
ABSL_FLAG(uint32_t, delay_us, 1000,
          "how long every chunk is held in each direction, in microseconds");

namespace grps {
namespace {

constexpr size_t kReadBytes = 256 << 10;
constexpr size_t kMaxHeldBytes = 16 << 20;

// "a.b.c.d:port" as a socket address, or nullopt when malformed.
std::optional<sockaddr_in> ParseAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  uint32_t port = 0;
  if (!absl::SimpleAtoi(text.substr(colon + 1), &port) || port > 65535) return std::nullopt;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, text.substr(0, colon).c_str(), &address.sin_addr) != 1)
    return std::nullopt;
  return address;
}

void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// One direction of a connection: bytes read from `from` are written to `to`
// `delay` after they were read. ReadLoop and WriteLoop each run on a thread
// of their own; the sockets belong to the Connection.
class DelayedPipe {
 public:
  DelayedPipe(int from, int to, absl::Duration delay) : from_(from), to_(to), delay_(delay) {}

  void ReadLoop() {
    std::vector<char> buffer(kReadBytes);
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &DelayedPipe::HasRoomOrFailed));
        if (write_failed_) return;
      }
      ssize_t n = read(from_, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      const absl::Time due = absl::Now() + delay_;
      absl::MutexLock lock(&mu_);
      if (n <= 0) {  // end of stream, or an error: passed on as a half-close
        held_.push_back(Chunk{due, std::string(), true});
        return;
      }
      held_.push_back(Chunk{due, std::string(buffer.data(), n), false});
      held_bytes_ += n;
    }
  }

  void WriteLoop() {
    for (;;) {
      Chunk chunk;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &DelayedPipe::HasChunk));
        chunk = std::move(held_.front());
        held_.pop_front();
      }
      absl::SleepFor(chunk.due - absl::Now());
      if (chunk.end) {
        shutdown(to_, SHUT_WR);
        return;
      }
      if (!WriteAll(chunk.bytes)) {
        absl::MutexLock lock(&mu_);
        write_failed_ = true;
        shutdown(from_, SHUT_RD);  // wakes a reader blocked in read()
        return;
      }
      bytes_ += chunk.bytes.size();
      absl::MutexLock lock(&mu_);
      held_bytes_ -= chunk.bytes.size();
    }
  }

  // Bytes written so far; read once both loops have returned.
  uint64_t bytes() const { return bytes_; }

 private:
  struct Chunk {
    absl::Time due;
    std::string bytes;
    bool end = false;
  };

  bool HasRoomOrFailed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return held_bytes_ < kMaxHeldBytes || write_failed_;
  }
  bool HasChunk() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_.empty(); }

  bool WriteAll(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = send(to_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += n;
    }
    return true;
  }

  const int from_;
  const int to_;
  const absl::Duration delay_;
  absl::Mutex mu_;
  std::deque<Chunk> held_ ABSL_GUARDED_BY(mu_);
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_ = 0;  // the writer thread's
};

// A relayed connection: owns both sockets, which it closes (and logs its
// counts) when the last of its four threads lets go of it.
class Connection {
 public:
  Connection(uint64_t id, int client, int target, absl::Duration delay)
      : id_(id), client_(client), target_(target),
        upstream_(client, target, delay), downstream_(target, client, delay) {}
  ~Connection() {
    std::fprintf(stderr, "connection %llu closed: %llu bytes to the target, %llu back\n",
                 static_cast<unsigned long long>(id_),
                 static_cast<unsigned long long>(upstream_.bytes()),
                 static_cast<unsigned long long>(downstream_.bytes()));
    close(client_);
    close(target_);
  }

  static void Start(const std::shared_ptr<Connection>& c) {
    std::thread([c] { c->upstream_.ReadLoop(); }).detach();
    std::thread([c] { c->upstream_.WriteLoop(); }).detach();
    std::thread([c] { c->downstream_.ReadLoop(); }).detach();
    std::thread([c] { c->downstream_.WriteLoop(); }).detach();
  }

 private:
  const uint64_t id_;
  const int client_;
  const int target_;
  DelayedPipe upstream_;
  DelayedPipe downstream_;
};

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "grps-delay-relay --listen=ADDR:PORT --target=ADDR:PORT --delay_us=N");
  absl::ParseCommandLine(argc, argv);
  const std::optional<sockaddr_in> listen = ParseAddress(absl::GetFlag(FLAGS_listen));
  const std::optional<sockaddr_in> target = ParseAddress(absl::GetFlag(FLAGS_target));
  if (!listen || !target) {
    std::fprintf(stderr, "grps-delay-relay: --listen and --target must be IPv4 address:port\n");
    return 2;
  }
  const absl::Duration delay = absl::Microseconds(absl::GetFlag(FLAGS_delay_us));
  signal(SIGPIPE, SIG_IGN);

  const int acceptor = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (acceptor < 0 ||
      setsockopt(acceptor, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      bind(acceptor, reinterpret_cast<const sockaddr*>(&*listen), sizeof(*listen)) != 0 ||
      ::listen(acceptor, 128) != 0) {
    std::fprintf(stderr, "grps-delay-relay: cannot listen on %s: %s\n",
                 absl::GetFlag(FLAGS_listen).c_str(), std::strerror(errno));
    return 1;
  }
  std::fprintf(stderr, "grps-delay-relay: %s -> %s, %s each way\n",
               absl::GetFlag(FLAGS_listen).c_str(), absl::GetFlag(FLAGS_target).c_str(),
               absl::FormatDuration(delay).c_str());
  for (uint64_t id = 1;; ++id) {
    const int client = accept4(acceptor, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno != EINTR && errno != ECONNABORTED)
        std::fprintf(stderr, "grps-delay-relay: accept: %s\n", std::strerror(errno));
      continue;
    }
    const int upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (upstream < 0 ||
        connect(upstream, reinterpret_cast<const sockaddr*>(&*target), sizeof(*target)) != 0) {
      // The client sees its connection closed, as if the target refused it.
      std::fprintf(stderr, "grps-delay-relay: connection %llu: cannot reach the target: %s\n",
                   static_cast<unsigned long long>(id), std::strerror(errno));
      if (upstream >= 0) close(upstream);
      close(client);
      continue;
    }
    SetNoDelay(client);
    SetNoDelay(upstream);
    Connection::Start(std::make_shared<Connection>(id, client, upstream, delay));
  }
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
