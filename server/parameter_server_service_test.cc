#include "server/parameter_server_service.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "daemon/daemon.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "job/initializer.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "proto/grps.grpc.pb.h"
#include "tensor/dtype.h"
#include "wire/lane_doorbell.h"
#include "wire/shared_lane.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

// Whether `holds` becomes true within `timeout` (looked at every
// millisecond): how a test waits for another thread to get somewhere.
bool Eventually(const std::function<bool()>& holds, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!holds()) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

std::string F32Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::string Encode(const std::vector<float>& values, DType dtype) {
  std::string bytes(values.size() * DTypeSize(dtype), '\0');
  ConvertElements(values.data(), DType::kF32, bytes.data(), dtype,
                  values.size());
  return bytes;
}

std::vector<float> Decode(const std::string& bytes, DType dtype) {
  std::vector<float> values(bytes.size() / DTypeSize(dtype));
  ConvertElements(bytes.data(), dtype, values.data(), DType::kF32,
                  values.size());
  return values;
}

v1::TensorSpec Tensor(const std::string& name, std::vector<int64_t> shape,
                      const std::string& initializer) {
  v1::TensorSpec t;
  t.set_name(name);
  for (int64_t d : shape) t.add_shape(d);
  t.set_initializer(initializer);
  return t;
}

// What a bad request must leave untouched: every chunk's values and version
// and every counter except rejected_pushes.
struct Snapshot {
  std::vector<ShardStore::ChunkValues> chunks;
  v1::ShardStatus status;
};

// A two-shard, two-worker sync job with SGD (lr 0.5); this process serves
// shard 0 over real gRPC on a loopback port.
class ParameterServerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(v1::MODE_SYNC); }
  void TearDown() override {
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  void Start(v1::ConsistencyMode mode, v1::OptimizerKind optimizer = v1::OPTIMIZER_SGD) {
    config_ = DefaultJobConfig();
    config_.set_job_id("test-job");
    config_.set_mode(mode);
    config_.set_num_workers(2);
    config_.set_num_servers(2);
    config_.set_chunk_bytes(1024);
    config_.mutable_optimizer()->set_kind(optimizer);
    config_.mutable_optimizer()->set_learning_rate(0.5f);
    config_.mutable_optimizer()->set_momentum(0.0f);
    if (optimizer == v1::OPTIMIZER_WORKERS) {  // a user model's program's own
      config_.set_model(v1::MODEL_USER);
      config_.mutable_dataset()->set_path("");
    }
    // Chunks of 8, 8, 4 and 4 elements: two on each shard.
    absl::StatusOr<v1::ShardMap> map = BuildShardMap(
        {Tensor("w0", {2, 4}, "glorot_uniform"),
         Tensor("w1", {2, 4}, "glorot_uniform"), Tensor("b0", {4}, "zeros"),
         Tensor("b1", {4}, "zeros")},
        2, config_.chunk_bytes());
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    own_ = ChunksOfShard(map_, 0);
    ASSERT_EQ(own_.size(), 2u);
    foreign_ = ChunksOfShard(map_, 1).at(0);

    ShardStore::Options options;
    options.config = config_;
    options.shard_map = map_;
    options.shard = 0;
    options.incarnation = 1;
    absl::StatusOr<std::unique_ptr<ShardStore>> store =
        ShardStore::Create(std::move(options));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    service_ = std::make_unique<ParameterServerService>(store_.get());
    absl::StatusOr<GrpcServer> server =
        StartGrpcServer("127.0.0.1:0", {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::ParameterServer::NewStub(
        MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
  }

  uint64_t Elements(uint32_t chunk_id) const {
    return map_.chunks(chunk_id).num_elements();
  }

  // A valid f32 push of gradient `value` for every chunk of shard 0.
  v1::PushRequest GoodPush(uint32_t rank, uint64_t step, float value = 1.0f) {
    v1::PushRequest request;
    request.set_job_id("test-job");
    request.set_worker_rank(rank);
    request.set_incarnation(1);
    request.set_step(step);
    request.set_num_samples(32);
    for (uint32_t id : own_) {
      v1::ChunkData* c = request.add_chunks();
      c->set_chunk_id(id);
      c->set_dtype(v1::DTYPE_F32);
      c->set_version(step);
      c->set_data(F32Bytes(std::vector<float>(Elements(id), value)));
    }
    return request;
  }

  grpc::Status Push(const v1::PushRequest& request,
                    v1::PushResponse* response = nullptr) {
    v1::PushResponse ignored;
    grpc::ClientContext context;
    return stub_->Push(&context, request, response ? response : &ignored);
  }

  grpc::Status Pull(const v1::PullRequest& request, v1::PullResponse* response) {
    grpc::ClientContext context;
    return stub_->Pull(&context, request, response);
  }

  v1::PullRequest PullOf(std::vector<uint32_t> ids, uint64_t min_version = 0) {
    v1::PullRequest request;
    request.set_job_id("test-job");
    request.set_worker_rank(0);
    for (uint32_t id : ids) request.add_chunk_ids(id);
    request.set_min_version(min_version);
    request.set_timeout_ms(10000);
    return request;
  }

  Snapshot Take() const {
    Snapshot s;
    for (uint32_t id : own_) s.chunks.push_back(*store_->TEST_ReadChunk(id));
    s.status = store_->ShardStatus();
    s.status.clear_rejected_pushes();
    return s;
  }

  void ExpectUnchanged(const Snapshot& before) const {
    const Snapshot after = Take();
    for (size_t i = 0; i < own_.size(); ++i) {
      EXPECT_EQ(after.chunks[i].version, before.chunks[i].version);
      EXPECT_EQ(after.chunks[i].values, before.chunks[i].values);
    }
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(
        after.status, before.status))
        << "before: " << before.status.ShortDebugString()
        << "\nafter: " << after.status.ShortDebugString();
  }

  // The push fails with `code` and a message containing `message`, changes
  // nothing, and is counted as rejected.
  void ExpectPushRefused(const v1::PushRequest& request, grpc::StatusCode code,
                         const std::string& message) {
    const Snapshot before = Take();
    const uint64_t rejected = store_->ShardStatus().rejected_pushes();
    const grpc::Status status = Push(request);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
    ExpectUnchanged(before);
    EXPECT_GT(store_->ShardStatus().rejected_pushes(), rejected);
  }

  // The pull fails with `code`, serves nothing and counts nothing.
  void ExpectPullRefused(const v1::PullRequest& request, grpc::StatusCode code,
                         const std::string& message) {
    const Snapshot before = Take();
    v1::PullResponse response;
    const grpc::Status status = Pull(request, &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
    EXPECT_EQ(response.chunks_size(), 0);
    ExpectUnchanged(before);
  }

  std::vector<float> InitialValues(uint32_t chunk_id) const {
    const v1::ChunkSpec& spec = map_.chunks(chunk_id);
    std::vector<float> values(spec.num_elements());
    EXPECT_TRUE(InitializeRange(map_.tensors(spec.tensor_index()),
                                config_.seed(), spec.tensor_index(),
                                spec.offset(), spec.num_elements(),
                                values.data())
                    .ok());
    return values;
  }

  v1::JobConfig config_;
  v1::ShardMap map_;
  std::vector<uint32_t> own_;
  uint32_t foreign_ = 0;
  // Destroyed in reverse: the server stops before the service and the store.
  std::unique_ptr<ShardStore> store_;
  std::unique_ptr<ParameterServerService> service_;
  GrpcServer server_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
};

// ---- bad pushes ------------------------------------------------------------

TEST_F(ParameterServerServiceTest, PushForAnotherJobIsFailedPrecondition) {
  v1::PushRequest request = GoodPush(0, 0);
  request.set_job_id("other-job");
  ExpectPushRefused(request, grpc::StatusCode::FAILED_PRECONDITION,
                    "job 'other-job'");
}

// An empty message is a message (every field at its default): refused as
// such, not taken for one that never arrived.
TEST_F(ParameterServerServiceTest, AnEmptyPushOrPullIsRefusedForItsJob) {
  ExpectPushRefused(v1::PushRequest(), grpc::StatusCode::FAILED_PRECONDITION, "job ''");
  ExpectPullRefused(v1::PullRequest(), grpc::StatusCode::FAILED_PRECONDITION, "job ''");
}

TEST_F(ParameterServerServiceTest, AHugeJobIdIsCutAndEscapedInTheError) {
  // A 1 MiB job id echoed whole made a status the client refuses (and took
  // down another call on the connection).
  v1::PushRequest request = GoodPush(0, 0);
  request.set_job_id(std::string("\x01\n", 2) + std::string(1 << 20, 'j'));
  const Snapshot before = Take();
  const grpc::Status status = Push(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_LT(status.error_message().size(), 512u);
  EXPECT_THAT(status.error_message(), HasSubstr("\\x01\\n"));
  EXPECT_THAT(status.error_message(), HasSubstr("(1048578 bytes)"));
  ExpectUnchanged(before);
}

TEST_F(ParameterServerServiceTest, PushFromAnUnknownWorkerIsInvalidArgument) {
  ExpectPushRefused(GoodPush(2, 0), grpc::StatusCode::INVALID_ARGUMENT,
                    "unknown worker rank 2");
}

TEST_F(ParameterServerServiceTest, PushFromZeroSamplesIsInvalidArgumentAndChangesNothing) {
  v1::PushRequest request = GoodPush(0, 0);
  request.set_num_samples(0);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "0 samples");
}

TEST_F(ParameterServerServiceTest, PushToAnUnknownChunkIsNotFound) {
  v1::PushRequest request = GoodPush(0, 0);
  request.mutable_chunks(1)->set_chunk_id(99);
  ExpectPushRefused(request, grpc::StatusCode::NOT_FOUND, "unknown chunk 99");
}

TEST_F(ParameterServerServiceTest, PushToAChunkOfAnotherShardIsNotFound) {
  v1::PushRequest request = GoodPush(0, 0);
  v1::ChunkData* c = request.mutable_chunks(1);
  c->set_chunk_id(foreign_);
  c->set_data(F32Bytes(std::vector<float>(Elements(foreign_), 1.0f)));
  ExpectPushRefused(request, grpc::StatusCode::NOT_FOUND,
                    absl::StrCat("chunk ", foreign_, " is held by shard 1"));
}

// A re-sharded job's worker may hear of the new map (and its generation)
// before the shard has rebuilt for it: a chunk the shard does not hold yet is
// then "retry", not "not found" (which would end the worker).
TEST_F(ParameterServerServiceTest, PushOfANewerGenerationToAChunkNotHeldIsUnavailable) {
  v1::PushRequest request = GoodPush(0, 0);
  request.set_generation(1);  // the shard is in generation 0
  v1::ChunkData* c = request.mutable_chunks(1);
  c->set_chunk_id(foreign_);
  c->set_data(F32Bytes(std::vector<float>(Elements(foreign_), 1.0f)));
  ExpectPushRefused(request, grpc::StatusCode::UNAVAILABLE, "not yet 1; retry");
}

TEST_F(ParameterServerServiceTest, PushWithTheWrongByteLengthIsInvalidArgument) {
  v1::PushRequest request = GoodPush(0, 0);
  const uint32_t id = own_[1];
  request.mutable_chunks(1)->mutable_data()->pop_back();
  const uint64_t n = Elements(id);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("expected ", n * 4, " bytes (", n,
                                 " x f32), got ", n * 4 - 1));
}

TEST_F(ParameterServerServiceTest, PushWithAnUnspecifiedDTypeIsInvalidArgument) {
  v1::PushRequest request = GoodPush(0, 0);
  request.mutable_chunks(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "dtype is unspecified");
}

TEST_F(ParameterServerServiceTest, PushWithAnUnknownDTypeIsInvalidArgument) {
  v1::PushRequest request = GoodPush(0, 0);
  request.mutable_chunks(0)->set_dtype(static_cast<v1::DType>(9));
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "unknown dtype 9");
}

TEST_F(ParameterServerServiceTest, PushWithANaNGradientIsInvalidArgument) {
  // The first chunk is fine; the push is refused as a whole.
  v1::PushRequest request = GoodPush(0, 0);
  std::vector<float> bad(Elements(own_[1]), 1.0f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  request.mutable_chunks(1)->set_data(F32Bytes(bad));
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "gradient element 3 is nan");
}

TEST_F(ParameterServerServiceTest, FiniteGradientsThatWouldOverflowTheWeightsAreRefused) {
  // Two workers each pushing 3e38 (finite) made every weight non-finite.
  ExpectPushRefused(GoodPush(0, 0, 3e38f), grpc::StatusCode::INVALID_ARGUMENT,
                    "magnitudes above");
  // The largest accepted magnitude, from both workers: the step completes
  // and every weight stays finite.
  const float max = ParameterServerService::kMaxGradientMagnitude;
  ASSERT_TRUE(Push(GoodPush(0, 0, max)).ok());
  ASSERT_TRUE(Push(GoodPush(1, 0, max)).ok());
  for (uint32_t id : own_) {
    absl::StatusOr<ShardStore::ChunkValues> v = store_->TEST_ReadChunk(id);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->version, 1u);
    for (float x : v->values) ASSERT_TRUE(std::isfinite(x)) << x;
  }
}

TEST_F(ParameterServerServiceTest, PushWithAnInfinityInF16IsInvalidArgument) {
  v1::PushRequest request = GoodPush(0, 0);
  v1::ChunkData* c = request.mutable_chunks(0);
  std::string half = Encode(std::vector<float>(Elements(own_[0]), 1.0f),
                            DType::kF16);
  const uint16_t infinity = 0x7c00;
  std::memcpy(half.data() + 2, &infinity, 2);
  c->set_dtype(v1::DTYPE_F16);
  c->set_data(half);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "gradient element 1 is inf");
}

TEST_F(ParameterServerServiceTest, PushNamingAChunkTwiceIsInvalidArgument) {
  v1::PushRequest request = GoodPush(0, 0);
  *request.add_chunks() = request.chunks(0);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "appears twice");
}

TEST_F(ParameterServerServiceTest, PushWithoutChunksIsInvalidArgument) {
  v1::PushRequest request = GoodPush(0, 0);
  request.clear_chunks();
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "no chunks");
}

TEST_F(ParameterServerServiceTest,
       SyncPushComputedOnAVersionNeverServedIsFailedPrecondition) {
  ExpectPushRefused(GoodPush(0, 3), grpc::StatusCode::FAILED_PRECONDITION,
                    "computed on version 3 but the chunk is only at version 0");
}

// The threads of this process, as the kernel counts them.
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

TEST_F(ParameterServerServiceTest, SixtyFourWaitingPullsNeedNoThreadEach) {
  constexpr int kPulls = 64;
  // Warm gRPC's callback machinery up with a pull that is answered at once.
  v1::PullRequest ready = PullOf({});
  ready.set_clock(0);
  v1::PullResponse warm;
  ASSERT_TRUE(Pull(ready, &warm).ok());
  const int threads_before = ThreadCount();

  // Rank 0 contributes to step 0, then pulls for clock 1 64 times: each pull
  // waits until step 0 completes, which needs rank 1.
  ASSERT_TRUE(Push(GoodPush(0, 0, 1.0f)).ok());
  v1::PullRequest waiting = PullOf({});
  waiting.set_clock(1);
  struct Call {
    grpc::ClientContext context;
    v1::PullResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kPulls; ++i) {
    auto call = std::make_unique<Call>();
    Call* c = call.get();
    StartUnaryCall(
        [&](grpc::ClientUnaryReactor* r) {
          stub_->async()->Pull(&c->context, &waiting, &c->response, r);
        },
        [c](grpc::Status status) {
          c->status = std::move(status);
          c->done.Notify();
        });
    calls.push_back(std::move(call));
  }
  // Every pull has reached the store and waits there.
  ASSERT_TRUE(Eventually([&] { return store_->waiting_pulls() == static_cast<size_t>(kPulls); }, absl::Seconds(20)))
      << store_->waiting_pulls() << " pulls waiting";
  const int threads_waiting = ThreadCount();
  EXPECT_LT(threads_waiting - threads_before, 16)
      << threads_before << " threads before, " << threads_waiting
      << " with " << kPulls << " pulls waiting";
  for (const auto& c : calls) EXPECT_FALSE(c->done.HasBeenNotified());

  // Rank 1's gradient completes the step and releases every pull.
  ASSERT_TRUE(Push(GoodPush(1, 0, 3.0f)).ok());
  for (const auto& c : calls) {
    ASSERT_TRUE(c->done.WaitForNotificationWithTimeout(absl::Seconds(20)));
    ASSERT_TRUE(c->status.ok()) << c->status.error_message();
    ASSERT_EQ(c->response.chunks_size(), 2);
    EXPECT_EQ(c->response.chunks(0).version(), 1u);
  }
  EXPECT_EQ(store_->ShardStatus().waiting_pulls(), 0u);
}

// ---- good pushes and pulls -------------------------------------------------

TEST_F(ParameterServerServiceTest, SyncStepCompletesAndRetryIsAcknowledged) {
  v1::PushResponse response;
  ASSERT_TRUE(Push(GoodPush(0, 0, 1.0f), &response).ok());
  EXPECT_THAT(response.versions(), ::testing::ElementsAre(1, 1));
  ASSERT_TRUE(Push(GoodPush(0, 0, 1.0f), &response).ok());
  EXPECT_EQ(response.duplicates(), 2u);
  ASSERT_TRUE(Push(GoodPush(1, 0, 3.0f), &response).ok());

  v1::PullResponse pulled;
  ASSERT_TRUE(Pull(PullOf({}, 1), &pulled).ok());
  ASSERT_EQ(pulled.chunks_size(), 2);
  for (const v1::ChunkData& c : pulled.chunks()) {
    EXPECT_EQ(c.version(), 1u);
    EXPECT_EQ(c.dtype(), v1::DTYPE_F32);
    std::vector<float> expected = InitialValues(c.chunk_id());
    for (float& v : expected) v -= 0.5f * 2.0f;  // average of 1 and 3
    EXPECT_EQ(Decode(c.data(), DType::kF32), expected);
  }
}

TEST_F(ParameterServerServiceTest, AStepRunsTheProgramsOptimizerItsChunksName) {
  // Rank 0 (the lowest) names the program's SGD at lr 0.125 for its second
  // chunk; its first runs the job's (lr 0.5).
  v1::PushRequest first = GoodPush(0, 0, 1.0f);
  v1::OptimizerConfig* program = first.add_optimizers();
  program->set_kind(v1::OPTIMIZER_SGD);
  program->set_learning_rate(0.125f);
  first.mutable_chunks(1)->set_optimizer(1);
  ASSERT_TRUE(Push(first).ok());
  ASSERT_TRUE(Push(GoodPush(1, 0, 3.0f)).ok());
  v1::PullResponse pulled;
  ASSERT_TRUE(Pull(PullOf({}, 1), &pulled).ok());
  ASSERT_EQ(pulled.chunks_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::ChunkData& c = pulled.chunks(i);
    std::vector<float> expected = InitialValues(c.chunk_id());
    for (float& v : expected) v -= (i == 1 ? 0.125f : 0.5f) * 2.0f;
    EXPECT_EQ(Decode(c.data(), DType::kF32), expected) << i;
  }
}

TEST_F(ParameterServerServiceTest, AProgramsOptimizerOfAnotherStateOrOutOfRangeIsRefused) {
  v1::PushRequest request = GoodPush(0, 0);
  v1::OptimizerConfig* program = request.add_optimizers();
  program->set_kind(v1::OPTIMIZER_ADAM);
  request.mutable_chunks(0)->set_optimizer(1);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "optimizer 1: the program's optimizer is adam but the job's is sgd");
  program->set_kind(v1::OPTIMIZER_SGD);
  program->set_learning_rate(std::numeric_limits<float>::infinity());
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "not a finite number");
  program->set_learning_rate(0.1f);
  request.mutable_chunks(1)->set_optimizer(2);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "names optimizer 2 of 1");
}

// ---- a program's optimizer state (grps.torch's state_dict) ----------------

class OptimizerStateTest : public ParameterServerServiceTest {
 protected:
  void SetUp() override { Start(v1::MODE_SYNC, v1::OPTIMIZER_ADAM); }

  // Adam's state of shard 0's chunks: first moments m, second moments v,
  // counted `steps`.
  v1::LoadOptimizerStateRequest LoadOf(float m, float v, uint64_t steps) {
    v1::LoadOptimizerStateRequest request;
    request.set_job_id("test-job");
    request.set_worker_rank(0);
    request.set_incarnation(1);
    request.set_kind(v1::OPTIMIZER_ADAM);
    for (uint32_t id : own_) {
      v1::ChunkOptimizerState* c = request.add_chunks();
      c->set_chunk_id(id);
      c->set_steps(steps);
      c->add_slots(F32Bytes(std::vector<float>(Elements(id), m)));
      c->add_slots(F32Bytes(std::vector<float>(Elements(id), v)));
    }
    return request;
  }
  grpc::Status Load(const v1::LoadOptimizerStateRequest& request) {
    v1::LoadOptimizerStateResponse response;
    grpc::ClientContext context;
    return stub_->LoadOptimizerState(&context, request, &response);
  }
  absl::StatusOr<v1::GetOptimizerStateResponse> Get() {
    v1::GetOptimizerStateRequest request;
    request.set_job_id("test-job");
    request.set_worker_rank(1);
    for (uint32_t id : own_) request.add_chunk_ids(id);
    v1::GetOptimizerStateResponse response;
    grpc::ClientContext context;
    grpc::Status status = stub_->GetOptimizerState(&context, request, &response);
    if (!status.ok()) return absl::UnknownError(status.error_message());
    return response;
  }
  // Every chunk's state is (m, v) after `steps` updates.
  void ExpectState(float m, float v, uint64_t steps) {
    absl::StatusOr<v1::GetOptimizerStateResponse> state = Get();
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_EQ(state->kind(), v1::OPTIMIZER_ADAM);
    ASSERT_EQ(state->chunks_size(), static_cast<int>(own_.size()));
    for (int i = 0; i < state->chunks_size(); ++i) {
      const v1::ChunkOptimizerState& c = state->chunks(i);
      EXPECT_EQ(c.chunk_id(), own_[i]);
      EXPECT_EQ(c.steps(), steps);
      ASSERT_EQ(c.slots_size(), 2);
      EXPECT_EQ(Decode(c.slots(0), DType::kF32), std::vector<float>(Elements(own_[i]), m));
      EXPECT_EQ(Decode(c.slots(1), DType::kF32), std::vector<float>(Elements(own_[i]), v));
    }
  }
};

TEST_F(OptimizerStateTest, ASavedStateStartsTheJobAndItsStepCountGoesOn) {
  ExpectState(0, 0, 0);
  ASSERT_TRUE(Load(LoadOf(0.5f, 0.25f, 20)).ok());
  ExpectState(0.5f, 0.25f, 20);
  // Step 0 (the gradients' average is 2) is Adam's 21st update of the state.
  ASSERT_TRUE(Push(GoodPush(0, 0, 1.0f)).ok());
  ASSERT_TRUE(Push(GoodPush(1, 0, 3.0f)).ok());
  const float m = 0.9f * 0.5f + (1.0f - 0.9f) * 2.0f;
  const float v = 0.999f * 0.25f + (1.0f - 0.999f) * 2.0f * 2.0f;
  ExpectState(m, v, 21);
  const double step = 0.5 * (m / (1 - std::pow(0.9, 21))) /
                      (std::sqrt(v / (1 - std::pow(0.999, 21))) + 1e-8);
  for (uint32_t id : own_) {
    const std::vector<float> initial = InitialValues(id);
    absl::StatusOr<ShardStore::ChunkValues> now = store_->TEST_ReadChunk(id);
    ASSERT_TRUE(now.ok());
    for (size_t e = 0; e < initial.size(); ++e)
      EXPECT_NEAR(now->values[e], initial[e] - step, 1e-6) << id << " " << e;
  }
  // Once the job has updated, its state is its own.
  const grpc::Status again = Load(LoadOf(0.5f, 0.25f, 20));
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(again.error_message(), HasSubstr("has had 1 updates"));
  ExpectState(m, v, 21);
}

TEST_F(OptimizerStateTest, ACheckpointKeepsTheLoadedStepCount) {
  ASSERT_TRUE(Load(LoadOf(0.5f, 0.25f, 20)).ok());
  v1::CheckpointRequest at;
  at.set_id(1);
  absl::StatusOr<v1::ShardCheckpointFile> file = store_->CaptureCheckpoint(at, absl::Now());
  ASSERT_TRUE(file.ok()) << file.status();
  for (const v1::ChunkState& c : file->chunks()) EXPECT_EQ(c.optimizer_step_offset(), 20);
  ASSERT_TRUE(store_->Restore(1, 0, {}, {}).ok());  // back to step 0: no state
  ExpectState(0, 0, 0);
  ASSERT_TRUE(store_->Restore(2, 1, {file->chunks().begin(), file->chunks().end()}, {}).ok());
  ExpectState(0.5f, 0.25f, 20);
  // A file's count below zero (the offset below minus the version) is refused.
  std::vector<v1::ChunkState> bad(file->chunks().begin(), file->chunks().end());
  bad[1].set_optimizer_step_offset(-1);
  const absl::Status refused = store_->Restore(3, 1, bad, {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("step offset -1 is below minus the version 0"));
  ExpectState(0.5f, 0.25f, 20);
}

TEST_F(OptimizerStateTest, AStateThatDoesNotFitTheJobIsRefusedAndChangesNothing) {
  auto refused = [&](const v1::LoadOptimizerStateRequest& request, grpc::StatusCode code,
                     const std::string& message) {
    const grpc::Status status = Load(request);
    EXPECT_EQ(status.error_code(), code) << message << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
    ExpectState(0, 0, 0);
  };
  v1::LoadOptimizerStateRequest r = LoadOf(0.5f, 0.25f, 20);
  r.set_job_id("other");
  refused(r, grpc::StatusCode::FAILED_PRECONDITION, "job 'other'");
  r = LoadOf(0.5f, 0.25f, 20);
  r.set_kind(v1::OPTIMIZER_MOMENTUM);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "the state is the momentum optimizer's; the job's servers keep adam's");
  r = LoadOf(0.5f, 0.25f, 20);
  r.mutable_chunks(1)->mutable_slots()->RemoveLast();
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "1 optimizer state slots; adam has 2");
  r = LoadOf(0.5f, 0.25f, 20);
  r.mutable_chunks(0)->mutable_slots(0)->resize(4);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "has 4 bytes");
  r = LoadOf(std::numeric_limits<float>::quiet_NaN(), 0.25f, 20);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "not a finite number");
  r = LoadOf(0.5f, -0.25f, 20);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "a sum of squares is not negative");
  r = LoadOf(1e16f, 0.25f, 20);  // m / (sqrt(v) + eps) would pass a float
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "above 1e+15");
  r = LoadOf(0.5f, 1e31f, 20);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "above 1e+30");
  r = LoadOf(0.5f, 0.25f, uint64_t{1} << 60);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "steps, above");
  r = LoadOf(0.5f, 0.25f, 20);
  *r.add_chunks() = r.chunks(0);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "twice in one request");
  r = LoadOf(0.5f, 0.25f, 20);
  r.mutable_chunks(0)->set_chunk_id(foreign_);
  refused(r, grpc::StatusCode::NOT_FOUND, "is held by shard 1");
  r = LoadOf(0.5f, 0.25f, 20);
  r.clear_chunks();
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "names no chunk");
  r = LoadOf(0.5f, 0.25f, 20);
  r.set_worker_rank(9);
  refused(r, grpc::StatusCode::INVALID_ARGUMENT, "unknown worker rank 9");
}

class OptimizerOnWorkersTest : public ParameterServerServiceTest {
 protected:
  void SetUp() override { Start(v1::MODE_SYNC, v1::OPTIMIZER_WORKERS); }
};

TEST_F(OptimizerOnWorkersTest, TheServersKeepNoStateToLoadAndRunNoProgramsOptimizer) {
  v1::LoadOptimizerStateRequest request;
  request.set_job_id("test-job");
  request.set_kind(v1::OPTIMIZER_WORKERS);
  request.add_chunks()->set_chunk_id(own_[0]);
  v1::LoadOptimizerStateResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub_->LoadOptimizerState(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("the job's optimizer runs on the workers"));
  // A push naming an optimizer for the servers is refused too.
  v1::PushRequest push = GoodPush(0, 0);
  push.add_optimizers()->set_kind(v1::OPTIMIZER_SGD);
  push.mutable_chunks(0)->set_optimizer(1);
  ExpectPushRefused(push, grpc::StatusCode::INVALID_ARGUMENT,
                    "the job's optimizer runs on the workers");
}

TEST_F(ParameterServerServiceTest, F16PushAndBf16PullRoundTrip) {
  const std::vector<float> pattern = {0.5f, -1.25f, 2.0f, 0.125f};
  auto push_f16 = [&](uint32_t rank) {
    v1::PushRequest request = GoodPush(rank, 0);
    for (v1::ChunkData& c : *request.mutable_chunks()) {
      std::vector<float> g(Elements(c.chunk_id()));
      for (size_t i = 0; i < g.size(); ++i) g[i] = pattern[i % pattern.size()];
      c.set_dtype(v1::DTYPE_F16);
      c.set_data(Encode(g, DType::kF16));
    }
    return Push(request);
  };
  ASSERT_TRUE(push_f16(0).ok());
  ASSERT_TRUE(push_f16(1).ok());

  v1::PullRequest request = PullOf(own_, 1);
  request.set_dtype(v1::DTYPE_BF16);
  v1::PullResponse pulled;
  ASSERT_TRUE(Pull(request, &pulled).ok());
  ASSERT_EQ(pulled.chunks_size(), 2);
  for (const v1::ChunkData& c : pulled.chunks()) {
    EXPECT_EQ(c.dtype(), v1::DTYPE_BF16);
    ASSERT_EQ(c.data().size(), Elements(c.chunk_id()) * 2);
    // The f32 update of the f16 gradients, as bf16 on the way out.
    std::vector<float> expected = InitialValues(c.chunk_id());
    for (size_t i = 0; i < expected.size(); ++i)
      expected[i] -= 0.5f * pattern[i % pattern.size()];
    EXPECT_EQ(Decode(c.data(), DType::kBF16),
              Decode(Encode(expected, DType::kBF16), DType::kBF16));
  }
  const v1::ShardStatus status = store_->ShardStatus();
  EXPECT_EQ(status.bytes_in(), 2 * (8 + 4) * 2u);  // two f16 pushes
  EXPECT_EQ(status.bytes_out(), (8 + 4) * 2u);     // one bf16 pull
}

// ---- shared-memory lanes ------------------------------------------------

// A worker's lane with room for every chunk of shard 0 twice: its gradients
// from kLaneHeaderBytes, the fused pull's values from reply_at.
struct TestLane {
  std::shared_ptr<LaneSegment> segment;
  uint64_t reply_at = 0;
};

class LaneTest : public ParameterServerServiceTest {
 protected:
  // `value_bytes`: 4096 holds the values and the reply; more leaves room
  // after them.
  TestLane NewLane(uint64_t value_bytes = 4096) {
    TestLane lane;
    absl::StatusOr<std::shared_ptr<LaneSegment>> segment = LaneSegment::Create(value_bytes);
    EXPECT_TRUE(segment.ok()) << segment.status();
    if (segment.ok()) lane.segment = *segment;
    lane.reply_at = kLaneHeaderBytes + 2048;
    return lane;
  }

  // GoodPush(rank, step, value) with its values in `lane` and the reply's
  // values asked into it too.
  v1::PushRequest LanePush(const TestLane& lane, uint32_t rank, uint64_t step, float value) {
    v1::PushRequest request = GoodPush(rank, step, value);
    uint64_t at = kLaneHeaderBytes;
    for (v1::ChunkData& c : *request.mutable_chunks()) {
      std::memcpy(lane.segment->base() + at, c.data().data(), c.data().size());
      c.clear_data();
      c.set_lane_offset(at);
      at += Elements(c.chunk_id()) * sizeof(float);
    }
    *request.mutable_lane() = lane.segment->Ref();
    request.mutable_lane()->set_reply_offset(lane.reply_at);
    request.set_pull(true);
    request.set_pull_timeout_ms(10000);
    return request;
  }
};

TEST_F(LaneTest, APushThroughTheLaneIsAppliedAsInBytesAndItsReplyComesThroughTheLane) {
  ASSERT_TRUE(Push(GoodPush(1, 0, 3.0f)).ok());
  const TestLane lane = NewLane();
  ASSERT_NE(lane.segment, nullptr);
  v1::PushResponse response;
  ASSERT_TRUE(Push(LanePush(lane, 0, 0, 1.0f), &response).ok());

  // The step completed (1 and 3 averaged); the reply names where the new
  // weights are in the lane, back to back from reply_offset, and carries no
  // bytes of them.
  ASSERT_EQ(response.chunks_size(), 2);
  uint64_t at = lane.reply_at;
  for (const v1::ChunkData& c : response.chunks()) {
    EXPECT_TRUE(c.data().empty());
    EXPECT_EQ(c.lane_offset(), at);
    EXPECT_EQ(c.version(), 1u);
    std::vector<float> expected = InitialValues(c.chunk_id());
    for (float& v : expected) v -= 0.5f * 2.0f;
    std::vector<float> in_lane(expected.size());
    std::memcpy(in_lane.data(), lane.segment->base() + at, in_lane.size() * sizeof(float));
    EXPECT_EQ(in_lane, expected);
    EXPECT_EQ(store_->TEST_ReadChunk(c.chunk_id())->values, expected);
    at += in_lane.size() * sizeof(float);
  }
  const v1::ShardStatus status = store_->ShardStatus();
  EXPECT_EQ(status.bytes_in(), 2 * (8 + 4) * 4u) << "the lane's bytes count as bytes in";
  EXPECT_EQ(status.bytes_out(), (8 + 4) * 4u);
}

TEST_F(LaneTest, AGradientInTheLaneIsCheckedAsOneInBytes) {
  const TestLane lane = NewLane();
  ASSERT_NE(lane.segment, nullptr);
  v1::PushRequest request = LanePush(lane, 0, 0, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(lane.segment->base() + kLaneHeaderBytes + 4, &nan, sizeof(nan));
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "is nan");
}

TEST_F(LaneTest, APlaceOutsideTheLaneIsInvalidArgumentAndChangesNothing) {
  const TestLane lane = NewLane();
  ASSERT_NE(lane.segment, nullptr);
  v1::PushRequest request = LanePush(lane, 0, 0, 1.0f);
  request.mutable_chunks(1)->set_lane_offset(lane.segment->size() - 4);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "outside the lane");

  request = LanePush(lane, 0, 0, 1.0f);
  request.mutable_lane()->set_reply_offset(lane.segment->size() - 8);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "outside the lane");
}

TEST_F(LaneTest, ALaneOffsetWithoutALaneOrBesideBytesIsInvalidArgument) {
  const TestLane lane = NewLane();
  ASSERT_NE(lane.segment, nullptr);
  v1::PushRequest request = LanePush(lane, 0, 0, 1.0f);
  request.clear_lane();
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "lane offset");

  request = LanePush(lane, 0, 0, 1.0f);
  request.mutable_chunks(0)->set_data(F32Bytes(std::vector<float>(Elements(own_[0]), 1.0f)));
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "lane offset");
}

TEST_F(LaneTest, ALaneTheShardCannotMapIsUnimplementedAndChangesNothing) {
  const TestLane lane = NewLane();
  ASSERT_NE(lane.segment, nullptr);
  v1::PushRequest request = LanePush(lane, 0, 0, 1.0f);
  request.mutable_lane()->set_nonce(request.lane().nonce() ^ 0xff);
  const Snapshot before = Take();
  const grpc::Status status = Push(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("send the values in the message"));
  ExpectUnchanged(before);
  // Not a bad push: the worker sends it again in bytes.
  EXPECT_EQ(store_->ShardStatus().rejected_pushes(), 0u);
  ASSERT_TRUE(Push(GoodPush(0, 0, 1.0f)).ok());
}

TEST_F(LaneTest, ALaneOfAnotherJobOrRankIsRefusedBeforeItIsOpened) {
  const TestLane lane = NewLane();
  ASSERT_NE(lane.segment, nullptr);
  v1::PushRequest request = LanePush(lane, 0, 0, 1.0f);
  request.set_job_id("other-job");
  ExpectPushRefused(request, grpc::StatusCode::FAILED_PRECONDITION, "job 'other-job'");
  request = LanePush(lane, 5, 0, 1.0f);
  ExpectPushRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "unknown worker rank 5");
}

// ---- doorbells ------------------------------------------------------------

// A lane with a doorbell area of one slot after its values; pushes rung
// there are PushRequests serialized by protobuf, as a plain client would.
class DoorbellTest : public LaneTest {
 protected:
  static constexpr uint32_t kSlotBytes = 1024;

  // A lane with its doorbell area after the first 4096 bytes of values.
  TestLane NewDoorbellLane() { return NewLane(8192); }
  static uint64_t AreaOffset() { return kLaneHeaderBytes + 4096; }
  static LaneDoorbell BellOf(const TestLane& lane) {
    return LaneDoorbell(lane.segment->base() + AreaOffset(), 1, kSlotBytes);
  }

  // LanePush asking shard 0 to serve the lane's doorbell.
  v1::PushRequest DoorbellPush(const TestLane& lane, uint32_t rank, uint64_t step, float value) {
    v1::PushRequest request = LanePush(lane, rank, step, value);
    request.mutable_lane()->set_doorbell_offset(AreaOffset());
    request.mutable_lane()->set_doorbell_slots(1);
    request.mutable_lane()->set_doorbell_slot_bytes(kSlotBytes);
    return request;
  }

  // Step 0 of both workers, rank 0's through `lane` asking for its
  // doorbell: the step completes and the doorbell opens.
  void OpenDoorbell(const TestLane& lane) {
    ASSERT_NE(lane.segment, nullptr);
    ASSERT_TRUE(Push(GoodPush(1, 0, 3.0f)).ok());
    v1::PushResponse response;
    ASSERT_TRUE(Push(DoorbellPush(lane, 0, 0, 1.0f), &response).ok());
    EXPECT_TRUE(response.doorbell()) << "the shard says it serves the doorbell";
  }

  // Rings `bytes` at `lane`'s doorbell and waits for the answer.
  absl::Status RingBytes(const TestLane& lane, const std::string& bytes,
                         v1::PushResponse* response = nullptr) {
    LaneDoorbell bell = BellOf(lane);
    grpc::Slice slice(bytes.data(), bytes.size());
    const uint32_t seq = bell.Ring(0, grpc::ByteBuffer(&slice, 1));
    if (!bell.AwaitAnswer(0, seq, absl::Seconds(20)))
      return absl::DeadlineExceededError("no answer at the doorbell");
    grpc::ByteBuffer reply;
    if (absl::Status s = bell.TakeAnswer(0, &reply); !s.ok()) return s;
    v1::PushResponse ignored;
    if (!grpc::SerializationTraits<v1::PushResponse>::Deserialize(&reply,
                                                                 response ? response : &ignored)
             .ok())
      return absl::DataLossError("the answer is not a PushResponse");
    return absl::OkStatus();
  }
  absl::Status Ring(const TestLane& lane, const v1::PushRequest& request,
                    v1::PushResponse* response = nullptr) {
    return RingBytes(lane, request.SerializeAsString(), response);
  }

  // The expected weights of shard 0's chunks after SGD steps of these mean
  // gradients.
  std::vector<float> After(uint32_t chunk_id, std::vector<float> means) const {
    std::vector<float> values = InitialValues(chunk_id);
    for (float mean : means)
      for (float& v : values) v -= 0.5f * mean;
    return values;
  }
};

TEST_F(DoorbellTest, ALanePushOpensTheDoorbellAndARungPushIsServedAsACallWouldBe) {
  const TestLane lane = NewDoorbellLane();
  OpenDoorbell(lane);
  EXPECT_EQ(service_->doorbells_served(), 1u);

  // Step 1: rank 1 calls, rank 0 rings; the step completes (1 and 5
  // averaged) and the rung push's weights come back through the lane.
  ASSERT_TRUE(Push(GoodPush(1, 1, 5.0f)).ok());
  v1::PushResponse rung;
  ASSERT_TRUE(Ring(lane, LanePush(lane, 0, 1, 1.0f), &rung).ok());
  ASSERT_EQ(rung.chunks_size(), 2);
  uint64_t at = lane.reply_at;
  for (const v1::ChunkData& c : rung.chunks()) {
    EXPECT_EQ(c.lane_offset(), at);
    EXPECT_EQ(c.version(), 2u);
    const std::vector<float> expected = After(c.chunk_id(), {2.0f, 3.0f});
    std::vector<float> in_lane(expected.size());
    std::memcpy(in_lane.data(), lane.segment->base() + at, in_lane.size() * sizeof(float));
    EXPECT_EQ(in_lane, expected);
    EXPECT_EQ(store_->TEST_ReadChunk(c.chunk_id())->values, expected);
    at += in_lane.size() * sizeof(float);
  }
  // Rung again: the same push is a duplicate, applied once.
  ASSERT_TRUE(Ring(lane, LanePush(lane, 0, 1, 1.0f), &rung).ok());
  EXPECT_EQ(rung.duplicates(), 2u);
  EXPECT_EQ(store_->TEST_ReadChunk(own_[0])->values, After(own_[0], {2.0f, 3.0f}));
}

TEST_F(DoorbellTest, ARungDuplicateGetsItsWeightsThroughTheLaneNotInTheSlot) {
  // A worker that rolled back pushes steps the shard applied already; rung,
  // their weights must not travel in the slot, which holds a few hundred
  // bytes (in the message they would not fit a real model's slot).
  const TestLane lane = NewDoorbellLane();
  OpenDoorbell(lane);
  ASSERT_TRUE(Push(GoodPush(1, 1, 5.0f)).ok());
  ASSERT_TRUE(Ring(lane, LanePush(lane, 0, 1, 1.0f)).ok());
  std::memset(lane.segment->base() + lane.reply_at, 0xff, 1024);  // the weights read before

  v1::PushResponse rung;
  ASSERT_TRUE(Ring(lane, LanePush(lane, 0, 1, 1.0f), &rung).ok());
  EXPECT_EQ(rung.duplicates(), 2u);
  ASSERT_EQ(rung.chunks_size(), 2);
  uint64_t at = lane.reply_at;
  for (const v1::ChunkData& c : rung.chunks()) {
    EXPECT_TRUE(c.data().empty()) << "chunk " << c.chunk_id() << "'s weights are in the slot";
    EXPECT_EQ(c.lane_offset(), at);
    EXPECT_EQ(c.version(), 2u);
    const std::vector<float> expected = After(c.chunk_id(), {2.0f, 3.0f});
    std::vector<float> in_lane(expected.size());
    std::memcpy(in_lane.data(), lane.segment->base() + at, in_lane.size() * sizeof(float));
    EXPECT_EQ(in_lane, expected) << "applied once, written again into the lane";
    EXPECT_EQ(store_->TEST_ReadChunk(c.chunk_id())->values, expected);
    at += in_lane.size() * sizeof(float);
  }
}

TEST_F(DoorbellTest, ADuplicateCalledThroughGrpcGetsItsWeightsInTheMessage) {
  // A call may be a copy of one whose place in the lane a newer call holds
  // by now: its weights stay out of the lane.
  const TestLane lane = NewDoorbellLane();
  OpenDoorbell(lane);
  std::memset(lane.segment->base() + lane.reply_at, 0xff, 1024);
  v1::PushResponse called;
  ASSERT_TRUE(Push(DoorbellPush(lane, 0, 0, 1.0f), &called).ok());
  EXPECT_EQ(called.duplicates(), 2u);
  ASSERT_EQ(called.chunks_size(), 2);
  for (const v1::ChunkData& c : called.chunks()) {
    EXPECT_EQ(c.lane_offset(), 0u);
    EXPECT_EQ(c.data().size(), Elements(c.chunk_id()) * sizeof(float));
  }
  for (size_t i = 0; i < 1024; ++i)
    ASSERT_EQ(static_cast<unsigned char>(lane.segment->base()[lane.reply_at + i]), 0xff)
        << "the lane was written at byte " << i;
}

TEST_F(DoorbellTest, ARingFromAnotherRankIncarnationOrLaneIsRefusedAndChangesNothing) {
  const TestLane lane = NewDoorbellLane();
  const TestLane other = NewDoorbellLane();
  ASSERT_NE(other.segment, nullptr);
  OpenDoorbell(lane);
  ASSERT_EQ(service_->doorbells_served(), 1u);
  const Snapshot before = Take();
  const uint64_t rejected = store_->ShardStatus().rejected_pushes();
  v1::PushRequest request = LanePush(lane, 1, 1, 1.0f);
  absl::Status s = Ring(lane, request);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  request = LanePush(lane, 0, 1, 1.0f);
  request.set_incarnation(2);
  EXPECT_TRUE(absl::IsPermissionDenied(Ring(lane, request)));
  request = LanePush(lane, 0, 1, 1.0f);
  *request.mutable_lane() = other.segment->Ref();  // names another lane
  EXPECT_TRUE(absl::IsPermissionDenied(Ring(lane, request)));
  // Bytes that are no PushRequest, or a NaN: refused as a call's would be.
  s = RingBytes(lane, std::string("\xff\xff\xff", 3));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a PushRequest"));
  request = LanePush(lane, 0, 1, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(lane.segment->base() + kLaneHeaderBytes, &nan, sizeof(nan));
  s = Ring(lane, request);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  ExpectUnchanged(before);
  EXPECT_EQ(store_->ShardStatus().rejected_pushes(), rejected + 5 * 2 - 1)
      << "each refusal counts its chunks (the unreadable one counts 1)";
  // The doorbell still serves its worker.
  ASSERT_TRUE(Push(GoodPush(1, 1, 3.0f)).ok());
  EXPECT_TRUE(Ring(lane, LanePush(lane, 0, 1, 1.0f)).ok());
}

TEST_F(DoorbellTest, ADoorbellOutsideTheLaneIsNotServedButThePushStands) {
  const TestLane lane = NewDoorbellLane();
  ASSERT_NE(lane.segment, nullptr);
  ASSERT_TRUE(Push(GoodPush(1, 0, 3.0f)).ok());
  v1::PushRequest request = DoorbellPush(lane, 0, 0, 1.0f);
  request.mutable_lane()->set_doorbell_offset(lane.segment->size() - 512);
  v1::PushResponse response;
  ASSERT_TRUE(Push(request, &response).ok());
  EXPECT_FALSE(response.doorbell());
  EXPECT_EQ(response.chunks_size(), 2) << "applied, and its step completed";
  request = DoorbellPush(lane, 0, 1, 1.0f);
  request.mutable_lane()->set_doorbell_slot_bytes(1000);  // not a multiple of 64
  ASSERT_TRUE(Push(GoodPush(1, 1, 3.0f)).ok());
  ASSERT_TRUE(Push(request, &response).ok());
  EXPECT_FALSE(response.doorbell());
  EXPECT_EQ(service_->doorbells_served(), 0u);
}

TEST_F(DoorbellTest, ADoorbellStopsWhenItsLaneIsReplacedAndWhenTheServiceStops) {
  const TestLane first = NewDoorbellLane();
  const TestLane second = NewDoorbellLane();
  ASSERT_NE(second.segment, nullptr);
  OpenDoorbell(first);
  const LaneDoorbell old_bell = BellOf(first);
  // It beats while it serves.
  const uint32_t beat = old_bell.beat();
  EXPECT_TRUE(Eventually([&] { return old_bell.beat() != beat; }, kDoorbellBeat * 100));

  // The worker's next lane (a retry, a restart) replaces it.
  ASSERT_TRUE(Push(GoodPush(1, 1, 3.0f)).ok());
  v1::PushResponse response;
  ASSERT_TRUE(Push(DoorbellPush(second, 0, 1, 1.0f), &response).ok());
  EXPECT_TRUE(response.doorbell());
  EXPECT_EQ(service_->doorbells_served(), 1u);
  const uint32_t last = old_bell.beat();
  // What is tested is that nothing happens: three beats' time is the wait.
  absl::SleepFor(kDoorbellBeat * 3);
  EXPECT_EQ(old_bell.beat(), last) << "the old lane's doorbell serves no more";

  // A rung push waiting for its step (rank 1 has not pushed step 2) is
  // answered when the service stops: applied, without the weights.
  LaneDoorbell bell = BellOf(second);
  const std::string request = LanePush(second, 0, 2, 1.0f).SerializeAsString();
  grpc::Slice slice(request.data(), request.size());
  const uint32_t seq = bell.Ring(0, grpc::ByteBuffer(&slice, 1));
  EXPECT_FALSE(bell.AwaitAnswer(0, seq, absl::Milliseconds(200))) << "waits for rank 1";
  service_->StopDoorbells();
  ASSERT_TRUE(bell.AwaitAnswer(0, seq, absl::Seconds(5)));
  grpc::ByteBuffer reply;
  ASSERT_TRUE(bell.TakeAnswer(0, &reply).ok());
  v1::PushResponse answered;
  ASSERT_TRUE(grpc::SerializationTraits<v1::PushResponse>::Deserialize(&reply, &answered).ok());
  EXPECT_EQ(answered.chunks_size(), 0);
  EXPECT_EQ(service_->doorbells_served(), 0u);
  const uint32_t stopped = bell.beat();
  absl::SleepFor(kDoorbellBeat * 3);  // as above: no beat in three beats' time
  EXPECT_EQ(bell.beat(), stopped);
  // Stopped for good: a push asking for a doorbell is served as a call.
  const TestLane third = NewDoorbellLane();
  ASSERT_NE(third.segment, nullptr);
  ASSERT_TRUE(Push(GoodPush(1, 2, 3.0f)).ok());  // step 2 completes
  v1::PushRequest plain = DoorbellPush(third, 0, 3, 1.0f);
  plain.set_pull(false);
  const grpc::Status pushed = Push(plain, &response);
  ASSERT_TRUE(pushed.ok()) << pushed.error_message();
  EXPECT_FALSE(response.doorbell());
  EXPECT_EQ(service_->doorbells_served(), 0u);
}

TEST_F(ParameterServerServiceTest, PullWaitsThenTimesOutWithDeadlineExceeded) {
  v1::PullRequest request = PullOf({own_[0]}, 1);
  request.set_timeout_ms(100);
  ExpectPullRefused(request, grpc::StatusCode::DEADLINE_EXCEEDED,
                    "is at version 0, wanted >= 1");
}

TEST_F(ParameterServerServiceTest, PullWithTimeoutZeroDoesNotWait) {
  v1::PullRequest request = PullOf({own_[0]}, 1);
  request.set_timeout_ms(0);  // "no wait"; it used to wait 5 minutes
  const absl::Time start = absl::Now();
  ExpectPullRefused(request, grpc::StatusCode::DEADLINE_EXCEEDED,
                    "is at version 0, wanted >= 1");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // the call allows 10
}

TEST_F(ParameterServerServiceTest, TwoHundredCancelledPullsLeaveWithinASecondHoldingNoThread) {
  constexpr int kPulls = 200;
  const int threads_before = ThreadCount();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<v1::PullResponse> replies(kPulls);
  absl::Mutex mu;
  int finished = 0;
  std::vector<grpc::StatusCode> codes;
  for (int i = 0; i < kPulls; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
    v1::PullRequest request = PullOf({own_[0]}, 1);  // waits for step 0
    request.set_timeout_ms(300000);
    StartUnaryCall(
        [&](grpc::ClientUnaryReactor* r) {
          stub_->async()->Pull(contexts.back().get(), &request, &replies[i], r);
        },
        [&](grpc::Status s) {
          absl::MutexLock lock(&mu);
          codes.push_back(s.error_code());
          ++finished;
        });
  }
  ASSERT_TRUE(Eventually([&] { return store_->waiting_pulls() == static_cast<size_t>(kPulls); }, absl::Seconds(20)))
      << store_->waiting_pulls() << " pulls waiting";
  const int threads_waiting = ThreadCount();

  const absl::Time cancelled = absl::Now();
  for (auto& context : contexts) context->TryCancel();
  {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(
                            +[](int* n) { return *n == kPulls; }, &finished),
                        absl::Seconds(10));
    ASSERT_EQ(finished, kPulls);
  }
  EXPECT_TRUE(Eventually([&] { return store_->waiting_pulls() == 0; },
                         cancelled + absl::Seconds(1) - absl::Now()))
      << "cancelled pulls still wait in the store a second later";
  const absl::Duration left_after = absl::Now() - cancelled;
  const int threads_after = ThreadCount();
  std::printf("threads: %d before, %d with %d pulls waiting, %d after; the store was empty "
              "%s after the cancel\n",
              threads_before, threads_waiting, kPulls, threads_after,
              absl::FormatDuration(left_after).c_str());
  // A waiting pull is a waiter, not a thread: waiting costs none, and
  // leaving frees none (gRPC's own pollers may come and go by a few).
  EXPECT_LE(threads_waiting, threads_before + 8)
      << threads_before << " threads before, " << threads_waiting << " with 200 waiting";
  EXPECT_LE(threads_after, threads_before + 8)
      << threads_before << " threads before, " << threads_after << " after";
  for (grpc::StatusCode code : codes) EXPECT_EQ(code, grpc::StatusCode::CANCELLED);
}

TEST_F(ParameterServerServiceTest, PullOfAnotherShardsChunkIsNotFound) {
  ExpectPullRefused(PullOf({own_[0], foreign_}), grpc::StatusCode::NOT_FOUND,
                    "is held by shard 1");
}

// ... and one of the map the job rolled back from is refused as from an
// older generation, as the store would (the worker follows the roll-back),
// not as a chunk unknown here (which would end the worker).
TEST_F(ParameterServerServiceTest, PushOfAnOlderGenerationToAChunkNotHeldIsAborted) {
  ASSERT_TRUE(store_->Restore(2, 0, {}, {}).ok());
  v1::PushRequest request = GoodPush(0, 0);
  request.set_generation(1);
  v1::ChunkData* c = request.mutable_chunks(1);
  c->set_chunk_id(foreign_);
  c->set_data(F32Bytes(std::vector<float>(Elements(foreign_), 1.0f)));
  ExpectPushRefused(request, grpc::StatusCode::ABORTED, "generation 1");
}

TEST_F(ParameterServerServiceTest, PullOfANewerGenerationOfAChunkNotHeldIsUnavailable) {
  v1::PullRequest request = PullOf({own_[0], foreign_});
  request.set_generation(1);
  ExpectPullRefused(request, grpc::StatusCode::UNAVAILABLE, "not yet 1; retry");
}

TEST_F(ParameterServerServiceTest, PullForAnotherJobIsFailedPrecondition) {
  v1::PullRequest request = PullOf({});
  request.set_job_id("");
  ExpectPullRefused(request, grpc::StatusCode::FAILED_PRECONDITION,
                    "this shard serves job 'test-job'");
}

TEST_F(ParameterServerServiceTest, PullInAnUnknownDTypeIsInvalidArgument) {
  v1::PullRequest request = PullOf({});
  request.set_dtype(static_cast<v1::DType>(42));
  ExpectPullRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "unknown dtype 42");
}

TEST_F(ParameterServerServiceTest, PullFromAnUnknownWorkerIsInvalidArgument) {
  v1::PullRequest request = PullOf({});
  request.set_worker_rank(5);
  ExpectPullRefused(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "unknown worker rank 5");
}

TEST_F(ParameterServerServiceTest, GetShardStatusReportsTheStore) {
  ASSERT_TRUE(Push(GoodPush(0, 0)).ok());
  v1::GetShardStatusRequest request;
  request.set_job_id("test-job");
  v1::ShardStatus status;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->GetShardStatus(&context, request, &status).ok());
  EXPECT_EQ(status.shard(), 0u);
  EXPECT_EQ(status.incarnation(), 1u);
  EXPECT_EQ(status.num_chunks(), 2u);
  EXPECT_EQ(status.num_elements(), 12u);
  EXPECT_EQ(status.pushes(), 2u);
  EXPECT_EQ(status.bytes_in(), 48u);
}

TEST(ParameterServerServiceWithoutStore, AnswersUnavailableUntilAttached) {
  ParameterServerService service;
  absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::ParameterServer::NewStub(
      MakeChannel(absl::StrCat("127.0.0.1:", server->port)));
  v1::PullResponse response;
  grpc::ClientContext context;
  const grpc::Status status = stub->Pull(&context, v1::PullRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("not ready"));
  server->server->Shutdown();
}

}  // namespace
}  // namespace grps
