#include "coordinator/resharding.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "job/shard_map.h"
#include "spdlog/spdlog.h"

namespace grps {

Resharding::Resharding(const v1::JobConfig& config)
    : job_id_(config.job_id()), max_servers_(config.max_servers()) {}

absl::Status Resharding::CheckTarget(uint32_t num_servers) const {
  if (!enabled())
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id_,
        " has a fixed shard count (start the coordinator with --max_servers to scale it)"));
  if (num_servers == 0 || num_servers > max_servers_)
    return absl::InvalidArgumentError(absl::StrCat(
        "--servers must be in [1, ", max_servers_, "] (the job's max_servers), got ",
        num_servers));
  return absl::OkStatus();
}

void Resharding::Ask(uint32_t num_servers, uint32_t shards) {
  if (num_servers == shards && target_ == 0) return;
  if (target_ != num_servers)
    spdlog::info("job {}: re-sharding from {} to {} shards asked for", job_id_, shards,
                 num_servers);
  target_ = num_servers;
}

void Resharding::Tick(const Job& job, const CheckpointScheduler& checkpoints,
                      const CutStarter& cut, absl::Time now) {
  if (target_ == 0) return;
  if (job.ended) {
    target_ = 0;
    cut_ = 0;
    phase_.clear();
    return;
  }
  if (target_ == job.shards && cut_ == 0) {
    target_ = 0;  // asked back to where it is
    phase_.clear();
    return;
  }
  if (!job.training) {
    phase_ = "waits for a training job";
    return;
  }
  if (cut_ != 0) {
    const v1::CheckpointSummary summary = checkpoints.SummaryOf(cut_);
    if (summary.state() == v1::CHECKPOINT_STATE_PENDING) return;
    if (summary.state() == v1::CHECKPOINT_STATE_COMPLETE) return;  // moved when written
    spdlog::warn("re-sharding to {} shards: cut {} failed ({}); cutting again", target_, cut_,
                 summary.error());
    cut_ = 0;
  }
  std::vector<uint32_t> missing;
  const std::map<uint32_t, Membership::Endpoint> standbys = FreshStandbys();
  for (uint32_t s = job.shards; s < target_; ++s)
    if (standbys.count(s) == 0) missing.push_back(s);
  if (!missing.empty()) {
    phase_ = absl::StrCat("waiting for a server of shard", missing.size() == 1 ? " " : "s ",
                          absl::StrJoin(missing, ", "), " to register");
    return;
  }
  if (asked_ == absl::InfiniteFuture()) asked_ = now;
  if (checkpoints.pending()) {
    // The pending checkpoint is as good a cut as a new one.
    cut_ = checkpoints.pending_summary().id();
  } else {
    absl::StatusOr<v1::CheckpointRequest> started =
        cut(absl::StrCat("the cut of re-sharding to ", target_, " shards"));
    if (!started.ok()) {
      phase_ = absl::StrCat("cannot cut yet: ", started.status().message());
      return;
    }
    cut_ = started->id();
  }
  phase_ = absl::StrCat("cutting at checkpoint ", cut_);
}

std::optional<uint32_t> Resharding::CutWritten(uint64_t id, uint32_t shards) {
  if (target_ == 0 || id != cut_) return std::nullopt;
  cut_ = 0;
  if (target_ == shards) {  // asked back to where it is while the cut was taken
    target_ = 0;
    phase_.clear();
    asked_ = absl::InfiniteFuture();
    return std::nullopt;
  }
  return target_;
}

void Resharding::Moved(uint32_t from, uint32_t to, uint64_t step, absl::Time now) {
  target_ = 0;
  phase_.clear();
  done_.set_completed(done_.completed() + 1);
  done_.set_last_from(from);
  done_.set_last_to(to);
  done_.set_last_step(step);
  done_.set_last_seconds(asked_ == absl::InfiniteFuture()
                             ? 0
                             : std::max(0.0, absl::ToDoubleSeconds(now - asked_)));
  asked_ = absl::InfiniteFuture();
}

uint64_t Resharding::StandBy(uint32_t shard, const std::string& address, uint32_t shards,
                             const std::function<uint64_t()>& reserve) {
  Standby& standby = standbys_[shard];
  if (standby.endpoint.address != address || standby.endpoint.incarnation == 0) {
    // A new server for the shard takes the place (an older standby that
    // still waits hears so from StandbyIncarnation).
    standby.endpoint.address = address;
    standby.endpoint.incarnation = reserve();
    spdlog::info("server {} stands by for shard {} (incarnation {}); the job has {} shards",
                 address, shard, standby.endpoint.incarnation, shards);
  }
  ++standby.calls_waiting;
  return standby.endpoint.incarnation;
}

uint64_t Resharding::StandbyIncarnation(uint32_t shard) const {
  auto it = standbys_.find(shard);
  return it == standbys_.end() ? 0 : it->second.endpoint.incarnation;
}

void Resharding::StandbyCallEnded(uint32_t shard, uint64_t incarnation, bool taken) {
  auto it = standbys_.find(shard);
  if (it == standbys_.end() || it->second.endpoint.incarnation != incarnation) return;
  --it->second.calls_waiting;
  it->second.last_call = absl::Now();
  if (taken) standbys_.erase(it);
}

bool Resharding::TakenInAgain(uint32_t shard, const std::string& address,
                              uint64_t incarnation) {
  auto it = standbys_.find(shard);
  if (it == standbys_.end() || it->second.endpoint.address != address ||
      it->second.endpoint.incarnation != incarnation)
    return false;
  standbys_.erase(it);
  return true;
}

std::map<uint32_t, Membership::Endpoint> Resharding::FreshStandbys() const {
  std::map<uint32_t, Membership::Endpoint> out;
  const absl::Time real_now = absl::Now();
  for (const auto& [shard, standby] : standbys_)
    if (standby.calls_waiting > 0 || real_now - standby.last_call <= kStandbyFresh)
      out[shard] = standby.endpoint;
  return out;
}

v1::ReshardProgress Resharding::Progress() const {
  v1::ReshardProgress progress = done_;
  progress.set_target_servers(target_);
  progress.set_phase(target_ == 0 ? std::string() : phase_);
  progress.set_checkpoint_id(cut_);
  return progress;
}

void Resharding::TakeOver(const v1::CoordinatorState& state) {
  // A move asked for goes on with a new cut.
  target_ = enabled() ? state.reshard_target() : 0;
  done_ = state.reshard();
}

void Resharding::ExportTo(v1::CoordinatorState* state) const {
  state->set_reshard_target(target_);
  *state->mutable_reshard() = done_;
}

Resharding::Publication Resharding::Publish(const v1::CheckpointManifest& manifest,
                                            uint64_t chunk_bytes, Membership* membership,
                                            CheckpointScheduler* checkpoints, absl::Time now) {
  Publication out{.from = membership->num_shards()};
  const std::optional<uint32_t> to = CutWritten(manifest.id(), out.from);
  if (!to.has_value()) return out;
  out.to = *to;
  absl::StatusOr<std::map<uint32_t, uint64_t>> dropped =
      ReshardMembers(*to, FreshStandbys(), chunk_bytes, membership, checkpoints, now);
  if (absl::IsFailedPrecondition(dropped.status())) {
    spdlog::error("re-sharding to {} shards: {}; not re-sharded", *to,
                  std::string(dropped.status().message()));
    Abandon();
    return out;
  }
  if (!dropped.ok()) {
    spdlog::warn("re-sharding to {} shards: {}; waiting for it", *to,
                 std::string(dropped.status().message()));
    out.wait_again = true;
    return out;
  }
  Moved(out.from, *to, manifest.step(), now);
  out.moved = true;
  if (!dropped->empty())
    spdlog::info("job {}: shard{} {} retired", job_id_, dropped->size() == 1 ? "" : "s",
                 absl::StrJoin(*dropped, ", ",
                               absl::PairFormatter(absl::AlphaNumFormatter(), " incarnation ",
                                                   absl::AlphaNumFormatter())));
  return out;
}

absl::StatusOr<std::map<uint32_t, uint64_t>> ReshardMembers(
    uint32_t count, const std::map<uint32_t, Membership::Endpoint>& servers,
    uint64_t chunk_bytes, Membership* membership, CheckpointScheduler* checkpoints,
    absl::Time now) {
  const v1::ShardMap& map = membership->shard_map();
  absl::StatusOr<v1::ShardMap> built =
      BuildShardMap({map.tensors().begin(), map.tensors().end()}, count, chunk_bytes);
  if (!built.ok())
    return absl::FailedPreconditionError(absl::StrCat(
        "no map of ", count, " shards: ", built.status().message()));
  absl::StatusOr<std::map<uint32_t, uint64_t>> dropped =
      membership->Reshard(*built, servers, now);
  if (dropped.ok()) checkpoints->set_num_shards(count);
  return dropped;
}

}  // namespace grps
