// LookupClient: what an inference process links to read a job's sparse rows
// from a lookup service (grps-server --serve; proto/lookup.proto,
// server/served_rows.h). Calls carry the process's security settings (the
// worker token, TLS: daemon/security.h) and a deadline, and fail with
// UNAVAILABLE naming the target when the service cannot be reached. A reply
// is checked before it is returned (its rows and missing positions fit the
// ids asked for): a malformed one is DATA_LOSS.
//
// Thread safety: a LookupClient may be shared by threads.
#ifndef GRPS_CLIENT_LOOKUP_CLIENT_H_
#define GRPS_CLIENT_LOOKUP_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "proto/lookup.grpc.pb.h"

namespace grps {

// The rows of a lookup: ids x dim values in the order asked, a missing
// row's zeros.
struct LookedUpRows {
  uint32_t dim = 0;
  std::vector<float> values;
  std::vector<uint32_t> missing;  // positions of the ids without a row
  uint64_t checkpoint_id = 0;     // what they are from
  uint64_t step = 0;
};

class LookupClient {
 public:
  // `target` is the service's "host:port".
  explicit LookupClient(const std::string& target, absl::Duration rpc_timeout = absl::Seconds(10));
  LookupClient(std::shared_ptr<grpc::ChannelInterface> channel, std::string target,
               absl::Duration rpc_timeout = absl::Seconds(10));

  absl::StatusOr<LookedUpRows> Lookup(const std::string& table,
                                      absl::Span<const int64_t> ids) const;
  absl::StatusOr<v1::LookupStatusResponse> Status() const;

 private:
  absl::Status Error(const char* call, const grpc::Status& status) const;

  const std::string target_;
  const absl::Duration rpc_timeout_;
  std::unique_ptr<v1::Lookup::Stub> stub_;
};

}  // namespace grps

#endif  // GRPS_CLIENT_LOOKUP_CLIENT_H_
