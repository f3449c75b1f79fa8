#include "coordinator/membership.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace grps {

namespace {

// Longest address, host or backend name accepted from the network.
constexpr size_t kMaxNameBytes = 256;
// Longest staleness histogram accepted in a server's status.
constexpr int kMaxHistogramBuckets = 4096;

// Names from the network end up in logs and status tables: printable ASCII
// only (spaces allowed where `allow_space`).
bool Printable(absl::string_view text, bool allow_space) {
  for (char c : text)
    if (c < (allow_space ? 0x20 : 0x21) || c > 0x7e) return false;
  return true;
}

absl::Status ValidateAddress(absl::string_view address) {
  if (address.empty() || address.size() > kMaxNameBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "server address must be host:port of at most ", kMaxNameBytes,
        " bytes, got '", absl::CHexEscape(address.substr(0, 64)), "'"));
  size_t colon = address.rfind(':');
  uint32_t port = 0;
  if (!Printable(address, /*allow_space=*/false) ||
      colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port == 0 ||
      port > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "server address must be host:port (printable, no spaces) with a "
        "port in [1, 65535], got '",
        absl::CHexEscape(address.substr(0, 64)), "'"));
  return absl::OkStatus();
}

absl::Status ValidateProgress(const v1::WorkerProgress& p) {
  if (!std::isfinite(p.samples_per_sec()) || p.samples_per_sec() < 0)
    return absl::InvalidArgumentError(
        "progress.samples_per_sec must be a finite number >= 0");
  if (!std::isfinite(p.test_accuracy()) || p.test_accuracy() < -1 ||
      p.test_accuracy() > 1)
    return absl::InvalidArgumentError(
        "progress.test_accuracy must be in [0, 1], or -1 for none");
  if (p.has_test_auc() && !(p.test_auc() >= 0 && p.test_auc() <= 1))
    return absl::InvalidArgumentError("progress.test_auc must be in [0, 1]");
  return absl::OkStatus();
}

// A progress message carries an evaluation when test_accuracy is not -1.
// An all-zero pair is an unset field, not an evaluation (a real evaluation
// has a positive loss or a positive accuracy).
std::optional<Membership::Evaluation> EvaluationIn(const v1::WorkerProgress& p) {
  if (p.test_accuracy() < 0) return std::nullopt;
  if (p.test_accuracy() == 0 && p.test_loss() == 0) return std::nullopt;
  Membership::Evaluation eval{p.test_accuracy(), p.test_loss(), std::nullopt};
  if (p.has_test_auc()) eval.auc = p.test_auc();
  return eval;
}

uint64_t MillisSince(absl::Time then, absl::Time now) {
  if (now <= then) return 0;
  return static_cast<uint64_t>(absl::ToInt64Milliseconds(now - then));
}

}  // namespace

Membership::Membership(v1::ShardMap shard_map, uint32_t num_workers,
                       absl::Duration heartbeat_timeout, uint32_t start_workers)
    : heartbeat_timeout_(heartbeat_timeout),
      start_workers_(start_workers == 0 ? num_workers : std::min(start_workers, num_workers)),
      workers_(num_workers),
      shard_map_(std::move(shard_map)) {
  servers_.resize(shard_map_.shards_size());
  shard_map_.clear_shards();
  for (uint32_t s = 0; s < servers_.size(); ++s)
    shard_map_.add_shards()->set_shard(s);
  shard_map_.set_epoch(0);
}

void Membership::SetLayout(const v1::ShardMap& built) {
  *shard_map_.mutable_tensors() = built.tensors();
  *shard_map_.mutable_chunks() = built.chunks();
}

absl::StatusOr<std::map<uint32_t, uint64_t>> Membership::Reshard(
    const v1::ShardMap& built, const std::map<uint32_t, Endpoint>& joining, absl::Time now) {
  const uint32_t from = num_shards();
  const uint32_t to = static_cast<uint32_t>(built.shards_size());
  if (to == 0 || built.chunks_size() != shard_map_.chunks_size() ||
      built.tensors_size() != shard_map_.tensors_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "a map of ", to, " shards and ", built.chunks_size(),
        " chunks does not re-shard this job's ", shard_map_.chunks_size(), " chunks"));
  for (uint32_t s = from; s < to; ++s)
    if (joining.count(s) == 0)
      return absl::InvalidArgumentError(absl::StrCat("shard ", s, " has no server"));
  std::map<uint32_t, uint64_t> dropped;
  for (uint32_t s = to; s < from; ++s)
    if (servers_[s].registered) dropped[s] = servers_[s].incarnation;
  servers_.resize(to);
  for (uint32_t s = from; s < to; ++s) {
    const Endpoint& e = joining.at(s);
    Server& server = servers_[s];
    server = Server();
    server.registered = true;
    server.incarnation = e.incarnation;
    server.address = e.address;
    server.state = v1::MEMBER_STATE_ALIVE;
    server.last_heartbeat = now;
    last_incarnation_ = std::max(last_incarnation_, e.incarnation);
  }
  const uint64_t epoch = shard_map_.epoch();
  shard_map_ = built;
  shard_map_.clear_shards();
  for (uint32_t s = 0; s < to; ++s) {
    v1::ShardEndpoint* endpoint = shard_map_.add_shards();
    endpoint->set_shard(s);
    if (!servers_[s].registered) continue;
    endpoint->set_address(servers_[s].address);
    endpoint->set_incarnation(servers_[s].incarnation);
  }
  shard_map_.set_epoch(epoch + 1);
  return dropped;
}

absl::StatusOr<uint32_t> Membership::PickShard(int32_t requested,
                                               absl::string_view address) const {
  const uint32_t n = num_shards();
  // The shard this address already serves, if any: a restarted server.
  std::optional<uint32_t> own;
  for (uint32_t s = 0; s < n; ++s)
    if (servers_[s].registered && servers_[s].address == address) own = s;
  if (requested != -1) {
    if (requested < 0 || static_cast<uint32_t>(requested) >= n)
      return absl::InvalidArgumentError(absl::StrCat(
          "requested shard ", requested, " is out of range; the job has ", n,
          " shards (use -1 for any)"));
    const uint32_t r = static_cast<uint32_t>(requested);
    if (own.has_value() && *own != r &&
        servers_[*own].state == v1::MEMBER_STATE_ALIVE)
      return absl::FailedPreconditionError(absl::StrCat(
          "address ", address, " already serves live shard ", *own,
          "; cannot also serve shard ", r));
    return r;
  }
  if (own.has_value()) return *own;
  for (uint32_t s = 0; s < n; ++s)
    if (!servers_[s].registered) return s;
  for (uint32_t s = 0; s < n; ++s)
    if (servers_[s].state == v1::MEMBER_STATE_DEAD) return s;
  return absl::ResourceExhaustedError(absl::StrCat(
      "every one of the job's ", n, " shards has a live server"));
}

absl::Status Membership::ValidateWorkerRequest(int32_t requested_rank,
                                               absl::string_view host,
                                               absl::string_view backend) const {
  if (requested_rank != -1 &&
      (requested_rank < 0 || static_cast<uint32_t>(requested_rank) >= num_workers()))
    return absl::InvalidArgumentError(absl::StrCat(
        "requested rank ", requested_rank, " is out of range; the job has ",
        num_workers(), " workers (use -1 for any)"));
  if (host.size() > kMaxNameBytes || backend.size() > kMaxNameBytes ||
      !Printable(host, true) || !Printable(backend, true))
    return absl::InvalidArgumentError(absl::StrCat(
        "worker host and backend must be printable ASCII of at most ",
        kMaxNameBytes, " bytes"));
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Membership::PickRank(int32_t requested, bool holds_live_rank,
                                              absl::Time now) const {
  const uint32_t n = num_workers();
  if (requested != -1) {
    const uint32_t r = static_cast<uint32_t>(requested);
    const Worker& worker = workers_[r];
    if (worker.state == v1::MEMBER_STATE_FINISHED)
      return absl::FailedPreconditionError(
          absl::StrCat("worker rank ", r, " has already finished"));
    if (worker.state == v1::MEMBER_STATE_ALIVE && !holds_live_rank)
      return absl::AlreadyExistsError(absl::StrCat(
          "worker rank ", r, " is alive (incarnation ", worker.incarnation,
          ", last heartbeat ", absl::FormatDuration(now - worker.last_heartbeat),
          " ago); a restarted worker gets its rank once the old incarnation is "
          "declared dead, after ", absl::FormatDuration(heartbeat_timeout_),
          " without a heartbeat"));
    return r;
  }
  for (uint32_t r = 0; r < n; ++r)
    if (!workers_[r].registered) return r;
  for (uint32_t r = 0; r < n; ++r)
    if (workers_[r].state == v1::MEMBER_STATE_DEAD || workers_[r].state == v1::MEMBER_STATE_LEFT)
      return r;
  return absl::ResourceExhaustedError(absl::StrCat(
      "every one of the job's ", n, " worker ranks is live or finished"));
}

uint64_t Membership::NextIncarnation(absl::Time now) {
  uint64_t from_clock =
      static_cast<uint64_t>(std::max<int64_t>(0, absl::ToUnixMillis(now)));
  last_incarnation_ = std::max(last_incarnation_ + 1, from_clock);
  return last_incarnation_;
}

absl::StatusOr<Membership::Registration> Membership::RegisterServer(
    int32_t requested_shard, absl::string_view address, absl::Time now) {
  if (absl::Status s = ValidateAddress(address); !s.ok()) return s;
  absl::StatusOr<uint32_t> shard = PickShard(requested_shard, address);
  if (!shard.ok()) return shard.status();
  Server& server = servers_[*shard];
  Registration reg;
  reg.slot = *shard;
  reg.rejoined = server.registered;
  reg.incarnation = NextIncarnation(now);
  server.registered = true;
  server.incarnation = reg.incarnation;
  server.address = std::string(address);
  server.state = v1::MEMBER_STATE_ALIVE;
  server.last_heartbeat = now;
  server.status.reset();
  v1::ShardEndpoint* endpoint = shard_map_.mutable_shards(*shard);
  endpoint->set_address(server.address);
  endpoint->set_incarnation(reg.incarnation);
  shard_map_.set_epoch(shard_map_.epoch() + 1);
  return reg;
}

absl::StatusOr<Membership::Registration> Membership::RegisterWorker(
    int32_t requested_rank, absl::string_view host, absl::string_view backend,
    absl::Time now, bool holds_live_rank, bool joining) {
  if (absl::Status s = ValidateWorkerRequest(requested_rank, host, backend);
      !s.ok())
    return s;
  absl::StatusOr<uint32_t> rank = PickRank(requested_rank, holds_live_rank, now);
  if (!rank.ok()) return rank.status();
  Worker& worker = workers_[*rank];
  Registration reg;
  reg.slot = *rank;
  reg.rejoined = worker.registered;
  reg.incarnation = NextIncarnation(now);
  reg.start_step = worker.resume_step;
  worker.registered = true;
  worker.incarnation = reg.incarnation;
  worker.host = std::string(host);
  worker.backend = std::string(backend);
  worker.state = v1::MEMBER_STATE_ALIVE;
  worker.drain = false;
  worker.joining = joining;
  worker.last_heartbeat = now;
  worker.progress.reset();
  // A new live worker, or a live rank with a new incarnation (or without
  // its old one, while the new one joins).
  ++membership_epoch_;
  return reg;
}

bool Membership::MarkReady(uint32_t rank) {
  if (rank >= num_workers()) return false;
  Worker& worker = workers_[rank];
  if (!worker.joining || worker.state != v1::MEMBER_STATE_ALIVE) return false;
  worker.joining = false;
  ++membership_epoch_;
  return true;
}

std::optional<uint64_t> Membership::LiveIncarnation(uint32_t rank) const {
  if (rank >= num_workers() || workers_[rank].state != v1::MEMBER_STATE_ALIVE)
    return std::nullopt;
  return workers_[rank].incarnation;
}

absl::Status Membership::CheckServer(uint32_t shard, uint64_t incarnation) const {
  if (shard >= num_shards() || !servers_[shard].registered)
    return absl::NotFoundError(
        absl::StrCat("shard ", shard, " has no registered server; register first"));
  if (incarnation != servers_[shard].incarnation)
    return absl::FailedPreconditionError(
        absl::StrCat("server of shard ", shard, " has stale incarnation ", incarnation,
                     " (current ", servers_[shard].incarnation, "); the shard was re-registered"));
  return absl::OkStatus();
}

absl::Status Membership::ServerAlive(uint32_t shard, uint64_t incarnation, absl::Time now,
                                     bool* revived) {
  *revived = false;
  if (absl::Status s = CheckServer(shard, incarnation); !s.ok()) return s;
  Server& server = servers_[shard];
  if (server.state == v1::MEMBER_STATE_DEAD) {
    server.state = v1::MEMBER_STATE_ALIVE;
    *revived = true;
  }
  server.last_heartbeat = now;
  return absl::OkStatus();
}

absl::Status Membership::ServerHeartbeat(uint32_t shard, uint64_t incarnation,
                                         const v1::ShardStatus& status, absl::Time now,
                                         bool* revived) {
  *revived = false;
  if (absl::Status s = CheckServer(shard, incarnation); !s.ok()) return s;
  if (status.staleness_histogram_size() > kMaxHistogramBuckets)
    return absl::InvalidArgumentError(absl::StrCat(
        "shard status has more than ", kMaxHistogramBuckets, " staleness histogram buckets"));
  if (absl::Status s = ServerAlive(shard, incarnation, now, revived); !s.ok()) return s;
  Server& server = servers_[shard];
  server.status = status;
  server.status->set_shard(shard);
  server.status->set_address(server.address);
  server.status->set_incarnation(server.incarnation);
  return absl::OkStatus();
}

absl::Status Membership::CheckWorker(uint32_t rank, uint64_t incarnation) const {
  if (rank >= num_workers() || !workers_[rank].registered)
    return absl::NotFoundError(absl::StrCat(
        "worker rank ", rank, " is not registered; register first"));
  if (incarnation != workers_[rank].incarnation)
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " has stale incarnation ", incarnation,
        " (current ", workers_[rank].incarnation,
        "); the rank was re-registered"));
  return absl::OkStatus();
}

void Membership::RecordProgress(Worker* worker,
                                const v1::WorkerProgress& progress) {
  std::optional<Evaluation> eval = EvaluationIn(progress);
  std::optional<Evaluation> before =
      worker->progress.has_value() ? EvaluationIn(*worker->progress) : std::nullopt;
  // Heartbeats repeat a worker's last evaluation; only a changed one is new.
  if (eval.has_value() &&
      (!before.has_value() || before->accuracy != eval->accuracy ||
       before->loss != eval->loss))
    latest_eval_ = eval;
  worker->progress = progress;
  worker->resume_step = std::max(worker->resume_step, progress.step());
}

absl::Status Membership::WorkerHeartbeat(uint32_t rank, uint64_t incarnation,
                                         const v1::WorkerProgress* progress,
                                         absl::Time now, bool* revived) {
  *revived = false;
  if (absl::Status s = CheckWorker(rank, incarnation); !s.ok()) return s;
  if (progress != nullptr) {
    if (absl::Status s = ValidateProgress(*progress); !s.ok()) return s;
  }
  Worker& worker = workers_[rank];
  if (worker.state == v1::MEMBER_STATE_DEAD) {
    worker.state = v1::MEMBER_STATE_ALIVE;
    ++membership_epoch_;
    *revived = true;
  }
  worker.last_heartbeat = now;
  if (progress != nullptr) RecordProgress(&worker, *progress);
  return absl::OkStatus();
}

absl::Status Membership::FinishWorker(uint32_t rank, uint64_t incarnation,
                                      const v1::WorkerProgress& progress,
                                      absl::Time now) {
  if (absl::Status s = CheckWorker(rank, incarnation); !s.ok()) return s;
  if (absl::Status s = ValidateProgress(progress); !s.ok()) return s;
  Worker& worker = workers_[rank];
  if (worker.state == v1::MEMBER_STATE_ALIVE) ++membership_epoch_;
  worker.state = v1::MEMBER_STATE_FINISHED;
  worker.last_heartbeat = now;
  RecordProgress(&worker, progress);
  return absl::OkStatus();
}

absl::Status Membership::LeaveWorker(uint32_t rank, uint64_t incarnation,
                                     const v1::WorkerProgress& progress, absl::Time now) {
  if (absl::Status s = CheckWorker(rank, incarnation); !s.ok()) return s;
  if (absl::Status s = ValidateProgress(progress); !s.ok()) return s;
  Worker& worker = workers_[rank];
  if (worker.state == v1::MEMBER_STATE_FINISHED)
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", rank, " has already finished: it cannot leave"));
  if (worker.state == v1::MEMBER_STATE_ALIVE) ++membership_epoch_;
  worker.state = v1::MEMBER_STATE_LEFT;
  worker.drain = false;
  worker.last_heartbeat = now;
  RecordProgress(&worker, progress);
  return absl::OkStatus();
}

absl::Status Membership::RequestDrain(uint32_t rank) {
  if (rank >= num_workers())
    return absl::NotFoundError(absl::StrCat("worker rank ", rank, " is out of range; the job has ",
                                            num_workers(), " workers"));
  if (workers_[rank].state != v1::MEMBER_STATE_ALIVE)
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", rank, " is not alive (",
                     v1::MemberState_Name(workers_[rank].state), "): nothing to drain"));
  workers_[rank].drain = true;
  return absl::OkStatus();
}

bool Membership::DrainRequested(uint32_t rank) const {
  return rank < num_workers() && workers_[rank].drain &&
         workers_[rank].state == v1::MEMBER_STATE_ALIVE;
}

absl::Status Membership::AdoptServer(uint32_t shard, uint64_t incarnation,
                                     absl::string_view address, absl::Time now) {
  if (shard >= num_shards())
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, " is out of range; the job has ",
                     num_shards(), " shards"));
  if (absl::Status s = ValidateAddress(address); !s.ok()) return s;
  Server& server = servers_[shard];
  if (server.registered && incarnation <= server.incarnation)
    return absl::FailedPreconditionError(absl::StrCat(
        "server of shard ", shard, " has stale incarnation ", incarnation,
        " (current ", server.incarnation, "); the shard was re-registered"));
  server.registered = true;
  server.incarnation = incarnation;
  server.address = std::string(address);
  server.state = v1::MEMBER_STATE_ALIVE;
  server.last_heartbeat = now;
  server.status.reset();
  last_incarnation_ = std::max(last_incarnation_, incarnation);
  v1::ShardEndpoint* endpoint = shard_map_.mutable_shards(shard);
  endpoint->set_address(server.address);
  endpoint->set_incarnation(incarnation);
  shard_map_.set_epoch(shard_map_.epoch() + 1);
  return absl::OkStatus();
}

absl::Status Membership::AdoptWorker(uint32_t rank, uint64_t incarnation,
                                     bool finished,
                                     const v1::WorkerProgress* progress,
                                     absl::Time now) {
  if (rank >= num_workers())
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", rank, " is out of range; the job has ",
                     num_workers(), " workers"));
  if (progress != nullptr) {
    if (absl::Status s = ValidateProgress(*progress); !s.ok()) return s;
  }
  Worker& worker = workers_[rank];
  if (worker.registered && incarnation <= worker.incarnation)
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank, " has stale incarnation ", incarnation,
        " (current ", worker.incarnation, "); the rank was re-registered"));
  worker.registered = true;
  worker.incarnation = incarnation;
  worker.state = finished ? v1::MEMBER_STATE_FINISHED : v1::MEMBER_STATE_ALIVE;
  worker.last_heartbeat = now;
  worker.progress.reset();
  if (progress != nullptr) RecordProgress(&worker, *progress);
  last_incarnation_ = std::max(last_incarnation_, incarnation);
  ++membership_epoch_;
  return absl::OkStatus();
}

std::vector<uint32_t> Membership::ResetResumeSteps(
    const std::vector<uint64_t>& worker_steps, absl::Time now) {
  std::vector<uint32_t> revived;
  for (uint32_t r = 0; r < num_workers(); ++r) {
    Worker& worker = workers_[r];
    const uint64_t step = r < worker_steps.size() ? worker_steps[r] : 0;
    worker.resume_step = step;
    if (worker.progress.has_value()) worker.progress->set_step(step);
    // A finished rank whose total is unknown trains again too: the worker
    // finishes at once if it has no steps left.
    const uint64_t total =
        worker.progress.has_value() ? worker.progress->total_steps() : 0;
    if (worker.registered && worker.state == v1::MEMBER_STATE_FINISHED &&
        (total == 0 || step < total)) {
      worker.state = v1::MEMBER_STATE_ALIVE;
      worker.last_heartbeat = now;
      revived.push_back(r);
    }
  }
  if (!revived.empty()) ++membership_epoch_;
  return revived;
}

void Membership::ExportTo(v1::CoordinatorState* state) const {
  state->clear_shards();
  state->clear_workers();
  for (uint32_t s = 0; s < num_shards(); ++s) {
    v1::ShardEndpoint* e = state->add_shards();
    e->set_shard(s);
    if (!servers_[s].registered) continue;
    e->set_address(servers_[s].address);
    e->set_incarnation(servers_[s].incarnation);
  }
  for (uint32_t r = 0; r < num_workers(); ++r) {
    const Worker& worker = workers_[r];
    v1::WorkerStatus* w = state->add_workers();
    w->set_rank(r);
    if (!worker.registered) {
      // An unregistered rank may still have a resume step (a resumed job).
      if (worker.resume_step > 0) w->mutable_progress()->set_step(worker.resume_step);
      continue;
    }
    w->set_incarnation(worker.incarnation);
    w->set_host(worker.host);
    w->set_backend(worker.backend);
    w->set_state(worker.state);
    w->set_joining(worker.joining);
    if (worker.progress.has_value()) *w->mutable_progress() = *worker.progress;
    w->mutable_progress()->set_step(worker.resume_step);
  }
  state->set_map_epoch(shard_map_.epoch());
  state->set_membership_epoch(membership_epoch_);
}

absl::Status Membership::ImportFrom(const v1::CoordinatorState& state,
                                    absl::Time now) {
  if (state.shards_size() != static_cast<int>(num_shards()) ||
      state.workers_size() != static_cast<int>(num_workers()))
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator state has ", state.shards_size(), " shards and ",
        state.workers_size(), " workers; the job has ", num_shards(), " and ",
        num_workers()));
  for (const v1::ShardEndpoint& e : state.shards())
    if (e.incarnation() != 0) {
      if (absl::Status s = ValidateAddress(e.address()); !s.ok()) return s;
    }
  for (const v1::WorkerStatus& w : state.workers())
    if (w.incarnation() != 0) {
      if (absl::Status s = ValidateWorkerRequest(-1, w.host(), w.backend()); !s.ok())
        return s;
    }
  for (uint32_t s = 0; s < num_shards(); ++s) {
    const v1::ShardEndpoint& e = state.shards(s);
    Server& server = servers_[s];
    server = Server();
    v1::ShardEndpoint* endpoint = shard_map_.mutable_shards(s);
    endpoint->set_address("");
    endpoint->set_incarnation(0);
    if (e.incarnation() == 0) continue;
    server.registered = true;
    server.incarnation = e.incarnation();
    server.address = e.address();
    server.state = v1::MEMBER_STATE_ALIVE;
    server.last_heartbeat = now;
    endpoint->set_address(e.address());
    endpoint->set_incarnation(e.incarnation());
    last_incarnation_ = std::max(last_incarnation_, e.incarnation());
  }
  for (uint32_t r = 0; r < num_workers(); ++r) {
    const v1::WorkerStatus& w = state.workers(r);
    Worker& worker = workers_[r];
    worker = Worker();
    worker.resume_step = w.progress().step();
    if (w.incarnation() == 0) continue;
    worker.registered = true;
    worker.incarnation = w.incarnation();
    worker.host = w.host();
    worker.backend = w.backend();
    worker.state = w.state() == v1::MEMBER_STATE_FINISHED || w.state() == v1::MEMBER_STATE_LEFT
                       ? w.state()
                       : v1::MEMBER_STATE_ALIVE;
    worker.joining = worker.state == v1::MEMBER_STATE_ALIVE && w.joining();
    worker.last_heartbeat = now;
    if (w.has_progress()) worker.progress = w.progress();
    last_incarnation_ = std::max(last_incarnation_, w.incarnation());
  }
  shard_map_.set_epoch(state.map_epoch() + 1);
  membership_epoch_ = state.membership_epoch() + 1;
  return absl::OkStatus();
}

std::vector<uint64_t> Membership::LiveShardVersions() const {
  std::vector<uint64_t> out;
  for (const Server& server : servers_)
    if (server.state == v1::MEMBER_STATE_ALIVE && server.status.has_value() &&
        server.status->num_chunks() > 0)
      out.push_back(server.status->version());
  return out;
}

std::vector<uint32_t> Membership::LiveShardsUnheard() const {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < num_shards(); ++s)
    if (servers_[s].state == v1::MEMBER_STATE_ALIVE && !servers_[s].status.has_value())
      out.push_back(s);
  return out;
}

void Membership::RecordEvaluation(Evaluation evaluation) {
  latest_eval_ = evaluation;
}

Membership::Failures Membership::DetectFailures(absl::Time now) {
  Failures failures;
  for (uint32_t s = 0; s < num_shards(); ++s) {
    Server& server = servers_[s];
    if (server.state == v1::MEMBER_STATE_ALIVE &&
        now - server.last_heartbeat > heartbeat_timeout_) {
      server.state = v1::MEMBER_STATE_DEAD;
      failures.shards.push_back(s);
    }
  }
  for (uint32_t r = 0; r < num_workers(); ++r) {
    Worker& worker = workers_[r];
    if (worker.state == v1::MEMBER_STATE_ALIVE &&
        now - worker.last_heartbeat > heartbeat_timeout_) {
      worker.state = v1::MEMBER_STATE_DEAD;
      failures.ranks.push_back(r);
    }
  }
  if (!failures.ranks.empty()) ++membership_epoch_;
  return failures;
}

bool Membership::AllShardsRegistered() const {
  return UnregisteredShards().empty();
}

std::vector<uint32_t> Membership::UnregisteredShards() const {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < num_shards(); ++s)
    if (!servers_[s].registered) out.push_back(s);
  return out;
}

std::vector<uint32_t> Membership::UnregisteredRanks() const {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < start_workers_; ++r)
    if (!workers_[r].registered) out.push_back(r);
  return out;
}

std::vector<uint32_t> Membership::RanksInState(v1::MemberState state) const {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < num_workers(); ++r)
    if (workers_[r].registered && workers_[r].state == state) out.push_back(r);
  return out;
}

bool Membership::TrainingOver() const {
  return RanksInState(v1::MEMBER_STATE_ALIVE).empty() &&
         !RanksInState(v1::MEMBER_STATE_FINISHED).empty();
}

std::vector<uint32_t> Membership::ShardsInState(v1::MemberState state) const {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < num_shards(); ++s)
    if (servers_[s].registered && servers_[s].state == state) out.push_back(s);
  return out;
}

std::vector<uint32_t> Membership::FinishedRanksHeartbeating(absl::Time now) const {
  std::vector<uint32_t> out;
  for (uint32_t r = 0; r < num_workers(); ++r)
    if (workers_[r].registered && workers_[r].state == v1::MEMBER_STATE_FINISHED &&
        now - workers_[r].last_heartbeat <= heartbeat_timeout_)
      out.push_back(r);
  return out;
}

Membership::LiveWorkers Membership::live_workers() const {
  LiveWorkers live;
  for (uint32_t r = 0; r < num_workers(); ++r) {
    if (workers_[r].state != v1::MEMBER_STATE_ALIVE || workers_[r].joining) continue;
    live.ranks.push_back(r);
    live.incarnations.push_back(workers_[r].incarnation);
  }
  return live;
}

std::vector<v1::WorkerStatus> Membership::WorkerStatuses(absl::Time now) const {
  std::vector<v1::WorkerStatus> out;
  for (uint32_t r = 0; r < num_workers(); ++r) {
    const Worker& worker = workers_[r];
    v1::WorkerStatus status;
    status.set_rank(r);
    if (worker.registered) {
      status.set_incarnation(worker.incarnation);
      status.set_host(worker.host);
      status.set_backend(worker.backend);
      status.set_state(worker.state);
      status.set_joining(worker.joining);
      status.set_last_heartbeat_ms_ago(MillisSince(worker.last_heartbeat, now));
      if (worker.progress.has_value()) *status.mutable_progress() = *worker.progress;
    }
    out.push_back(std::move(status));
  }
  return out;
}

std::vector<v1::ShardStatus> Membership::ShardStatuses(absl::Time now) const {
  std::vector<v1::ShardStatus> out;
  for (uint32_t s = 0; s < num_shards(); ++s) {
    const Server& server = servers_[s];
    v1::ShardStatus status;
    if (server.status.has_value()) status = *server.status;
    status.set_shard(s);
    if (server.registered) {
      status.set_address(server.address);
      status.set_incarnation(server.incarnation);
      status.set_state(server.state);
      status.set_last_heartbeat_ms_ago(MillisSince(server.last_heartbeat, now));
    }
    out.push_back(std::move(status));
  }
  return out;
}

}  // namespace grps
