// grps-coordinator: the control plane of one job. Serves grps.v1.Coordinator
// until the job ends, then waits (up to --linger_ms) until every live daemon
// has been told, and exits.
//
// At start: a state file (<state_dir>/coordinator.state) of this job that is
// not final is taken back (a restarted coordinator); one of a COMPLETED job
// makes it exit 0 at once. Otherwise, with --checkpoint_dir, the job resumes
// from the newest complete checkpoint there (damaged ones are refused and
// logged). While running, the state file is rewritten as the job changes.
//
// Exit codes: 0 when the job completed or was stopped (also by SIGINT or
// SIGTERM); 1 when it failed or could not serve; 2 for an invalid job
// configuration (also a checkpoint cut from another model or chunk size).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_flags.h"
#include "coordinator/job_metrics.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "daemon/metrics.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port to serve on (port 0 picks a free one; see --port_file)");
ABSL_FLAG(std::string, port_file, "",
          "after listening, write the bound port to this file (atomically)");
ABSL_FLAG(std::string, state_dir, "(checkpoint_dir)",
          "folder for the coordinator's state file, so that a restarted "
          "coordinator takes the job back (default: --checkpoint_dir; empty: "
          "no state file)");
ABSL_FLAG(int32_t, linger_ms, 3000,
          "after the job ends, wait up to this long for every live daemon to "
          "learn it before exiting");

namespace grps {
namespace {

// The highest id of a ckpt-<id> folder under `root` (0 if none).
uint64_t HighestCheckpointFolder(Env* env, const std::string& root) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(root);
  if (!names.ok()) return 0;
  uint64_t highest = 0;
  for (const std::string& name : *names) {
    uint64_t id = 0;
    if (absl::StartsWith(name, "ckpt-") &&
        absl::SimpleAtoi(absl::string_view(name).substr(5), &id))
      highest = std::max(highest, id);
  }
  return highest;
}

// What the state file says: nullopt to start fresh; an exit code to exit
// with at once.
struct StateFileVerdict {
  std::optional<v1::CoordinatorState> take_over;
  std::optional<int> exit_code;
};

StateFileVerdict ReadStateFile(Env* env, const std::string& path,
                               const v1::JobConfig& config) {
  StateFileVerdict verdict;
  if (path.empty() || !env->FileExists(path)) return verdict;
  absl::StatusOr<std::string> bytes = env->ReadFile(path);
  v1::CoordinatorState state;
  if (!bytes.ok() || !state.ParseFromString(*bytes)) {
    spdlog::warn("{}: {}; starting fresh (members are adopted from their "
                 "heartbeats)",
                 path,
                 bytes.ok() ? std::string("not a coordinator state")
                            : std::string(bytes.status().message()));
    return verdict;
  }
  if (state.config().job_id() != config.job_id()) {
    spdlog::warn("{} is of job '{}', not '{}'; starting fresh", path,
                 state.config().job_id(), config.job_id());
    return verdict;
  }
  switch (state.state()) {
    case v1::JOB_STATE_COMPLETED:
      spdlog::info("job {} already completed ({}): nothing to do", config.job_id(),
                   path);
      verdict.exit_code = 0;
      return verdict;
    case v1::JOB_STATE_STOPPED:
    case v1::JOB_STATE_FAILED:
      spdlog::info("job {} was {} ({}); starting it again", config.job_id(),
                   JobStateName(state.state()), path);
      return verdict;
    default:
      verdict.take_over = std::move(state);
      return verdict;
  }
}

// Resumes `service` from the newest complete checkpoint under
// config.checkpoint_dir, if any. An exit code when the job cannot start.
std::optional<int> ResumeFromCheckpoint(Env* env, const v1::JobConfig& config,
                                        const v1::ShardMap& map,
                                        CoordinatorService* service) {
  const bool per_shard = config.checkpoint_storage() == v1::CHECKPOINT_STORAGE_PER_SHARD;
  absl::StatusOr<CheckpointChoice> choice =
      // Any job's: a job started again on its folder may have a new id
      // (grps-local names each run). Per-shard storage: the manifests alone
      // are here; each server checks its own file when it restores, and one
      // it cannot load sends the job to the checkpoint before.
      FindNewestCheckpoint(env, config.checkpoint_dir(), "",
                           per_shard ? CheckpointFiles::kManifestOnly
                                     : CheckpointFiles::kEveryFile);
  if (!choice.ok()) {
    spdlog::error("--checkpoint_dir: {}", std::string(choice.status().message()));
    return 1;
  }
  for (const std::string& refused : choice->refused)
    spdlog::warn("checkpoint refused: {}", refused);
  // Checkpoints refused: the job's status warns of the steps they held.
  auto warn = [&](const std::string& warning) {
    spdlog::warn("job {}: {}", config.job_id(), warning);
    service->AddCheckpointWarning(warning);
  };
  const size_t refused = choice->refused.size();
  const std::string refused_what =
      refused == 0 ? ""
                   : absl::StrCat(refused, " checkpoint", refused == 1 ? "" : "s", " in ",
                                  config.checkpoint_dir(), " refused (", choice->refused.front(),
                                  refused == 1 ? "" : ", ...", ")");
  if (!choice->manifest.has_value()) {
    if (refused > 0) {
      warn(absl::StrCat(refused_what, ": the job started from step 0"));
    } else {
      spdlog::info("no checkpoint in {}; job {} starts from step 0", config.checkpoint_dir(),
                   config.job_id());
    }
    return std::nullopt;
  }
  // Every rank is past the job's last step: there is nothing to train, and
  // the job would report a model of fewer steps than it holds.
  const auto& steps = choice->manifest->worker_steps();
  if (config.steps() > 0 && !steps.empty() &&
      *std::min_element(steps.begin(), steps.end()) > config.steps()) {
    std::fprintf(stderr,
                 "grps-coordinator: checkpoint %s is at step %llu, past this job's --steps=%llu: "
                 "nothing is left to train; give --steps above it, or another "
                 "--checkpoint_dir\n",
                 choice->dir.c_str(),
                 static_cast<unsigned long long>(*std::min_element(steps.begin(), steps.end())),
                 static_cast<unsigned long long>(config.steps()));
    return 2;
  }
  // A user model's layout is the checkpoint's, cut as this job cuts.
  v1::ShardMap layout = map;
  if (config.model() == v1::MODEL_USER) {
    absl::StatusOr<v1::ShardMap> built = BuildShardMap(
        ModelTensors(choice->manifest->config()), config.num_servers(), config.chunk_bytes());
    if (built.ok()) layout = std::move(*built);
  }
  if (absl::Status s = CheckSameChunks(choice->manifest->shard_map(), layout); !s.ok()) {
    std::fprintf(stderr, "grps-coordinator: checkpoint %s: %s; or use another --checkpoint_dir\n",
                 choice->dir.c_str(), std::string(s.message()).c_str());
    return 2;
  }
  if (absl::Status s = CheckSameTables(choice->manifest->config(), config); !s.ok()) {
    std::fprintf(stderr,
                 "grps-coordinator: checkpoint %s holds other sparse tables than this job's "
                 "(%s); use the same --model and --embedding_dim, or another "
                 "--checkpoint_dir\n",
                 choice->dir.c_str(), std::string(s.message()).c_str());
    return 2;
  }
  if (per_shard) {
    if (absl::Status s = CheckSameShards(choice->manifest->shard_map(), layout); !s.ok()) {
      std::fprintf(stderr, "grps-coordinator: checkpoint %s: %s\n", choice->dir.c_str(),
                   std::string(s.message()).c_str());
      return 2;
    }
  }
  // The optimizer state in the files is that optimizer's (Adam's moments,
  // momentum's velocity): another optimizer cannot continue from it. A user
  // model's job takes the checkpoint's kind, which its program chose.
  if (config.model() != v1::MODEL_USER &&
      choice->manifest->config().optimizer().kind() != config.optimizer().kind()) {
    std::fprintf(stderr,
                 "grps-coordinator: checkpoint %s was taken with --optimizer=%s, this "
                 "job uses --optimizer=%s; use the same optimizer, or another "
                 "--checkpoint_dir\n",
                 choice->dir.c_str(),
                 OptimizerName(choice->manifest->config().optimizer().kind()).c_str(),
                 OptimizerName(config.optimizer().kind()).c_str());
    return 2;
  }
  if (refused > 0)
    warn(absl::StrCat(refused_what, ": the job resumed from checkpoint ", choice->manifest->id(),
                      " at step ", choice->manifest->step()));
  spdlog::info("job {} resumes from checkpoint {} of job {} in {} (step {}, {} shards then, "
               "{} now)",
               config.job_id(), choice->manifest->id(), choice->manifest->job_id(), choice->dir,
               choice->manifest->step(), choice->manifest->shards_size(),
               config.num_servers());
  service->ResumeFrom(*choice->manifest, choice->dir);
  return std::nullopt;
}

// Parses the flags and sets up the process; the job's config and shard map,
// or the exit code when they are invalid.
std::optional<int> ReadJob(int argc, char** argv, v1::JobConfig* config,
                           v1::ShardMap* map) {
  ParseFlagsWithEnvironment(
      argc, argv,
      "grps-coordinator [--mode=sync|async|ssp] [--servers=N] [--workers=M] "
      "[--listen=HOST:PORT] [--port_file=FILE] ...: the control plane of a "
      "grps job (every flag can also be set as GRPS_<FLAG>)",
      // The coordinator dials no one: no server name to check.
      {"tls_server_name"});
  InitDaemon("coordinator");
  InstallShutdownHandlers();
  if (absl::Status s = InitProcessSecurity(Role::kAdmin, /*serves=*/true); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  absl::StatusOr<v1::JobConfig> flags = JobConfigFromFlags();
  if (!flags.ok()) {
    std::fprintf(stderr, "grps-coordinator: invalid job: %s\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  *config = std::move(*flags);
  absl::StatusOr<v1::ShardMap> built = BuildShardMap(
      ModelTensors(*config), config->num_servers(), config->chunk_bytes());
  if (!built.ok()) {
    std::fprintf(stderr, "grps-coordinator: invalid job: %s\n",
                 std::string(built.status().message()).c_str());
    return 2;
  }
  *map = std::move(*built);
  if (absl::GetFlag(FLAGS_linger_ms) < 0) {
    std::fprintf(stderr, "grps-coordinator: --linger_ms must be >= 0\n");
    return 2;
  }
  return std::nullopt;
}

// Where the state file lives (empty: nowhere), per --state_dir.
std::string StateDir(const v1::JobConfig& config) {
  std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir == "(checkpoint_dir)") state_dir = config.checkpoint_dir();
  return state_dir;
}

// Where the job starts from: the state file taken over, or else the newest
// checkpoint. An exit code when it cannot start.
std::optional<int> PlaceJob(Env* env, const v1::JobConfig& config, const v1::ShardMap& map,
                            const StateFileVerdict& verdict, const std::string& state_path,
                            CoordinatorService* service) {
  if (!config.checkpoint_dir().empty())
    service->SetNextCheckpointId(HighestCheckpointFolder(env, config.checkpoint_dir()) + 1);
  if (verdict.take_over.has_value()) {
    if (absl::Status s = service->TakeOver(*verdict.take_over, state_path); !s.ok()) {
      std::fprintf(stderr, "grps-coordinator: cannot take the job back: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
    return std::nullopt;
  }
  if (config.checkpoint_dir().empty()) return std::nullopt;
  return ResumeFromCheckpoint(env, config, map, service);
}

// The gRPC server and the metrics endpoint, serving until destroyed.
struct Serving {
  GrpcServer server;
  std::unique_ptr<MetricsEndpoint> metrics;
};

absl::StatusOr<Serving> StartServing(Env* env, const v1::JobConfig& config,
                                     const v1::ShardMap& map, CoordinatorService* service) {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  // Every request to the coordinator is small: 4 MiB is far more than any
  // needs, and gRPC holds at most the default quota for them.
  ServerLimits limits;
  limits.max_receive_bytes = 4 << 20;
  absl::StatusOr<GrpcServer> server = StartGrpcServer(listen, {service}, limits);
  if (!server.ok()) return server.status();
  Serving serving{std::move(*server), nullptr};
  auto stop_now = [&serving] {
    serving.server.server->Shutdown(absl::ToChronoTime(absl::Now()));
  };
  auto job_metrics = std::make_shared<CollectFunction>(
      [service] { return JobMetricFamilies(service->Status()); });
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
      StartMetricsFromFlags("grps-coordinator", {job_metrics});
  if (!metrics.ok()) {
    stop_now();
    return metrics.status();
  }
  serving.metrics = std::move(*metrics);
  spdlog::info(
      "job {}: {} {} ({} chunks), {}, {} servers, {} workers; listening on {}",
      config.job_id(), ModelName(config.model()), absl::StrJoin(LayerWidths(config), "-"),
      map.chunks_size(), ModeName(config.mode()), config.num_servers(),
      config.num_workers(), WithPort(listen, serving.server.port));
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    if (absl::Status s =
            WriteFileAtomically(env, port_file, absl::StrCat(serving.server.port, "\n"));
        !s.ok()) {
      stop_now();
      return absl::Status(s.code(), absl::StrCat("--port_file: ", s.message()));
    }
  }
  return serving;
}

// Detects failures every heartbeat interval, on this thread, and rewrites
// the state file on a thread of its own (an fsync may take seconds, and
// failure detection and checkpoint scheduling must not wait for it), until
// the job ends or a signal arrives.
void RunUntilTheJobEnds(const v1::JobConfig& config, CoordinatorService* service) {
  std::atomic<bool> persisting{true};
  std::thread persister([service, &persisting] {
    while (persisting.load()) {
      if (absl::Status s = service->PersistState(/*force=*/false); !s.ok())
        spdlog::warn("state file: {}", std::string(s.message()));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  const absl::Duration tick = absl::Milliseconds(config.heartbeat_interval_ms());
  absl::Time next_tick = absl::Now() + tick;
  while (true) {
    if (ShutdownRequested()) {
      service->Stop("the coordinator received a shutdown signal");
      break;
    }
    if (absl::Now() >= next_tick) {
      service->DetectFailures();
      next_tick = absl::Now() + tick;
    }
    const absl::Duration wait = std::min(absl::Milliseconds(100), next_tick - absl::Now());
    if (service->WaitForEnd(std::max(wait, absl::ZeroDuration()))) break;
  }
  persisting.store(false);
  persister.join();
  // The end on disk at once, not after the linger: a coordinator killed
  // while it lingers must not leave a state that says the job runs (a
  // restarted one would take back a job whose members are leaving), and
  // grps-local reads how the job ended from it.
  if (absl::Status s = service->PersistState(/*force=*/true); !s.ok())
    spdlog::warn("state file: {}", std::string(s.message()));
}

// Lingers so that every live daemon hears the final state from a heartbeat
// reply and exits by itself; a member that dies meanwhile stops counting.
void LingerUntilEveryMemberHeard(CoordinatorService* service) {
  const absl::Time linger_end =
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_linger_ms));
  // A signal that arrives now cuts the linger short (the job has ended;
  // nothing is lost). The one that stopped the job does not.
  const int signals_before_linger = ShutdownSignals();
  while (absl::Now() < linger_end && !service->EveryLiveMemberSawEnd() &&
         ShutdownSignals() == signals_before_linger) {
    service->DetectFailures();
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!service->EveryLiveMemberSawEnd())
    spdlog::warn("exiting before every live daemon heard that the job ended");
}

// "job j completed after 1m5s at global step 1500; final test accuracy ...".
std::string ResultLine(const v1::JobStatus& status) {
  std::string result = absl::StrCat(
      "job ", status.job_id(), " ", JobStateName(status.state()), " after ",
      absl::FormatDuration(absl::Seconds(static_cast<int64_t>(status.elapsed_seconds()))),
      " at global step ", status.global_step());
  if (status.has_final_eval())
    absl::StrAppend(&result, "; final test accuracy ",
                    absl::SixDigits(status.final_test_accuracy()), ", loss ",
                    absl::SixDigits(status.final_test_loss()));
  if (!status.message().empty()) absl::StrAppend(&result, " (", status.message(), ")");
  return result;
}

int Main(int argc, char** argv) {
  v1::JobConfig config;
  v1::ShardMap map;
  if (std::optional<int> code = ReadJob(argc, argv, &config, &map)) return *code;

  Env* env = Env::Default();
  const std::string state_dir = StateDir(config);
  const std::string state_path =
      state_dir.empty() ? std::string() : JoinPath(state_dir, kCoordinatorStateFile);
  StateFileVerdict verdict = ReadStateFile(env, state_path, config);
  if (verdict.exit_code.has_value()) return *verdict.exit_code;
  // Folders this process writes, checked before the job starts: a
  // checkpoint folder it could not create was found only at the final
  // checkpoint, retried for a minute, and the job "completed" without it.
  for (const auto& [flag, dir] : {std::pair<const char*, std::string>{"state_dir", state_dir},
                                  {"checkpoint_dir", config.checkpoint_dir()}}) {
    if (dir.empty()) continue;
    if (absl::Status s = CreateWritableDir(env, dir); !s.ok()) {
      spdlog::error("--{}: cannot write in {}: {}", flag, dir, std::string(s.message()));
      return 1;
    }
  }

  CoordinatorOptions options;
  options.env = env;
  options.state_path = state_path;
  options.member_key = MemberKey(ProcessSecurity().admin_token);
  CoordinatorService service(config, map, &absl::Now, options);
  if (std::optional<int> code = PlaceJob(env, config, map, verdict, state_path, &service))
    return *code;
  absl::StatusOr<Serving> serving = StartServing(env, config, map, &service);
  if (!serving.ok()) {
    spdlog::error("{}", std::string(serving.status().message()));
    return ExitCodeOf(serving.status());
  }

  RunUntilTheJobEnds(config, &service);
  LingerUntilEveryMemberHeard(&service);
  if (absl::Status s = service.PersistState(/*force=*/true); !s.ok())
    spdlog::warn("state file: {}", std::string(s.message()));
  service.Shutdown();
  // In-flight unary calls take milliseconds and blocked ones were released
  // above. gRPC's Shutdown always waits out its deadline here (something
  // stays pending until cancelled: measured, 500 ms of a 500 ms deadline,
  // 50 of 50), so the deadline is short: every member has heard the end and
  // the state is saved.
  serving->server.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(50)));

  const v1::JobStatus status = service.Status();
  spdlog::info("{}", ResultLine(status));
  // The state is saved and every member has heard the end; skip gRPC's
  // library shutdown (see ExitNow).
  ExitNow(status.state() == v1::JOB_STATE_FAILED ? 1 : 0);
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
