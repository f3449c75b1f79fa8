#include "coordinator/server_requests.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace grps {

absl::StatusOr<ServerRequests::Registered> ServerRequests::Register(
    absl::Mutex* mu, const v1::RegisterServerRequest& request, const JobWait& wait, absl::Time now,
    const std::function<void()>& tick_reshard) {
  const v1::JobConfig& config = *p_.config;
  Membership& membership = *p_.membership;
  if (p_.phase->ended()) return p_.phase->EndedError();
  if (p_.model->awaiting_definition())
    return absl::UnavailableError(absl::StrCat(
        "job ", config.job_id(), "'s model is not defined yet: its first worker defines it"));
  if (config.max_servers() > 0 && request.has_requested_shard() && request.requested_shard() >= 0) {
    const uint32_t shard = static_cast<uint32_t>(request.requested_shard());
    if (shard >= membership.num_shards()) return StandBy(mu, request, shard, wait, tick_reshard);
    // A standby the last re-sharding took in, asking again.
    const uint64_t incarnation = membership.shard_map().shards(shard).incarnation();
    if (p_.resharding->TakenInAgain(shard, request.address(), incarnation))
      return Registered{.shard = shard, .incarnation = incarnation, .roll_back = std::nullopt};
  }
  absl::StatusOr<Membership::Registration> reg = membership.RegisterServer(
      request.has_requested_shard() ? request.requested_shard() : -1, request.address(), now);
  if (!reg.ok()) return reg.status();
  p_.phase->NoteRegistration(now);
  spdlog::info("server {} {} shard {} (incarnation {}); shard map epoch {}", request.address(),
               reg->rejoined ? "re-registered" : "registered", reg->slot, reg->incarnation,
               membership.shard_map().epoch());
  Registered out{.shard = reg->slot, .incarnation = reg->incarnation, .roll_back = std::nullopt};
  // Every mode rolls back to one cut: the shard's own updates since the
  // checkpoint are gone, and the others' must not outrun them (async
  // workers would push gradients of versions the shard no longer has). A
  // checkpoint the shard cannot load is replaced by the one before it, for
  // every member.
  if (request.has_restore_failed() && p_.generations->Refuse(reg->slot, request.restore_failed()))
    out.roll_back = absl::StrCat("shard ", reg->slot, " cannot restore checkpoint ",
                                 request.restore_failed().id());
  else if (reg->rejoined && p_.phase->running())
    out.roll_back = absl::StrCat("server of shard ", reg->slot, " restarted");
  return out;
}

ServerRegistration ServerRequests::Answer(uint32_t shard, uint64_t incarnation) const {
  ServerRegistration out;
  out.response.set_shard(shard);
  out.response.set_incarnation(incarnation);
  *out.response.mutable_config() = p_.model->MemberConfig(p_.membership->num_shards());
  *out.response.mutable_shard_map() = p_.membership->shard_map();
  *out.response.mutable_restore() = p_.generations->order();
  return out;
}

absl::StatusOr<ServerRequests::Registered> ServerRequests::StandBy(
    absl::Mutex* mu, const v1::RegisterServerRequest& request, uint32_t shard, const JobWait& wait,
    const std::function<void()>& tick_reshard) {
  const v1::JobConfig& config = *p_.config;
  if (shard >= config.max_servers())
    return absl::InvalidArgumentError(absl::StrCat("requested shard ", shard,
                                                   " is out of range; the job may have up to ",
                                                   config.max_servers(), " shards (max_servers)"));
  const uint64_t incarnation =
      p_.resharding->StandBy(shard, request.address(), p_.membership->num_shards(),
                             [this] { return p_.membership->ReserveIncarnation(p_.clock()); });
  tick_reshard();
  p_.waits->Changed();
  const absl::Status outcome = WaitToBeTakenIn(mu, shard, incarnation, wait);
  p_.resharding->StandbyCallEnded(shard, incarnation, outcome.ok() || absl::IsCancelled(outcome));
  if (!outcome.ok()) return outcome;
  spdlog::info("server {} takes shard {} (incarnation {}); shard map epoch {}", request.address(),
               shard, incarnation, p_.membership->shard_map().epoch());
  return Registered{.shard = shard, .incarnation = incarnation, .roll_back = std::nullopt};
}

absl::Status ServerRequests::WaitToBeTakenIn(absl::Mutex* mu, uint32_t shard, uint64_t incarnation,
                                             const JobWait& wait) {
  const Membership& membership = *p_.membership;
  return p_.waits->Until(
      mu, wait,
      [&]() -> std::optional<absl::Status> {
        if (shard < membership.num_shards() &&
            membership.shard_map().shards(shard).incarnation() == incarnation)
          return absl::OkStatus();
        if (p_.phase->ended()) return p_.phase->EndedError();
        if (p_.resharding->StandbyIncarnation(shard) != incarnation)
          return absl::FailedPreconditionError(
              absl::StrCat("another server stands by for shard ", shard, " now"));
        return std::nullopt;
      },
      [&] {
        return absl::UnavailableError(absl::StrCat(
            "standby: shard ", shard, " waits for the job to re-shard (it has ",
            membership.num_shards(), "; grpsctl scale --servers ", shard + 1, " takes it in)"));
      },
      kStandbyAnswerMargin);
}

}  // namespace grps
