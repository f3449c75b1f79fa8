// Trainer in one process, with no daemon started: its parameters come from
// an in-memory ParameterShards that records every pull and push and serves
// weights and versions, its coordinator is a fake Coordinator service over
// real gRPC on 127.0.0.1 whose answers the test sets, and its clock is a
// FakeClock the test moves. The data is a small CSV whose training rows are
// all alike, so that every batch is the same and a step's gradient is
// known from the weights it was computed on.
#include "worker/trainer.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "coordinator/testing/fake_clock.h"
#include "daemon/daemon.h"
#include "data/criteo.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "tensor/backend.h"
#include "worker/mlp_model.h"

namespace grps {
namespace {

constexpr uint64_t kIncarnation = 7;
constexpr float kLearningRate = 0.1f;
// How long a test waits, in real time, for what must happen soon.
constexpr absl::Duration kPatience = absl::Seconds(20);

// What the fakes below saw, in order, across them: "dense push 3", ...
class EventLog {
 public:
  void Add(std::string event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

// The job's dense parameters in memory: one shard that applies each push
// at once (plain SGD), counts a version per push applied, and answers a
// fused pull at once. Pulls and pushes are recorded, with the weights each
// clock was served.
class InMemoryShards : public ParameterShards {
 public:
  struct Push {
    uint64_t step = 0;
    uint64_t generation = 0;
    uint32_t samples = 0;
    std::vector<float> grads;
  };

  InMemoryShards(int64_t num_parameters, uint64_t version)
      : num_parameters_(num_parameters), version_(version) {
    weights_.resize(num_parameters);
    for (int64_t i = 0; i < num_parameters; ++i)
      weights_[i] = 0.05f * static_cast<float>(i % 7 - 3);
  }
  ~InMemoryShards() override {
    if (on_close_) on_close_(*this);
  }

  // Called by the destructor (a trainer dropping these shards' client).
  void set_on_close(std::function<void(const InMemoryShards&)> on_close) {
    on_close_ = std::move(on_close);
  }

  // The next `times` pushes of `step` fail with `error` (not applied).
  void FailPushes(uint64_t step, int times, absl::Status error) {
    absl::MutexLock lock(&mu_);
    fail_step_ = step;
    fail_times_ = times;
    fail_error_ = std::move(error);
  }
  // Pushes from `step` on of a generation below `generation` are refused
  // ABORTED, as shards that rolled back refuse them.
  void RefuseOldGenerationFrom(uint64_t step, uint64_t generation) {
    absl::MutexLock lock(&mu_);
    refuse_from_step_ = step;
    min_generation_ = generation;
  }
  // After the push of `step`, the others complete `versions` more steps
  // without this rank (it was not counted yet) before its weights come back.
  void OthersGoOnAfter(uint64_t step, uint64_t versions) {
    absl::MutexLock lock(&mu_);
    others_after_step_ = step;
    others_versions_ = versions;
  }
  void set_log(EventLog* log) {
    absl::MutexLock lock(&mu_);
    log_ = log;
  }
  void set_fuse_pulls(bool fuse) {
    absl::MutexLock lock(&mu_);
    fuse_pulls_ = fuse;
  }

  std::vector<Push> applied() const {
    absl::MutexLock lock(&mu_);
    return applied_;
  }
  std::vector<uint64_t> pulls() const {
    absl::MutexLock lock(&mu_);
    return pulls_;
  }
  int attempts(uint64_t step) const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count(attempts_.begin(), attempts_.end(), step));
  }
  int refused() const {
    absl::MutexLock lock(&mu_);
    return refused_;
  }
  // The weights the shard served for `clock` last (empty: none).
  std::vector<float> served(uint64_t clock) const {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(served_.rbegin(), served_.rend(),
                           [clock](const auto& s) { return s.first == clock; });
    return it == served_.rend() ? std::vector<float>() : it->second;
  }
  // Waits (real time, bounded) until a push was refused.
  bool AwaitRefused() const {
    absl::MutexLock lock(&mu_);
    auto any = [this] {
      mu_.AssertReaderHeld();
      return refused_ > 0;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&any), kPatience);
  }

  // ---- ParameterShards ----
  int64_t num_parameters() const override { return num_parameters_; }
  void set_generation(uint64_t generation) override {
    absl::MutexLock lock(&mu_);
    generation_ = generation;
  }
  absl::Status UpdateShardMap(const v1::ShardMap& map) override {
    absl::MutexLock lock(&mu_);
    epoch_ = map.epoch();
    return absl::OkStatus();
  }
  uint64_t map_epoch() const override {
    absl::MutexLock lock(&mu_);
    return epoch_;
  }
  absl::Status Pull(uint64_t clock, absl::Duration, float* host_params) override {
    absl::MutexLock lock(&mu_);
    pulls_.push_back(clock);
    Serve(clock, host_params);
    return absl::OkStatus();
  }
  absl::StatusOr<PushOutcome> PushAndPull(uint64_t step, const float* host_grads,
                                          uint32_t num_samples, float* pull_into,
                                          absl::Duration, const RetryPolicy&) override {
    absl::MutexLock lock(&mu_);
    attempts_.push_back(step);
    if (step >= refuse_from_step_ && generation_ < min_generation_) {
      ++refused_;
      return absl::AbortedError(absl::StrCat("generation ", generation_, " is over"));
    }
    if (fail_times_ > 0 && step == fail_step_) {
      --fail_times_;
      return fail_error_;
    }
    if (log_ != nullptr) log_->Add(absl::StrCat("dense push ", step));
    applied_.push_back({step, generation_, num_samples,
                        std::vector<float>(host_grads, host_grads + weights_.size())});
    for (size_t i = 0; i < weights_.size(); ++i) weights_[i] -= kLearningRate * host_grads[i];
    // A sync shard in lock-step with this rank: its step completes (in the
    // push's generation: a roll-back restored the version too).
    version_ = step + 1;
    if (step == others_after_step_) version_ += std::exchange(others_versions_, 0);
    PushOutcome outcome;
    if (fuse_pulls_ && pull_into != nullptr) {
      Serve(step + 1, pull_into);
      outcome.pulled = true;
    }
    return outcome;
  }
  uint64_t max_pulled_version() const override {
    absl::MutexLock lock(&mu_);
    return pulled_version_;
  }
  Traffic traffic() const override { return Traffic(); }

 private:
  void Serve(uint64_t clock, float* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::copy(weights_.begin(), weights_.end(), out);
    served_.emplace_back(clock, weights_);
    pulled_version_ = version_;
  }

  const int64_t num_parameters_;
  std::function<void(const InMemoryShards&)> on_close_;
  mutable absl::Mutex mu_;
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_);
  uint64_t pulled_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t min_generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refuse_from_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool fuse_pulls_ ABSL_GUARDED_BY(mu_) = true;
  EventLog* log_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t others_after_step_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t others_versions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t fail_step_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_times_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_error_ ABSL_GUARDED_BY(mu_);
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Push> applied_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> attempts_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> pulls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, std::vector<float>>> served_ ABSL_GUARDED_BY(mu_);
};

// The embedding table in memory: a row's values are made from its id, and
// every pull and push is logged with its ids.
class InMemorySparseTable : public SparseShards {
 public:
  struct RowPush {
    std::string table;
    uint64_t step = 0;
    uint64_t generation = 0;
    std::vector<int64_t> ids;
  };
  InMemorySparseTable(int64_t dim, EventLog* log) : dim_(dim), log_(log) {}

  std::vector<RowPush> pushes() const {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  uint64_t generation() const {
    absl::MutexLock lock(&mu_);
    return generation_;
  }
  // The ids pulled for each clock, in order.
  std::vector<std::pair<uint64_t, std::vector<int64_t>>> pulls() const {
    absl::MutexLock lock(&mu_);
    return pulls_;
  }

  // The table of each of pulls(), in order.
  std::vector<std::string> pulled_tables() const {
    absl::MutexLock lock(&mu_);
    return pulled_tables_;
  }

  void UpdateShardMap(const v1::ShardMap&) override {}
  void set_generation(uint64_t generation) override {
    absl::MutexLock lock(&mu_);
    generation_ = generation;
  }
  // The next pull of `table` fails (DEADLINE_EXCEEDED: a shard's wait ran
  // out), reading nothing.
  void FailNextPullOf(const std::string& table) {
    absl::MutexLock lock(&mu_);
    fail_next_ = table;
  }

  // One part a pull: an attempt whose progress says it was read reads
  // nothing (and is not logged).
  using SparseShards::Pull;
  absl::Status Pull(const std::string& table, absl::Span<const int64_t> ids, uint64_t clock,
                    absl::Duration, float* out, PullProgress* progress) override {
    absl::MutexLock lock(&mu_);
    if (progress != nullptr && progress->read == std::vector<bool>{true}) return absl::OkStatus();
    log_->Add(absl::StrCat("sparse pull ", clock));
    pulls_.emplace_back(clock, std::vector<int64_t>(ids.begin(), ids.end()));
    pulled_tables_.push_back(table);
    if (fail_next_ == table) {
      fail_next_.clear();
      return absl::DeadlineExceededError("a shard's wait ran out");
    }
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t j = 0; j < dim_; ++j)
        out[i * dim_ + j] = 0.01f * static_cast<float>((ids[i] + j) % 11 - 5);
    if (progress != nullptr) *progress = PullProgress{{true}, {0}};
    return absl::OkStatus();
  }
  absl::StatusOr<PushOutcome> Push(const std::string& table, uint64_t step,
                                   absl::Span<const int64_t> ids, const float*,
                                   const ParameterShards::RetryPolicy&) override {
    absl::MutexLock lock(&mu_);
    log_->Add(absl::StrCat("sparse push ", step));
    pushes_.push_back({table, step, generation_, std::vector<int64_t>(ids.begin(), ids.end())});
    return PushOutcome();
  }
  uint64_t bytes_pushed() const override { return 0; }
  uint64_t bytes_pulled() const override { return 0; }

 private:
  const int64_t dim_;
  EventLog* const log_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<RowPush> pushes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, std::vector<int64_t>>> pulls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> pulled_tables_ ABSL_GUARDED_BY(mu_);
  std::string fail_next_ ABSL_GUARDED_BY(mu_);
};

// A coordinator that answers as the test says: heartbeats with the job's
// state (and the evaluator, a final evaluation, a restore order), WorkerDone
// by completing the job (after the final evaluation, when it asks for one);
// or, while not answering, UNAVAILABLE to everything, as a coordinator that
// is gone.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  void set_answering(bool answering) {
    absl::MutexLock lock(&mu_);
    answering_ = answering;
  }
  // WorkerDone is acknowledged, but the job goes on (other ranks train).
  void KeepTheJobRunning() {
    absl::MutexLock lock(&mu_);
    keep_running_ = true;
  }
  // Waits (real time, bounded) until a heartbeat was refused: every
  // heartbeat answered before it has been handled by the worker (a member
  // agent beats one at a time).
  bool AwaitRefusedHeartbeat() const {
    absl::MutexLock lock(&mu_);
    auto refused = [this] {
      mu_.AssertReaderHeld();
      return refused_heartbeats_ > 0;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&refused), kPatience);
  }
  // The worker of rank 0 is the evaluator; after training, it evaluates the
  // final weights before the job completes.
  void AskForFinalEvaluation() {
    absl::MutexLock lock(&mu_);
    final_evaluation_ = true;
  }
  // As AskForFinalEvaluation; the first evaluation is not final: a rank
  // came back and training was done again, and the coordinator asks again
  // two heartbeats after it stopped asking.
  void AskForFinalEvaluationTwice() {
    absl::MutexLock lock(&mu_);
    final_evaluation_ = true;
    evaluations_wanted_ = 2;
  }
  // The job failed for `reason`, as heartbeats and the job status say.
  void FailTheJob(std::string reason) {
    absl::MutexLock lock(&mu_);
    state_ = v1::JOB_STATE_FAILED;
    reason_ = std::move(reason);
  }
  // The job is stopped, and the coordinator answers again to say so.
  void StopTheJob() {
    absl::MutexLock lock(&mu_);
    answering_ = true;
    state_ = v1::JOB_STATE_STOPPED;
  }
  void OrderRestore(v1::RestoreOrder order) {
    absl::MutexLock lock(&mu_);
    restore_ = std::move(order);
  }
  // Heartbeat replies carry `map` to a worker that says an older epoch.
  void PublishShardMap(v1::ShardMap map) {
    absl::MutexLock lock(&mu_);
    map_ = std::move(map);
  }
  // A re-sharding: the new map and the roll-back to the cut, in one reply.
  void ReShard(v1::ShardMap map, v1::RestoreOrder order) {
    absl::MutexLock lock(&mu_);
    map_ = std::move(map);
    restore_ = std::move(order);
  }
  // The shard map epoch the last heartbeat said the worker follows.
  uint64_t reported_map_epoch() const {
    absl::MutexLock lock(&mu_);
    return reported_map_epoch_;
  }
  int heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  // Waits (real time, bounded) until `n` heartbeats were answered: every
  // reply before the last has been handled by the worker.
  bool AwaitHeartbeats(int n) const { return AwaitCount(&heartbeats_, n); }
  std::vector<v1::WorkerDoneRequest> done_reports() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  int done_calls() const {
    absl::MutexLock lock(&mu_);
    return done_calls_;
  }
  // Waits (real time, bounded) until WorkerDone was called `n` times.
  bool AwaitDoneCalls(int n) const { return AwaitCount(&done_calls_, n); }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (!answering_) {
      ++refused_heartbeats_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone");
    }
    ++heartbeats_;
    reported_map_epoch_ = request->shard_map_epoch();
    response->set_job_state(state_);
    if (map_.epoch() > request->shard_map_epoch()) *response->mutable_shard_map() = map_;
    if (final_evaluation_) response->set_evaluator_rank(0);
    if (ask_again_at_ > 0 && heartbeats_ >= ask_again_at_) {
      evaluate_final_ = true;
      ask_again_at_ = 0;
    }
    response->set_evaluate_final(evaluate_final_);
    if (restore_.generation() > request->generation()) *response->mutable_restore() = restore_;
    return grpc::Status::OK;
  }
  grpc::Status WorkerDone(grpc::ServerContext*, const v1::WorkerDoneRequest* request,
                          v1::WorkerDoneResponse*) override {
    absl::MutexLock lock(&mu_);
    ++done_calls_;
    if (!answering_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone");
    done_.push_back(*request);
    if (final_evaluation_ && !request->has_final_eval()) {
      evaluate_final_ = true;
    } else if (request->has_final_eval() && --evaluations_wanted_ > 0) {
      evaluate_final_ = false;
      ask_again_at_ = heartbeats_ + 2;
    } else if (!keep_running_ && state_ == v1::JOB_STATE_RUNNING)
      state_ = v1::JOB_STATE_COMPLETED;
    return grpc::Status::OK;
  }
  grpc::Status GetJobStatus(grpc::ServerContext*, const v1::GetJobStatusRequest*,
                            v1::JobStatus* response) override {
    absl::MutexLock lock(&mu_);
    response->set_state(state_);
    response->set_message(reason_);
    return grpc::Status::OK;
  }

 private:
  // Waits (real time, bounded) until *counter (guarded by mu_) is `n`.
  bool AwaitCount(const int* counter, int n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, counter, n] {
      mu_.AssertReaderHeld();
      return *counter >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kPatience);
  }
  mutable absl::Mutex mu_;
  bool answering_ ABSL_GUARDED_BY(mu_) = true;
  bool keep_running_ ABSL_GUARDED_BY(mu_) = false;
  int refused_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  bool final_evaluation_ ABSL_GUARDED_BY(mu_) = false;
  bool evaluate_final_ ABSL_GUARDED_BY(mu_) = false;
  int evaluations_wanted_ ABSL_GUARDED_BY(mu_) = 1;
  int ask_again_at_ ABSL_GUARDED_BY(mu_) = 0;  // heartbeats; 0: not
  v1::JobState state_ ABSL_GUARDED_BY(mu_) = v1::JOB_STATE_RUNNING;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  v1::RestoreOrder restore_ ABSL_GUARDED_BY(mu_);
  v1::ShardMap map_ ABSL_GUARDED_BY(mu_);  // epoch 0: none published
  uint64_t reported_map_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int done_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::WorkerDoneRequest> done_ ABSL_GUARDED_BY(mu_);
};

// The one example every training row repeats: each batch is this example
// batch_size times.
const std::vector<float> kFeatures = {0.5f, -1.0f, 2.0f};
constexpr int32_t kLabel = 1;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Files of this test's own: ctest may run the others at the same time.
    const std::string prefix =
        absl::StrCat(::testing::TempDir(), "/trainer_test_",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string train = absl::StrCat(prefix, "_train.csv");
    const std::string test = absl::StrCat(prefix, "_test.csv");
    {
      std::ofstream out(train);
      for (int i = 0; i < 32; ++i)
        out << kLabel << "," << kFeatures[0] << "," << kFeatures[1] << "," << kFeatures[2]
            << "\n";
      std::ofstream t(test);
      t << "1,0.5,-1,2\n0,-0.5,1,-2\n";
    }
    config_ = DefaultJobConfig();
    config_.set_job_id("trainer-job");
    config_.set_model(v1::MODEL_MLP);
    config_.clear_hidden_units();
    config_.add_hidden_units(4);
    config_.set_input_features(3);
    config_.set_num_classes(2);
    config_.mutable_dataset()->set_format("csv");
    config_.mutable_dataset()->set_path(train);
    config_.mutable_dataset()->set_test_path(test);
    config_.set_batch_size(4);
    config_.set_steps(6);
    config_.set_num_workers(1);
    config_.set_num_servers(1);
    config_.set_eval_every_steps(0);
    config_.set_heartbeat_interval_ms(10);
    config_.set_heartbeat_timeout_ms(1000);
    config_.set_coordinator_timeout_ms(5000);
    ASSERT_TRUE(ValidateJobConfig(config_).ok()) << ValidateJobConfig(config_);

    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {&coordinator_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Coordinator::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", server_.port)));
  }
  void TearDown() override {
    if (runner_.joinable()) Finish().IgnoreError();
    trainer_.reset();
    if (server_.server != nullptr) server_.server->Shutdown();
  }

  // The registration of rank 0, incarnation kIncarnation, generation 1.
  v1::RegisterWorkerResponse Registration(uint64_t start_step) const {
    v1::RegisterWorkerResponse reg;
    *reg.mutable_config() = config_;
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), 1, config_.chunk_bytes());
    EXPECT_TRUE(map.ok());
    for (v1::ShardEndpoint& e : *map->mutable_shards()) e.set_address("127.0.0.1:1");
    map->set_epoch(1);
    *reg.mutable_shard_map() = *map;
    reg.set_rank(0);
    reg.set_incarnation(kIncarnation);
    reg.set_start_step(start_step);
    reg.set_generation(1);
    return reg;
  }

  // The dense parameters: the MLP's, or the embedding model's head's (an
  // MLP of the same widths).
  int64_t NumParameters() const {
    return MlpModel(backend_.get(), LayerWidths(config_), 1).num_parameters();
  }

  // In-memory clients of the job's model, logging to log_; the dense one
  // notes in closed_ what it applied when the trainer drops it.
  TrainerShards InMemoryClients(uint64_t version) {
    TrainerShards clients;
    auto dense = std::make_unique<InMemoryShards>(NumParameters(), version);
    dense->set_log(&log_);
    dense->set_on_close([this](const InMemoryShards& closed) {
      log_.Add("dense shards closed");
      absl::MutexLock lock(&mu_);
      closed_.push_back(closed.applied());
    });
    clients.dense = std::move(dense);
    if (config_.model() == v1::MODEL_EMBEDDING) {
      const int64_t dim = config_.embedding_dim();
      clients.sparse = std::make_unique<InMemorySparseTable>(dim, &log_);
      clients.eval_sparse = std::make_unique<InMemorySparseTable>(dim, &log_);
    }
    return clients;
  }

  // The trainers made next follow a re-sharding: their clients of a new
  // map are InMemoryClients, kept in connected_ with the map.
  void FollowReSharding() {
    connect_ = [this](const v1::ShardMap& map) -> absl::StatusOr<TrainerShards> {
      TrainerShards clients = InMemoryClients(0);
      absl::MutexLock lock(&mu_);
      connected_.push_back({map, static_cast<InMemoryShards*>(clients.dense.get()),
                            static_cast<InMemorySparseTable*>(clients.sparse.get()),
                            static_cast<InMemorySparseTable*>(clients.eval_sparse.get())});
      return clients;
    };
  }

  // A trainer of `steps` steps (following a re-sharding when `follow`),
  // started on shards that move to generation 2 after this rank's step 3 (a
  // roll-back or a re-sharding, cut at step 2): returns once the old shard
  // refused its push of step 4.
  void StartUntilTheOldShardRefuses(uint64_t steps, bool follow = true) {
    config_.set_steps(steps);
    if (follow) FollowReSharding();
    Trainer* trainer = MakeTrainer();
    shards_->RefuseOldGenerationFrom(4, 2);
    Start(trainer);
    ASSERT_TRUE(shards_->AwaitRefused());
  }

  // A trainer registered at `start_step` on shards at `version`, whose
  // InMemoryShards stays reachable through shards_.
  Trainer* MakeTrainer(uint64_t start_step = 0, uint64_t version = 0,
                       const std::string& examples_log = "") {
    TrainerOptions options;
    options.examples_log = examples_log;
    options.clock = [this] { return clock_.Now(); };
    options.connect_shards = connect_;
    TrainerShards clients = InMemoryClients(version);
    shards_ = static_cast<InMemoryShards*>(clients.dense.get());
    table_ = static_cast<InMemorySparseTable*>(clients.sparse.get());
    trainer_ = std::make_unique<Trainer>(stub_.get(), Registration(start_step),
                                         backend_.get(), std::move(clients), options);
    return trainer_.get();
  }

  // The registration's map with the same chunks on `shards` shards, at
  // `epoch`: a re-sharding.
  v1::ShardMap ReShardedMap(uint32_t shards, uint64_t epoch) const {
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), shards, config_.chunk_bytes());
    EXPECT_TRUE(map.ok());
    for (v1::ShardEndpoint& e : *map->mutable_shards())
      e.set_address(absl::StrCat("127.0.0.1:", 2 + e.shard()));
    map->set_epoch(epoch);
    return *map;
  }

  // The roll-back of a re-sharding to generation 2, at step 2 (rank 0's).
  static v1::RestoreOrder RollBackToStep2() {
    v1::RestoreOrder order;
    order.set_generation(2);
    order.set_checkpoint_id(1);
    order.set_step(2);
    order.add_worker_steps(2);
    return order;
  }

  // The embedding model over a small synthetic data set.
  void UseEmbeddingModel() {
    config_.set_model(v1::MODEL_EMBEDDING);
    config_.set_embedding_dim(4);
    config_.set_embedding_rows(0);
    v1::SparseTableSpec* table = config_.add_sparse_tables();
    table->set_name(kEmbeddingTable);
    table->set_dim(4);
    config_.mutable_dataset()->set_format("synthetic");
    config_.mutable_dataset()->set_path("");
    config_.mutable_dataset()->set_test_path("");
    v1::SyntheticDataConfig* synthetic = config_.mutable_dataset()->mutable_synthetic();
    synthetic->set_num_train(64);
    synthetic->set_num_test(8);
    synthetic->set_vocabulary(40);
    synthetic->set_features_per_example(3);
    ASSERT_TRUE(ValidateJobConfig(config_).ok()) << ValidateJobConfig(config_);
  }

  // The embedding model on eight Criteo examples (C1 is "a" or "b", C2 one
  // value each, C3 missing; I1 a count or missing, the other integers 0):
  // a table per field, named in `tables`.
  void UseCriteoTables(std::vector<std::string>* tables) {
    UseEmbeddingModel();
    std::string text;
    for (int i = 0; i < 8; ++i) {
      absl::StrAppend(&text, i % 2, "\t", i % 3 == 0 ? "" : "5", std::string(12, '\t'), "\t",
                      i % 2 == 0 ? "a" : "b", "\t", absl::Hex(100 + i), std::string(24, '\t'),
                      "\n");
    }
    const std::string path = absl::StrCat(::testing::TempDir(), "/trainer_test_criteo.tsv");
    std::ofstream(path) << text;
    config_.mutable_dataset()->set_format("criteo");
    config_.mutable_dataset()->set_path(path);
    config_.mutable_dataset()->set_test_path(path);
    config_.set_num_classes(2);
    config_.clear_sparse_tables();
    *tables = EmbeddingTables(config_);
    ASSERT_EQ(tables->size(), 27u);
    for (const std::string& name : *tables) {
      v1::SparseTableSpec* t = config_.add_sparse_tables();
      t->set_name(name);
      t->set_dim(4);
    }
    ASSERT_TRUE(ValidateJobConfig(config_).ok()) << ValidateJobConfig(config_);
  }

  // What the clients made for re-shardings were made of and for.
  struct Connected {
    v1::ShardMap map;
    InMemoryShards* dense;
    InMemorySparseTable* sparse;
    InMemorySparseTable* eval_sparse;
  };
  std::vector<Connected> connected() const {
    absl::MutexLock lock(&mu_);
    return connected_;
  }
  std::vector<std::vector<InMemoryShards::Push>> closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  // Runs `trainer` on a thread of its own; done_ is notified when it returns.
  void Start(Trainer* trainer) {
    runner_ = std::thread([this, trainer] {
      result_ = trainer->Run();
      done_.Notify();
    });
  }
  // Waits for Run's result. A Run that does not return in time is a
  // failure; the job is then stopped, which ends every wait of the trainer.
  absl::Status Finish() {
    if (!done_.WaitForNotificationWithTimeout(kPatience)) {
      ADD_FAILURE() << "Run did not return within " << kPatience << "; stopping the job";
      coordinator_.StopTheJob();
    }
    runner_.join();
    return result_;
  }
  absl::Status RunToEnd(Trainer* trainer) {
    Start(trainer);
    return Finish();
  }

  // The gradient of one batch of the repeated example at `weights`.
  std::vector<float> ExpectedGradient(const std::vector<float>& weights) const {
    const int batch = static_cast<int>(config_.batch_size());
    MlpModel model(backend_.get(), LayerWidths(config_), batch);
    std::vector<float> x, grads(model.num_parameters());
    for (int i = 0; i < batch; ++i) x.insert(x.end(), kFeatures.begin(), kFeatures.end());
    const std::vector<int32_t> y(batch, kLabel);
    model.SetParameters(weights.data());
    model.ForwardBackward(x.data(), y.data(), batch, nullptr);
    model.GetGradients(grads.data());
    return grads;
  }

  static std::vector<uint64_t> StepsOf(const std::vector<InMemoryShards::Push>& pushes) {
    std::vector<uint64_t> steps;
    for (const InMemoryShards::Push& p : pushes) steps.push_back(p.step);
    return steps;
  }

  std::unique_ptr<Backend> backend_ = CreateCpuBackend();
  FakeClock clock_;
  v1::JobConfig config_;
  FakeCoordinator coordinator_;
  GrpcServer server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  EventLog log_;
  std::unique_ptr<Trainer> trainer_;
  InMemoryShards* shards_ = nullptr;
  InMemorySparseTable* table_ = nullptr;  // the embedding model's, for training
  ConnectShards connect_;  // MakeTrainer's TrainerOptions::connect_shards
  mutable absl::Mutex mu_;
  std::vector<Connected> connected_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<InMemoryShards::Push>> closed_ ABSL_GUARDED_BY(mu_);
  std::thread runner_;
  absl::Notification done_;
  absl::Status result_;
};

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5) << what << ", element " << i;
}

TEST_F(TrainerTest, EachStepPushesTheGradientOfTheWeightsItWasServed) {
  Trainer* trainer = MakeTrainer();
  ASSERT_TRUE(RunToEnd(trainer).ok());

  // Step 0 pulls; every later step trains on the weights the push before
  // brought back (fused), which the shard moved by each gradient.
  EXPECT_EQ(shards_->pulls(), std::vector<uint64_t>({0}));
  const std::vector<InMemoryShards::Push> pushes = shards_->applied();
  ASSERT_EQ(StepsOf(pushes), std::vector<uint64_t>({0, 1, 2, 3, 4, 5}));
  for (const InMemoryShards::Push& p : pushes) {
    EXPECT_EQ(p.generation, 1u);
    EXPECT_EQ(p.samples, config_.batch_size());
    const std::vector<float> weights = shards_->served(p.step);
    ASSERT_FALSE(weights.empty()) << "step " << p.step;
    ExpectNear(p.grads, ExpectedGradient(weights), absl::StrCat("step ", p.step));
  }
  // The weights moved, so the gradients differ: the trainer did not keep
  // computing on its first pull.
  EXPECT_NE(pushes.front().grads, pushes.back().grads);
}

TEST_F(TrainerTest, WithoutFusedWeightsEachStepPullsItsOwnClock) {
  Trainer* trainer = MakeTrainer();
  shards_->set_fuse_pulls(false);
  ASSERT_TRUE(RunToEnd(trainer).ok());
  EXPECT_EQ(shards_->pulls(), std::vector<uint64_t>({0, 1, 2, 3, 4, 5}));
  for (const InMemoryShards::Push& p : shards_->applied())
    ExpectNear(p.grads, ExpectedGradient(shards_->served(p.step)),
               absl::StrCat("step ", p.step));
}

TEST_F(TrainerTest, AfterTheLastStepReportsWorkerDoneAndEndsWithTheJob) {
  config_.set_steps(3);
  Trainer* trainer = MakeTrainer();
  ASSERT_TRUE(RunToEnd(trainer).ok());
  const std::vector<v1::WorkerDoneRequest> done = coordinator_.done_reports();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].job_id(), "trainer-job");
  EXPECT_EQ(done[0].worker_rank(), 0u);
  EXPECT_EQ(done[0].incarnation(), kIncarnation);
  EXPECT_EQ(done[0].generation(), 1u);
  EXPECT_EQ(done[0].progress().step(), 3u);
  EXPECT_EQ(done[0].progress().total_steps(), 3u);
  EXPECT_FALSE(done[0].has_final_eval());
  EXPECT_EQ(shards_->applied().size(), 3u);
}

TEST_F(TrainerTest, ARankRestartedInSyncJoinsTheOthersAtTheirStep) {
  config_.set_mode(v1::MODE_SYNC);
  config_.set_steps(10);
  // Restarted at step 3 while the shards are at version 7: the others are
  // at step 7, and this rank trains the remaining steps with them.
  Trainer* trainer = MakeTrainer(/*start_step=*/3, /*version=*/7);
  ASSERT_TRUE(RunToEnd(trainer).ok());
  ASSERT_FALSE(shards_->pulls().empty());
  EXPECT_EQ(shards_->pulls().front(), 3u);
  EXPECT_EQ(StepsOf(shards_->applied()), std::vector<uint64_t>({7, 8, 9}));
  ASSERT_EQ(coordinator_.done_reports().size(), 1u);
  EXPECT_EQ(coordinator_.done_reports()[0].progress().step(), 10u);
}

// The Python rejoin drill's extra step: a rank the others went on without
// kept its own count, computed its last steps on versions past them, and
// made a step past the job's end where those gradients went.
TEST_F(TrainerTest, InSyncARanksClockFollowsTheWeightsTheOthersMovedOn) {
  config_.set_mode(v1::MODE_SYNC);
  config_.set_steps(10);
  Trainer* trainer = MakeTrainer();
  shards_->OthersGoOnAfter(2, 2);
  ASSERT_TRUE(RunToEnd(trainer).ok());
  EXPECT_EQ(StepsOf(shards_->applied()), std::vector<uint64_t>({0, 1, 2, 5, 6, 7, 8, 9}));
  ASSERT_EQ(coordinator_.done_reports().size(), 1u);
  EXPECT_EQ(coordinator_.done_reports()[0].progress().step(), 10u);
}

TEST_F(TrainerTest, ARankRestartedInAsyncResumesAtItsStartStep) {
  config_.set_mode(v1::MODE_ASYNC);
  config_.set_steps(10);
  Trainer* trainer = MakeTrainer(/*start_step=*/3, /*version=*/7);
  ASSERT_TRUE(RunToEnd(trainer).ok());
  EXPECT_EQ(shards_->pulls().front(), 3u);
  EXPECT_EQ(StepsOf(shards_->applied()), std::vector<uint64_t>({3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(TrainerTest, APushThatFailsTransientlyIsSentAgainAndAppliedOnce) {
  Trainer* trainer = MakeTrainer();
  shards_->FailPushes(2, 2, absl::UnavailableError("shard restarting"));
  ASSERT_TRUE(RunToEnd(trainer).ok());
  EXPECT_EQ(shards_->attempts(2), 3);
  EXPECT_EQ(StepsOf(shards_->applied()), std::vector<uint64_t>({0, 1, 2, 3, 4, 5}));
}

TEST_F(TrainerTest, APushThatAGoingShardCancelledIsSentAgainNotTheEndOfTraining) {
  // A shard that a re-sharding retired cancels the calls in flight as its
  // server exits, before this worker hears of the move: no interrupt of
  // its own, so the push goes again (the roll-back comes with a heartbeat).
  Trainer* trainer = MakeTrainer();
  shards_->FailPushes(2, 2, absl::CancelledError("server shutting down"));
  ASSERT_TRUE(RunToEnd(trainer).ok());
  EXPECT_EQ(shards_->attempts(2), 3);
  EXPECT_EQ(StepsOf(shards_->applied()), std::vector<uint64_t>({0, 1, 2, 3, 4, 5}));
}

TEST_F(TrainerTest, APushRefusedOtherwiseEndsTraining) {
  Trainer* trainer = MakeTrainer();
  shards_->FailPushes(2, 1, absl::InvalidArgumentError("bad chunk"));
  const absl::Status s = RunToEnd(trainer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(StepsOf(shards_->applied()), std::vector<uint64_t>({0, 1}));
  EXPECT_TRUE(coordinator_.done_reports().empty());
}

TEST_F(TrainerTest, AFailedJobEndsRunWithTheCoordinatorsReason) {
  coordinator_.FailTheJob("shard 0 lost its data");
  Trainer* trainer = MakeTrainer();
  const absl::Status s = RunToEnd(trainer);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(s.message(), "job failed: shard 0 lost its data");
}

TEST_F(TrainerTest, TheEvaluatorEvaluatesTheFinalWeightsAndReportsThem) {
  coordinator_.AskForFinalEvaluation();
  Trainer* trainer = MakeTrainer();
  ASSERT_TRUE(RunToEnd(trainer).ok());
  const std::vector<v1::WorkerDoneRequest> done = coordinator_.done_reports();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_FALSE(done[0].has_final_eval());
  ASSERT_TRUE(done[1].has_final_eval());
  EXPECT_GE(done[1].final_test_accuracy(), 0.0f);
  EXPECT_LE(done[1].final_test_accuracy(), 1.0f);
  EXPECT_GT(done[1].final_test_loss(), 0.0f);
  // The final weights are those of clock `total`, pulled after training.
  EXPECT_EQ(shards_->pulls().back(), 6u);
}

// A worker started again for its rank (restart 2 at step 3) adds its steps
// to the log its predecessor wrote: a new file lost them, and the epoch's
// examples looked untrained.
TEST_F(TrainerTest, TheExamplesLogOfARankStartedAgainKeepsItsPredecessorsSteps) {
  const std::string path = ::testing::TempDir() + "/trainer_test_examples.log";
  { std::ofstream(path, std::ios::trunc) << "0 0 1000 5 6\n1 0 1001 7 8\n2 0 1002 9 10\n"; }
  Trainer* trainer = MakeTrainer(/*start_step=*/3, /*version=*/3, path);
  ASSERT_TRUE(RunToEnd(trainer).ok());
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 6u);  // the predecessor's 3 steps, then steps 3, 4 and 5
  EXPECT_EQ(lines[0], "0 0 1000 5 6");
  EXPECT_TRUE(absl::StartsWith(lines[3], "3 ")) << lines[3];
  EXPECT_TRUE(absl::StartsWith(lines[5], "5 ")) << lines[5];
  std::remove(path.c_str());
}

// A drained rank came back while the evaluator evaluated, and training was
// done again: the coordinator asks again. The evaluator ignored the second
// request, and the job waited for good.
TEST_F(TrainerTest, TheEvaluatorAskedAgainAfterItsEvaluationEvaluatesAgain) {
  coordinator_.AskForFinalEvaluationTwice();
  Trainer* trainer = MakeTrainer();
  ASSERT_TRUE(RunToEnd(trainer).ok());
  const std::vector<v1::WorkerDoneRequest> done = coordinator_.done_reports();
  ASSERT_EQ(done.size(), 3u);
  EXPECT_FALSE(done[0].has_final_eval());
  EXPECT_TRUE(done[1].has_final_eval());
  EXPECT_TRUE(done[2].has_final_eval());
}

TEST_F(TrainerTest, ARollBackResumesAtTheOrdersStepInItsGeneration) {
  // The shards rolled back to generation 2 after step 3: the rank's push
  // of step 4 is refused, and it waits for the restore order to come with a
  // heartbeat.
  ASSERT_NO_FATAL_FAILURE(StartUntilTheOldShardRefuses(8, /*follow=*/false));
  v1::RestoreOrder order;
  order.set_generation(2);
  order.set_checkpoint_id(1);
  order.set_step(2);
  order.add_worker_steps(2);
  coordinator_.OrderRestore(order);
  ASSERT_TRUE(Finish().ok());

  const std::vector<InMemoryShards::Push> pushes = shards_->applied();
  ASSERT_EQ(StepsOf(pushes), std::vector<uint64_t>({0, 1, 2, 3, 2, 3, 4, 5, 6, 7}));
  for (size_t i = 0; i < pushes.size(); ++i)
    EXPECT_EQ(pushes[i].generation, i < 4 ? 1u : 2u) << "push " << i;
  ASSERT_FALSE(coordinator_.done_reports().empty());
  EXPECT_EQ(coordinator_.done_reports().back().generation(), 2u);
}

TEST_F(TrainerTest, WithTheCoordinatorGoneWorkerDoneGivesUpAtTheTimeoutNotBefore) {
  coordinator_.set_answering(false);
  Trainer* trainer = MakeTrainer();
  Start(trainer);
  // Training goes on without the coordinator; then WorkerDone is retried.
  ASSERT_TRUE(coordinator_.AwaitDoneCalls(2));
  EXPECT_EQ(shards_->applied().size(), 6u);

  // Silent for exactly coordinator_timeout_ms: still retrying. (Call c + 2
  // starts after call c + 1 was answered, so after the clock moved.)
  clock_.Advance(absl::Milliseconds(config_.coordinator_timeout_ms()));
  const int calls = coordinator_.done_calls();
  ASSERT_TRUE(coordinator_.AwaitDoneCalls(calls + 2));
  EXPECT_FALSE(done_.HasBeenNotified());

  // Past it: the next attempt gives up, and Run says why.
  clock_.Advance(absl::Milliseconds(1));
  const absl::Status s = Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("giving up"), absl::string_view::npos) << s;
  EXPECT_TRUE(coordinator_.done_reports().empty());
}

TEST_F(TrainerTest, AFinishedWorkerWaitingForTheJobsEndGivesUpOnAGoneCoordinator) {
  coordinator_.KeepTheJobRunning();
  Trainer* trainer = MakeTrainer();
  Start(trainer);
  ASSERT_TRUE(coordinator_.AwaitDoneCalls(1));
  coordinator_.set_answering(false);
  ASSERT_TRUE(coordinator_.AwaitRefusedHeartbeat());
  EXPECT_FALSE(done_.HasBeenNotified());  // the job runs: it waits for its end

  clock_.Advance(absl::Milliseconds(config_.coordinator_timeout_ms() + 1));
  const absl::Status s = Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("finished, but no word from the coordinator"),
            absl::string_view::npos)
      << s;
  ASSERT_EQ(coordinator_.done_reports().size(), 1u);
}

TEST_F(TrainerTest, AnEmbeddingStepPullsItsBatchsRowsAndPushesTheirGradientsBeforeTheHeads) {
  UseEmbeddingModel();
  config_.set_steps(3);
  Trainer* trainer = MakeTrainer();
  ASSERT_TRUE(RunToEnd(trainer).ok());

  // Each step reads its batch's rows as of its clock, then pushes their
  // gradients, then the head's (whose push brings the next weights).
  EXPECT_EQ(log_.events(),
            std::vector<std::string>({"sparse pull 0", "sparse push 0", "dense push 0",
                                      "sparse pull 1", "sparse push 1", "dense push 1",
                                      "sparse pull 2", "sparse push 2", "dense push 2"}));
  const auto pulls = table_->pulls();
  const std::vector<InMemorySparseTable::RowPush> pushes = table_->pushes();
  ASSERT_EQ(pulls.size(), 3u);
  ASSERT_EQ(pushes.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(pushes[s].table, kEmbeddingTable);
    EXPECT_EQ(pushes[s].generation, 1u);
    EXPECT_FALSE(pulls[s].second.empty());
    EXPECT_EQ(pushes[s].ids, pulls[s].second) << "step " << s;
  }
}

// Criteo data: a table per field. Each step pulls every table's rows of its
// batch, in field order, then pushes every table's gradients for the same
// ids, then the head's.
TEST_F(TrainerTest, AnEmbeddingStepOfCriteoDataPullsAndPushesEveryFieldsTable) {
  std::vector<std::string> tables;
  ASSERT_NO_FATAL_FAILURE(UseCriteoTables(&tables));
  config_.set_steps(2);
  Trainer* trainer = MakeTrainer();
  ASSERT_TRUE(RunToEnd(trainer).ok());

  std::vector<std::string> want;
  for (int step = 0; step < 2; ++step) {
    for (int k = 0; k < 27; ++k) want.push_back(absl::StrCat("sparse pull ", step));
    for (int k = 0; k < 27; ++k) want.push_back(absl::StrCat("sparse push ", step));
    want.push_back(absl::StrCat("dense push ", step));
  }
  EXPECT_EQ(log_.events(), want);
  const auto pulls = table_->pulls();
  const std::vector<std::string> pulled = table_->pulled_tables();
  const std::vector<InMemorySparseTable::RowPush> pushes = table_->pushes();
  ASSERT_EQ(pulls.size(), 54u);
  ASSERT_EQ(pushes.size(), 54u);
  for (size_t k = 0; k < 54; ++k) {
    EXPECT_EQ(pulled[k], tables[k % 27]) << k;
    EXPECT_EQ(pushes[k].table, tables[k % 27]) << k;
    EXPECT_EQ(pushes[k].step, k / 27);
    EXPECT_EQ(pushes[k].ids, pulls[k].second) << pushes[k].table;
  }
  // A batch of four reads one or both of C1's two values (0xa, 0xb), four of
  // C2's, C3's missing id, and I1 (index 0) when a count was there.
  for (size_t step = 0; step < 2; ++step) {
    for (int64_t id : pulls[step * 27].second) EXPECT_TRUE(id == 0xa || id == 0xb) << id;
    EXPECT_EQ(pulls[step * 27 + 1].second.size(), 4u);
    EXPECT_EQ(pulls[step * 27 + 2].second, std::vector<int64_t>{kCriteoMissingId});
    for (int64_t id : pulls[step * 27 + 26].second) EXPECT_EQ(id, 0);
  }
}

// A step's pull of its rows that fails on one table (a shard's wait ran
// out) is tried again for that table only: the others' rows stay as read.
TEST_F(TrainerTest, AStepsRowsTriedAgainAreReadOnlyForTheTableThatFailed) {
  std::vector<std::string> tables;
  ASSERT_NO_FATAL_FAILURE(UseCriteoTables(&tables));
  config_.set_steps(1);
  Trainer* trainer = MakeTrainer();
  table_->FailNextPullOf(tables[1]);
  ASSERT_TRUE(RunToEnd(trainer).ok());
  std::vector<std::string> want = tables;
  want.push_back(tables[1]);  // its second attempt, after the other 25
  EXPECT_EQ(table_->pulled_tables(), want);
  EXPECT_EQ(table_->pushes().size(), 27u);
}

TEST_F(TrainerTest, AReShardingsRollBackMovesTheClientsToTheNewMapsShards) {
  ASSERT_NO_FATAL_FAILURE(StartUntilTheOldShardRefuses(8));
  coordinator_.ReShard(ReShardedMap(2, 2), RollBackToStep2());
  ASSERT_TRUE(Finish().ok());

  // One set of clients, for the new map, made at the roll-back.
  const std::vector<Connected> connected = this->connected();
  ASSERT_EQ(connected.size(), 1u);
  EXPECT_EQ(connected[0].map.epoch(), 2u);
  EXPECT_EQ(connected[0].map.shards_size(), 2);
  // The old client trained steps 0-3 in generation 1 and was closed before
  // the new one trained; the new one resumed at the order's step, pulling
  // it first, in generation 2.
  const std::vector<std::vector<InMemoryShards::Push>> closed = this->closed();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(StepsOf(closed[0]), std::vector<uint64_t>({0, 1, 2, 3}));
  for (const InMemoryShards::Push& p : closed[0]) EXPECT_EQ(p.generation, 1u);
  InMemoryShards* moved = connected[0].dense;
  const std::vector<InMemoryShards::Push> pushes = moved->applied();
  ASSERT_EQ(StepsOf(pushes), std::vector<uint64_t>({2, 3, 4, 5, 6, 7}));
  for (const InMemoryShards::Push& p : pushes) EXPECT_EQ(p.generation, 2u);
  ASSERT_FALSE(moved->pulls().empty());
  EXPECT_EQ(moved->pulls().front(), 2u);
  EXPECT_EQ(log_.events(),
            std::vector<std::string>({"dense push 0", "dense push 1", "dense push 2",
                                      "dense push 3", "dense shards closed", "dense push 2",
                                      "dense push 3", "dense push 4", "dense push 5",
                                      "dense push 6", "dense push 7"}));
  // The heartbeats say the new map is followed.
  EXPECT_EQ(coordinator_.reported_map_epoch(), 2u);
  ASSERT_FALSE(coordinator_.done_reports().empty());
  EXPECT_EQ(coordinator_.done_reports().back().generation(), 2u);
}

TEST_F(TrainerTest, AReShardedMapThatComesBeforeItsOrderWaitsForTheRollBack) {
  ASSERT_NO_FATAL_FAILURE(StartUntilTheOldShardRefuses(8));
  coordinator_.PublishShardMap(ReShardedMap(2, 2));
  // Replies with the map alone: kept, the clients are not replaced.
  ASSERT_TRUE(coordinator_.AwaitHeartbeats(coordinator_.heartbeats() + 3));
  EXPECT_TRUE(connected().empty());
  EXPECT_EQ(coordinator_.reported_map_epoch(), 1u);
  EXPECT_TRUE(closed().empty());

  coordinator_.OrderRestore(RollBackToStep2());
  ASSERT_TRUE(Finish().ok());
  const std::vector<Connected> connected = this->connected();
  ASSERT_EQ(connected.size(), 1u);
  EXPECT_EQ(connected[0].map.epoch(), 2u);
  EXPECT_EQ(StepsOf(connected[0].dense->applied()),
            std::vector<uint64_t>({2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(coordinator_.reported_map_epoch(), 2u);
}

TEST_F(TrainerTest, AMapOfAnotherModelIsRefusedAndTheRollBackKeepsTheClients) {
  ASSERT_NO_FATAL_FAILURE(StartUntilTheOldShardRefuses(8));
  v1::JobConfig other = config_;
  other.add_hidden_units(8);
  absl::StatusOr<v1::ShardMap> map = BuildShardMap(ModelTensors(other), 2, other.chunk_bytes());
  ASSERT_TRUE(map.ok());
  for (v1::ShardEndpoint& e : *map->mutable_shards()) e.set_address("127.0.0.1:2");
  map->set_epoch(2);
  coordinator_.ReShard(*map, RollBackToStep2());
  ASSERT_TRUE(Finish().ok());

  EXPECT_TRUE(connected().empty());
  EXPECT_TRUE(closed().empty());
  EXPECT_EQ(StepsOf(shards_->applied()),
            std::vector<uint64_t>({0, 1, 2, 3, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(coordinator_.reported_map_epoch(), 1u);
}

TEST_F(TrainerTest, WithoutConnectShardsAReShardingIsRefusedAndTheRollBackKeepsTheClients) {
  // No TrainerOptions::connect_shards.
  ASSERT_NO_FATAL_FAILURE(StartUntilTheOldShardRefuses(8, /*follow=*/false));
  coordinator_.ReShard(ReShardedMap(2, 2), RollBackToStep2());
  ASSERT_TRUE(Finish().ok());

  EXPECT_TRUE(closed().empty());
  EXPECT_EQ(StepsOf(shards_->applied()),
            std::vector<uint64_t>({0, 1, 2, 3, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(shards_->map_epoch(), 0u);  // never handed the map
  EXPECT_EQ(coordinator_.reported_map_epoch(), 1u);
}

TEST_F(TrainerTest, AnEmbeddingTrainersSparseClientsFollowAReShardingToo) {
  UseEmbeddingModel();
  ASSERT_NO_FATAL_FAILURE(StartUntilTheOldShardRefuses(6));
  coordinator_.ReShard(ReShardedMap(3, 2), RollBackToStep2());
  ASSERT_TRUE(Finish().ok());

  const std::vector<Connected> connected = this->connected();
  ASSERT_EQ(connected.size(), 1u);
  ASSERT_NE(connected[0].sparse, nullptr);
  ASSERT_NE(connected[0].eval_sparse, nullptr);
  // The new training client took the rows' pushes from the order's step
  // on, in the new generation; the evaluator's is in that generation too.
  std::vector<uint64_t> steps;
  for (const InMemorySparseTable::RowPush& p : connected[0].sparse->pushes()) {
    steps.push_back(p.step);
    EXPECT_EQ(p.generation, 2u);
  }
  EXPECT_EQ(steps, std::vector<uint64_t>({2, 3, 4, 5}));
  EXPECT_EQ(connected[0].eval_sparse->generation(), 2u);
  EXPECT_EQ(StepsOf(connected[0].dense->applied()), std::vector<uint64_t>({2, 3, 4, 5}));
}

// The session alone: a map that moves a shard of the new layout, arriving
// after the roll-back was taken and before the clients were replaced, is
// judged against the old layout and kept; ReplaceClients follows it.
TEST_F(TrainerTest, ASessionFollowsAShardThatMovedWhileItsClientsWereReplaced) {
  const int64_t n = NumParameters();
  WorkerSession::Options options;
  options.clock = [this] { return clock_.Now(); };
  options.follow_replaced_maps = true;
  absl::Mutex seen_mu;
  std::vector<uint64_t> seen_maps;
  options.on_shard_map = [&](const v1::ShardMap& map) {
    absl::MutexLock lock(&seen_mu);
    seen_maps.push_back(map.epoch());
  };
  WorkerSession session(stub_.get(), Registration(0), std::make_unique<InMemoryShards>(n, 0),
                        nullptr, options);
  const v1::ShardMap resharded = ReShardedMap(2, 2);
  coordinator_.ReShard(resharded, RollBackToStep2());
  const absl::Time give_up = absl::Now() + kPatience;
  while (session.Interrupted() != WorkerSession::Interrupt::kRollBack && absl::Now() < give_up)
    absl::SleepFor(absl::Milliseconds(5));
  uint64_t step = 0;
  std::optional<v1::ShardMap> replaced;
  ASSERT_TRUE(session.TakeRollBack(10, &step, &replaced));
  EXPECT_EQ(step, 2u);
  ASSERT_TRUE(replaced.has_value());
  EXPECT_EQ(replaced->epoch(), 2u);

  v1::ShardMap moved = resharded;
  moved.mutable_shards(1)->set_address("127.0.0.1:9");
  moved.set_epoch(3);
  coordinator_.PublishShardMap(moved);
  ASSERT_TRUE(coordinator_.AwaitHeartbeats(coordinator_.heartbeats() + 3));
  EXPECT_EQ(coordinator_.reported_map_epoch(), 1u);  // kept, not followed yet

  auto fresh = std::make_unique<InMemoryShards>(n, 0);
  InMemoryShards* fresh_dense = fresh.get();
  WorkerSession::Clients old = session.ReplaceClients(*replaced, {std::move(fresh), nullptr});
  ASSERT_NE(old.dense, nullptr);
  EXPECT_EQ(&session.dense(), fresh_dense);
  EXPECT_EQ(fresh_dense->map_epoch(), 3u);  // the moved shard's map, at once
  {
    absl::MutexLock lock(&seen_mu);
    EXPECT_EQ(seen_maps, std::vector<uint64_t>({3}));
  }
  ASSERT_TRUE(coordinator_.AwaitHeartbeats(coordinator_.heartbeats() + 2));
  EXPECT_EQ(coordinator_.reported_map_epoch(), 3u);
}

}  // namespace
}  // namespace grps
