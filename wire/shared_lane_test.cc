// Shared-memory lanes: what a shard maps, what it refuses to map, and how
// a lane travels in a push.
#include "wire/shared_lane.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/chunk_codec.h"

namespace grps {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<LaneSegment> NewLane(uint64_t value_bytes) {
  absl::StatusOr<std::shared_ptr<LaneSegment>> lane = LaneSegment::Create(value_bytes);
  EXPECT_TRUE(lane.ok()) << lane.status();
  return lane.ok() ? *lane : nullptr;
}

TEST(SharedLane, AShardSeesWhatTheWorkerWroteAndTheWorkerWhatTheShardWrote) {
  std::shared_ptr<LaneSegment> lane = NewLane(4096);
  ASSERT_NE(lane, nullptr);
  EXPECT_EQ(lane->size(), kLaneHeaderBytes + 4096);
  std::memcpy(lane->base() + kLaneHeaderBytes, "gradient", 8);

  absl::StatusOr<std::shared_ptr<MappedLane>> mapped = MappedLane::Open(lane->Ref());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  absl::StatusOr<char*> at = (*mapped)->At(kLaneHeaderBytes, 8);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(std::string(*at, 8), "gradient");
  // Two mappings of one memfd: the shard's write is the worker's read.
  std::memcpy(*(*mapped)->At(kLaneHeaderBytes + 100, 7), "weights", 7);
  EXPECT_EQ(std::string(lane->base() + kLaneHeaderBytes + 100, 7), "weights");
  EXPECT_TRUE((*mapped)->Names(lane->Ref()));
}

TEST(SharedLane, PlacesOutsideTheValuesAreRefused) {
  std::shared_ptr<LaneSegment> lane = NewLane(1024);
  ASSERT_NE(lane, nullptr);
  absl::StatusOr<std::shared_ptr<MappedLane>> mapped = MappedLane::Open(lane->Ref());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const MappedLane& m = **mapped;
  EXPECT_TRUE(m.At(kLaneHeaderBytes, 1024).ok());
  EXPECT_TRUE(m.At(lane->size(), 0).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(m.At(0, 8).status())) << "the header is not values";
  EXPECT_TRUE(absl::IsInvalidArgument(m.At(kLaneHeaderBytes, 1025).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(m.At(lane->size() + 1, 0).status()));
  // offset + bytes wraps around 2^64: still refused.
  EXPECT_TRUE(absl::IsInvalidArgument(m.At(kLaneHeaderBytes + 8, ~uint64_t{0} - 4).status()));
}

TEST(SharedLane, ALaneNamedWithAnotherNonceOrSizeIsNotMapped) {
  std::shared_ptr<LaneSegment> lane = NewLane(1024);
  ASSERT_NE(lane, nullptr);
  v1::SharedLane other_nonce = lane->Ref();
  other_nonce.set_nonce(other_nonce.nonce() ^ 1);
  absl::Status s = MappedLane::Open(other_nonce).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("nonce"));

  v1::SharedLane other_size = lane->Ref();
  other_size.set_size(other_size.size() + 4096);
  s = MappedLane::Open(other_size).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("bytes"));
}

TEST(SharedLane, NamesThatLeadToNoLaneAreRefusedWithoutOpeningAnything) {
  std::shared_ptr<LaneSegment> lane = NewLane(1024);
  ASSERT_NE(lane, nullptr);
  // A process that does not exist (pid_max is at most 2^22).
  v1::SharedLane gone = lane->Ref();
  gone.set_pid(1u << 23);
  EXPECT_TRUE(absl::IsFailedPrecondition(MappedLane::Open(gone).status()));
  // A descriptor of this process that is a plain file, not a lane.
  char path[] = "/tmp/grps-lane-test-XXXXXX";
  const int file = mkstemp(path);
  ASSERT_GE(file, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(file, lane->size()), 0);
  v1::SharedLane not_a_lane = lane->Ref();
  not_a_lane.set_fd(file);
  absl::Status s = MappedLane::Open(not_a_lane).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not a grps lane"));
  close(file);
  // Malformed names.
  v1::SharedLane bad = lane->Ref();
  bad.set_fd(-1);
  EXPECT_TRUE(absl::IsFailedPrecondition(MappedLane::Open(bad).status()));
  bad = lane->Ref();
  bad.set_size(kMaxLaneBytes + 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(MappedLane::Open(bad).status()));
}

TEST(SharedLane, AnUnsealedMemfdIsRefused) {
  // Named like a lane, but it could shrink under the shard's mapping (a
  // fault on every access past its new end).
  const int fd = memfd_create("grps-lane", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  v1::SharedLane ref;
  ref.set_pid(static_cast<uint32_t>(getpid()));
  ref.set_fd(fd);
  ref.set_size(4096);
  absl::Status s = MappedLane::Open(ref).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not sealed"));
  close(fd);
}

TEST(SharedLane, TheTableKeepsOneLanePerRankAndFollowsANewOne) {
  std::shared_ptr<LaneSegment> first = NewLane(1024), second = NewLane(1024);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  LaneTable table;
  absl::StatusOr<std::shared_ptr<MappedLane>> a = table.Get(3, first->Ref());
  absl::StatusOr<std::shared_ptr<MappedLane>> again = table.Get(3, first->Ref());
  ASSERT_TRUE(a.ok() && again.ok());
  EXPECT_EQ(a->get(), again->get()) << "mapped once";
  absl::StatusOr<std::shared_ptr<MappedLane>> b = table.Get(3, second->Ref());
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->get(), b->get());
  EXPECT_TRUE((*b)->Names(second->Ref()));
  // A refused lane leaves the rank's lane as it was.
  v1::SharedLane wrong = second->Ref();
  wrong.set_nonce(wrong.nonce() + 1);
  EXPECT_FALSE(table.Get(3, wrong).ok());
  absl::StatusOr<std::shared_ptr<MappedLane>> still = table.Get(3, second->Ref());
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->get(), b->get());
}

// Calls of one worker that name its new lane at the same moment (the first
// push of a step, one call per part) share one mapping: a shard holds one
// lane per worker, whichever call maps it first.
TEST(SharedLane, CallsNamingANewLaneAtOnceShareOneMapping) {
  constexpr int kThreads = 8;
  for (int round = 0; round < 20; ++round) {
    std::shared_ptr<LaneSegment> lane = NewLane(8 << 20);
    ASSERT_NE(lane, nullptr);
    LaneTable table;
    std::vector<const MappedLane*> got(kThreads, nullptr);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) {
        }
        absl::StatusOr<std::shared_ptr<MappedLane>> mapped = table.Get(0, lane->Ref());
        if (mapped.ok()) got[t] = mapped->get();
      });
    for (std::thread& t : threads) t.join();
    ASSERT_NE(got[0], nullptr);
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], got[0]) << "thread " << t;
    EXPECT_TRUE(table.IsCurrent(0, got[0]));
  }
}

TEST(SharedLane, APushNamesItsLaneAndChunkPlacesAsProtobufReadsThem) {
  std::shared_ptr<LaneSegment> lane = NewLane(1024);
  ASSERT_NE(lane, nullptr);
  v1::PushRequest header;
  header.set_job_id("job");
  header.set_worker_rank(1);
  header.set_pull(true);
  *header.mutable_lane() = lane->Ref();
  header.mutable_lane()->set_reply_offset(kLaneHeaderBytes + 512);
  std::vector<WireChunk> chunks(2);
  chunks[0].chunk_id = 4;
  chunks[0].lane_offset = kLaneHeaderBytes;
  chunks[1].chunk_id = 6;
  chunks[1].lane_offset = kLaneHeaderBytes + 256;
  const grpc::ByteBuffer encoded = EncodePushRequest(header, v1::DTYPE_F32, chunks);

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(encoded.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.lane().SerializeAsString(), header.lane().SerializeAsString());
  ASSERT_EQ(parsed.chunks_size(), 2);
  EXPECT_EQ(parsed.chunks(0).lane_offset(), kLaneHeaderBytes);
  EXPECT_EQ(parsed.chunks(1).lane_offset(), kLaneHeaderBytes + 256);
  EXPECT_TRUE(parsed.chunks(0).data().empty());

  v1::PushRequest decoded;
  std::vector<uint64_t> offsets;
  ASSERT_TRUE(DecodePushRequest(encoded, &decoded, [&](ReceivedChunk& c) {
                offsets.push_back(c.lane_offset);
                EXPECT_TRUE(c.data.AtEnd());
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(decoded.lane().SerializeAsString(), header.lane().SerializeAsString());
  EXPECT_EQ(offsets, (std::vector<uint64_t>{kLaneHeaderBytes, kLaneHeaderBytes + 256}));
}

}  // namespace
}  // namespace grps
