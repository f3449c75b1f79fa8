#include "server/shard_checkpointer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/checkpoint.h"
#include "daemon/daemon.h"
#include "daemon/env.h"
#include "daemon/metrics.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "server/shard_restore.h"
#include "spdlog/spdlog.h"

namespace grps {
namespace {

// grps_checkpoint_write_seconds{result}: how long this shard took to collect
// and write its part of a checkpoint.
prometheus::Histogram& CheckpointSeconds(bool ok) {
  static prometheus::Family<prometheus::Histogram>& family =
      prometheus::BuildHistogram()
          .Name("grps_checkpoint_write_seconds")
          .Help("time to collect and write the shard's part of a checkpoint, by result")
          .Register(*ProcessMetrics());
  return family.Add({{"result", ok ? "ok" : "failed"}}, DurationBuckets());
}

}  // namespace

ShardCheckpointer::ShardCheckpointer(ShardStore* store, std::string own_dir,
                                     const ShardCheckpointer* before)
    : store_(store), own_dir_(std::move(own_dir)), thread_([this] { Loop(); }) {
  if (before != nullptr) {
    last_id_ = before->last_id_;
    last_incarnation_ = before->last_incarnation_;
  }
}

void ShardCheckpointer::MaybeStart(const v1::CheckpointRequest& request) {
  if (request.id() == 0 ||
      (request.id() == last_id_ && request.coordinator_incarnation() == last_incarnation_))
    return;
  std::vector<v1::ShardFileRef> base = IncrementalBase(request, last_id_);
  last_id_ = request.id();
  last_incarnation_ = request.coordinator_incarnation();
  v1::ShardCheckpoint report;
  report.set_id(request.id());
  report.set_shard(store_->shard());
  report.set_coordinator_incarnation(request.coordinator_incarnation());
  // Armed now, on the heartbeat thread, so that a sync cut a few steps
  // ahead is not missed; collected and written on the checkpoint thread.
  // Arming supersedes the capture in progress, whose Take then ends.
  const uint64_t generation = store_->generation();
  absl::Status armed = store_->ArmCheckpoint(request, !base.empty());
  absl::MutexLock lock(&mu_);
  const uint64_t seq = ++latest_;
  if (!armed.ok()) {
    report.set_state(v1::CHECKPOINT_STATE_FAILED);
    report.set_error(std::string(armed.message()));
    spdlog::warn("checkpoint {}: shard {} failed: {}", request.id(), store_->shard(),
                 report.error());
    store_->SetCheckpointReport(report);
    pending_.reset();
    return;
  }
  report.set_state(v1::CHECKPOINT_STATE_PENDING);
  store_->SetCheckpointReport(report);
  pending_ = Pending{request, seq, std::move(base), generation};
}

std::vector<v1::ShardFileRef> ShardCheckpointer::IncrementalBase(
    const v1::CheckpointRequest& request, uint64_t previous) {
  const uint32_t every = store_->config().checkpoint_full_every();
  absl::MutexLock lock(&mu_);
  // chain_ holds the full file and at most `every` - 1 increments: room for one more.
  if (every == 0 || chain_.empty() || chain_.size() > every) return {};
  const v1::ShardFileRef& newest = chain_.back();
  if (newest.id() != previous || newest.id() >= request.id() ||
      chain_generation_ != store_->generation())
    return {};
  return chain_;
}

void ShardCheckpointer::Join() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ShardCheckpointer::Loop() {
  while (true) {
    Pending next;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ShardCheckpointer::HasWorkLocked));
      if (!pending_.has_value()) return;  // stopping, nothing left
      next = std::move(*pending_);
      pending_.reset();
    }
    Take(next);
  }
}

void ShardCheckpointer::Take(const Pending& pending) {
  const v1::CheckpointRequest& request = pending.request;
  const absl::Time start = absl::Now();
  v1::ShardCheckpoint report;
  report.set_id(request.id());
  report.set_shard(store_->shard());
  absl::StatusOr<v1::ShardCheckpointFile> file =
      store_->CollectCheckpoint(request.id(), start + kCaptureTimeout);
  if (file.ok() && !pending.base.empty()) file->set_base_id(pending.base.back().id());
  absl::StatusOr<v1::ShardCheckpoint> written =
      file.ok() ? WriteShardFile(
                      Env::Default(),
                      OwnCheckpointFolder(store_->config(), request.id(), request.dir(), own_dir_),
                      *file, CheckpointPartBytes(store_->config()))
                : absl::StatusOr<v1::ShardCheckpoint>(file.status());
  CheckpointSeconds(written.ok()).Observe(absl::ToDoubleSeconds(absl::Now() - start));
  if (written.ok()) {
    report = *written;
    report.set_coordinator_incarnation(request.coordinator_incarnation());
    for (const v1::ShardFileRef& ref : pending.base) *report.add_chain() = ref;
    for (const v1::ChunkState& chunk : file->chunks())
      LowerHeldFrom(chunk.held_from(), report.mutable_held_from());
    for (const v1::TableState& table : file->tables())
      LowerHeldFrom(table.held_from(), report.mutable_held_from());
    spdlog::info(
        "checkpoint {}: shard {} wrote {} chunks{}{} ({:.2f} MiB) at versions "
        "{}..{} in {}",
        request.id(), store_->shard(), report.num_chunks(),
        report.num_tables() > 0
            ? absl::StrCat(" and ", report.num_rows(), pending.base.empty() ? "" : " changed",
                           " sparse rows")
            : "",
        pending.base.empty()
            ? ""
            : absl::StrCat(" (incremental on checkpoint ", pending.base.back().id(), ")"),
        BytesInMiB(ShardFileBytes(report)), report.min_version(), report.max_version(),
        absl::FormatDuration(absl::Now() - start));
  } else {
    report.set_state(v1::CHECKPOINT_STATE_FAILED);
    report.set_coordinator_incarnation(request.coordinator_incarnation());
    report.set_error(std::string(written.status().message()));
    spdlog::warn("checkpoint {}: shard {} failed: {}", request.id(), store_->shard(),
                 report.error());
  }
  absl::MutexLock lock(&mu_);
  // The next may apply on top of this file; after a failure, on nothing
  // (a table's changes since its previous capture were taken here).
  chain_.clear();
  if (written.ok()) {
    chain_ = pending.base;
    v1::ShardFileRef& ref = chain_.emplace_back();
    ref.set_id(report.id());
    ref.set_file(report.file());
    ref.set_bytes(report.bytes());
    ref.set_crc32(report.crc32());
    *ref.mutable_parts() = report.parts();
    chain_generation_ = pending.generation;
  }
  // A superseded checkpoint leaves the report to the newer one.
  if (pending.seq == latest_) store_->SetCheckpointReport(report);
}

}  // namespace grps
