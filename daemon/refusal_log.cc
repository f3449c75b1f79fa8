#include "daemon/refusal_log.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "daemon/hand_over.h"
#include "spdlog/spdlog.h"

namespace grps {

bool IsRefusal(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::ABORTED:
      return false;
    default:
      return true;
  }
}

RefusalLog::RefusalLog(absl::Duration every, std::function<absl::Time()> now)
    : every_(every), now_(std::move(now)) {}

RefusalLog& RefusalLog::Process() {
  static RefusalLog* const log = new RefusalLog();
  return *log;
}

bool RefusalLog::Note(absl::string_view method, grpc::StatusCode code,
                      absl::string_view peer, absl::string_view message) {
  const absl::Time now = now_();
  std::string key = absl::StrCat(method, " ", static_cast<int>(code));
  uint64_t unsaid = 0;
  absl::Time since;
  {
    absl::MutexLock lock(&mu_);
    if (!kinds_.contains(key) && kinds_.size() >= kMaxKinds) key = "other";
    auto [it, first] = kinds_.try_emplace(key);
    Kind& kind = it->second;
    if (!first && now - kind.logged < every_) {
      ++kind.unsaid;
      return false;
    }
    unsaid = kind.unsaid;
    since = kind.logged;
    kind.logged = now;
    kind.unsaid = 0;
  }
  spdlog::warn("refused {} from {}: {}: {}{}", QuoteUntrusted(method, 96),
               QuoteUntrusted(peer, 96),
               absl::StatusCodeToString(static_cast<absl::StatusCode>(code)),
               QuoteUntrusted(message, 240),
               unsaid == 0 ? std::string()
                           : absl::StrCat(" (and ", unsaid, " more like it in the last ",
                                          absl::FormatDuration(absl::Trunc(
                                              now - since, absl::Milliseconds(100))),
                                          ", not logged)"));
  return true;
}

namespace {

// Notes the call's status at PRE_SEND_STATUS when it is a refusal of a
// request that arrived.
struct NoteRefusal {
  grpc::experimental::ServerRpcInfo* info;
  // The call's message never came: its caller cancelled it first (a member
  // stopping its heartbeats cancels the one in flight), and the INTERNAL
  // "Couldn't initialize byte buffer reader" a service of grps's answers
  // then is no fault of a request. (gRPC's own health service parses its
  // requests itself and answers such a call INVALID_ARGUMENT: still noted.)
  bool no_message = false;

  void operator()(grpc::experimental::InterceptorBatchMethods* methods) {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr)
      no_message = true;
    if (!methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) return;
    const grpc::Status status = methods->GetSendStatus();
    if (!IsRefusal(status.error_code()) || no_message) return;
    const grpc::ServerContextBase* context = info->server_context();
    RefusalLog::Process().Note(
        info->method() != nullptr ? info->method() : "?", status.error_code(),
        context != nullptr ? context->peer() : std::string("?"), status.error_message());
  }
};

class RefusalLogInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new HandedOver<NoteRefusal>(NoteRefusal{info});
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRefusalLogInterceptorFactory() {
  return std::make_unique<RefusalLogInterceptorFactory>();
}

}  // namespace grps
