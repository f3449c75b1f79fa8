// OptimizerStateCalls: the GetOptimizerState and LoadOptimizerState calls of
// a worker, over its flat parameter array.
#include "worker/optimizer_state_calls.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "job/job_config.h"

namespace grps {

OptimizerStateCalls::OptimizerStateCalls(const v1::JobConfig& config, const ChunkLayout& layout,
                                         uint32_t rank, uint64_t incarnation,
                                         const std::atomic<uint64_t>* generation, StubFor stub)
    : job_id_(config.job_id()),
      kind_(config.optimizer().kind()),
      layout_(layout),
      rank_(rank),
      incarnation_(incarnation),
      generation_(generation),
      stub_(std::move(stub)) {}

absl::StatusOr<ProgramOptimizerState> OptimizerStateCalls::Read(absl::Duration timeout) const {
  ProgramOptimizerState state;
  state.kind = kind_;
  const uint32_t slots = OptimizerStateSlots(state.kind);
  state.slots.assign(slots, std::vector<float>(layout_.num_parameters()));
  std::vector<uint64_t> chunk_steps(layout_.num_chunks(), 0);
  for (const ChunkLayout::Part& call : layout_.Runs(slots, kCallBytes)) {
    v1::GetOptimizerStateRequest request;
    request.set_job_id(job_id_);
    request.set_worker_rank(rank_);
    request.set_generation(generation_->load());
    for (uint32_t id : call.chunk_ids) request.add_chunk_ids(id);
    v1::GetOptimizerStateResponse reply;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status = stub_(call.shard)->GetOptimizerState(&context, request, &reply);
    if (!status.ok())
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("reading shard ", call.shard, "'s optimizer state: ",
                                       status.error_message()));
    if (reply.kind() != state.kind || reply.chunks_size() != request.chunk_ids_size())
      return absl::InternalError(absl::StrCat("shard ", call.shard, " answered the state of ",
                                              reply.chunks_size(), " chunks of ",
                                              OptimizerName(reply.kind()), ", not ",
                                              request.chunk_ids_size(), " of ",
                                              OptimizerName(state.kind)));
    for (int i = 0; i < reply.chunks_size(); ++i) {
      const v1::ChunkOptimizerState& c = reply.chunks(i);
      const uint32_t id = request.chunk_ids(i);
      const uint64_t n = layout_.num_elements(id);
      if (c.chunk_id() != id || static_cast<uint32_t>(c.slots_size()) != slots)
        return absl::InternalError(absl::StrCat("shard ", call.shard, " answered chunk ",
                                                c.chunk_id(), " with ", c.slots_size(),
                                                " slots for chunk ", id));
      for (uint32_t k = 0; k < slots; ++k) {
        const std::string& slot = c.slots(static_cast<int>(k));
        if (slot.size() != n * sizeof(float))
          return absl::InternalError(absl::StrCat("shard ", call.shard, " answered ",
                                                  slot.size(), " bytes of chunk ", id, "'s slot ",
                                                  k));
        std::memcpy(state.slots[k].data() + layout_.offset(id), slot.data(), slot.size());
      }
      chunk_steps[id] = c.steps();
    }
  }
  for (size_t t = 0; t < layout_.num_tensors(); ++t) {
    const std::vector<uint32_t>& chunks = layout_.tensor_chunks(t);
    state.steps.push_back(chunks.empty() ? 0 : chunk_steps[chunks.front()]);
  }
  return state;
}

absl::Status OptimizerStateCalls::Load(const ProgramOptimizerState& state,
                                       absl::Duration timeout) const {
  const uint32_t slots = OptimizerStateSlots(kind_);
  if (state.kind != kind_)
    return absl::InvalidArgumentError(absl::StrCat("the state is the ", OptimizerName(state.kind),
                                                   " optimizer's; the job keeps ",
                                                   OptimizerName(kind_), "'s"));
  if (state.slots.size() != slots || state.steps.size() != layout_.num_tensors())
    return absl::InvalidArgumentError(absl::StrCat(
        "the state has ", state.slots.size(), " slots and steps for ", state.steps.size(),
        " tensors; ", OptimizerName(kind_), " has ", slots, ", the model ",
        layout_.num_tensors(), " tensors"));
  for (const std::vector<float>& slot : state.slots)
    if (static_cast<int64_t>(slot.size()) != layout_.num_parameters())
      return absl::InvalidArgumentError(absl::StrCat(
          "a state slot of ", slot.size(), " floats; the model has ", layout_.num_parameters()));
  for (const ChunkLayout::Part& call : layout_.Runs(slots, kCallBytes)) {
    v1::LoadOptimizerStateRequest request;
    request.set_job_id(job_id_);
    request.set_worker_rank(rank_);
    request.set_incarnation(incarnation_);
    request.set_generation(generation_->load());
    request.set_kind(kind_);
    for (uint32_t id : call.chunk_ids) {
      const v1::ChunkSpec& spec = layout_.map().chunks(static_cast<int>(id));
      v1::ChunkOptimizerState* c = request.add_chunks();
      c->set_chunk_id(id);
      c->set_steps(state.steps[spec.tensor_index()]);
      for (const std::vector<float>& slot : state.slots)
        c->add_slots(reinterpret_cast<const char*>(slot.data() + layout_.offset(id)),
                     spec.num_elements() * sizeof(float));
    }
    v1::LoadOptimizerStateResponse reply;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    grpc::Status status = stub_(call.shard)->LoadOptimizerState(&context, request, &reply);
    if (!status.ok())
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("loading shard ", call.shard, "'s optimizer state: ",
                                       status.error_message()));
  }
  return absl::OkStatus();
}

}  // namespace grps
