// JobModel as a specification: the first user model offer defines the
// layout, an equal one changes nothing, another is refused naming the
// tensor; a built-in model takes no offer; the program's optimizer is the
// defining offer's; members get the tensors and the shard count they serve.
#include "coordinator/job_model.h"

#include <string>

#include "coordinator/testing/test_job.h"
#include "gtest/gtest.h"
#include "job/job_config.h"

namespace grps {
namespace {

v1::JobConfig UserJob() {
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("model-job");
  config.set_model(v1::MODEL_USER);
  config.set_num_servers(2);
  return config;
}

TEST(JobModel, TheFirstOfferDefinesTheLayoutAndAnEqualOneChangesNothing) {
  const v1::JobConfig config = UserJob();
  JobModel model(config);
  EXPECT_TRUE(model.awaiting_definition());
  absl::StatusOr<std::optional<v1::ShardMap>> layout =
      model.Define(TestUserModel(16), v1::OPTIMIZER_UNSPECIFIED, 2);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_TRUE(layout->has_value());
  EXPECT_EQ((*layout)->tensors_size(), 3);
  EXPECT_EQ((*layout)->shards_size(), 2);
  EXPECT_FALSE(model.awaiting_definition());
  absl::StatusOr<std::optional<v1::ShardMap>> again =
      model.Define(TestUserModel(16), v1::OPTIMIZER_UNSPECIFIED, 2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->has_value());
}

TEST(JobModel, AnotherModelIsRefusedNamingTheFirstTensorThatDiffers) {
  const v1::JobConfig config = UserJob();
  JobModel model(config);
  ASSERT_TRUE(model.Define(TestUserModel(16), v1::OPTIMIZER_UNSPECIFIED, 2).ok());
  absl::StatusOr<std::optional<v1::ShardMap>> other =
      model.Define(TestUserModel(32), v1::OPTIMIZER_UNSPECIFIED, 2);
  ASSERT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();
  EXPECT_NE(other.status().message().find("fc.weight"), std::string::npos) << other.status();
}

TEST(JobModel, ABuiltInModelTakesNoOfferAndABadOfferIsRefused) {
  v1::JobConfig built_in = UserJob();
  built_in.set_model(v1::MODEL_MLP);
  JobModel mlp(built_in);
  EXPECT_FALSE(mlp.awaiting_definition());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      mlp.Define(TestUserModel(16), v1::OPTIMIZER_UNSPECIFIED, 2).status()));
  const v1::JobConfig config = UserJob();
  JobModel model(config);
  EXPECT_TRUE(absl::IsInvalidArgument(model.Define(TensorSpecs(), v1::OPTIMIZER_UNSPECIFIED, 2)
                                          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      model.Define(TestUserModel(16), static_cast<v1::OptimizerKind>(99), 2).status()));
  EXPECT_TRUE(model.awaiting_definition());
}

TEST(JobModel, MembersGetTheTensorsTheProgramsOptimizerAndTheirShardCount) {
  v1::JobConfig config = UserJob();
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_SGD);
  JobModel model(config);
  ASSERT_TRUE(model.Define(TestUserModel(16), v1::OPTIMIZER_ADAM, 2).ok());
  ASSERT_TRUE(model.Define(TestUserModel(16), v1::OPTIMIZER_SGD, 2).ok());  // a later offer's: ignored
  const v1::JobConfig member = model.MemberConfig(3);
  EXPECT_EQ(member.model_tensors_size(), 3);
  EXPECT_EQ(member.optimizer().kind(), v1::OPTIMIZER_ADAM);
  EXPECT_EQ(member.num_servers(), 3u);
}

}  // namespace
}  // namespace grps
