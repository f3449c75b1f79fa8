// What a coordinator test builds around the class it tests: the job's
// collaborators, built from its config and shard map as JobStateMachine's
// constructor builds them, and a folder for one test's files. For tests only.
//
//   class RollBacksTest : public ::testing::Test {
//     void SetUp() override {
//       config_ = TestJobConfig(1, 2, v1::MODE_ASYNC, folder_.path());
//       absl::StatusOr<v1::ShardMap> map = TestShardMap(config_);
//       ASSERT_TRUE(map.ok()) << map.status();
//       parts_ = std::make_unique<TestJobParts>(config_, *map);
//       roll_backs_ = std::make_unique<RollBacks>(RollBacks::Parts{
//           .job_id = config_.job_id(), .generations = &parts_->generations, ...});
//     }
//     TestFolder folder_{"roll_backs_test"};
//     v1::JobConfig config_;
//     std::unique_ptr<TestJobParts> parts_;  // before the class under test
//     std::unique_ptr<RollBacks> roll_backs_;
//   };
#ifndef GRPS_COORDINATOR_TESTING_JOB_PARTS_H_
#define GRPS_COORDINATOR_TESTING_JOB_PARTS_H_

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/time/time.h"
#include "coordinator/checkpoint_cuts.h"
#include "coordinator/checkpoint_scheduler.h"
#include "coordinator/elastic_data.h"
#include "coordinator/generations.h"
#include "coordinator/global_step.h"
#include "coordinator/job_ending.h"
#include "coordinator/job_model.h"
#include "coordinator/job_phase.h"
#include "coordinator/job_waits.h"
#include "coordinator/membership.h"
#include "coordinator/resharding.h"
#include "daemon/env.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "proto/grps.pb.h"

namespace grps {

// The collaborators JobStateMachine builds from its config and map, built
// the same way (generations on Env::Default()); the classes that take them
// as their Parts (Heartbeats, ServerRequests, WorkerRequests, JobReport,
// RollBacks) are the tests' own. `config` must outlive the parts: JobModel
// keeps a reference to it. Several parts point at others, so the whole is
// neither copied nor moved; a fixture holds it in a std::unique_ptr declared
// before the class under test, which points into it.
struct TestJobParts {
  TestJobParts(const v1::JobConfig& config, v1::ShardMap shard_map)
      : phase(config.job_id()),
        membership(std::move(shard_map), JobRanks(config),
                   absl::Milliseconds(config.heartbeat_timeout_ms()), config.num_workers()),
        checkpoints(config, config.num_servers()),
        model(config),
        generations(config, Env::Default()),
        resharding(config),
        cuts(config, &checkpoints, &membership, &global_step),
        ending(config.job_id(), &membership) {}
  // Deleting the copy leaves no move either.
  TestJobParts(const TestJobParts&) = delete;
  TestJobParts& operator=(const TestJobParts&) = delete;

  JobWaits waits;
  JobPhase phase;
  Membership membership;
  CheckpointScheduler checkpoints;
  JobModel model;
  Generations generations;
  GlobalStep global_step;
  ElasticData data;
  Resharding resharding;
  CheckpointCuts cuts;  // reads membership and global_step, asks checkpoints
  JobEnding ending;     // reads membership
};

// A folder for the files of the test now running, under the system's
// temporary folder, named `prefix`-<process id>-<test name>: empty when
// made (nothing is created until the test writes there), removed with what
// it holds when destroyed. Construct it while the test runs (a fixture's
// member will do).
class TestFolder {
 public:
  explicit TestFolder(const std::string& prefix)
      : path_((std::filesystem::temp_directory_path() /
               (prefix + "-" + std::to_string(getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                  .string()) {
    std::filesystem::remove_all(path_);
  }
  ~TestFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TestFolder(const TestFolder&) = delete;
  TestFolder& operator=(const TestFolder&) = delete;

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_TESTING_JOB_PARTS_H_
