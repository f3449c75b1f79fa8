// ParameterServerService: the gRPC edge of one shard. Every request is
// validated here, once, and turned into typed values before the ShardStore
// sees it; a bad request gets a clear status and changes no state (except
// the shard's count of rejected pushes).
//
// Status codes:
//   FAILED_PRECONDITION  wrong job_id; a push the store refuses (stale
//                        incarnation, a version the chunk or table never
//                        had). Late and too-stale gradients are not errors:
//                        the push is OK and its reply counts them.
//   INVALID_ARGUMENT     unknown worker rank, bad dtype, wrong byte length,
//                        NaN/Inf gradient, a chunk twice in one request,
//                        a push without chunks; a sparse row id outside its
//                        table's range, or twice in one sparse push
//   NOT_FOUND            unknown chunk or table, or a chunk or row owned by
//                        another shard
//   DEADLINE_EXCEEDED    a pull's version did not arrive in time
//   RESOURCE_EXHAUSTED   a pull reply would exceed the message limit; a
//                        sparse table would pass its max_rows_per_shard
//   UNAVAILABLE          no store attached yet, or shutting down
//   UNIMPLEMENTED        a push names a shared-memory lane this shard cannot
//                        use (a caller not on loopback, or a lane it cannot
//                        map): nothing changed; send the values in bytes
//
// Push, Pull and PullSparse use gRPC's callback API: a pull that has to wait is a waiter
// in the store, not a gRPC thread parked on a condition variable, so any
// number of waiting pulls costs no threads. Replies are built by
// wire/chunk_codec.h over the values the store read (no copy into a protobuf
// field; the bytes are PullResponse's and PushResponse's all the same).
//
// A push may carry its values, and receive its fused pull's, through the
// worker's shared-memory lane (wire/shared_lane.h) instead of the message:
// the lane is mapped once per worker and checked like any other input. A
// lane push may also ask the shard to serve a doorbell in the lane
// (wire/lane_doorbell.h): a thread per worker then takes that worker's
// later pushes from the lane instead of from gRPC, each served by the same
// code as a call (the member secret was checked when the doorbell opened,
// for that rank, incarnation and lane).
//
// Thread safety: gRPC calls the handlers from many threads at once; the
// service's mutable state is the attached store pointer, the table of
// mapped lanes (which locks itself) and the doorbells served (under
// doorbells_mu_).
#ifndef GRPS_SERVER_PARAMETER_SERVER_SERVICE_H_
#define GRPS_SERVER_PARAMETER_SERVER_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/grps.grpc.pb.h"
#include "server/request_checks.h"
#include "server/shard_store.h"
#include "wire/shared_lane.h"

namespace grps {

class ParameterServerService final
    : public v1::ParameterServer::WithRawCallbackMethod_Push<
          v1::ParameterServer::WithRawCallbackMethod_Pull<
              v1::ParameterServer::WithRawCallbackMethod_PushSparse<
                  v1::ParameterServer::WithRawCallbackMethod_PullSparse<
                      v1::ParameterServer::Service>>>> {
 public:
  // A pull with timeout_ms = 0 waits until the call's own deadline, and never
  // longer than this, so that an abandoned pull does not stay a waiter.
  static constexpr absl::Duration kMaxPullWait = absl::Minutes(5);
  // Gradient elements beyond this magnitude are refused (request_checks.h).
  static constexpr float kMaxGradientMagnitude = ::grps::kMaxGradientMagnitude;

  // The daemon listens (to learn its port) before the coordinator tells it
  // which shard it is, so the store arrives later through Attach(). Until
  // then every RPC answers UNAVAILABLE.
  // `member_key`: MemberKey(admin token), under which a push must carry its
  // rank's member secret (daemon/security.h); empty: no secret is asked for.
  explicit ParameterServerService(std::string member_key = "")
      : member_key_(std::move(member_key)) {}
  // Convenience for tests and for callers that already have the store.
  explicit ParameterServerService(ShardStore* store, std::string member_key = "")
      : member_key_(std::move(member_key)), store_(store) {}
  ~ParameterServerService() override { StopDoorbells(); }

  // Serves `store` from now on. `store` is not owned and must outlive every
  // RPC (shut the gRPC server down before destroying it). Call at most once.
  void Attach(ShardStore* store) { store_.store(store); }

  // Stops serving doorbells: their pushes waiting in the store end, and
  // their threads are joined. Call before the store goes away (with the
  // gRPC server's shutdown); the destructor calls it too.
  void StopDoorbells() ABSL_LOCKS_EXCLUDED(doorbells_mu_);
  // Doorbells served now (one per worker at most).
  size_t doorbells_served() const ABSL_LOCKS_EXCLUDED(doorbells_mu_);
  // The store's status with what this service adds (ShardStatus.doorbells,
  // doorbell_pushes).
  v1::ShardStatus ShardStatus(const ShardStore& store) const;

  // A PushRequest in, a PushResponse out, as raw bytes. A push with
  // PushRequest.pull waits (as a waiter, holding no thread) for the pushed
  // chunks at the next clock and replies with them.
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // A PullRequest in, a PullResponse out, as raw bytes.
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  // Rows of a sparse table: a push, and a pull (created on first use; may
  // wait as Pull does), as raw bytes: a push's gradients are read straight
  // from gRPC's slices, a pull's rows are sent from where they were read
  // (wire/chunk_codec.h).
  grpc::ServerUnaryReactor* PushSparse(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PullSparse(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::Status GetShardStatus(grpc::ServerContext* context,
                              const v1::GetShardStatusRequest* request,
                              v1::ShardStatus* response) override;
  // A program's optimizer state (ShardStore::ReadOptimizerState and
  // LoadOptimizerState), its request checked here: RESOURCE_EXHAUSTED for a
  // reply past the message limit; INVALID_ARGUMENT for another kind than
  // the job's, a wrong number or length of slots, a value that is not finite
  // or a negative sum of squares.
  grpc::Status GetOptimizerState(grpc::ServerContext* context,
                                 const v1::GetOptimizerStateRequest* request,
                                 v1::GetOptimizerStateResponse* response) override;
  grpc::Status LoadOptimizerState(grpc::ServerContext* context,
                                  const v1::LoadOptimizerStateRequest* request,
                                  v1::LoadOptimizerStateResponse* response) override;

 private:
  struct Doorbell;
  // PushSparse's status, before its reply is sent.
  grpc::Status ServePushSparse(grpc::CallbackServerContext* context,
                               const grpc::ByteBuffer& request, v1::SparsePushResponse* response);
  // Who a push comes from: a gRPC call, or a doorbell this shard serves.
  struct PushSource {
    const grpc::CallbackServerContext* context = nullptr;
    std::shared_ptr<Doorbell> doorbell;
  };
  using PushDone = std::function<void(grpc::Status, grpc::ByteBuffer)>;

  // The one path of a push, from its bytes to its reply: `done` is called
  // exactly once, maybe on another thread (a sync step's last pusher), maybe
  // before ServePush returns. `cancelled`: set when the caller gave up.
  void ServePush(ShardStore* store, const grpc::ByteBuffer& bytes, const PushSource& source,
                 std::shared_ptr<const std::atomic<bool>> cancelled, PushDone done);
  // The lane a push comes on: its doorbell's, the one it names (mapped), or
  // none (null); the status to refuse the push with otherwise (counted as
  // rejected, but for UNIMPLEMENTED: lanes off).
  absl::StatusOr<std::shared_ptr<MappedLane>> PushLane(ShardStore& store,
                                                        const v1::PushRequest& request,
                                                        size_t chunks, const PushSource& source);
  // Serves the doorbell the accepted lane push `request` asks for, unless
  // it is served already; whether it is served.
  // A push of initial values (PushRequest.initial_values), checked as a
  // push; its reply is empty.
  grpc::Status GiveInitialValues(ShardStore* store, const v1::PushRequest& request,
                                 const ShardStore::GradientPush& push, const MappedLane* lane);
  bool ServeDoorbell(ShardStore* store, const v1::PushRequest& request,
                     std::shared_ptr<MappedLane> lane) ABSL_LOCKS_EXCLUDED(doorbells_mu_);
  // A doorbell's thread: takes each rung request and serves it.
  void DoorbellLoop(ShardStore* store, std::shared_ptr<Doorbell> doorbell);
  // One thread beats every doorbell served, every kDoorbellBeat: the beat
  // says the shard lives and serves it, however long a push takes.
  void BeatLoop() ABSL_LOCKS_EXCLUDED(doorbells_mu_);

  // The lane `request` names, mapped, once its caller has proven to be a
  // worker of this job on this machine; the status to refuse the push with
  // otherwise.
  absl::StatusOr<std::shared_ptr<MappedLane>> LaneOf(const ShardStore& store,
                                                      const grpc::CallbackServerContext& context,
                                                      const v1::PushRequest& request);

  const std::string member_key_;
  std::atomic<ShardStore*> store_{nullptr};
  LaneTable lanes_;
  mutable absl::Mutex doorbells_mu_;
  absl::flat_hash_map<uint32_t, std::shared_ptr<Doorbell>> doorbells_
      ABSL_GUARDED_BY(doorbells_mu_);  // by worker rank
  bool doorbells_stopped_ ABSL_GUARDED_BY(doorbells_mu_) = false;  // for good
  absl::CondVar beat_wake_;
  std::thread beater_ ABSL_GUARDED_BY(doorbells_mu_);
  std::atomic<uint64_t> doorbell_pushes_{0};  // requests taken from doorbells
};

}  // namespace grps

#endif  // GRPS_SERVER_PARAMETER_SERVER_SERVICE_H_
