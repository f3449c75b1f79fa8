#include "wire/chunk_codec.h"
#include "wire/wire_format.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/grps.pb.h"

namespace grps {
namespace {

// `bytes` cut into slices of `piece` bytes (the last one shorter), as gRPC
// may hand a received message over.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += piece)
    slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::vector<float> Ramp(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + 0.25f * static_cast<float>(i);
  return v;
}

TEST(ChunkCodec, PushRequestIsWhatProtobufReads) {
  const std::vector<float> a = Ramp(1000, -3), b = Ramp(7, 100);
  v1::PushRequest header;
  header.set_job_id("job-7");
  header.set_worker_rank(3);
  header.set_incarnation(1234567890123ull);
  header.set_step(0);  // zero: omitted on the wire, read back as zero
  header.set_num_samples(64);
  header.set_generation(5);
  header.set_pull(true);
  header.set_pull_timeout_ms(2000);
  header.set_pull_dtype(v1::DTYPE_BF16);
  std::vector<WireChunk> chunks(2);
  chunks[0].chunk_id = 0;
  chunks[0].version = 41;
  chunks[0].external = a.data();
  chunks[0].external_bytes = a.size() * sizeof(float);
  chunks[1].chunk_id = 9;
  chunks[1].version = 0;
  chunks[1].owned.assign(reinterpret_cast<const char*>(b.data()), b.size() * sizeof(float));

  const grpc::ByteBuffer encoded = EncodePushRequest(header, v1::DTYPE_F32, std::move(chunks));
  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(BufferBytes(encoded)));
  EXPECT_EQ(parsed.job_id(), "job-7");
  EXPECT_EQ(parsed.worker_rank(), 3u);
  EXPECT_EQ(parsed.incarnation(), 1234567890123ull);
  EXPECT_EQ(parsed.step(), 0u);
  EXPECT_EQ(parsed.num_samples(), 64u);
  EXPECT_EQ(parsed.generation(), 5u);
  EXPECT_TRUE(parsed.pull());
  EXPECT_EQ(parsed.pull_timeout_ms(), 2000u);
  EXPECT_EQ(parsed.pull_dtype(), v1::DTYPE_BF16);
  ASSERT_EQ(parsed.chunks_size(), 2);
  EXPECT_EQ(parsed.chunks(0).chunk_id(), 0u);
  EXPECT_EQ(parsed.chunks(0).version(), 41u);
  EXPECT_EQ(parsed.chunks(0).dtype(), v1::DTYPE_F32);
  ASSERT_EQ(parsed.chunks(0).data().size(), a.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(parsed.chunks(0).data().data(), a.data(), a.size() * 4), 0);
  EXPECT_EQ(parsed.chunks(1).chunk_id(), 9u);
  EXPECT_EQ(std::memcmp(parsed.chunks(1).data().data(), b.data(), b.size() * 4), 0);
  // The same bytes protobuf itself would write.
  EXPECT_EQ(BufferBytes(encoded), parsed.SerializeAsString());
}

// A user model's initial values travel as a push with initial_values set,
// which both codecs read.
TEST(ChunkCodec, InitialValuesFlagIsWhatProtobufReadsAndDecodesBack) {
  const std::vector<float> a = Ramp(16, 1);
  v1::PushRequest header;
  header.set_job_id("job");
  header.set_num_samples(1);
  header.set_initial_values(true);
  std::vector<WireChunk> chunks(1);
  chunks[0].chunk_id = 2;
  chunks[0].external = a.data();
  chunks[0].external_bytes = a.size() * sizeof(float);
  const grpc::ByteBuffer encoded = EncodePushRequest(header, v1::DTYPE_F32, std::move(chunks));
  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(BufferBytes(encoded)));
  EXPECT_TRUE(parsed.initial_values());
  EXPECT_EQ(BufferBytes(encoded), parsed.SerializeAsString());
  v1::PushRequest decoded;
  size_t seen = 0;
  ASSERT_TRUE(DecodePushRequest(encoded, &decoded, [&](ReceivedChunk&) {
                ++seen;
                return absl::OkStatus();
              }).ok());
  EXPECT_TRUE(decoded.initial_values());
  EXPECT_EQ(seen, 1u);
  header.set_initial_values(false);
  EXPECT_FALSE(parsed.ParseFromString(BufferBytes(EncodePushRequest(header, v1::DTYPE_F32, {}))) &&
               parsed.initial_values());
}

// The program's optimizers travel in the header, each chunk naming its
// own: protobuf reads them, and they decode back.
TEST(ChunkCodec, ProgramOptimizersAreWhatProtobufReadsAndDecodeBack) {
  const std::vector<float> a = Ramp(8, 1);
  v1::PushRequest header;
  header.set_job_id("job");
  header.set_num_samples(1);
  for (float lr : {0.5f, 0.25f}) {
    v1::OptimizerConfig* o = header.add_optimizers();
    o->set_kind(v1::OPTIMIZER_ADAM);
    o->set_learning_rate(lr);
    o->set_decoupled_weight_decay(true);
  }
  std::vector<WireChunk> chunks(2);
  for (uint32_t i = 0; i < 2; ++i) {
    chunks[i].chunk_id = i;
    chunks[i].external = a.data();
    chunks[i].external_bytes = a.size() * sizeof(float);
  }
  chunks[0].optimizer = 2;  // chunks[1]: the job's
  const grpc::ByteBuffer encoded = EncodePushRequest(header, v1::DTYPE_F32, std::move(chunks));
  v1::PushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(BufferBytes(encoded)));
  EXPECT_EQ(BufferBytes(encoded), parsed.SerializeAsString());
  ASSERT_EQ(parsed.optimizers_size(), 2);
  EXPECT_FLOAT_EQ(parsed.optimizers(1).learning_rate(), 0.25f);
  EXPECT_EQ(parsed.chunks(0).optimizer(), 2u);
  EXPECT_EQ(parsed.chunks(1).optimizer(), 0u);
  v1::PushRequest decoded;
  std::vector<uint32_t> named;
  ASSERT_TRUE(DecodePushRequest(encoded, &decoded, [&](ReceivedChunk& c) {
                named.push_back(c.optimizer);
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(decoded.optimizers_size(), 2);
  EXPECT_TRUE(decoded.optimizers(0).decoupled_weight_decay());
  EXPECT_EQ(named, (std::vector<uint32_t>{2, 0}));
}

TEST(ChunkCodec, ExternalPayloadIsNotCopied) {
  const std::vector<float> a = Ramp(4096, 0);
  std::vector<WireChunk> chunks(1);
  chunks[0].external = a.data();
  chunks[0].external_bytes = a.size() * sizeof(float);
  const grpc::ByteBuffer encoded = EncodePullResponse(v1::DTYPE_F32, std::move(chunks));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(encoded.Dump(&slices).ok());
  bool points_at_values = false;
  for (const grpc::Slice& s : slices)
    points_at_values |= s.begin() == reinterpret_cast<const uint8_t*>(a.data());
  EXPECT_TRUE(points_at_values);
}

// A reply written by protobuf, cut at every slice size from 1 byte up, is
// decoded into the caller's array with the right values, versions and ids.
TEST(ChunkCodec, DecodesProtobufPullResponseAcrossAnySliceBoundary) {
  const std::vector<float> a = Ramp(33, 1), b = Ramp(5, -7);
  v1::PullResponse reply;
  v1::ChunkData* c = reply.add_chunks();
  c->set_chunk_id(4);
  c->set_dtype(v1::DTYPE_F32);
  c->set_version(12);
  c->set_data(std::string(reinterpret_cast<const char*>(a.data()), a.size() * 4));
  c = reply.add_chunks();
  c->set_chunk_id(6);
  c->set_dtype(v1::DTYPE_F32);
  c->set_version(13);
  c->set_data(std::string(reinterpret_cast<const char*>(b.data()), b.size() * 4));
  const std::string bytes = reply.SerializeAsString();
  for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, bytes.size()}) {
    SCOPED_TRACE(piece);
    std::vector<float> got_a(a.size()), got_b(b.size());
    std::vector<uint32_t> ids;
    std::string scratch;
    absl::Status s = DecodePullResponse(Sliced(bytes, piece), [&](ReceivedChunk& r) {
      ids.push_back(r.chunk_id);
      EXPECT_EQ(r.dtype, v1::DTYPE_F32);
      EXPECT_EQ(r.version, r.chunk_id == 4 ? 12u : 13u);
      std::vector<float>& dst = r.chunk_id == 4 ? got_a : got_b;
      return ReadValues(r.data, DType::kF32, dst.data(), dst.size(), &scratch);
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(ids, (std::vector<uint32_t>{4, 6}));
    EXPECT_EQ(got_a, a);
    EXPECT_EQ(got_b, b);
  }
}

TEST(ChunkCodec, ReadValuesConvertsHalfPrecision) {
  const std::vector<float> a = {1.0f, -2.5f, 0.125f, 65504.0f};
  std::string half(a.size() * 2, '\0');
  ConvertElements(a.data(), DType::kF32, half.data(), DType::kF16, a.size());
  std::vector<WireChunk> chunks(1);
  chunks[0].chunk_id = 2;
  chunks[0].owned = half;
  const std::string bytes = BufferBytes(EncodePullResponse(v1::DTYPE_F16, std::move(chunks)));
  std::vector<float> got(a.size());
  std::string scratch;
  absl::Status s = DecodePullResponse(Sliced(bytes, 3), [&](ReceivedChunk& r) {
    absl::StatusOr<DType> d = DTypeFromWire(r.dtype, false, "chunk");
    if (!d.ok()) return d.status();
    return ReadValues(r.data, *d, got.data(), got.size(), &scratch);
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(got, a);
}

TEST(ChunkCodec, WrongPayloadLengthIsDataLoss) {
  std::vector<WireChunk> chunks(1);
  chunks[0].owned = std::string(10, 'x');  // not a whole number of floats
  const grpc::ByteBuffer encoded = EncodePullResponse(v1::DTYPE_F32, std::move(chunks));
  std::vector<float> dst(3);
  std::string scratch;
  absl::Status s = DecodePullResponse(encoded, [&](ReceivedChunk& r) {
    return ReadValues(r.data, DType::kF32, dst.data(), dst.size(), &scratch);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
}

TEST(ChunkCodec, UnknownFieldsAreSkipped) {
  v1::PullResponse reply;
  v1::ChunkData* c = reply.add_chunks();
  c->set_chunk_id(1);
  c->set_data(std::string(8, '\0'));
  std::string bytes = reply.SerializeAsString();
  // Field 15 (varint 300) and field 16 (a string) around the chunk, and a
  // fixed32 and fixed64 field: a newer sender's additions.
  const std::string extra = std::string("\x78\xac\x02", 3) + std::string("\x82\x01\x02hi", 5) +
                            std::string("\x8d\x01\x01\x02\x03\x04", 6) +
                            std::string("\x91\x01\x01\x02\x03\x04\x05\x06\x07\x08", 10);
  bytes = extra + bytes + extra;
  int seen = 0;
  absl::Status s = DecodePullResponse(Sliced(bytes, 5), [&](ReceivedChunk& r) {
    ++seen;
    EXPECT_EQ(r.chunk_id, 1u);
    EXPECT_EQ(r.data.left(), 8u);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(seen, 1);
}

// Every prefix of a valid reply, and a few corruptions, are refused with
// DATA_LOSS or read as fewer chunks, never read out of bounds (run under
// ASan to see the "never").
TEST(ChunkCodec, TruncatedAndMalformedRepliesAreRefused) {
  v1::PullResponse reply;
  for (uint32_t id = 0; id < 3; ++id) {
    v1::ChunkData* c = reply.add_chunks();
    c->set_chunk_id(id);
    c->set_version(300 + id);
    c->set_data(std::string(40, static_cast<char>(id)));
  }
  const std::string bytes = reply.SerializeAsString();
  for (size_t n = 0; n < bytes.size(); ++n) {
    int seen = 0;
    absl::Status s = DecodePullResponse(Sliced(bytes.substr(0, n), 4), [&](ReceivedChunk& r) {
      ++seen;
      return absl::OkStatus();
    });
    EXPECT_TRUE(!s.ok() || seen < 3) << n;
    if (!s.ok()) EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
  for (const std::string& bad :
       {std::string("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),  // 11-byte varint
        std::string("\x0a\x7f", 2),                                           // length past the end
        std::string("\x0b", 1),                                               // group start
        std::string("\x00", 1)}) {                                            // field 0
    absl::Status s = DecodePullResponse(Sliced(bad, 1), [](ReceivedChunk&) {
      return absl::OkStatus();
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  }
}

TEST(ChunkCodec, DTypeMapping) {
  EXPECT_EQ(*DTypeFromWire(v1::DTYPE_BF16, false, "x"), DType::kBF16);
  EXPECT_EQ(*DTypeFromWire(v1::DTYPE_UNSPECIFIED, true, "x"), DType::kF32);
  EXPECT_EQ(DTypeFromWire(v1::DTYPE_UNSPECIFIED, false, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeFromWire(99, true, "x").status().code(), absl::StatusCode::kInvalidArgument);
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16})
    EXPECT_EQ(*DTypeFromWire(DTypeToWire(d), false, "x"), d);
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

TEST(ChunkCodec, PushResponseRoundTripsThroughProtobuf) {
  const std::vector<float> a = Ramp(9, 2);
  v1::PushResponse header;
  header.add_versions(5);
  header.add_versions(300);
  header.set_duplicates(1);
  header.set_late(2);
  header.set_too_stale(3);
  std::vector<WireChunk> chunks(1);
  chunks[0].chunk_id = 7;
  chunks[0].version = 6;
  chunks[0].external = a.data();
  chunks[0].external_bytes = a.size() * sizeof(float);
  const std::string bytes =
      BufferBytes(EncodePushResponse(header, v1::DTYPE_F32, std::move(chunks)));
  v1::PushResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.versions_size(), 2);
  EXPECT_EQ(parsed.versions(1), 300u);
  EXPECT_EQ(parsed.duplicates(), 1u);
  EXPECT_EQ(parsed.late(), 2u);
  EXPECT_EQ(parsed.too_stale(), 3u);
  ASSERT_EQ(parsed.chunks_size(), 1);
  EXPECT_EQ(parsed.chunks(0).chunk_id(), 7u);
  EXPECT_EQ(parsed.chunks(0).version(), 6u);

  // And protobuf's own bytes decode to the same, cut anywhere.
  v1::PushResponse decoded;
  std::vector<float> got(a.size());
  std::string scratch;
  absl::Status s = DecodePushResponse(Sliced(parsed.SerializeAsString(), 3), &decoded,
                                      [&](ReceivedChunk& r) {
                                        EXPECT_EQ(r.chunk_id, 7u);
                                        EXPECT_EQ(r.version, 6u);
                                        return ReadValues(r.data, DType::kF32, got.data(),
                                                          got.size(), &scratch);
                                      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(decoded.duplicates(), 1u);
  EXPECT_EQ(decoded.late(), 2u);
  EXPECT_EQ(decoded.too_stale(), 3u);
  EXPECT_EQ(got, a);
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

TEST(ChunkCodec, DecodesAProtobufPushRequest) {
  v1::PushRequest request;
  request.set_job_id("job-9");
  request.set_worker_rank(2);
  request.set_incarnation(77);
  request.set_step(1000000000000ull);
  request.set_num_samples(32);
  request.set_generation(3);
  request.set_pull(true);
  request.set_pull_timeout_ms(1500);
  request.set_pull_dtype(v1::DTYPE_F16);
  const std::vector<float> a = Ramp(17, -1);
  v1::ChunkData* c = request.add_chunks();
  c->set_chunk_id(11);
  c->set_dtype(v1::DTYPE_F32);
  c->set_version(8);
  c->set_data(std::string(reinterpret_cast<const char*>(a.data()), a.size() * 4));
  v1::PushRequest header;
  std::vector<float> got(a.size());
  std::string scratch;
  int chunks = 0;
  absl::Status s = DecodePushRequest(Sliced(request.SerializeAsString(), 6), &header,
                                     [&](ReceivedChunk& r) {
                                       ++chunks;
                                       EXPECT_EQ(r.chunk_id, 11u);
                                       EXPECT_EQ(r.version, 8u);
                                       return ReadValues(r.data, DType::kF32, got.data(),
                                                         got.size(), &scratch);
                                     });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(chunks, 1);
  EXPECT_EQ(got, a);
  request.clear_chunks();
  EXPECT_EQ(header.SerializeAsString(), request.SerializeAsString());
}

// Ids of every varint length, negative ones (ten bytes) included.
std::vector<int64_t> AwkwardIds() {
  return {0, 1, 127, 128, 16383, 16384, -1, INT64_MIN, INT64_MAX, 1ll << 35, -(1ll << 40), 42};
}

TEST(SparseCodec, PushRequestIsWhatProtobufReads) {
  const std::vector<int64_t> ids = AwkwardIds();
  const std::vector<float> grads = Ramp(ids.size() * 4, -2);
  v1::SparsePushRequest header;
  header.set_job_id("job-s");
  header.set_worker_rank(2);
  header.set_incarnation(77);
  header.set_step(0);  // omitted on the wire, read back as zero
  header.set_table("emb");
  header.set_dtype(v1::DTYPE_F32);
  header.set_version(9);
  header.set_generation(3);
  std::string packed;
  PackVarints(ids, &packed);
  const std::string bytes(reinterpret_cast<const char*>(grads.data()),
                          grads.size() * sizeof(float));
  const grpc::ByteBuffer encoded = EncodeSparsePushRequest(header, packed, bytes);

  v1::SparsePushRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(BufferBytes(encoded)));
  v1::SparsePushRequest expected = header;
  for (int64_t id : ids) expected.add_ids(id);
  expected.set_gradients(bytes);
  EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
  EXPECT_EQ(encoded.Length(), expected.ByteSizeLong());  // the same bytes protobuf writes
}

TEST(SparseCodec, DecodesProtobufPushRequestsPackedOrNotAcrossAnySliceBoundary) {
  const std::vector<int64_t> ids = AwkwardIds();
  const std::vector<float> grads = Ramp(ids.size() * 4, 5);
  v1::SparsePushRequest message;
  message.set_job_id("job-s");
  message.set_worker_rank(1);
  message.set_incarnation(5);
  message.set_step(12);
  message.set_table("emb");
  message.set_dtype(v1::DTYPE_F32);
  message.set_version(8);
  message.set_generation(2);
  for (int64_t id : ids) message.add_ids(id);
  message.set_gradients(
      std::string(reinterpret_cast<const char*>(grads.data()), grads.size() * sizeof(float)));
  // The same ids unpacked (one varint field each), as a proto2 writer or an
  // old serializer may send them: protobuf reads both, so must the shard.
  std::string unpacked = message.SerializeAsString();
  {
    v1::SparsePushRequest no_ids = message;
    no_ids.clear_ids();
    unpacked = no_ids.SerializeAsString();
    for (int64_t id : ids) {
      unpacked.push_back(static_cast<char>(6 << 3));  // field 6, varint
      uint64_t v = static_cast<uint64_t>(id);
      while (v >= 0x80) {
        unpacked.push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
      }
      unpacked.push_back(static_cast<char>(v));
    }
    v1::SparsePushRequest check;
    ASSERT_TRUE(check.ParseFromString(unpacked));
    ASSERT_EQ(check.ids_size(), static_cast<int>(ids.size()));
  }
  for (const std::string& wire : {message.SerializeAsString(), unpacked}) {
    for (size_t piece : {1, 3, 7, 64, 100000}) {
      v1::SparsePushRequest header;
      SliceReader gradients;
      ASSERT_TRUE(DecodeSparsePushRequest(Sliced(wire, piece), &header, &gradients).ok()) << piece;
      EXPECT_EQ(header.job_id(), "job-s");
      EXPECT_EQ(header.worker_rank(), 1u);
      EXPECT_EQ(header.incarnation(), 5u);
      EXPECT_EQ(header.step(), 12u);
      EXPECT_EQ(header.table(), "emb");
      EXPECT_EQ(header.dtype(), v1::DTYPE_F32);
      EXPECT_EQ(header.version(), 8u);
      EXPECT_EQ(header.generation(), 2u);
      EXPECT_EQ(std::vector<int64_t>(header.ids().begin(), header.ids().end()), ids);
      EXPECT_TRUE(header.gradients().empty());  // read in place, not copied here
      std::vector<float> read(grads.size());
      ASSERT_EQ(gradients.left(), grads.size() * sizeof(float));
      ASSERT_TRUE(gradients.ReadBytes(read.data(), gradients.left()).ok());
      EXPECT_EQ(read, grads) << piece;
    }
  }
}

TEST(SparseCodec, MalformedPushRequestsAreDataLoss) {
  v1::SparsePushRequest message;
  message.set_table("emb");
  message.add_ids(300);
  message.add_ids(-5);
  message.set_gradients(std::string(8, '\1'));
  const std::string wire = message.SerializeAsString();
  for (size_t cut = 1; cut < wire.size(); ++cut) {
    v1::SparsePushRequest header;
    SliceReader gradients;
    const absl::Status s =
        DecodeSparsePushRequest(Sliced(wire.substr(0, cut), 2), &header, &gradients);
    // Every prefix either fails as protobuf's parser does, or is a shorter
    // message protobuf reads the same way.
    v1::SparsePushRequest protobuf;
    if (protobuf.ParseFromString(wire.substr(0, cut))) continue;
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "cut at " << cut;
  }
  // A packed field whose last varint runs past the field's end.
  std::string bad;
  bad.push_back(static_cast<char>((6 << 3) | 2));
  bad.push_back(2);
  bad.push_back(static_cast<char>(0x81));
  bad.push_back(static_cast<char>(0x82));
  v1::SparsePushRequest header;
  SliceReader gradients;
  EXPECT_EQ(DecodeSparsePushRequest(Sliced(bad, 1), &header, &gradients).code(),
            absl::StatusCode::kDataLoss);
  // A varint of 11 bytes inside a packed field.
  bad.clear();
  bad.push_back(static_cast<char>((6 << 3) | 2));
  bad.push_back(11);
  for (int i = 0; i < 10; ++i) bad.push_back(static_cast<char>(0xff));
  bad.push_back(1);
  EXPECT_EQ(DecodeSparsePushRequest(Sliced(bad, 4), &header, &gradients).code(),
            absl::StatusCode::kDataLoss);
}

TEST(SparseCodec, PullResponseRoundTripsThroughProtobuf) {
  const std::vector<float> rows = Ramp(48, 1);
  const std::string bytes(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float));
  BufferPool pool(1 << 20);
  {
    const grpc::ByteBuffer encoded = EncodeSparsePullResponse(v1::DTYPE_F32, 17, bytes, &pool);
    v1::SparsePullResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(BufferBytes(encoded)));
    EXPECT_EQ(parsed.values(), bytes);
    EXPECT_EQ(parsed.dtype(), v1::DTYPE_F32);
    EXPECT_EQ(parsed.version(), 17u);
  }
  EXPECT_EQ(pool.idle_bytes(), bytes.size());  // the values went back to their pool

  v1::SparsePullResponse message;
  message.set_values(bytes);
  message.set_dtype(v1::DTYPE_BF16);
  message.set_version(4);
  for (size_t piece : {1, 5, 4096}) {
    v1::SparsePullResponse header;
    SliceReader values;
    ASSERT_TRUE(
        DecodeSparsePullResponse(Sliced(message.SerializeAsString(), piece), &header, &values)
            .ok());
    EXPECT_EQ(header.dtype(), v1::DTYPE_BF16);
    EXPECT_EQ(header.version(), 4u);
    std::string read(values.left(), '\0');
    ASSERT_TRUE(values.ReadBytes(read.data(), read.size()).ok());
    EXPECT_EQ(read, bytes);
  }
  // No rows: no values field at all, as protobuf writes it.
  v1::SparsePullResponse header;
  SliceReader values;
  ASSERT_TRUE(
      DecodeSparsePullResponse(EncodeSparsePullResponse(v1::DTYPE_F32, 2, ""), &header, &values)
          .ok());
  EXPECT_TRUE(values.AtEnd());
  EXPECT_EQ(header.version(), 2u);
}

TEST(BufferPool, GivesBackABufferOfTheSizeAskedForAndKeepsAtMostItsLimit) {
  BufferPool pool(100);
  std::string a = pool.Take(60);
  EXPECT_EQ(a.size(), 60u);
  const char* where = a.data();
  pool.Give(std::move(a));
  EXPECT_EQ(pool.idle_bytes(), 60u);
  EXPECT_EQ(pool.Take(30).size(), 30u);  // another size: a new buffer
  std::string again = pool.Take(60);
  EXPECT_EQ(again.data(), where);  // the same buffer, used again
  EXPECT_EQ(pool.idle_bytes(), 0u);
  pool.Give(std::string(60, 'x'));
  pool.Give(std::string(60, 'y'));  // over the limit: freed
  EXPECT_EQ(pool.idle_bytes(), 60u);
}

TEST(BufferPool, BuffersOfNearbySizesShareARoom) {
  for (size_t size : {size_t{1}, size_t{65536}, size_t{65537}, size_t{1} << 20,
                      (size_t{1} << 20) + 1, size_t{4194303}, size_t{123456789}}) {
    const size_t room = BufferPool::RoomFor(size);
    EXPECT_GE(room, size);
    EXPECT_LE(room, size + size / 8 + 1) << size;  // at most an eighth more
  }
  BufferPool pool(size_t{64} << 20);
  std::string first = pool.TakeRoom(4'000'000);
  ASSERT_EQ(first.size(), 4'000'000u);
  const char* room = first.data();
  pool.Give(std::move(first));
  EXPECT_EQ(pool.idle_bytes(), BufferPool::RoomFor(4'000'000));  // the whole room went back
  // A reply of another number of rows, the same room: no new buffer.
  std::string second = pool.TakeRoom(4'100'000);
  EXPECT_EQ(second.size(), 4'100'000u);
  EXPECT_EQ(second.data(), room);
  EXPECT_EQ(pool.idle_bytes(), 0u);
  // A size of another room does not take it.
  pool.Give(std::move(second));
  EXPECT_NE(pool.TakeRoom(2'000'000).data(), room);
}

TEST(BufferPool, AnOwnedPayloadReturnsToItsPoolWhenGrpcLetsGo) {
  BufferPool pool(1 << 20);
  {
    std::vector<WireChunk> chunks(1);
    chunks[0].owned = pool.Take(4096);
    chunks[0].recycle = &pool;
    grpc::ByteBuffer reply = EncodePullResponse(v1::DTYPE_F32, std::move(chunks));
    EXPECT_EQ(pool.idle_bytes(), 0u);
  }
  EXPECT_EQ(pool.idle_bytes(), 4096u);
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

TEST(TopK, SendsTheLargestAndKeepsTheRestForTheNextPush) {
  const std::vector<float> g = {0.1f, -5.0f, 0.3f, 2.0f, -0.2f, 0.0f, 1.0f, -0.4f};
  std::vector<float> residual(g.size(), 0.0f);
  std::string indices, values;
  std::vector<uint32_t> order;
  SparsifyTopK(g.data(), residual.data(), g.size(), 3, DType::kF32, &indices, &values, &order);
  ASSERT_EQ(indices.size(), 3 * sizeof(uint32_t));
  std::vector<uint32_t> idx(3);
  std::memcpy(idx.data(), indices.data(), indices.size());
  EXPECT_EQ(idx, (std::vector<uint32_t>{1, 3, 6}));  // |-5|, |2|, |1|, ascending
  std::vector<float> sent(3);
  std::memcpy(sent.data(), values.data(), values.size());
  EXPECT_EQ(sent, (std::vector<float>{-5.0f, 2.0f, 1.0f}));
  EXPECT_EQ(residual, (std::vector<float>{0.1f, 0, 0.3f, 0, -0.2f, 0.0f, 0, -0.4f}));

  // Error feedback: what was held back adds to the next gradient, so over
  // pushes nothing is lost: what was sent plus the residual is the sum of
  // the gradients, element by element.
  std::vector<double> sent_total(g.size(), 0);
  sent_total[1] = -5.0;
  sent_total[3] = 2.0;
  sent_total[6] = 1.0;
  for (int round = 2; round <= 3; ++round) {
    SparsifyTopK(g.data(), residual.data(), g.size(), 3, DType::kF32, &indices, &values,
                 &order);
    std::memcpy(idx.data(), indices.data(), indices.size());
    std::memcpy(sent.data(), values.data(), values.size());
    for (int j = 0; j < 3; ++j) sent_total[idx[j]] += sent[j];
    if (round == 3) EXPECT_EQ(idx, (std::vector<uint32_t>{1, 3, 7}));  // -0.4 x 3 > 1
  }
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(sent_total[i] + residual[i], 3.0 * g[i], 1e-6) << i;
}

// A sparse ChunkData as a protobuf writer would send it.
std::string SparseReply(const std::vector<uint32_t>& idx, const std::vector<float>& values) {
  v1::PullResponse reply;  // any message with repeated ChunkData at field 1
  v1::ChunkData* c = reply.add_chunks();
  c->set_chunk_id(3);
  c->set_dtype(v1::DTYPE_F32);
  c->set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  c->set_indices(std::string(reinterpret_cast<const char*>(idx.data()), idx.size() * 4));
  return reply.SerializeAsString();
}

absl::Status ReadSparse(const std::string& bytes, std::vector<float>* dst) {
  std::string scratch;
  return DecodePullResponse(Sliced(bytes, 5), [&](ReceivedChunk& r) {
    return ReadGradient(r, DType::kF32, dst->data(), dst->size(), &scratch);
  });
}

TEST(TopK, ASparseGradientIsScatteredOverZeros) {
  std::vector<float> dst(8, 9.0f);
  ASSERT_TRUE(ReadSparse(SparseReply({0, 2, 7}, {1, 2, 3}), &dst).ok());
  EXPECT_EQ(dst, (std::vector<float>{1, 0, 2, 0, 0, 0, 0, 3}));
  std::vector<float> all(3, 9.0f);
  ASSERT_TRUE(ReadSparse(SparseReply({0, 1, 2}, {4, 5, 6}), &all).ok());
  EXPECT_EQ(all, (std::vector<float>{4, 5, 6}));
}

TEST(TopK, BadIndicesAreDataLoss) {
  std::vector<float> dst(8);
  EXPECT_EQ(ReadSparse(SparseReply({2, 1}, {1, 2}), &dst).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadSparse(SparseReply({2, 2}, {1, 2}), &dst).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadSparse(SparseReply({8}, {1}), &dst).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadSparse(SparseReply({1, 2}, {1}), &dst).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

// Mutated messages (bytes flipped, cut, repeated) never make a decoder read
// out of bounds or claim more than it was given: each either fails with
// DATA_LOSS or yields chunks whose payloads fit in the message. (Run under
// ASan to make "never" an assertion; here it must at least not crash.)
TEST(ChunkCodec, MutatedPushRequestsAreRefusedOrReadSafely) {
  v1::PushRequest request;
  request.set_job_id("fuzz");
  request.set_worker_rank(1);
  request.set_step(9);
  for (uint32_t id = 0; id < 3; ++id) {
    v1::ChunkData* c = request.add_chunks();
    c->set_chunk_id(id);
    c->set_dtype(v1::DTYPE_F32);
    c->set_version(id);
    c->set_data(std::string(64, static_cast<char>(id)));
    if (id == 2) c->set_indices(std::string("\x01\0\0\0\x03\0\0\0", 8));
  }
  const std::string valid = request.SerializeAsString();
  std::mt19937 rng(7);
  int refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 3) {
        case 0:
          bytes[rng() % bytes.size()] = static_cast<char>(rng());
          break;
        case 1:
          bytes.resize(rng() % (bytes.size() + 1));
          break;
        default:
          bytes += bytes.substr(0, rng() % (bytes.size() + 1));
      }
      if (bytes.empty()) bytes = "\x08";
    }
    v1::PushRequest header;
    std::string scratch;
    std::vector<float> values(64);
    absl::Status s = DecodePushRequest(Sliced(bytes, 1 + rng() % 17), &header,
                                       [&](ReceivedChunk& c) -> absl::Status {
                                         EXPECT_LE(c.data.left() + c.indices.left(),
                                                   bytes.size());
                                         // Read as a 16-element chunk: fits or refused.
                                         absl::Status r = ReadGradient(
                                             c, DType::kF32, values.data(), 16, &scratch);
                                         if (!r.ok()) EXPECT_EQ(r.code(), absl::StatusCode::kDataLoss);
                                         return absl::OkStatus();
                                       });
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);  // the mutations did reach the checks
}

}  // namespace
}  // namespace grps
