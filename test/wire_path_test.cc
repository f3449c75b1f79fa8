// The wire path end to end, against real shards (ShardStore behind the
// ParameterServer service over gRPC on loopback): the worker's
// ParameterClient with its slices, tickets, split requests and fused
// push-and-pull, and a plain protobuf client speaking the same contract.
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "proto/grps.grpc.pb.h"
#include "test/in_process_shards.h"
#include "wire/lane_doorbell.h"
#include "worker/parameter_client.h"
#include "worker/sparse_client.h"

namespace grps {
namespace {

// A job of one tensor of `elements` floats (zeros at start), plain SGD with
// lr 1, so a pushed gradient g moves the weights to -g / workers per step.
v1::JobConfig Config(v1::ConsistencyMode mode, uint32_t workers, uint32_t servers) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_job_id("wire-path-test");
  c.set_mode(mode);
  c.set_num_workers(workers);
  c.set_num_servers(servers);
  c.mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
  c.mutable_optimizer()->set_learning_rate(1.0f);
  c.mutable_optimizer()->set_momentum(0);
  c.mutable_optimizer()->set_weight_decay(0);
  return c;
}

v1::ShardMap MapOf(const v1::JobConfig& config, int64_t elements) {
  absl::StatusOr<v1::ShardMap> map = OneTensorMap(config, elements);
  EXPECT_TRUE(map.ok()) << map.status();
  return map.ok() ? *map : v1::ShardMap();
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * 1e-3f;
  return v;
}

TEST(WirePath, FusedPushBringsTheWeightsOfTheNextStep) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1, 2);
  v1::ShardMap map = MapOf(config, 300000);
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(1);
  ParameterClient client(config, map, 0, 1);
  std::vector<float> params(client.num_parameters(), -7);
  ASSERT_TRUE(client.Pull(0, absl::Seconds(5), params.data()).ok());
  const std::vector<float> grads = Ramp(params.size());

  std::vector<float> fused(params.size(), -7);
  absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(
      client.PushAsync(0, grads.data(), 1, fused.data(), absl::Seconds(5)));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(pushed->pulled);
  EXPECT_EQ(client.min_pulled_version(), 1u);  // the step-1 weights, recorded

  std::vector<float> pulled(params.size(), -7);
  ASSERT_TRUE(client.Pull(1, absl::Seconds(5), pulled.data()).ok());
  EXPECT_EQ(fused, pulled);
  EXPECT_FLOAT_EQ(pulled[1], -grads[1]);
}

// Parts by the link: a worker sends shards on its own machine (here, on
// loopback) parts of 4 MiB, where a request costs more than its bytes, and
// the job's part_bytes when it names a size: 16 MiB over 2 shards is 4 calls
// a push by the link, 64 in parts of 256 KiB. Either way the same weights.
TEST(WirePath, APushToShardsOnThisMachineGoesInPartsOf4MiBUnlessTheJobNamesASize) {
  std::vector<float> weights[2];
  for (const uint64_t part_bytes : {uint64_t{0}, uint64_t{256} << 10}) {
    v1::JobConfig config = Config(v1::MODE_ASYNC, 1, 2);
    config.set_part_bytes(part_bytes);
    v1::ShardMap map = MapOf(config, (int64_t{16} << 20) / sizeof(float));
    InProcessShards shards(config, &map);
    shards.SetLiveWorkers(1);
    ParameterClient client(config, map, 0, 1);
    std::vector<float>& params = weights[part_bytes == 0 ? 0 : 1];
    params.assign(client.num_parameters(), -7);
    const std::vector<float> grads = Ramp(params.size());
    absl::StatusOr<ParameterClient::PushOutcome> pushed =
        client.Wait(client.PushAsync(0, grads.data(), 1, params.data(), absl::Seconds(5)));
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    ASSERT_TRUE(pushed->pulled);
    EXPECT_EQ(client.traffic().push_calls, part_bytes == 0 ? 4u : 64u)
        << "part_bytes " << part_bytes;
  }
  EXPECT_EQ(weights[0], weights[1]);
}

// Two workers' fused pushes for `steps` sync steps through 2 real shards,
// with the job's `transport` and wire `dtype`: the weights each worker ends
// with (both must agree), and the bytes that went through lanes.
// `before_step` (may be null) runs before each step with the shards and the
// step.
struct LaneRun {
  std::vector<float> weights;
  uint64_t lane_bytes = 0;
  uint64_t bytes_moved = 0;  // pushed and pulled
  uint64_t push_calls = 0;
  uint64_t doorbell_calls = 0;  // of those, rung at lane doorbells
};
// The model of the lane tests: 400 KB of f32, 200 KB per shard, one part
// (ParameterClient::kPartBytes) each.
constexpr uint64_t kModelParams = 100000;
static_assert(kModelParams * sizeof(float) / 2 <= ParameterClient::kPartBytes);

LaneRun RunTwoWorkers(v1::LocalTransport transport, v1::DType dtype, int steps,
                      const std::function<void(InProcessShards&, int)>& before_step = nullptr) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 2, 2);
  config.set_local_transport(transport);
  config.set_wire_dtype(dtype);
  config.set_chunk_bytes(64 << 10);
  v1::ShardMap map = MapOf(config, kModelParams);
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(2);
  ParameterClient w0(config, map, 0, 1), w1(config, map, 1, 1);
  std::vector<float> p0(w0.num_parameters()), p1(w1.num_parameters());
  EXPECT_TRUE(w0.Pull(0, absl::Seconds(5), p0.data()).ok());
  EXPECT_TRUE(w1.Pull(0, absl::Seconds(5), p1.data()).ok());
  std::vector<float> g0 = Ramp(p0.size()), g1(p1.size());
  for (size_t i = 0; i < g1.size(); ++i) g1[i] = 0.25f - g0[i];
  for (int step = 0; step < steps; ++step) {
    if (before_step) before_step(shards, step);
    std::thread second([&] {
      absl::StatusOr<ParameterClient::PushOutcome> r =
          w1.Wait(w1.PushAsync(step, g1.data(), 1, p1.data(), absl::Seconds(5)));
      EXPECT_TRUE(r.ok() && r->pulled) << r.status();
    });
    absl::StatusOr<ParameterClient::PushOutcome> r =
        w0.Wait(w0.PushAsync(step, g0.data(), 1, p0.data(), absl::Seconds(5)));
    EXPECT_TRUE(r.ok() && r->pulled) << r.status();
    second.join();
  }
  EXPECT_EQ(p0, p1);
  return {p0, w0.lane_bytes() + w1.lane_bytes(),
          w0.bytes_pushed() + w1.bytes_pushed() + w0.bytes_pulled() + w1.bytes_pulled(),
          w0.push_calls() + w1.push_calls(), w0.doorbell_calls() + w1.doorbell_calls()};
}

TEST(WirePath, TheLanesOfWorkersOnTheShardsMachineCarryTheValuesAndChangeNoResult) {
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const LaneRun bytes = RunTwoWorkers(v1::LOCAL_TRANSPORT_GRPC, dtype, 3);
    const LaneRun lanes = RunTwoWorkers(v1::LOCAL_TRANSPORT_SHARED_MEMORY, dtype, 3);
    EXPECT_EQ(lanes.weights, bytes.weights) << "bit for bit";
    EXPECT_FLOAT_EQ(bytes.weights[7], -3 * 0.125f);  // three steps of mean gradient 0.125
    EXPECT_EQ(bytes.lane_bytes, 0u);
    // Every gradient and every fused pull went through the lanes: both ways,
    // 2 workers x 3 steps x the model in the wire dtype.
    const uint64_t size = dtype == v1::DTYPE_F32 ? 4 : 2;
    EXPECT_EQ(lanes.lane_bytes, 2 * 2 * 3 * kModelParams * size);
    EXPECT_GE(lanes.bytes_moved, lanes.lane_bytes);
    // Each worker's first push to each shard is a call that opens the
    // shard's doorbell in its lane; the later ones are rung there.
    EXPECT_EQ(bytes.push_calls, 2 * 2 * 3u);
    EXPECT_EQ(bytes.doorbell_calls, 0u);
    EXPECT_EQ(lanes.push_calls, 2 * 2 * 3u);
    EXPECT_EQ(lanes.doorbell_calls, 2 * 2 * 2u);
  }
}

TEST(WirePath, AShardThatStopsServingDoorbellsGetsThePushThroughGrpcAppliedOnce) {
  const LaneRun bytes = RunTwoWorkers(v1::LOCAL_TRANSPORT_GRPC, v1::DTYPE_F32, 4);
  // Before step 2, shard 0 stops serving doorbells for good (as a shard
  // that is shutting down does; one that died beats no more either): both
  // workers' rings there go unanswered and unbeaten, the workers give up on
  // their lanes after kDoorbellSilence and send the pushes again through
  // gRPC on fresh lanes.
  const absl::Time start = absl::Now();
  const LaneRun lanes = RunTwoWorkers(v1::LOCAL_TRANSPORT_SHARED_MEMORY, v1::DTYPE_F32, 4,
                                      [](InProcessShards& shards, int step) {
                                        if (step == 2) shards.service(0).StopDoorbells();
                                      });
  EXPECT_EQ(lanes.weights, bytes.weights) << "each push applied exactly once";
  EXPECT_GE(absl::Now() - start, kDoorbellSilence);
  // Per worker, shard 0: a call (step 0), rung (1), rung and failed (2),
  // its retry a call on the fresh lane, a call (3: the shard opens no
  // doorbell any more); shard 1: a call (0), rung (1, 2), and a call at
  // step 3 (the fresh lane's doorbell there is not open yet).
  EXPECT_EQ(lanes.push_calls, 2 * (5 + 4u));
  EXPECT_EQ(lanes.doorbell_calls, 2 * (2 + 2u));
}

TEST(WirePath, PushesTheShardsTookAlreadyAreRungAtTheirDoorbellsAndAppliedOnce) {
  // A worker that rolled back to a checkpoint older than the shards' marks
  // pushes those steps again: each is a duplicate, answered at the doorbell
  // with its weights in the lane (a real model's weights do not fit a
  // doorbell's slot; answered there, the worker would retire its lane and
  // retry each one through gRPC after a backoff).
  for (v1::ConsistencyMode mode : {v1::MODE_ASYNC, v1::MODE_SSP}) {
    SCOPED_TRACE(v1::ConsistencyMode_Name(mode));
    v1::JobConfig config = Config(mode, 1, 2);
    config.set_chunk_bytes(64 << 10);
    v1::ShardMap map = MapOf(config, kModelParams);
    InProcessShards shards(config, &map);
    shards.SetLiveWorkers(1);
    ParameterClient client(config, map, 0, 1);
    std::vector<float> params(client.num_parameters());
    ASSERT_TRUE(client.Pull(0, absl::Seconds(5), params.data()).ok());
    const std::vector<float> grads = Ramp(params.size());
    for (uint64_t step = 0; step < 4; ++step) {
      absl::StatusOr<ParameterClient::PushOutcome> r = client.Wait(
          client.PushAsync(step, grads.data(), 1, params.data(), absl::Seconds(5)));
      ASSERT_TRUE(r.ok() && r->pulled) << r.status();
    }
    const std::vector<float> applied = params;
    EXPECT_FLOAT_EQ(applied[7], -4 * grads[7]);
    const uint64_t calls = client.push_calls(), rung = client.doorbell_calls();
    ASSERT_EQ(rung, 2 * 3u) << "steps 1 to 3 rung at both shards";

    for (uint64_t step = 1; step < 4; ++step) {
      std::vector<float> fused(params.size(), -7);
      absl::StatusOr<ParameterClient::PushOutcome> r = client.Wait(
          client.PushAsync(step, grads.data(), 1, fused.data(), absl::Seconds(5)));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->pulled);
      EXPECT_EQ(fused, applied) << "step " << step << " applied once";
    }
    EXPECT_EQ(client.push_calls() - calls, 2 * 3u) << "one call per shard and step";
    EXPECT_EQ(client.doorbell_calls() - rung, 2 * 3u) << "every one rung, none retried";
    EXPECT_TRUE(client.LaneUsable(0) && client.LaneUsable(1));
    for (size_t s = 0; s < shards.size(); ++s)
      EXPECT_EQ(shards.service(s).doorbells_served(), 1u) << "the lane kept, shard " << s;
  }
}

// Two live workers' clients of a job of one tensor of `elements` on real
// shards, each with its weights array.
struct TwoWorkers {
  TwoWorkers(const v1::JobConfig& job, int64_t elements)
      : config(job),
        map(MapOf(config, elements)),
        shards(config, &map),
        w0(config, map, 0, 1),
        w1(config, map, 1, 1),
        p0(w0.num_parameters()),
        p1(w1.num_parameters()) {
    shards.SetLiveWorkers(2);
  }
  const v1::JobConfig config;
  v1::ShardMap map;  // the shards' addresses filled in by `shards`
  InProcessShards shards;
  ParameterClient w0, w1;
  std::vector<float> p0, p1;
};

TEST(WirePath, FusedPushInSyncComesBackWithoutWeightsWhileTheStepIsOpen) {
  TwoWorkers job(Config(v1::MODE_SYNC, 2, 1), 1000);
  ParameterClient& w0 = job.w0;
  ParameterClient& w1 = job.w1;
  std::vector<float>& p0 = job.p0;
  std::vector<float>& p1 = job.p1;
  ASSERT_TRUE(w0.Pull(0, absl::Seconds(5), p0.data()).ok());
  ASSERT_TRUE(w1.Pull(0, absl::Seconds(5), p1.data()).ok());
  const std::vector<float> grads = Ramp(p0.size());

  // Worker 1 has not pushed: step 0 stays open past the pull's wait.
  absl::StatusOr<ParameterClient::PushOutcome> alone = w0.Wait(
      w0.PushAsync(0, grads.data(), 1, p0.data(), absl::Milliseconds(200)));
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_FALSE(alone->pulled);

  // The push stood: worker 1's fused push completes the step and brings the
  // average of both gradients.
  absl::StatusOr<ParameterClient::PushOutcome> second = w1.Wait(
      w1.PushAsync(0, grads.data(), 1, p1.data(), absl::Seconds(5)));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->pulled);
  EXPECT_FLOAT_EQ(p1[5], -grads[5]);
}

TEST(WirePath, TicketsOfOneClientRunConcurrentlyAndEachIsWaitedOnce) {
  v1::JobConfig config = Config(v1::MODE_ASYNC, 1, 2);
  v1::ShardMap map = MapOf(config, 100000);
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(1);
  ParameterClient client(config, map, 0, 1);
  std::vector<float> a(client.num_parameters()), b(client.num_parameters());
  const ParameterClient::Ticket ta = client.PullAsync(0, absl::Seconds(5), a.data());
  const ParameterClient::Ticket tb = client.PullAsync(0, absl::Seconds(5), b.data());
  EXPECT_NE(ta, tb);
  EXPECT_TRUE(client.Wait(tb).ok());
  EXPECT_TRUE(client.Wait(ta).ok());
  EXPECT_EQ(client.Wait(ta).status().code(), absl::StatusCode::kInvalidArgument);
}

// A shard of 80 MiB is more than one gRPC message may carry (64 MiB): it
// travels as many requests, a chunk of 8 MiB each.
TEST(WirePath, AShardLargerThanTheMessageLimitTrains) {
  v1::JobConfig config = Config(v1::MODE_ASYNC, 1, 1);
  config.set_chunk_bytes(8 << 20);
  const int64_t elements = int64_t{80} << 20 >> 2;
  v1::ShardMap map = MapOf(config, elements);
  ASSERT_GT(static_cast<uint64_t>(elements) * 4, static_cast<uint64_t>(kMaxMessageBytes));
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(1);
  ParameterClient client(config, map, 0, 1);
  std::vector<float> params(client.num_parameters());
  ASSERT_TRUE(client.Pull(0, absl::Seconds(30), params.data()).ok());
  std::vector<float> grads(params.size(), 0.5f);
  grads.back() = 2.0f;
  absl::StatusOr<ParameterClient::PushOutcome> pushed =
      client.Push(0, grads.data(), 1, absl::Seconds(30));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  ASSERT_TRUE(client.Pull(1, absl::Seconds(30), params.data()).ok());
  EXPECT_FLOAT_EQ(params.front(), -0.5f);
  EXPECT_FLOAT_EQ(params.back(), -2.0f);
  EXPECT_EQ(client.bytes_pulled(), 2 * params.size() * sizeof(float));
}

// The server's replies are built by the wire codec, not by protobuf; a
// client that uses the generated classes reads them all the same, a fused
// push's weights included.
TEST(WirePath, PlainProtobufClientPushesAndPullsTheSameContract) {
  v1::JobConfig config = Config(v1::MODE_SYNC, 1, 1);
  v1::ShardMap map = MapOf(config, 64);
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(1);
  auto stub = v1::ParameterServer::NewStub(MakeChannel(map.shards(0).address()));
  const uint32_t chunk = map.chunks(0).chunk_id();

  v1::PushRequest push;
  push.set_job_id(config.job_id());
  push.set_worker_rank(0);
  push.set_incarnation(1);
  push.set_step(0);
  push.set_num_samples(1);
  push.set_pull(true);
  push.set_pull_timeout_ms(5000);
  v1::ChunkData* c = push.add_chunks();
  c->set_chunk_id(chunk);
  c->set_dtype(v1::DTYPE_F32);
  const std::vector<float> grads(map.chunks(0).num_elements(), 0.25f);
  c->set_data(std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * 4));
  v1::PushResponse pushed;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->Push(&context, push, &pushed).ok());
  }
  ASSERT_EQ(pushed.versions_size(), 1);
  EXPECT_EQ(pushed.versions(0), 1u);
  ASSERT_EQ(pushed.chunks_size(), 1);
  EXPECT_EQ(pushed.chunks(0).version(), 1u);
  float first;
  std::memcpy(&first, pushed.chunks(0).data().data(), sizeof(first));
  EXPECT_FLOAT_EQ(first, -0.25f);

  v1::PullRequest pull;
  pull.set_job_id(config.job_id());
  pull.set_worker_rank(0);
  pull.set_dtype(v1::DTYPE_BF16);
  v1::PullResponse pulled;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Pull(&context, pull, &pulled).ok());
  ASSERT_EQ(pulled.chunks_size(), 1);
  EXPECT_EQ(pulled.chunks(0).dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(pulled.chunks(0).data().size(), grads.size() * 2);
}

// With top-k, a push sends only the largest gradients of each chunk and the
// worker keeps the rest: after one push exactly k elements per chunk moved,
// and over pushes the held-back gradients are sent too (error feedback).
TEST(WirePath, TopKPushesMoveOnlyTheLargestElementsAndLoseNothing) {
  v1::JobConfig config = Config(v1::MODE_ASYNC, 1, 1);
  config.set_chunk_bytes(1024);  // chunks of 256 elements
  config.set_gradient_topk(0.25f);
  v1::ShardMap map = MapOf(config, 1024);
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(1);
  ParameterClient client(config, map, 0, 1);
  std::vector<float> params(client.num_parameters());
  std::vector<float> grads(params.size());
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 256 + 1);
  ASSERT_TRUE(client.Push(0, grads.data(), 1, absl::Seconds(5)).ok());
  ASSERT_TRUE(client.Pull(1, absl::Seconds(5), params.data()).ok());
  int moved = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i] != 0) {
      ++moved;
      EXPECT_GE(i % 256, 192u) << "element " << i << " is not among its chunk's largest";
    }
  }
  EXPECT_EQ(moved, 4 * 64);
  // Three more pushes of a zero gradient send what was held back, a quarter
  // at a time: after them every element has moved by exactly its gradient.
  const std::vector<float> zeros(grads.size(), 0.0f);
  for (uint64_t step = 1; step < 4; ++step)
    ASSERT_TRUE(client.Push(step, zeros.data(), 1, absl::Seconds(5)).ok());
  ASSERT_TRUE(client.Pull(4, absl::Seconds(5), params.data()).ok());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_FLOAT_EQ(params[i], -grads[i]) << i;
  // A sent element costs an index and a value, so a quarter of them is about
  // half a dense push's bytes (plus framing).
  const size_t dense = params.size() * sizeof(float);
  EXPECT_LT(client.bytes_pushed(), 4 * dense * 55 / 100);
}

// Bytes that are not a PushRequest get INVALID_ARGUMENT and change nothing;
// the shard goes on serving.
TEST(WirePath, GarbagePushIsRefusedAndChangesNothing) {
  v1::JobConfig config = Config(v1::MODE_ASYNC, 1, 1);
  v1::ShardMap map = MapOf(config, 64);
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(1);
  grpc::GenericStub stub(MakeChannel(map.shards(0).address()));
  for (const std::string& garbage :
       {std::string("\x2a\xff\xff\xff\xff\x0f", 6), std::string("\x0a\x7f", 2),
        std::string(100, '\xff')}) {
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), reply;
    grpc::ClientContext context;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    StartUnaryCall(
        [&](grpc::ClientUnaryReactor* r) {
          stub.PrepareUnaryCall(&context, "/grps.v1.ParameterServer/Push", grpc::StubOptions(),
                                &request, &reply, r);
        },
        [&](grpc::Status s) {
          std::lock_guard<std::mutex> lock(mu);
          status = s;
          done = true;
          cv.notify_one();
        });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  EXPECT_EQ(shards.store(0).ShardStatus().version(), 0u);
  ParameterClient client(config, map, 0, 1);
  std::vector<float> params(client.num_parameters(), -1);
  EXPECT_TRUE(client.Pull(0, absl::Seconds(5), params.data()).ok());
  EXPECT_EQ(params[0], 0.0f);
}

// ssp(0) (sync's weights) over two shards with a tensor each, "a" on shard
// 0 and "b" on shard 1: worker 0 reads clock 1 of shard 0 while shard 1's
// step is still open (worker 1 has pushed only "a"). Worker 1 then ends
// step 0 and pushes step 1, which shard 0 holds until worker 0 pushes its
// step 1 (worker 0's read of clock 1 does not let it in: that read's reply
// could have been lost). Worker 0's next pull of clock 1 reads shard 1
// only (what it read of shard 0 stays as read; no bytes come twice), and
// its weights are clock 1's, with no gradient of step 1 in them.
class SspReadsOfOneClock : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = Config(v1::MODE_SSP, 2, 2);
    config_.set_staleness_bound(0);
    std::vector<v1::TensorSpec> tensors(2);
    for (int t = 0; t < 2; ++t) {
      tensors[t].set_name(t == 0 ? "a" : "b");
      tensors[t].add_shape(kElements);
      tensors[t].set_initializer("zeros");
    }
    absl::StatusOr<v1::ShardMap> map = BuildShardMap(tensors, 2, config_.chunk_bytes());
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    ASSERT_EQ(map_.chunks(0).shard(), 0u);
    ASSERT_EQ(map_.chunks(1).shard(), 1u);
    shards_ = std::make_unique<InProcessShards>(config_, &map_);
    shards_->SetLiveWorkers(2);
    w0_ = std::make_unique<ParameterClient>(config_, map_, 0, 1);
    w1_ = std::make_unique<ParameterClient>(config_, map_, 1, 1);
    p0_.assign(2 * kElements, -7);
    p1_.assign(2 * kElements, -7);
    ASSERT_TRUE(w0_->Pull(0, absl::Seconds(5), p0_.data()).ok());
    ASSERT_TRUE(w1_->Pull(0, absl::Seconds(5), p1_.data()).ok());
  }

  // Worker 1 pushes step 0's "a" (fused with the pull of clock 1): the
  // ticket whose Wait pushes "b".
  ParameterClient::Ticket PushOnlyA() {
    const ParameterClient::Ticket t =
        w1_->StagePush(0, g1_.data(), 1, p1_.data(), absl::Seconds(5));
    EXPECT_TRUE(w1_->TensorReady(t, 0).ok());
    return t;
  }

  // Worker 1 ends step 0 (its fused pull brings clock 1 whole) and pushes
  // step 1, a gradient of 100.
  void EndStep0AndPushStep1(ParameterClient::Ticket t) {
    absl::StatusOr<ParameterClient::PushOutcome> ended = w1_->Wait(t);
    ASSERT_TRUE(ended.ok()) << ended.status();
    ASSERT_TRUE(ended->pulled);
    const std::vector<float> next(2 * kElements, 100);
    ASSERT_TRUE(w1_->Wait(w1_->PushAsync(1, next.data(), 1)).ok());
  }

  // Worker 0 pushes step 0 and pulls clock 1, which reads shard 0 and
  // times out on shard 1 (worker 1 pushed only "a"); then worker 1 ends
  // step 0 and pushes step 1.
  void PullThatTimesOutOnShard1ThenStep1() {
    ASSERT_TRUE(w0_->Wait(w0_->PushAsync(0, g0_.data(), 1)).ok());
    const ParameterClient::Ticket t = PushOnlyA();
    EXPECT_EQ(w0_->Pull(1, absl::Milliseconds(300), p0_.data()).code(),
              absl::StatusCode::kDeadlineExceeded);
    EndStep0AndPushStep1(t);
  }

  // Worker 1's step 1 waits at shard 0 for worker 0's push of step 1;
  // worker 0's next pull of clock 1 into p0_ leaves shard 0 unread (its
  // pull counter, per chunk, stays) and gives it clock 1's weights.
  void ExpectThePullOfClock1ReadsShard1Only() {
    EXPECT_EQ(shards_->store(0).ShardStatus().held_gradients(), 1u);
    const uint64_t read = shards_->store(0).ShardStatus().pulls();
    ASSERT_TRUE(w0_->Pull(1, absl::Seconds(5), p0_.data()).ok());
    EXPECT_EQ(shards_->store(0).ShardStatus().pulls(), read) << "shard 0 was read again";
    ExpectClock1();
  }

  // Worker 0's weights are clock 1's, as worker 1 read them: lr 1 over 2
  // workers, each gradient at half.
  void ExpectClock1() {
    for (size_t i : {size_t{0}, size_t{kElements}}) EXPECT_FLOAT_EQ(p1_[i], -(1.0f + 3.0f) / 2);
    EXPECT_EQ(p0_, p1_);
  }

  static constexpr int64_t kElements = 1000;
  v1::JobConfig config_;
  v1::ShardMap map_;
  std::unique_ptr<InProcessShards> shards_;
  std::unique_ptr<ParameterClient> w0_, w1_;
  std::vector<float> p0_, p1_;
  const std::vector<float> g0_ = std::vector<float>(2 * kElements, 1);
  const std::vector<float> g1_ = std::vector<float>(2 * kElements, 3);
};

TEST_F(SspReadsOfOneClock, APullThatTimedOutOnOneShardReadsOnlyThatShardAgain) {
  ASSERT_NO_FATAL_FAILURE(PullThatTimesOutOnShard1ThenStep1());
  ExpectThePullOfClock1ReadsShard1Only();
}

TEST_F(SspReadsOfOneClock, APullAfterAFusedPullThatCameInPartReadsOnlyTheRest) {
  const ParameterClient::Ticket t = PushOnlyA();
  absl::StatusOr<ParameterClient::PushOutcome> pushed =
      w0_->Wait(w0_->PushAsync(0, g0_.data(), 1, p0_.data(), absl::Milliseconds(300)));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(pushed->pulled);
  EndStep0AndPushStep1(t);
  ExpectThePullOfClock1ReadsShard1Only();
}

// A whole pull of the same clock into another array (the final weights an
// evaluation pulls, after training) does not end what this array has read:
// its next pull still leaves shard 0 as it first read it. Shard 0, read
// again by the other pull, answers clock 1's values once more.
TEST_F(SspReadsOfOneClock, AWholePullIntoAnotherArrayLeavesThisOnesPartsRead) {
  ASSERT_NO_FATAL_FAILURE(PullThatTimesOutOnShard1ThenStep1());
  std::vector<float> elsewhere(p0_.size());
  ASSERT_TRUE(w0_->Pull(1, absl::Seconds(5), elsewhere.data()).ok());
  EXPECT_FLOAT_EQ(elsewhere[0], -2);  // clock 1's "a": worker 1's step 1 still held
  ExpectThePullOfClock1ReadsShard1Only();
}

// Once a pull has read every part, the next pull of that clock reads them
// all again: async's final weights (PullFinal) come after the last step's.
TEST(WirePath, APullAfterAWholeOneOfTheSameClockReadsEveryShardAgain) {
  TwoWorkers job(Config(v1::MODE_ASYNC, 2, 2), 100000);
  ASSERT_TRUE(job.w0.Pull(1, absl::Seconds(5), job.p0.data()).ok());
  const std::vector<float> grads(job.p1.size(), 2);
  ASSERT_TRUE(job.w1.Wait(job.w1.PushAsync(0, grads.data(), 1)).ok());
  ASSERT_TRUE(job.w0.Pull(1, absl::Seconds(5), job.p0.data()).ok());
  EXPECT_FLOAT_EQ(job.p0.front(), -1);  // lr 1 over 2 workers
  EXPECT_FLOAT_EQ(job.p0.back(), -1);
}

// The same for a sparse table's rows: worker 0's pull of clock 1 reads
// shard 0's rows and times out on shard 1's; worker 1 ends step 0 and
// pushes step 1, which shard 0 holds until worker 0 pushes its step 1. The
// next attempt of the pull, given what the first read, reads shard 1 only.
TEST(WirePath, AnSspPullOfRowsTriedAgainReadsOnlyTheShardsItHasNotRead) {
  v1::JobConfig config = Config(v1::MODE_SSP, 2, 2);
  config.set_staleness_bound(0);
  constexpr uint32_t kDim = 4;
  v1::SparseTableSpec* table = config.add_sparse_tables();
  table->set_name("emb");
  table->set_dim(kDim);
  table->set_rows(100);
  v1::ShardMap map = MapOf(config, 10);
  InProcessShards shards(config, &map);
  shards.SetLiveWorkers(2);
  SparseClient w0(config, map, 0, 1), w1(config, map, 1, 1);
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int64_t> on_shard[2];
  for (int64_t id : ids) on_shard[SparseShardOf(id, 2)].push_back(id);
  ASSERT_FALSE(on_shard[0].empty());
  ASSERT_FALSE(on_shard[1].empty());
  std::vector<float> rows0(ids.size() * kDim), rows1(ids.size() * kDim);
  ASSERT_TRUE(w0.Pull("emb", ids, 0, absl::Seconds(5), rows0.data()).ok());
  ASSERT_TRUE(w1.Pull("emb", ids, 0, absl::Seconds(5), rows1.data()).ok());
  const std::vector<float> ones(ids.size() * kDim, 1);
  ASSERT_TRUE(w0.Push("emb", 0, ids, ones.data(), ParameterClient::RetryPolicy()).ok());
  // Worker 1's step 0, one shard at a time (a client sends to both at once).
  auto push_step0_of_w1 = [&](size_t s) {
    const std::vector<float> threes(on_shard[s].size() * kDim, 3);
    ShardStore::SparseGradientPush push;
    push.worker_rank = 1;
    push.incarnation = 1;
    push.table = "emb";
    push.ids = on_shard[s];
    push.values = threes;
    absl::StatusOr<ShardStore::SparsePushResult> pushed = shards.store(s).PushSparse(push);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
  };
  push_step0_of_w1(0);
  SparseShards::PullProgress progress;
  EXPECT_EQ(w0.Pull("emb", ids, 1, absl::Milliseconds(300), rows0.data(), &progress).code(),
            absl::StatusCode::kDeadlineExceeded);
  push_step0_of_w1(1);
  ASSERT_TRUE(w1.Pull("emb", ids, 1, absl::Seconds(5), rows1.data()).ok());
  const std::vector<float> hundreds(ids.size() * kDim, 100);
  ASSERT_TRUE(w1.Push("emb", 1, ids, hundreds.data(), ParameterClient::RetryPolicy()).ok());
  EXPECT_EQ(shards.store(0).ShardStatus().held_gradients(), 1u);  // worker 1's step 1
  const uint64_t read = shards.store(0).ShardStatus().pulls();
  ASSERT_TRUE(w0.Pull("emb", ids, 1, absl::Seconds(5), rows0.data(), &progress).ok());
  EXPECT_EQ(shards.store(0).ShardStatus().pulls(), read) << "shard 0's rows were read again";
  EXPECT_EQ(rows0, rows1);  // clock 1's rows: both step-0 gradients, no step 1
}

}  // namespace
}  // namespace grps
