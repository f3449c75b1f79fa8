// ParameterClient against fake shards served over real gRPC on loopback:
// which endpoint a push or pull reaches after a map update, what generation
// it carries, and how a retrying push ends; which newer maps fit a client
// (FitShardMap), and which shards a SparseClient spreads rows over.
#include "worker/parameter_client.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/daemon.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "test/captured_log.h"
#include "worker/push_schedule.h"
#include "worker/sparse_client.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

// What a shard saw of a push: the lane it named (nonce 0: none) and whether
// its chunks carried their values as bytes.
struct SeenPush {
  uint64_t lane_nonce = 0;
  bool bytes = false;
  uint32_t first_chunk = 0;  // of a held push
  size_t data_bytes = 0;     // of a held push: its chunks' values
  std::string peer;          // the connection it came on (address:port)
};

// A shard that answers every pull with its chunks filled with `fill`, and
// records the generation of every push and pull it sees. Replies to pushes
// with `push_error` when one is set, and to pushes that name a lane with
// UNIMPLEMENTED when it refuses lanes (as a shard on another machine does).
class FakeShard : public v1::ParameterServer::Service {
 public:
  FakeShard(const v1::ShardMap& map, uint32_t shard, float fill)
      : map_(map), shard_(shard), fill_(fill) {}

  grpc::Status Push(grpc::ServerContext* context, const v1::PushRequest* req,
                    v1::PushResponse* resp) override {
    {
      // A held push is seen at once and answered once released (a sync
      // shard's fused pull waits for every worker's push of its chunks).
      absl::MutexLock lock(&mu_);
      if (held_ != nullptr) {
        absl::Notification* release = held_;
        SeenPush& seen = pushes_.emplace_back();
        seen.first_chunk = req->chunks_size() > 0 ? req->chunks(0).chunk_id() : 0;
        for (const v1::ChunkData& c : req->chunks()) seen.data_bytes += c.data().size();
        mu_.Unlock();
        release->WaitForNotification();
        mu_.Lock();
        for (int i = 0; i < req->chunks_size(); ++i) resp->add_versions(1);
        return grpc::Status::OK;
      }
    }
    absl::MutexLock lock(&mu_);
    push_generations_.push_back(req->generation());
    SeenPush& seen = pushes_.emplace_back();
    seen.peer = context->peer();
    seen.lane_nonce = req->has_lane() ? req->lane().nonce() : 0;
    seen.bytes = req->chunks_size() > 0;
    for (const v1::ChunkData& c : req->chunks())
      seen.bytes = seen.bytes && c.lane_offset() == 0 &&
                   c.data().size() == map_.chunks(c.chunk_id()).num_elements() * sizeof(float);
    if (refuse_lanes_ && req->has_lane())
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no lanes here");
    if (!push_error_.ok()) return ToGrpc(push_error_);
    for (int i = 0; i < req->chunks_size(); ++i) resp->add_versions(1);
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext*, const v1::PullRequest* req,
                    v1::PullResponse* resp) override {
    absl::MutexLock lock(&mu_);
    pull_generations_.push_back(req->generation());
    for (uint32_t id : req->chunk_ids()) {
      if (id >= static_cast<uint32_t>(map_.chunks_size()) || map_.chunks(id).shard() != shard_)
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not this shard's chunk");
      v1::ChunkData* c = resp->add_chunks();
      c->set_chunk_id(id);
      c->set_dtype(v1::DTYPE_F32);
      std::vector<float> values(map_.chunks(id).num_elements(), fill_);
      c->mutable_data()->assign(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float));
      c->set_version(1);
    }
    return grpc::Status::OK;
  }

  // Rows of every id asked for, kTableDim floats each, every one the id;
  // the version: how many sparse pulls came before this one.
  grpc::Status PullSparse(grpc::ServerContext*, const v1::SparsePullRequest* req,
                          v1::SparsePullResponse* resp) override {
    absl::MutexLock lock(&mu_);
    sparse_ids_.insert(sparse_ids_.end(), req->ids().begin(), req->ids().end());
    sparse_pull_sizes_.push_back(req->ids_size());
    resp->set_dtype(v1::DTYPE_F32);
    resp->set_version(sparse_pull_sizes_.size() - 1);
    std::vector<float> rows;
    rows.reserve(static_cast<size_t>(req->ids_size()) * kTableDim);
    for (int64_t id : req->ids()) rows.insert(rows.end(), kTableDim, static_cast<float>(id));
    resp->mutable_values()->assign(reinterpret_cast<const char*>(rows.data()),
                                   rows.size() * sizeof(float));
    return grpc::Status::OK;
  }

  void FailPushesWith(absl::Status s) {
    absl::MutexLock lock(&mu_);
    push_error_ = std::move(s);
  }
  void RefuseLanes() {
    absl::MutexLock lock(&mu_);
    refuse_lanes_ = true;
  }
  // Answers no push until `release` is notified (it must outlive them).
  void HoldPushesUntil(absl::Notification* release) {
    absl::MutexLock lock(&mu_);
    held_ = release;
  }
  std::vector<SeenPush> pushes() {
    absl::MutexLock lock(&mu_);
    return pushes_;
  }
  std::vector<uint64_t> push_generations() {
    absl::MutexLock lock(&mu_);
    return push_generations_;
  }
  std::vector<uint64_t> pull_generations() {
    absl::MutexLock lock(&mu_);
    return pull_generations_;
  }
  std::vector<int> sparse_pull_sizes() {
    absl::MutexLock lock(&mu_);
    return sparse_pull_sizes_;
  }
  std::vector<int64_t> sparse_ids() {
    absl::MutexLock lock(&mu_);
    return sparse_ids_;
  }

  static constexpr uint32_t kTableDim = 4;

 private:
  const v1::ShardMap map_;
  const uint32_t shard_;
  const float fill_;
  absl::Mutex mu_;
  absl::Status push_error_ ABSL_GUARDED_BY(mu_);
  bool refuse_lanes_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification* held_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<SeenPush> pushes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> push_generations_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> pull_generations_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> sparse_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<int> sparse_pull_sizes_ ABSL_GUARDED_BY(mu_);
};

// A fake shard behind its own gRPC server on a free loopback port.
struct ServedShard {
  std::unique_ptr<FakeShard> service;
  GrpcServer server;
  std::string address;
  ~ServedShard() {
    if (server.server) server.server->Shutdown(std::chrono::system_clock::now());
  }
};

// A part as the client cuts it (ChunkLayout): each shard's chunks in runs
// of at most kPartBytes, in the model's order (the first chunk's).
struct CutPart {
  uint32_t first = 0;  // chunk id
  size_t bytes = 0;    // values
  std::vector<uint32_t> chunks;
};
std::vector<CutPart> PartsOf(const v1::ShardMap& map) {
  std::vector<CutPart> parts;
  for (int shard = 0; shard < map.shards_size(); ++shard) {
    size_t bytes = ParameterClient::kPartBytes;
    for (uint32_t id : ChunksOfShard(map, static_cast<uint32_t>(shard))) {
      const size_t chunk = map.chunks(id).num_elements() * sizeof(float);
      if (bytes + chunk > ParameterClient::kPartBytes) {
        parts.push_back(CutPart{id, 0, {}});
        bytes = 0;
      }
      parts.back().bytes += chunk;
      parts.back().chunks.push_back(id);
      bytes += chunk;
    }
  }
  std::sort(parts.begin(), parts.end(),
            [](const CutPart& a, const CutPart& b) { return a.first < b.first; });
  return parts;
}

class ParameterClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = DefaultJobConfig();
    config_.set_job_id("client-test");
    config_.set_num_servers(2);
    config_.set_num_workers(1);
    config_.set_chunk_bytes(1024);
    // Parts as a worker cuts them to a shard on another machine: these
    // shards are on loopback, where by the link they would be of 4 MiB.
    config_.set_part_bytes(ParameterClient::kPartBytes);
    // A model of 26,000 parameters: each shard's chunks are one part.
    config_.clear_hidden_units();
    config_.add_hidden_units(32);
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), 2, config_.chunk_bytes());
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
    map_.set_epoch(1);
    ASSERT_FALSE(ChunksOfShard(map_, 0).empty());
    ASSERT_FALSE(ChunksOfShard(map_, 1).empty());
  }

  // Shard `shard` of `map` (map_ when null).
  std::unique_ptr<ServedShard> Serve(uint32_t shard, float fill,
                                     const v1::ShardMap* map = nullptr) {
    auto served = std::make_unique<ServedShard>();
    served->service = std::make_unique<FakeShard>(map ? *map : map_, shard, fill);
    absl::StatusOr<GrpcServer> server =
        StartGrpcServer("127.0.0.1:0", {served->service.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    served->server = std::move(*server);
    served->address = absl::StrCat("127.0.0.1:", served->server.port);
    return served;
  }

  // A model of one hidden layer of `hidden` units in chunks of
  // `chunk_bytes`, over 2 shards, as map_.
  void UseModel(int hidden, uint64_t chunk_bytes) {
    config_.clear_hidden_units();
    config_.add_hidden_units(hidden);
    config_.set_chunk_bytes(chunk_bytes);
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), 2, config_.chunk_bytes());
    ASSERT_TRUE(map.ok()) << map.status();
    map_ = *map;
  }

  // Both shards of map_ holding every push (seen at once, answered once
  // released), and a client of them. Leaving, it releases every hold first
  // (also after a failed assertion), then ends the client, then the shards:
  // neither the shards' handlers nor the client's calls are left waiting.
  struct Held {
    std::deque<absl::Notification> releases;  // the last one: the hold now
    std::array<std::unique_ptr<ServedShard>, 2> shards;
    std::unique_ptr<ParameterClient> client;
    ~Held() {
      for (absl::Notification& r : releases)
        if (!r.HasBeenNotified()) r.Notify();
    }
    // Every push from now on is held until Release().
    void Hold() {
      releases.emplace_back();
      for (std::unique_ptr<ServedShard>& s : shards) s->service->HoldPushesUntil(&releases.back());
    }
    void Release() { releases.back().Notify(); }
  };
  // map_: a model of `hidden` units in chunks of `chunk_bytes`, its values
  // through gRPC; its shards served into *held, holding.
  // The client counts both shards on the network's link unless
  // `on_this_machine` says otherwise (they are on loopback).
  void ServeHeld(int hidden, uint64_t chunk_bytes, std::unique_ptr<Held>* held,
                 std::vector<bool> on_this_machine = {false, false}) {
    config_.set_local_transport(v1::LOCAL_TRANSPORT_GRPC);
    ASSERT_NO_FATAL_FAILURE(UseModel(hidden, chunk_bytes));
    *held = std::make_unique<Held>();
    Held& h = **held;
    h.shards = {Serve(0, 0), Serve(1, 0)};
    ASSERT_TRUE(h.shards[0] && h.shards[1]);
    h.Hold();
    h.client = std::make_unique<ParameterClient>(
        config_, MapWith(h.shards[0]->address, h.shards[1]->address, 1), 0, 1, on_this_machine);
  }

  // A loopback address nobody listens on: a server's port, after it stopped.
  std::string DeadAddress() {
    std::unique_ptr<ServedShard> gone = Serve(0, 0);
    if (gone == nullptr) return "127.0.0.1:1";
    const std::string address = gone->address;
    gone.reset();
    return address;
  }

  v1::ShardMap MapWith(const std::string& shard0, const std::string& shard1,
                       uint64_t epoch) const {
    v1::ShardMap map = map_;
    map.mutable_shards(0)->set_address(shard0);
    map.mutable_shards(1)->set_address(shard1);
    map.set_epoch(epoch);
    return map;
  }

  // The job's chunks placed on `shards` shards, every one with an address.
  v1::ShardMap ReShardedMap(uint32_t shards, uint64_t epoch) const {
    absl::StatusOr<v1::ShardMap> map =
        BuildShardMap(ModelTensors(config_), shards, config_.chunk_bytes());
    EXPECT_TRUE(map.ok()) << map.status();
    for (v1::ShardEndpoint& e : *map->mutable_shards())
      e.set_address(absl::StrCat("127.0.0.1:", 1 + e.shard()));
    map->set_epoch(epoch);
    return *map;
  }

  // The pulled value of the first element of shard `shard`'s first chunk.
  float PulledValueOfShard(ParameterClient& client, uint32_t shard) {
    std::vector<float> params(client.num_parameters(), -1);
    absl::Status s = client.Pull(0, absl::Seconds(5), params.data());
    EXPECT_TRUE(s.ok()) << s;
    const uint32_t chunk = ChunksOfShard(map_, shard).front();
    int64_t offset = 0;
    for (uint32_t t = 0; t < map_.chunks(chunk).tensor_index(); ++t)
      offset += NumElements(map_.tensors(t));
    return params[offset + map_.chunks(chunk).offset()];
  }

  v1::JobConfig config_;
  v1::ShardMap map_;
};

TEST_F(ParameterClientTest, UpdateShardMapSendsPullsAndPushesToTheNewAddress) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0.5f);
  std::unique_ptr<ServedShard> old1 = Serve(1, 1.0f);
  std::unique_ptr<ServedShard> new1 = Serve(1, 2.0f);
  ASSERT_TRUE(shard0 && old1 && new1);
  ParameterClient client(config_, MapWith(shard0->address, old1->address, 1), 0, 1);
  EXPECT_EQ(PulledValueOfShard(client, 1), 1.0f);

  ASSERT_TRUE(client.UpdateShardMap(MapWith(shard0->address, new1->address, 2)).ok());
  EXPECT_EQ(client.map_epoch(), 2u);
  EXPECT_EQ(PulledValueOfShard(client, 1), 2.0f);
  EXPECT_EQ(PulledValueOfShard(client, 0), 0.5f);
  std::vector<float> grads(client.num_parameters(), 0.1f);
  absl::StatusOr<ParameterClient::PushOutcome> pushed =
      client.Push(0, grads.data(), 1, absl::Seconds(5));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(new1->service->push_generations().size(), 1u);
  EXPECT_TRUE(old1->service->push_generations().empty());
  EXPECT_EQ(old1->service->pull_generations().size(), 1u);  // the first pull only
}

TEST_F(ParameterClientTest, AStagedPushSendsAPartOnceAllItsTensorsAreReady) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0.5f);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 1.0f);
  ASSERT_TRUE(shard0 && shard1);
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  ASSERT_TRUE(client.CanStage());
  std::vector<float> grads(client.num_parameters(), 0.1f);
  std::vector<float> params(client.num_parameters(), 0.0f);
  // The tensors each shard's chunks belong to (each shard's chunks are one
  // part: the model is far below ParameterClient::kPartBytes).
  std::vector<std::set<uint32_t>> tensors_of(2);
  for (uint32_t shard : {0u, 1u})
    for (uint32_t id : ChunksOfShard(map_, shard))
      tensors_of[shard].insert(map_.chunks(id).tensor_index());
  // The ready shard: one whose tensors leave some of the other's out.
  auto within = [](const std::set<uint32_t>& a, const std::set<uint32_t>& b) {
    return std::includes(b.begin(), b.end(), a.begin(), a.end());
  };
  const uint32_t ready = within(tensors_of[1], tensors_of[0]) ? 0 : 1;
  const uint32_t other = 1 - ready;
  ASSERT_FALSE(within(tensors_of[other], tensors_of[ready]))
      << "the test needs a shard with a tensor the other lacks";
  ServedShard* shards[2] = {shard0.get(), shard1.get()};

  // The ready shard's tensors, then given up: it got its push, the other
  // shard nothing.
  ParameterClient::Ticket ticket =
      client.StagePush(0, grads.data(), 1, params.data(), absl::Seconds(1));
  for (uint32_t t : tensors_of[ready]) ASSERT_TRUE(client.TensorReady(ticket, t).ok());
  ASSERT_TRUE(client.TensorReady(ticket, *tensors_of[ready].begin()).ok());  // twice: once
  EXPECT_EQ(client.TensorReady(ticket, map_.tensors_size()).code(),
            absl::StatusCode::kInvalidArgument);
  client.Discard(ticket);
  EXPECT_EQ(shards[ready]->service->pushes().size(), 1u);
  EXPECT_EQ(shards[other]->service->pushes().size(), 0u);
  EXPECT_EQ(client.TensorReady(ticket, 0).code(), absl::StatusCode::kInvalidArgument);

  // Nothing said ready: Wait sends every part.
  ticket = client.StagePush(1, grads.data(), 1, params.data(), absl::Seconds(1));
  absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(ticket, {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(shards[ready]->service->pushes().size(), 2u);
  EXPECT_EQ(shards[other]->service->pushes().size(), 1u);
}

TEST_F(ParameterClientTest, APushSendsItsPartsInTheModelsOrderWithinItsCredit) {
  // A model of about 26 MB: 100 parts of 256 KiB, more than the credit, sent
  // as bytes (the schedule is the network's; a lane's values are not sent).
  std::unique_ptr<Held> held;
  ASSERT_NO_FATAL_FAILURE(ServeHeld(8192, 256 << 10, &held));
  ServedShard* shard0 = held->shards[0].get();
  ServedShard* shard1 = held->shards[1].get();
  ParameterClient& client = *held->client;
  const std::vector<CutPart> parts = PartsOf(map_);
  size_t credit_parts = 0, credit = 0;
  while (credit_parts < parts.size() &&
         credit + parts[credit_parts].bytes <= ParameterClient::kInFlightBytes)
    credit += parts[credit_parts++].bytes;
  ASSERT_LT(credit_parts, parts.size()) << "the model must be larger than the credit";

  std::vector<float> grads(client.num_parameters(), 0.1f);
  std::vector<float> params(client.num_parameters(), 0.0f);
  ParameterClient::Ticket ticket =
      client.PushAsync(0, grads.data(), 1, params.data(), absl::Seconds(30));
  auto seen = [&] {
    std::vector<SeenPush> all = shard0->service->pushes();
    for (const SeenPush& p : shard1->service->pushes()) all.push_back(p);
    return all;
  };
  // The credit counts whole requests (a part's values and its header): the
  // last part whose values fit may not.
  for (int i = 0; i < 500 && seen().size() + 1 < credit_parts; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(300));  // time for a part past the credit to show
  // While no reply comes, as many parts are out as the credit holds, from
  // both shards, each shard's first ones in the model's order. (Each shard
  // goes at its own pace: one whose connection is slower to take its parts
  // leaves more of the credit to the other.)
  ServedShard* served[2] = {shard0, shard1};
  size_t out = 0, out_bytes = 0;
  for (uint32_t shard : {0u, 1u}) {
    SCOPED_TRACE(absl::StrCat("shard ", shard));
    std::vector<uint32_t> firsts;
    for (const CutPart& part : parts)
      if (map_.chunks(part.first).shard() == shard) firsts.push_back(part.first);
    std::set<uint32_t> seen_firsts;
    for (const SeenPush& p : served[shard]->service->pushes()) {
      seen_firsts.insert(p.first_chunk);
      out_bytes += p.data_bytes;
      ++out;
    }
    EXPECT_FALSE(seen_firsts.empty());
    EXPECT_EQ(seen_firsts, std::set<uint32_t>(firsts.begin(), firsts.begin() +
                                                  std::min(seen_firsts.size(), firsts.size())));
  }
  ASSERT_GE(out + 1, credit_parts);
  ASSERT_LE(out, credit_parts);
  EXPECT_LE(out_bytes, ParameterClient::kInFlightBytes);

  // Answered, the rest follow: every part once.
  held->Release();
  absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(ticket, {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  std::set<uint32_t> out_first;
  for (const SeenPush& p : seen()) out_first.insert(p.first_chunk);
  EXPECT_EQ(out_first.size(), parts.size());
  EXPECT_EQ(seen().size(), parts.size());

  // That push measured the credit of the next: its window held the wait for
  // the release, so the rate it saw is low and its credit well under the
  // first push's (on loopback the least, kMinCredit; under a sanitizer's
  // slowdown a part's round trip can be long enough for a little more).
  // Held again, the next push has no more than that out.
  const size_t measured = client.credit();
  EXPECT_GE(measured, ParameterClient::kMinCredit);
  EXPECT_LE(measured, ParameterClient::kInFlightBytes / 2);
  auto seen_bytes = [&] {
    size_t bytes = 0;
    for (const SeenPush& p : seen()) bytes += p.data_bytes;
    return bytes;
  };
  const size_t first_bytes = seen_bytes();
  held->Hold();
  ticket = client.PushAsync(1, grads.data(), 1, params.data(), absl::Seconds(30));
  for (int i = 0; i < 500 && seen().size() < parts.size() + 4; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_GT(seen_bytes() - first_bytes, measured / 2);
  EXPECT_LE(seen_bytes() - first_bytes, measured);
  held->Release();
  pushed = client.Wait(ticket, {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
}

TEST_F(ParameterClientTest, PartsToAShardOnThisMachineTakeNothingOfTheNetworksCredit) {
  // The model of about 26 MB again, more than one credit holds; shard 0 on
  // this machine, shard 1 across the network. Each shard's parts fit its
  // link's credit, so while no reply comes every part is out: the
  // loopback's parts do not hold the network's back (with one credit for
  // both, about 16 MiB of them would be).
  std::unique_ptr<Held> held;
  ASSERT_NO_FATAL_FAILURE(ServeHeld(8192, 256 << 10, &held, {true, false}));
  ParameterClient& client = *held->client;
  const std::vector<CutPart> parts = PartsOf(map_);
  size_t total = 0, by_shard[2] = {0, 0};
  for (const CutPart& part : parts) {
    total += part.bytes;
    by_shard[map_.chunks(part.first).shard()] += part.bytes + (size_t{16} << 10);
  }
  ASSERT_GT(total, ParameterClient::kInFlightBytes) << "the model must be larger than a credit";
  ASSERT_LT(by_shard[0], client.local_credit());
  ASSERT_LT(by_shard[1], client.credit());

  std::vector<float> grads(client.num_parameters(), 0.1f);
  std::vector<float> params(client.num_parameters(), 0.0f);
  ParameterClient::Ticket ticket =
      client.PushAsync(0, grads.data(), 1, params.data(), absl::Seconds(30));
  auto out = [&] {
    return held->shards[0]->service->pushes().size() + held->shards[1]->service->pushes().size();
  };
  for (int i = 0; i < 1000 && out() < parts.size(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(out(), parts.size()) << "parts held back with no reply come";
  held->Release();
  absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(ticket, {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
}

TEST_F(ParameterClientTest, APushOfLargePartsKeepsTwoOfThemOutAShardAfterASlowPush) {
  // Chunks of about 4 MiB (--chunk_kb=4096), a part each. A push held at its
  // shards measures a slow link (the least credit, one part); the next one
  // still has two parts a shard out at once.
  std::unique_ptr<Held> held;
  ASSERT_NO_FATAL_FAILURE(ServeHeld(8192, 4 << 20, &held));
  ParameterClient& client = *held->client;
  const std::vector<CutPart> parts = PartsOf(map_);
  ASSERT_GE(parts.size(), 6u) << "the model must have more parts than the test counts";
  size_t largest = 0;
  for (const CutPart& part : parts) largest = std::max(largest, part.bytes);
  ASSERT_GT(largest, size_t{3} << 20);
  const size_t least = PushSchedule::LeastCredit({largest, largest});
  ASSERT_GT(least, PushSchedule::kMinCredit);

  std::vector<float> grads(client.num_parameters(), 0.1f);
  std::vector<float> params(client.num_parameters(), 0.0f);
  ParameterClient::Ticket ticket =
      client.PushAsync(0, grads.data(), 1, params.data(), absl::Seconds(30));
  absl::SleepFor(absl::Milliseconds(300));
  held->Release();
  absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(ticket, {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_GE(client.credit(), least);

  held->Hold();
  auto out = [&] {
    return held->shards[0]->service->pushes().size() + held->shards[1]->service->pushes().size() -
           parts.size();
  };
  ticket = client.PushAsync(1, grads.data(), 1, params.data(), absl::Seconds(30));
  for (int i = 0; i < 500 && out() < 4; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(out(), 4u) << "fewer than two parts a shard out at once";
  held->Release();
  pushed = client.Wait(ticket, {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
}

TEST_F(ParameterClientTest, AStagedSyncPushSendsEachShardItsPartsInBackwardsOrder) {
  // Every worker sends a shard the same parts in the same order, whatever
  // its hooks made ready first: the last tensor's parts first, a tensor's
  // parts in the model's order. Here the hooks report the tensors in the
  // model's order, the opposite of backward's.
  config_.set_mode(v1::MODE_SYNC);
  // W1 of 3.2 MB: 13 parts; W2 and the biases in a few more.
  std::unique_ptr<Held> held;
  ASSERT_NO_FATAL_FAILURE(ServeHeld(1024, 256 << 10, &held));
  ParameterClient& client = *held->client;
  ASSERT_LT(PartsOf(map_).size() * ParameterClient::kPartBytes, ParameterClient::kInFlightBytes)
      << "the credit must not bind here";

  // Each shard's parts in backward's order.
  std::vector<CutPart> order = PartsOf(map_);
  std::stable_sort(order.begin(), order.end(), [&](const CutPart& a, const CutPart& b) {
    return map_.chunks(a.first).tensor_index() > map_.chunks(b.first).tensor_index();
  });
  // The parts each shard may have by now: its parts in that order up to the
  // first one with a tensor not yet ready.
  auto due = [&](uint32_t shard, const std::set<uint32_t>& ready) {
    std::set<uint32_t> firsts;
    for (const CutPart& part : order) {
      if (map_.chunks(part.first).shard() != shard) continue;
      for (uint32_t id : part.chunks)
        if (ready.count(map_.chunks(id).tensor_index()) == 0) return firsts;
      firsts.insert(part.first);
    }
    return firsts;
  };
  ServedShard* served[2] = {held->shards[0].get(), held->shards[1].get()};
  auto seen = [&](uint32_t shard) {
    std::set<uint32_t> firsts;
    for (const SeenPush& p : served[shard]->service->pushes()) firsts.insert(p.first_chunk);
    return firsts;
  };

  std::vector<float> grads(client.num_parameters(), 0.1f);
  std::vector<float> params(client.num_parameters(), 0.0f);
  ParameterClient::Ticket ticket =
      client.StagePush(0, grads.data(), 1, params.data(), absl::Seconds(30));
  std::set<uint32_t> ready;
  bool held_back = false;  // some ready part waited for a later tensor's
  for (int t = 0; t < map_.tensors_size(); ++t) {
    SCOPED_TRACE(absl::StrCat("tensors 0 to ", t, " ready"));
    ASSERT_TRUE(client.TensorReady(ticket, t).ok());
    ready.insert(t);
    for (uint32_t shard : {0u, 1u}) {
      const std::set<uint32_t> want = due(shard, ready);
      for (int i = 0; i < 500 && seen(shard).size() < want.size(); ++i)
        absl::SleepFor(absl::Milliseconds(10));
    }
    absl::SleepFor(absl::Milliseconds(200));  // time for a part out of turn to show
    for (uint32_t shard : {0u, 1u}) {
      EXPECT_EQ(seen(shard), due(shard, ready)) << "shard " << shard;
      size_t ready_parts = 0;
      for (const CutPart& part : order) {
        bool all = map_.chunks(part.first).shard() == shard;
        for (uint32_t id : part.chunks) all = all && ready.count(map_.chunks(id).tensor_index());
        ready_parts += all;
      }
      held_back = held_back || ready_parts > seen(shard).size();
    }
  }
  EXPECT_TRUE(held_back) << "the model's order made no part wait: the test shows nothing";
  held->Release();
  absl::StatusOr<ParameterClient::PushOutcome> pushed = client.Wait(ticket, {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(seen(0).size() + seen(1).size(), order.size());
}

TEST(RetryNotice, SaysWhatIsSentAgainOnceItHasBeenRefusedForTenSecondsAndEveryTenAfter) {
  CapturedLog log;
  absl::Time now = absl::UnixEpoch();
  RetryNotice notice([&] { return now; });
  const absl::Status refused = absl::ResourceExhaustedError("Received RST_STREAM");
  // Refused every 2 s (the backoff's most) for 35 s: said at 10, 20 and 30.
  for (int i = 0; i <= 17; ++i, now += absl::Seconds(2))
    notice.Refused("a push of step 0 to shard 1", refused);
  const std::vector<std::string> lines = log.Lines();
  ASSERT_EQ(lines.size(), 3u) << absl::StrJoin(lines, "\n");
  EXPECT_THAT(lines[0], HasSubstr("[warning] a push of step 0 to shard 1 has been refused for 10s "
                                  "and is sent again: RESOURCE_EXHAUSTED: Received RST_STREAM"));
  EXPECT_THAT(lines[1], HasSubstr("refused for 20s"));
  EXPECT_THAT(lines[2], HasSubstr("refused for 30s"));
}

TEST(RetryNotice, SaysNothingOfARefusalThatEndsWithinTenSeconds) {
  CapturedLog log;
  absl::Time now = absl::UnixEpoch();
  RetryNotice notice([&] { return now; });
  for (int i = 0; i < 5; ++i, now += absl::Seconds(2))
    notice.Refused("a push", absl::UnavailableError("shard restarting"));
  EXPECT_TRUE(log.Lines().empty());
}

TEST(ParameterClientCredit, IsThreeRoundTripsOfTheMeasuredRateWithinItsBounds) {
  // 60 MB in 1 s, the quickest part 40 ms: 2.4 MB a round trip, three of them.
  EXPECT_NEAR(static_cast<double>(ParameterClient::CreditFor(60'000'000, absl::Seconds(1),
                                                             absl::Milliseconds(40))),
              7.2e6, 1);
  // 200 Mbit/s namespace hosts, 2 workers: 23.3 MB a step in 1.2 s, a part
  // 45 ms (2.6 MB): at least kMinCredit.
  EXPECT_EQ(ParameterClient::CreditFor(23'300'000, absl::Seconds(1.2), absl::Milliseconds(45)),
            ParameterClient::kMinCredit);
  // 10 Gbit/s and 13 ms: at most kInFlightBytes.
  EXPECT_EQ(ParameterClient::CreditFor(1'250'000'000, absl::Seconds(1), absl::Milliseconds(13)),
            ParameterClient::kInFlightBytes);
  // Nothing measured: the most.
  EXPECT_EQ(ParameterClient::CreditFor(0, absl::ZeroDuration(), absl::InfiniteDuration()),
            ParameterClient::kInFlightBytes);
}

TEST_F(ParameterClientTest, PushRetriedAfterUnavailableGoesToTheNewEndpoint) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> new1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && new1);
  ParameterClient client(config_, MapWith(shard0->address, DeadAddress(), 1), 0, 1);
  std::vector<float> grads(client.num_parameters(), 0.1f);

  absl::Notification retrying;
  ParameterClient::RetryPolicy retry;
  retry.retry_for = absl::Seconds(60);
  retry.stop = [&] {
    if (!retrying.HasBeenNotified()) retrying.Notify();
    return false;
  };
  absl::StatusOr<ParameterClient::PushOutcome> pushed;
  std::thread pusher([&] { pushed = client.Push(3, grads.data(), 1, retry); });
  // The stop predicate is polled only after a failed attempt.
  const bool saw_retry = retrying.WaitForNotificationWithTimeout(absl::Seconds(20));
  absl::Status updated =
      client.UpdateShardMap(MapWith(shard0->address, new1->address, 2));
  pusher.join();
  ASSERT_TRUE(saw_retry);
  ASSERT_TRUE(updated.ok()) << updated;
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(new1->service->push_generations().size(), 1u);
  EXPECT_EQ(shard0->service->push_generations().size(), 1u);
}

TEST_F(ParameterClientTest, PushesAndPullsCarryTheGeneration) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && shard1);
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  std::vector<float> buffer(client.num_parameters(), 0.1f);
  EXPECT_EQ(client.generation(), 0u);
  client.set_generation(7);
  ASSERT_TRUE(client.Pull(0, absl::Seconds(5), buffer.data()).ok());
  ASSERT_TRUE(client.Push(0, buffer.data(), 1, absl::Seconds(5)).ok());
  client.set_generation(9);
  ASSERT_TRUE(client.Pull(1, absl::Seconds(5), buffer.data()).ok());
  ASSERT_TRUE(client.Push(1, buffer.data(), 1, absl::Seconds(5)).ok());
  for (FakeShard* shard : {shard0->service.get(), shard1->service.get()}) {
    EXPECT_EQ(shard->pull_generations(), (std::vector<uint64_t>{7, 9}));
    EXPECT_EQ(shard->push_generations(), (std::vector<uint64_t>{7, 9}));
  }
}

TEST_F(ParameterClientTest, AbortedPushIsReturnedAsItIsWithoutRetrying) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && shard1);
  shard1->service->FailPushesWith(
      absl::AbortedError("job rolled back to checkpoint 2 (generation 3)"));
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  std::vector<float> grads(client.num_parameters(), 0.1f);
  absl::StatusOr<ParameterClient::PushOutcome> pushed =
      client.Push(0, grads.data(), 1, absl::Seconds(60));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kAborted) << pushed.status();
  EXPECT_EQ(shard1->service->push_generations().size(), 1u);
}

TEST_F(ParameterClientTest, PushRefusedForMemoryIsRetriedUntilTheShardTakesIt) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && shard1);
  // What a shard's gRPC answers while its memory quota is used up (by
  // somebody else's big messages).
  shard1->service->FailPushesWith(
      absl::ResourceExhaustedError("Received RST_STREAM with error code 11"));
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  std::vector<float> grads(client.num_parameters(), 0.1f);
  ParameterClient::RetryPolicy retry;
  retry.retry_for = absl::Seconds(60);
  retry.stop = [&] {  // after the first refusal, the memory is free again
    shard1->service->FailPushesWith(absl::OkStatus());
    return false;
  };
  absl::StatusOr<ParameterClient::PushOutcome> pushed =
      client.Push(0, grads.data(), 1, retry);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(shard1->service->push_generations().size(), 2u);
  EXPECT_EQ(shard0->service->push_generations().size(), 1u);
  // Refused before the shard read it: the retry keeps its lane.
  const std::vector<SeenPush> seen = shard1->service->pushes();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0].lane_nonce, 0u);
  EXPECT_EQ(seen[1].lane_nonce, seen[0].lane_nonce);
}

TEST_F(ParameterClientTest, StopPredicateEndsARetryingPushQuickly) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  ASSERT_TRUE(shard0);
  ParameterClient client(config_, MapWith(shard0->address, DeadAddress(), 1), 0, 1);
  std::vector<float> grads(client.num_parameters(), 0.1f);
  std::atomic<int> polls{0};
  ParameterClient::RetryPolicy retry;
  retry.retry_for = absl::Seconds(60);
  retry.stop = [&] { return ++polls >= 3; };  // after a few failed attempts
  const absl::Time start = absl::Now();
  absl::StatusOr<ParameterClient::PushOutcome> pushed =
      client.Push(0, grads.data(), 1, retry);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kCancelled) << pushed.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_GE(polls.load(), 3);
}

TEST_F(ParameterClientTest, UnavailableShardIsRetriedOnlyForRetryFor) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  ASSERT_TRUE(shard0);
  ParameterClient client(config_, MapWith(shard0->address, DeadAddress(), 1), 0, 1);
  std::vector<float> grads(client.num_parameters(), 0.1f);
  absl::StatusOr<ParameterClient::PushOutcome> pushed =
      client.Push(0, grads.data(), 1, absl::Milliseconds(300));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kUnavailable) << pushed.status();
}

TEST_F(ParameterClientTest, UpdateShardMapRefusesOtherChunksAndMissingAddresses) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0.5f);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 1.0f);
  ASSERT_TRUE(shard0 && shard1);
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);

  v1::ShardMap missing = MapWith(shard0->address, "", 2);
  EXPECT_EQ(client.UpdateShardMap(missing).code(), absl::StatusCode::kInvalidArgument);
  v1::ShardMap dropped = MapWith(shard0->address, shard1->address, 2);
  dropped.mutable_shards()->RemoveLast();
  EXPECT_EQ(client.UpdateShardMap(dropped).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::ShardMap> recut =
      BuildShardMap(ModelTensors(config_), 2, config_.chunk_bytes() * 4);
  ASSERT_TRUE(recut.ok());
  recut->mutable_shards(0)->set_address(shard0->address);
  recut->mutable_shards(1)->set_address("127.0.0.1:1");
  recut->set_epoch(2);
  EXPECT_EQ(client.UpdateShardMap(*recut).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(client.map_epoch(), 1u);
  EXPECT_EQ(PulledValueOfShard(client, 1), 1.0f);  // still the old endpoint
}

TEST_F(ParameterClientTest, FitShardMapTellsAMovedShardFromAReShardingFromAnotherModel) {
  const v1::ShardMap layout = MapWith("127.0.0.1:1", "127.0.0.1:2", 1);
  absl::StatusOr<MapFit> moved = FitShardMap(layout, MapWith("127.0.0.1:1", "127.0.0.1:3", 2));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, MapFit::kSameLayout);

  // The same chunks on three shards, or on the same two otherwise.
  absl::StatusOr<MapFit> three = FitShardMap(layout, ReShardedMap(3, 2));
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(*three, MapFit::kReplaced);
  v1::ShardMap swapped = MapWith("127.0.0.1:1", "127.0.0.1:2", 2);
  swapped.mutable_chunks(0)->set_shard(1 - swapped.chunks(0).shard());
  absl::StatusOr<MapFit> placed = FitShardMap(layout, swapped);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(*placed, MapFit::kReplaced);

  // Another model, another cut, a shard without an address: no fit.
  v1::JobConfig other = config_;
  other.add_hidden_units(8);
  absl::StatusOr<v1::ShardMap> model =
      BuildShardMap(ModelTensors(other), 3, config_.chunk_bytes());
  ASSERT_TRUE(model.ok());
  for (v1::ShardEndpoint& e : *model->mutable_shards()) e.set_address("127.0.0.1:1");
  EXPECT_EQ(FitShardMap(layout, *model).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::ShardMap> recut =
      BuildShardMap(ModelTensors(config_), 3, config_.chunk_bytes() * 4);
  ASSERT_TRUE(recut.ok());
  for (v1::ShardEndpoint& e : *recut->mutable_shards()) e.set_address("127.0.0.1:1");
  EXPECT_EQ(FitShardMap(layout, *recut).status().code(), absl::StatusCode::kInvalidArgument);
  v1::ShardMap missing = ReShardedMap(3, 2);
  missing.mutable_shards(2)->clear_address();
  EXPECT_EQ(FitShardMap(layout, missing).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ParameterClientTest, UpdateShardMapRefusesAReShardingWhichNeedsANewClient) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0.5f);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 1.0f);
  ASSERT_TRUE(shard0 && shard1);
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  v1::ShardMap three = ReShardedMap(3, 2);
  three.mutable_shards(0)->set_address(shard0->address);
  three.mutable_shards(1)->set_address(shard1->address);
  EXPECT_EQ(client.UpdateShardMap(three).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.map_epoch(), 1u);
  EXPECT_EQ(PulledValueOfShard(client, 1), 1.0f);
}

TEST_F(ParameterClientTest, ASparseClientSpreadsRowsOverItsMapsShardsNotTheJobsFirstCount) {
  v1::SparseTableSpec* table = config_.add_sparse_tables();
  table->set_name("rows");
  table->set_dim(FakeShard::kTableDim);
  // Re-sharded from the config's two shards to three.
  v1::ShardMap three = ReShardedMap(3, 2);
  std::vector<std::unique_ptr<ServedShard>> shards;
  for (uint32_t s = 0; s < 3; ++s) {
    shards.push_back(Serve(s, 0, &three));
    ASSERT_TRUE(shards.back());
    three.mutable_shards(s)->set_address(shards.back()->address);
  }
  SparseClient client(config_, three, 0, 1);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 60; ++id) ids.push_back(id);
  std::vector<float> rows(ids.size() * FakeShard::kTableDim, -1);
  absl::Status pulled = client.Pull("rows", ids, 0, absl::Seconds(5), rows.data());
  ASSERT_TRUE(pulled.ok()) << pulled;
  for (size_t i = 0; i < rows.size(); ++i)
    ASSERT_EQ(rows[i], static_cast<float>(ids[i / FakeShard::kTableDim])) << i;
  for (uint32_t s = 0; s < 3; ++s) {
    std::vector<int64_t> want;
    for (int64_t id : ids)
      if (SparseShardOf(id, 3) == s) want.push_back(id);
    EXPECT_FALSE(want.empty()) << "shard " << s;
    EXPECT_EQ(shards[s]->service->sparse_ids(), want) << "shard " << s;
  }
}

// Issue 43: a pull whose rows on a shard would pass gRPC's message limit
// goes in parts of at most 16 MiB of reply, and every row lands in its
// place. 2.2 million rows of 4 floats over 2 shards: about 1.1 million (17
// MiB of reply) each, so 2 parts a shard.
TEST_F(ParameterClientTest, APullPastTheMessageLimitGoesInPartsAndEveryRowLandsInPlace) {
  v1::SparseTableSpec* table = config_.add_sparse_tables();
  table->set_name("rows");
  table->set_dim(FakeShard::kTableDim);
  v1::ShardMap map = map_;
  std::vector<std::unique_ptr<ServedShard>> shards;
  for (uint32_t s = 0; s < 2; ++s) {
    shards.push_back(Serve(s, 0));
    ASSERT_TRUE(shards.back());
    map.mutable_shards(s)->set_address(shards.back()->address);
  }
  SparseClient client(config_, map, 0, 1);
  std::vector<int64_t> ids;
  for (int64_t id = 2200000; id > 0; --id) ids.push_back(id);  // not in the shards' order
  std::vector<float> rows(ids.size() * FakeShard::kTableDim, -1);
  absl::Status pulled = client.Pull("rows", ids, 0, absl::Seconds(30), rows.data());
  ASSERT_TRUE(pulled.ok()) << pulled;
  for (size_t i = 0; i < rows.size(); ++i)
    ASSERT_EQ(rows[i], static_cast<float>(ids[i / FakeShard::kTableDim])) << i;
  const size_t part_rows = (16 << 20) / (FakeShard::kTableDim * sizeof(float));
  size_t all = 0;
  for (uint32_t s = 0; s < 2; ++s) {
    const std::vector<int> sizes = shards[s]->service->sparse_pull_sizes();
    EXPECT_EQ(sizes.size(), 2u) << "shard " << s;
    for (int n : sizes) {
      EXPECT_LE(static_cast<size_t>(n), part_rows) << "shard " << s;
      all += n;
    }
  }
  EXPECT_EQ(all, ids.size());
  // A pull with no rows still asks every shard (its version) once.
  ASSERT_TRUE(client.Pull("rows", {}, 0, absl::Seconds(5), rows.data()).ok());
  for (uint32_t s = 0; s < 2; ++s)
    EXPECT_EQ(shards[s]->service->sparse_pull_sizes().back(), 0) << "shard " << s;
}

TEST_F(ParameterClientTest, AShardThatCannotUseTheLaneGetsThePushInBytesAndNoLaneAfter) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && shard1);
  shard1->service->RefuseLanes();
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  ASSERT_TRUE(client.LaneUsable(0) && client.LaneUsable(1));
  std::vector<float> grads(client.num_parameters(), 0.1f);
  ASSERT_TRUE(client.Push(0, grads.data(), 1, absl::Seconds(5)).ok());
  ASSERT_TRUE(client.Push(1, grads.data(), 1, absl::Seconds(5)).ok());

  // Refused once, at once sent again in bytes, and bytes from then on.
  const std::vector<SeenPush> refused = shard1->service->pushes();
  ASSERT_EQ(refused.size(), 3u);
  EXPECT_NE(refused[0].lane_nonce, 0u);
  EXPECT_FALSE(refused[0].bytes);
  for (size_t i : {1, 2}) {
    EXPECT_EQ(refused[i].lane_nonce, 0u) << i;
    EXPECT_TRUE(refused[i].bytes) << i;
  }
  EXPECT_FALSE(client.LaneUsable(1));
  // The other shard keeps its lane.
  const std::vector<SeenPush> kept = shard0->service->pushes();
  ASSERT_EQ(kept.size(), 2u);
  for (const SeenPush& p : kept) {
    EXPECT_NE(p.lane_nonce, 0u);
    EXPECT_FALSE(p.bytes);
  }
  EXPECT_TRUE(client.LaneUsable(0));
}

TEST_F(ParameterClientTest, ALaneCallThatFailsIsSentAgainOnAFreshLane) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && shard1);
  shard1->service->FailPushesWith(absl::UnavailableError("restarting"));
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  std::vector<float> grads(client.num_parameters(), 0.1f);
  ParameterClient::RetryPolicy retry;
  retry.retry_for = absl::Seconds(60);
  retry.stop = [&] {  // after the first failure the shard is back
    shard1->service->FailPushesWith(absl::OkStatus());
    return false;
  };
  ASSERT_TRUE(client.Push(0, grads.data(), 1, retry).ok());
  // The shard may still write the failed call's place late: the retry, and
  // every push after it, uses another lane.
  const std::vector<SeenPush> seen = shard1->service->pushes();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_NE(seen[0].lane_nonce, 0u);
  EXPECT_NE(seen[1].lane_nonce, 0u);
  EXPECT_NE(seen[0].lane_nonce, seen[1].lane_nonce);
  ASSERT_TRUE(client.Push(1, grads.data(), 1, absl::Seconds(5)).ok());
  EXPECT_EQ(shard0->service->pushes().back().lane_nonce, seen[1].lane_nonce);
  EXPECT_TRUE(client.LaneUsable(1));
}

TEST_F(ParameterClientTest, AJobThatAsksForGrpcSendsEveryByteInTheMessage) {
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && shard1);
  config_.set_local_transport(v1::LOCAL_TRANSPORT_GRPC);
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  EXPECT_FALSE(client.LaneUsable(0));
  std::vector<float> grads(client.num_parameters(), 0.1f);
  ASSERT_TRUE(client.Push(0, grads.data(), 1, absl::Seconds(5)).ok());
  for (ServedShard* shard : {shard0.get(), shard1.get()}) {
    ASSERT_EQ(shard->service->pushes().size(), 1u);
    EXPECT_EQ(shard->service->pushes()[0].lane_nonce, 0u);
    EXPECT_TRUE(shard->service->pushes()[0].bytes);
  }
  EXPECT_EQ(client.lane_bytes(), 0u);
}

TEST_F(ParameterClientTest, EachShardGetsEveryPartOfAPushOnOneConnection) {
  // A shard's parts leave one after the other only on one connection: on
  // two, two of them share the link at once and both arrive late
  // (ParameterClient's header).
  config_.set_local_transport(v1::LOCAL_TRANSPORT_GRPC);
  ASSERT_NO_FATAL_FAILURE(UseModel(1024, 16 << 10));
  std::unique_ptr<ServedShard> shard0 = Serve(0, 0);
  std::unique_ptr<ServedShard> shard1 = Serve(1, 0);
  ASSERT_TRUE(shard0 && shard1);
  ParameterClient client(config_, MapWith(shard0->address, shard1->address, 1), 0, 1);
  std::vector<float> grads(client.num_parameters(), 0.1f);
  for (int step = 0; step < 2; ++step)
    ASSERT_TRUE(client.Push(step, grads.data(), 1, absl::Seconds(5)).ok());
  for (ServedShard* shard : {shard0.get(), shard1.get()}) {
    const std::vector<SeenPush> pushes = shard->service->pushes();
    ASSERT_GE(pushes.size(), 2u * 4) << "at least 4 parts a push";
    std::set<std::string> peers;
    for (const SeenPush& p : pushes) peers.insert(p.peer);
    EXPECT_EQ(peers.size(), 1u) << "the parts came on " << peers.size() << " connections";
  }
}

}  // namespace
}  // namespace grps
