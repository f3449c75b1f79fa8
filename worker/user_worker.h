// UserWorker: a worker whose model is the user's own (MODEL_USER,
// docs/pytorch.md): the grps Python package's C++ core. The user's program
// computes each step's gradient (PyTorch's autograd); UserWorker offers the
// model's tensors to the job, registers, gives rank 0's initial values,
// pushes each step's gradient and pulls the weights the mode serves next,
// into the caller's flat arrays. Membership, roll-backs and every bounded
// wait are WorkerSession's, as for grps-worker.
//
//   UserWorker::Options options;  options.coordinator = "127.0.0.1:7070";
//   auto w = UserWorker::Join(options, tensors);     // DefineModel + RegisterWorker
//   w->Begin(params, rank0 ? params : nullptr);      // initial values, first pull
//   w->SetTotalSteps(n);                             // unless the job sets --steps
//   while (w->step() < w->total_steps()) { ...grads...; w->Step(grads, batch, params); }
//   w->Done(evaluation);  w->AwaitEnd();
//
// The flat arrays hold the model's tensors back to back in the order they
// were offered, as f32 (the shards keep f32 whatever the tensor's dtype).
//
// Thread safety: one thread calls Begin, SetTotalSteps, Step, Done and
// AwaitEnd; the accessors may be called from any thread.
#ifndef GRPS_WORKER_USER_WORKER_H_
#define GRPS_WORKER_USER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "job/job_config.h"
#include "job/user_model.h"
#include "member/member_agent.h"
#include "proto/grps.grpc.pb.h"
#include "worker/example_leases.h"
#include "worker/parameter_client.h"
#include "worker/worker_session.h"

namespace grps {

class UserWorker {
 public:
  struct Options {
    std::string coordinator = "127.0.0.1:7070";  // host:port
    std::string job_id;                          // "" = whichever job it runs
    int32_t rank = -1;                           // -1: any free rank
    std::string host;                            // for status; "" = gethostname
    std::string backend = "python";              // for status
    // How long to keep offering the model and registering while the
    // coordinator is unreachable or the job is still forming.
    absl::Duration register_timeout = kRegisterTimeout;
    // The holder's own reason to stop waiting (see WorkerSession::Options).
    std::function<bool()> interrupted;
    // The program's optimizer kind, offered with the model
    // (DefineModelRequest.optimizer); UNSPECIFIED: the job's.
    v1::OptimizerKind optimizer = v1::OPTIMIZER_UNSPECIFIED;
  };

  // What a step did besides its push.
  struct StepOutcome {
    // The job rolled back: the weights in `params` are the restore order's
    // and step() went back to this rank's resume step.
    bool rolled_back = false;
    uint32_t late = 0;       // sync: chunk gradients past their step
    uint32_t too_stale = 0;  // async / ssp: refused by max_staleness
  };

  struct Evaluation {
    float accuracy = 0;
    float loss = 0;
    float auc = -1;  // a two-class model's test AUC; -1: none
  };

  // Offers `model` (DefineModel; the first offer defines the job's model),
  // then registers. FAILED_PRECONDITION when the job's model differs (naming
  // the first tensor that does) or the job trains a built-in model;
  // INVALID_ARGUMENT for a model ValidateUserModel refuses; UNAVAILABLE when
  // the coordinator did not answer within register_timeout. The process's
  // security (InitProcessSecurity) must be set.
  static absl::StatusOr<std::unique_ptr<UserWorker>> Join(const Options& options,
                                                          const TensorSpecs& model);
  ~UserWorker();

  uint32_t rank() const { return session_->rank(); }
  uint32_t num_workers() const { return session_->config().num_workers(); }
  const v1::JobConfig& config() const { return session_->config(); }
  // The steps this rank completed so far (its clock: the next push's step).
  uint64_t step() const { return step_; }
  // The job's steps per worker: the job's own (JobConfig.steps, grps-local
  // --steps) when set, else what the program declared (SetTotalSteps); 0
  // while neither says. A rank never pushes past it: a restarted rank whose
  // program runs its whole loop again stops at the job's last step.
  // An elastic job's workers train until its example ledger has no block
  // left: 0.
  uint64_t total_steps() const {
    if (IsElastic(config())) return 0;
    return config().steps() > 0 ? config().steps() : declared_total_;
  }
  // The program's own count of steps (its loop's length), for a job that
  // sets none: reported in the heartbeats (the coordinator's total_steps,
  // grps-local's progress) and the bound of Step. Returns total_steps(),
  // which is the job's when the job sets one. INVALID_ARGUMENT for 0.
  absl::StatusOr<uint64_t> SetTotalSteps(uint64_t steps);
  // Floats of the flat parameter (and gradient) array.
  int64_t num_parameters() const { return session_->dense().num_parameters(); }
  // Whether this process's offer defined the job's model.
  bool defined_model() const { return defined_model_; }
  WorkerSession& session() { return *session_; }

  // Gives rank 0's initial values (`initial`, num_parameters() floats; null:
  // none, as every other rank) to the chunks that have none yet (and keeps
  // a copy to give again after a roll-back), then pulls
  // the weights of this rank's first step into `params`. A rank that
  // restarted in a sync job joins the others' step.
  absl::Status Begin(float* params, const float* initial);
  // Pushes step()'s gradient (`grads`, from `samples` examples) and leaves
  // the weights of the next step in `params`. INVALID_ARGUMENT (nothing
  // pushed) when a gradient is not a finite number: its flat index is in the
  // message as "element N". FAILED_PRECONDITION once the job has ended, and
  // (nothing pushed) once step() has reached total_steps(): both
  // IsJobEnded.
  absl::StatusOr<StepOutcome> Step(const float* grads, uint32_t samples, float* params);
  // Adds to the progress the heartbeats report.
  void ReportLoss(float loss);

  // ---- Overlap: each tensor pushed as soon as its gradient is final ----

  // Whether TensorReady can start pushes early (not with top-k, whose
  // selection is made over a whole part: its pushes then go at Step).
  bool CanOverlap() const;
  // Tensor `t`'s gradient (in `grads`, the flat array this step's Step will
  // be given) is final for step(): each part whose tensors are all final
  // starts at once, fused with the pull of the next weights into `params`
  // (which they may write before Step is called). A part's gradients must not
  // change from then until Step returns. INVALID_ARGUMENT, nothing of the
  // tensor pushed, for a gradient that is not finite ("element N" of the
  // flat array) or a tensor the model lacks. A restarted rank that is still
  // joining the others in sync (see Step), or one at total_steps(), pushes
  // nothing here (Step pushes, or refuses, the step); nor does a step whose
  // rows a roll-back replaced (PullRows: the step is not pushed).
  absl::Status TensorReady(uint32_t t, const float* grads, float* params);
  // Gives up step()'s early pushes: the parts that started stand (a push of
  // the same step later is deduplicated for them by the shards); the others
  // are not sent. The step stays where it is.
  void AbandonStep();
  // The program's optimizer for the steps from the next one started on
  // (ParameterClient::SetOptimizers): what the servers run for each
  // tensor's update, in place of the job's optimizer and schedule.
  absl::Status SetOptimizers(std::vector<v1::OptimizerConfig> optimizers,
                             std::vector<uint32_t> by_tensor);
  // The job's optimizer state as the shards hold it now
  // (ParameterClient::ReadOptimizerState), for the program's
  // optimizer.state_dict(): in sync, the state after this rank's last step.
  absl::StatusOr<ParameterClient::OptimizerState> ReadOptimizerState();
  // A program's saved optimizer state into the shards, before the job's
  // first update (ParameterClient::LoadOptimizerState); kept, and loaded
  // again after a roll-back to step 0 (as rank 0's initial values are).
  absl::Status LoadOptimizerState(ParameterClient::OptimizerState state);
  // Each optimizer-state call's deadline.
  static constexpr absl::Duration kStateCallTimeout = absl::Seconds(60);

  // ---- Sparse tables (--sparse_tables) ----

  // Floats per row of `table`; INVALID_ARGUMENT when the job has no such table.
  absl::StatusOr<uint32_t> TableDim(const std::string& table) const;
  // The rows of `ids` (any order, repeats allowed) into `out` (ids.size() x
  // dim floats), as of step(), waiting as a pull of the weights waits. A
  // roll-back (a re-sharding's, a restore's) that ends the wait is taken
  // here, not returned: step() goes back to the restore's step, its dense
  // weights are in the `params` of the last Begin or Step, and the rows are
  // pulled as of it. The step at hand then computes on weights of two
  // steps: none of its pushes is sent (PushRows returns OK, the next Step
  // says rolled_back), and the program trains the restore's step next.
  absl::Status PullRows(const std::string& table, absl::Span<const int64_t> ids, float* out);
  // The gradients of distinct `ids` for step() (`grads`: ids.size() x dim).
  // INVALID_ARGUMENT, nothing pushed, for a gradient that is not finite;
  // nothing pushed past total_steps(), as Step. A roll-back that ends the
  // push is taken as PullRows takes it: the step's gradients were computed
  // on weights the job no longer has, so neither the other tables' nor the
  // next Step's push is sent, and that Step says rolled_back.
  absl::Status PushRows(const std::string& table, absl::Span<const int64_t> ids,
                        const float* grads);

  // SIGTERM (InstallLeaveOnSigterm) or a drain asked this worker to leave
  // the job; Leave does so after the step Step finished last (the rank is
  // out of the live set at once; a worker started for it later resumes at
  // that step).
  bool LeaveRequested() const { return session_->LeaveRequested(); }
  absl::Status Leave();

  // Reports this rank done (WorkerDone), with `evaluation` of its weights
  // when given. `declined`, without an evaluation: the coordinator asked
  // this rank for the final evaluation and its program has none to give;
  // the job completes without one.
  absl::Status Done(const std::optional<Evaluation>& evaluation, bool declined = false);
  // After Done: waits until the job ends (false) or the coordinator asks this
  // rank to evaluate the final weights (true: pull them with PullFinal, then
  // Done again with the evaluation).
  absl::StatusOr<bool> AwaitEnd();
  // The final weights into `params`.
  absl::Status PullFinal(float* params);

  // ---- Elastic jobs (--max_workers): the data is leased ----

  // An example block of the job's ledger (ExampleLeases).
  struct Block {
    std::vector<int64_t> examples;  // indices into the program's training set
    uint64_t epoch = 0;
  };
  // The block `step` trains (the same again when asked twice for a step),
  // leased from the coordinator's example ledger of a training set of
  // `train_examples` (the same on every worker and every call). Each is
  // StepExamples(config()) examples; Step marks a step's block trained, and
  // Done and Leave report what was. OUT_OF_RANGE once the ledger has no
  // block left; FAILED_PRECONDITION when the job is not elastic;
  // INVALID_ARGUMENT for a set smaller than one step's examples or of
  // another size than before.
  absl::StatusOr<Block> LeaseBlock(uint64_t train_examples, uint64_t step);

  // A collective among the job's live workers (WorkerSession::Collective):
  // every contributor's (rank, payload), in rank order.
  absl::StatusOr<std::vector<std::pair<uint32_t, std::string>>> Collective(
      const std::string& name, std::string payload, absl::Duration timeout);

 private:
  UserWorker(std::unique_ptr<v1::Coordinator::Stub> stub,
             const v1::RegisterWorkerResponse& registration, const Options& options,
             bool defined_model);
  // Rank 0: initial_ to the chunks that await their values; and, at step 0,
  // the optimizer state LoadOptimizerState loaded.
  absl::Status GiveInitialValues();
  // A re-sharding's roll-back placed the chunks on other shards (`map`):
  // the session's clients are replaced by ones of that map (between steps,
  // no call in flight).
  void FollowReplacedMap(const v1::ShardMap& map);
  // The dense shards' client (UserWorker always makes a ParameterClient).
  ParameterClient& client();
  // INVALID_ARGUMENT naming the first element of grads[begin, end) that is
  // not finite.
  absl::Status CheckFinite(const float* grads, int64_t begin, int64_t end) const;
  // An interrupt that ended a wait, as the status Step returns.
  absl::Status InterruptStatus(const absl::Status& cause);
  // `s` from a push or pull that a roll-back ended: the roll-backs that came
  // are taken (another may come while one's weights are pulled): the step
  // and `params` of the restore order, from the shards of its map. The
  // status of the last pull (`s` itself when no roll-back was taken);
  // *taken says whether one was.
  absl::Status TakeRollBacks(absl::Status s, float* params, bool* taken);
  // Whether step() has reached total_steps(): the job's steps are done.
  bool PastTheEnd() const;
  // The JobEnded error of a push past the end (`what`: what was not pushed).
  absl::Status PastTheEndError(absl::string_view what) const;

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<WorkerSession> session_;
  const bool defined_model_;
  uint64_t step_ = 0;
  // SetTotalSteps's; 0: none declared.
  uint64_t declared_total_ = 0;
  // A rank that restarted in a sync job: it joins the others' step again
  // after each push that came late, until one is in time (as grps-worker's
  // Trainer does).
  bool joining_ = false;
  absl::Time window_start_;
  uint64_t window_samples_ = 0;
  uint64_t samples_ = 0;
  // Rank 0: the initial values it gave, given again after a roll-back (a
  // restarted shard that restores no checkpoint needs them again).
  std::vector<float> initial_;
  // LoadOptimizerState's, loaded again after a roll-back to step 0.
  std::optional<ParameterClient::OptimizerState> loaded_state_;
  // The flat offset of each tensor, and the end of the last.
  std::vector<int64_t> tensor_offset_;
  // step()'s push while its tensors become final (TensorReady), and the
  // samples of the last step (the staged push's; the shards only check it).
  std::optional<ParameterClient::Ticket> staged_;
  uint32_t last_samples_ = 1;
  // The flat weights of the last Begin or Step, where a roll-back that
  // PullRows or PushRows takes pulls the restore's.
  float* params_ = nullptr;
  // PullRows or PushRows took a roll-back: the step's pushes are not sent,
  // and the next Step says rolled_back.
  bool rolled_back_in_rows_ = false;
  // An elastic job's leases, from the first LeaseBlock on (the training
  // set's size comes with it), and the heartbeat thread's way to them (a
  // coordinator that took the job over asks what this worker holds).
  std::unique_ptr<ExampleLeases> leases_;
  std::atomic<ExampleLeases*> claims_to_{nullptr};
  uint64_t lease_examples_ = 0;
  // SetOptimizers's, set again on the client that replaces one.
  std::vector<v1::OptimizerConfig> optimizers_;
  std::vector<uint32_t> optimizer_by_tensor_;
};

}  // namespace grps

#endif  // GRPS_WORKER_USER_WORKER_H_
