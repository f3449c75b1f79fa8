// MessagePool: a released pair comes back cleared with its room kept; what
// it keeps is bounded in pairs and in bytes.
#include "server/message_pool.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/grps.pb.h"

namespace grps {
namespace {

using Pool = MessagePool<v1::SparsePushRequest, v1::SparsePullResponse>;

TEST(MessagePool, AReleasedPairComesBackClearedWithItsRoom) {
  Pool pool;
  grpc::MessageHolder<v1::SparsePushRequest, v1::SparsePullResponse>* h = pool.AllocateMessages();
  v1::SparsePushRequest* request = h->request();
  v1::SparsePullResponse* response = h->response();
  request->set_table("emb");
  for (int64_t id = 0; id < 1000; ++id) request->add_ids(id);
  request->set_gradients(std::string(64000, 'g'));
  response->set_values(std::string(64000, 'v'));
  response->set_version(9);
  h->Release();
  EXPECT_EQ(pool.kept(), 1u);

  grpc::MessageHolder<v1::SparsePushRequest, v1::SparsePullResponse>* again =
      pool.AllocateMessages();
  ASSERT_EQ(again, h);
  EXPECT_EQ(pool.kept(), 0u);
  EXPECT_EQ(again->request()->ByteSizeLong(), 0u) << "cleared";
  EXPECT_EQ(again->response()->ByteSizeLong(), 0u) << "cleared";
  EXPECT_GE(again->request()->ids().Capacity(), 1000);
  EXPECT_GE(again->request()->gradients().capacity(), 64000u);
  EXPECT_GE(again->response()->values().capacity(), 64000u);
  again->Release();
}

TEST(MessagePool, ItKeepsAtMostKKeptPairsAndNoneTooBig) {
  Pool pool;
  std::vector<grpc::MessageHolder<v1::SparsePushRequest, v1::SparsePullResponse>*> held;
  for (size_t i = 0; i < Pool::kKept + 3; ++i) held.push_back(pool.AllocateMessages());
  for (auto* h : held) h->Release();
  EXPECT_EQ(pool.kept(), Pool::kKept);

  Pool big_pool;
  auto* big = big_pool.AllocateMessages();
  big->response()->set_values(std::string(Pool::kMaxKeptBytes + 1, 'v'));
  big->Release();
  EXPECT_EQ(big_pool.kept(), 0u) << "a pair holding more than kMaxKeptBytes is freed";
}

}  // namespace
}  // namespace grps
