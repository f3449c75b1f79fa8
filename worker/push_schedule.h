// PushSchedule: when each part of one push may start (ParameterClient's
// push schedule, worker/parameter_client.h), and the credit it measures for
// the next push.
//
//   PushSchedule schedule(client_credit);
//   schedule.Enqueue(call, shard, request_bytes);       // a part is ready
//   for (size_t c : schedule.Start()) Send(c);          // those that may go
//   // Its request written: schedule.Written(c), then Start() again.
//   // Its reply: schedule.Replied(c, ok), schedule.Written(c), Start().
//   // All done: schedule.Measured() is the next push's credit, if any.
//
// The rules: a shard's next ready part, in the push's order, starts once its
// part before has been written to its connection, with at most the credit
// of request bytes whose replies have not come; past the credit only a part
// ahead of every one in flight (a sync part's reply waits for every
// worker's push of it, and a worker whose hooks made its parts ready in
// another order must still send the part the others wait for). The push's
// order is the model's (call index), or one the caller gives: then it is
// strict, each shard's parts start in that order and no other, whenever
// they are ready (every worker of a sync job sends a shard the same parts
// in the same order, so the shard has every worker's copy of a part at
// about the same time, even where each worker's autograd hooks made its
// parts ready at its own pace; a part that does not go through the
// schedule, a lane's, is Bypass()ed).
//
// Thread safety: every method may be called from any thread.
#ifndef GRPS_WORKER_PUSH_SCHEDULE_H_
#define GRPS_WORKER_PUSH_SCHEDULE_H_

#include <cstddef>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grps {

class PushSchedule {
 public:
  // The credit: request bytes sent whose replies have not come. It must
  // cover the bandwidth-delay product of a part's round trip (its request
  // up, the wait of its update for the other workers' copies, its weights
  // down), or the link idles between replies; and no more by much, or a
  // worker runs ahead of the others on a shard by as much, its parts wait
  // there for theirs, and the replies trail the uploads (across 200 Mbit/s
  // namespace hosts, N = 2: 16 MiB gave 48-50 samples/s, 3 MiB 55, 1 MiB
  // 42; docs/performance.md). So each push measures it for the next:
  // kCreditRoundTrips x its bytes' rate x its shortest round trip (a part
  // sent on an idle link: the step's first), within [kMinCredit,
  // kInFlightBytes]. The first push has kInFlightBytes.
  static constexpr size_t kInFlightBytes = size_t{16} << 20;
  static constexpr size_t kMinCredit = size_t{4} << 20;
  static constexpr double kCreditRoundTrips = 3;
  // The credit a push that moved `bytes` through the schedule in `window`
  // (its first request's start to its last reply), whose quickest part took
  // `shortest`, measures for the next one.
  static size_t CreditFor(size_t bytes, absl::Duration window, absl::Duration shortest);
  // The least credit of a push to `shards` shards whose largest part carries
  // `largest_part_bytes` of values: kMinCredit, or room for kLeastPartsPerShard
  // of those parts a shard (one going up while the one before comes back),
  // whichever is more. Below it a push of large parts (chunks of 4 MiB:
  // --chunk_kb=4096) has one part out at a time, measures the slow rate that
  // gives, and keeps it: across 200 Mbit/s namespace hosts, N = 2, 16.5
  // samples/s, 35.4 with this floor (59.3 with the default chunks of 256
  // KiB: such parts suit fast links only; docs/performance.md).
  static constexpr size_t kLeastPartsPerShard = 2;
  // `largest_part_bytes`: each shard's largest part (of the shards a credit
  // covers); room for kLeastPartsPerShard of each, at least kMinCredit.
  static size_t LeastCredit(const std::vector<size_t>& largest_part_bytes);

  // Two links, a credit each: the network's (`network`, what Measured()
  // measures), and this machine's (`local`), to the shards at an address of
  // the worker's own machine (`local_shards[shard]`). A local shard's parts
  // do not cross the network: they neither take its credit nor count in its
  // measure (a worker beside one shard of several on its host would
  // otherwise hold its network parts back while its local ones are out, and
  // measure the loopback's rate for the network).
  struct Credits {
    size_t network = kInFlightBytes;
    size_t local = kInFlightBytes;
    std::vector<bool> local_shards;  // by shard; missing: the network's
  };

  // A call and its shard, in a strict order.
  struct Placed {
    size_t call = 0;
    size_t shard = 0;
  };
  // `order`: every call of the push, in the order they must start (each
  // shard's calls in it); empty: as they are ready, in index order.
  explicit PushSchedule(size_t credit, const std::vector<Placed>& order = {})
      : PushSchedule(Credits{credit, credit, {}}, order) {}
  PushSchedule(Credits credits, const std::vector<Placed>& order);
  PushSchedule(const PushSchedule&) = delete;
  PushSchedule& operator=(const PushSchedule&) = delete;

  // Call `call` (its index: its place in the model's order), to `shard`,
  // of `bytes` request bytes, is ready to start.
  void Enqueue(size_t call, size_t shard, size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // In a strict order: call `call` goes outside the schedule (a lane's),
  // and its shard's next call need not wait for it.
  void Bypass(size_t call) ABSL_LOCKS_EXCLUDED(mu_);
  // The queued calls that may start now, in order, each taken out of the
  // queue and counted as started (writing, in flight) now.
  std::vector<size_t> Start() ABSL_LOCKS_EXCLUDED(mu_);
  // The request of started call `call` has been written to its connection
  // (or the call ended): its shard's next call may start.
  void Written(size_t call) ABSL_LOCKS_EXCLUDED(mu_);
  // Started call `call` ended; its bytes leave its link's credit. `ok`: its
  // reply came, and (a network part's) counts toward the measure.
  void Replied(size_t call, bool ok) ABSL_LOCKS_EXCLUDED(mu_);
  // The network credit this push measured for the next one (CreditFor),
  // once its network parts' replies brought at least kMinCredit request
  // bytes; none before.
  std::optional<size_t> Measured() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    size_t shard = 0;
    size_t bytes = 0;
    absl::Time started_at;  // once started
  };
  // A link's calls started and not yet done, and their request bytes.
  struct Link {
    size_t credit = 0;
    std::set<size_t> in_flight;
    size_t in_flight_bytes = 0;
  };
  static constexpr size_t kNetwork = 0;
  static constexpr size_t kLocal = 1;
  size_t LinkOf(size_t shard) const {
    return shard < local_shards_.size() && local_shards_[shard] ? kLocal : kNetwork;
  }

  // A call's place in the push's order, and the call at a place.
  // (A call the order lacks goes after it, unordered.)
  size_t Place(size_t call) const {
    if (!strict_) return call;
    return call < place_.size() && order_[place_[call]] == call ? place_[call]
                                                                : order_.size() + call;
  }
  size_t CallAt(size_t place) const {
    if (!strict_) return place;
    return place < order_.size() ? order_[place] : place - order_.size();
  }

  mutable absl::Mutex mu_;
  const std::vector<bool> local_shards_;
  const bool strict_;
  std::vector<size_t> order_;  // strict: the calls by place
  std::vector<size_t> place_;  // strict: the places by call
  // Strict: each shard's places not yet started or bypassed, in order.
  std::map<size_t, std::deque<size_t>> turns_ ABSL_GUARDED_BY(mu_);
  // Every call enqueued, by place; those ready to start; each shard's call
  // whose request is being written; each link's started calls.
  std::map<size_t, Queued> calls_ ABSL_GUARDED_BY(mu_);
  std::set<size_t> queued_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, size_t> writing_ ABSL_GUARDED_BY(mu_);  // shard -> call
  Link links_[2] ABSL_GUARDED_BY(mu_);                     // kNetwork, kLocal
  // What the schedule measures, of its network calls: the first one's
  // start, the last reply, the quickest call, and the request bytes of
  // their replies.
  absl::Time first_start_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time last_reply_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration shortest_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  size_t replied_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace grps

#endif  // GRPS_WORKER_PUSH_SCHEDULE_H_
