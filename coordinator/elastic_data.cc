#include "coordinator/elastic_data.h"

#include <string>
#include <utility>

#include "spdlog/spdlog.h"

namespace grps {

void ElasticData::ResumeFrom(const v1::CheckpointManifest& manifest) {
  if (manifest.example_ledger().total_blocks() == 0) return;
  if (absl::Status s = ledger_.ImportFrom(manifest.example_ledger()); s.ok())
    from_checkpoint_ = true;
  else
    spdlog::error("checkpoint {}: {}; the epochs start over", manifest.id(),
                  std::string(s.message()));
}

absl::StatusOr<ExampleLedger> ElasticData::Read(const v1::CoordinatorState& state) {
  ExampleLedger ledger;
  if (absl::Status s = ledger.ImportFrom(state.example_ledger()); !s.ok()) return s;
  return ledger;
}

void ElasticData::TakeOver(ExampleLedger ledger, const std::vector<uint32_t>& live_ranks) {
  ledger_ = std::move(ledger);
  ledger_.LimboAfterTakeOver();
  // What the state file may have missed is leased once every live worker
  // has said what it holds, or after the take-over's grace.
  ledger_.HoldLimbo(true);
  claims_awaited_ = std::set<uint32_t>(live_ranks.begin(), live_ranks.end());
}

void ElasticData::ExportTo(v1::CoordinatorState* state) const {
  if (ledger_.sized()) ledger_.ExportTo(state->mutable_example_ledger());
}

void ElasticData::AddTo(v1::JobStatus* status) const {
  if (ledger_.sized()) *status->mutable_data() = ledger_.Progress();
}

absl::Status ElasticData::Admit(const v1::JobConfig& config,
                                const v1::LeaseExamplesRequest& request) {
  // The whole request is checked before anything changes: a refused one
  // leaves the ledger (unsized too) as it was.
  const absl::StatusOr<LedgerShape> shape = ExampleLedger::ShapeFor(config, request.train_examples());
  if (!shape.ok()) return shape.status();
  const absl::Status fits = ledger_.CheckSize(*shape);
  // A checkpoint's ledger of another job's shape (another batch, data set
  // or epoch count): the epochs start over.
  const bool start_over = !fits.ok() && from_checkpoint_;
  if (!fits.ok() && !start_over) return fits;
  if (absl::Status s = ExampleLedger::CheckRequest(*shape, request); !s.ok()) return s;
  if (start_over) {
    spdlog::warn("the checkpoint's example ledger does not fit this job ({}); the epochs "
                 "start over",
                 std::string(fits.message()));
    ledger_ = ExampleLedger();
  }
  from_checkpoint_ = false;
  // Neither this nor Grant refuse what passed the checks.
  return ledger_.Size(*shape);
}

absl::StatusOr<v1::LeaseExamplesResponse> ElasticData::Grant(
    const v1::LeaseExamplesRequest& request, const std::vector<uint32_t>& live_ranks,
    bool grace_over) {
  if (absl::Status s = ledger_.Claim(request.worker_rank(), request.held()); !s.ok()) return s;
  // Only a claim the heartbeat asked for: a call retried since before the
  // take-over may say less than the worker holds now.
  if (request.claim()) claims_awaited_.erase(request.worker_rank());
  ReleaseLimbo(live_ranks, grace_over);
  bool exhausted = false;
  absl::StatusOr<std::vector<uint64_t>> blocks = ledger_.Lease(
      request.worker_rank(),
      std::vector<v1::TrainedBlock>(request.trained().begin(), request.trained().end()),
      request.want(), &exhausted, static_cast<uint32_t>(live_ranks.size()));
  if (!blocks.ok()) return blocks.status();
  v1::LeaseExamplesResponse response;
  response.mutable_blocks()->Add(blocks->begin(), blocks->end());
  response.set_blocks_per_epoch(ledger_.blocks_per_epoch());
  response.set_exhausted(exhausted);
  return response;
}

bool ElasticData::ClaimAwaited(uint32_t rank) const {
  return ledger_.holding_limbo() && claims_awaited_.count(rank) > 0;
}

void ElasticData::ReleaseLimbo(const std::vector<uint32_t>& live_ranks, bool grace_over) {
  if (!ledger_.holding_limbo()) return;
  bool all_heard = true;
  for (uint32_t r : live_ranks) all_heard = all_heard && claims_awaited_.count(r) == 0;
  if (!all_heard && !grace_over) return;
  ledger_.HoldLimbo(false);
  spdlog::info("example ledger: {}; the blocks whose fate the state file missed are leased "
               "again once no other block is left",
               all_heard ? "every live worker said what it holds and trained"
                         : "the take-over's grace is over");
}

void ElasticData::CutInto(v1::CheckpointManifest* manifest) const {
  if (!ledger_.sized()) return;
  ExampleLedger cut = ledger_;
  cut.RollBack({manifest->worker_steps().begin(), manifest->worker_steps().end()});
  cut.ExportTo(manifest->mutable_example_ledger());
}

}  // namespace grps
