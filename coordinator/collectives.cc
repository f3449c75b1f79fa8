#include "coordinator/collectives.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace grps {

absl::StatusOr<Collectives::Answer> Collectives::Contribute(const std::string& name,
                                                            uint32_t rank, std::string payload,
                                                            const std::vector<uint32_t>& live,
                                                            absl::Time now) {
  if (name.empty() || name.size() > kMaxNameBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("a collective's name must be 1 to ", kMaxNameBytes, " bytes, not ",
                     name.size()));
  if (payload.size() > kMaxPayloadBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "collective '", name, "': a payload of ", payload.size(), " bytes; at most ",
        kMaxPayloadBytes, " (collectives carry metrics and small tensors)"));
  absl::MutexLock lock(&mu_);
  ForgetExpiredLocked(now);
  if (held_bytes_ + payload.size() > kMaxHeldBytes)
    return absl::ResourceExhaustedError(absl::StrCat(
        "collective '", name, "': the coordinator holds ", held_bytes_,
        " bytes of collectives already, at most ", kMaxHeldBytes));
  auto it = std::find_if(rounds_.begin(), rounds_.end(), [&](const auto& entry) {
    const Round& r = entry.second;
    return !r.complete && r.name == name && r.payloads.count(rank) == 0;
  });
  if (it == rounds_.end()) {
    if (rounds_.size() >= kMaxOpenRounds)
      return absl::ResourceExhaustedError(absl::StrCat(
          "collective '", name, "': ", rounds_.size(),
          " rounds are open already (do the workers call the same collectives?)"));
    it = rounds_.emplace(next_round_++, Round{}).first;
    it->second.name = name;
  }
  held_bytes_ += payload.size();
  it->second.payloads.emplace(rank, std::move(payload));
  return AnswerLocked(it->first, rank, live, now);
}

absl::StatusOr<Collectives::Answer> Collectives::Result(uint64_t round, uint32_t rank,
                                                        const std::vector<uint32_t>& live,
                                                        absl::Time now) {
  absl::MutexLock lock(&mu_);
  ForgetExpiredLocked(now);
  auto it = rounds_.find(round);
  if (it == rounds_.end())
    return absl::NotFoundError(absl::StrCat(
        "collective round ", round,
        " is not held: the coordinator restarted, or every contributor had its result"));
  if (it->second.payloads.count(rank) == 0)
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", rank, " did not contribute to collective round ", round, " ('",
        it->second.name, "')"));
  return AnswerLocked(round, rank, live, now);
}

size_t Collectives::rounds_held() const {
  absl::MutexLock lock(&mu_);
  return rounds_.size();
}

Collectives::Answer Collectives::AnswerLocked(uint64_t id, uint32_t rank,
                                              const std::vector<uint32_t>& live,
                                              absl::Time now) {
  auto it = rounds_.find(id);
  Round& round = it->second;
  if (!round.complete &&
      std::all_of(live.begin(), live.end(),
                  [&](uint32_t r) { return round.payloads.count(r) > 0; })) {
    round.complete = true;
    round.completed = now;
  }
  Answer answer;
  answer.round = id;
  answer.complete = round.complete;
  if (!round.complete) return answer;
  for (const auto& [contributor, payload] : round.payloads) {
    answer.ranks.push_back(contributor);
    answer.payloads.push_back(payload);
  }
  round.given.insert(rank);
  if (round.given.size() == round.payloads.size()) EraseLocked(it);
  return answer;
}

void Collectives::EraseLocked(std::map<uint64_t, Round>::iterator it) {
  for (const auto& [contributor, payload] : it->second.payloads) held_bytes_ -= payload.size();
  rounds_.erase(it);
}

void Collectives::ForgetExpiredLocked(absl::Time now) {
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    auto next = std::next(it);
    if (it->second.complete && now - it->second.completed > kKeepComplete) EraseLocked(it);
    it = next;
  }
}

}  // namespace grps
