// PushSchedule: the order, pace and credit of one push's parts.
#include "worker/push_schedule.h"

#include <algorithm>
#include <utility>

namespace grps {

size_t PushSchedule::CreditFor(size_t bytes, absl::Duration window, absl::Duration shortest) {
  if (window <= absl::ZeroDuration() || shortest == absl::InfiniteDuration())
    return kInFlightBytes;
  const double product = static_cast<double>(bytes) / absl::ToDoubleSeconds(window) *
                         absl::ToDoubleSeconds(shortest);
  return static_cast<size_t>(std::clamp(kCreditRoundTrips * product,
                                        static_cast<double>(kMinCredit),
                                        static_cast<double>(kInFlightBytes)));
}

size_t PushSchedule::LeastCredit(const std::vector<size_t>& largest_part_bytes) {
  // A request's header and framing beside its values: a few KiB at most.
  constexpr size_t kRequestOverhead = size_t{16} << 10;
  size_t least = 0;
  for (size_t bytes : largest_part_bytes) least += kLeastPartsPerShard * (bytes + kRequestOverhead);
  return std::max(kMinCredit, least);
}

PushSchedule::PushSchedule(Credits credits, const std::vector<Placed>& order)
    : local_shards_(std::move(credits.local_shards)), strict_(!order.empty()) {
  links_[kNetwork].credit = credits.network;
  links_[kLocal].credit = credits.local;
  for (const Placed& p : order) {
    if (p.call >= place_.size()) place_.resize(p.call + 1, 0);
    place_[p.call] = order_.size();
    turns_[p.shard].push_back(order_.size());
    order_.push_back(p.call);
  }
}

void PushSchedule::Enqueue(size_t call, size_t shard, size_t bytes) {
  absl::MutexLock lock(&mu_);
  const size_t place = Place(call);
  calls_[place] = Queued{shard, bytes, absl::InfinitePast()};
  queued_.insert(place);
}

void PushSchedule::Bypass(size_t call) {
  if (!strict_) return;
  absl::MutexLock lock(&mu_);
  const size_t place = Place(call);
  for (auto& [shard, turn] : turns_) {
    auto it = std::find(turn.begin(), turn.end(), place);
    if (it != turn.end()) turn.erase(it);
  }
}

std::vector<size_t> PushSchedule::Start() {
  std::vector<size_t> start;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  // A link whose credit a call did not fit: its later calls wait too.
  bool full[2] = {false, false};
  for (auto it = queued_.begin(); it != queued_.end() && !(full[kNetwork] && full[kLocal]);) {
    const size_t next = *it;
    Queued& call = calls_[next];
    const size_t l = LinkOf(call.shard);
    Link& link = links_[l];
    std::deque<size_t>* turn = strict_ ? &turns_[call.shard] : nullptr;
    if (full[l] || writing_.count(call.shard) > 0 ||
        (turn != nullptr && !turn->empty() && turn->front() != next)) {
      ++it;
      continue;
    }
    if (!link.in_flight.empty() && link.in_flight_bytes + call.bytes > link.credit &&
        next > *link.in_flight.begin()) {
      full[l] = true;
      ++it;
      continue;
    }
    it = queued_.erase(it);
    if (turn != nullptr && !turn->empty() && turn->front() == next) turn->pop_front();
    call.started_at = now;
    if (l == kNetwork) first_start_ = std::min(first_start_, now);
    writing_[call.shard] = next;
    link.in_flight.insert(next);
    link.in_flight_bytes += call.bytes;
    start.push_back(CallAt(next));
  }
  return start;
}

void PushSchedule::Written(size_t call) {
  absl::MutexLock lock(&mu_);
  const size_t place = Place(call);
  auto it = calls_.find(place);
  if (it == calls_.end()) return;
  auto writing = writing_.find(it->second.shard);
  if (writing != writing_.end() && writing->second == place) writing_.erase(writing);
}

void PushSchedule::Replied(size_t call, bool ok) {
  absl::MutexLock lock(&mu_);
  const size_t place = Place(call);
  auto it = calls_.find(place);
  if (it == calls_.end()) return;
  const size_t l = LinkOf(it->second.shard);
  Link& link = links_[l];
  if (link.in_flight.erase(place) == 0) return;
  link.in_flight_bytes -= it->second.bytes;
  if (ok && l == kNetwork) {
    const absl::Time now = absl::Now();
    shortest_ = std::min(shortest_, now - it->second.started_at);
    last_reply_ = now;
    replied_bytes_ += it->second.bytes;
  }
}

std::optional<size_t> PushSchedule::Measured() const {
  absl::MutexLock lock(&mu_);
  if (replied_bytes_ < kMinCredit) return std::nullopt;
  return CreditFor(replied_bytes_, last_reply_ - first_start_, shortest_);
}

}  // namespace grps
