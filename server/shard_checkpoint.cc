#include "server/shard_checkpoint.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "job/job_config.h"
#include "job/sparse_tables.h"

namespace grps {

// ---- Capture ----

absl::Status CheckpointCapture::Arm(const v1::CheckpointRequest& request, bool changes_only) {
  absl::MutexLock capture(&mu_);
  epoch_.fetch_add(1);
  absl::Status armed;
  for (StoreTarget* t : shard_.targets) {
    absl::MutexLock lock(&t->mu);
    t->Disarm();
    t->capture_changes = changes_only;
    const CheckpointCut cut = t->policy->Cut(request.version(), *t);
    if (cut == CheckpointCut::kNow) {
      t->Capture();
    } else if (cut == CheckpointCut::kArmed) {
      t->capture_at = request.version();
    } else {
      armed = absl::FailedPreconditionError(absl::StrCat(t->name, " is already at version ",
                                                         t->version(), ", past the checkpoint's ",
                                                         request.version()));
      break;  // DisarmAll below
    }
  }
  if (!armed.ok()) {
    DisarmAll();
    armed_.reset();
    return armed;
  }
  armed_ = request;
  armed_generation_ = shard_.generation->load();
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardCheckpointFile> CheckpointCapture::Collect(uint64_t id,
                                                                   absl::Time deadline) {
  v1::CheckpointRequest request;
  uint64_t generation = 0;
  uint64_t epoch = 0;
  {
    absl::MutexLock capture(&mu_);
    // Under mu_, as Arm bumps it: the epoch of this arm.
    epoch = epoch_.load();
    if (!armed_.has_value() || armed_->id() != id)
      return absl::AbortedError(absl::StrCat("checkpoint ", id, " was superseded"));
    request = *armed_;
    generation = armed_generation_;
    armed_.reset();
  }
  const auto superseded = [&] {
    return absl::AbortedError(
        absl::StrCat("checkpoint ", request.id(), " was superseded by a newer one"));
  };
  v1::ShardCheckpointFile file;
  file.set_job_id(shard_.job_id);
  file.set_checkpoint_id(request.id());
  file.set_shard(shard_.shard);
  absl::Status stop;
  for (StoreTarget* t : shard_.targets) {
    while (stop.ok()) {
      {
        absl::MutexLock lock(&t->mu);
        // A newer arm may have put its own capture here already: the epoch
        // is checked under the target's lock, which that arm takes after
        // bumping it.
        if (epoch_.load() != epoch) return superseded();
        if (t->TakeCapture(&file)) break;
      }
      if (epoch_.load() != epoch) return superseded();
      if (shard_.generation->load() != generation)
        stop = absl::AbortedError("the shard was rolled back while checkpointing");
      else if (shard_.shutdown->load())
        stop = absl::UnavailableError("shard is shutting down");
      else if (absl::Now() >= deadline)
        stop = absl::DeadlineExceededError(absl::StrCat(t->name, " did not reach version ",
                                                        request.version(), " in time"));
      else
        absl::SleepFor(absl::Milliseconds(1));
    }
  }
  if (!stop.ok()) {
    DisarmAll();
    return stop;
  }
  return file;
}

void CheckpointCapture::DisarmAll() {
  for (StoreTarget* t : shard_.targets) {
    absl::MutexLock lock(&t->mu);
    t->Disarm();
  }
}

// ---- Restore ----

absl::StatusOr<std::vector<const v1::ChunkState*>> MatchChunkStates(
    const std::vector<std::unique_ptr<StoreChunk>>& chunks,
    const std::vector<v1::ChunkState>& states) {
  std::vector<const v1::ChunkState*> by_chunk(chunks.size(), nullptr);
  if (states.empty()) return by_chunk;
  for (const v1::ChunkState& state : states) {
    auto it = std::lower_bound(chunks.begin(), chunks.end(), state.chunk_id(),
                               [](const auto& c, uint32_t id) { return c->id < id; });
    if (it == chunks.end() || (*it)->id != state.chunk_id())
      continue;  // another shard's chunk (a re-sharded restore)
    StoreChunk& c = **it;
    const size_t index = it - chunks.begin();
    auto bad = [&](auto... why) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", c.id, ": ", why...));
    };
    if (by_chunk[index] != nullptr) return bad("appears twice in the checkpoint");
    if (state.num_elements() != c.num_elements() ||
        state.values().size() != c.num_elements() * sizeof(float))
      return bad("the checkpoint has ", state.values().size(), " bytes of values, the chunk ",
                 c.num_elements(), " elements");
    if (state.optimizer_step_offset() < 0 &&
        static_cast<uint64_t>(-(state.optimizer_step_offset() + 1)) + 1 > state.version())
      return bad("the optimizer's step offset ", state.optimizer_step_offset(),
                 " is below minus the version ", state.version());
    if (state.optimizer_step_offset() > kMaxOptimizerSteps)
      return bad("the optimizer's step offset ", state.optimizer_step_offset(), " is above ",
                 kMaxOptimizerSteps);
    std::vector<const std::string*> slots;
    for (const std::string& slot : state.optimizer_state()) slots.push_back(&slot);
    absl::MutexLock lock(&c.mu);
    if (absl::Status s = c.optimizer->CheckState(slots); !s.ok()) return bad(s.message());
    by_chunk[index] = &state;
  }
  for (size_t i = 0; i < chunks.size(); ++i)
    if (by_chunk[i] == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint has no state for chunk ", chunks[i]->id));
  return by_chunk;
}

absl::StatusOr<std::vector<LoadedTable>> LoadTableStates(
    const std::vector<std::unique_ptr<StoreTable>>& tables, uint32_t shard,
    uint32_t num_servers, const std::vector<v1::TableState>& states, bool required) {
  std::vector<LoadedTable> loaded(tables.size());
  for (const v1::TableState& state : states) {
    auto it = std::find_if(tables.begin(), tables.end(),
                           [&](const auto& t) { return t->spec.name() == state.name(); });
    if (it == tables.end())
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint has a sparse table '", state.name(), "' this job has not"));
    const StoreTable& t = **it;
    LoadedTable& out = loaded[it - tables.begin()];
    if (out.state != nullptr)
      return absl::InvalidArgumentError(absl::StrCat(t.name, " appears twice in the checkpoint"));
    for (int64_t id : state.ids())
      if (!SparseIdInRange(t.spec, id) || SparseShardOf(id, num_servers) != shard)
        return absl::InvalidArgumentError(absl::StrCat(
            t.name, ": the checkpoint gives shard ", shard, " row ", id,
            ", which is out of the table's range or another shard's"));
    out.state = &state;
    out.rows = t.NewRows();
    if (absl::Status s = out.rows->Load(state); !s.ok()) return s;
  }
  for (size_t i = 0; required && i < loaded.size(); ++i)
    if (loaded[i].state == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("the checkpoint has no state for ", tables[i]->name));
  return loaded;
}

absl::Status ResetTargets(const std::vector<std::unique_ptr<StoreChunk>>& chunks,
                          absl::Span<const v1::ChunkState* const> chunk_states,
                          const std::vector<std::unique_ptr<StoreTable>>& tables,
                          std::vector<LoadedTable> table_states, const v1::ShardMap& map,
                          const v1::JobConfig& config, absl::Span<const uint64_t> resume_steps,
                          const LiveSet& live) {
  for (size_t i = 0; i < chunks.size(); ++i) {
    StoreChunk& c = *chunks[i];
    c.mu.AssertHeld();
    const v1::ChunkSpec& spec = map.chunks(c.id);
    if (absl::Status s = c.Reset(chunk_states[i], spec, map.tensors(spec.tensor_index()), config,
                                 resume_steps);
        !s.ok())
      return absl::InternalError(absl::StrCat("chunk ", c.id, ": ", s.message()));
    c.policy->LiveSetChanged(c, live);
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    StoreTable& t = *tables[i];
    t.mu.AssertHeld();
    LoadedTable& l = table_states[i];
    t.Reset(l.state, std::move(l.rows), config, resume_steps);
    t.policy->LiveSetChanged(t, live);
  }
  return absl::OkStatus();
}

}  // namespace grps
