// grps-auth-load: an outside client of a job that authenticates every RPC,
// for the tests and drills of per-call authentication (docs/security.md).
// Every call of one run goes over ONE channel (one connection), as a hostile
// or merely busy client would send them.
//
//   --rpc=heartbeat  registers as --rank (the worker token; see --rpc=register),
//                    then --threads
//                    threads each send --calls heartbeats as that rank, with
//                    its member secret
//   --rpc=push       the same, with pushes of a zero gradient to the first
//                    chunk of shard 0 (each push its own step)
//   --rpc=shard_status  --threads x --calls GetShardStatus to --target (or
//                    shard 0 of the coordinator's map)
//   --rpc=roles      one channel, two tokens: GetJobStatus with --token,
//                    then StopJob with --worker_token (must be refused);
//                    a second channel: GetJobStatus with --worker_token, then
//                    CheckpointJob with --token (must not be refused for its
//                    role)
//   --rpc=register   one RegisterWorker for --rank with no member secret,
//                    retried while ALREADY_EXISTS for up to --wait_s
//
// Prints one line per run ("heartbeat: 80000 calls, 80000 OK, ...") and
// exits 0 when every call ended as it should, 1 otherwise, 2 on bad flags.
// --token is the admin token (GRPS_TOKEN), --worker_token the worker token
// (GRPS_WORKER_TOKEN), both daemon/security.cc's flags.
#include <atomic>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/daemon.h"
#include "daemon/security.h"
#include "proto/grps.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "", "the coordinator's host:port (required)");
ABSL_FLAG(std::string, rpc, "heartbeat",
          "heartbeat, push, shard_status, roles or register");
ABSL_FLAG(std::string, job_id, "", "the job's id (empty: the coordinator's)");
ABSL_FLAG(int32_t, rank, 0, "the worker rank to register as");
ABSL_FLAG(uint32_t, threads, 8, "threads sending calls at once on the one channel");
ABSL_FLAG(uint32_t, calls, 10000, "calls per thread");
ABSL_FLAG(std::string, target, "", "shard_status: the shard's host:port");
ABSL_FLAG(double, wait_s, 0, "register: retry ALREADY_EXISTS for this long");
ABSL_DECLARE_FLAG(std::string, token);
ABSL_DECLARE_FLAG(std::string, worker_token);

namespace grps {
namespace {

constexpr char kSecretHeader[] = "grps-member-secret";

std::unique_ptr<grpc::ClientContext> Context(const std::string& secret = "") {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  if (!secret.empty()) context->AddMetadata(kSecretHeader, secret);
  return context;
}

// A channel that sends `token` on every call (empty: none).
std::shared_ptr<grpc::Channel> Channel(const std::string& target, const std::string& token) {
  SecurityConfig caller;
  caller.call_token = token;
  return MakeChannel(target, caller, /*member_secret_source=*/false);
}

// Tallies the status codes of many calls, from many threads.
class Tally {
 public:
  void Add(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    ++codes_[status.error_code()];
    if (!status.ok() && first_error_.empty())
      first_error_ = absl::StrCat(status.error_code(), ": ", status.error_message());
  }
  // "N calls, K OK[, M code C][; first error: ...]"; true when all were OK.
  bool Print(const std::string& what) {
    absl::MutexLock lock(&mu_);
    uint64_t total = 0;
    std::string others;
    for (const auto& [code, n] : codes_) {
      total += n;
      if (code != grpc::StatusCode::OK) absl::StrAppend(&others, ", ", n, " code ", code);
    }
    std::printf("%s: %llu calls, %llu OK%s%s\n", what.c_str(),
                static_cast<unsigned long long>(total),
                static_cast<unsigned long long>(codes_[grpc::StatusCode::OK]), others.c_str(),
                first_error_.empty() ? "" : absl::StrCat("; first error ", first_error_).c_str());
    return others.empty();
  }

 private:
  absl::Mutex mu_;
  std::map<grpc::StatusCode, uint64_t> codes_ ABSL_GUARDED_BY(mu_);
  std::string first_error_ ABSL_GUARDED_BY(mu_);
};

// Runs `call(thread, i)` --calls times on each of --threads threads.
void Hammer(const std::function<grpc::Status(uint32_t, uint32_t)>& call, Tally* tally) {
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < absl::GetFlag(FLAGS_threads); ++t)
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; i < absl::GetFlag(FLAGS_calls); ++i) tally->Add(call(t, i));
    });
  for (std::thread& thread : threads) thread.join();
}

absl::StatusOr<v1::RegisterWorkerResponse> Register(v1::Coordinator::Stub* stub,
                                                    const std::string& secret) {
  v1::RegisterWorkerRequest request;
  request.set_job_id(absl::GetFlag(FLAGS_job_id));
  request.set_requested_rank(absl::GetFlag(FLAGS_rank));
  request.set_host("grps-auth-load");
  request.set_backend("none");
  v1::RegisterWorkerResponse reply;
  grpc::Status status = stub->RegisterWorker(Context(secret).get(), request, &reply);
  if (!status.ok()) return ToAbsl(status);
  return reply;
}

int Heartbeats(v1::Coordinator::Stub* stub, const v1::RegisterWorkerResponse& me) {
  Tally tally;
  Hammer(
      [&](uint32_t, uint32_t) {
        v1::HeartbeatRequest request;
        request.set_job_id(me.config().job_id());
        request.set_worker_rank(me.rank());
        request.set_incarnation(me.incarnation());
        v1::HeartbeatResponse reply;
        return stub->Heartbeat(Context(me.member_secret()).get(), request, &reply);
      },
      &tally);
  return tally.Print(absl::StrCat("heartbeat as rank ", me.rank())) ? 0 : 1;
}

int Pushes(const v1::RegisterWorkerResponse& me) {
  const v1::ChunkSpec* chunk = nullptr;
  for (const v1::ChunkSpec& c : me.shard_map().chunks())
    if (c.shard() == 0) {
      chunk = &c;
      break;
    }
  if (chunk == nullptr) {
    std::fprintf(stderr, "grps-auth-load: shard 0 holds no chunk\n");
    return 1;
  }
  auto stub = v1::ParameterServer::NewStub(
      Channel(me.shard_map().shards(0).address(), absl::GetFlag(FLAGS_worker_token)));
  const std::string zeros(chunk->num_elements() * sizeof(float), '\0');
  auto push = [&](uint64_t step) {
    v1::PushRequest request;
    request.set_job_id(me.config().job_id());
    request.set_worker_rank(me.rank());
    request.set_incarnation(me.incarnation());
    request.set_step(step);
    request.set_num_samples(1);
    request.set_generation(me.generation());
    v1::ChunkData* data = request.add_chunks();
    data->set_chunk_id(chunk->chunk_id());
    data->set_dtype(v1::DTYPE_F32);
    data->set_data(zeros);
    v1::PushResponse reply;
    return stub->Push(Context(me.member_secret()).get(), request, &reply);
  };
  // The shard hears of our incarnation in its next heartbeat reply: until
  // then it may refuse us.
  const uint64_t hammered = uint64_t{absl::GetFlag(FLAGS_threads)} * absl::GetFlag(FLAGS_calls);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  grpc::Status first = push(hammered);
  while (!first.ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(100));
    first = push(hammered);
  }
  if (!first.ok()) {
    std::fprintf(stderr, "grps-auth-load: shard 0 refuses our pushes: %s\n",
                 first.error_message().c_str());
    return 1;
  }
  Tally tally;
  Hammer([&](uint32_t thread, uint32_t i) {
    return push(uint64_t{thread} * absl::GetFlag(FLAGS_calls) + i);
  }, &tally);
  return tally.Print(absl::StrCat("push as rank ", me.rank(), " to shard 0")) ? 0 : 1;
}

int ShardStatuses(v1::Coordinator::Stub* coordinator) {
  v1::JobStatus job;
  grpc::Status status = coordinator->GetJobStatus(Context().get(), {}, &job);
  if (!status.ok() || job.shards_size() == 0) {
    std::fprintf(stderr, "grps-auth-load: no job status: %s\n",
                 status.error_message().c_str());
    return 1;
  }
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) target = job.shards(0).address();
  auto stub = v1::ParameterServer::NewStub(Channel(target, absl::GetFlag(FLAGS_token)));
  v1::GetShardStatusRequest request;
  request.set_job_id(job.job_id());
  Tally tally;
  Hammer(
      [&](uint32_t, uint32_t) {
        v1::ShardStatus reply;
        return stub->GetShardStatus(Context().get(), request, &reply);
      },
      &tally);
  return tally.Print(absl::StrCat("GetShardStatus to ", target)) ? 0 : 1;
}

// A call on a channel with no token of its own, carrying `token`.
std::unique_ptr<grpc::ClientContext> WithToken(const std::string& token) {
  std::unique_ptr<grpc::ClientContext> context = Context();
  context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  return context;
}

int Roles() {
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  const std::string admin = absl::GetFlag(FLAGS_token);
  const std::string worker = absl::GetFlag(FLAGS_worker_token);
  bool as_expected = true;
  v1::JobStatus status;
  {
    auto stub = v1::Coordinator::NewStub(Channel(coordinator, ""));
    grpc::Status first = stub->GetJobStatus(WithToken(admin).get(), {}, &status);
    v1::StopJobRequest stop;
    stop.set_reason("grps-auth-load: the worker token after the admin token");
    v1::StopJobResponse stopped;
    grpc::Status second = stub->StopJob(WithToken(worker).get(), stop, &stopped);
    std::printf("one channel: GetJobStatus with the admin token: %d; then StopJob with "
                "the worker token: %d %s\n",
                first.error_code(), second.error_code(), second.error_message().c_str());
    as_expected &= first.ok() && second.error_code() == grpc::StatusCode::PERMISSION_DENIED;
  }
  {
    auto stub = v1::Coordinator::NewStub(Channel(coordinator, ""));
    grpc::Status first = stub->GetJobStatus(WithToken(worker).get(), {}, &status);
    v1::CheckpointJobResponse checkpoint;
    grpc::Status second = stub->CheckpointJob(WithToken(admin).get(), {}, &checkpoint);
    std::printf("another channel: GetJobStatus with the worker token: %d; then "
                "CheckpointJob with the admin token: %d %s\n",
                first.error_code(), second.error_code(), second.error_message().c_str());
    as_expected &= first.ok() && second.error_code() != grpc::StatusCode::PERMISSION_DENIED &&
                   second.error_code() != grpc::StatusCode::UNAUTHENTICATED;
  }
  return as_expected ? 0 : 1;
}

// Registers as --rank with no member secret, again every 100 ms while the
// rank is refused as live (ALREADY_EXISTS), for up to --wait_s. Prints the
// first refusal and the outcome.
absl::StatusOr<v1::RegisterWorkerResponse> RegisterWaiting(v1::Coordinator::Stub* stub) {
  const absl::Time start = absl::Now();
  const absl::Time give_up = start + absl::Seconds(absl::GetFlag(FLAGS_wait_s));
  int tries = 0;
  absl::StatusOr<v1::RegisterWorkerResponse> reply;
  std::string first_refusal;
  do {
    if (tries > 0) absl::SleepFor(absl::Milliseconds(100));
    ++tries;
    reply = Register(stub, "");
    if (absl::IsAlreadyExists(reply.status()) && first_refusal.empty())
      first_refusal = std::string(reply.status().message());
  } while (absl::IsAlreadyExists(reply.status()) && absl::Now() < give_up);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!first_refusal.empty())
    std::printf("refused: ALREADY_EXISTS: %s\n", first_refusal.c_str());
  if (reply.ok())
    std::printf("granted: rank %u (incarnation %llu) after %d tries, %.2f s\n", reply->rank(),
                static_cast<unsigned long long>(reply->incarnation()), tries, seconds);
  else
    std::printf("not granted after %d tries, %.2f s: %s\n", tries, seconds,
                reply.status().ToString().c_str());
  std::fflush(stdout);
  return reply;
}

int Main(int argc, char** argv) {
  ParseFlagsWithEnvironment(argc, argv,
                            "grps-auth-load --coordinator=HOST:PORT --rpc=KIND [flags]");
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  const std::string rpc = absl::GetFlag(FLAGS_rpc);
  if (coordinator.empty() || absl::GetFlag(FLAGS_threads) == 0 ||
      absl::GetFlag(FLAGS_threads) > 64) {
    std::fprintf(stderr, "grps-auth-load: --coordinator is required, --threads 1..64\n");
    return 2;
  }
  if (rpc == "roles") return Roles();
  const bool as_worker = rpc == "heartbeat" || rpc == "push" || rpc == "register";
  auto stub = v1::Coordinator::NewStub(Channel(
      coordinator, as_worker ? absl::GetFlag(FLAGS_worker_token) : absl::GetFlag(FLAGS_token)));
  if (rpc == "shard_status") return ShardStatuses(stub.get());
  if (rpc != "heartbeat" && rpc != "push" && rpc != "register") {
    std::fprintf(stderr, "grps-auth-load: unknown --rpc=%s\n", rpc.c_str());
    return 2;
  }
  absl::StatusOr<v1::RegisterWorkerResponse> me = RegisterWaiting(stub.get());
  if (!me.ok()) return 1;
  if (rpc == "register") return 0;
  return rpc == "heartbeat" ? Heartbeats(stub.get(), *me) : Pushes(*me);
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
