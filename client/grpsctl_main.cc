// grpsctl: the command-line client of a running job. Talks to the
// coordinator (client/job_client.h), but for `health`, which asks any
// daemon's gRPC health service; prints tables (client/status_format.h) or
// JSON.
//
// Exit status: 0 success; 1 an error (coordinator unreachable, RPC failed,
// `watch` saw the job fail or be stopped, or `health` did not hear SERVING);
// 2 a usage error.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_client.h"
#include "client/status_format.h"
#include "daemon/daemon.h"
#include "job/job_config.h"

ABSL_FLAG(std::string, coordinator, "",
          "the job's coordinator, HOST:PORT (or set GRPS_COORDINATOR)");
ABSL_FLAG(bool, json, false, "print JSON (proto field names) instead of tables");
ABSL_FLAG(std::string, reason, "stopped by grpsctl",
          "stop: why the job is stopped (shown in its status)");
ABSL_FLAG(int32_t, interval_ms, 1000, "watch: milliseconds between snapshots");
ABSL_FLAG(bool, wait, false,
          "checkpoint: wait until the checkpoint is complete or failed; scale: until the "
          "job has re-sharded");
ABSL_FLAG(int32_t, wait_s, 300, "checkpoint/scale --wait: give up after this many seconds");
ABSL_FLAG(uint32_t, servers, 0, "scale: the shard count to re-shard the job to");
ABSL_FLAG(std::string, address, "",
          "health: the daemon to ask, HOST:PORT (default: --coordinator)");

namespace grps {
namespace {

constexpr char kUsage[] =
    "looks at and controls a running grps job through its coordinator.\n"
    "\n"
    "usage: grpsctl [--coordinator=HOST:PORT] [--json] COMMAND [flags]\n"
    "\n"
    "commands:\n"
    "  status    job state and progress, the workers table, the shards table\n"
    "  watch     stream the status until the job ends or Ctrl-C\n"
    "            [--interval_ms=1000]\n"
    "  workers   the workers table\n"
    "  shards    per-shard counters and the shard map (chunk placement)\n"
    "  stop      stop the job [--reason=TEXT]\n"
    "  drain RANK  worker RANK leaves the job after its step in progress\n"
    "            (as on SIGTERM); a worker started for the rank rejoins\n"
    "  checkpoint  take a checkpoint now [--wait [--wait_s=300]]\n"
    "  scale --servers=K  re-shard the running job to K shards (a job started\n"
    "            with --max_servers; new shards need a server started with\n"
    "            --shard) [--wait [--wait_s=300]]\n"
    "  health    whether a daemon's gRPC health service says SERVING (exit 0)\n"
    "            [--address=HOST:PORT, default --coordinator]; over TLS when\n"
    "            --tls_ca is set, needs no token (a Kubernetes exec probe)\n"
    "\n"
    "--coordinator defaults to $GRPS_COORDINATOR. Exit status: 0 ok, 1 error\n"
    "(coordinator unreachable, RPC failed, watched job failed, health not\n"
    "SERVING), 2 usage error.";

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

int UsageError(const std::string& message) {
  std::fprintf(stderr, "grpsctl: %s\nrun 'grpsctl --help' for usage\n",
               message.c_str());
  return kExitUsage;
}

int Fail(const absl::Status& status) {
  // The code too: UNAUTHENTICATED and PERMISSION_DENIED say what to fix.
  std::fprintf(stderr, "grpsctl: %s (%s)\n", std::string(status.message()).c_str(),
               absl::StatusCodeToString(status.code()).c_str());
  return kExitError;
}

// Prints one JSON document on stdout.
int PrintJson(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message);
  if (!json.ok()) return Fail(json.status());
  std::printf("%s\n", json->c_str());
  return 0;
}

int Status(const JobClient& client, bool json) {
  absl::StatusOr<v1::JobStatus> status = client.GetStatus();
  if (!status.ok()) return Fail(status.status());
  if (json) return PrintJson(*status);
  std::fputs(FormatJobStatus(*status, absl::ToUnixMillis(absl::Now())).c_str(), stdout);
  return 0;
}

int Workers(const JobClient& client, bool json) {
  absl::StatusOr<v1::JobStatus> status = client.GetStatus();
  if (!status.ok()) return Fail(status.status());
  if (!json) {
    std::printf("job %s: %d workers\n", status->job_id().c_str(),
                status->workers_size());
    std::fputs(FormatWorkersTable(*status).c_str(), stdout);
    return 0;
  }
  std::vector<std::string> workers;
  for (const v1::WorkerStatus& w : status->workers()) {
    absl::StatusOr<std::string> one = ToJson(w);
    if (!one.ok()) return Fail(one.status());
    workers.push_back(*std::move(one));
  }
  std::printf("[%s]\n", absl::StrJoin(workers, ",").c_str());
  return 0;
}

int Shards(const JobClient& client, bool json) {
  absl::StatusOr<v1::JobStatus> status = client.GetStatus();
  if (!status.ok()) return Fail(status.status());
  absl::StatusOr<v1::ShardMap> map = client.GetShardMap();
  if (!map.ok()) return Fail(map.status());
  if (!json) {
    std::printf("job %s: %d shards\n", status->job_id().c_str(),
                status->shards_size());
    std::fputs(FormatShardsTable(*status).c_str(), stdout);
    std::printf("\n%s", FormatShardMap(*map).c_str());
    return 0;
  }
  std::vector<std::string> shards;
  for (const v1::ShardStatus& s : status->shards()) {
    absl::StatusOr<std::string> one = ToJson(s);
    if (!one.ok()) return Fail(one.status());
    shards.push_back(*std::move(one));
  }
  absl::StatusOr<std::string> map_json = ToJson(*map);
  if (!map_json.ok()) return Fail(map_json.status());
  std::printf("{\"shards\":[%s],\"shard_map\":%s}\n",
              absl::StrJoin(shards, ",").c_str(), map_json->c_str());
  return 0;
}

// Redraws the whole status on a terminal; prints one line (or one JSON
// document) per snapshot otherwise. Ctrl-C ends it (default SIGINT action).
int Watch(const JobClient& client, bool json) {
  const bool tty = isatty(STDOUT_FILENO);
  v1::JobStatus last;
  bool any = false;
  absl::Status render_error;
  absl::Status s = client.Watch(
      absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms)),
      [&](const v1::JobStatus& status) {
        last = status;
        any = true;
        if (json) {
          absl::StatusOr<std::string> line = ToJson(status);
          if (!line.ok()) {
            render_error = line.status();
            return false;
          }
          std::printf("%s\n", line->c_str());
        } else if (tty) {
          std::printf("\033[H\033[2J%s", FormatJobStatus(status, absl::ToUnixMillis(absl::Now())).c_str());
        } else {
          std::printf("%s\n", FormatStatusLine(status).c_str());
        }
        std::fflush(stdout);
        return true;
      });
  if (!render_error.ok()) return Fail(render_error);
  if (!s.ok()) return Fail(s);
  if (any && (last.state() == v1::JOB_STATE_FAILED ||
              last.state() == v1::JOB_STATE_STOPPED)) {
    std::fprintf(stderr, "grpsctl: job %s %s%s%s\n", last.job_id().c_str(),
                 JobStateName(last.state()).c_str(),
                 last.message().empty() ? "" : ": ", last.message().c_str());
    return kExitError;
  }
  return 0;
}

int Stop(const JobClient& client) {
  absl::Status s = client.Stop(absl::GetFlag(FLAGS_reason));
  if (!s.ok()) return Fail(s);
  std::printf("stop requested (coordinator %s)\n", client.target().c_str());
  return 0;
}

int Drain(const JobClient& client, const std::string& rank_text) {
  uint32_t rank = 0;
  if (!absl::SimpleAtoi(rank_text, &rank))
    return UsageError(absl::StrCat("drain: '", rank_text, "' is not a worker rank"));
  if (absl::Status s = client.Drain(rank); !s.ok()) return Fail(s);
  std::printf("worker %u drained: it leaves after its step in progress (see grpsctl workers)\n",
              rank);
  return 0;
}

int Checkpoint(const JobClient& client, bool json) {
  const bool wait = absl::GetFlag(FLAGS_wait);
  absl::StatusOr<v1::CheckpointSummary> c = client.Checkpoint(
      wait, absl::Seconds(std::max<int32_t>(1, absl::GetFlag(FLAGS_wait_s))));
  if (!c.ok()) return Fail(c.status());
  if (json) return PrintJson(*c);
  switch (c->state()) {
    case v1::CHECKPOINT_STATE_COMPLETE:
      std::printf("checkpoint %llu complete at step %llu: %s in %s, %s\n",
                  static_cast<unsigned long long>(c->id()),
                  static_cast<unsigned long long>(c->step()),
                  HumanBytes(c->bytes()).c_str(), HumanDuration(c->seconds()).c_str(),
                  c->dir().c_str());
      return 0;
    case v1::CHECKPOINT_STATE_FAILED:
      std::fprintf(stderr, "grpsctl: checkpoint %llu failed: %s\n",
                   static_cast<unsigned long long>(c->id()), c->error().c_str());
      return kExitError;
    default:
      std::printf("checkpoint %llu asked for%s (%s); see grpsctl status\n",
                  static_cast<unsigned long long>(c->id()),
                  c->step() > 0 ? absl::StrCat(" at step ", c->step()).c_str() : "",
                  c->dir().c_str());
      return 0;
  }
}

// Re-shards the job; with --wait, polls its status until the move is done.
int Scale(const JobClient& client) {
  const uint32_t servers = absl::GetFlag(FLAGS_servers);
  if (servers == 0) return UsageError("scale needs --servers=K (K >= 1)");
  absl::StatusOr<v1::ReshardProgress> asked = client.ScaleServers(servers);
  if (!asked.ok()) return Fail(asked.status());
  if (asked->target_servers() == 0) {
    std::printf("the job has %u shards\n", servers);
    return 0;
  }
  std::printf("re-sharding to %u shards asked for: %s\n", servers, asked->phase().c_str());
  if (!absl::GetFlag(FLAGS_wait)) return 0;
  const absl::Time deadline =
      absl::Now() + absl::Seconds(std::max<int32_t>(1, absl::GetFlag(FLAGS_wait_s)));
  std::string phase = asked->phase();
  while (absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    absl::StatusOr<v1::JobStatus> status = client.GetStatus();
    // A call the coordinator dropped while it moved the job: asked again.
    if (!status.ok() &&
        (absl::IsCancelled(status.status()) || absl::IsUnavailable(status.status())))
      continue;
    if (!status.ok()) return Fail(status.status());
    const v1::ReshardProgress& r = status->reshard();
    const JobClient::ScaleWait wait =
        JobClient::JudgeScaleWait(*status, servers, asked->completed());
    switch (wait.outcome) {
      case JobClient::ScaleWait::kSuperseded:
        return Fail(absl::FailedPreconditionError(absl::StrCat(
            "another scale asked for ", wait.other, " shards meanwhile; the job ",
            r.target_servers() != 0 ? "moves there" : "moved there", ", not to ", servers)));
      case JobClient::ScaleWait::kAskedBack:
        std::printf("the job has %u shards\n", servers);
        return 0;
      case JobClient::ScaleWait::kDone:
        std::printf(
            "re-sharded from %u to %u shards at step %llu (%s after it was asked for); "
            "shard map epoch %llu\n",
            r.last_from(), r.last_to(), static_cast<unsigned long long>(r.last_step()),
            HumanDuration(r.last_seconds()).c_str(),
            static_cast<unsigned long long>(status->map_epoch()));
        return 0;
      case JobClient::ScaleWait::kUnderWay:
        break;
    }
    if (status->state() != v1::JOB_STATE_RUNNING && status->state() != v1::JOB_STATE_WAITING)
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("the job ended (", JobStateName(status->state()), ") before it re-sharded")));
    if (r.phase() != phase && !r.phase().empty()) {
      phase = r.phase();
      std::printf("%s\n", phase.c_str());
    }
  }
  return Fail(absl::DeadlineExceededError(
      absl::StrCat("not re-sharded to ", servers, " shards after --wait_s")));
}

// How long `health` waits for the answer: under a Kubernetes probe's own
// timeout (deploy/ gives it 5 s).
constexpr absl::Duration kHealthTimeout = absl::Seconds(3);

// Asks the daemon at `target` for the whole server's health. Its own
// channel, not a JobClient: any daemon, not only the coordinator.
int Health(const std::string& target) {
  absl::StatusOr<bool> serving = IsServing(MakeChannel(target), kHealthTimeout);
  if (!serving.ok()) return Fail(serving.status());
  std::printf("%s: %s\n", target.c_str(), *serving ? "SERVING" : "NOT_SERVING");
  return *serving ? 0 : kExitError;
}

int Main(int argc, char** argv) {
  std::string problem = CheckCommandLine(argc, argv);
  if (!problem.empty()) return UsageError(problem);
  // grpsctl serves nothing: no metrics, no clients to authenticate.
  std::vector<char*> args = ParseFlagsWithEnvironment(argc, argv, kUsage,
                                                      {"metrics_listen", "tls_client_auth"});
  if (args.size() < 2) return UsageError("no command given");
  const std::string command = args[1];
  // Only drain takes an argument: its rank.
  if (args.size() != (command == "drain" ? 3u : 2u))
    return UsageError(command == "drain" ? "drain takes one worker rank"
                                         : "expected exactly one command");
  std::string target = absl::GetFlag(FLAGS_coordinator);
  if (command != "status" && command != "watch" && command != "workers" &&
      command != "shards" && command != "stop" && command != "checkpoint" &&
      command != "drain" && command != "health" && command != "scale")
    return UsageError(absl::StrCat("unknown command '", command, "'"));
  if (command == "health" && !absl::GetFlag(FLAGS_address).empty())
    target = absl::GetFlag(FLAGS_address);
  if (target.empty())
    return UsageError(command == "health"
                          ? "set --address=HOST:PORT (or --coordinator)"
                          : "set --coordinator=HOST:PORT or GRPS_COORDINATOR");
  if (absl::GetFlag(FLAGS_interval_ms) <= 0)
    return UsageError("--interval_ms must be positive");

  if (absl::Status s = InitProcessSecurity(Role::kAdmin, /*serves=*/false); !s.ok())
    return UsageError(std::string(s.message()));
  if (command == "health") return Health(target);
  JobClient client(target);
  const bool json = absl::GetFlag(FLAGS_json);
  if (command == "status") return Status(client, json);
  if (command == "watch") return Watch(client, json);
  if (command == "workers") return Workers(client, json);
  if (command == "shards") return Shards(client, json);
  if (command == "checkpoint") return Checkpoint(client, json);
  if (command == "drain") return Drain(client, args[2]);
  if (command == "scale") return Scale(client);
  return Stop(client);
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
