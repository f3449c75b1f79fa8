#include "client/lookup_client.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"

namespace grps {

LookupClient::LookupClient(const std::string& target, absl::Duration rpc_timeout)
    : LookupClient(MakeChannel(target), target, rpc_timeout) {}

LookupClient::LookupClient(std::shared_ptr<grpc::ChannelInterface> channel, std::string target,
                           absl::Duration rpc_timeout)
    : target_(std::move(target)),
      rpc_timeout_(rpc_timeout),
      stub_(v1::Lookup::NewStub(std::move(channel))) {}

absl::Status LookupClient::Error(const char* call, const grpc::Status& status) const {
  absl::Status s = ToAbsl(status);
  if (s.code() == absl::StatusCode::kUnavailable)
    return absl::UnavailableError(
        absl::StrCat("lookup service ", target_, " (", call, "): ", s.message()));
  return absl::Status(s.code(),
                      absl::StrCat(call, " to lookup service ", target_, ": ", s.message()));
}

absl::StatusOr<LookedUpRows> LookupClient::Lookup(const std::string& table,
                                                  absl::Span<const int64_t> ids) const {
  v1::LookupRequest request;
  request.set_table(table);
  request.mutable_ids()->Add(ids.begin(), ids.end());
  v1::LookupResponse reply;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  if (grpc::Status s = stub_->Lookup(&context, request, &reply); !s.ok()) return Error("Lookup", s);
  const uint64_t want = static_cast<uint64_t>(ids.size()) * reply.dim() * sizeof(float);
  auto malformed = [&](auto... why) {
    return absl::DataLossError(
        absl::StrCat("Lookup to lookup service ", target_, ": a malformed reply: ", why...));
  };
  if (reply.dim() == 0 || reply.values().size() != want)
    return malformed(reply.values().size(), " bytes of rows of dim ", reply.dim(), " for ",
                     ids.size(), " ids");
  LookedUpRows rows;
  for (int i = 0; i < reply.missing_size(); ++i)
    if (reply.missing(i) >= ids.size() || (i > 0 && reply.missing(i) <= reply.missing(i - 1)))
      return malformed("missing position ", reply.missing(i), " out of order or past ", ids.size(),
                       " ids");
  rows.dim = reply.dim();
  rows.values.resize(static_cast<size_t>(ids.size()) * reply.dim());
  if (!reply.values().empty())  // memcpy takes no null pointer, even for no bytes
    std::memcpy(rows.values.data(), reply.values().data(), reply.values().size());
  rows.missing.assign(reply.missing().begin(), reply.missing().end());
  rows.checkpoint_id = reply.checkpoint_id();
  rows.step = reply.step();
  return rows;
}

absl::StatusOr<v1::LookupStatusResponse> LookupClient::Status() const {
  v1::LookupStatusResponse reply;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  if (grpc::Status s = stub_->LookupStatus(&context, v1::LookupStatusRequest(), &reply); !s.ok())
    return Error("LookupStatus", s);
  return reply;
}

}  // namespace grps
