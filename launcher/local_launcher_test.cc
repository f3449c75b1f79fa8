#include "launcher/local_launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon/daemon.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/grps.grpc.pb.h"
#include "test/temp_folders.h"

namespace grps {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A new folder, removed when the test process exits (children are forked,
// but leave with _exit and never run that).
std::string TempDir() {
  static TempFolders folders;
  return folders.Make("local_launcher_test");
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

LaunchOptions Options() {
  LaunchOptions o;
  o.bin_dir = "/opt/grps/bin";
  o.run_dir = "/tmp/runs/sync-1";
  o.job_id = "sync-1";
  o.mode = "ssp";
  o.servers = 3;
  o.workers = 4;
  o.backend = "cpu";
  o.job_flags = {{"steps", "50"}, {"lr", "0.1"}};
  return o;
}

// ---- Pure parts -------------------------------------------------------------

TEST(CoordinatorSpec, ListensOnLoopbackWritesAPortFileAndPassesOnlySetJobFlags) {
  ChildSpec spec = CoordinatorSpec(Options());
  EXPECT_EQ(spec.name, "coordinator");
  EXPECT_EQ(spec.log_path, "/tmp/runs/sync-1/coordinator.log");
  EXPECT_EQ(spec.argv, (std::vector<std::string>{
                           "/opt/grps/bin/grps-coordinator",
                           "--listen=127.0.0.1:0",
                           "--port_file=/tmp/runs/sync-1/coordinator.port",
                           "--state_dir=/tmp/runs/sync-1",
                           "--job_id=sync-1", "--mode=ssp", "--servers=3",
                           "--workers=4", "--steps=50", "--lr=0.1"}));
}

TEST(CoordinatorSpec, ARestartListensOnTheSamePort) {
  ChildSpec spec = CoordinatorSpec(Options(), 40123);
  EXPECT_EQ(spec.argv[1], "--listen=127.0.0.1:40123");
  EXPECT_EQ(spec.argv[3], "--state_dir=/tmp/runs/sync-1");
}

TEST(MetricsTargets, EveryDaemonServesMetricsOnItsOwnPortAfterTheCoordinators) {
  LaunchOptions options = Options();  // 3 servers, 4 workers
  EXPECT_TRUE(MetricsTargets(options).empty());
  const std::vector<std::string> plain = CoordinatorSpec(options).argv;
  EXPECT_EQ(std::count_if(plain.begin(), plain.end(),
                          [](const std::string& a) {
                            return absl::StartsWith(a, "--metrics_listen");
                          }),
            0);
  options.metrics = LaunchOptions::MetricsPorts{"127.0.0.1", 9464};
  const std::vector<MetricsTarget> targets = MetricsTargets(options);
  ASSERT_EQ(targets.size(), 8u);
  EXPECT_EQ(targets[0].daemon, "coordinator");
  EXPECT_EQ(targets[0].address, "127.0.0.1:9464");
  EXPECT_EQ(targets[3].daemon, "server-2");
  EXPECT_EQ(targets[3].address, "127.0.0.1:9467");
  EXPECT_EQ(targets[7].daemon, "worker-3");
  EXPECT_EQ(targets[7].address, "127.0.0.1:9471");
  // Each daemon is started with the address its target names, a restarted
  // coordinator too.
  EXPECT_EQ(CoordinatorSpec(options, 40123).argv.back(), "--metrics_listen=127.0.0.1:9464");
  EXPECT_EQ(ServerSpec(options, 2, "127.0.0.1:4000").argv.back(),
            "--metrics_listen=127.0.0.1:9467");
  EXPECT_EQ(WorkerSpec(options, 3, "127.0.0.1:4000").argv.back(),
            "--metrics_listen=127.0.0.1:9471");
  EXPECT_EQ(PrometheusTargetsJson({targets[0], targets[7]}, "sync-1"),
            "[\n"
            "  {\"targets\": [\"127.0.0.1:9464\"], \"labels\": {\"grps_job\": \"sync-1\", "
            "\"daemon\": \"coordinator\"}},\n"
            "  {\"targets\": [\"127.0.0.1:9471\"], \"labels\": {\"grps_job\": \"sync-1\", "
            "\"daemon\": \"worker-3\"}}\n"
            "]\n");
}

TEST(CoordinatorSpec, GetsTheTlsFilesButNotTheServerNameOnlyDialersCheck) {
  LaunchOptions options = Options();
  options.tls_flags = {"--tls_cert=c.pem", "--tls_key=k.pem", "--tls_ca=ca.pem",
                       "--tls_server_name=grps"};
  const std::vector<std::string> argv = CoordinatorSpec(options).argv;
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--tls_ca=ca.pem"), 1);
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--tls_server_name=grps"), 0);
  const std::vector<std::string> server = ServerSpec(options, 0, "127.0.0.1:1").argv;
  EXPECT_EQ(std::count(server.begin(), server.end(), "--tls_server_name=grps"), 1);
}

TEST(ServerSpec, NamesTheCoordinatorItsShardAndLoopback) {
  ChildSpec spec = ServerSpec(Options(), 2, "127.0.0.1:4000");
  EXPECT_EQ(spec.name, "server-2");
  EXPECT_EQ(spec.log_path, "/tmp/runs/sync-1/server-2.log");
  EXPECT_EQ(spec.argv, (std::vector<std::string>{
                           "/opt/grps/bin/grps-server", "--coordinator=127.0.0.1:4000",
                           "--listen=127.0.0.1:0", "--shard=2"}));
}

TEST(WorkerSpec, NamesItsRankBackendAndCurveFileInTheRunDir) {
  LaunchOptions o = Options();
  o.workers = 1;
  ChildSpec spec = WorkerSpec(o, 3, "127.0.0.1:4000");
  EXPECT_EQ(spec.name, "worker-3");
  EXPECT_EQ(spec.log_path, "/tmp/runs/sync-1/worker-3.log");
  EXPECT_EQ(spec.argv,
            (std::vector<std::string>{
                "/opt/grps/bin/grps-worker", "--coordinator=127.0.0.1:4000",
                "--rank=3", "--backend=cpu",
                absl::StrCat("--blas_threads=", UsableCores()),
                "--curve_csv=/tmp/runs/sync-1/curve-worker-3.csv"}));
}

TEST(WorkerSpec, WorkersShareTheUsableCoresForTheirBlasThreads) {
  LaunchOptions o = Options();
  o.workers = 2 * UsableCores();  // more workers than cores: one thread each
  EXPECT_THAT(WorkerSpec(o, 0, "127.0.0.1:4000").argv, Contains("--blas_threads=1"));
  o.workers = 1;
  EXPECT_THAT(WorkerSpec(o, 0, "127.0.0.1:4000").argv,
              Contains(absl::StrCat("--blas_threads=", UsableCores())));
}

TEST(WorkerSpec, OnlyTheStragglerRankGetsTheStraggleFlags) {
  LaunchOptions o = Options();
  o.straggler_rank = 2;
  o.straggle_factor = 5;
  o.straggle_ms = 40;
  std::vector<std::string> straggler = WorkerSpec(o, 2, "127.0.0.1:4000").argv;
  EXPECT_THAT(straggler, Contains("--straggle_factor=5"));
  EXPECT_THAT(straggler, Contains("--straggle_ms=40"));
  EXPECT_EQ(straggler.size(), WorkerSpec(Options(), 2, "127.0.0.1:4000").argv.size() + 2);
  for (uint32_t rank : {0, 1, 3})
    EXPECT_THAT(WorkerSpec(o, rank, "127.0.0.1:4000").argv,
                Not(Contains(StartsWith("--straggle"))))
        << rank;
  // Only the flags that are set.
  o.straggle_factor = 1.5;
  o.straggle_ms.reset();
  straggler = WorkerSpec(o, 2, "127.0.0.1:4000").argv;
  EXPECT_THAT(straggler, Contains("--straggle_factor=1.5"));
  EXPECT_THAT(straggler, Not(Contains(StartsWith("--straggle_ms"))));
}

// The value a spec gives `name` in its child's environment ("" removes
// it), or nothing when the spec leaves it as the launcher's.
std::optional<std::string> EnvironmentValue(const ChildSpec& spec, const std::string& name) {
  std::optional<std::string> value;
  for (const auto& [n, v] : spec.environment)
    if (n == name) value = v;
  return value;
}

// Sets an environment variable (nullptr: unsets it) for one scope.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedVariable() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  const std::string name_;
  std::optional<std::string> old_;
};

TEST(WorkerSpec, AnEntryWorkerRunsTheCommandThroughTheShellWithTheJobInItsEnvironment) {
  LaunchOptions o = Options();  // 4 workers, job sync-1
  o.entry = "python3 train.py --name 'a b' \"$HOME\"";
  o.token = "admin-secret";
  o.worker_token = "worker-secret";
  ChildSpec spec = WorkerSpec(o, 3, "127.0.0.1:4000");
  EXPECT_EQ(spec.name, "worker-3");
  EXPECT_EQ(spec.log_path, "/tmp/runs/sync-1/worker-3.log");
  // exec: the shell becomes the program, which is what the launcher signals.
  EXPECT_EQ(spec.argv, (std::vector<std::string>{
                           "/bin/sh", "-c", "exec python3 train.py --name 'a b' \"$HOME\""}));
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_COORDINATOR"), "127.0.0.1:4000");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_RANK"), "3");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_WORKERS"), "4");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_JOB_ID"), "sync-1");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_RUN_DIR"), "/tmp/runs/sync-1");
  // Every worker runs on this host: its local rank is its rank, and torchrun's
  // variables say the same.
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_LOCAL_RANK"), "3");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_LOCAL_SIZE"), "4");
  EXPECT_EQ(EnvironmentValue(spec, "RANK"), "3");
  EXPECT_EQ(EnvironmentValue(spec, "WORLD_SIZE"), "4");
  EXPECT_EQ(EnvironmentValue(spec, "LOCAL_RANK"), "3");
  EXPECT_EQ(EnvironmentValue(spec, "LOCAL_WORLD_SIZE"), "4");
  // Where grps.torch writes the curve the program reports.
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_CURVE_CSV"), "/tmp/runs/sync-1/curve-worker-3.csv");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_STRAGGLE_FACTOR"), std::nullopt);
  o.straggler_rank = 3;
  o.straggle_factor = 5;
  o.straggle_ms = 40;
  EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 3, "127.0.0.1:4000"), "GRPS_STRAGGLE_FACTOR"), "5");
  EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 3, "127.0.0.1:4000"), "GRPS_STRAGGLE_MS"), "40");
  EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 2, "127.0.0.1:4000"), "GRPS_STRAGGLE_MS"), std::nullopt);
  // The worker token only, as grps-worker gets it: the admin token removed.
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_WORKER_TOKEN"), "worker-secret");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_TOKEN"), "");
  EXPECT_EQ(EnvironmentValue(WorkerSpec(Options(), 3, "127.0.0.1:4000"), "GRPS_TOKEN"), "");
  // Authentication off: no worker token either, whatever the launcher has.
  o.worker_token.clear();
  EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 3, "127.0.0.1:4000"), "GRPS_WORKER_TOKEN"), "");
}

TEST(WorkerSpec, AnEntryWorkerGetsTheTlsFlagsAsVariablesAndNoneTheLaunchLacks) {
  LaunchOptions o = Options();
  o.entry = "python3 train.py";
  ChildSpec plain = WorkerSpec(o, 0, "127.0.0.1:4000");
  for (const char* name : {"GRPS_TLS_CERT", "GRPS_TLS_KEY", "GRPS_TLS_CA",
                           "GRPS_TLS_CLIENT_AUTH", "GRPS_TLS_SERVER_NAME"})
    EXPECT_EQ(EnvironmentValue(plain, name), "") << name;
  o.tls_flags = {"--tls_cert=/pki/c.pem", "--tls_key=/pki/k.pem", "--tls_ca=/pki/ca.pem",
                 "--tls_client_auth", "--tls_server_name=grps.test"};
  ChildSpec spec = WorkerSpec(o, 0, "127.0.0.1:4000");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_TLS_CERT"), "/pki/c.pem");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_TLS_KEY"), "/pki/k.pem");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_TLS_CA"), "/pki/ca.pem");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_TLS_CLIENT_AUTH"), "true");
  EXPECT_EQ(EnvironmentValue(spec, "GRPS_TLS_SERVER_NAME"), "grps.test");
  EXPECT_EQ(spec.argv.size(), 3u);  // nothing added to the user's command
}

TEST(WorkerSpec, AnEntryWorkerFindsTheBuildTreesPythonPackageFirst) {
  const std::string build = TempDir();
  std::filesystem::create_directories(build + "/bin");
  LaunchOptions o = Options();
  o.entry = "python3 train.py";
  o.bin_dir = build + "/bin/";
  {
    // No package built there: PYTHONPATH is the launcher's.
    ScopedVariable pythonpath("PYTHONPATH", "/site");
    EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 0, "127.0.0.1:4000"), "PYTHONPATH"),
              std::nullopt);
  }
  std::filesystem::create_directories(build + "/python/grps");
  std::ofstream(build + "/python/grps/__init__.py") << "\n";
  {
    ScopedVariable pythonpath("PYTHONPATH", "/site:/more");
    EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 0, "127.0.0.1:4000"), "PYTHONPATH"),
              build + "/python:/site:/more");
  }
  {
    ScopedVariable pythonpath("PYTHONPATH", nullptr);
    EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 0, "127.0.0.1:4000"), "PYTHONPATH"),
              build + "/python");
  }
  // grps-worker needs no Python.
  o.entry.clear();
  EXPECT_EQ(EnvironmentValue(WorkerSpec(o, 0, "127.0.0.1:4000"), "PYTHONPATH"), std::nullopt);
}

TEST(MetricsTargets, EntryWorkersServeNone) {
  LaunchOptions options = Options();  // 3 servers, 4 workers
  options.entry = "python3 train.py";
  options.metrics = LaunchOptions::MetricsPorts{"127.0.0.1", 9464};
  const std::vector<MetricsTarget> targets = MetricsTargets(options);
  ASSERT_EQ(targets.size(), 4u);
  EXPECT_EQ(targets[0].daemon, "coordinator");
  EXPECT_EQ(targets[3].daemon, "server-2");
  EXPECT_EQ(ServerSpec(options, 2, "127.0.0.1:4000").argv.back(),
            "--metrics_listen=127.0.0.1:9467");
  EXPECT_THAT(WorkerSpec(options, 0, "127.0.0.1:4000").argv,
              Not(Contains(StartsWith("--metrics_listen"))));
}

TEST(DefaultRunDir, IsModeAndLocalTimestampUnderRuns) {
  absl::TimeZone utc = absl::UTCTimeZone();
  absl::Time t = absl::FromCivil(absl::CivilSecond(2024, 3, 9, 7, 5, 1), utc);
  EXPECT_EQ(DefaultRunDir("async", t, utc), "runs/async-20240309-070501");
}

TEST(ParsePort, AcceptsOnlyAPortNumber) {
  EXPECT_EQ(ParsePort("40123\n").value(), 40123);
  EXPECT_FALSE(ParsePort("").ok());
  EXPECT_FALSE(ParsePort("0\n").ok());
  EXPECT_FALSE(ParsePort("70000").ok());
  EXPECT_FALSE(ParsePort("12ab").ok());
}

TEST(TailOfFile, KeepsTheLastLines) {
  std::string path = TempDir() + "/log";
  {
    std::ofstream f(path);
    for (int i = 1; i <= 30; ++i) f << "line " << i << "\n";
  }
  EXPECT_EQ(TailOfFile(path, 3), "line 28\nline 29\nline 30\n");
  EXPECT_EQ(Lines(TailOfFile(path, 100)).size(), 30u);
  EXPECT_THAT(TailOfFile(path + ".missing", 3), HasSubstr("cannot read"));
}

v1::JobStatus FinishedJob() {
  v1::JobStatus s;
  s.set_job_id("sync-1");
  s.set_state(v1::JOB_STATE_COMPLETED);
  s.set_mode(v1::MODE_SYNC);
  v1::JobConfig* c = s.mutable_config();
  c->set_mode(v1::MODE_SYNC);
  c->set_model(v1::MODEL_SOFTMAX);
  c->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
  c->set_num_servers(2);
  c->set_num_workers(2);
  s.set_total_steps(50);
  s.set_global_step(50);
  for (int r = 0; r < 2; ++r) {
    v1::WorkerStatus* w = s.add_workers();
    w->set_rank(r);
    w->set_state(v1::MEMBER_STATE_FINISHED);
    w->mutable_progress()->set_step(50);
    w->mutable_progress()->set_total_steps(50);
    w->mutable_progress()->set_samples(3200);
  }
  s.set_has_final_eval(true);
  s.set_final_test_accuracy(0.85f);
  s.set_final_test_loss(0.42f);
  return s;
}

TEST(ResultOf, TakesTheJobsFiguresFromItsLastStatus) {
  RunResult r = ResultOf(Options(), FinishedJob(), FinishedJob(), 4.0);
  EXPECT_EQ(r.mode, "sync");
  EXPECT_EQ(r.model, "softmax");
  EXPECT_EQ(r.optimizer, "adam");
  EXPECT_EQ(r.servers, 2u);
  EXPECT_EQ(r.workers, 2u);
  EXPECT_EQ(r.steps, 50u);
  v1::JobStatus stopped_early = FinishedJob();
  stopped_early.mutable_workers(0)->mutable_progress()->set_step(20);
  stopped_early.mutable_workers(1)->mutable_progress()->set_step(30);
  EXPECT_EQ(ResultOf(Options(), stopped_early, std::nullopt, 4.0).steps, 25u);
  EXPECT_DOUBLE_EQ(r.samples_per_sec, 6400 / 4.0);  // all workers' samples / wall
  ASSERT_TRUE(r.final_test_accuracy.has_value());
  EXPECT_NEAR(*r.final_test_accuracy, 0.85, 1e-6);
  EXPECT_NEAR(*r.final_test_loss, 0.42, 1e-6);
  EXPECT_EQ(r.run_dir, "/tmp/runs/sync-1");
}

// The issue's drill: rank 1 was killed, restarted, and ran its program's
// whole loop again, training on alone to 2,653 after rank 0 finished at
// 1,872; the shards ended at 1,961. Neither rank's count is the job's.
v1::JobStatus EntryJobWithARestartedRank(v1::JobState state) {
  v1::JobStatus s = FinishedJob();
  s.set_state(state);
  s.mutable_config()->set_model(v1::MODEL_USER);
  s.set_total_steps(1872);  // the most a worker reported
  s.set_global_step(1961);
  s.mutable_workers(0)->mutable_progress()->set_step(1872);
  s.mutable_workers(0)->mutable_progress()->set_total_steps(1872);
  s.mutable_workers(1)->mutable_progress()->set_step(2653);
  s.mutable_workers(1)->mutable_progress()->set_total_steps(2653);
  for (uint32_t shard = 0; shard < 2; ++shard) {
    v1::ShardStatus* shard_status = s.add_shards();
    shard_status->set_shard(shard);
    shard_status->set_num_chunks(4);
    shard_status->set_version(1961);
  }
  return s;
}

TEST(ResultOf, AnEntryJobsStepsAreTheShardsNotAMeanOverItsWorkers) {
  LaunchOptions entry = Options();
  entry.entry = "python3 train.py";
  const v1::JobStatus s = EntryJobWithARestartedRank(v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(ResultOf(entry, s, std::nullopt, 1.0).steps, 1961u);  // not (1872 + 2653) / 2
  EXPECT_EQ(ResultOf(Options(), s, std::nullopt, 1.0).steps, 2263u);  // grps-worker's: the mean
}

TEST(EntryProgressOf, IsTheJobsStepFromTheShardsOutOfTheJobsSteps) {
  v1::JobStatus s = EntryJobWithARestartedRank(v1::JOB_STATE_RUNNING);
  s.set_global_step(1500);
  s.set_total_steps(1872);
  s.mutable_workers(1)->mutable_progress()->set_step(1530);
  JobProgress p = EntryProgressOf(s);
  EXPECT_DOUBLE_EQ(p.step, 1500);
  EXPECT_EQ(p.total, 1872u);
  EXPECT_THAT(ProgressLine(p, 12.0), HasSubstr("step 1500/1872 (80%)"));
  // The job's --steps is its count, whatever a worker reported.
  s.mutable_config()->set_steps(2000);
  EXPECT_EQ(EntryProgressOf(s).total, 2000u);
  // Async and ssp: a shard version a gradient, so the step is per worker.
  s.mutable_config()->set_mode(v1::MODE_ASYNC);
  s.set_global_step(3000);
  EXPECT_DOUBLE_EQ(EntryProgressOf(s).step, 1500);
}

TEST(EntryProgressOf, AJobWhoseStepsNoOneSaidHasNoTotal) {
  v1::JobStatus s = EntryJobWithARestartedRank(v1::JOB_STATE_RUNNING);
  s.set_total_steps(0);
  for (v1::WorkerStatus& w : *s.mutable_workers()) w.mutable_progress()->set_total_steps(0);
  s.set_global_step(700);
  JobProgress p = EntryProgressOf(s);
  EXPECT_DOUBLE_EQ(p.step, 700);
  EXPECT_EQ(p.total, 0u);
  EXPECT_THAT(ProgressLine(p, std::nullopt), HasSubstr("step 700 (0%)"));
  EXPECT_THAT(ProgressLine(p, std::nullopt), HasSubstr("ETA ?"));
}

// An elastic async job said "730 steps per worker, 2 workers": the mean
// over ranks that trained 400, 2331 and 80 steps, without the one that
// joined.
TEST(RankStepsText, AnElasticJobsLineSaysEachRanksStepsAndTheRanksThatJoined) {
  v1::JobStatus s;
  s.mutable_config()->set_num_workers(2);
  EXPECT_EQ(RankStepsText(s), "");  // not elastic
  s.mutable_config()->set_max_workers(3);
  EXPECT_EQ(RankStepsText(s), "");  // no rank trained
  for (const auto& [rank, step] : std::vector<std::pair<uint32_t, uint64_t>>{
           {0, 400}, {1, 2331}, {2, 80}, {1, 12}}) {  // rank 1's first incarnation died at 12
    v1::WorkerStatus* w = s.add_workers();
    w->set_rank(rank);
    w->mutable_progress()->set_step(step);
  }
  EXPECT_EQ(RankStepsText(s), "3 ranks trained 2811 steps (rank 0: 400, rank 1: 2331, rank 2: 80)");
}

TEST(ShardStepsText, SaysTheShardsFinalVersionAndWhetherTheyAgree) {
  v1::JobStatus s = EntryJobWithARestartedRank(v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(ShardStepsText(s), "1961 steps (every shard at version 1961)");
  s.mutable_shards(1)->set_version(1962);
  EXPECT_EQ(ShardStepsText(s), "shards at versions 1961, 1962: they differ");
  s.mutable_shards(1)->set_version(1961);
  s.mutable_config()->set_mode(v1::MODE_SSP);
  EXPECT_EQ(ShardStepsText(s), "every shard at version 1961 (a version a gradient)");
  // A shard that holds no chunks (a standby, sparse rows only) has no say.
  s.mutable_shards(1)->set_num_chunks(0);
  s.mutable_shards(1)->set_version(0);
  EXPECT_EQ(ShardStepsText(s), "every shard at version 1961 (a version a gradient)");
  s.clear_shards();
  EXPECT_EQ(ShardStepsText(s), "");
}

TEST(ResultOf, MergesTheShardsStalenessAndTakesTheJobsLateCounts) {
  v1::JobStatus s = FinishedJob();
  s.mutable_config()->set_backup_workers(1);
  s.mutable_config()->set_staleness_bound(4);
  s.set_late_gradients(7);
  s.set_too_stale(3);
  v1::ShardStatus* a = s.add_shards();
  a->set_staleness_mean(1.0);
  a->set_staleness_max(2);
  for (uint64_t n : {1, 2, 1}) a->add_staleness_histogram(n);  // mean 1 over 4
  v1::ShardStatus* b = s.add_shards();
  b->set_staleness_mean(3.0);
  b->set_staleness_max(9);
  for (uint64_t n : {0, 0, 0, 4}) b->add_staleness_histogram(n);  // mean 3 over 4
  RunResult r = ResultOf(Options(), s, std::nullopt, 1.0);
  EXPECT_EQ(r.backup_workers, 1u);
  EXPECT_EQ(r.staleness_bound, 4u);
  EXPECT_EQ(r.late_gradients, 7u);
  EXPECT_EQ(r.too_stale, 3u);
  EXPECT_DOUBLE_EQ(r.staleness_mean, 2.0);  // weighted by each shard's count
  EXPECT_EQ(r.staleness_max, 9u);
  EXPECT_EQ(r.staleness_histogram, (std::vector<uint64_t>{1, 2, 1, 4}));
}

TEST(ResultOf, SumsTheShardsLateCountsWhenTheJobLeftThemOut) {
  v1::JobStatus s = FinishedJob();
  s.add_shards()->set_late_gradients(2);
  s.add_shards()->set_late_gradients(5);
  s.mutable_shards(1)->set_too_stale(1);
  RunResult r = ResultOf(Options(), s, std::nullopt, 1.0);
  EXPECT_EQ(r.late_gradients, 7u);
  EXPECT_EQ(r.too_stale, 1u);
}

TEST(ResultOf, FallsBackToTheLaunchOptionsWithoutAStatus) {
  RunResult r = ResultOf(Options(), std::nullopt, std::nullopt, 1.0);
  EXPECT_EQ(r.mode, "ssp");
  EXPECT_EQ(r.servers, 3u);
  EXPECT_EQ(r.workers, 4u);
  EXPECT_FALSE(r.final_test_accuracy.has_value());
}

google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct parsed;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  return parsed;
}

TEST(ResultJson, HasEveryFieldOfTheResult) {
  RunResult r = ResultOf(Options(), FinishedJob(), FinishedJob(), 4.0);
  google::protobuf::Struct json = ParseJson(ResultJson(r));
  const auto& f = json.fields();
  for (const char* key :
       {"mode", "servers", "workers", "model", "optimizer", "steps",
        "final_test_accuracy", "final_test_loss", "wall_seconds", "samples_per_sec",
        "run_dir", "started_unix", "workers_died", "workers_restarted", "backup_workers",
        "staleness_bound", "late_gradients", "too_stale", "staleness_mean",
        "staleness_max", "staleness_histogram", "clipped_steps", "gradient_norm",
        "overflow_steps", "loss_scale", "exit"})
    EXPECT_EQ(f.count(key), 1u) << key;
  EXPECT_EQ(f.count("error"), 0u);
  EXPECT_EQ(f.at("mode").string_value(), "sync");
  EXPECT_EQ(f.at("servers").number_value(), 2);
  EXPECT_EQ(f.at("steps").number_value(), 50);
  EXPECT_NEAR(f.at("final_test_accuracy").number_value(), 0.85, 1e-6);
  EXPECT_EQ(f.at("wall_seconds").number_value(), 4);
  EXPECT_EQ(f.at("samples_per_sec").number_value(), 1600);
  EXPECT_EQ(f.at("run_dir").string_value(), "/tmp/runs/sync-1");
  EXPECT_EQ(f.at("exit").string_value(), "ok");
}

TEST(ResultJson, CarriesTheConsistencyFiguresAndTheStartTime) {
  RunResult r = ResultOf(Options(), FinishedJob(), FinishedJob(), 4.0);
  r.started_unix = 1790000000.25;
  r.workers_died = 2;
  r.workers_restarted = 1;
  r.late_gradients = 12;
  r.too_stale = 3;
  r.staleness_mean = 1.5;
  r.staleness_max = 15;
  r.staleness_histogram = {4, 0, 7};
  r.backup_workers = 1;
  r.staleness_bound = 4;
  google::protobuf::Struct json = ParseJson(ResultJson(r));
  const auto& f = json.fields();
  EXPECT_DOUBLE_EQ(f.at("started_unix").number_value(), 1790000000.25);
  EXPECT_EQ(f.at("workers_died").number_value(), 2);
  EXPECT_EQ(f.at("workers_restarted").number_value(), 1);
  EXPECT_EQ(f.at("late_gradients").number_value(), 12);
  EXPECT_EQ(f.at("too_stale").number_value(), 3);
  EXPECT_EQ(f.at("staleness_mean").number_value(), 1.5);
  EXPECT_EQ(f.at("staleness_max").number_value(), 15);
  EXPECT_EQ(f.at("backup_workers").number_value(), 1);
  EXPECT_EQ(f.at("staleness_bound").number_value(), 4);
  const auto& histogram = f.at("staleness_histogram").list_value().values();
  ASSERT_EQ(histogram.size(), 3);
  EXPECT_EQ(histogram[0].number_value(), 4);
  EXPECT_EQ(histogram[2].number_value(), 7);
  r.staleness_histogram.clear();
  EXPECT_EQ(ParseJson(ResultJson(r)).fields().at("staleness_histogram").list_value()
                .values_size(),
            0);
}

TEST(ResultJson, UnknownFiguresAreNullAndAFailureSaysWhy) {
  RunResult r = ResultOf(Options(), std::nullopt, std::nullopt, 1.0);
  r.exit = "failed";
  r.error = "worker-1 exited with status 3: \"quoted\"\n";
  google::protobuf::Struct json = ParseJson(ResultJson(r));
  const auto& f = json.fields();
  EXPECT_TRUE(f.at("final_test_accuracy").has_null_value());
  EXPECT_EQ(f.at("exit").string_value(), "failed");
  EXPECT_EQ(f.at("error").string_value(), r.error);
}

std::string WriteCurve(const std::string& dir, const std::string& name,
                       const std::string& rows) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << "step,epoch,elapsed_s,unix_time,loss,samples_per_sec,"
                         "test_accuracy,test_loss,evaluated\n"
                      << rows;
  return path;
}

TEST(ReadCurveFile, FindsColumnsByNameAndWhetherAnyRowIsAnEvaluation) {
  std::string dir = TempDir();
  CurveFile c = ReadCurveFile(
      WriteCurve(dir, "a.csv", "1,0,0.5,1000.5,2.3,100,,,0\n2,0,1,1001,2.1,100,0.4,1.9,1\n"),
      "worker-0");
  EXPECT_EQ(c.label, "worker-0");
  EXPECT_EQ(c.step, 1);
  EXPECT_EQ(c.unix_time, 4);
  EXPECT_EQ(c.loss, 5);
  EXPECT_EQ(c.test_accuracy, 7);
  EXPECT_EQ(c.evaluated, 9);
  EXPECT_TRUE(c.has_rows);
  EXPECT_TRUE(c.has_evaluated);
  EXPECT_TRUE(c.has_training);
  c = ReadCurveFile(WriteCurve(dir, "b.csv", "1,0,0.5,1000.5,2.3,100,,,0\n"), "worker-1");
  EXPECT_TRUE(c.has_rows);
  EXPECT_FALSE(c.has_evaluated);
  // A program that reported only its final figures (gt.done): no loss.
  c = ReadCurveFile(WriteCurve(dir, "e.csv", "30,0,0.5,1000.5,-1,0,0.8,0.4,1\n"), "worker-1");
  EXPECT_TRUE(c.has_evaluated);
  EXPECT_FALSE(c.has_training);
  c = ReadCurveFile(WriteCurve(dir, "c.csv", ""), "worker-2");
  EXPECT_FALSE(c.has_rows);
  c = ReadCurveFile(dir + "/missing.csv", "worker-3");
  EXPECT_EQ(c.step, 0);
  EXPECT_FALSE(c.has_rows);
}

TEST(CurvesGnuplotScript, PlotsLossPerWorkerAndOnlyEvaluatedAccuracyAgainstLaunchTime) {
  CurveFile a{"/r/curve-worker-0.csv", "worker-0", 1, 4, 5, 7, 9, true, true, true};
  CurveFile b{"/r/curve-worker-1.csv", "worker-1", 1, 4, 5, 7, 9, true, false, true};
  std::string gp = CurvesGnuplotScript({a, b}, 1000.5, "/r/curves.svg");
  EXPECT_THAT(gp, HasSubstr("set output '/r/curves.svg'"));
  EXPECT_THAT(gp, HasSubstr("set multiplot layout 2,1"));
  // Evaluation rows (written out of step order) are left out of the loss.
  EXPECT_THAT(gp, HasSubstr("'/r/curve-worker-0.csv' skip 1 using 1:($9 == 1 ? NaN : $5) "
                            "with lines title 'worker-0'"));
  EXPECT_THAT(gp, HasSubstr("'/r/curve-worker-1.csv' skip 1 using 1:($9 == 1 ? NaN : $5) "
                            "with lines"));
  EXPECT_THAT(gp, HasSubstr("'/r/curve-worker-0.csv' skip 1 using ($4 - 1000.500):"
                            "($9 == 1 ? $7 : NaN)"));
  // worker-1 evaluated nothing: it is not in the accuracy panel.
  EXPECT_THAT(gp, Not(HasSubstr("evaluated by worker-1")));
  EXPECT_THAT(gp, Not(HasSubstr("no data")));
}

TEST(CurvesGnuplotScript, APanelWithNothingToDrawSaysNoData) {
  CurveFile empty{"/r/it's.csv", "worker-0", 1, 4, 5, 7, 9, false, false, false};
  std::string gp = CurvesGnuplotScript({empty}, 0, "/r/curves.svg");
  EXPECT_THAT(gp, HasSubstr("'no data'"));
  EXPECT_THAT(gp, Not(HasSubstr("it''s.csv")));  // never plotted
}

TEST(CurvesGnuplotScript, RealGnuplotDrawsTheSvg) {
  if (FindInSearchPath("gnuplot", "/usr/bin:/usr/local/bin").empty())
    GTEST_SKIP() << "no gnuplot";
  std::string dir = TempDir();
  std::vector<CurveFile> curves = {
      ReadCurveFile(WriteCurve(dir, "curve-worker-0.csv",
                               "1,0,0.5,1000.5,2.3,100,,,0\n2,0,1,1001,2.1,100,0.4,1.9,1\n"
                               "3,0,1.5,1001.5,1.9,100,,,0\n4,0,2,1002,1.7,100,0.6,1.2,1\n"),
                    "worker-0"),
      ReadCurveFile(WriteCurve(dir, "curve-worker-1.csv", "1,0,0.5,1000.5,2.2,100,,,0\n"),
                    "worker-1"),
      ReadCurveFile(WriteCurve(dir, "curve-worker-2.csv", ""), "worker-2"),
      // Evaluations only (an entry program's gt.done() figures): no loss line.
      ReadCurveFile(WriteCurve(dir, "curve-worker-3.csv", "30,0,0.5,1000.8,-1,0,0.7,0.6,1\n"),
                    "worker-3")};
  std::ofstream(dir + "/curves.gp") << CurvesGnuplotScript(curves, 1000, dir + "/curves.svg");
  ASSERT_EQ(std::system(("gnuplot " + dir + "/curves.gp").c_str()), 0);
  EXPECT_THAT(ReadFile(dir + "/curves.svg"), HasSubstr("<svg"));
  // Nothing to draw is still a picture, not an error.
  std::ofstream(dir + "/empty.gp") << CurvesGnuplotScript({}, 0, dir + "/empty.svg");
  ASSERT_EQ(std::system(("gnuplot " + dir + "/empty.gp").c_str()), 0);
  EXPECT_THAT(ReadFile(dir + "/empty.svg"), HasSubstr("no data"));
}

TEST(FindInSearchPath, FindsTheFirstExecutableInTheList) {
  std::string a = TempDir(), b = TempDir();
  std::ofstream(a + "/tool") << "not executable";
  std::ofstream(b + "/tool") << "#!/bin/sh\n";
  chmod((b + "/tool").c_str(), 0755);
  EXPECT_EQ(FindInSearchPath("tool", a + ":" + b), b + "/tool");
  EXPECT_EQ(FindInSearchPath("tool", a), "");
  EXPECT_EQ(FindInSearchPath("tool", ""), "");
}

// ---- The whole launch, with fake daemons --------------------------------------

// A coordinator that streams canned snapshots: `stream`, each after
// `interval`, ending the stream after the last.
class FakeCoordinator final : public v1::Coordinator::Service {
 public:
  explicit FakeCoordinator(std::vector<v1::JobStatus> stream,
                           absl::Duration interval = absl::Milliseconds(20))
      : stream_(std::move(stream)), interval_(interval) {}
  grpc::Status WatchJobStatus(grpc::ServerContext* context,
                              const v1::WatchJobStatusRequest* request,
                              grpc::ServerWriter<v1::JobStatus>* writer) override {
    for (const v1::JobStatus& s : stream_) {
      if (context->IsCancelled() || !writer->Write(s)) break;
      absl::SleepFor(interval_);
    }
    return grpc::Status::OK;
  }

 private:
  const std::vector<v1::JobStatus> stream_;
  const absl::Duration interval_;
};

// Every fake daemon records its argv (one per line) in $FAKE_DIR/<name>.args
// and its pid in <name>.pid, prints a line, then runs its behaviour with
// $id set to its name and $port_file to the coordinator's --port_file.
constexpr char kFakePrologue[] = R"(#!/bin/sh
id=coordinator
for a in "$@"; do
  case "$a" in
    --rank=*) id="worker-${a#--rank=}";;
    --shard=*) id="server-${a#--shard=}";;
    --port_file=*) port_file="${a#--port_file=}";;
  esac
done
printf '%s\n' "$@" > "$FAKE_DIR/$id.args"
echo $$ > "$FAKE_DIR/$id.pid"
echo $$ >> "$FAKE_DIR/$id.starts"
echo "$id is up"
)";

// Writes the coordinator's port atomically, as grps-coordinator does.
constexpr char kWritePort[] =
    "printf '%s\\n' \"$FAKE_PORT\" > \"$port_file.tmp\" && "
    "mv \"$port_file.tmp\" \"$port_file\"\n";

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("FAKE_DIR", fake_dir_.c_str(), 1);
    options_.bin_dir = TempDir();
    options_.run_dir = TempDir() + "/run";
    options_.job_id = "test-job";
    options_.mode = "async";
    options_.servers = 2;
    options_.workers = 2;
    options_.job_flags = {{"steps", "50"}};
    options_.status_interval = absl::Milliseconds(20);
    options_.stop_grace = absl::Seconds(2);
    options_.result_json = options_.run_dir + "/result.json";
    options_.plot_search_path = "";  // no gnuplot unless a test asks for one
  }

  void TearDown() override {
    if (server_.server) server_.server->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  // Serves `stream` from an in-process fake; the fake coordinator hands its
  // port to the launcher.
  void ServeStatus(std::vector<v1::JobStatus> stream,
                   absl::Duration interval = absl::Milliseconds(20)) {
    // A second call replaces the fake: the server that calls the old one
    // (maybe in a handler still) goes first.
    if (server_.server) {
      server_.server->Shutdown(absl::ToChronoTime(absl::Now()));
      server_.server.reset();
    }
    fake_ = std::make_unique<FakeCoordinator>(std::move(stream), interval);
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {fake_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    setenv("FAKE_PORT", absl::StrCat(server_.port).c_str(), 1);
  }

  void WriteFake(const std::string& binary, const std::string& behaviour) {
    std::string path = options_.bin_dir + "/" + binary;
    std::ofstream(path) << kFakePrologue << behaviour;
    chmod(path.c_str(), 0755);
  }

  // Runs the launcher; returns its exit code, its output in *out.
  int Launch(std::string* out, std::function<bool()> interrupted = [] { return false; }) {
    std::FILE* f = std::tmpfile();
    LocalLauncher launcher(options_, f, std::move(interrupted));
    int code = launcher.Run();
    std::fflush(f);
    std::rewind(f);
    out->clear();
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
    std::fclose(f);
    return code;
  }

  std::string Args(const std::string& name) {
    return ReadFile(fake_dir_ + "/" + name + ".args");
  }

  // Every fake that started is gone (exited and reaped by the launcher).
  void ExpectNoFakeLeft() {
    std::vector<std::string> names = {"coordinator"};
    for (uint32_t i = 0; i < options_.servers; ++i) names.push_back(absl::StrCat("server-", i));
    for (uint32_t i = 0; i < options_.workers; ++i) names.push_back(absl::StrCat("worker-", i));
    for (const std::string& name : names) {
      std::string pid_text = ReadFile(fake_dir_ + "/" + name + ".pid");
      if (pid_text.empty()) continue;
      pid_t pid = std::atoi(pid_text.c_str());
      errno = 0;
      EXPECT_EQ(kill(pid, 0), -1) << name << " (pid " << pid << ") is still there";
      EXPECT_EQ(errno, ESRCH) << name;
    }
  }

  const std::string fake_dir_ = TempDir();
  LaunchOptions options_;
  std::unique_ptr<FakeCoordinator> fake_;
  GrpcServer server_;
};

v1::JobStatus RunningJob() {
  v1::JobStatus s = FinishedJob();
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_has_final_eval(false);
  return s;
}

TEST_F(LaunchTest, CompletedJobPrintsRunDirFirstAndFinalAccuracyLast) {
  ServeStatus({RunningJob(), FinishedJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 1\n");
  WriteFake("grps-server", "exec sleep 0.5\n");
  WriteFake("grps-worker", "exec sleep 0.5\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  std::vector<std::string> lines = Lines(out);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines.front(), "run dir: " + options_.run_dir);
  EXPECT_EQ(lines.back(), "final test accuracy: 0.8500");
  EXPECT_THAT(out, HasSubstr(absl::StrCat("coordinator: 127.0.0.1:", server_.port)));
  EXPECT_THAT(out, HasSubstr("final test loss: 0.4200"));
  ExpectNoFakeLeft();
}

// The grpsctl line it prints works as printed under TLS (it left out the
// TLS files: "Socket closed"), and a token the user gave is not said to
// be generated.
TEST_F(LaunchTest, TheGrpsctlLineNamesTheTlsFilesAndAGivenTokenIsSaidToBeGiven) {
  ServeStatus({RunningJob(), FinishedJob()});
  options_.token = "given-token";
  options_.worker_token = "worker-token";
  options_.tls_flags = {"--tls_cert=/c.pem", "--tls_key=/k.pem", "--tls_ca=/ca.pem",
                        "--tls_client_auth"};
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 1\n");
  WriteFake("grps-server", "exec sleep 0.5\n");
  WriteFake("grps-worker", "exec sleep 0.5\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("auth: every RPC needs the job's token, given in GRPS_TOKEN: "));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("grpsctl --coordinator=127.0.0.1:", server_.port,
                                          " --tls_cert=/c.pem --tls_key=/k.pem "
                                          "--tls_ca=/ca.pem status)")));
  ExpectNoFakeLeft();
}

TEST_F(LaunchTest, CompletedJobWritesTheResultJson) {
  ServeStatus({RunningJob(), FinishedJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 1\n");
  WriteFake("grps-server", "exec sleep 0.5\n");
  WriteFake("grps-worker", "exec sleep 0.5\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  const auto& f = json.fields();
  EXPECT_EQ(f.at("exit").string_value(), "ok");
  EXPECT_NEAR(f.at("final_test_accuracy").number_value(), 0.85, 1e-6);
  EXPECT_EQ(f.at("steps").number_value(), 50);
  EXPECT_EQ(f.at("model").string_value(), "softmax");
  EXPECT_GE(f.at("wall_seconds").number_value(), 1.0);  // the coordinator's sleep
  EXPECT_GT(f.at("samples_per_sec").number_value(), 0);
  EXPECT_EQ(f.at("run_dir").string_value(), options_.run_dir);
}

// An elastic job whose ledger missed a block completes with a warning:
// printed and in result.json; --strict fails the launch on it.
TEST_F(LaunchTest, AJobThatCompletedWithAWarningSaysSoAndFailsOnlyAStrictLaunch) {
  v1::JobStatus warned = FinishedJob();
  warned.add_warnings("1 of the job's 2000 blocks of examples was never trained");
  for (bool strict : {false, true}) {
    SCOPED_TRACE(strict ? "strict" : "not strict");
    options_.strict = strict;
    ServeStatus({RunningJob(), warned});
    WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 1\n");
    WriteFake("grps-server", "exec sleep 0.5\n");
    WriteFake("grps-worker", "exec sleep 0.5\n");
    std::string out;
    EXPECT_EQ(Launch(&out), strict ? kLaunchFailed : kLaunchOk) << out;
    EXPECT_THAT(out, HasSubstr("warning: 1 of the job's 2000 blocks of examples was never "
                               "trained"));
    google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
    const auto& f = json.fields();
    ASSERT_EQ(f.at("warnings").list_value().values_size(), 1);
    EXPECT_EQ(f.at("exit").string_value(), strict ? "failed" : "ok");
    if (strict) {
      EXPECT_THAT(out, HasSubstr("grps-local: the job completed with 1 warning (--strict)"));
      EXPECT_THAT(out, Not(HasSubstr("job completed:")));
    }
  }
}

TEST_F(LaunchTest, EveryChildGetsItsFlagsAndItsOwnLog) {
  ServeStatus({FinishedJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 0.5\n");
  WriteFake("grps-server", "exit 0\n");
  WriteFake("grps-worker", "exit 0\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  const std::string coordinator = absl::StrCat("--coordinator=127.0.0.1:", server_.port);
  std::vector<std::string> args = Lines(Args("coordinator"));
  EXPECT_THAT(args, Contains("--mode=async"));
  EXPECT_THAT(args, Contains("--steps=50"));
  EXPECT_THAT(args, Contains("--job_id=test-job"));
  EXPECT_THAT(args, Contains(absl::StrCat("--port_file=", options_.run_dir,
                                          "/coordinator.port")));
  EXPECT_THAT(args, Not(Contains(StartsWith("--lr"))));
  for (int shard : {0, 1}) {
    args = Lines(Args(absl::StrCat("server-", shard)));
    EXPECT_THAT(args, Contains(coordinator));
    EXPECT_THAT(args, Contains(absl::StrCat("--shard=", shard)));
  }
  for (int rank : {0, 1}) {
    args = Lines(Args(absl::StrCat("worker-", rank)));
    EXPECT_THAT(args, Contains(coordinator));
    EXPECT_THAT(args, Contains(absl::StrCat("--rank=", rank)));
    EXPECT_THAT(args, Contains(absl::StrCat("--curve_csv=", options_.run_dir,
                                            "/curve-worker-", rank, ".csv")));
  }
  for (const char* name : {"coordinator", "server-0", "server-1", "worker-0", "worker-1"})
    EXPECT_EQ(ReadFile(options_.run_dir + "/" + name + ".log"),
              absl::StrCat(name, " is up\n"));
}

TEST_F(LaunchTest, StrictLaunchFailsOnAWorkerNamingItWithItsLogAndStopsTheRest) {
  ServeStatus({RunningJob()});
  options_.strict = true;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  WriteFake("grps-worker",
            "if [ \"$id\" = worker-1 ]; then sleep 0.3; echo 'out of memory' >&2; "
            "exit 3; fi\nexec sleep 30\n");

  absl::Time start = absl::Now();
  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(out, HasSubstr("worker-1"));
  EXPECT_THAT(out, HasSubstr("exited with status 3"));
  EXPECT_THAT(out, HasSubstr("out of memory"));  // the tail of its log
  EXPECT_THAT(out, Not(HasSubstr("final test accuracy")));
  ExpectNoFakeLeft();
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  EXPECT_EQ(json.fields().at("exit").string_value(), "failed");
  EXPECT_THAT(json.fields().at("error").string_value(), HasSubstr("worker-1"));
}

TEST_F(LaunchTest, ServerKilledBySignalIsRestartedWithItsShardAsOftenAsAllowed) {
  ServeStatus({RunningJob()});
  options_.restart_servers = 1;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server",
            "if [ \"$id\" = server-0 ]; then sleep 0.3; kill -SEGV $$; fi\n"
            "exec sleep 30\n");
  WriteFake("grps-worker", "exec sleep 30\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_THAT(out, HasSubstr("server-0 killed by signal 11 (Segmentation fault); "
                             "restarting it with --shard=0 (restart 1 of 1)"));
  EXPECT_THAT(out, HasSubstr("(no server restarts left)"));
  EXPECT_EQ(Lines(ReadFile(fake_dir_ + "/server-0.starts")).size(), 2u);
  EXPECT_EQ(Lines(ReadFile(fake_dir_ + "/server-1.starts")).size(), 1u);
  EXPECT_THAT(Lines(Args("server-0")), Contains("--shard=0"));
  EXPECT_EQ(ReadFile(options_.run_dir + "/server-0.restart-1.log"), "server-0 is up\n");
  ExpectNoFakeLeft();
}

TEST_F(LaunchTest, CoordinatorKilledBySignalIsRestartedOnItsPortAndTheJobCompletes) {
  // The first coordinator dies by SIGKILL; the second one serves to the end.
  ServeStatus({RunningJob(), FinishedJob()}, absl::Milliseconds(400));
  WriteFake("grps-coordinator",
            std::string(kWritePort) +
                "if [ \"$(wc -l < \"$FAKE_DIR/coordinator.starts\")\" -eq 1 ]; then\n"
                "  sleep 0.3; kill -KILL $$; fi\n"
                "exec sleep 1.5\n");
  WriteFake("grps-server", "exec sleep 1.5\n");
  WriteFake("grps-worker", "exec sleep 1.5\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("coordinator killed by signal 9 (Killed); restarting it on "
                             "port "));
  EXPECT_EQ(Lines(ReadFile(fake_dir_ + "/coordinator.starts")).size(), 2u);
  EXPECT_THAT(Lines(Args("coordinator")), Contains(absl::StrCat("--listen=127.0.0.1:", server_.port)));
  EXPECT_THAT(Lines(Args("coordinator")), Contains("--state_dir=" + options_.run_dir));
  ExpectNoFakeLeft();
}

// A coordinator restarted near the end can finish the job and exit before
// the launcher's feed dials it again: the launcher then reads the status
// the job ended with from the coordinator's state file.
TEST_F(LaunchTest, AnEndTheFeedMissedIsReadFromTheCoordinatorsStateFile) {
  ServeStatus({RunningJob()});  // the stream never says the job ended
  v1::CoordinatorState state;
  state.set_state(v1::JOB_STATE_COMPLETED);
  *state.mutable_final_status() = FinishedJob();
  // Written after this launch started (an hour from now).
  state.set_unix_time_ms(absl::ToUnixMillis(absl::Now() + absl::Hours(1)));
  std::ofstream(fake_dir_ + "/ended.state") << state.SerializeAsString();
  WriteFake("grps-coordinator", std::string(kWritePort) +
                                    "sleep 0.5\ncp \"$FAKE_DIR/ended.state\" \"" +
                                    options_.run_dir + "/coordinator.state\"\n");
  WriteFake("grps-server", "exec sleep 0.3\n");
  WriteFake("grps-worker", "exec sleep 0.3\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("job completed: 50 steps per worker"));
  EXPECT_EQ(Lines(out).back(), "final test accuracy: 0.8500");
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  const auto& f = json.fields();
  EXPECT_EQ(f.at("exit").string_value(), "ok");
  EXPECT_EQ(f.at("steps").number_value(), 50);
  EXPECT_NEAR(f.at("final_test_accuracy").number_value(), 0.85, 1e-6);
  EXPECT_EQ(f.at("warnings").list_value().values_size(), 0);
  ExpectNoFakeLeft();
}

// Every child exited 0 but nothing said how the job ended (a state file an
// earlier launch left is not this one's): the figures are the last status
// heard, and the result says so; --strict fails on it.
TEST_F(LaunchTest, AnEndNeverHeardIsAWarningNotAQuietSuccess) {
  v1::CoordinatorState state;
  *state.mutable_final_status() = FinishedJob();
  state.set_unix_time_ms(absl::ToUnixMillis(absl::Now() - absl::Hours(1)));
  std::ofstream(fake_dir_ + "/old.state") << state.SerializeAsString();
  for (bool strict : {false, true}) {
    SCOPED_TRACE(strict ? "strict" : "not strict");
    options_.strict = strict;
    ServeStatus({RunningJob()});
    WriteFake("grps-coordinator", std::string(kWritePort) +
                                      "sleep 0.5\ncp \"$FAKE_DIR/old.state\" \"" +
                                      options_.run_dir + "/coordinator.state\"\n");
    WriteFake("grps-server", "exec sleep 0.3\n");
    WriteFake("grps-worker", "exec sleep 0.3\n");
    std::string out;
    EXPECT_EQ(Launch(&out), strict ? kLaunchFailed : kLaunchOk) << out;
    EXPECT_THAT(out, HasSubstr("warning: the coordinator's ending status was not heard"));
    google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
    const auto& f = json.fields();
    ASSERT_EQ(f.at("warnings").list_value().values_size(), 1);
    EXPECT_THAT(f.at("warnings").list_value().values(0).string_value(),
                HasSubstr("the figures are those of the last status heard (running)"));
    EXPECT_EQ(f.at("final_test_accuracy").kind_case(), google::protobuf::Value::kNullValue);
  }
}

TEST_F(LaunchTest, ServerExitingWithAnErrorFailsTheLaunchWithoutARestart) {
  ServeStatus({RunningJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server",
            "if [ \"$id\" = server-0 ]; then sleep 0.3; exit 1; fi\n"
            "exec sleep 30\n");
  WriteFake("grps-worker", "exec sleep 30\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_THAT(out, HasSubstr("grps-local: server-0 exited with status 1"));
  EXPECT_THAT(out, Not(HasSubstr("restarting")));
  ExpectNoFakeLeft();
}

TEST_F(LaunchTest, InterruptStopsEveryChildAndReturns130) {
  ServeStatus({RunningJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  WriteFake("grps-worker", "exec sleep 30\n");

  absl::Time interrupt_at = absl::Now() + absl::Seconds(1);
  std::string out;
  EXPECT_EQ(Launch(&out, [&] { return absl::Now() >= interrupt_at; }),
            kLaunchInterrupted)
      << out;
  EXPECT_LT(absl::Now() - interrupt_at, absl::Seconds(5));
  EXPECT_THAT(out, HasSubstr("stopping 5 processes"));
  ExpectNoFakeLeft();
  EXPECT_EQ(ParseJson(ReadFile(options_.result_json)).fields().at("exit").string_value(),
            "interrupted");
}

TEST_F(LaunchTest, InterruptWhileStartingMembersStartsNoMoreAndStopsThoseStarted) {
  ServeStatus({RunningJob()});
  options_.workers = 50;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  WriteFake("grps-worker", "exec sleep 30\n");
  // The launcher creates a child's log before it starts it.
  const std::string third_workers_log = options_.run_dir + "/worker-2.log";

  std::string out;
  EXPECT_EQ(Launch(&out, [&] { return std::filesystem::exists(third_workers_log); }),
            kLaunchInterrupted)
      << out;
  EXPECT_FALSE(std::filesystem::exists(options_.run_dir + "/worker-3.log")) << out;
  EXPECT_THAT(out, HasSubstr("stopping 6 processes"));  // coordinator, 2 servers, 3 workers
  EXPECT_THAT(out, Not(HasSubstr("started 2 servers")));
  ExpectNoFakeLeft();
  EXPECT_EQ(ParseJson(ReadFile(options_.result_json)).fields().at("exit").string_value(),
            "interrupted");
}

TEST_F(LaunchTest, ChildIgnoringSigtermIsKilledAfterTheGrace) {
  ServeStatus({RunningJob()});
  options_.stop_grace = absl::Milliseconds(500);
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "trap '' TERM\nexec sleep 30\n");
  WriteFake("grps-worker", "exec sleep 30\n");

  absl::Time interrupt_at = absl::Now() + absl::Seconds(1);
  std::string out;
  EXPECT_EQ(Launch(&out, [&] { return absl::Now() >= interrupt_at; }),
            kLaunchInterrupted);
  EXPECT_THAT(out, HasSubstr("killed"));
  EXPECT_THAT(out, HasSubstr("server-0, server-1"));
  ExpectNoFakeLeft();
}

TEST_F(LaunchTest, CoordinatorThatNeverWritesItsPortFailsTheLaunch) {
  options_.port_file_timeout = absl::Seconds(1);
  WriteFake("grps-coordinator", "echo 'cannot bind'\nexec sleep 30\n");
  WriteFake("grps-server", "exit 0\n");
  WriteFake("grps-worker", "exit 0\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed);
  EXPECT_THAT(out, HasSubstr("wrote no port"));
  EXPECT_THAT(out, HasSubstr("cannot bind"));
  EXPECT_EQ(ReadFile(fake_dir_ + "/server-0.pid"), "");  // never started
  ExpectNoFakeLeft();
}

TEST_F(LaunchTest, CoordinatorRejectingTheJobFailsTheLaunchWithItsMessage) {
  WriteFake("grps-coordinator", "echo 'invalid job: --mode: unknown' >&2\nexit 2\n");
  WriteFake("grps-server", "exit 0\n");
  WriteFake("grps-worker", "exit 0\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed);
  EXPECT_THAT(out, HasSubstr("exited with status 2"));
  EXPECT_THAT(out, HasSubstr("invalid job: --mode: unknown"));
}

TEST_F(LaunchTest, MissingDaemonIsNamedWithTheBinDir) {
  WriteFake("grps-coordinator", "exit 0\n");
  WriteFake("grps-server", "exit 0\n");
  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed);
  EXPECT_THAT(out, HasSubstr("cannot find grps-worker in " + options_.bin_dir));
}

TEST_F(LaunchTest, TimeoutFailsTheJobAndStopsEveryChild) {
  ServeStatus({RunningJob()});
  options_.timeout = absl::Seconds(1);
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  WriteFake("grps-worker", "exec sleep 30\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed);
  EXPECT_THAT(out, HasSubstr("timed out after 1s"));
  ExpectNoFakeLeft();
  EXPECT_EQ(ParseJson(ReadFile(options_.result_json)).fields().at("exit").string_value(),
            "timeout");
}

TEST_F(LaunchTest, JobStoppedByAnOperatorIsAFailureEvenIfEveryoneExits0) {
  v1::JobStatus stopped = RunningJob();
  stopped.set_state(v1::JOB_STATE_STOPPED);
  stopped.set_message("stopped by grpsctl");
  ServeStatus({RunningJob(), stopped});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 0.5\n");
  WriteFake("grps-server", "exit 0\n");
  WriteFake("grps-worker", "exit 0\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed);
  EXPECT_THAT(out, HasSubstr("job stopped: stopped by grpsctl"));
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  EXPECT_EQ(json.fields().at("exit").string_value(), "stopped");
  EXPECT_EQ(json.fields().at("error").string_value(), "job stopped: stopped by grpsctl");
}

// ---- Workers that die ----------------------------------------------------------

TEST_F(LaunchTest, DeadWorkerIsReportedAndTheJobGoesOnWithoutIt) {
  ServeStatus({RunningJob(), FinishedJob()}, absl::Milliseconds(500));
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 2\n");
  WriteFake("grps-server", "exec sleep 1.5\n");
  WriteFake("grps-worker",
            "if [ \"$id\" = worker-1 ]; then sleep 0.5; kill -KILL $$; fi\n"
            "exec sleep 1.5\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("grps-local: worker-1 killed by signal 9"));
  EXPECT_THAT(out, HasSubstr("the job goes on with 1 of 2 workers"));
  EXPECT_THAT(out, HasSubstr("workers: 1 died, 0 restarted, of 2"));
  EXPECT_EQ(Lines(out).back(), "final test accuracy: 0.8500");
  ExpectNoFakeLeft();
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  EXPECT_EQ(json.fields().at("exit").string_value(), "ok");
  EXPECT_EQ(json.fields().at("workers_died").number_value(), 1);
  EXPECT_EQ(json.fields().at("workers_restarted").number_value(), 0);
}

TEST_F(LaunchTest, StrictLaunchFailsWhenAWorkerIsKilled) {
  ServeStatus({RunningJob()});
  options_.strict = true;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  WriteFake("grps-worker",
            "if [ \"$id\" = worker-1 ]; then sleep 0.3; kill -KILL $$; fi\n"
            "exec sleep 30\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_THAT(out, HasSubstr("grps-local: worker-1 killed by signal 9"));
  EXPECT_THAT(out, Not(HasSubstr("goes on")));
  ExpectNoFakeLeft();
  EXPECT_THAT(ParseJson(ReadFile(options_.result_json)).fields().at("error").string_value(),
              HasSubstr("worker-1"));
}

TEST_F(LaunchTest, DeadWorkerIsRestartedWithItsRankAsOftenAsAllowedAndNoMore) {
  // The job runs on (no ending snapshot) while worker-1 dies again and again.
  ServeStatus({RunningJob()});
  options_.restart_workers = 2;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 3\n");
  WriteFake("grps-server", "exec sleep 2.5\n");
  WriteFake("grps-worker",
            "if [ \"$id\" = worker-1 ]; then sleep 0.5; echo 'lost'; exit 3; fi\n"
            "exec sleep 2.5\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("worker-1 exited with status 3; restarting it with --rank=1 "
                             "(restart 1 of 2)"));
  EXPECT_THAT(out, HasSubstr("(restart 2 of 2)"));
  EXPECT_THAT(out, Not(HasSubstr("restart 3")));
  EXPECT_THAT(out, HasSubstr("the job goes on with 1 of 2 workers (no restarts left)"));
  EXPECT_THAT(out, HasSubstr("workers: 3 died, 2 restarted, of 2"));
  EXPECT_EQ(Lines(ReadFile(fake_dir_ + "/worker-1.starts")).size(), 3u);
  EXPECT_EQ(Lines(ReadFile(fake_dir_ + "/worker-0.starts")).size(), 1u);
  EXPECT_THAT(Lines(Args("worker-1")), Contains("--rank=1"));
  // Each incarnation has its own log; the first one's is kept.
  EXPECT_EQ(ReadFile(options_.run_dir + "/worker-1.log"), "worker-1 is up\nlost\n");
  EXPECT_EQ(ReadFile(options_.run_dir + "/worker-1.restart-2.log"), "worker-1 is up\nlost\n");
  ExpectNoFakeLeft();
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  EXPECT_EQ(json.fields().at("workers_died").number_value(), 3);
  EXPECT_EQ(json.fields().at("workers_restarted").number_value(), 2);
}

// An entry worker (the user's command) that records its arguments, one a
// line, and the job's variables in $FAKE_DIR/entry-<rank>.{args,env}.
constexpr char kEntryProgram[] = R"(#!/bin/sh
printf '%s\n' "$@" > "$FAKE_DIR/entry-$GRPS_RANK.args"
env | grep -E '^(GRPS_|PYTHONPATH=|RANK=|WORLD_SIZE=|LOCAL_RANK=|LOCAL_WORLD_SIZE=)' |
  sort > "$FAKE_DIR/entry-$GRPS_RANK.env"
echo $$ >> "$FAKE_DIR/entry-$GRPS_RANK.starts"
echo "entry $GRPS_RANK is up"
)";

TEST_F(LaunchTest, EntryWorkersRunTheUsersCommandInsteadOfGrpsWorker) {
  ServeStatus({RunningJob(), FinishedJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 1\n");
  WriteFake("grps-server", "exec sleep 0.5\n");
  // No grps-worker in the bin dir: an entry job does not need one.
  const std::string program = fake_dir_ + "/train";
  std::ofstream(program) << kEntryProgram << "exec sleep 0.5\n";
  chmod(program.c_str(), 0755);
  options_.entry = program + " --name 'a b' --steps=3";
  options_.worker_token = "worker-secret";
  options_.token = "admin-secret";
  setenv("GRPS_TLS_CA", "/launchers/own/ca.pem", 1);  // the launch has no TLS

  std::string out;
  int code;
  {
    // grps-local itself run by torchrun: its workers get the job's values.
    ScopedVariable rank("RANK", "7"), world_size("WORLD_SIZE", "9");
    ScopedVariable local_rank("LOCAL_RANK", "7"), local_world_size("LOCAL_WORLD_SIZE", "9");
    code = Launch(&out);
  }
  unsetenv("GRPS_TLS_CA");
  ASSERT_EQ(code, kLaunchOk) << out;
  for (int rank : {0, 1}) {
    EXPECT_EQ(Lines(ReadFile(absl::StrCat(fake_dir_, "/entry-", rank, ".args"))),
              (std::vector<std::string>{"--name", "a b", "--steps=3"}));
    std::vector<std::string> env = Lines(ReadFile(absl::StrCat(fake_dir_, "/entry-", rank, ".env")));
    EXPECT_THAT(env, Contains(absl::StrCat("GRPS_COORDINATOR=127.0.0.1:", server_.port)));
    EXPECT_THAT(env, Contains(absl::StrCat("GRPS_RANK=", rank)));
    EXPECT_THAT(env, Contains("GRPS_WORKERS=2"));
    EXPECT_THAT(env, Contains("GRPS_JOB_ID=test-job"));
    EXPECT_THAT(env, Contains("GRPS_RUN_DIR=" + options_.run_dir));
    // One host: the local rank is the rank, the local size the workers.
    EXPECT_THAT(env, Contains(absl::StrCat("GRPS_LOCAL_RANK=", rank)));
    EXPECT_THAT(env, Contains("GRPS_LOCAL_SIZE=2"));
    EXPECT_THAT(env, Contains(absl::StrCat("RANK=", rank)));
    EXPECT_THAT(env, Contains("WORLD_SIZE=2"));
    EXPECT_THAT(env, Contains(absl::StrCat("LOCAL_RANK=", rank)));
    EXPECT_THAT(env, Contains("LOCAL_WORLD_SIZE=2"));
    EXPECT_THAT(env, Contains("GRPS_WORKER_TOKEN=worker-secret"));
    EXPECT_THAT(env, Not(Contains(StartsWith("GRPS_TOKEN="))));
    EXPECT_THAT(env, Not(Contains(StartsWith("GRPS_TLS_"))));
    EXPECT_EQ(ReadFile(absl::StrCat(options_.run_dir, "/worker-", rank, ".log")),
              absl::StrCat("entry ", rank, " is up\n"));
  }
  EXPECT_THAT(out, HasSubstr("started 2 servers and 2 workers (" + options_.entry + ")"));
  // No curves from the user's program, and nothing said about it.
  EXPECT_THAT(out, Not(HasSubstr("no plot")));
  EXPECT_EQ(Lines(out).back(), "final test accuracy: 0.8500");
  ExpectNoFakeLeft();
}

TEST_F(LaunchTest, DeadEntryWorkerIsRestartedWithItsRank) {
  ServeStatus({RunningJob()});
  options_.restart_workers = 1;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 2.5\n");
  WriteFake("grps-server", "exec sleep 2\n");
  const std::string program = fake_dir_ + "/train";
  std::ofstream(program) << kEntryProgram
                         << "if [ \"$GRPS_RANK\" = 1 ] && "
                            "[ \"$(wc -l < \"$FAKE_DIR/entry-1.starts\")\" = 1 ]; then\n"
                            "  sleep 0.3; kill -KILL $$\nfi\nexec sleep 1.5\n";
  chmod(program.c_str(), 0755);
  options_.entry = program;

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("worker-1 killed by signal 9 (Killed); restarting it with GRPS_RANK=1 "
                             "(restart 1 of 1)"));
  EXPECT_EQ(Lines(ReadFile(fake_dir_ + "/entry-1.starts")).size(), 2u);
  EXPECT_EQ(Lines(ReadFile(fake_dir_ + "/entry-0.starts")).size(), 1u);
  EXPECT_EQ(ReadFile(options_.run_dir + "/worker-1.restart-1.log"), "entry 1 is up\n");
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  EXPECT_EQ(json.fields().at("workers_died").number_value(), 1);
  EXPECT_EQ(json.fields().at("workers_restarted").number_value(), 1);
}

TEST_F(LaunchTest, EveryWorkerDeadFailsTheLaunch) {
  ServeStatus({RunningJob()});
  options_.restart_workers = 1;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  WriteFake("grps-worker", "sleep 0.5\necho 'no data'\nexit 4\n");

  absl::Time start = absl::Now();
  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(out, HasSubstr("(restart 1 of 1)"));
  EXPECT_THAT(out, HasSubstr("every worker died"));
  EXPECT_THAT(out, HasSubstr("no worker is left to train"));
  EXPECT_THAT(out, HasSubstr("no data"));  // the last one's log
  ExpectNoFakeLeft();
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  EXPECT_EQ(json.fields().at("exit").string_value(), "failed");
  EXPECT_EQ(json.fields().at("workers_died").number_value(), 3);
}

TEST_F(LaunchTest, WorkerDeadBeforeTheJobStartsFailsTheLaunch) {
  v1::JobStatus waiting = RunningJob();
  waiting.set_state(v1::JOB_STATE_WAITING);
  ServeStatus({waiting});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  WriteFake("grps-worker",
            "if [ \"$id\" = worker-1 ]; then echo 'unknown flag' >&2; exit 1; fi\n"
            "exec sleep 30\n");

  absl::Time start = absl::Now();
  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(out, HasSubstr("worker-1 exited with status 1 before the job started"));
  EXPECT_THAT(out, HasSubstr("unknown flag"));
  ExpectNoFakeLeft();
}

// A job still waiting for its members: none has registered.
v1::JobStatus WaitingJob() {
  v1::JobStatus s = RunningJob();
  s.set_state(v1::JOB_STATE_WAITING);
  s.set_global_step(0);
  for (v1::WorkerStatus& w : *s.mutable_workers()) {
    w.clear_state();
    w.clear_progress();
  }
  return s;
}

// The coordinator would wait for it for good: servers and workers "waiting
// for members" forever.
TEST_F(LaunchTest, EntryWorkerExiting0BeforeItJoinedFailsTheLaunchNamingIt) {
  ServeStatus({WaitingJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server", "exec sleep 30\n");
  const std::string program = fake_dir_ + "/train";
  std::ofstream(program) << kEntryProgram
                         << "if [ \"$GRPS_RANK\" = 1 ]; then echo 'nothing to do'; exit 0; fi\n"
                            "exec sleep 30\n";
  chmod(program.c_str(), 0755);
  options_.entry = program;

  absl::Time start = absl::Now();
  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(out, HasSubstr("grps-local: worker-1 exited with status 0 before it joined the "
                             "job (it trained nothing); the job cannot start without it"));
  EXPECT_THAT(out, HasSubstr("nothing to do"));  // the tail of its log
  EXPECT_THAT(out, Not(HasSubstr("worker-0 exited")));
  ExpectNoFakeLeft();
  google::protobuf::Struct json = ParseJson(ReadFile(options_.result_json));
  EXPECT_EQ(json.fields().at("exit").string_value(), "failed");
  EXPECT_THAT(json.fields().at("error").string_value(), HasSubstr("worker-1"));
}

// A short job: the workers trained and exited 0 while the newest snapshot the
// launcher had still said "waiting"; the next ones show the job ran.
TEST_F(LaunchTest, WorkerExiting0BeforeTheFeedShowedTheJobRunningFinishedItsPart) {
  ServeStatus({WaitingJob(), RunningJob(), FinishedJob()}, absl::Milliseconds(300));
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 1.5\n");
  WriteFake("grps-server", "exec sleep 1\n");
  WriteFake("grps-worker", "exit 0\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, Not(HasSubstr("before it joined")));
  EXPECT_EQ(Lines(out).back(), "final test accuracy: 0.8500");
  ExpectNoFakeLeft();
}

// worker-1 died at its fifth step, while the newest snapshot the launcher
// had still said "waiting": the next ones show the job ran, and it goes on
// with the other worker (it was failed "before the job started").
TEST_F(LaunchTest, WorkerDyingBeforeTheFeedShowedTheJobRunningLeavesTheJobGoingOn) {
  ServeStatus({WaitingJob(), RunningJob(), FinishedJob()}, absl::Milliseconds(300));
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 1.5\n");
  WriteFake("grps-server", "exec sleep 1\n");
  WriteFake("grps-worker", "if [ \"$id\" = worker-1 ]; then exit 1; fi\nexec sleep 1\n");

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("worker-1 exited with status 1; the job goes on with 1 of 2"));
  EXPECT_THAT(out, Not(HasSubstr("before the job started")));
  EXPECT_EQ(Lines(out).back(), "final test accuracy: 0.8500");
  ExpectNoFakeLeft();
}

TEST_F(LaunchTest, DeadServerFailsTheLaunchEvenWithRestarts) {
  ServeStatus({RunningJob()});
  options_.restart_workers = 3;
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 30\n");
  WriteFake("grps-server",
            "if [ \"$id\" = server-1 ]; then sleep 0.3; exit 5; fi\nexec sleep 30\n");
  WriteFake("grps-worker", "exec sleep 30\n");

  std::string out;
  EXPECT_EQ(Launch(&out), kLaunchFailed) << out;
  EXPECT_THAT(out, HasSubstr("grps-local: server-1 exited with status 5"));
  EXPECT_THAT(out, Not(HasSubstr("restarting")));
  ExpectNoFakeLeft();
}

// ---- The plot ------------------------------------------------------------------

// Fake workers that write a curve with one evaluation.
constexpr char kWorkerWritingACurve[] = R"(for a in "$@"; do
  case "$a" in --curve_csv=*) csv="${a#--curve_csv=}";; esac
done
printf 'step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,test_loss,evaluated\n1,0,1,1000,2.0,10,0.5,1.0,1\n' > "$csv"
exit 0
)";

TEST_F(LaunchTest, GnuplotOnThePathDrawsTheCurvesWithTheWrittenScript) {
  ServeStatus({FinishedJob()});
  const std::string tools = TempDir();
  options_.plot_search_path = "/nonexistent:" + tools;
  // A fake gnuplot: records its argv and draws an "svg".
  {
    std::ofstream(tools + "/gnuplot")
        << "#!/bin/sh\necho \"$@\" > \"$FAKE_DIR/gnuplot.args\"\n"
           "echo '<svg/>' > \"$(dirname \"$1\")/curves.svg\"\n";
    chmod((tools + "/gnuplot").c_str(), 0755);
  }
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 0.5\n");
  WriteFake("grps-server", "exit 0\n");
  WriteFake("grps-worker", kWorkerWritingACurve);

  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("curves: " + options_.run_dir + "/curves.svg"));
  EXPECT_EQ(ReadFile(fake_dir_ + "/gnuplot.args"), options_.run_dir + "/curves.gp\n");
  const std::string gp = ReadFile(options_.run_dir + "/curves.gp");
  EXPECT_THAT(gp, HasSubstr("curve-worker-0.csv"));
  EXPECT_THAT(gp, HasSubstr("curve-worker-1.csv"));
  EXPECT_EQ(Lines(out).back(), "final test accuracy: 0.8500");
}

TEST_F(LaunchTest, NoGnuplotOrAFailingOneOnlySaysWhyThereIsNoPlot) {
  ServeStatus({FinishedJob()});
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 0.5\n");
  WriteFake("grps-server", "exit 0\n");
  WriteFake("grps-worker", kWorkerWritingACurve);
  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("no plot: gnuplot is not on PATH"));

  const std::string tools = TempDir();
  options_.plot_search_path = tools;
  std::ofstream(tools + "/gnuplot") << "#!/bin/sh\necho 'bad script' >&2\nexit 1\n";
  chmod((tools + "/gnuplot").c_str(), 0755);
  ServeStatus({FinishedJob()});
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_THAT(out, HasSubstr("no plot: gnuplot exited with status 1"));
  EXPECT_EQ(ReadFile(options_.run_dir + "/curves.log"), "bad script\n");
}

TEST_F(LaunchTest, HangingGnuplotIsKilledAfterItsTimeAndTheJobStillCompletes) {
  ServeStatus({FinishedJob()});
  const std::string tools = TempDir();
  options_.plot_search_path = tools;
  options_.plot_timeout = absl::Milliseconds(500);
  std::ofstream(tools + "/gnuplot") << "#!/bin/sh\nexec sleep 30\n";
  chmod((tools + "/gnuplot").c_str(), 0755);
  WriteFake("grps-coordinator", std::string(kWritePort) + "exec sleep 0.5\n");
  WriteFake("grps-server", "exit 0\n");
  WriteFake("grps-worker", kWorkerWritingACurve);

  absl::Time start = absl::Now();
  std::string out;
  ASSERT_EQ(Launch(&out), kLaunchOk) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(out, HasSubstr("no plot: gnuplot ran longer than 500ms"));
}

}  // namespace
}  // namespace grps
