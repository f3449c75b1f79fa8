#include "test/in_process_shards.h"

#include <chrono>
#include <random>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "daemon/daemon.h"
#include "gtest/gtest.h"

namespace grps {

InProcessShards::InProcessShards(const v1::JobConfig& config, v1::ShardMap* map) {
  for (uint32_t s = 0; s < config.num_servers(); ++s) {
    ShardStore::Options o;
    o.config = config;
    o.shard_map = *map;
    o.shard = s;
    o.incarnation = 1;
    absl::StatusOr<std::unique_ptr<ShardStore>> store = ShardStore::Create(o);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return;
    stores_.push_back(std::move(*store));
    services_.push_back(std::make_unique<ParameterServerService>(stores_.back().get()));
    absl::StatusOr<GrpcServer> server = StartGrpcServer("127.0.0.1:0", {services_.back().get()});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    map->mutable_shards(s)->set_address(absl::StrCat("127.0.0.1:", server->port));
    servers_.push_back(std::move(server->server));
  }
}

InProcessShards::~InProcessShards() {
  for (auto& store : stores_) store->Shutdown();
  for (auto& server : servers_) server->Shutdown(std::chrono::system_clock::now());
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
