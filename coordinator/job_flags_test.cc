#include "coordinator/job_flags.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "job/job_config.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, hidden);
ABSL_DECLARE_FLAG(std::string, mode);
ABSL_DECLARE_FLAG(std::string, wire_dtype);
ABSL_DECLARE_FLAG(uint64_t, chunk_kb);
ABSL_DECLARE_FLAG(uint64_t, part_kb);
ABSL_DECLARE_FLAG(uint32_t, batch);
ABSL_DECLARE_FLAG(uint32_t, workers);
ABSL_DECLARE_FLAG(float, lr);
ABSL_DECLARE_FLAG(std::string, checkpoint_dir);
ABSL_DECLARE_FLAG(uint64_t, checkpoint_every_steps);
ABSL_DECLARE_FLAG(uint32_t, checkpoint_every_s);
ABSL_DECLARE_FLAG(uint32_t, recovery_timeout_ms);
ABSL_DECLARE_FLAG(uint32_t, coordinator_timeout_ms);
ABSL_DECLARE_FLAG(std::string, data_format);
ABSL_DECLARE_FLAG(std::string, dataset);
ABSL_DECLARE_FLAG(std::string, test_data);
ABSL_DECLARE_FLAG(uint32_t, classes);
ABSL_DECLARE_FLAG(uint32_t, embedding_dim);
ABSL_DECLARE_FLAG(uint64_t, embedding_rows);
ABSL_DECLARE_FLAG(std::string, embedding_combiner);
ABSL_DECLARE_FLAG(uint64_t, embedding_max_rows_per_shard);
ABSL_DECLARE_FLAG(double, synthetic_noise);
ABSL_DECLARE_FLAG(uint64_t, synthetic_vocabulary);

namespace grps {
namespace {

using ::google::protobuf::util::MessageDifferencer;

TEST(JobFlags, DefaultFlagsDescribeTheDefaultJob) {
  absl::FlagSaver saver;
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*config, DefaultJobConfig()))
      << config->DebugString();
}

TEST(JobFlags, OnlyFlagsSetAwayFromTheirDefaultAreChangedJobFlags) {
  absl::FlagSaver saver;
  EXPECT_TRUE(ChangedJobFlags().empty());
  absl::SetFlag(&FLAGS_lr, 0.125f);
  absl::SetFlag(&FLAGS_mode, "async");
  absl::SetFlag(&FLAGS_batch, DefaultJobConfig().batch_size());  // its default
  using Flags = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(ChangedJobFlags(), (Flags{{"lr", "0.125"}, {"mode", "async"}}));
  // The job those flags describe is what a coordinator given them builds.
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->optimizer().learning_rate(), 0.125f);
  EXPECT_EQ(config->mode(), v1::MODE_ASYNC);
}

TEST(JobFlags, TheEmbeddingModelGetsItsTableAndReadsFashionMnistAsSparseByDefault) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_model, "embedding");
  absl::SetFlag(&FLAGS_embedding_dim, 32);
  absl::SetFlag(&FLAGS_embedding_rows, 5000);
  absl::SetFlag(&FLAGS_embedding_combiner, "mean");
  absl::SetFlag(&FLAGS_embedding_max_rows_per_shard, 3000);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->dataset().format(), "idx-sparse");
  EXPECT_EQ(config->embedding_combiner(), v1::COMBINER_MEAN);
  ASSERT_EQ(config->sparse_tables_size(), 1);
  const v1::SparseTableSpec& t = config->sparse_tables(0);
  EXPECT_EQ(t.name(), "embedding");
  EXPECT_EQ(t.dim(), 32u);
  EXPECT_EQ(t.rows(), 5000u);
  EXPECT_EQ(t.max_rows_per_shard(), 3000u);
  // The head keeps --hidden.
  EXPECT_EQ(LayerWidths(*config), (std::vector<int64_t>{32, 256, 128, 10}));
  absl::SetFlag(&FLAGS_embedding_combiner, "max");
  config = JobConfigFromFlags();
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("--embedding_combiner"), std::string::npos);
}

// Criteo data: a table per field, every one of the embedding flags' shape
// and policies.
TEST(JobFlags, CriteoDataGetsATableAPerFieldWithTheEmbeddingFlagsPolicies) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_model, "embedding");
  absl::SetFlag(&FLAGS_data_format, "criteo");
  absl::SetFlag(&FLAGS_dataset, "/data/train.tsv.gz");
  absl::SetFlag(&FLAGS_test_data, "/data/test.tsv.gz");
  absl::SetFlag(&FLAGS_classes, 2);
  absl::SetFlag(&FLAGS_embedding_dim, 16);
  absl::SetFlag(&FLAGS_embedding_max_rows_per_shard, 3000);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->sparse_tables_size(), 27);
  for (int t = 0; t < 27; ++t) {
    EXPECT_EQ(config->sparse_tables(t).name(), EmbeddingTables(*config)[t]);
    EXPECT_EQ(config->sparse_tables(t).dim(), 16u);
    EXPECT_EQ(config->sparse_tables(t).max_rows_per_shard(), 3000u);
  }
  EXPECT_EQ(LayerWidths(*config).front(), 27 * 16);
  // Ten classes are not a click.
  absl::SetFlag(&FLAGS_classes, 10);
  EXPECT_NE(JobConfigFromFlags().status().message().find("num_classes must be 2"),
            std::string::npos);
}

TEST(JobFlags, SyntheticFlagsFillTheGeneratorsOptionsAndAreValidated) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_model, "embedding");
  absl::SetFlag(&FLAGS_data_format, "synthetic");
  absl::SetFlag(&FLAGS_classes, 4);
  absl::SetFlag(&FLAGS_synthetic_vocabulary, 500);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_classes(), 4u);
  EXPECT_EQ(config->dataset().synthetic().vocabulary(), 500u);
  // Unset: the generator's defaults, spelled out.
  EXPECT_DOUBLE_EQ(config->dataset().synthetic().label_noise(), 0.1);
  EXPECT_DOUBLE_EQ(config->dataset().synthetic().margin(), 1.25);
  absl::SetFlag(&FLAGS_synthetic_noise, 1.5);
  config = JobConfigFromFlags();
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("label_noise"), std::string::npos);
}

TEST(JobFlags, CsvAndLibsvmNeedATestFile) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_data_format, "csv");
  absl::SetFlag(&FLAGS_dataset, "/data/train.csv");
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("test_path"), std::string::npos);
  absl::SetFlag(&FLAGS_test_data, "/data/test.csv");
  config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->dataset().test_path(), "/data/test.csv");
  // A dense model cannot read libsvm.
  absl::SetFlag(&FLAGS_data_format, "libsvm");
  config = JobConfigFromFlags();
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("idx or csv"), std::string::npos);
}

TEST(JobFlags, DurabilityFlagsSetTheirFields) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_checkpoint_dir, "/tmp/ckpts");
  absl::SetFlag(&FLAGS_checkpoint_every_steps, 100);
  absl::SetFlag(&FLAGS_checkpoint_every_s, 30);
  absl::SetFlag(&FLAGS_recovery_timeout_ms, 20000);
  absl::SetFlag(&FLAGS_coordinator_timeout_ms, 45000);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->checkpoint_dir(), "/tmp/ckpts");
  EXPECT_EQ(config->checkpoint_every_steps(), 100u);
  EXPECT_EQ(config->checkpoint_every_seconds(), 30u);
  EXPECT_EQ(config->recovery_timeout_ms(), 20000u);
  EXPECT_EQ(config->coordinator_timeout_ms(), 45000u);
}

TEST(JobFlags, PeriodicCheckpointsNeedACheckpointDir) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_checkpoint_every_steps, 100);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("checkpoint_dir"), std::string::npos);
}

TEST(JobFlags, FlagsSetTheirFields) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_mode, "async");
  absl::SetFlag(&FLAGS_hidden, "32");
  absl::SetFlag(&FLAGS_wire_dtype, "bf16");
  absl::SetFlag(&FLAGS_chunk_kb, 8);
  absl::SetFlag(&FLAGS_part_kb, 1024);
  absl::SetFlag(&FLAGS_workers, 5);
  absl::SetFlag(&FLAGS_lr, 0.5f);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mode(), v1::MODE_ASYNC);
  ASSERT_EQ(config->hidden_units_size(), 1);
  EXPECT_EQ(config->hidden_units(0), 32u);
  EXPECT_EQ(config->wire_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(config->chunk_bytes(), 8u * 1024);
  EXPECT_EQ(config->part_bytes(), 1024u * 1024);
  EXPECT_EQ(config->num_workers(), 5u);
  EXPECT_FLOAT_EQ(config->optimizer().learning_rate(), 0.5f);
}

TEST(JobFlags, SoftmaxModelHasNoHiddenLayers) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_model, "softmax");  // --hidden keeps its default
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model(), v1::MODEL_SOFTMAX);
  EXPECT_EQ(config->hidden_units_size(), 0);
}

TEST(JobFlags, EmptyHiddenMeansAnMlpWithoutHiddenLayers) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_hidden, "");
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->hidden_units_size(), 0);
}

TEST(JobFlags, BadValuesNameTheirFlag) {
  {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_mode, "bsp");
    absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find("--mode"), std::string::npos);
  }
  {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_wire_dtype, "f64");
    EXPECT_NE(JobConfigFromFlags().status().message().find("--wire_dtype"),
              std::string::npos);
  }
  {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_hidden, "64,x");
    EXPECT_NE(JobConfigFromFlags().status().message().find("--hidden"),
              std::string::npos);
  }
  {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_chunk_kb, 0);
    EXPECT_NE(JobConfigFromFlags().status().message().find("--chunk_kb"),
              std::string::npos);
  }
  {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_chunk_kb, 16385);  // a chunk that no message could carry whole
    EXPECT_NE(JobConfigFromFlags().status().message().find("--chunk_kb"), std::string::npos);
  }
  for (uint64_t part_kb : {uint64_t{8}, uint64_t{16385}, uint64_t{1} << 60}) {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_part_kb, part_kb);
    EXPECT_NE(JobConfigFromFlags().status().message().find("--part_kb"), std::string::npos)
        << part_kb;
  }
  {
    absl::FlagSaver saver;
    absl::SetFlag(&FLAGS_batch, 0);  // caught by ValidateJobConfig
    absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find("batch_size"), std::string::npos);
  }
}

}  // namespace
}  // namespace grps
