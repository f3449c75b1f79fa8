// Collectives: the job's small collectives among its live workers
// (Coordinator.Collective; grps.torch's allreduce, allgather and
// broadcast): who contributed which payload under which name, and when a
// round is complete.
//
//   Collectives c;
//   absl::StatusOr<Collectives::Answer> a = c.Contribute("loss", rank, bytes, live, now);
//   while (a.ok() && !a->complete) a = c.Result(a->round, rank, live, now);
//   // a->ranks, a->payloads: every contributor's payload, in rank order
//
// A contribution goes to the oldest open round of its name that its rank
// has not contributed to (so calls pair up by name and order), else opens
// a new one. A round is complete once every rank in the live set the caller
// passes has contributed: a rank that died before contributing is not
// waited for, a payload from one that died after counts. A complete round
// is kept until each contributor has had its result, or for kKeepComplete.
//
// Thread-safe.
#ifndef GRPS_COORDINATOR_COLLECTIVES_H_
#define GRPS_COORDINATOR_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grps {

class Collectives {
 public:
  static constexpr size_t kMaxNameBytes = 256;
  static constexpr size_t kMaxPayloadBytes = size_t{4} << 20;
  static constexpr size_t kMaxOpenRounds = 256;
  static constexpr size_t kMaxHeldBytes = size_t{64} << 20;
  static constexpr absl::Duration kKeepComplete = absl::Minutes(1);

  struct Answer {
    uint64_t round = 0;
    bool complete = false;
    std::vector<uint32_t> ranks;        // when complete: the contributors
    std::vector<std::string> payloads;  // theirs, in the same order
  };

  // INVALID_ARGUMENT for an empty or too long name or a payload over
  // kMaxPayloadBytes; RESOURCE_EXHAUSTED when a new round would pass
  // kMaxOpenRounds or kMaxHeldBytes. `live`: the job's live worker ranks.
  absl::StatusOr<Answer> Contribute(const std::string& name, uint32_t rank,
                                    std::string payload, const std::vector<uint32_t>& live,
                                    absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // The round `round` as `rank`, its contributor, sees it now. NOT_FOUND for
  // a round not held (never opened, or given to every contributor);
  // FAILED_PRECONDITION when `rank` did not contribute to it.
  absl::StatusOr<Answer> Result(uint64_t round, uint32_t rank,
                                const std::vector<uint32_t>& live, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Rounds held (open or complete, not yet given to all), for tests.
  size_t rounds_held() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Round {
    std::string name;
    std::map<uint32_t, std::string> payloads;  // by contributing rank
    bool complete = false;
    absl::Time completed;
    std::set<uint32_t> given;  // contributors that had the result
  };

  // The answer for `rank` about round `id`, completing it first if the live
  // set allows; forgets it once every contributor had it.
  Answer AnswerLocked(uint64_t id, uint32_t rank, const std::vector<uint32_t>& live,
                      absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(std::map<uint64_t, Round>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_round_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);  // by id: oldest first
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace grps

#endif  // GRPS_COORDINATOR_COLLECTIVES_H_
