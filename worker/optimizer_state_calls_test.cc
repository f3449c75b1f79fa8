// OptimizerStateCalls: a program's optimizer state read from and loaded
// into every chunk on the shards, laid over the flat array.
#include "worker/optimizer_state_calls.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/daemon.h"
#include "gtest/gtest.h"

namespace grps {
namespace {

// Two tensors, [4] and [2], in chunks of 2 floats dealt over 2 shards.
v1::ShardMap SmallModel() {
  v1::ShardMap map;
  const int64_t sizes[] = {4, 2};
  uint32_t id = 0;
  for (uint32_t t = 0; t < 2; ++t) {
    v1::TensorSpec* tensor = map.add_tensors();
    tensor->set_name(absl::StrCat("t", t));
    tensor->add_shape(sizes[t]);
    for (int64_t at = 0; at < sizes[t]; at += 2, ++id) {
      v1::ChunkSpec* c = map.add_chunks();
      c->set_chunk_id(id);
      c->set_tensor_index(t);
      c->set_offset(at);
      c->set_num_elements(2);
      c->set_shard(id % 2);
    }
  }
  map.add_shards()->set_shard(0);
  map.add_shards()->set_shard(1);
  return map;
}

// A shard that keeps each chunk's optimizer state as it was loaded, and
// answers reads with it (or with `wrong_slots` slots, when set).
class StateShard : public v1::ParameterServer::Service {
 public:
  grpc::Status GetOptimizerState(grpc::ServerContext*, const v1::GetOptimizerStateRequest* req,
                                 v1::GetOptimizerStateResponse* resp) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    resp->set_kind(v1::OPTIMIZER_ADAM);
    for (uint32_t id : req->chunk_ids()) {
      v1::ChunkOptimizerState* c = resp->add_chunks();
      *c = chunks_[id];
      c->set_chunk_id(id);
      if (wrong_slots_) c->add_slots("");
    }
    return grpc::Status::OK;
  }
  grpc::Status LoadOptimizerState(grpc::ServerContext*, const v1::LoadOptimizerStateRequest* req,
                                  v1::LoadOptimizerStateResponse*) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    for (const v1::ChunkOptimizerState& c : req->chunks()) chunks_[c.chunk_id()] = c;
    return grpc::Status::OK;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  void set_wrong_slots() {
    absl::MutexLock lock(&mu_);
    wrong_slots_ = true;
  }

 private:
  absl::Mutex mu_;
  std::map<uint32_t, v1::ChunkOptimizerState> chunks_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool wrong_slots_ ABSL_GUARDED_BY(mu_) = false;
};

class OptimizerStateCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.set_job_id("state-test");
    config_.mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
    for (StateShard& shard : shards_) {
      absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {&shard});
      ASSERT_TRUE(server.ok()) << server.status();
      addresses_.push_back(absl::StrCat("127.0.0.1:", server->port));
      servers_.push_back(std::move(*server));
    }
  }
  void TearDown() override {
    for (GrpcServer& s : servers_) s.server->Shutdown(std::chrono::system_clock::now());
  }

  OptimizerStateCalls Calls() {
    return OptimizerStateCalls(config_, layout_, 0, 1, &generation_, [this](size_t shard) {
      return v1::ParameterServer::NewStub(MakeChannel(addresses_[shard]));
    });
  }

  // Adam's two slots over the flat array, and a step count per tensor.
  ProgramOptimizerState State() const {
    ProgramOptimizerState state;
    state.kind = v1::OPTIMIZER_ADAM;
    state.slots = {{1, 2, 3, 4, 5, 6}, {-1, -2, -3, -4, -5, -6}};
    state.steps = {7, 9};
    return state;
  }

  v1::JobConfig config_;
  const ChunkLayout layout_{SmallModel()};
  std::atomic<uint64_t> generation_{0};
  StateShard shards_[2];
  std::vector<GrpcServer> servers_;
  std::vector<std::string> addresses_;
};

TEST_F(OptimizerStateCallsTest, ReadsBackWhatWasLoadedOverTheFlatArray) {
  ASSERT_TRUE(Calls().Load(State(), absl::Seconds(5)).ok());
  absl::StatusOr<ProgramOptimizerState> read = Calls().Read(absl::Seconds(5));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->kind, v1::OPTIMIZER_ADAM);
  EXPECT_EQ(read->slots, State().slots);
  EXPECT_EQ(read->steps, State().steps);
  EXPECT_EQ(shards_[0].calls(), 2);  // one call each way
  EXPECT_EQ(shards_[1].calls(), 2);
}

TEST_F(OptimizerStateCallsTest, LoadRefusesAnotherOptimizersStateWithoutACall) {
  ProgramOptimizerState state = State();
  state.kind = v1::OPTIMIZER_MOMENTUM;
  EXPECT_TRUE(absl::IsInvalidArgument(Calls().Load(state, absl::Seconds(5))));
  state = State();
  state.slots[1].pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(Calls().Load(state, absl::Seconds(5))));
  EXPECT_EQ(shards_[0].calls() + shards_[1].calls(), 0);
}

TEST_F(OptimizerStateCallsTest, AShardAnsweringOtherSlotsThanTheOptimizersIsInternal) {
  ASSERT_TRUE(Calls().Load(State(), absl::Seconds(5)).ok());
  shards_[1].set_wrong_slots();
  EXPECT_TRUE(absl::IsInternal(Calls().Read(absl::Seconds(5)).status()));
}

}  // namespace
}  // namespace grps
