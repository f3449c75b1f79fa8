#include "launcher/local_launcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/job_client.h"
#include "client/status_format.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "job/job_config.h"

namespace grps {
namespace {

namespace fs = std::filesystem;

constexpr int kLogTailLines = 20;
constexpr size_t kLogTailBytes = 64 * 1024;
constexpr absl::Duration kSupervisePeriod = absl::Milliseconds(50);
// How long after the job ended a standby server may still be registering
// before it is asked to leave (the servers of the map's shards exit within
// a heartbeat of the end by themselves).
constexpr absl::Duration kStandbyGrace = absl::Seconds(2);

int TerminalWidth(std::FILE* out) {
  winsize ws = {};
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

// Writes `contents` to a new file only its owner can read.
absl::Status WriteSecretFile(const std::string& path, const std::string& contents) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && fchmod(fd, 0600) == 0 &&
            write(fd, contents.data(), contents.size()) ==
                static_cast<ssize_t>(contents.size());
  if (fd >= 0) ok = close(fd) == 0 && ok;
  if (ok) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
}

}  // namespace

std::string DefaultRunDir(const std::string& mode, absl::Time now,
                          absl::TimeZone zone) {
  return absl::StrCat("runs/", mode, "-", absl::FormatTime("%Y%m%d-%H%M%S", now, zone));
}

absl::StatusOr<int> ParsePort(const std::string& contents) {
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(contents), &port) || port < 1 ||
      port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("not a port number: '", contents, "'"));
  return port;
}

std::string TailOfFile(const std::string& path, int max_lines) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::StrCat("(cannot read ", path, ": ", std::strerror(errno), ")\n");
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  const std::streamoff start =
      size > static_cast<std::streamoff>(kLogTailBytes) ? size - kLogTailBytes : 0;
  f.seekg(start);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (text.empty()) return "(empty)\n";
  if (text.back() != '\n') text += '\n';
  // Walk back over max_lines line ends (the last one ends the last line).
  size_t begin = text.size() - 1;
  for (int lines = 0; begin > 0; --begin)
    if (text[begin - 1] == '\n' && ++lines == max_lines) break;
  return text.substr(begin);
}

LocalLauncher::LocalLauncher(LaunchOptions options, std::FILE* out,
                             std::function<bool()> interrupted)
    : options_(std::move(options)),
      out_(out),
      interrupted_(std::move(interrupted)),
      tty_(isatty(fileno(out)) == 1) {}

void LocalLauncher::Say(const std::string& message) {
  if (bar_drawn_) std::fputc('\n', out_);
  bar_drawn_ = false;
  std::fprintf(out_, "%s\n", message.c_str());
  std::fflush(out_);
}

absl::Status LocalLauncher::StartChild(const ChildSpec& spec, Role role,
                                       uint32_t index) {
  auto child = std::make_unique<ChildProcess>(spec.name, spec.argv, spec.log_path,
                                              spec.environment);
  absl::Status s = child->Start();
  children_.push_back(std::move(child));
  child_role_.push_back(role);
  child_index_.push_back(index);
  death_handled_.push_back(false);
  const size_t newest = children_.size() - 1;
  switch (role) {
    case Role::kCoordinator:
      coordinator_child_ = newest;
      break;
    case Role::kServer:
      if (server_restarts_.size() <= index) server_restarts_.resize(index + 1, 0);
      break;
    case Role::kWorker:
      if (worker_child_.size() <= index) {
        worker_child_.resize(index + 1, 0);
        worker_restarts_.resize(index + 1, 0);
      }
      worker_child_[index] = newest;
      break;
  }
  return s;
}

absl::Status LocalLauncher::OnDaemonCrashed(size_t child_index) {
  death_handled_[child_index] = true;
  const ChildProcess& dead = *children_[child_index];
  const bool is_coordinator = child_role_[child_index] == Role::kCoordinator;
  const bool job_ended = latest_ && JobEnded(latest_->state());
  if (!dead.killed_by_signal() || job_ended)
    return absl::FailedPreconditionError(
        absl::StrCat(dead.name(), " ", dead.DescribeExit()));
  if (is_coordinator) {
    if (coordinator_restarts_ >= options_.restart_coordinator)
      return absl::FailedPreconditionError(absl::StrCat(
          dead.name(), " ", dead.DescribeExit(), " (no coordinator restarts left)"));
    ++coordinator_restarts_;
    ChildSpec spec = CoordinatorSpec(options_, coordinator_port_);
    spec.log_path = InDir(options_.run_dir,
                          absl::StrCat("coordinator.restart-", coordinator_restarts_, ".log"));
    Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                     "; restarting it on port ", coordinator_port_, " (restart ",
                     coordinator_restarts_, " of ", options_.restart_coordinator,
                     "), log ", spec.log_path));
    return StartChild(spec, Role::kCoordinator);
  }
  const uint32_t shard = child_index_[child_index];
  if (servers_restarted_ >= options_.restart_servers)
    return absl::FailedPreconditionError(absl::StrCat(
        dead.name(), " ", dead.DescribeExit(), " (no server restarts left)"));
  ++servers_restarted_;
  ++server_restarts_[shard];
  ChildSpec spec = ServerSpec(options_, shard, coordinator_address_);
  spec.log_path = InDir(options_.run_dir, absl::StrCat("server-", shard, ".restart-",
                                                       server_restarts_[shard], ".log"));
  Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                   "; restarting it with --shard=", shard, " (restart ",
                   servers_restarted_, " of ", options_.restart_servers, "), log ",
                   spec.log_path));
  return StartChild(spec, Role::kServer, shard);
}

namespace {

bool SaidRetired(const ChildProcess& server) {
  // Its last words: "shard 2 exiting (shard 2 retired: the job re-sharded
  // to 1 shards): ...". A server that exits 0 otherwise (the job ended, a
  // signal) is not started again.
  std::ifstream log(server.log_path(), std::ios::binary);
  if (!log) return false;
  log.seekg(0, std::ios::end);
  const std::streamoff size = log.tellg();
  log.seekg(std::max<std::streamoff>(0, size - 4096));
  const std::string tail((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  return absl::StrContains(tail, " retired: the job re-sharded to ");
}

}  // namespace

void LocalLauncher::StopStandbys(absl::Time now) {
  // The servers of the shards in the job's map hear the end and exit within
  // a heartbeat; a standby still registering after that has nothing to
  // serve (and, with the coordinator gone, no one to ask).
  if (standbys_.empty() || now < stop_standbys_at_) return;
  for (size_t i : standbys_)
    if (children_[i]->running()) children_[i]->Signal(SIGTERM);
  standbys_.clear();
}

absl::Status LocalLauncher::OnServerRetired(size_t child_index) {
  death_handled_[child_index] = true;
  const uint32_t shard = child_index_[child_index];
  ++server_restarts_[shard];
  ChildSpec spec = ServerSpec(options_, shard, coordinator_address_);
  spec.log_path = InDir(options_.run_dir, absl::StrCat("server-", shard, ".standby-",
                                                       server_restarts_[shard], ".log"));
  Say(absl::StrCat("grps-local: ", children_[child_index]->name(),
                   " left the job (its shard was re-sharded away); it stands by again, log ",
                   spec.log_path));
  absl::Status started = StartChild(spec, Role::kServer, shard);
  standbys_.push_back(children_.size() - 1);
  return started;
}

absl::Status LocalLauncher::OnWorkerDied(size_t child_index) {
  const ChildProcess& dead = *children_[child_index];
  const uint32_t rank = child_index_[child_index];
  // A worker that dies after the job ended has nothing left to rejoin.
  const bool job_ended =
      coordinator().exited() || (latest_ && JobEnded(latest_->state()));
  const bool restart = workers_restarted_ < options_.restart_workers && !job_ended;
  // The coordinator waits for every worker to register before the job runs;
  // one that dies before then (most likely a bad flag or a missing file)
  // leaves the job waiting for good.
  std::optional<bool> started;
  if (!restart) {
    started = JobStartedWhenItExited(child_index);
    if (!started) return absl::OkStatus();  // looked at again next time
  }
  death_handled_[child_index] = true;
  ++workers_died_;
  if (restart) {
    ++workers_restarted_;
    ++worker_restarts_[rank];
    ChildSpec spec = WorkerSpec(options_, rank, coordinator_address_);
    spec.log_path = InDir(options_.run_dir,
                          absl::StrCat("worker-", rank, ".restart-",
                                       worker_restarts_[rank], ".log"));
    Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                     "; restarting it with ",
                     options_.entry.empty() ? "--rank=" : "GRPS_RANK=", rank, " (restart ",
                     workers_restarted_, " of ", options_.restart_workers, "), log ",
                     spec.log_path));
    return StartChild(spec, Role::kWorker, rank);
  }
  if (!*started)
    return absl::FailedPreconditionError(absl::StrCat(
        dead.name(), " ", dead.DescribeExit(),
        " before the job started; the job cannot start without it"));
  uint32_t going_on = 0;
  for (size_t index : worker_child_) {
    const ChildProcess& newest = *children_[index];
    if (newest.running() || newest.succeeded()) ++going_on;
  }
  Say(absl::StrCat("grps-local: ", dead.name(), " ", dead.DescribeExit(),
                   "; the job goes on with ", going_on, " of ", options_.workers,
                   " workers",
                   options_.restart_workers > 0 && !job_ended ? " (no restarts left)" : ""));
  return absl::OkStatus();
}

bool LocalLauncher::JobStarted() const {
  return latest_ && latest_->state() != v1::JOB_STATE_WAITING &&
         latest_->state() != v1::JOB_STATE_UNSPECIFIED;
}

std::optional<bool> LocalLauncher::JobStartedWhenItExited(size_t child_index) {
  // Counted before the refresh, so that latest_ is at least that snapshot.
  const uint64_t snapshots = feed_->count();
  RefreshStatus();
  if (JobStarted() || coordinator().exited()) {
    exited_at_snapshot_.erase(child_index);
    return true;
  }
  // The snapshot after the one at hand may have been on its way when the
  // worker exited; the one after that was built since.
  const uint64_t seen_at = exited_at_snapshot_.try_emplace(child_index, snapshots).first->second;
  if (snapshots < seen_at + 2) return std::nullopt;
  exited_at_snapshot_.erase(child_index);
  return false;
}

absl::Status LocalLauncher::OnWorkerExited0(size_t child_index) {
  const std::optional<bool> started = JobStartedWhenItExited(child_index);
  if (!started) return absl::OkStatus();  // looked at again next time
  death_handled_[child_index] = true;
  if (*started) return absl::OkStatus();  // it finished its part
  const ChildProcess& worker = *children_[child_index];
  const uint32_t rank = child_index_[child_index];
  const bool registered = std::any_of(
      latest_->workers().begin(), latest_->workers().end(), [rank](const v1::WorkerStatus& w) {
        return w.rank() == rank && w.state() != v1::MEMBER_STATE_UNSPECIFIED;
      });
  return absl::FailedPreconditionError(
      absl::StrCat(worker.name(), " ", worker.DescribeExit(), " before ",
                   registered ? "the job started" : "it joined the job",
                   " (it trained nothing); the job cannot start without it"));
}

const ChildProcess* LocalLauncher::EveryWorkerDead() const {
  const ChildProcess* last = nullptr;
  for (size_t index : worker_child_) {
    const ChildProcess& newest = *children_[index];
    if (!newest.exited() || newest.succeeded()) return nullptr;
    last = &newest;
  }
  return last;
}

void LocalLauncher::RefreshStatus() {
  // The feed has nothing newer than the end read from the state file.
  if (feed_ == nullptr || end_from_state_file_) return;
  if (auto latest = feed_->Latest()) latest_ = std::move(latest);
  if (auto final_eval = feed_->WithFinalEval()) final_eval_ = std::move(final_eval);
  // A coordinator restarted near the end may finish the job and exit before
  // the feed dials it again (gRPC waits out its reconnect backoff between
  // refused dials): the ending snapshot is then in its state file.
  if (coordinator().exited() && !(latest_ && JobEnded(latest_->state()))) {
    if (std::optional<v1::JobStatus> ended = EndFromStateFile()) {
      latest_ = std::move(ended);
      if (latest_->has_final_eval()) final_eval_ = latest_;
      end_from_state_file_ = true;
    }
  }
}

std::optional<v1::JobStatus> LocalLauncher::EndFromStateFile() const {
  absl::StatusOr<std::string> bytes =
      Env::Default()->ReadFile(InDir(options_.run_dir, kCoordinatorStateFile));
  v1::CoordinatorState state;
  if (!bytes.ok() || !state.ParseFromString(*bytes) || !state.has_final_status() ||
      !JobEnded(state.final_status().state()))
    return std::nullopt;
  // Not a file an earlier launch in this run dir left.
  if (absl::FromUnixMillis(static_cast<int64_t>(state.unix_time_ms())) < start_)
    return std::nullopt;
  return state.final_status();
}

void LocalLauncher::ShowProgress(absl::Time now) {
  if (!latest_) return;
  const uint64_t count = feed_->count();
  const bool fresh = count != snapshots_seen_;
  snapshots_seen_ = count;
  JobProgress progress =
      options_.entry.empty() ? ProgressOf(*latest_) : EntryProgressOf(*latest_);
  // The rate counts from the first step, not from start-up (loading data).
  if (fresh && progress.state == v1::JOB_STATE_RUNNING && progress.step > 0)
    eta_.Observe(now, progress.step);
  // No ETA ("?") while the job's steps are not known.
  std::optional<double> eta =
      progress.total > 0 ? eta_.SecondsLeft(progress.total) : std::nullopt;
  if (tty_) {
    if (!fresh) return;
    std::fprintf(out_, "\r%s\033[K",
                 ProgressBar(progress, eta, TerminalWidth(out_) - 1).c_str());
    bar_drawn_ = true;
  } else {
    if (now < next_plain_line_) return;
    std::fprintf(out_, "%s\n", ProgressLine(progress, eta).c_str());
    next_plain_line_ = now + options_.plain_progress_period;
  }
  std::fflush(out_);
}

std::optional<int> LocalLauncher::PrepareRunDir() {
  std::error_code ec;
  fs::create_directories(options_.run_dir, ec);
  if (ec)
    return Finish("failed",
                  absl::StrCat("cannot create run dir ", options_.run_dir, ": ",
                               ec.message()),
                  nullptr);
  std::fprintf(out_, "run dir: %s\n", options_.run_dir.c_str());
  std::fflush(out_);
  if (!options_.token.empty()) {
    const std::string path = InDir(options_.run_dir, "token");
    // The worker token too: a worker started by hand (a rank that comes
    // back) needs it.
    for (const auto& [file, token] :
         {std::pair<std::string, std::string>{path, options_.token},
          {InDir(options_.run_dir, "worker_token"), options_.worker_token}})
      if (absl::Status s = WriteSecretFile(file, token + "\n"); !s.ok())
        return Finish("failed", std::string(s.message()), nullptr);
    std::fprintf(out_, "auth: every RPC needs the job's token, %s: %s%s\n",
                 options_.token_generated ? "generated for it" : "given in GRPS_TOKEN",
                 path.c_str(), options_.tls_flags.empty() ? "" : " (and TLS)");
  } else {
    std::fprintf(out_, "auth: off (--noauth): anyone who can reach the ports may act "
                       "on the job\n");
  }
  std::vector<const char*> binaries = {kCoordinatorBinary, kServerBinary};
  if (options_.entry.empty()) binaries.push_back(kWorkerBinary);  // else the user's command
  for (const char* binary : binaries) {
    const std::string path = InDir(options_.bin_dir, binary);
    if (access(path.c_str(), X_OK) != 0)
      return Finish("failed",
                    absl::StrCat("cannot find ", binary, " in ", options_.bin_dir,
                                 " (build it, or point --bin_dir at it)"),
                    nullptr);
  }
  return std::nullopt;
}

std::optional<int> LocalLauncher::StartCoordinator() {
  const std::string port_file = CoordinatorPortFile(options_);
  std::error_code ec;
  fs::remove(port_file, ec);
  if (absl::Status s = StartChild(CoordinatorSpec(options_), Role::kCoordinator);
      !s.ok())
    return Finish("failed", std::string(s.message()), nullptr);
  const absl::Time port_deadline = absl::Now() + options_.port_file_timeout;
  while (true) {
    if (interrupted_()) return Finish("interrupted", "interrupted", nullptr);
    if (children_.front()->Poll())
      return Finish("failed",
                    absl::StrCat("coordinator ", coordinator().DescribeExit(),
                                 " before it was listening"),
                    &coordinator());
    std::ifstream f(port_file);
    std::stringstream contents;
    contents << f.rdbuf();
    if (absl::StatusOr<int> port = ParsePort(contents.str()); f && port.ok()) {
      coordinator_port_ = *port;
      break;
    }
    if (absl::Now() >= port_deadline)
      return Finish("failed",
                    absl::StrCat("coordinator wrote no port to ", port_file, " within ",
                                 absl::FormatDuration(options_.port_file_timeout)),
                    &coordinator());
    absl::SleepFor(kSupervisePeriod);
  }
  coordinator_address_ = absl::StrCat("127.0.0.1:", coordinator_port_);
  // The TLS files grpsctl needs to call it too (the job's own certificate is
  // its client certificate under mutual TLS); --tls_client_auth is a
  // server's.
  std::string tls;
  for (const std::string& flag : options_.tls_flags)
    if (!absl::StartsWith(flag, "--tls_client_auth")) absl::StrAppend(&tls, flag, " ");
  Say(absl::StrCat("coordinator: ", coordinator_address_, "   (",
                   options_.token.empty()
                       ? ""
                       : absl::StrCat("GRPS_TOKEN=$(cat ", InDir(options_.run_dir, "token"), ") "),
                   "grpsctl --coordinator=", coordinator_address_, " ", tls, "status)"));
  return std::nullopt;
}

std::optional<int> LocalLauncher::StartMembers() {
  const std::string& address = coordinator_address_;
  // Asked before each start: a launch of many members takes a while to
  // start them all (each start waits for its exec).
  for (uint32_t shard = 0; shard < options_.servers + options_.standby_servers; ++shard) {
    if (interrupted_()) return Finish("interrupted", "interrupted", nullptr);
    if (absl::Status s = StartChild(ServerSpec(options_, shard, address), Role::kServer, shard);
        !s.ok())
      return Finish("failed", std::string(s.message()), nullptr);
    if (shard >= options_.servers) standbys_.push_back(children_.size() - 1);
  }
  for (uint32_t rank = 0; rank < options_.workers; ++rank) {
    if (interrupted_()) return Finish("interrupted", "interrupted", nullptr);
    if (absl::Status s = StartChild(WorkerSpec(options_, rank, address), Role::kWorker, rank);
        !s.ok())
      return Finish("failed", std::string(s.message()), nullptr);
  }
  Say(absl::StrCat("started ", options_.servers, " servers",
                   options_.standby_servers > 0
                       ? absl::StrCat(" (and ", options_.standby_servers, " standing by)")
                       : std::string(),
                   " and ", options_.workers, " workers",
                   options_.entry.empty() ? "" : absl::StrCat(" (", options_.entry, ")"),
                   "; logs in ", options_.run_dir));
  if (options_.metrics) SayWhereMetricsAre();
  return std::nullopt;
}

void LocalLauncher::SayWhereMetricsAre() {
  const std::string targets_path = InDir(options_.run_dir, "prometheus-targets.json");
  const std::vector<MetricsTarget> targets = MetricsTargets(options_);
  std::vector<std::string> lines;
  for (const MetricsTarget& t : targets)
    lines.push_back(absl::StrCat("  ", t.daemon, ": http://", t.address, "/metrics"));
  Say(absl::StrCat("metrics (Prometheus; scrape targets in ", targets_path, "):\n",
                   absl::StrJoin(lines, "\n")));
  // Written after the list is printed (and flushed), so that whoever sees the file can
  // read the printed list too.
  if (absl::Status s = WriteFileAtomically(Env::Default(), targets_path,
                                           PrometheusTargetsJson(targets, options_.job_id));
      !s.ok())
    Say(absl::StrCat("grps-local: ", s.message()));
}

std::optional<int> LocalLauncher::HandleExitedChildren(bool* all_exited) {
  *all_exited = true;
  // By index: a restart appends to children_.
  for (size_t i = 0; i < children_.size(); ++i) {
    ChildProcess& child = *children_[i];
    if (!child.Poll()) {
      *all_exited = false;
    } else if (child.succeeded() && !death_handled_[i] && child_role_[i] == Role::kServer &&
               options_.standby_servers > 0 && !job_ended_ && !coordinator().exited() &&
               SaidRetired(child)) {
      if (absl::Status s = OnServerRetired(i); !s.ok())
        return Finish("failed", std::string(s.message()), &child);
      *all_exited = false;
    } else if (child.succeeded() && !death_handled_[i] && child_role_[i] == Role::kWorker) {
      if (absl::Status s = OnWorkerExited0(i); !s.ok())
        return Finish("failed", std::string(s.message()), &child);
    } else if (!child.succeeded() && !death_handled_[i]) {
      if (options_.strict)
        return Finish("failed", absl::StrCat(child.name(), " ", child.DescribeExit()),
                      &child);
      const absl::Status s = child_role_[i] == Role::kWorker ? OnWorkerDied(i)
                                                             : OnDaemonCrashed(i);
      if (!s.ok()) return Finish("failed", std::string(s.message()), &child);
    }
  }
  if (const ChildProcess* last_dead = EveryWorkerDead())
    return Finish("failed",
                  absl::StrCat("every worker died (the last: ", last_dead->name(), " ",
                               last_dead->DescribeExit(), "); no worker is left to train"),
                  last_dead);
  return std::nullopt;
}

std::optional<int> LocalLauncher::Supervise() {
  std::optional<absl::Time> ended_at;
  while (true) {
    if (interrupted_()) return Finish("interrupted", "interrupted", nullptr);
    bool all_exited = false;
    if (std::optional<int> code = HandleExitedChildren(&all_exited)) return code;
    if (all_exited) return std::nullopt;
    const absl::Time now = absl::Now();
    if (options_.timeout > absl::ZeroDuration() && now - start_ >= options_.timeout)
      return Finish("timeout",
                    absl::StrCat("timed out after ",
                                 absl::FormatDuration(options_.timeout)),
                    nullptr);
    RefreshStatus();
    ShowProgress(now);
    if (!ended_at && (coordinator().exited() || (latest_ && JobEnded(latest_->state())))) {
      ended_at = now;
      job_ended_ = true;
      stop_standbys_at_ = now + kStandbyGrace;
    }
    if (ended_at) StopStandbys(now);
    if (ended_at && now - *ended_at > options_.exit_grace) {
      std::vector<std::string> running;
      for (const auto& child : children_)
        if (child->running()) running.push_back(child->name());
      return Finish("failed",
                    absl::StrCat(absl::StrJoin(running, ", "), " still running ",
                                 absl::FormatDuration(options_.exit_grace),
                                 " after the job ended"),
                    nullptr);
    }
    absl::SleepFor(kSupervisePeriod);
  }
}

int LocalLauncher::Run() {
  start_ = absl::Now();
  if (std::optional<int> code = PrepareRunDir()) return *code;
  // The coordinator first; the others need its address.
  if (std::optional<int> code = StartCoordinator()) return *code;
  if (std::optional<int> code = StartMembers()) return *code;
  // Only now: every fork above happened before gRPC's client threads exist.
  feed_ = std::make_unique<StatusFeed>(coordinator_address_, options_.status_interval);
  // Until every child has exited 0, or something goes wrong.
  if (std::optional<int> code = Supervise()) return *code;

  // Every child exited 0. A job stopped by an operator ends that way too.
  feed_->Stop();
  RefreshStatus();
  if (latest_ && (latest_->state() == v1::JOB_STATE_FAILED ||
                  latest_->state() == v1::JOB_STATE_STOPPED))
    return Finish(latest_->state() == v1::JOB_STATE_STOPPED ? "stopped" : "failed",
                  absl::StrCat("job ", JobStateName(latest_->state()),
                               latest_->message().empty() ? "" : ": ",
                               latest_->message()),
                  nullptr);
  return Finish("ok", "", nullptr);
}

void LocalLauncher::PlotCurves() {
  std::vector<CurveFile> curves;
  for (uint32_t rank = 0; rank < options_.workers; ++rank) {
    const std::string path =
        InDir(options_.run_dir, absl::StrCat("curve-worker-", rank, ".csv"));
    if (fs::exists(path)) curves.push_back(ReadCurveFile(path, absl::StrCat("worker-", rank)));
  }
  // A program that reported nothing (gt.report, gt.done's figures) wrote no
  // curve: nothing to say.
  if (curves.empty() && !options_.entry.empty()) return;
  const std::string gnuplot = FindInSearchPath("gnuplot", options_.plot_search_path);
  if (gnuplot.empty()) {
    Say("grps-local: no plot: gnuplot is not on PATH (scripts/setup installs it)");
    return;
  }
  if (curves.empty()) {
    Say("grps-local: no plot: no worker wrote a curve");
    return;
  }
  const std::string script_path = InDir(options_.run_dir, "curves.gp");
  const std::string svg_path = InDir(options_.run_dir, "curves.svg");
  const double started_unix = absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  if (absl::Status s = WriteFileAtomically(
          Env::Default(), script_path, CurvesGnuplotScript(curves, started_unix, svg_path));
      !s.ok()) {
    Say(absl::StrCat("grps-local: no plot: ", s.message()));
    return;
  }
  ChildProcess plot("gnuplot", {gnuplot, script_path}, InDir(options_.run_dir, "curves.log"));
  if (absl::Status s = plot.Start(); !s.ok()) {
    Say(absl::StrCat("grps-local: no plot: ", s.message()));
    return;
  }
  if (!plot.WaitFor(options_.plot_timeout)) {
    plot.Signal(SIGKILL);
    plot.WaitFor(absl::Seconds(5));
    Say(absl::StrCat("grps-local: no plot: gnuplot ran longer than ",
                     absl::FormatDuration(options_.plot_timeout), " (", script_path, ")"));
    return;
  }
  if (!plot.succeeded()) {
    Say(absl::StrCat("grps-local: no plot: gnuplot ", plot.DescribeExit(), " (see ",
                     plot.log_path(), ")"));
    return;
  }
  Say(absl::StrCat("curves: ", svg_path));
}

int LocalLauncher::Finish(const std::string& exit, const std::string& error,
                          const ChildProcess* failed_child) {
  bool ok = exit == "ok";
  if (!ok) Say(absl::StrCat("grps-local: ", error));
  if (failed_child != nullptr)
    Say(absl::StrCat("--- last lines of ", failed_child->log_path(), " (pid ",
                     failed_child->pid(), ") ---\n",
                     TailOfFile(failed_child->log_path(), kLogTailLines),
                     "--- end of ", failed_child->name(), " log ---"));

  int running = 0;
  for (const auto& child : children_) running += child->running() ? 1 : 0;
  if (running > 0) {
    Say(absl::StrCat("grps-local: stopping ", running, " processes"));
    std::vector<std::string> killed = StopChildren(children_, options_.stop_grace);
    if (!killed.empty())
      Say(absl::StrCat("grps-local: killed (no exit ",
                       absl::FormatDuration(options_.stop_grace),
                       " after SIGTERM): ", absl::StrJoin(killed, ", ")));
  }
  if (feed_ != nullptr) feed_->Stop();  // the coordinator is gone by now
  RefreshStatus();
  if (!worker_child_.empty()) PlotCurves();

  const double wall = absl::ToDoubleSeconds(absl::Now() - start_);
  RunResult result = ResultOf(options_, latest_, final_eval_, wall);
  result.exit = exit;
  result.error = error;
  result.started_unix = absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  result.workers_died = workers_died_;
  result.workers_restarted = workers_restarted_;
  // Every child exited 0, yet nothing said how the job ended: the figures
  // are those of the last status heard, not the job's last.
  if (ok && !(latest_ && JobEnded(latest_->state())))
    result.warnings.push_back(
        absl::StrCat("the coordinator's ending status was not heard (neither streamed nor in ",
                     InDir(options_.run_dir, kCoordinatorStateFile),
                     "): the figures are those of the last status heard",
                     latest_ ? absl::StrCat(" (", JobStateName(latest_->state()), ")") : ""));
  if (workers_died_ > 0)
    Say(absl::StrCat("workers: ", workers_died_, " died, ", workers_restarted_,
                     " restarted, of ", options_.workers));
  for (const std::string& warning : result.warnings) Say(absl::StrCat("warning: ", warning));
  if (ok && options_.strict && !result.warnings.empty()) {
    ok = false;
    result.exit = "failed";
    result.error = absl::StrCat("the job completed with ", result.warnings.size(), " warning",
                                result.warnings.size() == 1 ? "" : "s", " (--strict)");
    Say(absl::StrCat("grps-local: ", result.error));
  }
  if (ok) {
    // An --entry job's steps are the shards' versions: a worker's own count
    // may be a restarted rank's, past or short of the job's.
    const std::string shard_steps =
        options_.entry.empty() || !latest_ ? "" : ShardStepsText(*latest_);
    // An elastic job's ranks train what the ledger leases them: no count
    // is every worker's, and a rank that joined is one more.
    const std::string rank_steps = latest_ ? RankStepsText(*latest_) : "";
    Say(absl::StrCat(
        "job completed: ",
        !rank_steps.empty() ? rank_steps
        : shard_steps.empty()
            ? absl::StrCat(result.steps, " steps per worker, ", result.workers, " workers")
            : absl::StrCat(shard_steps, ", ", result.workers, " workers"),
        ", ", result.servers, " servers, ", HumanDuration(wall), " wall, ",
        absl::StrFormat("%.1f", result.samples_per_sec), " samples/s (all workers)"));
    if (result.final_test_accuracy) {
      Say(absl::StrFormat("final test loss: %.4f", *result.final_test_loss));
      Say(absl::StrFormat("final test accuracy: %.4f", *result.final_test_accuracy));
      if (result.final_test_auc)
        Say(absl::StrFormat("final test AUC: %.4f", *result.final_test_auc));
    } else {
      Say("final test accuracy: n/a (no worker reported a final evaluation)");
    }
  } else {
    Say(absl::StrCat("grps-local: job ", result.exit, "; logs in ", options_.run_dir));
  }
  if (!options_.result_json.empty()) {
    if (absl::Status s =
            WriteFileAtomically(Env::Default(), options_.result_json, ResultJson(result));
        !s.ok()) {
      Say(absl::StrCat("grps-local: ", s.message()));
      return kLaunchFailed;
    }
  }
  if (ok) return kLaunchOk;
  return result.exit == "interrupted" ? kLaunchInterrupted : kLaunchFailed;
}

}  // namespace grps
