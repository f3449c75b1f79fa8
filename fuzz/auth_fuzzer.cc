// Fuzz target: per-call authentication (daemon/security.h), through real
// gRPC on 127.0.0.1. A coordinator served with the job's two tokens, and ONE
// channel that sends no token of its own; each input is up to four calls
// made at once on that channel, each with the metadata the input spells:
//
//   per call: [rpc][token kind][extra header count] then per extra header
//   [key kind][value length][value bytes]; a token kind of 3 reads a token
//   the same way ([length][bytes]). Bytes run out: the input ends.
//
// rpc 0 is GetJobStatus (any role), 1 CheckpointJob (the admin's; the job
// has no checkpoint_dir, so it changes nothing). Token kinds: none, the
// admin's, the worker's, arbitrary bytes, the admin's without "Bearer ".
// Extra headers: grps-role, authorization, grps-member-secret, or another
// name, with arbitrary printable values (the characters a gRPC client may
// send in a text header).
//
// What must hold, for every call, whatever the calls beside it carry: a call
// with no authorization header, more than one, or one that is not "Bearer "
// and a job token is UNAUTHENTICATED; the worker's token is never admitted to
// CheckpointJob (PERMISSION_DENIED), whatever grps-role header it sends;
// the admin's is never refused for its role. The server outlives inputs
// (starting one per input would be all the fuzzer did), but the calls change
// nothing it keeps: every input sees the same job.
#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_service.h"
#include "daemon/daemon.h"
#include "daemon/security.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/quiet_logs.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

constexpr char kAdmin[] = "fuzz-admin-token";
constexpr char kWorker[] = "fuzz-worker-token";
constexpr size_t kMaxCalls = 4;
constexpr size_t kMaxHeaders = 4;

// Reads the input front to back; past its end every read is 0 / empty.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // [length][bytes] as printable ASCII (a text header's legal characters).
  std::string Printable(size_t max) {
    const size_t length = Byte() % (max + 1);
    std::string out;
    for (size_t i = 0; i < length && pos_ < size_; ++i)
      out.push_back(static_cast<char>(0x20 + data_[pos_++] % 0x5f));
    return out;
  }

 private:
  const uint8_t* const data_;
  const size_t size_;
  size_t pos_ = 0;
};

struct Call {
  bool admin_rpc = false;
  std::vector<std::pair<std::string, std::string>> headers;
};

enum class Expect { kUnauthenticated, kAdmin, kWorker };

Expect Expected(const Call& call) {
  int authorizations = 0;
  std::string value;
  for (const auto& [key, v] : call.headers)
    if (key == "authorization") {
      ++authorizations;
      value = v;
    }
  if (authorizations != 1) return Expect::kUnauthenticated;
  if (value == absl::StrCat("Bearer ", kAdmin)) return Expect::kAdmin;
  if (value == absl::StrCat("Bearer ", kWorker)) return Expect::kWorker;
  return Expect::kUnauthenticated;
}

Call ReadCall(Reader* in) {
  Call call;
  call.admin_rpc = in->Byte() % 2 == 1;
  switch (in->Byte() % 5) {
    case 0: break;
    case 1: call.headers.push_back({"authorization", absl::StrCat("Bearer ", kAdmin)}); break;
    case 2: call.headers.push_back({"authorization", absl::StrCat("Bearer ", kWorker)}); break;
    case 3: call.headers.push_back({"authorization", in->Printable(40)}); break;
    case 4: call.headers.push_back({"authorization", kAdmin}); break;
  }
  const size_t extra = in->Byte() % (kMaxHeaders + 1);
  for (size_t i = 0; i < extra; ++i) {
    static const char* const kKeys[] = {"grps-role", "authorization", "grps-member-secret",
                                        "x-grps-fuzz"};
    const char* key = kKeys[in->Byte() % 4];
    call.headers.push_back({key, in->Printable(40)});
  }
  return call;
}

struct Served {
  std::unique_ptr<CoordinatorService> service;
  GrpcServer server;
  std::unique_ptr<v1::Coordinator::Stub> stub;  // one channel, no token of its own
};

Served& Server() {
  static Served* served = [] {
    auto* s = new Served();
    v1::JobConfig config = DefaultJobConfig();
    config.set_job_id("fuzz-job");
    config.set_num_servers(1);
    config.set_num_workers(1);
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config), 1, config.chunk_bytes());
    FUZZ_CHECK(map.ok(), map.status().ToString());
    CoordinatorOptions options;
    options.member_key = MemberKey(kAdmin);
    s->service = std::make_unique<CoordinatorService>(config, *map, &absl::Now, options);
    SecurityConfig security;
    security.admin_token = kAdmin;
    security.worker_token = kWorker;
    absl::StatusOr<GrpcServer> server =
        StartGrpcServer("127.0.0.1:0", {s->service.get()}, security);
    FUZZ_CHECK(server.ok(), server.status().ToString());
    s->server = std::move(*server);
    s->stub = v1::Coordinator::NewStub(MakeChannel(
        absl::StrCat("127.0.0.1:", s->server.port), SecurityConfig(), false));
    // Stopped and freed at exit, before LeakSanitizer's check of the run
    // (registered earlier, so run later): a server still running would
    // hold its threads' memory.
    std::atexit([] {
      Served& s = Server();
      s.stub.reset();
      s.service->Shutdown();
      s.server.server->Shutdown();
      s.server.server->Wait();
      s.server = GrpcServer();
      s.service.reset();
    });
    return s;
  }();
  return *served;
}

grpc::Status Make(const Call& call) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  for (const auto& [key, value] : call.headers) context.AddMetadata(key, value);
  if (call.admin_rpc) {
    v1::CheckpointJobResponse reply;
    return Server().stub->CheckpointJob(&context, {}, &reply);
  }
  v1::JobStatus reply;
  return Server().stub->GetJobStatus(&context, {}, &reply);
}

void Check(const Call& call, const grpc::Status& status) {
  const std::string what = absl::StrCat(call.admin_rpc ? "CheckpointJob" : "GetJobStatus",
                                        " got ", status.error_code(), " ",
                                        status.error_message());
  switch (Expected(call)) {
    case Expect::kUnauthenticated:
      FUZZ_CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED, what);
      break;
    case Expect::kWorker:
      FUZZ_CHECK(call.admin_rpc ? status.error_code() == grpc::StatusCode::PERMISSION_DENIED
                                : status.ok(),
                 what);
      break;
    case Expect::kAdmin:
      FUZZ_CHECK(status.error_code() != grpc::StatusCode::PERMISSION_DENIED &&
                     status.error_code() != grpc::StatusCode::UNAUTHENTICATED,
                 what);
      break;
  }
}

}  // namespace
}  // namespace grps

// libFuzzer calls this before it reads its flags. Its leak check after each
// input (-detect_leaks) assumes an input frees what it allocated; the
// long-lived gRPC server's threads and per-connection state come and go
// across inputs, which that check would report as leaks of each input.
// Every other sanitizer check stays on, and LeakSanitizer still checks the
// whole run at exit, once the server is stopped and freed.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static std::vector<char*> args;
  static char no_leak_check[] = "-detect_leaks=0";
  args.assign(*argv, *argv + *argc);
  args.insert(args.begin() + (*argc > 0 ? 1 : 0), no_leak_check);
  args.push_back(nullptr);
  *argc = static_cast<int>(args.size()) - 1;
  *argv = args.data();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  grps::QuietLogs();
  grps::Reader in(data, size);
  std::vector<grps::Call> calls;
  while (!in.empty() && calls.size() < grps::kMaxCalls) calls.push_back(grps::ReadCall(&in));
  std::vector<grpc::Status> statuses(calls.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i)
    threads.emplace_back([&, i] { statuses[i] = grps::Make(calls[i]); });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < calls.size(); ++i) grps::Check(calls[i], statuses[i]);
  return 0;
}
