#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "data/split_mix.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/initializer.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "job/user_model.h"

namespace grps {
namespace {

TEST(JobConfig, DefaultsAreValid) {
  EXPECT_TRUE(ValidateJobConfig(DefaultJobConfig()).ok());
}

TEST(JobConfig, RejectsEachBrokenFieldWithItsName) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_batch_size(0);
  absl::Status s = ValidateJobConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch_size"), std::string::npos);
  c = DefaultJobConfig();
  c.mutable_optimizer()->set_learning_rate(NAN);
  EXPECT_FALSE(ValidateJobConfig(c).ok());
  c = DefaultJobConfig();
  c.set_heartbeat_timeout_ms(c.heartbeat_interval_ms());
  EXPECT_FALSE(ValidateJobConfig(c).ok());
  c = DefaultJobConfig();
  c.set_mode(v1::MODE_SSP);
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  // Backup workers belong to sync mode and leave at least one gradient.
  c = DefaultJobConfig();
  c.set_backup_workers(1);
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  c.set_backup_workers(c.num_workers());
  s = ValidateJobConfig(c);
  EXPECT_NE(s.message().find("backup_workers"), std::string::npos) << s;
  c.set_backup_workers(1);
  c.set_mode(v1::MODE_ASYNC);
  s = ValidateJobConfig(c);
  EXPECT_NE(s.message().find("sync mode only"), std::string::npos) << s;
  c = DefaultJobConfig();
  c.set_late_gradients(static_cast<v1::LateGradientPolicy>(7));
  EXPECT_FALSE(ValidateJobConfig(c).ok());
  // A chunk: whole in one message, whatever it carries beside its values.
  for (uint64_t chunk : {uint64_t{1} << 10, uint64_t{16} << 20}) {
    c = DefaultJobConfig();
    c.set_chunk_bytes(chunk);
    EXPECT_TRUE(ValidateJobConfig(c).ok()) << chunk;
  }
  for (uint64_t chunk : {uint64_t{1023}, (uint64_t{16} << 20) + 1, uint64_t{64} << 20}) {
    c = DefaultJobConfig();
    c.set_chunk_bytes(chunk);
    s = ValidateJobConfig(c);
    EXPECT_NE(s.message().find("chunk_bytes"), std::string::npos) << chunk;
  }
  // A part: 0 (by the link) or a size a request carries.
  for (uint64_t part : {uint64_t{0}, uint64_t{16} << 10, uint64_t{16} << 20}) {
    c = DefaultJobConfig();
    c.set_part_bytes(part);
    EXPECT_TRUE(ValidateJobConfig(c).ok()) << part;
  }
  for (uint64_t part : {uint64_t{1}, (uint64_t{16} << 10) - 1, (uint64_t{16} << 20) + 1}) {
    c = DefaultJobConfig();
    c.set_part_bytes(part);
    s = ValidateJobConfig(c);
    EXPECT_NE(s.message().find("part_bytes"), std::string::npos) << part;
  }
}

// Each refusal below was once taken, and the job that followed hung, died
// or trained to nonsense (a probe of grps-local's flags at their edges).
TEST(JobConfig, ValuesAJobCouldNotSurviveAreRefusedAtTheStart) {
  auto refused = [](const std::function<void(v1::JobConfig*)>& change, const std::string& says) {
    v1::JobConfig c = DefaultJobConfig();
    change(&c);
    const absl::Status s = ValidateJobConfig(c);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(says));
  };
  auto taken = [](const std::function<void(v1::JobConfig*)>& change) {
    v1::JobConfig c = DefaultJobConfig();
    change(&c);
    EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  };
  // A loss scale below 1 (f16 gradients underflowed; worse than untrained),
  // or for a compute dtype that scales nothing.
  refused(
      [](v1::JobConfig* c) {
        c->set_compute_dtype(v1::DTYPE_F16);
        c->set_loss_scale(1e-5f);
      },
      "loss_scale must be 0 (65536) or in [1, 2^24]");
  refused([](v1::JobConfig* c) { c->set_loss_scale(1024); }, "compute_dtype f16 only");
  taken([](v1::JobConfig* c) {
    c->set_compute_dtype(v1::DTYPE_F16);
    c->set_loss_scale(1);
  });
  // Members declared dead for a heartbeat 1 ms late.
  refused(
      [](v1::JobConfig* c) {
        c->set_heartbeat_interval_ms(1);
        c->set_heartbeat_timeout_ms(2);
      },
      "heartbeat_timeout_ms must be at least 3 x heartbeat_interval_ms (> 0) and at least 100");
  refused(
      [](v1::JobConfig* c) {
        c->set_heartbeat_interval_ms(100);
        c->set_heartbeat_timeout_ms(299);
      },
      "heartbeat_timeout_ms");
  refused(
      [](v1::JobConfig* c) {
        c->set_heartbeat_interval_ms(10);
        c->set_heartbeat_timeout_ms(99);
      },
      "heartbeat_timeout_ms");
  taken([](v1::JobConfig* c) {
    c->set_heartbeat_interval_ms(10);
    c->set_heartbeat_timeout_ms(100);
  });
  // Staleness rules in a mode where nothing is stale (silently ignored).
  refused([](v1::JobConfig* c) { c->set_max_staleness(4); }, "apply to async and ssp");
  refused([](v1::JobConfig* c) { c->set_staleness_aware_lr(true); }, "apply to async and ssp");
  taken([](v1::JobConfig* c) {
    c->set_mode(v1::MODE_ASYNC);
    c->set_max_staleness(4);
    c->set_staleness_aware_lr(true);
  });
  // A model the shards cannot hold (65536 x 65536: the worker was killed
  // for memory).
  refused(
      [](v1::JobConfig* c) {
        c->clear_hidden_units();
        c->add_hidden_units(65536);
        c->add_hidden_units(65536);
      },
      "parameters, past the 2^32");
  taken([](v1::JobConfig* c) {
    c->clear_hidden_units();
    c->add_hidden_units(65536);
    c->add_hidden_units(4096);
  });
  // A worker with fewer examples than a step's (it failed at its start; the
  // job failed or went on without it, by the timing).
  refused(
      [](v1::JobConfig* c) {
        c->set_num_workers(4);
        c->set_batch_size(1);
        c->mutable_dataset()->set_train_limit(3);
      },
      "dataset.train_limit 3 gives each worker 0 examples, fewer than one step's 1");
  refused(
      [](v1::JobConfig* c) {
        c->set_num_workers(2);
        c->set_batch_size(32);
        c->set_accumulate_steps(2);
        c->mutable_dataset()->set_train_limit(127);
      },
      "fewer than one step's 64");
  taken([](v1::JobConfig* c) {
    c->set_num_workers(2);
    c->set_batch_size(32);
    c->set_accumulate_steps(2);
    c->mutable_dataset()->set_train_limit(128);
  });
  // An elastic job's workers lease the whole set: a step's examples in all.
  taken([](v1::JobConfig* c) {
    c->set_num_workers(4);
    c->set_max_workers(4);
    c->set_batch_size(1);
    c->mutable_dataset()->set_train_limit(3);
  });
}

TEST(JobConfig, MlpTensorsFollowLayerWidths) {
  v1::JobConfig c = DefaultJobConfig();
  std::vector<v1::TensorSpec> t = ModelTensors(c);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0].name(), "dense_0/weight");
  EXPECT_EQ(t[0].shape(0), 784);
  EXPECT_EQ(t[0].shape(1), 256);
  EXPECT_EQ(t[5].name(), "dense_2/bias");
  EXPECT_EQ(t[5].shape(0), 10);
  c.set_model(v1::MODEL_SOFTMAX);
  c.clear_hidden_units();
  EXPECT_EQ(ModelTensors(c).size(), 2u);
}

// The embedding model of a valid job: the table "embedding" of its rows and
// dim, a sparse data format, and no input_features to agree with.
v1::JobConfig EmbeddingJob() {
  v1::JobConfig c = DefaultJobConfig();
  c.set_model(v1::MODEL_EMBEDDING);
  c.mutable_dataset()->set_format("synthetic");
  c.set_embedding_dim(8);
  c.set_embedding_rows(1000);
  c.set_input_features(0);
  v1::SparseTableSpec* t = c.add_sparse_tables();
  t->set_name(kEmbeddingTable);
  t->set_dim(8);
  t->set_rows(1000);
  return c;
}

std::string Refusal(const v1::JobConfig& c) {
  const absl::Status s = ValidateJobConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(JobConfig, TheEmbeddingModelNeedsItsTableAndASparseFormat) {
  v1::JobConfig c = EmbeddingJob();
  ASSERT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  // The head's input is the bag: embedding_dim wide.
  EXPECT_EQ(LayerWidths(c), (std::vector<int64_t>{8, 256, 128, 10}));
  EXPECT_EQ(ModelTensors(c)[0].shape(0), 8);
  c.mutable_sparse_tables(0)->set_dim(9);
  EXPECT_NE(Refusal(c).find("1000 rows x 9"), std::string::npos);
  c = EmbeddingJob();
  c.mutable_sparse_tables(0)->set_name("other");
  EXPECT_NE(Refusal(c).find("needs the sparse table \"embedding\""), std::string::npos);
  c = EmbeddingJob();
  c.mutable_dataset()->set_format("idx");
  EXPECT_NE(Refusal(c).find("idx-sparse, libsvm, synthetic or criteo"), std::string::npos);
  c = EmbeddingJob();
  c.set_embedding_dim(0);
  EXPECT_NE(Refusal(c).find("embedding_dim"), std::string::npos);
  c = EmbeddingJob();
  c.set_embedding_combiner(static_cast<v1::EmbeddingCombiner>(9));
  EXPECT_NE(Refusal(c).find("embedding_combiner"), std::string::npos);
  // Accumulation and clipping are every model's.
  c = EmbeddingJob();
  c.set_accumulate_steps(2);
  c.set_clip_norm(1);
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  // A dense model reads dense formats only, and libsvm and csv need a test
  // file.
  c = DefaultJobConfig();
  c.mutable_dataset()->set_format("libsvm");
  EXPECT_NE(Refusal(c).find("idx or csv"), std::string::npos);
  c.mutable_dataset()->set_format("csv");
  EXPECT_NE(Refusal(c).find("test_path"), std::string::npos);
  c.mutable_dataset()->set_test_path("/data/test.csv");
  EXPECT_TRUE(ValidateJobConfig(c).ok());
}

// Criteo data has 27 fields: a table each, named for Criteo's columns, all
// of the model's shape; the head reads the 27 bags side by side.
TEST(JobConfig, TheEmbeddingModelOfCriteoDataReadsATablePerField) {
  v1::JobConfig c = EmbeddingJob();
  c.mutable_dataset()->set_format("criteo");
  c.mutable_dataset()->set_path("/data/train.tsv");
  c.mutable_dataset()->set_test_path("/data/test.tsv");
  c.set_num_classes(2);
  const std::vector<std::string> tables = EmbeddingTables(c);
  ASSERT_EQ(tables.size(), 27u);
  EXPECT_EQ(tables.front(), "embedding.C1");
  EXPECT_EQ(tables[25], "embedding.C26");
  EXPECT_EQ(tables.back(), "embedding.I");
  EXPECT_EQ(LayerWidths(c), (std::vector<int64_t>{27 * 8, 256, 128, 2}));
  // The single table "embedding" is not theirs.
  EXPECT_NE(Refusal(c).find("needs the sparse table \"embedding.C1\""), std::string::npos);
  c.clear_sparse_tables();
  for (const std::string& name : tables) {
    v1::SparseTableSpec* t = c.add_sparse_tables();
    t->set_name(name);
    t->set_dim(8);
    t->set_rows(1000);
  }
  ASSERT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.mutable_sparse_tables(26)->set_dim(4);
  EXPECT_NE(Refusal(c).find("\"embedding.I\" is 1000 rows x 4"), std::string::npos);
  c.mutable_sparse_tables(26)->set_dim(8);
  c.set_num_classes(10);
  EXPECT_NE(Refusal(c).find("num_classes must be 2"), std::string::npos);
  c.set_num_classes(2);
  c.mutable_dataset()->clear_test_path();
  EXPECT_NE(Refusal(c).find("test_path"), std::string::npos);
}

TEST(JobConfig, SyntheticDataIsCheckedAgainstTheGeneratorsLimits) {
  v1::JobConfig c = EmbeddingJob();
  c.mutable_dataset()->mutable_synthetic()->set_label_noise(1);
  EXPECT_NE(Refusal(c).find("label_noise"), std::string::npos);
  c = EmbeddingJob();
  c.mutable_dataset()->mutable_synthetic()->set_vocabulary(5);
  c.mutable_dataset()->mutable_synthetic()->set_features_per_example(6);
  EXPECT_NE(Refusal(c).find("features_per_example"), std::string::npos);
  c = EmbeddingJob();
  c.mutable_dataset()->mutable_synthetic()->set_vocabulary(uint64_t{1} << 27);
  EXPECT_NE(Refusal(c).find("2^28"), std::string::npos);
  c = EmbeddingJob();
  c.mutable_dataset()->mutable_synthetic()->set_margin(-1);
  EXPECT_NE(Refusal(c).find("margin"), std::string::npos);
}

TEST(JobConfig, ParsersNameTheAllowedValues) {
  EXPECT_EQ(*ParseMode("ASYNC"), v1::MODE_ASYNC);
  absl::StatusOr<v1::ConsistencyMode> bad = ParseMode("bsp");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sync, async, ssp"), std::string::npos);
  EXPECT_EQ(ParseHiddenUnits("256, 128")->size(), 2u);
  EXPECT_FALSE(ParseHiddenUnits("256,x").ok());
  // No hidden layers: "" for grps-coordinator, "none" also for grps-local
  // (whose unset flags are empty).
  EXPECT_TRUE(ParseHiddenUnits("")->empty());
  EXPECT_TRUE(ParseHiddenUnits("none")->empty());
  EXPECT_FALSE(ParseHiddenUnits("none,4").ok());
  // An empty width is a typo, not "none".
  for (const char* typo : {",", "64,,32", "64,", " , "})
    EXPECT_FALSE(ParseHiddenUnits(typo).ok()) << typo;
  EXPECT_EQ(*ParseOptimizer("adam"), v1::OPTIMIZER_ADAM);
}

TEST(JobConfig, TotalStepsDerivesFromEpochsPerWorkerPartition) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_num_workers(2);
  c.set_batch_size(64);
  c.set_epochs(3);
  EXPECT_EQ(TotalSteps(c, 60000), 3u * (30000 / 64));
  c.set_steps(17);
  EXPECT_EQ(TotalSteps(c, 60000), 17u);
}

TEST(JobConfig, AnAccumulatingStepTakesAccumulateStepsBatches) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_batch_size(16);
  c.set_accumulate_steps(4);
  EXPECT_EQ(AccumulateSteps(c), 4u);
  EXPECT_EQ(StepExamples(c), 64u);
  EXPECT_EQ(TotalSteps(c, 60000), 3u * (30000 / 64));
  c.set_accumulate_steps(0);  // unset: one batch per step
  EXPECT_EQ(AccumulateSteps(c), 1u);
  EXPECT_EQ(StepExamples(c), 16u);
}

// `c` is refused INVALID_ARGUMENT with a message that says `what`.
void ExpectRefused(const v1::JobConfig& c, const std::string& what) {
  const absl::Status s = ValidateJobConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
  EXPECT_NE(s.message().find(what), std::string::npos) << s;
}

// `c` as a user model's job, valid, with a sparse table "emb".
void MakeUserJobWithATable(v1::JobConfig& c) {
  c.set_model(v1::MODEL_USER);
  c.mutable_dataset()->set_path("");
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  v1::SparseTableSpec* table = c.add_sparse_tables();
  table->set_name("emb");
  table->set_dim(4);
  table->set_rows(100);
}

TEST(JobConfig, AccumulationAndClippingAreValidated) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_accumulate_steps(8);
  c.set_clip_norm(1.5f);
  c.set_clip_value(0.1f);
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  c.set_accumulate_steps(1025);
  ExpectRefused(c, "accumulate_steps must be in [0, 1024]");
  c.set_accumulate_steps(1024);
  c.set_batch_size(100);  // 102,400 examples a step
  ExpectRefused(c, "batch_size x accumulate_steps");
  c = DefaultJobConfig();
  c.set_clip_norm(-1);
  ExpectRefused(c, "clip_norm");
  c.set_clip_norm(INFINITY);
  ExpectRefused(c, "clip_norm");
  c = DefaultJobConfig();
  c.set_clip_value(NAN);
  ExpectRefused(c, "clip_value");
}

TEST(JobConfig, AnElasticJobsWorkerBoundsAreValidated) {
  v1::JobConfig c = DefaultJobConfig();  // 2 workers
  c.set_max_workers(4);
  c.set_min_workers(1);
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.set_max_workers(2);  // no spare rank, but elastic (leased data)
  c.set_min_workers(2);
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.set_max_workers(1);
  c.set_min_workers(0);
  ExpectRefused(c, "max_workers must be at least num_workers");
  c.set_max_workers(1025);
  ExpectRefused(c, "max_workers must be in [0, 1024]");
  c.set_max_workers(4);
  c.set_min_workers(3);
  ExpectRefused(c, "min_workers must be at most num_workers");
  c.set_max_workers(0);
  c.set_min_workers(1);
  ExpectRefused(c, "min_workers needs max_workers");
  c = DefaultJobConfig();
  c.set_model(v1::MODEL_USER);
  c.mutable_dataset()->set_path("");
  ASSERT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.set_max_workers(4);
  c.set_epochs(0);
  ExpectRefused(c, "max_workers: a user model's elastic job needs --epochs or --steps");
  c.set_epochs(2);  // a Python elastic job leases its data (gt.ElasticSampler)
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
}

TEST(JobConfig, ServersThatScaleNeedSharedCheckpoints) {
  v1::JobConfig c = DefaultJobConfig();  // 2 servers
  c.set_max_servers(3);
  ExpectRefused(c, "max_servers needs checkpoint_dir");
  c.set_checkpoint_dir("/tmp/ckpt");
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  c.set_checkpoint_storage(v1::CHECKPOINT_STORAGE_PER_SHARD);
  ExpectRefused(c, "max_servers needs shared checkpoint storage");
  c.set_checkpoint_storage(v1::CHECKPOINT_STORAGE_SHARED);
  c.set_max_servers(1);
  ExpectRefused(c, "max_servers must be at least num_servers");
  c.set_max_servers(257);
  ExpectRefused(c, "max_servers must be in [0, 256]");
  // A user model's Python workers follow a re-sharding, with sparse tables
  // too (a row pull or push that its roll-back ends is taken in the library).
  c.set_max_servers(3);
  MakeUserJobWithATable(c);
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
}

TEST(JobConfig, AnElasticJobHasMaxWorkersRanksAndAFixedJobNumWorkers) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_num_workers(3);
  EXPECT_FALSE(IsElastic(c));
  EXPECT_EQ(JobRanks(c), 3u);
  c.set_max_workers(8);
  EXPECT_TRUE(IsElastic(c));
  EXPECT_EQ(JobRanks(c), 8u);
  c.set_max_workers(3);
  EXPECT_TRUE(IsElastic(c));
  EXPECT_EQ(JobRanks(c), 3u);
}

TEST(JobConfig, TheExampleLedgerCutsEachEpochIntoBlocksOfOneStepsExamples) {
  v1::JobConfig c = DefaultJobConfig();  // batch 64, 3 epochs, 2 workers
  c.set_max_workers(4);
  LedgerShape shape = ExampleLedgerShape(c, 60000);
  EXPECT_EQ(shape.blocks_per_epoch, 60000u / 64);  // 937: the rest is dropped
  EXPECT_EQ(shape.total_blocks, 3u * 937);
  // With steps: the examples a fixed job of num_workers would train.
  c.set_steps(17);
  shape = ExampleLedgerShape(c, 60000);
  EXPECT_EQ(shape.blocks_per_epoch, 937u);
  EXPECT_EQ(shape.total_blocks, 17u * 2);
  // A block is an accumulating step's batches.
  c.set_steps(0);
  c.set_accumulate_steps(4);
  shape = ExampleLedgerShape(c, 60000);
  EXPECT_EQ(shape.blocks_per_epoch, 60000u / 256);
  EXPECT_EQ(shape.total_blocks, 3u * (60000 / 256));
  // A set smaller than one step still makes a block an epoch.
  shape = ExampleLedgerShape(c, 100);
  EXPECT_EQ(shape.blocks_per_epoch, 1u);
  EXPECT_EQ(shape.total_blocks, 3u);
}

TEST(JobConfig, LearningRateWarmsUpThenDecays) {
  v1::OptimizerConfig o;
  o.set_learning_rate(1.0f);
  o.set_warmup_steps(4);
  o.set_decay_steps(10);
  o.set_decay_rate(0.5f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(o, 0), 0.25f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(o, 3), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(o, 13), 1.0f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(o, 14), 0.5f);
}

TEST(JobConfig, AsyncUpdatesScaleTheStepLearningRateByWorkers) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_num_workers(4);
  c.mutable_optimizer()->set_learning_rate(0.8f);
  c.mutable_optimizer()->set_decay_steps(10);
  c.mutable_optimizer()->set_decay_rate(0.5f);
  EXPECT_FLOAT_EQ(AsyncLearningRate(c, 0, 0), 0.2f);
  EXPECT_FLOAT_EQ(AsyncLearningRate(c, 39, 0), 0.2f) << "39 updates = 9 steps";
  EXPECT_FLOAT_EQ(AsyncLearningRate(c, 40, 0), 0.1f) << "40 updates = 10 steps";
  c.set_staleness_aware_lr(true);
  EXPECT_FLOAT_EQ(AsyncLearningRate(c, 0, 3), 0.05f);
}

TEST(JobConfig, AProgramsOptimizerMustKeepTheJobsStateAndBeInRange) {
  v1::OptimizerConfig job;
  job.set_kind(v1::OPTIMIZER_MOMENTUM);
  v1::OptimizerConfig program;
  program.set_kind(v1::OPTIMIZER_NESTEROV);  // the same velocity
  program.set_learning_rate(0.0f);           // a scheduler may reach 0
  program.set_momentum(0.9f);
  EXPECT_TRUE(CheckProgramOptimizer(job, program).ok());
  program.set_kind(v1::OPTIMIZER_ADAM);
  EXPECT_THAT(std::string(CheckProgramOptimizer(job, program).message()),
              ::testing::HasSubstr("start the job with --optimizer=adam"));
  program.set_kind(v1::OPTIMIZER_MOMENTUM);
  for (auto breaks : std::vector<std::function<void(v1::OptimizerConfig*)>>{
           [](v1::OptimizerConfig* o) { o->set_learning_rate(-1); },
           [](v1::OptimizerConfig* o) { o->set_weight_decay(std::nanf("")); },
           [](v1::OptimizerConfig* o) { o->set_momentum(1.0f); },
           [](v1::OptimizerConfig* o) { o->set_beta2(1.5f); },
           [](v1::OptimizerConfig* o) { o->set_epsilon(INFINITY); },
           [](v1::OptimizerConfig* o) { o->set_decay_steps(10); },
           [](v1::OptimizerConfig* o) { o->set_decoupled_weight_decay(true); }}) {
    v1::OptimizerConfig broken = program;
    breaks(&broken);
    EXPECT_TRUE(absl::IsInvalidArgument(CheckProgramOptimizer(job, broken)))
        << broken.ShortDebugString();
  }
  job.set_kind(v1::OPTIMIZER_ADAM);
  program.set_kind(v1::OPTIMIZER_ADAM);
  program.set_momentum(0);
  program.set_decoupled_weight_decay(true);  // AdamW
  EXPECT_TRUE(CheckProgramOptimizer(job, program).ok());
}

TEST(JobConfig, AnOptimizerOnTheWorkersIsForAUserModelWithNoSparseTables) {
  EXPECT_EQ(*ParseOptimizer("workers"), v1::OPTIMIZER_WORKERS);
  EXPECT_EQ(OptimizerName(v1::OPTIMIZER_WORKERS), "workers");
  EXPECT_EQ(OptimizerStateSlots(v1::OPTIMIZER_WORKERS), 0u);
  v1::JobConfig c = DefaultJobConfig();
  c.mutable_optimizer()->set_kind(v1::OPTIMIZER_WORKERS);
  ExpectRefused(c, "optimizer 'workers' (the program's optimizer on the workers) is for a user");
  MakeUserJobWithATable(c);
  ExpectRefused(c, "optimizer 'workers': the rows of sparse tables");
  // A push names no server optimizer in such a job, nor a worker one in another.
  v1::OptimizerConfig job, program;
  job.set_kind(v1::OPTIMIZER_WORKERS);
  program.set_kind(v1::OPTIMIZER_SGD);
  EXPECT_THAT(std::string(CheckProgramOptimizer(job, program).message()),
              ::testing::HasSubstr("the job's optimizer runs on the workers"));
  EXPECT_FALSE(CheckProgramOptimizer(program, job).ok());
}

TEST(ShardMap, ChunksTileEveryTensorAndBalanceBytes) {
  v1::JobConfig c = DefaultJobConfig();
  absl::StatusOr<v1::ShardMap> map = BuildShardMap(ModelTensors(c), 3, 64 * 1024);
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_TRUE(ValidateShardMap(*map).ok());
  for (const v1::ChunkSpec& ch : map->chunks())
    EXPECT_LE(ch.num_elements() * 4, 64u * 1024);
  std::vector<uint64_t> bytes = BytesPerShard(*map);
  uint64_t lo = *std::min_element(bytes.begin(), bytes.end());
  uint64_t hi = *std::max_element(bytes.begin(), bytes.end());
  EXPECT_LE(hi - lo, 64u * 1024) << "shards differ by more than one chunk";
  size_t owned = 0;
  for (uint32_t s = 0; s < 3; ++s) owned += ChunksOfShard(*map, s).size();
  EXPECT_EQ(owned, static_cast<size_t>(map->chunks_size()));
}

TEST(ShardMap, IsDeterministic) {
  v1::JobConfig c = DefaultJobConfig();
  auto a = BuildShardMap(ModelTensors(c), 2, 256 * 1024);
  auto b = BuildShardMap(ModelTensors(c), 2, 256 * 1024);
  EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString());
}

TEST(ShardMap, ValidationRejectsGapsAndUnknownShards) {
  v1::JobConfig c = DefaultJobConfig();
  v1::ShardMap map = *BuildShardMap(ModelTensors(c), 2, 256 * 1024);
  v1::ShardMap gap = map;
  gap.mutable_chunks(1)->set_offset(gap.chunks(1).offset() + 1);
  EXPECT_FALSE(ValidateShardMap(gap).ok());
  v1::ShardMap shard = map;
  shard.mutable_chunks(0)->set_shard(9);
  EXPECT_FALSE(ValidateShardMap(shard).ok());
}

v1::TensorSpec Shaped(std::vector<int64_t> shape) {
  v1::TensorSpec t;
  t.set_name("w");
  for (int64_t d : shape) t.add_shape(d);
  return t;
}

constexpr int64_t k2To32 = int64_t{1} << 32;

TEST(ShardMap, CheckedElementCountsRefuseProductsThatWrap) {
  EXPECT_EQ(CheckedNumElements(Shaped({})), 1u);
  EXPECT_EQ(CheckedNumElements(Shaped({10, 64})), 640u);
  EXPECT_EQ(CheckedNumElements(Shaped({10, 0})), std::nullopt);
  EXPECT_EQ(CheckedNumElements(Shaped({k2To32, k2To32})), std::nullopt) << "wraps to 0";
  EXPECT_EQ(CheckedNumElements(Shaped({int64_t{1} << 40, 1 << 24})), std::nullopt);
  EXPECT_EQ(CheckedNumElements(Shaped({k2To32 + 1, k2To32 - 1, k2To32 + 1, k2To32 - 1})),
            std::nullopt)
      << "wraps to 1";
  EXPECT_EQ(ChunksOfTensor(0, 1024), 0u);
  EXPECT_EQ(ChunksOfTensor(256, 1024), 1u);
  EXPECT_EQ(ChunksOfTensor(257, 1024), 2u);
}

TEST(ShardMap, BuildingRefusesATensorWhoseElementCountWraps) {
  // The count wrapped to 0 and the cut divided by it (SIGFPE).
  absl::StatusOr<v1::ShardMap> map = BuildShardMap({Shaped({k2To32, k2To32})}, 2, 1024);
  EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardMap, ValidationRefusesElementCountsAndOffsetsThatWrap) {
  // A tensor of 2^128 elements "of 1 element" (the product wraps to 1).
  v1::ShardMap wraps_to_one;
  *wraps_to_one.add_tensors() = Shaped({k2To32 + 1, k2To32 - 1, k2To32 + 1, k2To32 - 1});
  v1::ChunkSpec* c = wraps_to_one.add_chunks();
  c->set_num_elements(1);
  wraps_to_one.add_shards();
  EXPECT_THAT(std::string(ValidateShardMap(wraps_to_one).message()),
              ::testing::HasSubstr("more than 2^63 - 1 elements"));
  // A tensor of 2^64 elements and no chunk (the product wraps to 0).
  v1::ShardMap wraps_to_zero;
  *wraps_to_zero.add_tensors() = Shaped({k2To32, k2To32});
  wraps_to_zero.add_shards();
  EXPECT_FALSE(ValidateShardMap(wraps_to_zero).ok());
  // Chunks of a 4-element tensor whose sizes sum to 4 modulo 2^64.
  v1::ShardMap offsets_wrap;
  *offsets_wrap.add_tensors() = Shaped({4});
  c = offsets_wrap.add_chunks();
  c->set_num_elements(~uint64_t{0});
  c = offsets_wrap.add_chunks();
  c->set_chunk_id(1);
  c->set_offset(~uint64_t{0});
  c->set_num_elements(5);
  offsets_wrap.add_shards();
  EXPECT_THAT(std::string(ValidateShardMap(offsets_wrap).message()),
              ::testing::HasSubstr("chunk 0 runs past the end of its tensor"));
}

TEST(Initializer, ValuesDoNotDependOnChunking) {
  v1::TensorSpec t;
  t.add_shape(100);
  t.add_shape(50);
  t.set_initializer("glorot_uniform");
  std::vector<float> whole(5000), parts(5000);
  ASSERT_TRUE(InitializeRange(t, 7, 0, 0, 5000, whole.data()).ok());
  ASSERT_TRUE(InitializeRange(t, 7, 0, 0, 1234, parts.data()).ok());
  ASSERT_TRUE(InitializeRange(t, 7, 0, 1234, 5000 - 1234, parts.data() + 1234).ok());
  EXPECT_EQ(whole, parts);
  const float limit = std::sqrt(6.0f / 150.0f);
  double mean = 0;
  for (float v : whole) {
    EXPECT_LE(std::fabs(v), limit);
    mean += v;
  }
  EXPECT_NEAR(mean / whole.size(), 0.0, 0.02);
  std::vector<float> other(5000);
  ASSERT_TRUE(InitializeRange(t, 8, 0, 0, 5000, other.data()).ok());
  EXPECT_NE(whole, other) << "a different seed must give different weights";
  t.set_initializer("orthogonal");
  EXPECT_FALSE(InitializeRange(t, 7, 0, 0, 10, whole.data()).ok());
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

TEST(JobConfig, DurabilitySettingsDefaultAndValidate) {
  v1::JobConfig c = DefaultJobConfig();
  EXPECT_EQ(RecoveryTimeoutMs(c), 30000u);
  EXPECT_EQ(CoordinatorTimeoutMs(c), 60000u);
  c.set_recovery_timeout_ms(12000);
  c.set_coordinator_timeout_ms(9000);
  EXPECT_EQ(RecoveryTimeoutMs(c), 12000u);
  EXPECT_EQ(CoordinatorTimeoutMs(c), 9000u);
  EXPECT_TRUE(ValidateJobConfig(c).ok());

  v1::JobConfig no_dir = DefaultJobConfig();
  no_dir.set_checkpoint_every_seconds(60);
  EXPECT_FALSE(ValidateJobConfig(no_dir).ok());
  no_dir.set_checkpoint_dir("/ckpt");
  EXPECT_TRUE(ValidateJobConfig(no_dir).ok());

  v1::JobConfig short_recovery = DefaultJobConfig();
  short_recovery.set_recovery_timeout_ms(short_recovery.heartbeat_timeout_ms() - 1);
  EXPECT_FALSE(ValidateJobConfig(short_recovery).ok());

  // A shard file's part size: up to 2047 MiB, as one message holds.
  v1::JobConfig parts = DefaultJobConfig();
  parts.set_checkpoint_part_kib(2047 * 1024);
  EXPECT_TRUE(ValidateJobConfig(parts).ok());
  parts.set_checkpoint_part_kib(2048 * 1024);
  EXPECT_THAT(std::string(ValidateJobConfig(parts).message()),
              ::testing::HasSubstr("checkpoint_part_kib must be at most 2096128"));
}

TEST(JobEnded, TheCoordinatorsAnswerToALateMemberIsRecognisedAndNothingElse) {
  const absl::Status ended = JobEndedError("j", v1::JOB_STATE_COMPLETED);
  EXPECT_TRUE(absl::IsFailedPrecondition(ended));
  EXPECT_EQ(ended.message(), "job j has ended (completed)");
  EXPECT_TRUE(IsJobEnded(ended));
  EXPECT_TRUE(IsJobEnded(JobEndedError("j", v1::JOB_STATE_FAILED)));
  EXPECT_FALSE(IsJobEnded(absl::FailedPreconditionError(
      "request is for job 'x', this coordinator runs job 'j'")));
  EXPECT_FALSE(IsJobEnded(absl::UnavailableError("job j has ended (completed)")));
  EXPECT_FALSE(IsJobEnded(absl::OkStatus()));
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

using ::testing::HasSubstr;

TensorSpecs UserModel() {
  TensorSpecs model;
  for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"conv.weight", {4, 1, 3, 3}}, {"conv.bias", {4}}, {"scale", {}}}) {
    v1::TensorSpec* t = model.Add();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_initializer("given");
  }
  return model;
}

TEST(UserModel, ARealModelsTensorsPassAndEachBrokenRuleIsNamed) {
  EXPECT_TRUE(ValidateUserModel(UserModel()).ok());
  auto refused = [](const std::function<void(TensorSpecs*)>& edit) {
    TensorSpecs m = UserModel();
    edit(&m);
    return std::string(ValidateUserModel(m).message());
  };
  EXPECT_THAT(refused([](TensorSpecs* m) { m->Clear(); }), HasSubstr("no tensors"));
  EXPECT_THAT(refused([](TensorSpecs* m) { m->Mutable(1)->set_name("conv.weight"); }),
              HasSubstr("tensor 1 'conv.weight': the name appears twice"));
  EXPECT_THAT(refused([](TensorSpecs* m) { m->Mutable(0)->set_name("a b"); }),
              HasSubstr("tensor 0: a name may hold only"));
  EXPECT_THAT(refused([](TensorSpecs* m) { m->Mutable(1)->set_shape(0, 0); }),
              HasSubstr("tensor 1 'conv.bias' has shape [0]"));
  EXPECT_THAT(refused([](TensorSpecs* m) { m->Mutable(2)->set_initializer("zeros"); }),
              HasSubstr("tensor 2 'scale' has initializer 'zeros'"));
  EXPECT_EQ(refused([](TensorSpecs* m) { m->Mutable(2)->set_dtype(v1::DTYPE_UNSPECIFIED); }),
            "");
  EXPECT_THAT(refused([](TensorSpecs* m) {
                m->Mutable(0)->clear_shape();
                for (int i = 0; i < 5; ++i) m->Mutable(0)->add_shape(1 << 8);
              }),
              HasSubstr("more than 4294967296 elements"));
}

TensorSpecs OneTensor(std::vector<int64_t> shape) {
  TensorSpecs model;
  v1::TensorSpec* t = model.Add();
  t->set_name("w");
  for (int64_t d : shape) t->add_shape(d);
  t->set_initializer("given");
  return model;
}

TEST(UserModel, ShapesWhoseElementCountWrapsAreRefusedNamingTheTensor) {
  const int64_t k2To32 = int64_t{1} << 32;
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {k2To32, k2To32},                                  // 2^64: wraps to 0
           {int64_t{1} << 40, 1 << 24},                       // 2^64 too
           {k2To32 + 1, k2To32 - 1, k2To32 + 1, k2To32 - 1},  // wraps to 1
           {int64_t{1} << 33}}) {                             // 32 GiB on the shards
    const absl::Status s = ValidateUserModel(OneTensor(shape));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << shape[0];
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("tensor 0 'w' has shape [" + std::to_string(shape[0])));
    EXPECT_THAT(std::string(s.message()), HasSubstr("16 GiB on the shards"));
  }
  EXPECT_TRUE(ValidateUserModel(OneTensor({1 << 16, 1 << 16})).ok()) << "2^32: the bound";
}

TEST(UserModel, TheDescriptionIsBoundedSoThatAStatusReplyCarriesIt) {
  auto model = [](int tensors, int name_bytes) {
    TensorSpecs m;
    for (int i = 0; i < tensors; ++i) {
      v1::TensorSpec* t = m.Add();
      const std::string index = std::to_string(i);
      t->set_name(std::string(name_bytes - index.size(), 'x') + index);
      t->add_shape(1);
      t->set_initializer("given");
    }
    return m;
  };
  EXPECT_THAT(std::string(ValidateUserModel(model(100000, 8)).message()),
              HasSubstr("100000 tensors (at most 16384)"));
  EXPECT_THAT(std::string(ValidateUserModel(model(16384, 64)).message()),
              HasSubstr("description takes"));
  // A large LLM: a few thousand tensors with names like
  // "model.layers.79.self_attn.q_proj.weight".
  EXPECT_TRUE(ValidateUserModel(model(5000, 48)).ok());
}

TEST(UserModel, AModelOfMoreChunksThanAShardMapCarriesIsRefused) {
  const TensorSpecs big = OneTensor({1 << 16, 1 << 16});  // 16 GiB on the shards
  EXPECT_TRUE(CheckUserModelChunks(big, 256 * 1024).ok()) << "65,536 chunks";
  EXPECT_THAT(std::string(CheckUserModelChunks(big, 1024).message()),
              HasSubstr("cuts into 16777216 chunks of 1024 bytes"));
}

TEST(UserModel, TheFirstDifferenceIsNamedWithWhatTheJobHas) {
  const TensorSpecs job = UserModel();
  EXPECT_EQ(FirstModelDifference(job, job), "");
  TensorSpecs other = job;
  other.Mutable(1)->set_shape(0, 8);
  EXPECT_EQ(FirstModelDifference(job, other),
            "tensor 1 'conv.bias' has shape [8], the job's [4]");
  other = job;
  other.Mutable(0)->set_name("features.0.weight");
  EXPECT_EQ(FirstModelDifference(job, other),
            "tensor 0 'features.0.weight' is 'conv.weight' in the job's model");
  other = job;
  other.RemoveLast();
  EXPECT_THAT(FirstModelDifference(job, other), HasSubstr("lacks tensor 2 'scale'"));
  other = job;
  *other.Add() = job[0];
  other.Mutable(3)->set_name("extra");
  EXPECT_THAT(FirstModelDifference(job, other), HasSubstr("tensor 3 'extra' is not in the job's"));
  other = job;
  other.Mutable(2)->set_dtype(v1::DTYPE_F16);
  EXPECT_THAT(FirstModelDifference(job, other), HasSubstr("has dtype DTYPE_F16"));
  EXPECT_TRUE(IsModelMismatch(ModelMismatchError("j", "x")));
  EXPECT_FALSE(IsModelMismatch(absl::FailedPreconditionError("request is for job 'x'")));
}

TEST(UserModel, AUserJobNeedsNoDataAndItsLayoutIsItsTensors) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_model(v1::MODEL_USER);
  c.mutable_dataset()->set_path("");
  c.set_steps(0);
  c.set_epochs(0);
  EXPECT_TRUE(ValidateJobConfig(c).ok()) << ValidateJobConfig(c);
  EXPECT_TRUE(ModelTensors(c).empty());
  *c.mutable_model_tensors() = UserModel();
  EXPECT_TRUE(ValidateJobConfig(c).ok());
  ASSERT_EQ(ModelTensors(c).size(), 3u);
  EXPECT_EQ(ModelTensors(c)[2].name(), "scale");
  c.mutable_model_tensors(0)->set_initializer("glorot_uniform");
  EXPECT_THAT(std::string(ValidateJobConfig(c).message()), HasSubstr("model_tensors: tensor 0"));
  v1::JobConfig mlp = DefaultJobConfig();
  *mlp.mutable_model_tensors() = UserModel();
  EXPECT_THAT(std::string(ValidateJobConfig(mlp).message()), HasSubstr("user model only"));
}

// A row's shard is part of every checkpoint's layout: SparseShardOf must stay
// SplitMix64(id) mod the shard count, whatever the count.
TEST(SparseShardOf, IsTheIdsSplitMixHashModuloTheShardCount) {
  std::vector<int64_t> ids = {0, 1, 2, 3, 255, 256, 1 << 20, INT64_MAX, INT64_MAX - 1};
  uint64_t x = 7;
  for (int i = 0; i < 1000; ++i) ids.push_back(static_cast<int64_t>((x = SplitMix64(x)) >> 1));
  for (uint32_t shards : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 16u, 64u, 100u, 1u << 31})
    for (int64_t id : ids)
      ASSERT_EQ(SparseShardOf(id, shards), SplitMix64(static_cast<uint64_t>(id)) % shards)
          << "id " << id << ", " << shards << " shards";
  // Spread: 1000 random ids over 4 shards, each with a fair share.
  std::vector<int> count(4, 0);
  for (int64_t id : ids) ++count[SparseShardOf(id, 4)];
  for (int c : count) EXPECT_GT(c, 200);
}

TEST(SparseTablesFlag, ParsesNameRowsDimAndScale) {
  absl::StatusOr<std::vector<v1::SparseTableSpec>> t =
      ParseSparseTables("ids:10000000:16, users:0:8:0.01");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].name(), "ids");
  EXPECT_EQ((*t)[0].rows(), 10000000u);
  EXPECT_EQ((*t)[1].dim(), 8u);
  EXPECT_FLOAT_EQ((*t)[1].init_scale(), 0.01f);
  EXPECT_FALSE(ParseSparseTables("ids:16").ok());
  EXPECT_FALSE(ParseSparseTables("ids:x:16").ok());
}

}  // namespace
}  // namespace grps
