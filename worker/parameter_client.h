// ParameterClient: a worker's view of the sharded parameters. Pushes
// gradients to and pulls weights from every shard concurrently, cutting the
// flat parameter array into the chunks of the shard map, in the shape of
// ps-lite's KVWorker: PushAsync and PullAsync start the RPCs and return a
// ticket at once, Wait(ticket) waits for them.
//
// The wire (wire/chunk_codec.h): a push's f32 payloads are slices over the
// caller's gradient array, not copies; a pull's reply is copied once, from
// the received slices straight into the caller's parameter array. Each
// shard's chunks travel in parts (requests) of at most kPartBytes, or
// kLocalPartBytes to a shard on the worker's machine, or the job's
// part_bytes (a larger chunk alone), so no model is too large for gRPC's
// message limit (worker/chunk_layout.h), all on one channel (one TCP connection) per
// shard: a connection's bytes leave in the order they were written, so a
// shard gets a worker's parts one after the other. (Two connections a
// shard, each part on the next, sent two parts a shard at once, each at half
// the rate: every part, and every update waiting for all the workers'
// copies of it, came later. Across 200 Mbit/s namespace hosts under reno,
// one connection gave 114 samples/s at N = 4 and 62 at N = 2 against 107 and
// 60; on loopback no change: docs/performance.md, "One connection a
// shard".) The RPCs run on gRPC's callback API: no thread
// is created per call.
//
// The push schedule (push and pull at once; worker/push_schedule.h): a
// push's parts are ordered by their place in the model, shards
// interleaved, the same order on every worker. Those whose bytes travel in
// the request go out one at a time per shard: a shard's next ready part in
// that order starts once its part before has been written to its
// connection, with at most the credit of request bytes whose replies have
// not come (a part ahead of all of those may pass; the credit is measured),
// one credit for the network and one for the shards on this machine.
// A sync push staged for autograd's hooks (StagePush) keeps a strict order
// instead, backward's (ChunkLayout::BackwardOrder): each shard gets its
// parts in that order from every worker, whatever each worker's hooks made
// ready first, so a shard has every worker's copy of a part at about the
// same time.
// So each worker sends to every shard at once (with a shard per host, every
// server's link is busy), the first parts reach their shards from every
// worker at about the same time, their updates complete, and their new
// weights (a fused pull) come down while later parts still go up: a
// bandwidth-bound step costs about one transfer of the model each way at
// the same time, where parts sent all at once share the link, all arrive
// at its end, and come back after it (BytePS's partitions and credit, in
// the same shape).
//
// Shared-memory lanes (JobConfig.local_transport; worker/push_lanes.h): a
// dense push's gradients, and its fused pull's weights, travel through a
// memfd of this process that a shard on the same machine maps; the gRPC
// call carries the rest. A shard that cannot use the lane refuses the push
// unchanged, and from then on that shard gets bytes. A lane call that fails
// where the shard may have accepted it (deadline, cancellation, a lost
// connection) retires the lane and is sent again on a fresh one.
//
// Doorbells (wire/lane_doorbell.h): each lane push also asks its shard to
// serve a doorbell in the lane; once a shard's reply says it does, the
// next pushes to it are rung there instead of called (the same request
// bytes, the same reply), and Wait's thread sleeps on the answer's futex
// word. A shard that stops beating for kDoorbellSilence, or no answer in
// kPushCallTimeout, fails the call UNAVAILABLE or DEADLINE_EXCEEDED: the
// lane is retired and the push sent again through gRPC.
#ifndef GRPS_WORKER_PARAMETER_CLIENT_H_
#define GRPS_WORKER_PARAMETER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/grps.grpc.pb.h"
#include "worker/chunk_layout.h"
#include "worker/optimizer_state_calls.h"
#include "worker/parameter_shards.h"
#include "worker/push_lanes.h"
#include "worker/push_schedule.h"
#include "worker/topk_feedback.h"

namespace grps {

// MapFit and FitShardMap: worker/chunk_layout.h.
//
// The flat array holds the map's tensors back to back in map order; a chunk
// covers elements [tensor_offset + chunk.offset, + chunk.num_elements).
//
// Every push and pull is tagged with the client's generation (see
// RestoreOrder in proto/grps.proto): a shard refuses one from an older
// generation with ABORTED, which the client returns as it is.
//
// Thread safety: every method may be called from any thread, with one
// exception: PushAsync reads the chunk versions that pulls (and fused
// pushes) record, so it must not start while one of those is in flight on
// this client; it tags the push with the versions of the last one that
// completed. UpdateShardMap may be called while RPCs are in
// flight: an RPC attempt that starts after it returned goes to the new
// endpoint. Each ticket is waited for exactly once; the destructor waits
// for the RPCs of tickets nobody waited for.
class ParameterClient final : public ParameterShards {
 public:
  // `map` must be valid (ValidateShardMap) with every endpoint set.
  // `on_this_machine`, by shard: whether the push schedule counts it on
  // this machine's link rather than the network's; by default, whether its
  // address is this machine's (ChunkLayout::OnThisMachine). (A test plays a
  // shard of another machine on loopback.)
  ParameterClient(const v1::JobConfig& config, const v1::ShardMap& map, uint32_t rank,
                  uint64_t incarnation,
                  std::optional<std::vector<bool>> on_this_machine = std::nullopt);
  ~ParameterClient() override;
  ParameterClient(const ParameterClient&) = delete;
  ParameterClient& operator=(const ParameterClient&) = delete;

  // A part's payload: see ChunkLayout.
  static constexpr size_t kPartBytes = ChunkLayout::kPartBytes;
  // The push schedule's credit, its bounds and how a push measures it for
  // the next one: see PushSchedule.
  static constexpr size_t kInFlightBytes = PushSchedule::kInFlightBytes;
  static constexpr size_t kMinCredit = PushSchedule::kMinCredit;
  static size_t CreditFor(size_t bytes, absl::Duration window, absl::Duration shortest) {
    return PushSchedule::CreditFor(bytes, window, shortest);
  }
  // The network credit of the next push, and the credit of the link to the
  // shards on this machine (for tests and the docs' figures).
  size_t credit() const { return credit_.load(); }
  size_t local_credit() const { return local_credit_; }
  // The deadline of one push attempt (a gRPC call, or a doorbell's ring).
  static constexpr absl::Duration kPushCallTimeout = absl::Seconds(30);

  // Names a PushAsync or PullAsync in flight.
  using Ticket = uint64_t;

  int64_t num_parameters() const override { return layout_.num_parameters(); }

  // The job generation every later push and pull carries (0 = unchecked).
  void set_generation(uint64_t generation) override { generation_.store(generation); }
  uint64_t generation() const { return generation_.load(); }

  // Follows a newer shard map (a shard restarted, maybe on a new address):
  // rebuilds the stub of every endpoint whose address or incarnation changed.
  // Refuses (INVALID_ARGUMENT, nothing changed) a map that does not fit
  // (FitShardMap), and one that places the chunks on other shards: that
  // one needs a new client. The caller decides which map is the newest
  // (the coordinator's, by ShardMap.epoch).
  absl::Status UpdateShardMap(const v1::ShardMap& map) override ABSL_LOCKS_EXCLUDED(mu_);
  // The epoch of the map in use.
  uint64_t map_epoch() const override ABSL_LOCKS_EXCLUDED(mu_);

  // Fills host_params (num_parameters() floats) with every chunk. `clock` is
  // the step the worker is about to compute: each shard holds the pull as
  // long as the job's consistency mode requires (sync: until the step this
  // worker last pushed has completed) or until `timeout` passes
  // (DEADLINE_EXCEEDED). Records each chunk's version for Push. One attempt
  // per shard: the caller decides whether to try again. After a pull, or a
  // fused push's pull, of the same clock, generation and `host_params` that
  // read only some parts, reads only the others (ParameterShards::Pull).
  absl::Status Pull(uint64_t clock, absl::Duration timeout, float* host_params) override;
  // Pull, started: `host_params` must stay alive until Wait returns, and is
  // written (by gRPC's threads) until then.
  Ticket PullAsync(uint64_t clock, absl::Duration timeout, float* host_params);

  // PushOutcome and RetryPolicy: see ParameterShards.

  // Sends the gradient of every chunk to its shard, tagged with `step` (the
  // worker's clock), the generation and the chunk version seen by the last
  // Pull. Retries UNAVAILABLE and RESOURCE_EXHAUSTED per `retry` (each retry goes to the shard's
  // endpoint in the newest map); a retried push is deduplicated by the shard.
  // SIGINT/SIGTERM ends the retry with CANCELLED. Other errors (ABORTED: the
  // job rolled back) are returned as they are.
  absl::StatusOr<PushOutcome> Push(uint64_t step, const float* host_grads,
                                   uint32_t num_samples,
                                   const RetryPolicy& retry);
  // As above with RetryPolicy{retry_for} and no stop predicate.
  absl::StatusOr<PushOutcome> Push(uint64_t step, const float* host_grads,
                                   uint32_t num_samples,
                                   absl::Duration retry_for);
  // Push, started: `host_grads` must stay alive and unchanged until Wait
  // returns (its f32 values are sent from where they are). With
  // `pull_into`, the push is fused with the pull of clock step + 1: each
  // shard replies with the pushed chunks' values once the mode allows that
  // pull (waiting at most `pull_timeout`), written into `pull_into` as Pull
  // would; PushOutcome::pulled says whether they all came.
  Ticket PushAsync(uint64_t step, const float* host_grads, uint32_t num_samples,
                   float* pull_into = nullptr,
                   absl::Duration pull_timeout = absl::ZeroDuration());

  // A push whose calls start as their gradients become final (overlap: a
  // PyTorch hook per parameter, python/grps/torch.py). StagePush starts
  // nothing; TensorReady(ticket, t) says tensor t's gradient in `host_grads`
  // is final and starts each part whose chunks' tensors all are; Wait starts
  // the parts left, then waits as for PushAsync. A part's gradients must
  // stay unchanged from its start until Wait returns, and its fused pull's
  // weights may arrive in `pull_into` before Wait is called. Top-k
  // (JobConfig.gradient_topk) chooses over a part at once: CanStage() is
  // false, and such a push is sent as PushAsync's, by Wait. One thread at a
  // time calls TensorReady, Wait and Discard for a staged ticket.
  bool CanStage() const;
  Ticket StagePush(uint64_t step, const float* host_grads, uint32_t num_samples,
                   float* pull_into, absl::Duration pull_timeout);
  // INVALID_ARGUMENT for a ticket that is not a staged push in flight or a
  // tensor index out of range; a tensor said twice is ready once.
  absl::Status TensorReady(Ticket ticket, uint32_t tensor_index) ABSL_LOCKS_EXCLUDED(ops_mu_);
  // Waits for the calls of `ticket` that started and forgets it: the parts
  // that did not start are never sent. (A step abandoned half-way: its
  // pushed parts stand, and a push of the same step later is deduplicated
  // for them by the shards.)
  void Discard(Ticket ticket) ABSL_LOCKS_EXCLUDED(ops_mu_);

  // The program's optimizer for the pushes started from now on (a torch
  // optimizer's param groups as its LR scheduler left them, python/grps):
  // `optimizers` (PushRequest.optimizers) and, by tensor, the 1-based one
  // whose update its chunks run (0: the job's). Both empty: the job's for
  // every chunk. INVALID_ARGUMENT, changing nothing, unless `by_tensor`
  // names each tensor once (or is empty) with indices in range. A push
  // already started keeps what it had.
  absl::Status SetOptimizers(std::vector<v1::OptimizerConfig> optimizers,
                             const std::vector<uint32_t>& by_tensor)
      ABSL_LOCKS_EXCLUDED(optimizers_mu_);

  // A program's optimizer state over the flat array: see
  // ProgramOptimizerState (worker/optimizer_state_calls.h).
  using OptimizerState = ProgramOptimizerState;
  // Every chunk's optimizer state as the shards hold it now; a tensor's
  // steps are its first chunk's. Calls of at most kStateCallBytes, one
  // shard at a time, each attempted once within `timeout`.
  absl::StatusOr<OptimizerState> ReadOptimizerState(absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    return optimizer_state_.Read(timeout);
  }
  // Loads `state` (its kind the job's, its slots and steps of the model's
  // sizes: INVALID_ARGUMENT otherwise, nothing sent) into every chunk, as
  // ShardStore::LoadOptimizerState: FAILED_PRECONDITION once a chunk had
  // an update. Each shard's calls are all-or-nothing; the shards are not
  // (a failure may leave earlier shards loaded).
  absl::Status LoadOptimizerState(const OptimizerState& state, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    return optimizer_state_.Load(state, timeout);
  }
  static constexpr size_t kStateCallBytes = OptimizerStateCalls::kCallBytes;

  // A user model's initial values (num_parameters() floats, exactly; the
  // job's "given" tensors, PushRequest.initial_values): each chunk that has
  // none yet takes them, the others keep theirs. Only rank 0's are taken
  // (PERMISSION_DENIED otherwise). Retried as a push is.
  absl::Status GiveInitialValues(const float* host_values, const RetryPolicy& retry);

  // Waits for every RPC of `ticket`. A pull's outcome is empty. A push's
  // RPCs that failed UNAVAILABLE are sent again from this thread per
  // `retry` (the pull's `retry` is ignored: one attempt per shard).
  // INVALID_ARGUMENT for a ticket that is not in flight.
  absl::StatusOr<PushOutcome> Wait(Ticket ticket, const RetryPolicy& retry);
  // As above with the default RetryPolicy.
  absl::StatusOr<PushOutcome> Wait(Ticket ticket);
  // Wait(PushAsync(...), retry): ParameterShards' push.
  absl::StatusOr<PushOutcome> PushAndPull(uint64_t step, const float* host_grads,
                                          uint32_t num_samples, float* pull_into,
                                          absl::Duration pull_timeout,
                                          const RetryPolicy& retry) override;

  // Smallest and largest chunk version seen by the last Pull.
  uint64_t min_pulled_version() const;
  uint64_t max_pulled_version() const override;

  uint64_t bytes_pushed() const { return bytes_pushed_.load(); }
  uint64_t bytes_pulled() const { return bytes_pulled_.load(); }
  // Of those, the bytes that went through shared-memory lanes (both ways).
  uint64_t lane_bytes() const { return lane_bytes_.load(); }
  // Push calls (one per part and attempt), and of those the ones rung at
  // doorbells instead of called through gRPC.
  uint64_t push_calls() const { return push_calls_.load(); }
  uint64_t doorbell_calls() const { return doorbell_calls_.load(); }
  // All of the above at once.
  Traffic traffic() const override;
  // Whether pushes to `shard` may still use a lane (the job asks for lanes,
  // one could be made, and the shard has not refused it).
  bool LaneUsable(size_t shard) const { return lanes_.Usable(shard); }

 private:
  using Part = ChunkLayout::Part;
  struct Call;
  struct Operation;

  absl::Status CheckCompatible(const v1::ShardMap& map) const;
  // A stub to the shard of `shard` for a typed call (a fresh channel).
  std::unique_ptr<v1::ParameterServer::Stub> TypedStub(size_t shard) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A push's fields other than its chunks, lane and pull.
  v1::PushRequest PushHeader(uint64_t step, uint32_t num_samples) const;
  // A push of `host_grads` for `step`, fused with a pull into `pull_into`
  // (null: none), with a call for each part, nothing encoded.
  std::unique_ptr<Operation> NewPush(uint64_t step, const float* host_grads,
                                     uint32_t num_samples, float* pull_into,
                                     absl::Duration pull_timeout) const;
  void ConnectShard(const v1::ShardEndpoint& endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<grpc::GenericStub> StubOf(const Part& part) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps `op` under a new ticket and starts its calls (a staged push's
  // when they are ready).
  Ticket Register(std::unique_ptr<Operation> op) ABSL_LOCKS_EXCLUDED(ops_mu_);
  // Encodes and starts part `index` of staged push `op`.
  void StartStaged(Operation* op, size_t index);
  // The operation of `ticket`, taken out of ops_; null when not in flight.
  std::unique_ptr<Operation> Take(Ticket ticket) ABSL_LOCKS_EXCLUDED(ops_mu_);
  // Starts `op`'s call `index`: through the push schedule when its bytes
  // travel in a gRPC request, at once otherwise.
  void Launch(Operation* op, size_t index);
  // Starts the schedule's next queued call of `op` if the one before has
  // been written and the credit allows.
  void Pump(Operation* op);
  // Scheduled call `index` of `op` has been written (or ended): the next
  // may start.
  void ScheduledCallWritten(Operation* op, size_t index);
  // Sends `op`'s call `index` (again); `scheduled`: one of the schedule's.
  void StartCall(Operation* op, size_t index, bool scheduled = false);
  // Runs on a gRPC thread when a call ends (on the waiting thread for a
  // rung call).
  void OnCallDone(Operation* op, size_t index, grpc::Status status);
  // Waits for every call of `op`: first the rung ones, on this thread.
  void AwaitCalls(Operation* op);
  // Wait's work on `op`, taken: its calls, their retries and its outcome.
  absl::StatusOr<PushOutcome> AwaitOutcome(Operation* op, const RetryPolicy& retry);
  // After `op`'s calls ended: which parts its pull (or fused pull) read,
  // and which a pull of the same clock into the same place has left to read.
  void NoteRead(const Operation& op) ABSL_LOCKS_EXCLUDED(read_mu_);
  std::vector<bool> PartsRead(uint64_t clock, uint64_t generation, const float* into) const
      ABSL_LOCKS_EXCLUDED(read_mu_);
  // Waits for the answer to rung call `index` and completes it.
  void FinishRung(Operation* op, size_t index);
  // Builds push call `index` of `op` (again: a retry), through the lane
  // when it can take the part, in bytes otherwise.
  void EncodePushCall(Operation* op, size_t index);
  // A push's chunks of `part` with their ids, the versions seen by the last
  // pull and their optimizers set; no values.
  std::vector<WireChunk> ChunkHeads(const Operation& op, const Part& part) const;

  // Fixed at construction: the layout never changes (UpdateShardMap only
  // accepts maps with the same chunks on the same shards; the layout's
  // endpoints are stale).
  const v1::JobConfig config_;
  const ChunkLayout layout_;
  const uint32_t rank_;
  const uint64_t incarnation_;
  // The parts in backward's order, each with its shard: a staged sync
  // push's schedule (set in the constructor).
  std::vector<PushSchedule::Placed> backward_order_;
  // Written by the callbacks of pulls (and fused pushes), each its own
  // chunks; two pulls in flight on this client write the same ones.
  std::vector<std::atomic<uint64_t>> chunk_version_;
  std::atomic<uint64_t> generation_{0};

  mutable absl::Mutex mu_;
  std::vector<v1::ShardEndpoint> endpoints_ ABSL_GUARDED_BY(mu_);
  // By shard.
  std::vector<std::shared_ptr<grpc::GenericStub>> stubs_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex ops_mu_;
  absl::flat_hash_map<Ticket, std::unique_ptr<Operation>> ops_ ABSL_GUARDED_BY(ops_mu_);
  Ticket next_ticket_ ABSL_GUARDED_BY(ops_mu_) = 1;

  TopKFeedback topk_;  // JobConfig.gradient_topk in (0, 1) only

  // SetOptimizers': the header's optimizers and, by chunk id, the index
  // each chunk names. Null: the job's for all. Shared with the pushes in
  // flight that started with it.
  struct ProgramOptimizers {
    std::vector<v1::OptimizerConfig> optimizers;
    std::vector<uint32_t> by_chunk;
  };
  mutable absl::Mutex optimizers_mu_;
  std::shared_ptr<const ProgramOptimizers> optimizers_ ABSL_GUARDED_BY(optimizers_mu_);

  // The parts read into `into` at `clock` in `generation` by the pulls (and
  // fused pulls) since the last one that read them all; empty `parts`: none.
  struct ReadSoFar {
    uint64_t clock = 0;
    uint64_t generation = 0;
    const float* into = nullptr;
    std::vector<bool> parts;  // by part
  };
  mutable absl::Mutex read_mu_;
  ReadSoFar read_ ABSL_GUARDED_BY(read_mu_);

  PushLanes lanes_;
  const OptimizerStateCalls optimizer_state_;  // its stubs: TypedStub

  // Added to by the calls' callbacks.
  std::atomic<uint64_t> bytes_pushed_{0};
  std::atomic<uint64_t> bytes_pulled_{0};
  std::atomic<uint64_t> lane_bytes_{0};
  std::atomic<uint64_t> push_calls_{0};
  // The push schedule's links (PushSchedule::Credits): by shard, whether it
  // is on this machine, and that link's credit (fixed: kInFlightBytes, or
  // two of each local shard's largest parts). The network's credit of the
  // next push, and the least it may be (two of each other shard's largest
  // parts: PushSchedule::LeastCredit).
  const std::vector<bool> local_shards_;
  const size_t local_credit_;
  const size_t least_credit_;
  std::atomic<size_t> credit_;
  std::atomic<uint64_t> doorbell_calls_{0};
};

// Sleeps `d` in short slices; returns false (early) once `stop` (may be
// null) or a signal says to give up. The clients' retry backoff.
bool SleepUnlessStopped(absl::Duration d, const std::function<bool()>& stop);

// Tells of a call that is being sent again: once it has been refused for
// kSayAfter, and as often after, a warning says what and why (a push a
// shard refuses every time is told, not waited out silently).
class RetryNotice {
 public:
  static constexpr absl::Duration kSayAfter = absl::Seconds(10);
  explicit RetryNotice(std::function<absl::Time()> now = [] { return absl::Now(); })
      : now_(std::move(now)) {}
  // `what` (e.g. "a push of step 3 to shard 1") was refused with `why` and
  // will be sent again.
  void Refused(absl::string_view what, const absl::Status& why);

 private:
  const std::function<absl::Time()> now_;
  std::optional<absl::Time> since_;
  absl::Time said_ = absl::InfinitePast();
};

}  // namespace grps

#endif  // GRPS_WORKER_PARAMETER_CLIENT_H_
