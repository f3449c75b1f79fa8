// grps_wire_bench: a push and then a pull of a dense model of 1, 16, 64 and
// 256 MiB through 1 and 2 shards, beside two yardsticks measured in the same
// run on the same loopback (and, last, sparse rows beside the dense path of
// the same bytes: see SparseVersusDense):
//   - bare gRPC: the same bytes as one ByteBuffer each way (the request from
//     slices over a stored array, the reply from slices over another), on
//     one channel, each copied once out of the received slices and nothing
//     decoded or applied: what gRPC itself costs;
//   - loopback TCP (Boost.Asio): the same bytes written and read back on one
//     connection ("tcp"), and written while read back ("tcp both"): what the
//     kernel's loopback costs.
// The grps figures are the real path: ParameterClient (wire/ codec, requests
// of about 4 MiB to these shards on this machine, 256 KiB to another's as
// with --remote across hosts (ChunkLayout::PartBytesFor), on one channel per
// shard, the push schedule's) to ShardStores behind their
// gRPC servers in this process, in async mode, so each push is validated and
// applied (SGD) on arrival and each pull is served at once:
//   - "grps 1s", "grps 2s": every byte through gRPC (local_transport grpc),
//     a push and then a pull; "2s fused": the push fused with the pull, as a
//     worker sends them, each part's weights coming back as later parts go
//     up;
//   - "shm 2s": through the worker's shared-memory lane (the default for a
//     shard on the same machine; wire/shared_lane.h), a push fused with the
//     pull as grps-worker sends it: the values cross no socket.
// Each figure is the best of --reps (after one warm-up); the table ends with
// the times over bare gRPC's, and the rates against TCP's of the same
// pattern (bare gRPC and grps 2s against a push then a pull, the fused push
// against both ways at once).
//
// Across hosts (scripts/wire-cross-host runs it on two network-namespace
// hosts): one process serves the yardsticks' peer and 2 shards (--serve),
// another on the other host measures against them (--remote): TCP a push
// then a pull and both ways at once, bare gRPC, and grps a push then a pull
// and a push fused with the pull, each grps figure against TCP's of the same
// pattern.
//
//   grps_wire_bench                   # 1, 16, 64, 256 MiB
//   grps_wire_bench --mib=64 --reps=5
//   grps_wire_bench --mib=64 --serve=10.0.0.1 --serve_file=/tmp/peer   # host A
//   grps_wire_bench --mib=64 --remote=/tmp/peer                        # host B
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "boost/asio.hpp"
#include "daemon/daemon.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "proto/grps.grpc.pb.h"
#include "test/in_process_shards.h"
#include "worker/parameter_client.h"
#include "worker/sparse_client.h"

ABSL_FLAG(std::string, mib, "1,16,64,256", "model sizes in MiB");
ABSL_FLAG(int, reps, 3, "timed repetitions per figure (best is shown)");
ABSL_FLAG(uint64_t, sync_steps, 1000,
          "sync steps of the default model with no compute (0: skip)");
ABSL_FLAG(std::string, sparse_rows, "1024,16384,131072",
          "sparse: rows per push + pull (\"\": skip)");
ABSL_FLAG(std::string, sparse_dims, "16,64", "sparse: floats per row");
ABSL_FLAG(std::string, serve, "",
          "across hosts: serve the yardsticks' peer and 2 shards on this IP address (one size "
          "in --mib), for a --remote run on another host");
ABSL_FLAG(std::string, serve_file, "", "with --serve: where to write the peer's addresses");
ABSL_FLAG(int, serve_seconds, 600, "with --serve: exit after this many seconds");
ABSL_FLAG(std::string, remote, "",
          "across hosts: the --serve_file of a peer on another host; measure against it");

namespace grps {
namespace {

using Clock = std::function<void()>;

// Best wall time of `reps` runs of `f`, after one warm-up, in ms.
double BestMs(int reps, const Clock& f) {
  f();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const absl::Time t = absl::Now();
    f();
    best = std::min(best, absl::ToDoubleMilliseconds(absl::Now() - t));
  }
  return best;
}

// ---- Yardstick: bare gRPC ByteBuffers ----

// Copies a message's bytes into `out` (grown as needed), once.
void CopyOut(const grpc::ByteBuffer& message, std::vector<char>* out) {
  std::vector<grpc::Slice> slices;
  if (!message.Valid() || !message.Dump(&slices).ok()) return;
  size_t at = 0;
  for (const grpc::Slice& s : slices) {
    if (out->size() < at + s.size()) out->resize(at + s.size());
    std::memcpy(out->data() + at, s.begin(), s.size());
    at += s.size();
  }
}

// A valid message of no bytes (a default ByteBuffer is not one).
grpc::ByteBuffer Empty() {
  grpc::Slice none;
  return grpc::ByteBuffer(&none, 1);
}

// Push copies what arrived once into a reused array and answers nothing;
// Pull answers with slices over an array built once. No protobuf, no
// store: the least a receiver must do is take the bytes out once.
class BareService final
    : public v1::ParameterServer::WithRawCallbackMethod_Push<
          v1::ParameterServer::WithRawCallbackMethod_Pull<v1::ParameterServer::Service>> {
 public:
  explicit BareService(size_t bytes) : stored_(bytes, 'v'), received_(bytes) {}
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    CopyOut(*request, &received_);
    *response = Empty();
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    grpc::Slice slice(stored_.data(), stored_.size(), grpc::Slice::STATIC_SLICE);
    *response = grpc::ByteBuffer(&slice, 1);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const std::string stored_;
  std::vector<char> received_;  // one push at a time in this benchmark
};

// BareService behind its own gRPC server on a free port of `host`.
struct BareServer {
  explicit BareServer(size_t bytes, const std::string& host = "127.0.0.1") : service(bytes) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat(host, ":0"), grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat(host, ":", port);
  }
  ~BareServer() {
    if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
  }
  BareService service;
  int port = 0;
  std::string address;
  std::unique_ptr<grpc::Server> server;
};

// Best time of a push of `bytes` and then a pull of as many, as bare
// ByteBuffers to the BareService at `address`.
double BareGrpcMs(const std::string& address, size_t bytes, int reps) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  grpc::GenericStub stub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  const std::string grads(bytes, 'g');
  std::vector<char> params(bytes);
  auto call = [&](const char* method, const grpc::ByteBuffer& request) {
    grpc::ClientContext context;
    grpc::ByteBuffer reply;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    StartUnaryCall(
        [&](grpc::ClientUnaryReactor* r) {
          stub.PrepareUnaryCall(&context, method, grpc::StubOptions(), &request, &reply, r);
        },
        [&](grpc::Status) {
          std::lock_guard<std::mutex> lock(mu);
          done = true;
          cv.notify_one();
        });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    CopyOut(reply, &params);
  };
  return BestMs(reps, [&] {
    grpc::Slice slice(grads.data(), grads.size(), grpc::Slice::STATIC_SLICE);
    call("/grps.v1.ParameterServer/Push", grpc::ByteBuffer(&slice, 1));
    call("/grps.v1.ParameterServer/Pull", Empty());
  });
}

double BareGrpcMs(size_t bytes, int reps) {
  BareServer bare(bytes);
  return BareGrpcMs(bare.address, bytes, reps);
}

// ---- Yardstick: TCP ----

namespace asio = boost::asio;
using asio::ip::tcp;

// One round of the TCP yardstick: the client sends this header, then
// `bytes` bytes; the peer sends as many back, after it has read them all
// (duplex 0: a push, then a pull) or while it reads them (duplex 1: both
// directions at once, as a fused push and pull moves them).
struct TcpRound {
  uint64_t bytes;
  uint64_t duplex;
};

// The peer's side of one connection: rounds until the client closes it.
void ServeTcpConnection(tcp::socket& s) {
  s.set_option(tcp::no_delay(true));
  std::vector<char> in, out;
  for (;;) {
    TcpRound round;
    boost::system::error_code ec;
    asio::read(s, asio::buffer(&round, sizeof(round)), ec);
    if (ec || round.bytes > (uint64_t{1} << 34)) return;  // closed, or not our client
    in.resize(round.bytes);
    out.resize(round.bytes, 'v');
    boost::system::error_code wrote;
    if (round.duplex != 0) {
      std::thread writer([&] { asio::write(s, asio::buffer(out), wrote); });
      asio::read(s, asio::buffer(in), ec);
      writer.join();
    } else {
      asio::read(s, asio::buffer(in), ec);
      if (!ec) asio::write(s, asio::buffer(out), wrote);
    }
    if (ec || wrote) return;
  }
}

// Best time of a round of `bytes` each way with the peer at `peer`.
double TcpMs(const tcp::endpoint& peer, size_t bytes, int reps, bool duplex) {
  asio::io_context io;
  tcp::socket c(io);
  c.connect(peer);
  c.set_option(tcp::no_delay(true));
  std::vector<char> out(bytes, 'g'), in(bytes);
  const TcpRound round{bytes, duplex ? 1u : 0u};
  return BestMs(reps, [&] {
    asio::write(c, asio::buffer(&round, sizeof(round)));
    if (duplex) {
      std::thread writer([&] { asio::write(c, asio::buffer(out)); });
      asio::read(c, asio::buffer(in));
      writer.join();
    } else {
      asio::write(c, asio::buffer(out));
      asio::read(c, asio::buffer(in));
    }
  });
}

// The same on loopback, with the peer in this process.
double TcpMs(size_t bytes, int reps, bool duplex) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  std::thread peer([&] {
    tcp::socket s(io);
    acceptor.accept(s);
    ServeTcpConnection(s);
  });
  const double ms = TcpMs(acceptor.local_endpoint(), bytes, reps, duplex);
  peer.join();
  return ms;
}

// ---- grps: ParameterClient to ShardStores over gRPC ----

// Shards of a one-tensor model of `bytes`, served in this process with every
// worker of `config` live.
struct Shards {
  v1::ShardMap map;
  InProcessShards served;
};

std::unique_ptr<Shards> Serve(const v1::JobConfig& config, size_t bytes, std::string* error,
                              const std::string& host = "127.0.0.1") {
  absl::StatusOr<v1::ShardMap> map =
      OneTensorMap(config, static_cast<int64_t>(bytes / sizeof(float)));
  if (!map.ok()) {
    *error = std::string(map.status().message());
    return nullptr;
  }
  auto shards = std::make_unique<Shards>();
  shards->map = std::move(*map);
  if (absl::Status s = shards->served.Serve(config, &shards->map, SecurityConfig(), host);
      !s.ok()) {
    *error = std::string(s.message());
    return nullptr;
  }
  shards->served.SetLiveWorkers(config.num_workers());
  return shards;
}

// Best time of a push of `elements` gradients and a pull of the next step's
// weights by one ParameterClient (rank 0) of `map`, from clock *step on;
// `fused`: in one round trip (PushAsync with pull_into). The first failure,
// or a fused push whose reply lacked the weights, goes to *failed.
double DensePushPullMs(const v1::JobConfig& config, const v1::ShardMap& map, size_t elements,
                       int reps, uint64_t* step, absl::Status* failed, bool fused = false) {
  ParameterClient client(config, map, 0, 1);
  std::vector<float> grads(elements, 1e-3f), params(elements);
  return BestMs(reps, [&] {
    if (fused) {
      absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(
          client.PushAsync((*step)++, grads.data(), 1, params.data(), absl::Seconds(30)));
      if (failed->ok() && !pushed.ok()) *failed = pushed.status();
      if (failed->ok() && pushed.ok() && !pushed->pulled)
        *failed = absl::InternalError("a fused push came back without the weights");
      return;
    }
    absl::StatusOr<ParameterClient::PushOutcome> pushed =
        client.Push(*step, grads.data(), 1, absl::Seconds(30));
    absl::Status pulled = client.Pull(++*step, absl::Seconds(30), params.data());
    if (failed->ok() && !pushed.ok()) *failed = pushed.status();
    if (failed->ok() && !pulled.ok()) *failed = pulled;
  });
}

// The job of the grps figures: async, so each push is applied on arrival
// and each pull served at once; one worker.
v1::JobConfig WireJob(uint32_t shards, v1::LocalTransport transport) {
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("wire-bench");
  config.set_mode(v1::MODE_ASYNC);
  config.set_num_servers(shards);
  config.set_num_workers(1);
  config.set_local_transport(transport);
  return config;
}

// `transport`: the job's local_transport; shared memory is always measured
// fused, as grps-worker pushes, and must have gone through the lanes; gRPC
// a push then a pull, or fused (`fused`).
double GrpsMs(size_t bytes, uint32_t shards, v1::LocalTransport transport, int reps,
              std::string* error, bool fused = false) {
  const v1::JobConfig config = WireJob(shards, transport);
  std::unique_ptr<Shards> served = Serve(config, bytes, error);
  if (served == nullptr) return 0;
  uint64_t step = 0;
  absl::Status failed;
  const bool shm = transport == v1::LOCAL_TRANSPORT_SHARED_MEMORY;
  const double ms = DensePushPullMs(config, served->map, bytes / sizeof(float), reps, &step,
                                    &failed, /*fused=*/shm || fused);
  if (!failed.ok()) *error = std::string(failed.message());
  return ms;
}

// ---- Sparse rows beside the dense path of the same bytes ----

struct SparseFigures {
  double sparse_ms = 0;          // pull, then push, of `rows` rows
  double dense_ms = 0;           // push, then pull, of rows x dim floats
  double push_bytes_per_row = 0;  // on the wire: ids, values, framing
  double pull_bytes_per_row = 0;
};

// A worker's step of the sparse path: pull `rows` distinct random rows of a
// table of `dim` floats (ids in [0, 2^40)), then push their gradients,
// through 2 shards in async mode (so each push is applied on arrival); beside a dense model
// of rows x dim floats pushed and pulled through the same 2 shards by
// ParameterClient, the yardstick: what the same bytes of values cost on the
// dense path. Rows are created by the warm-up; the timed runs read and
// update rows that exist.
SparseFigures SparseVersusDense(int64_t rows, uint32_t dim, int reps, std::string* error) {
  SparseFigures f;
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("wire-bench-sparse");
  config.set_mode(v1::MODE_ASYNC);
  config.set_local_transport(v1::LOCAL_TRANSPORT_GRPC);  // bytes, as the sparse path
  config.set_num_servers(2);
  config.set_num_workers(1);
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
  v1::SparseTableSpec* table = config.add_sparse_tables();
  table->set_name("bench");
  table->set_dim(dim);
  std::unique_ptr<Shards> served = Serve(config, rows * dim * sizeof(float), error);
  if (served == nullptr) return f;
  std::vector<int64_t> ids(rows);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t& id : ids) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64: distinct, spread
    id = static_cast<int64_t>(x >> 24);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  SparseClient sparse(config, served->map, 0, 1);
  std::vector<float> values(ids.size() * dim), grads(values.size(), 1e-3f);
  ParameterClient::RetryPolicy retry;
  uint64_t step = 0;
  absl::Status failed;
  uint64_t pushed_before = 0, pulled_before = 0;
  int timed = -1;  // BestMs runs a warm-up first, which creates the rows
  f.sparse_ms = BestMs(reps, [&] {
    if (++timed == 1) {
      pushed_before = sparse.bytes_pushed();
      pulled_before = sparse.bytes_pulled();
    }
    absl::Status pulled = sparse.Pull("bench", ids, step, absl::Seconds(30), values.data());
    absl::StatusOr<SparseClient::PushOutcome> pushed =
        sparse.Push("bench", step++, ids, grads.data(), retry);
    if (failed.ok() && !pulled.ok()) failed = pulled;
    if (failed.ok() && !pushed.ok()) failed = pushed.status();
  });
  const double ops = static_cast<double>(timed) * ids.size();
  f.push_bytes_per_row = (sparse.bytes_pushed() - pushed_before) / ops;
  f.pull_bytes_per_row = (sparse.bytes_pulled() - pulled_before) / ops;
  uint64_t rows_held = 0;
  for (size_t s = 0; s < served->served.size(); ++s) {
    const v1::ShardStatus status = served->served.store(s).ShardStatus();
    for (const v1::SparseTableStatus& t : status.tables()) rows_held += t.rows();
  }
  f.dense_ms = DensePushPullMs(config, served->map, rows * dim, reps, &step, &failed);
  if (!failed.ok()) *error = std::string(failed.message());
  if (static_cast<int64_t>(ids.size()) != rows)
    *error = absl::StrCat(rows - ids.size(), " random ids repeated");
  if (rows_held != ids.size())
    *error = absl::StrCat("the shards hold ", rows_held, " rows for ", ids.size(), " ids");
  return f;
}

// The sync step of the default job's model with no compute: `workers`
// threads, each a worker with its own client, pushing and pulling (fused,
// as grps-worker does) through 2 shards for `steps` steps. Milliseconds per
// step.
double SyncStepMs(uint32_t workers, uint64_t steps, v1::LocalTransport transport,
                  std::string* error) {
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("wire-bench-sync");
  config.set_mode(v1::MODE_SYNC);
  config.set_num_workers(workers);
  config.set_local_transport(transport);
  int64_t params = 0;
  for (const v1::TensorSpec& t : ModelTensors(config)) params += NumElements(t);
  std::unique_ptr<Shards> served = Serve(config, params * sizeof(float), error);
  if (served == nullptr) return 0;
  std::vector<std::thread> threads;
  std::vector<absl::Status> failed(workers);
  const absl::Time start = absl::Now();
  for (uint32_t r = 0; r < workers; ++r)
    threads.emplace_back([&, r] {
      ParameterClient client(config, served->map, r, 1);
      std::vector<float> weights(client.num_parameters()), grads(weights.size(), 1e-4f);
      failed[r] = client.Pull(0, absl::Seconds(10), weights.data());
      for (uint64_t step = 0; step < steps && failed[r].ok(); ++step) {
        absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(
            client.PushAsync(step, grads.data(), 1, weights.data(), absl::Seconds(10)));
        if (!pushed.ok()) failed[r] = pushed.status();
        else if (!pushed->pulled) failed[r] = client.Pull(step + 1, absl::Seconds(10), weights.data());
      }
    });
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : failed)
    if (!s.ok()) *error = std::string(s.message());
  return absl::ToDoubleMilliseconds(absl::Now() - start) / steps;
}

// ---- Across hosts: a peer on one host, the figures taken on another ----

// The peer (--serve): the TCP yardstick's peer, the bare gRPC service and 2
// shards of a one-tensor model of `bytes`, all on `host`; their addresses go
// to `file` (written whole, then renamed into place), and the process ends
// after `seconds`, or when it is killed.
int ServePeer(const std::string& host, size_t bytes, const std::string& file, int seconds) {
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(host, ec);
  if (ec) {
    std::fprintf(stderr, "--serve: '%s' is not an IP address\n", host.c_str());
    return 2;
  }
  asio::io_context io;
  tcp::acceptor acceptor(io);
  acceptor.open(ip.is_v6() ? tcp::v6() : tcp::v4(), ec);
  if (!ec) acceptor.bind(tcp::endpoint(ip, 0), ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "--serve: cannot listen on %s: %s\n", host.c_str(), ec.message().c_str());
    return 1;
  }
  BareServer bare(bytes, host);
  std::string error;
  std::unique_ptr<Shards> shards = Serve(WireJob(2, v1::LOCAL_TRANSPORT_GRPC), bytes, &error, host);
  if (bare.server == nullptr || shards == nullptr) {
    std::fprintf(stderr, "--serve: cannot serve on %s: %s\n", host.c_str(), error.c_str());
    return 1;
  }
  std::string lines = absl::StrCat("tcp ", host, ":", acceptor.local_endpoint().port(), "\nbare ",
                                   bare.address, "\n");
  for (const v1::ShardEndpoint& shard : shards->map.shards())
    absl::StrAppend(&lines, "shard ", shard.address(), "\n");
  const std::string temporary = file + ".tmp";
  FILE* f = std::fopen(temporary.c_str(), "w");
  if (f == nullptr || std::fputs(lines.c_str(), f) < 0 || std::fclose(f) != 0 ||
      std::rename(temporary.c_str(), file.c_str()) != 0) {
    std::fprintf(stderr, "--serve_file: cannot write %s\n", file.c_str());
    return 1;
  }
  std::printf("grps_wire_bench: serving %zu MiB on %s for %d s\n", bytes >> 20, host.c_str(),
              seconds);
  std::fflush(stdout);
  std::thread([&] {
    for (;;) {
      auto s = std::make_shared<tcp::socket>(io);
      boost::system::error_code accepted;
      acceptor.accept(*s, accepted);
      if (accepted) return;
      std::thread([s] { ServeTcpConnection(*s); }).detach();
    }
  }).detach();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  std::fflush(stdout);
  std::_Exit(0);  // the acceptor's thread is blocked in accept
}

// The addresses a peer wrote to its --serve_file, waited for up to 60 s.
struct PeerAddresses {
  std::string tcp, bare;
  std::vector<std::string> shards;
};

std::optional<PeerAddresses> ReadPeer(const std::string& file) {
  for (int i = 0; i < 600; ++i) {
    if (FILE* f = std::fopen(file.c_str(), "r")) {
      PeerAddresses peer;
      char kind[16], address[256];
      while (std::fscanf(f, "%15s %255s", kind, address) == 2) {
        if (std::strcmp(kind, "tcp") == 0) peer.tcp = address;
        if (std::strcmp(kind, "bare") == 0) peer.bare = address;
        if (std::strcmp(kind, "shard") == 0) peer.shards.push_back(address);
      }
      std::fclose(f);
      if (peer.tcp.empty() || peer.bare.empty() || peer.shards.size() != 2) return std::nullopt;
      return peer;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return std::nullopt;
}

// The figures against a peer on another host (--remote): `bytes` each way by
// TCP (a push then a pull, and both at once), bare gRPC, and grps through
// the peer's 2 shards (a push then a pull, and a push fused with the pull:
// each part's new values come back while later parts still go up).
int MeasureRemote(const std::string& file, size_t bytes, int reps) {
  const std::optional<PeerAddresses> peer = ReadPeer(file);
  if (!peer) {
    std::fprintf(stderr, "--remote: no peer's addresses in %s\n", file.c_str());
    return 1;
  }
  const size_t colon = peer->tcp.rfind(':');
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(peer->tcp.substr(0, colon), ec);
  int port = 0;
  if (colon == std::string::npos || ec || !absl::SimpleAtoi(peer->tcp.substr(colon + 1), &port)) {
    std::fprintf(stderr, "--remote: bad TCP address '%s'\n", peer->tcp.c_str());
    return 1;
  }
  const tcp::endpoint tcp_peer(ip, static_cast<unsigned short>(port));
  const v1::JobConfig config = WireJob(2, v1::LOCAL_TRANSPORT_GRPC);
  absl::StatusOr<v1::ShardMap> map =
      OneTensorMap(config, static_cast<int64_t>(bytes / sizeof(float)));
  if (!map.ok()) {
    std::fprintf(stderr, "%s\n", std::string(map.status().message()).c_str());
    return 1;
  }
  for (int s = 0; s < map->shards_size(); ++s) map->mutable_shards(s)->set_address(peer->shards[s]);

  const double tcp_sequential = TcpMs(tcp_peer, bytes, reps, /*duplex=*/false);
  const double tcp_duplex = TcpMs(tcp_peer, bytes, reps, /*duplex=*/true);
  const double bare = BareGrpcMs(peer->bare, bytes, reps);
  uint64_t step = 0;
  absl::Status failed;
  const size_t elements = bytes / sizeof(float);
  const double grps = DensePushPullMs(config, *map, elements, reps, &step, &failed);
  const double fused = DensePushPullMs(config, *map, elements, reps, &step, &failed, true);
  if (!failed.ok()) {
    std::printf("grps failed: %s\n", std::string(failed.message()).c_str());
    return 1;
  }
  std::printf("grps_wire_bench across hosts: %zu MiB each way with the peer at %s, best of %d\n\n",
              bytes >> 20, ip.to_string().c_str(), reps);
  std::printf("| %-36s | %9s | %12s | %-28s |\n", "figure", "ms", "MB/s each way",
              "rate / TCP's (same pattern)");
  std::printf("| --- | ---: | ---: | --- |\n");
  auto row = [&](const char* name, double ms, double yardstick) {
    char ratio[32] = "-";
    if (yardstick > 0) std::snprintf(ratio, sizeof(ratio), "%.2f", yardstick / ms);
    std::printf("| %-36s | %9.1f | %12.1f | %-28s |\n", name, ms, bytes / ms / 1e3, ratio);
  };
  row("tcp: push, then pull", tcp_sequential, 0);
  row("tcp: both ways at once", tcp_duplex, 0);
  row("bare grpc: push, then pull", bare, tcp_sequential);
  row("grps 2 shards: push, then pull", grps, tcp_sequential);
  row("grps 2 shards: push fused with pull", fused, tcp_duplex);
  std::printf(
      "\nMB/s each way: the bytes one way over the time of the figure (a push then a "
      "pull moves them one way after the other). The fused push: parts of about "
      "256 KiB (4 MiB to a peer on this machine), each part's new weights returned as "
      "it is applied.\n");
  return 0;
}

// The comma-separated positive numbers of --`flag` (each at most `max`), or
// nothing after saying which one is bad.
template <typename T>
std::optional<std::vector<T>> ParseList(const std::string& text, const char* flag, T max) {
  std::vector<T> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    T n;
    if (!absl::SimpleAtoi(item, &n) || !(n > 0) || n > max) {
      std::fprintf(stderr, "--%s: bad value '%s'\n", flag, std::string(item).c_str());
      return std::nullopt;
    }
    out.push_back(n);
  }
  return out;
}

// Push + pull of each size against bare gRPC and TCP; false if any failed.
bool PrintDenseTable(const std::vector<size_t>& sizes, int reps) {
  std::printf("grps_wire_bench: push + pull, best of %d, ms (%d cores, loopback)\n\n", reps,
              UsableCores());
  std::printf("%6s %7s %9s %10s %8s %8s %9s %7s %10s %10s %10s %9s %9s %11s\n", "MiB", "tcp",
              "tcp both", "bare grpc", "grps 1s", "grps 2s", "2s fused", "shm 2s", "1s / bare",
              "2s / bare", "shm / bare", "bare:tcp", "2s:tcp", "fused:both");
  bool ok = true;
  for (size_t mib : sizes) {
    const size_t bytes = mib << 20;
    const double tcp = TcpMs(bytes, reps, /*duplex=*/false);
    const double tcp_both = TcpMs(bytes, reps, /*duplex=*/true);
    const double bare = BareGrpcMs(bytes, reps);
    std::string e[4];
    const double one = GrpsMs(bytes, 1, v1::LOCAL_TRANSPORT_GRPC, reps, &e[0]);
    const double two = GrpsMs(bytes, 2, v1::LOCAL_TRANSPORT_GRPC, reps, &e[1]);
    const double fused = GrpsMs(bytes, 2, v1::LOCAL_TRANSPORT_GRPC, reps, &e[2], /*fused=*/true);
    const double shm = GrpsMs(bytes, 2, v1::LOCAL_TRANSPORT_SHARED_MEMORY, reps, &e[3]);
    if (const std::string* err = std::find_if(std::begin(e), std::end(e),
                                              [](const std::string& s) { return !s.empty(); });
        err != std::end(e)) {
      ok = false;
      std::printf("%6zu failed: %s\n", mib, err->c_str());
      continue;
    }
    // The rates against TCP's of the same pattern: bare gRPC and grps 2s
    // against a push then a pull, the fused push against both ways at once.
    std::printf(
        "%6zu %7.1f %9.1f %10.1f %8.1f %8.1f %9.1f %7.1f %10.2f %10.2f %10.2f %9.2f "
        "%9.2f %11.2f\n",
        mib, tcp, tcp_both, bare, one, two, fused, shm, one / bare, two / bare, shm / bare,
        tcp / bare, tcp / two, tcp_both / fused);
    std::fflush(stdout);
  }
  return ok;
}

// The default model's sync step over each transport; false if one failed.
bool PrintSyncSteps(uint64_t steps) {
  std::printf("\nsync step of the default model (2 workers as threads, 2 shards, fused "
              "push + pull, no compute), over %llu steps:\n",
              static_cast<unsigned long long>(steps));
  bool ok = true;
  for (v1::LocalTransport t : {v1::LOCAL_TRANSPORT_GRPC, v1::LOCAL_TRANSPORT_SHARED_MEMORY}) {
    std::string e;
    const double ms = SyncStepMs(2, steps, t, &e);
    if (!e.empty()) {
      ok = false;
      std::printf("  %-5s failed: %s\n", LocalTransportName(t).c_str(), e.c_str());
    } else {
      std::printf("  %-5s %.3f ms\n", LocalTransportName(t).c_str(), ms);
    }
  }
  return ok;
}

// Sparse rows against the dense path of the same bytes; false if any failed.
bool PrintSparseTable(const std::vector<int64_t>& sparse_rows,
                      const std::vector<uint32_t>& sparse_dims, int reps) {
  std::printf("\nsparse rows: a pull then a push of N distinct rows of a table through 2 shards "
              "(async, SGD), beside the dense path of the same bytes of values (push + pull "
              "of N x dim floats, the yardstick); best of %d, ms\n\n", reps);
  std::printf("%4s %8s %10s %12s %10s %10s %10s %14s\n", "dim", "rows", "sparse ms",
              "rows/s", "B/row push", "B/row pull", "dense ms", "sparse / dense");
  bool ok = true;
  for (uint32_t dim : sparse_dims)
    for (int64_t rows : sparse_rows) {
      std::string e;
      const SparseFigures f = SparseVersusDense(rows, dim, reps, &e);
      if (!e.empty()) {
        ok = false;
        std::printf("%4u %8lld failed: %s\n", dim, static_cast<long long>(rows), e.c_str());
        continue;
      }
      std::printf("%4u %8lld %10.2f %12.0f %10.1f %10.1f %10.2f %14.2f\n", dim,
                  static_cast<long long>(rows), f.sparse_ms, rows / (f.sparse_ms / 1000),
                  f.push_bytes_per_row, f.pull_bytes_per_row, f.dense_ms,
                  f.sparse_ms / f.dense_ms);
      std::fflush(stdout);
    }
  std::printf("\nB/row: serialized bytes a row costs each way (4 bytes a value, its id, "
              "framing); the dense path moves 4 bytes a value and no ids.\n");
  return ok;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As every daemon runs: Abseil's lock-order graph, on by default in
  // Debian's build, off; freed memory kept for the next message.
  InitDaemon("wire-bench");
  const std::optional<std::vector<size_t>> sizes =
      ParseList<size_t>(absl::GetFlag(FLAGS_mib), "mib", SIZE_MAX >> 20);
  const std::optional<std::vector<int64_t>> sparse_rows =
      ParseList<int64_t>(absl::GetFlag(FLAGS_sparse_rows), "sparse_rows", INT64_MAX);
  const std::optional<std::vector<uint32_t>> sparse_dims =
      ParseList<uint32_t>(absl::GetFlag(FLAGS_sparse_dims), "sparse_dims", 4096);
  if (!sizes || !sparse_rows || !sparse_dims) return 2;
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const std::string serve = absl::GetFlag(FLAGS_serve), remote = absl::GetFlag(FLAGS_remote);
  if (!serve.empty() || !remote.empty()) {
    if (sizes->size() != 1 || (!serve.empty() && !remote.empty()) ||
        serve.empty() != absl::GetFlag(FLAGS_serve_file).empty()) {
      std::fprintf(stderr,
                   "either --serve (with --serve_file) or --remote, and one size in --mib\n");
      return 2;
    }
    const size_t bytes = sizes->front() << 20;
    if (!serve.empty())
      return ServePeer(serve, bytes, absl::GetFlag(FLAGS_serve_file),
                       std::max(1, absl::GetFlag(FLAGS_serve_seconds)));
    return MeasureRemote(remote, bytes, reps);
  }
  bool ok = PrintDenseTable(*sizes, reps);
  if (const uint64_t steps = absl::GetFlag(FLAGS_sync_steps); steps > 0)
    ok = PrintSyncSteps(steps) && ok;
  std::printf(
      "\nbare grpc: one ByteBuffer each way on one channel, copied out once, nothing decoded; "
      "tcp: the same bytes written and read back on one loopback connection (tcp "
      "both: written while read back); grps 1s, 2s: every byte through gRPC, a push "
      "then a pull (2s fused: the push fused with the pull, each part's weights coming "
      "back as later parts go up); shm 2s: the values through the worker's "
      "shared-memory lane, push and pull fused. x / bare: times; a:b: a's rate over b's "
      "(bare grpc and grps 2s against tcp, 2s fused against tcp both).\n");
  if (!sparse_rows->empty() && !sparse_dims->empty())
    ok = PrintSparseTable(*sparse_rows, *sparse_dims, reps) && ok;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
