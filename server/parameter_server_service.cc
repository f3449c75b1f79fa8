#include "server/parameter_server_service.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "daemon/refusal_log.h"
#include "job/job_config.h"
#include "job/sparse_tables.h"
#include "server/chunk_optimizer.h"
#include "spdlog/spdlog.h"
#include "tensor/dtype.h"
#include "wire/buffer_pool.h"
#include "wire/chunk_codec.h"
#include "wire/lane_doorbell.h"

namespace grps {
namespace {

absl::Status NotReady() {
  return absl::UnavailableError(
      "shard not ready: still registering with the coordinator");
}

// Parses a small request message (protobuf copies its few bytes once).
template <typename Message>
bool ParseRequest(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);  // shares the slices
  return grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok();
}

// What a pull read, handed to the reply without a copy; `lane_offsets`
// (empty, or one per chunk) says where in the caller's lane each chunk's
// values already are.
std::vector<WireChunk> ToWireChunks(std::vector<ShardStore::PulledChunk>& pulled,
                                    const std::vector<uint64_t>& lane_offsets = {}) {
  std::vector<WireChunk> chunks(pulled.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    chunks[i].chunk_id = pulled[i].chunk_id;
    chunks[i].version = pulled[i].version;
    chunks[i].owned = std::move(pulled[i].data);
    chunks[i].recycle = &BufferPool::Default();
    if (!lane_offsets.empty()) chunks[i].lane_offset = lane_offsets[i];
  }
  return chunks;
}

// The header of the reply to a push the store took.
v1::PushResponse PushReplyHeader(const ShardStore::PushResult& result) {
  v1::PushResponse header;
  for (uint64_t v : result.versions) header.add_versions(v);
  header.set_duplicates(result.duplicates);
  header.set_late(result.late);
  header.set_too_stale(result.too_stale);
  return header;
}

// A call's deadline; InfiniteFuture for none.
absl::Time CallDeadline(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  return deadline == std::chrono::system_clock::time_point::max() ? absl::InfiniteFuture()
                                                                  : absl::FromChrono(deadline);
}

// The end of a pull's wait: now + timeout_ms (0: now, no wait), never past
// `call_deadline` or kMaxPullWait.
absl::Time PullDeadline(absl::Time call_deadline, uint32_t timeout_ms) {
  const absl::Time now = absl::Now();
  return std::min({now + ParameterServerService::kMaxPullWait,
                   now + absl::Milliseconds(timeout_ms), call_deadline});
}

// The pull half of a push the store took: the pushed chunks at the
// worker's next clock, in the reply after `header`; without values when
// they are not ready in time (the push stands; the worker pulls). The lane
// stays mapped until the values are written.
void ServePullHalf(ShardStore* store, const v1::PushRequest& request, CheckedPush checked,
                   absl::Time call_deadline, std::shared_ptr<const std::atomic<bool>> cancelled,
                   v1::PushResponse header, std::shared_ptr<MappedLane> lane,
                   std::function<void(grpc::Status, grpc::ByteBuffer)> done) {
  ShardStore::PullSpec spec;
  spec.worker_rank = request.worker_rank();
  for (const ShardStore::ChunkGradient& g : checked.push.chunks)
    spec.chunk_ids.push_back(g.chunk_id);
  spec.clock = request.step() + 1;
  spec.generation = request.generation();
  spec.dtype = checked.pull_dtype;
  spec.deadline = PullDeadline(call_deadline, std::max<uint32_t>(1, request.pull_timeout_ms()));
  spec.cancelled = std::move(cancelled);
  spec.into = std::move(checked.reply_into);
  store->PullAsync(
      std::move(spec),
      [done = std::move(done), header = std::move(header), wire = DTypeToWire(checked.pull_dtype),
       lane = std::move(lane), reply_offsets = std::move(checked.reply_offsets)](
          absl::StatusOr<std::vector<ShardStore::PulledChunk>> pulled) {
        if (lane != nullptr) lane->Wrote();  // the values in it, before the answer
        done(grpc::Status::OK,
             EncodePushResponse(header, wire,
                                pulled.ok() ? ToWireChunks(*pulled, reply_offsets)
                                            : std::vector<WireChunk>()));
      });
}

// A unary call that may wait in the store as a pull: when the client
// cancels (or its channel closes), the wait ends at once with CANCELLED
// instead of holding its waiter until the deadline.
class PullReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit PullReactor(ShardStore* store) : store_(store) {}

  // For PullSpec.cancelled.
  std::shared_ptr<const std::atomic<bool>> cancelled() const { return cancelled_; }

  void OnCancel() override {
    // Through a copy: its release orders this store before the flag is
    // freed, in a way ThreadSanitizer sees (gRPC's own ordering of OnCancel
    // before OnDone, on another thread, it cannot).
    const std::shared_ptr<std::atomic<bool>> flag = cancelled_;
    flag->store(true);
    if (store_ != nullptr) store_->WakePulls();
  }
  void OnDone() override { delete this; }

 private:
  ShardStore* const store_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ =
      std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

grpc::ServerUnaryReactor* ParameterServerService::Pull(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response) {
  // The call may wait: its reactor hears a cancellation.
  ShardStore* store = store_.load();
  auto* reactor = new PullReactor(store);
  if (store == nullptr) {
    reactor->Finish(ToGrpc(NotReady()));
    return reactor;
  }
  if (!request_bytes->Valid()) {  // as in Push
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the pull's message never arrived"));
    return reactor;
  }
  v1::PullRequest request;
  if (!ParseRequest(*request_bytes, &request)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "pull request is not a PullRequest"));
    return reactor;
  }
  absl::StatusOr<ShardStore::PullSpec> spec =
      DecodePull(*store, request, PullDeadline(CallDeadline(*context), request.timeout_ms()));
  if (!spec.ok()) {
    reactor->Finish(ToGrpc(spec.status()));
    return reactor;
  }
  const v1::DType wire = DTypeToWire(spec->dtype);
  spec->cancelled = reactor->cancelled();
  // The reactor and the response live until Finish; the store calls back
  // exactly once.
  store->PullAsync(
      std::move(*spec),
      [reactor, response,
       wire](absl::StatusOr<std::vector<ShardStore::PulledChunk>> pulled) {
        if (!pulled.ok()) {
          reactor->Finish(ToGrpc(pulled.status()));
          return;
        }
        *response = EncodePullResponse(wire, ToWireChunks(*pulled));
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Push(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response) {
  // A push with a pull may wait: its reactor hears a cancellation.
  ShardStore* store = store_.load();
  auto* reactor = new PullReactor(store);
  if (store == nullptr) {
    reactor->Finish(ToGrpc(NotReady()));
    return reactor;
  }
  if (!request_bytes->Valid()) {
    // gRPC calls the handler without a message when the transport could not
    // read it (the memory quota reset the stream): the client sees that
    // failure, not this answer; nothing was refused.
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the push's message never arrived"));
    return reactor;
  }
  PushSource source;
  source.context = context;
  ServePush(store, *request_bytes, source, reactor->cancelled(),
            [reactor, response](grpc::Status status, grpc::ByteBuffer reply) {
              if (status.ok()) *response = std::move(reply);
              reactor->Finish(status);
            });
  return reactor;
}

// A doorbell this shard serves: a worker's lane, the area in it, and who
// proved to own it when it opened.
struct ParameterServerService::Doorbell {
  Doorbell(uint32_t rank, uint64_t incarnation, std::shared_ptr<MappedLane> lane,
           const v1::SharedLane& ref, char* area)
      : rank(rank), incarnation(incarnation), lane(std::move(lane)), ref(ref),
        bell(area, ref.doorbell_slots(), ref.doorbell_slot_bytes()),
        busy(std::make_unique<std::atomic<bool>[]>(ref.doorbell_slots())),
        served(ref.doorbell_slots()) {
    for (uint32_t i = 0; i < ref.doorbell_slots(); ++i) {
      busy[i].store(false);
      // Requests rung before the doorbell opened were not meant for it.
      served[i] = bell.request_seq(i);
    }
  }

  const uint32_t rank;
  const uint64_t incarnation;
  const std::shared_ptr<MappedLane> lane;  // mapped while anything serves it
  const v1::SharedLane ref;
  LaneDoorbell bell;
  std::unique_ptr<std::atomic<bool>[]> busy;  // a slot's request is being served
  std::vector<uint32_t> served;               // the thread's: last sequence taken
  std::atomic<bool> stop{false};
  // Set at stop: a push of this doorbell waiting in the store ends.
  const std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  std::thread thread;
};

absl::StatusOr<std::shared_ptr<MappedLane>> ParameterServerService::PushLane(
    ShardStore& store, const v1::PushRequest& request, size_t chunks,
    const PushSource& source) {
  if (const Doorbell* doorbell = source.doorbell.get(); doorbell != nullptr) {
    // Only the worker that opened the doorbell rings it, on its own lane.
    if (request.worker_rank() != doorbell->rank ||
        request.incarnation() != doorbell->incarnation || !request.has_lane() ||
        !doorbell->lane->Names(request.lane())) {
      store.CountRejectedAtEdge(std::max<size_t>(1, chunks));
      return absl::PermissionDeniedError(
          absl::StrCat("a push rung at the doorbell of worker ", doorbell->rank,
                       " must come from that worker's incarnation on its lane"));
    }
    return doorbell->lane;
  }
  if (!request.has_lane()) return nullptr;
  absl::StatusOr<std::shared_ptr<MappedLane>> mapped = LaneOf(store, *source.context, request);
  if (!mapped.ok() && !absl::IsUnimplemented(mapped.status()))
    store.CountRejectedAtEdge(std::max<uint64_t>(1, chunks));
  return mapped;
}

void ParameterServerService::ServePush(ShardStore* store, const grpc::ByteBuffer& bytes,
                                       const PushSource& source,
                                       std::shared_ptr<const std::atomic<bool>> cancelled,
                                       PushDone done) {
  v1::PushRequest request;  // the scalar fields; chunks stay in the slices
  std::vector<ReceivedChunk> chunks;
  if (absl::Status s = DecodePushRequest(bytes, &request,
                                         [&chunks](ReceivedChunk& c) {
                                           chunks.push_back(std::move(c));
                                           return absl::OkStatus();
                                         });
      !s.ok()) {
    store->CountRejectedAtEdge(1);
    done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("push request is not a PushRequest: ", s.message())),
         {});
    return;
  }
  absl::StatusOr<std::shared_ptr<MappedLane>> lane =
      PushLane(*store, request, chunks.size(), source);
  if (!lane.ok()) {
    done(ToGrpc(lane.status()), {});
    return;
  }
  absl::StatusOr<CheckedPush> checked = CheckPush(*store, request, chunks, lane->get());
  if (!checked.ok()) {
    store->CountRejectedAtEdge(std::max<uint64_t>(1, chunks.size()));
    done(ToGrpc(checked.status()), {});
    return;
  }
  // Only the member that registered as this rank's incarnation may push as
  // it (checked before the store admits the incarnation; LaneOf has
  // checked it for a push with a lane, and the doorbell's opening for its
  // pushes).
  if (*lane == nullptr) {
    if (grpc::Status member = CheckMemberSecret(
            member_key_, store->config().job_id(), MemberKind::kWorker,
            request.worker_rank(), request.incarnation(), CallerMemberSecret(*source.context));
        !member.ok()) {
      store->CountRejectedAtEdge(chunks.size());
      done(member, {});
      return;
    }
  }
  if (request.initial_values()) {
    grpc::Status given = GiveInitialValues(store, request, checked->push, lane->get());
    done(given, given.ok() ? EncodePushResponse(v1::PushResponse(), v1::DTYPE_F32, {})
                           : grpc::ByteBuffer());
    return;
  }
  absl::StatusOr<ShardStore::PushResult> result = store->Push(checked->push);
  if (!result.ok()) {
    done(ToGrpc(result.status()), {});
    return;
  }
  // A call seen before may be a retry (the worker sends one on a fresh lane)
  // or a copy the network made: its place in the lane may belong to a newer
  // call by now, so its values come back in the message. Not so a push rung
  // at a doorbell, even a duplicate (a worker that rolled back pushes its
  // steps again): its slot takes each request once, and the place it names
  // is its caller's until the answer (a worker that gives up on an answer
  // retires the lane), so its values go there as any rung push's do. In the
  // message they would not fit the slot: the worker would retire its lane
  // and retry through gRPC for every duplicate.
  if (result->duplicates > 0 && source.doorbell == nullptr) {
    checked->reply_offsets.clear();
    checked->reply_into.clear();
  }
  v1::PushResponse header = PushReplyHeader(*result);
  if (source.doorbell == nullptr && *lane != nullptr && request.lane().doorbell_offset() != 0)
    header.set_doorbell(ServeDoorbell(store, request, *lane));
  if (!request.pull()) {
    done(grpc::Status::OK, EncodePushResponse(header, DTypeToWire(checked->pull_dtype), {}));
    return;
  }
  ServePullHalf(store, request, std::move(*checked),
                source.context != nullptr ? CallDeadline(*source.context) : absl::InfiniteFuture(),
                std::move(cancelled), std::move(header), std::move(*lane), std::move(done));
}

grpc::Status ParameterServerService::GiveInitialValues(ShardStore* store,
                                                      const v1::PushRequest& request,
                                                      const ShardStore::GradientPush& push,
                                                      const MappedLane* lane) {
  if (lane != nullptr || request.pull()) {
    store->CountRejectedAtEdge(std::max<size_t>(1, push.chunks.size()));
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "initial values travel in the message, with no lane and no pull");
  }
  absl::StatusOr<uint32_t> taken = store->GiveInitialValues(push);
  if (!taken.ok()) return ToGrpc(taken.status());
  if (*taken > 0)
    spdlog::info("shard {}: {} chunks took worker rank 0's initial values", store->shard(),
                 *taken);
  return grpc::Status::OK;
}

bool ParameterServerService::ServeDoorbell(ShardStore* store, const v1::PushRequest& request,
                                           std::shared_ptr<MappedLane> lane) {
  const v1::SharedLane& ref = request.lane();
  if (!LaneDoorbell::CheckGeometry(ref.doorbell_slots(), ref.doorbell_slot_bytes()).ok() ||
      ref.doorbell_offset() % 64 != 0)
    return false;
  absl::StatusOr<char*> area = lane->At(
      ref.doorbell_offset(),
      LaneDoorbell::AreaBytes(ref.doorbell_slots(), ref.doorbell_slot_bytes()));
  if (!area.ok()) return false;
  std::shared_ptr<Doorbell> old;
  {
    absl::MutexLock lock(&doorbells_mu_);
    if (doorbells_stopped_) return false;
    if (!beater_.joinable()) beater_ = std::thread(&ParameterServerService::BeatLoop, this);
    std::shared_ptr<Doorbell>& served = doorbells_[request.worker_rank()];
    if (served != nullptr && served->lane == lane &&
        served->incarnation == request.incarnation() &&
        served->ref.doorbell_offset() == ref.doorbell_offset() &&
        served->ref.doorbell_slots() == ref.doorbell_slots() &&
        served->ref.doorbell_slot_bytes() == ref.doorbell_slot_bytes())
      return !served->stop.load();
    old = std::move(served);
    served = std::make_shared<Doorbell>(request.worker_rank(), request.incarnation(), lane, ref,
                                        *area);
    served->thread = std::thread(&ParameterServerService::DoorbellLoop, this, store, served);
  }
  if (old != nullptr) {
    old->stop.store(true);
    old->bell.Wake();
    old->thread.join();
  }
  return true;
}

namespace {

// A refused rung push goes to the log that gRPC's refused calls go to.
void NoteRefusedRing(uint32_t rank, grpc::StatusCode code, absl::string_view message) {
  RefusalLog::Process().Note("/grps.v1.ParameterServer/Push (rung at a lane doorbell)", code,
                             absl::StrCat("worker ", rank, "'s lane"), message);
}

}  // namespace

void ParameterServerService::DoorbellLoop(ShardStore* store, std::shared_ptr<Doorbell> d) {
  pthread_setname_np(pthread_self(), "grps-doorbell");
  while (!d->stop.load()) {
    // A worker that replaced its lane (a failed call, a restart) rings the
    // new one's doorbell; this one is done (and beats no more).
    if (!lanes_.IsCurrent(d->rank, d->lane.get())) {
      d->stop.store(true);
      break;
    }
    // The rings are noted before the slots are looked at: one rung after
    // the note ends the wait below at once, so none is missed.
    const uint32_t seen = d->bell.rings();
    for (uint32_t slot = 0; slot < d->bell.slots(); ++slot) {
      const uint32_t seq = d->bell.request_seq(slot);
      // One request per slot at a time: one rung before its answer waits.
      if (seq == d->served[slot] || d->busy[slot].load()) continue;
      d->served[slot] = seq;
      d->busy[slot].store(true);
      doorbell_pushes_.fetch_add(1);
      PushDone answer = [d, slot, seq](grpc::Status status, grpc::ByteBuffer reply) {
        if (IsRefusal(status.error_code()))
          NoteRefusedRing(d->rank, status.error_code(), status.error_message());
        // Free before the answer: the worker may ring the slot again as soon
        // as it has read it.
        d->busy[slot].store(false);
        d->bell.Answer(slot, seq, ToAbsl(status), reply);
      };
      grpc::ByteBuffer request;
      if (absl::Status s = d->bell.TakeRequest(slot, &request); !s.ok()) {
        store->CountRejectedAtEdge(1);
        answer(ToGrpc(s), {});
        continue;
      }
      PushSource source;
      source.doorbell = d;
      ServePush(store, request, source, d->cancelled, std::move(answer));
    }
    d->bell.AwaitRing(seen, kDoorbellBeat);
  }
}

void ParameterServerService::BeatLoop() {
  pthread_setname_np(pthread_self(), "grps-beat");
  absl::MutexLock lock(&doorbells_mu_);
  while (!doorbells_stopped_) {
    for (auto& [rank, d] : doorbells_)
      if (!d->stop.load()) d->bell.Beat();
    beat_wake_.WaitWithTimeout(&doorbells_mu_, kDoorbellBeat);
  }
}

void ParameterServerService::StopDoorbells() {
  absl::flat_hash_map<uint32_t, std::shared_ptr<Doorbell>> served;
  std::thread beater;
  {
    absl::MutexLock lock(&doorbells_mu_);
    doorbells_stopped_ = true;
    served.swap(doorbells_);
    beater.swap(beater_);
    beat_wake_.Signal();
  }
  if (beater.joinable()) beater.join();
  for (auto& [rank, d] : served) {
    d->stop.store(true);
    d->cancelled->store(true);
    d->bell.Wake();
  }
  if (ShardStore* store = store_.load(); store != nullptr) store->WakePulls();
  for (auto& [rank, d] : served) d->thread.join();
}

size_t ParameterServerService::doorbells_served() const {
  absl::MutexLock lock(&doorbells_mu_);
  size_t n = 0;
  for (const auto& [rank, d] : doorbells_) n += d->stop.load() ? 0 : 1;
  return n;
}

absl::StatusOr<std::shared_ptr<MappedLane>> ParameterServerService::LaneOf(
    const ShardStore& store, const grpc::CallbackServerContext& context,
    const v1::PushRequest& request) {
  // Only a worker of this job, on this machine, makes the shard open a file.
  if (absl::Status s = CheckJob(store, request.job_id()); !s.ok()) return s;
  if (absl::Status s = CheckRank(store, request.worker_rank()); !s.ok()) return s;
  if (grpc::Status member = CheckMemberSecret(
          member_key_, store.config().job_id(), MemberKind::kWorker, request.worker_rank(),
          request.incarnation(), CallerMemberSecret(context));
      !member.ok())
    return ToAbsl(member);
  if (!IsLoopbackPeer(context.peer()))
    return absl::UnimplementedError(absl::StrCat(
        "a shared-memory lane is for a worker on this machine; this push comes from ",
        QuoteUntrusted(context.peer()), ": send the values in the message"));
  absl::StatusOr<std::shared_ptr<MappedLane>> lane =
      lanes_.Get(request.worker_rank(), request.lane());
  if (!lane.ok())
    return absl::UnimplementedError(absl::StrCat(
        "cannot use the push's shared-memory lane (", lane.status().message(),
        "): send the values in the message"));
  return lane;
}

grpc::Status ParameterServerService::GetOptimizerState(
    grpc::ServerContext* context, const v1::GetOptimizerStateRequest* request,
    v1::GetOptimizerStateResponse* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  if (absl::Status s = CheckJob(*store, request->job_id()); !s.ok()) return ToGrpc(s);
  if (absl::Status s = CheckRank(*store, request->worker_rank()); !s.ok()) return ToGrpc(s);
  absl::StatusOr<std::vector<const v1::ChunkSpec*>> specs =
      CheckStateChunks(*store, request->generation(), request->chunk_ids());
  if (!specs.ok()) return ToGrpc(specs.status());
  uint64_t bytes = 0;
  const uint32_t slots = OptimizerStateSlots(store->config().optimizer().kind());
  for (const v1::ChunkSpec* spec : *specs) bytes += spec->num_elements() * sizeof(float) * slots;
  if (bytes + 64 * specs->size() > static_cast<uint64_t>(kMaxMessageBytes))
    return ToGrpc(absl::InvalidArgumentError(absl::StrCat(
        "the optimizer state of ", specs->size(), " chunks is ", bytes, " bytes, above the ",
        kMaxMessageBytes, "-byte message limit; ask for fewer chunks per call")));
  absl::StatusOr<v1::GetOptimizerStateResponse> state =
      store->ReadOptimizerState(request->generation(), request->chunk_ids());
  if (!state.ok()) return ToGrpc(state.status());
  *response = std::move(*state);
  return grpc::Status::OK;
}

grpc::Status ParameterServerService::LoadOptimizerState(
    grpc::ServerContext* context, const v1::LoadOptimizerStateRequest* request,
    v1::LoadOptimizerStateResponse* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  if (absl::Status s = CheckLoadOptimizerState(*store, *request); !s.ok()) return ToGrpc(s);
  // As a push: only the rank's registered incarnation may change the state.
  if (grpc::Status member = CheckMemberSecret(
          member_key_, store->config().job_id(), MemberKind::kWorker, request->worker_rank(),
          request->incarnation(), CallerMemberSecret(*context));
      !member.ok())
    return member;
  if (absl::Status s = store->LoadOptimizerState(*request); !s.ok()) return ToGrpc(s);
  spdlog::info("rank {} loaded the optimizer's state of {} chunks (a program's saved {})",
               request->worker_rank(), request->chunks_size(),
               OptimizerName(request->kind()));
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ParameterServerService::PushSparse(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request,
                                                             grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!request->Valid()) {  // as in Push
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the push's message never arrived"));
    return reactor;
  }
  v1::SparsePushResponse reply;
  grpc::Status status = ServePushSparse(context, *request, &reply);
  if (status.ok()) {
    bool own_buffer;
    status =
        grpc::SerializationTraits<v1::SparsePushResponse>::Serialize(reply, response, &own_buffer);
  }
  reactor->Finish(status);
  return reactor;
}

grpc::Status ParameterServerService::ServePushSparse(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer& bytes,
                                                     v1::SparsePushResponse* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  // Kept from call to call on this thread: its ids' room is used again.
  thread_local v1::SparsePushRequest request;
  request.Clear();
  SliceReader gradients;
  absl::StatusOr<ShardStore::SparseGradientPush> push = absl::InvalidArgumentError("");
  if (absl::Status s = DecodeSparsePushRequest(bytes, &request, &gradients); !s.ok())
    push = absl::InvalidArgumentError(
        absl::StrCat("sparse push is not a SparsePushRequest: ", s.message()));
  else
    push = DecodeSparsePush(*store, request, std::move(gradients), &ScratchBuffer());
  if (!push.ok()) {
    store->CountRejectedAtEdge(1);
    return ToGrpc(push.status());
  }
  // As Push: only the rank's registered incarnation may push as it.
  if (grpc::Status member = CheckMemberSecret(member_key_, store->config().job_id(),
                                              MemberKind::kWorker, request.worker_rank(),
                                              request.incarnation(), CallerMemberSecret(*context));
      !member.ok()) {
    store->CountRejectedAtEdge(1);
    return member;
  }
  absl::StatusOr<ShardStore::SparsePushResult> result = store->PushSparse(*push);
  if (!result.ok()) return ToGrpc(result.status());
  response->set_version(result->version);
  response->set_duplicate(result->duplicate);
  response->set_late(result->late);
  response->set_too_stale(result->too_stale);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* ParameterServerService::PullSparse(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request_bytes,
                                                             grpc::ByteBuffer* response) {
  // The call may wait: its reactor hears a cancellation.
  ShardStore* store = store_.load();
  auto* reactor = new PullReactor(store);
  if (store == nullptr) {
    reactor->Finish(ToGrpc(NotReady()));
    return reactor;
  }
  if (!request_bytes->Valid()) {  // as in Push
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the pull's message never arrived"));
    return reactor;
  }
  v1::SparsePullRequest request;
  if (!ParseRequest(*request_bytes, &request)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "sparse pull request is not a SparsePullRequest"));
    return reactor;
  }
  absl::StatusOr<ShardStore::SparsePullSpec> spec =
      DecodeSparsePull(*store, request, PullDeadline(CallDeadline(*context), request.timeout_ms()));
  if (!spec.ok()) {
    reactor->Finish(ToGrpc(spec.status()));
    return reactor;
  }
  const v1::DType wire = DTypeToWire(spec->dtype);
  spec->cancelled = reactor->cancelled();
  store->PullSparseAsync(std::move(*spec),
                         [reactor, response, wire](absl::StatusOr<ShardStore::PulledRows> rows) {
                           if (!rows.ok()) {
                             reactor->Finish(ToGrpc(rows.status()));
                             return;
                           }
                           // The rows as they were read: sent from there.
                           *response = EncodeSparsePullResponse(
                               wire, rows->version, std::move(rows->data), &BufferPool::Default());
                           reactor->Finish(grpc::Status::OK);
                         });
  return reactor;
}

grpc::Status ParameterServerService::GetShardStatus(
    grpc::ServerContext* context, const v1::GetShardStatusRequest* request,
    v1::ShardStatus* response) {
  ShardStore* store = store_.load();
  if (store == nullptr) return ToGrpc(NotReady());
  if (absl::Status s = CheckJob(*store, request->job_id()); !s.ok())
    return ToGrpc(s);
  *response = ShardStatus(*store);
  return grpc::Status::OK;
}

v1::ShardStatus ParameterServerService::ShardStatus(const ShardStore& store) const {
  v1::ShardStatus status = store.ShardStatus();
  status.set_doorbells(static_cast<uint32_t>(doorbells_served()));
  status.set_doorbell_pushes(doorbell_pushes_.load());
  return status;
}

}  // namespace grps
