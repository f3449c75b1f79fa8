#include "coordinator/job_flags.h"

#include <string>

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
ABSL_DECLARE_FLAG(uint32_t, batch);
ABSL_DECLARE_FLAG(uint32_t, workers);
ABSL_DECLARE_FLAG(float, lr);
ABSL_DECLARE_FLAG(std::string, checkpoint_dir);
ABSL_DECLARE_FLAG(uint64_t, checkpoint_every_steps);
ABSL_DECLARE_FLAG(uint32_t, checkpoint_every_s);
ABSL_DECLARE_FLAG(uint32_t, recovery_timeout_ms);
ABSL_DECLARE_FLAG(uint32_t, coordinator_timeout_ms);

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
  absl::SetFlag(&FLAGS_workers, 5);
  absl::SetFlag(&FLAGS_lr, 0.5f);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mode(), v1::MODE_ASYNC);
  ASSERT_EQ(config->hidden_units_size(), 1);
  EXPECT_EQ(config->hidden_units(0), 32u);
  EXPECT_EQ(config->wire_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(config->chunk_bytes(), 8u * 1024);
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
    absl::SetFlag(&FLAGS_batch, 0);  // caught by ValidateJobConfig
    absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(config.status().message().find("batch_size"), std::string::npos);
  }
}

}  // namespace
}  // namespace grps
