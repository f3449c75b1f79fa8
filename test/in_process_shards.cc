#include "test/in_process_shards.h"

#include <chrono>
#include <random>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "job/shard_map.h"

namespace grps {

absl::Status InProcessShards::Serve(const v1::JobConfig& config, v1::ShardMap* map,
                                    const SecurityConfig& security, const std::string& host) {
  for (uint32_t s = 0; s < config.num_servers(); ++s) {
    ShardStore::Options o;
    o.config = config;
    o.shard_map = *map;
    o.shard = s;
    o.incarnation = 1;
    absl::StatusOr<std::unique_ptr<ShardStore>> store = ShardStore::Create(o);
    if (!store.ok()) return store.status();
    stores_.push_back(std::move(*store));
    services_.push_back(std::make_unique<ParameterServerService>(
        stores_.back().get(), MemberKey(security.admin_token)));
    absl::StatusOr<GrpcServer> server =
        StartGrpcServer(absl::StrCat(host, ":0"), {services_.back().get()}, security);
    if (!server.ok()) return server.status();
    map->mutable_shards(s)->set_address(absl::StrCat(host, ":", server->port));
    servers_.push_back(std::move(server->server));
  }
  return absl::OkStatus();
}

void InProcessShards::SetLiveWorkers(uint32_t workers) {
  std::vector<uint32_t> ranks;
  std::vector<uint64_t> incarnations;
  for (uint32_t r = 0; r < workers; ++r) {
    ranks.push_back(r);
    incarnations.push_back(1);
  }
  for (auto& store : stores_) store->SetLiveWorkers(ranks, incarnations);
}

InProcessShards::~InProcessShards() {
  for (auto& store : stores_) store->Shutdown();
  for (auto& server : servers_) server->Shutdown(std::chrono::system_clock::now());
}

absl::StatusOr<v1::ShardMap> OneTensorMap(const v1::JobConfig& config, int64_t elements) {
  v1::TensorSpec tensor;
  tensor.set_name("w");
  tensor.add_shape(elements);
  tensor.set_initializer("zeros");
  return BuildShardMap({tensor}, config.num_servers(), config.chunk_bytes());
}

Examples RandomExamples(int n, int features, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, 1);
  Examples d;
  for (int i = 0; i < n * features; ++i) d.x.push_back(g(rng));
  for (int i = 0; i < n; ++i) d.y.push_back(rng() % classes);
  return d;
}

}  // namespace grps
