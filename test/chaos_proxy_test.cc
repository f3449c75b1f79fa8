// Exactly-once over an unreliable network: real shards (ParameterServer over
// gRPC on loopback), each behind a ChaosProxy that drops requests, drops
// replies, sends pushes twice and delays them, and two workers (the worker's
// own MlpModel and ParameterClient, which retries UNAVAILABLE pushes) train a
// sync job through the proxies. The shards deduplicate every retry and every
// second copy, so the final weights equal, bit for bit, those of the same
// job run without the proxies. Also: the proxy's counters count, and its
// decisions follow from the seed.
#include "test/chaos_proxy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/daemon.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "server/parameter_server_service.h"
#include "server/shard_store.h"
#include "tensor/backend.h"
#include "test/in_process_shards.h"
#include "worker/mlp_model.h"
#include "worker/parameter_client.h"
#include "worker/sparse_client.h"

namespace grps {
namespace {

constexpr int kFeatures = 12;
constexpr int kClasses = 4;
constexpr int kBatch = 8;  // per worker
constexpr int kWorkers = 2;
constexpr int kSteps = 20;

using Data = Examples;

Data MakeData(int n) { return RandomExamples(n, kFeatures, kClasses, 7); }

v1::JobConfig Config(uint32_t workers, uint32_t servers) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_job_id("chaos-job");
  c.set_mode(v1::MODE_SYNC);
  c.set_num_servers(servers);
  c.set_num_workers(workers);
  c.set_batch_size(kBatch);
  c.set_input_features(kFeatures);
  c.set_num_classes(kClasses);
  c.clear_hidden_units();
  c.add_hidden_units(16);
  c.set_chunk_bytes(1024);  // several chunks per tensor, spread over shards
  // Adam: its per-chunk step count makes an update applied twice visible.
  c.mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
  c.mutable_optimizer()->set_learning_rate(0.01f);
  return c;
}

// A ChaosProxy served on a loopback port.
class ServedProxy {
 public:
  explicit ServedProxy(ChaosProxy::Options options) {
    absl::StatusOr<std::unique_ptr<ChaosProxy>> proxy =
        ChaosProxy::Create(std::move(options));
    EXPECT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = std::move(*proxy);
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {proxy_.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    address_ = absl::StrCat("127.0.0.1:", server->port);
    server_ = std::move(server->server);
  }
  ~ServedProxy() {
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  const std::string& address() const { return address_; }
  ChaosProxy::Counters counters() const { return proxy_->counters(); }
  std::unique_ptr<v1::ParameterServer::Stub> NewStub() const {
    return v1::ParameterServer::NewStub(MakeChannel(address_));
  }

 private:
  std::unique_ptr<ChaosProxy> proxy_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

ChaosProxy::Options EveryFault(const std::string& backend, uint64_t seed) {
  ChaosProxy::Options o;
  o.backend = backend;
  o.seed = seed;
  o.drop_request = 0.1;
  o.drop_reply = 0.15;
  o.duplicate = 0.15;
  o.max_delay_ms = 10;
  o.max_faults = 10000;
  return o;
}

// The proxy's counters once the second copies it still holds have reached
// the shard: destroying a proxy drops them, so wait for them (a bounded
// poll; each is sent within max_delay_ms).
ChaosProxy::Counters Settled(const ServedProxy& proxy) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  ChaosProxy::Counters c = proxy.counters();
  while (c.duplicated < c.faults - c.dropped_requests - c.dropped_replies &&
         absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
    c = proxy.counters();
  }
  return c;
}

struct Outcome {
  std::vector<float> weights;
  std::vector<v1::ShardStatus> shards;
  std::vector<ChaosProxy::Counters> proxies;  // empty without proxies
};

// Trains kSteps with kWorkers workers on `data` (step s of rank r uses the
// kBatch examples from (s * kWorkers + r) * kBatch), through a ChaosProxy in
// front of every shard when `chaos`, and reads the final weights directly.
// The proxies' faults of pulls (EveryFault has none).
struct PullFaults {
  double drop_request = 0;
  double drop_reply = 0;
};

Outcome Train(const Data& data, bool chaos, const v1::JobConfig& config,
              PullFaults pull_faults = {}) {
  const uint32_t servers = config.num_servers();
  v1::ShardMap map = *BuildShardMap(ModelTensors(config), servers, config.chunk_bytes());
  InProcessShards shards(config, &map);
  std::vector<std::unique_ptr<ServedProxy>> proxies;
  v1::ShardMap worker_map = map;
  if (chaos) {
    for (uint32_t s = 0; s < servers; ++s) {
      ChaosProxy::Options options = EveryFault(map.shards(s).address(), /*seed=*/100 + s);
      options.drop_pull_request = pull_faults.drop_request;
      options.drop_pull_reply = pull_faults.drop_reply;
      proxies.push_back(std::make_unique<ServedProxy>(std::move(options)));
      worker_map.mutable_shards(s)->set_address(proxies.back()->address());
    }
  }
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < kWorkers; ++rank) {
    threads.emplace_back([&, rank] {
      std::unique_ptr<Backend> backend = CreateCpuBackend();
      MlpModel model(backend.get(), LayerWidths(config), kBatch);
      ParameterClient client(config, worker_map, rank, /*incarnation=*/1);
      std::vector<float> params(client.num_parameters()), grads(params.size());
      for (int step = 0; step < kSteps; ++step) {
        // A shard's listener may not take the very first connection at once
        // on a loaded machine: UNAVAILABLE is retried, as a worker does.
        Backoff retry;
        retry.initial = absl::Milliseconds(20);
        retry.give_up_after = absl::Seconds(20);
        const absl::Status pulled = RetryTransient(retry, [&] {
          return client.Pull(step, absl::Seconds(20), params.data());
        });
        ASSERT_TRUE(pulled.ok()) << "rank " << rank << " step " << step << ": " << pulled;
        model.SetParameters(params.data());
        const int first = (step * kWorkers + rank) * kBatch;
        model.ForwardBackward(&data.x[first * kFeatures], &data.y[first], kBatch,
                              nullptr);
        model.GetGradients(grads.data());
        const absl::StatusOr<ParameterClient::PushOutcome> pushed =
            client.Push(step, grads.data(), kBatch, absl::Seconds(60));
        ASSERT_TRUE(pushed.ok()) << "rank " << rank << " step " << step << ": "
                                 << pushed.status();
      }
    });
  }
  for (auto& t : threads) t.join();

  Outcome out;
  ParameterClient reader(config, map, 0, 1);
  out.weights.resize(reader.num_parameters());
  const absl::Status read = reader.Pull(kSteps, absl::Seconds(20), out.weights.data());
  EXPECT_TRUE(read.ok()) << read;
  // A version a step in sync; in ssp one a worker's gradient.
  EXPECT_EQ(reader.min_pulled_version(),
            static_cast<uint64_t>(kSteps) * (config.mode() == v1::MODE_SYNC ? 1 : kWorkers));
  // The proxies' second copies reach the shards before the counts are read.
  for (auto& p : proxies) out.proxies.push_back(Settled(*p));
  for (auto& p : proxies) p.reset();  // waits for nothing more in flight
  for (size_t s = 0; s < shards.size(); ++s)
    out.shards.push_back(shards.store(s).ShardStatus());
  return out;
}

TEST(ChaosProxy, SyncTrainingThroughDropsDuplicatesAndDelaysEqualsDirectTraining) {
  const Data data = MakeData(kBatch * kWorkers * kSteps);
  const Outcome direct = Train(data, /*chaos=*/false, Config(kWorkers, 2));
  const Outcome chaos = Train(data, /*chaos=*/true, Config(kWorkers, 2));

  // Every fault happened, through both proxies together.
  ChaosProxy::Counters total;
  for (const ChaosProxy::Counters& c : chaos.proxies) {
    total.dropped_requests += c.dropped_requests;
    total.dropped_replies += c.dropped_replies;
    total.duplicated += c.duplicated;
    total.delayed += c.delayed;
  }
  EXPECT_GT(total.dropped_requests, 0u);
  EXPECT_GT(total.dropped_replies, 0u);
  EXPECT_GT(total.duplicated, 0u);
  EXPECT_GT(total.delayed, 0u);

  // The shards saw the retries and the second copies and applied each
  // step's update exactly once per chunk.
  uint64_t duplicates = 0;
  for (const v1::ShardStatus& s : chaos.shards) {
    EXPECT_EQ(s.updates_applied(), kSteps * s.num_chunks()) << s.ShortDebugString();
    EXPECT_EQ(s.rejected_pushes(), 0u) << s.ShortDebugString();
    duplicates += s.duplicate_pushes();
  }
  EXPECT_GT(duplicates, 0u);
  for (const v1::ShardStatus& s : direct.shards) {
    EXPECT_EQ(s.updates_applied(), kSteps * s.num_chunks());
    EXPECT_EQ(s.duplicate_pushes(), 0u);
  }

  // Bit for bit the same weights, and training moved them.
  ASSERT_EQ(chaos.weights.size(), direct.weights.size());
  EXPECT_EQ(std::memcmp(chaos.weights.data(), direct.weights.data(),
                        direct.weights.size() * sizeof(float)),
            0)
      << "the weights trained through the chaos proxies differ";
  const v1::JobConfig config = Config(kWorkers, 2);
  v1::ShardMap map = *BuildShardMap(ModelTensors(config), 2, config.chunk_bytes());
  InProcessShards fresh(config, &map);
  ParameterClient reader(config, map, 0, 1);
  std::vector<float> initial(reader.num_parameters());
  ASSERT_TRUE(reader.Pull(0, absl::Seconds(5), initial.data()).ok());
  EXPECT_NE(std::memcmp(initial.data(), direct.weights.data(),
                        initial.size() * sizeof(float)),
            0)
      << "training did not change the weights";
}

// `c` in `mode` with staleness 0 and plain SGD (lr 0.5): ssp(0) with it
// ends as sync does, rounding apart.
v1::JobConfig ZeroStalenessSgd(v1::JobConfig c, v1::ConsistencyMode mode) {
  c.set_mode(mode);
  c.set_staleness_bound(0);
  c.mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
  c.mutable_optimizer()->set_learning_rate(0.5f);
  c.mutable_optimizer()->set_momentum(0);
  c.mutable_optimizer()->set_weight_decay(0);
  return c;
}

// |a - b| / |b|, in double.
double RelativeDistance(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff += std::pow(double{a[i]} - b[i], 2);
    norm += std::pow(double{b[i]}, 2);
  }
  return std::sqrt(diff / norm);
}

// ssp with staleness 0 through the same faults, and pulls dropped too,
// ends with sync's weights
// (plain SGD: ssp(0) applies each worker's gradient at lr / workers where
// sync applies their average; rounding apart, the same). A pull that one
// proxy dropped was served by the other shard: a worker that read that
// shard again could read the other worker's next step, which the first
// read let in (docs/consistency.md, ssp); the retry reads only the shard it
// missed. A pull whose reply a proxy dropped was served by its own shard,
// and the worker reads that shard again: the shard must answer the same
// values, so no read lets in another worker's gradient of its clock; only
// the reader's push of that clock does.
TEST(ChaosProxy, SspZeroThroughDropsDuplicatesAndDelaysEndsWithSyncsWeights) {
  const Data data = MakeData(kBatch * kWorkers * kSteps);
  const Outcome sync =
      Train(data, /*chaos=*/false, ZeroStalenessSgd(Config(kWorkers, 2), v1::MODE_SYNC));
  const Outcome ssp =
      Train(data, /*chaos=*/true, ZeroStalenessSgd(Config(kWorkers, 2), v1::MODE_SSP),
            PullFaults{/*drop_request=*/0.1, /*drop_reply=*/0.15});
  uint64_t dropped_pull_requests = 0, dropped_pull_replies = 0;
  for (const ChaosProxy::Counters& c : ssp.proxies) {
    dropped_pull_requests += c.dropped_pull_requests;
    dropped_pull_replies += c.dropped_pull_replies;
  }
  EXPECT_GT(dropped_pull_requests, 0u);
  EXPECT_GT(dropped_pull_replies, 0u) << "no pull was read twice: the test proves nothing";
  EXPECT_LT(RelativeDistance(ssp.weights, sync.weights), 1e-5)
      << "ssp(0) through the proxies left sync's weights";
}

// Sparse tables through the same faults: two workers train rows of a table
// (Adam, whose per-row step count makes a row updated twice visible) in sync
// mode with the worker's SparseClient, which retries UNAVAILABLE pushes; the
// rows end bit for bit as without the proxies.
constexpr int kSparseRows = 300;

struct SparseOutcome {
  std::vector<float> rows;  // every row of the table, id order
  uint64_t duplicates = 0;  // over the shards
  uint64_t sparse_pushes_through_proxies = 0;
  uint64_t dropped_pull_requests = 0, dropped_pull_replies = 0;  // over the proxies
};

// The chaos job's config with the table "emb" of kSparseRows rows of 8.
v1::JobConfig SparseConfig() {
  v1::JobConfig config = Config(kWorkers, /*servers=*/2);
  v1::SparseTableSpec* table = config.add_sparse_tables();
  table->set_name("emb");
  table->set_dim(8);
  table->set_rows(kSparseRows);
  return config;
}

// Each step every rank reads and pushes 16 distinct ids, overlapping
// between the ranks (`same_ids`: the same ids on every rank).
SparseOutcome TrainSparse(bool chaos, const v1::JobConfig& config = SparseConfig(),
                          PullFaults pull_faults = {}, bool same_ids = false) {
  v1::ShardMap map = *BuildShardMap(ModelTensors(config), 2, config.chunk_bytes());
  InProcessShards shards(config, &map);
  std::vector<std::unique_ptr<ServedProxy>> proxies;
  v1::ShardMap worker_map = map;
  if (chaos) {
    for (uint32_t s = 0; s < 2; ++s) {
      ChaosProxy::Options options = EveryFault(map.shards(s).address(), /*seed=*/200 + s);
      options.drop_pull_request = pull_faults.drop_request;
      options.drop_pull_reply = pull_faults.drop_reply;
      proxies.push_back(std::make_unique<ServedProxy>(std::move(options)));
      worker_map.mutable_shards(s)->set_address(proxies.back()->address());
    }
  }
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < kWorkers; ++rank) {
    threads.emplace_back([&, rank] {
      SparseClient client(config, worker_map, rank, /*incarnation=*/1);
      for (int step = 0; step < kSteps; ++step) {
        std::vector<int64_t> ids;
        for (int k = 0; k < 16; ++k)
          ids.push_back((step * 37 + (same_ids ? 0 : rank * 5) + k * 11) % kSparseRows);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        std::vector<float> rows(ids.size() * 8), grads(rows.size());
        Backoff retry;
        retry.initial = absl::Milliseconds(20);
        retry.give_up_after = absl::Seconds(20);
        const absl::Status pulled = RetryTransient(retry, [&] {
          return client.Pull("emb", ids, step, absl::Seconds(20), rows.data());
        });
        ASSERT_TRUE(pulled.ok()) << "rank " << rank << " step " << step << ": " << pulled;
        // The gradient of 0.5 |row - target|^2: it depends on the row, so an
        // update applied twice changes every later step.
        for (size_t i = 0; i < rows.size(); ++i)
          grads[i] = rows[i] - 0.01f * static_cast<float>(ids[i / 8] % 7);
        ParameterClient::RetryPolicy push_retry;
        const absl::StatusOr<SparseClient::PushOutcome> pushed =
            client.Push("emb", step, ids, grads.data(), push_retry);
        ASSERT_TRUE(pushed.ok()) << "rank " << rank << " step " << step << ": "
                                 << pushed.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  SparseOutcome out;
  for (auto& p : proxies) {
    const ChaosProxy::Counters c = Settled(*p);
    out.sparse_pushes_through_proxies += c.pushes;
    out.dropped_pull_requests += c.dropped_pull_requests;
    out.dropped_pull_replies += c.dropped_pull_replies;
  }
  proxies.clear();
  SparseClient reader(config, map, 0, 1);
  std::vector<int64_t> all(kSparseRows);
  for (int i = 0; i < kSparseRows; ++i) all[i] = i;
  out.rows.resize(kSparseRows * 8);
  EXPECT_TRUE(reader.Pull("emb", all, kSteps, absl::Seconds(20), out.rows.data()).ok());
  for (size_t s = 0; s < shards.size(); ++s) {
    const v1::ShardStatus status = shards.store(s).ShardStatus();
    out.duplicates += status.duplicate_pushes();
    // A version a step in sync; in ssp one a worker's push.
    EXPECT_EQ(status.tables(0).version(),
              static_cast<uint64_t>(kSteps) * (config.mode() == v1::MODE_SYNC ? 1 : kWorkers))
        << "shard " << s;
  }
  return out;
}

TEST(ChaosProxy, SparsePushesThroughDropsDuplicatesAndDelaysAreAppliedExactlyOnce) {
  const SparseOutcome direct = TrainSparse(/*chaos=*/false);
  const SparseOutcome chaos = TrainSparse(/*chaos=*/true);
  EXPECT_EQ(direct.duplicates, 0u);
  EXPECT_GT(chaos.duplicates, 0u);
  // Every step of both workers reached both shards, plus the retries.
  EXPECT_GT(chaos.sparse_pushes_through_proxies, static_cast<uint64_t>(kSteps * kWorkers * 2));
  ASSERT_EQ(direct.rows.size(), chaos.rows.size());
  EXPECT_EQ(std::memcmp(direct.rows.data(), chaos.rows.data(),
                        direct.rows.size() * sizeof(float)),
            0);
  // And training moved the rows (the comparison is not of two initial tables).
  v1::SparseTableSpec spec;
  spec.set_name("emb");
  spec.set_dim(8);
  std::vector<float> initial(8);
  InitializeSparseRow(spec, Config(kWorkers, 2).seed(), 0, initial.data());
  EXPECT_NE(std::vector<float>(direct.rows.begin(), direct.rows.begin() + 8), initial);
}

// ssp(0) of a sparse table through the same faults, and sparse pulls
// dropped before and after the shards, ends with sync's rows (plain SGD;
// every rank reads the same ids, so sync averages every row over both
// ranks where ssp applies each rank's at lr / 2). A pull whose reply is
// lost is read again, whole (this loop keeps no progress across tries):
// the shards must answer the rows they answered before.
TEST(ChaosProxy, SparseSspZeroThroughPullFaultsEndsWithSyncsRows) {
  const SparseOutcome sync = TrainSparse(
      /*chaos=*/false, ZeroStalenessSgd(SparseConfig(), v1::MODE_SYNC), {}, /*same_ids=*/true);
  const SparseOutcome ssp =
      TrainSparse(/*chaos=*/true, ZeroStalenessSgd(SparseConfig(), v1::MODE_SSP),
                  PullFaults{/*drop_request=*/0.1, /*drop_reply=*/0.15}, /*same_ids=*/true);
  EXPECT_GT(ssp.dropped_pull_requests, 0u);
  EXPECT_GT(ssp.dropped_pull_replies, 0u) << "no rows were read twice: the test proves nothing";
  EXPECT_LT(RelativeDistance(ssp.rows, sync.rows), 1e-5)
      << "ssp(0) through the proxies left sync's rows";
}

// One single-worker sync shard for pushing by hand.
class ChaosProxyCounters : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = Config(/*workers=*/1, /*servers=*/1);
    map_ = *BuildShardMap(ModelTensors(config_), 1, config_.chunk_bytes());
    shards_ = std::make_unique<InProcessShards>(config_, &map_);
  }

  // A push of step `step` (gradient 0.5 everywhere) for every chunk.
  v1::PushRequest PushOf(uint64_t step) const {
    v1::PushRequest request;
    request.set_job_id(config_.job_id());
    request.set_worker_rank(0);
    request.set_incarnation(1);
    request.set_step(step);
    request.set_num_samples(1);
    for (const v1::ChunkSpec& c : map_.chunks()) {
      v1::ChunkData* d = request.add_chunks();
      d->set_chunk_id(c.chunk_id());
      d->set_dtype(v1::DTYPE_F32);
      d->set_version(step);
      std::vector<float> g(c.num_elements(), 0.5f);
      d->set_data(std::string(reinterpret_cast<const char*>(g.data()),
                              g.size() * sizeof(float)));
    }
    return request;
  }

  grpc::StatusCode Push(v1::ParameterServer::Stub& stub, uint64_t step) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::PushResponse response;
    return stub.Push(&context, PushOf(step), &response).error_code();
  }

  uint64_t chunks() const { return map_.chunks_size(); }

  ChaosProxy::Options Only(uint64_t max_faults) const {
    ChaosProxy::Options o;
    o.backend = map_.shards(0).address();
    o.max_faults = max_faults;
    return o;
  }

  v1::JobConfig config_;
  v1::ShardMap map_;
  std::unique_ptr<InProcessShards> shards_;
};

TEST_F(ChaosProxyCounters, DroppedRequestsAreCountedAndStopAtTheCap) {
  ChaosProxy::Options o = Only(/*max_faults=*/3);
  o.drop_request = 1.0;
  ServedProxy proxy(o);
  auto stub = proxy.NewStub();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Push(*stub, 0), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(shards_->store(0).ShardStatus().pushes(), 0u) << "a dropped push reached the shard";
  EXPECT_EQ(Push(*stub, 0), grpc::StatusCode::OK);  // the cap is reached
  const ChaosProxy::Counters c = proxy.counters();
  EXPECT_EQ(c.pushes, 4u);
  EXPECT_EQ(c.calls, 4u);
  EXPECT_EQ(c.dropped_requests, 3u);
  EXPECT_EQ(c.faults, 3u);
  EXPECT_EQ(c.dropped_replies + c.duplicated + c.delayed, 0u);
  EXPECT_EQ(shards_->store(0).ShardStatus().updates_applied(), chunks());
}

TEST_F(ChaosProxyCounters, ADroppedReplyIsAppliedAndItsRetryIsADuplicate) {
  ChaosProxy::Options o = Only(/*max_faults=*/1);
  o.drop_reply = 1.0;
  ServedProxy proxy(o);
  auto stub = proxy.NewStub();
  EXPECT_EQ(Push(*stub, 0), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(shards_->store(0).ShardStatus().updates_applied(), chunks())
      << "the push whose reply was dropped was not applied";
  EXPECT_EQ(Push(*stub, 0), grpc::StatusCode::OK);  // the client's retry
  const v1::ShardStatus s = shards_->store(0).ShardStatus();
  EXPECT_EQ(s.updates_applied(), chunks());
  EXPECT_EQ(s.duplicate_pushes(), chunks());  // counted per chunk
  const ChaosProxy::Counters c = proxy.counters();
  EXPECT_EQ(c.dropped_replies, 1u);
  EXPECT_EQ(c.dropped_requests + c.duplicated, 0u);
}

TEST_F(ChaosProxyCounters, APullWhoseReplyIsDroppedWasServedByTheShard) {
  ChaosProxy::Options o = Only(/*max_faults=*/1);
  o.drop_pull_reply = 1.0;
  ServedProxy proxy(o);
  auto stub = proxy.NewStub();
  v1::PullRequest pull;
  pull.set_job_id(config_.job_id());
  pull.set_timeout_ms(5000);
  auto code = [&] {
    v1::PullResponse pulled;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->Pull(&context, pull, &pulled).error_code();
  };
  EXPECT_EQ(code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(shards_->store(0).ShardStatus().pulls(), chunks())  // counted per chunk
      << "the shard never served the pull";
  EXPECT_EQ(code(), grpc::StatusCode::OK);  // the cap is reached
  const ChaosProxy::Counters c = proxy.counters();
  EXPECT_EQ(c.dropped_pull_replies, 1u);
  EXPECT_EQ(c.dropped_pull_requests, 0u);
  EXPECT_EQ(shards_->store(0).ShardStatus().pulls(), 2 * chunks());
}

TEST_F(ChaosProxyCounters, ADuplicatedPushReachesTheShardTwiceAndIsAppliedOnce) {
  ChaosProxy::Options o = Only(/*max_faults=*/2);
  o.duplicate = 1.0;
  ServedProxy proxy(o);
  auto stub = proxy.NewStub();
  EXPECT_EQ(Push(*stub, 0), grpc::StatusCode::OK);
  EXPECT_EQ(Push(*stub, 1), grpc::StatusCode::OK);
  EXPECT_EQ(Push(*stub, 2), grpc::StatusCode::OK);  // past the cap: sent once
  // The second copies go out from the proxy's own thread, which counts each
  // once its call has returned: wait (bounded) until the proxy has counted
  // both and the shard has seen both.
  const uint64_t want = 2 * chunks();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while ((proxy.counters().duplicated < 2 ||
          shards_->store(0).ShardStatus().duplicate_pushes() < want) &&
         absl::Now() < give_up)
    absl::SleepFor(absl::Milliseconds(5));
  const v1::ShardStatus s = shards_->store(0).ShardStatus();
  EXPECT_EQ(s.duplicate_pushes(), want);
  EXPECT_EQ(s.pushes(), 5 * chunks());
  EXPECT_EQ(s.updates_applied(), 3 * chunks());
  const ChaosProxy::Counters c = proxy.counters();
  EXPECT_EQ(c.duplicated, 2u);
  EXPECT_EQ(c.faults, 2u);
  EXPECT_EQ(c.pushes, 3u);
}

TEST_F(ChaosProxyCounters, DelaysAreCountedAndOtherCallsAreForwarded) {
  ChaosProxy::Options o = Only(/*max_faults=*/0);
  o.max_delay_ms = 5;
  o.drop_request = 1.0;  // capped at 0: never happens
  ServedProxy proxy(o);
  auto stub = proxy.NewStub();
  for (int step = 0; step < 10; ++step) EXPECT_EQ(Push(*stub, step), grpc::StatusCode::OK);
  v1::PullRequest pull;
  pull.set_job_id(config_.job_id());
  pull.set_min_version(10);
  pull.set_timeout_ms(5000);
  v1::PullResponse pulled;
  grpc::ClientContext pull_context;
  ASSERT_TRUE(stub->Pull(&pull_context, pull, &pulled).ok());
  EXPECT_EQ(static_cast<uint64_t>(pulled.chunks_size()), chunks());
  for (const v1::ChunkData& c : pulled.chunks()) EXPECT_EQ(c.version(), 10u);
  v1::GetShardStatusRequest status_request;
  status_request.set_job_id(config_.job_id());
  v1::ShardStatus status;
  grpc::ClientContext status_context;
  ASSERT_TRUE(stub->GetShardStatus(&status_context, status_request, &status).ok());
  EXPECT_EQ(status.updates_applied(), 10u * chunks());
  const ChaosProxy::Counters c = proxy.counters();
  EXPECT_EQ(c.pushes, 10u);
  EXPECT_EQ(c.calls, 12u);
  EXPECT_GT(c.delayed, 0u);  // 10 draws from 0..5 ms: P(all 0) = 6^-10
  EXPECT_EQ(c.faults, 0u);
}

TEST_F(ChaosProxyCounters, TheSameSeedMakesTheSameDecisions) {
  // Sequential pushes (each retried until it gets through) through a proxy
  // see a sequence of status codes that follows from the seed alone. Each
  // run has a fresh shard.
  auto codes = [&](uint64_t seed) {
    shards_ = std::make_unique<InProcessShards>(config_, &map_);
    ChaosProxy::Options o = Only(/*max_faults=*/1000);
    o.seed = seed;
    o.drop_request = 0.3;
    o.drop_reply = 0.3;
    ServedProxy proxy(o);
    auto stub = proxy.NewStub();
    std::vector<int> seen;
    for (int step = 0; step < 15; ++step) {
      grpc::StatusCode code;
      do {
        code = Push(*stub, step);
        seen.push_back(code);
      } while (code == grpc::StatusCode::UNAVAILABLE && seen.size() < 1000);
      EXPECT_EQ(code, grpc::StatusCode::OK);
    }
    EXPECT_EQ(shards_->store(0).ShardStatus().updates_applied(), 15 * chunks());
    return seen;
  };
  const std::vector<int> a = codes(5), b = codes(5), c = codes(6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(a.size(), 15u) << "no fault at all: the comparison proves nothing";
}

TEST(ChaosProxyOptions, BadOptionsAreRefused) {
  ChaosProxy::Options o;
  EXPECT_EQ(ChaosProxy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.backend = "127.0.0.1:1";
  o.drop_reply = 1.5;
  EXPECT_EQ(ChaosProxy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.drop_reply = 0;
  o.duplicate = -0.1;
  EXPECT_EQ(ChaosProxy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.duplicate = 0;
  o.drop_pull_reply = 2;
  EXPECT_EQ(ChaosProxy::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.drop_pull_reply = 0;
  EXPECT_TRUE(ChaosProxy::Create(o).ok());
}

}  // namespace
}  // namespace grps
