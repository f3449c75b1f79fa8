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
