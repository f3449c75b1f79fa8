// grps-coordinator: the control plane of one job. Serves grps.v1.Coordinator
// until the job completes or is stopped, then waits (up to --linger_ms) until
// every live daemon has been told, and exits 0.
//
// Exit codes: 0 when the job completed or was stopped (also by SIGINT or
// SIGTERM); 1 when it could not serve; 2 for an invalid job configuration.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/job_flags.h"
#include "daemon/daemon.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port to serve on (port 0 picks a free one; see --port_file)");
ABSL_FLAG(std::string, port_file, "",
          "after listening, write the bound port to this file (atomically)");
ABSL_FLAG(int32_t, linger_ms, 3000,
          "after the job ends, wait up to this long for every live daemon to "
          "learn it before exiting");

namespace grps {
namespace {

// Writes "<port>\n" to a temporary file beside `path`, then renames it over
// `path`, so a reader never sees a partial file.
absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr)
    return absl::UnavailableError(
        absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  const bool written = std::fprintf(f, "%d\n", port) > 0 && std::fflush(f) == 0 &&
                       fsync(fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  ParseFlagsWithEnvironment(
      argc, argv,
      "grps-coordinator [--mode=sync|async|ssp] [--servers=N] [--workers=M] "
      "[--listen=HOST:PORT] [--port_file=FILE] ...: the control plane of a "
      "grps job (every flag can also be set as GRPS_<FLAG>)");
  InitLogging("coordinator");
  InstallShutdownHandlers();

  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "grps-coordinator: invalid job: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<v1::ShardMap> map = BuildShardMap(
      ModelTensors(*config), config->num_servers(), config->chunk_bytes());
  if (!map.ok()) {
    std::fprintf(stderr, "grps-coordinator: invalid job: %s\n",
                 std::string(map.status().message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_linger_ms) < 0) {
    std::fprintf(stderr, "grps-coordinator: --linger_ms must be >= 0\n");
    return 2;
  }

  CoordinatorService service(*config, *map);
  const std::string listen = absl::GetFlag(FLAGS_listen);
  absl::StatusOr<GrpcServer> server = StartGrpcServer(listen, {&service});
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return 1;
  }
  spdlog::info(
      "job {}: {} {} ({} chunks), {}, {} servers, {} workers; listening on {}",
      config->job_id(), ModelName(config->model()),
      absl::StrJoin(LayerWidths(*config), "-"), map->chunks_size(),
      ModeName(config->mode()), config->num_servers(), config->num_workers(),
      WithPort(listen, server->port));
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file);
      !port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, server->port); !s.ok()) {
      spdlog::error("--port_file: {}", std::string(s.message()));
      server->server->Shutdown(absl::ToChronoTime(absl::Now()));
      return 1;
    }
  }

  // Failure detection every heartbeat interval, on this thread, until the
  // job ends or a signal arrives.
  const absl::Duration tick = absl::Milliseconds(config->heartbeat_interval_ms());
  absl::Time next_tick = absl::Now() + tick;
  while (true) {
    if (ShutdownRequested()) {
      service.Stop("the coordinator received a shutdown signal");
      break;
    }
    if (absl::Now() >= next_tick) {
      service.DetectFailures();
      next_tick = absl::Now() + tick;
    }
    const absl::Duration wait =
        std::min(absl::Milliseconds(100), next_tick - absl::Now());
    if (service.WaitForEnd(std::max(wait, absl::ZeroDuration()))) break;
  }

  // Linger so that every live daemon hears the final state from a heartbeat
  // reply and exits by itself; a member that dies meanwhile stops counting.
  const absl::Time linger_end =
      absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_linger_ms));
  while (absl::Now() < linger_end && !service.EveryLiveMemberSawEnd()) {
    service.DetectFailures();
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!service.EveryLiveMemberSawEnd())
    spdlog::warn("exiting before every live daemon heard that the job ended");

  service.Shutdown();
  // In-flight unary calls take milliseconds and blocked ones were released
  // above; a client that keeps its connection open should not delay exit.
  server->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));

  const v1::JobStatus status = service.Status();
  std::string result = absl::StrCat(
      "job ", status.job_id(), " ", JobStateName(status.state()), " after ",
      absl::FormatDuration(absl::Seconds(static_cast<int64_t>(status.elapsed_seconds()))),
      " at global step ", status.global_step());
  if (status.has_final_eval())
    absl::StrAppend(&result, "; final test accuracy ",
                    absl::SixDigits(status.final_test_accuracy()), ", loss ",
                    absl::SixDigits(status.final_test_loss()));
  if (!status.message().empty()) absl::StrAppend(&result, " (", status.message(), ")");
  spdlog::info("{}", result);
  spdlog::default_logger()->flush();
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
