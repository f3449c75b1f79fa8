// grps-fuzz-corpus: writes the seed corpus of every fuzz target, the files
// checked in under fuzz/corpus/<target>/: small valid inputs and near-valid
// ones (one field wrong), so that fuzzing starts from requests the code
// accepts and from each of its refusals.
//
//   grps-fuzz-corpus fuzz/corpus
//
// Files are written by name and nothing else is removed, so inputs merged
// in from fuzzing (scripts/fuzz --merge) stay. The output is the same on
// every run.
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/coordinator_script.h"
#include "fuzz/shard_fixture.h"
#include "job/sparse_tables.h"
#include "proto/grps.pb.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"

namespace grps {
namespace {

namespace fs = std::filesystem;

class CorpusWriter {
 public:
  explicit CorpusWriter(fs::path root) : root_(std::move(root)) {}

  void Write(const std::string& target, const std::string& name, const std::string& bytes) {
    const fs::path dir = root_ / target;
    fs::create_directories(dir);
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "grps-fuzz-corpus: cannot write %s\n", (dir / name).c_str());
      std::exit(1);
    }
    ++written_;
  }
  int written() const { return written_; }

 private:
  const fs::path root_;
  int written_ = 0;
};

std::string Gzip(const std::string& data) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// ---- push_request -----------------------------------------------------------

// One chunk of a push, in f32 values (converted to the push's dtype).
struct PushChunk {
  uint32_t id = 0;
  std::vector<float> values;
  std::vector<uint32_t> indices;  // sparse when set
  uint64_t version = 0;
};

PushChunk Dense(uint32_t id, std::vector<float> values = std::vector<float>(
                                 kShardFuzzChunkElements, 0.125f),
                uint64_t version = 0) {
  return {id, std::move(values), {}, version};
}

PushChunk Sparse(uint32_t id, std::vector<float> values, std::vector<uint32_t> indices) {
  return {id, std::move(values), std::move(indices), 0};
}

v1::PushRequest PushHeader() {
  v1::PushRequest h;
  h.set_job_id(kShardFuzzJobId);
  h.set_worker_rank(0);
  h.set_incarnation(1);
  h.set_step(0);
  h.set_num_samples(64);
  h.set_generation(kShardFuzzGeneration);
  return h;
}

std::string Push(const v1::PushRequest& header, v1::DType dtype,
                 const std::vector<PushChunk>& chunks) {
  const DType element = dtype == v1::DTYPE_F16    ? DType::kF16
                        : dtype == v1::DTYPE_BF16 ? DType::kBF16
                                                  : DType::kF32;
  std::vector<WireChunk> wire;
  for (const PushChunk& c : chunks) {
    WireChunk& w = wire.emplace_back();
    w.chunk_id = c.id;
    w.version = c.version;
    w.owned.assign(c.values.size() * DTypeSize(element), '\0');
    ConvertElements(c.values.data(), DType::kF32, w.owned.data(), element, c.values.size());
    w.indices.assign(reinterpret_cast<const char*>(c.indices.data()),
                     c.indices.size() * sizeof(uint32_t));
  }
  return Flatten(EncodePushRequest(header, dtype, std::move(wire)));
}

void WriteBadPushes(CorpusWriter& out, const v1::PushRequest& h,
                    const std::vector<float>& ramp);

// Valid pushes in every encoding, and refused ones.
void WritePushes(CorpusWriter& out) {
  const std::string t = "push_request";
  const v1::PushRequest h = PushHeader();
  std::vector<float> ramp(kShardFuzzChunkElements);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = 0.1f * static_cast<float>(i + 1);

  out.Write(t, "valid_f32_chunk0", Push(h, v1::DTYPE_F32, {Dense(0, ramp)}));
  {
    v1::PushRequest p = h;
    p.set_pull(true);
    p.set_pull_timeout_ms(1);
    p.set_pull_dtype(v1::DTYPE_BF16);
    out.Write(t, "valid_f32_chunks_0_2_with_pull_bf16",
              Push(p, v1::DTYPE_F32, {Dense(0), Dense(2, ramp)}));
  }
  {
    v1::PushRequest p = h;
    p.set_worker_rank(1);
    out.Write(t, "valid_f16_rank1_chunk2", Push(p, v1::DTYPE_F16, {Dense(2, ramp)}));
  }
  {
    v1::PushRequest p = h;
    p.set_step(3);
    out.Write(t, "valid_bf16_step3", Push(p, v1::DTYPE_BF16, {Dense(0, ramp)}));
    out.Write(t, "bad_version_ahead_of_chunk", Push(p, v1::DTYPE_BF16, {Dense(0, ramp, 2)}));
  }
  out.Write(t, "valid_sparse_chunk0", Push(h, v1::DTYPE_F32, {Sparse(0, {0.5f, -0.5f}, {1, 5})}));
  {
    // Rank 0's initial values (a user model's): not a step, an empty reply.
    v1::PushRequest p = h;
    p.set_initial_values(true);
    out.Write(t, "valid_initial_values_chunks_0_2",
              Push(p, v1::DTYPE_F32, {Dense(0, ramp), Dense(2, ramp)}));
  }
  {
    // The same push as protobuf writes it (field order, packing its own).
    v1::PushRequest p = h;
    v1::ChunkData* c = p.add_chunks();
    c->set_chunk_id(2);
    c->set_dtype(v1::DTYPE_F32);
    c->set_data(std::string(reinterpret_cast<const char*>(ramp.data()),
                            ramp.size() * sizeof(float)));
    out.Write(t, "valid_protobuf_serialized_chunk2", p.SerializeAsString());
  }
  {
    std::string bytes = Push(h, v1::DTYPE_F32, {Dense(0, ramp)});
    bytes += std::string("\xb8\x06\x2a", 3);     // field 103, varint 42
    bytes += std::string("\xba\x06\x03xyz", 6);  // field 103, 3 bytes
    out.Write(t, "valid_with_unknown_fields", bytes);
  }
  {
    // Values in a shared-memory lane the shard cannot map (no such process
    // here): refused, nothing changed; and a lane offset without a lane.
    v1::PushRequest p = h;
    p.set_pull(true);
    v1::SharedLane* lane = p.mutable_lane();
    lane->set_pid(1u << 23);
    lane->set_fd(7);
    lane->set_size(4096);
    lane->set_nonce(0x1234567890abcdefull);
    lane->set_reply_offset(64);
    v1::ChunkData* c = p.add_chunks();
    c->set_chunk_id(0);
    c->set_dtype(v1::DTYPE_F32);
    c->set_lane_offset(64);
    out.Write(t, "bad_lane_not_mappable", p.SerializeAsString());
    p.clear_lane();
    out.Write(t, "bad_lane_offset_without_lane", p.SerializeAsString());
  }
  WriteBadPushes(out, h, ramp);
}

// Pushes a shard must refuse, and change nothing for.
void WriteBadPushes(CorpusWriter& out, const v1::PushRequest& h,
                    const std::vector<float>& ramp) {
  const std::string t = "push_request";
  out.Write(t, "bad_chunk1_held_by_shard1", Push(h, v1::DTYPE_F32, {Dense(1)}));
  out.Write(t, "bad_chunk9_unknown", Push(h, v1::DTYPE_F32, {Dense(9)}));
  out.Write(t, "bad_short_payload",
            Push(h, v1::DTYPE_F32,
                 {Dense(0, std::vector<float>(kShardFuzzChunkElements - 1, 0.5f))}));
  {
    std::vector<float> nan = ramp;
    nan[3] = std::numeric_limits<float>::quiet_NaN();
    out.Write(t, "bad_nan_gradient", Push(h, v1::DTYPE_F32, {Dense(0, nan)}));
  }
  out.Write(t, "bad_duplicate_chunk", Push(h, v1::DTYPE_F32, {Dense(0), Dense(0)}));
  {
    v1::PushRequest p = h;
    p.set_job_id("other-job");
    out.Write(t, "bad_job_id", Push(p, v1::DTYPE_F32, {Dense(0)}));
    p = h;
    p.set_worker_rank(kShardFuzzWorkers);
    out.Write(t, "bad_rank", Push(p, v1::DTYPE_F32, {Dense(0)}));
    p = h;
    p.set_generation(kShardFuzzGeneration + 1);
    out.Write(t, "bad_newer_generation", Push(p, v1::DTYPE_F32, {Dense(0)}));
    p = h;
    p.set_pull(true);
    p.set_pull_dtype(static_cast<v1::DType>(9));
    out.Write(t, "bad_pull_dtype", Push(p, v1::DTYPE_F32, {Dense(0)}));
  }
  out.Write(t, "bad_dtype_unspecified", Push(h, v1::DTYPE_UNSPECIFIED, {Dense(0)}));
  out.Write(t, "bad_dtype_unknown", Push(h, static_cast<v1::DType>(7), {Dense(0)}));
  out.Write(t, "bad_no_chunks", Push(h, v1::DTYPE_F32, {}));
  {
    std::string bytes = Push(h, v1::DTYPE_F32, {Dense(0, ramp)});
    bytes.resize(bytes.size() - 5);
    out.Write(t, "bad_truncated", bytes);
  }
  out.Write(t, "bad_sparse_indices_unsorted",
            Push(h, v1::DTYPE_F32, {Sparse(0, {0.5f, -0.5f}, {5, 1})}));
  out.Write(t, "bad_sparse_index_out_of_range",
            Push(h, v1::DTYPE_F32, {Sparse(0, {0.5f}, {kShardFuzzChunkElements})}));
}

// ---- sparse_push ------------------------------------------------------------

void WriteSparsePushes(CorpusWriter& out) {
  const std::string t = "sparse_push";
  // Ids of the fixture's table that shard 0 holds, and one shard 1 holds.
  std::vector<int64_t> mine;
  int64_t theirs = -1;
  for (int64_t id = 0; id < static_cast<int64_t>(kShardFuzzTableRows) && mine.size() < 3; ++id) {
    if (SparseShardOf(id, 2) == 0)
      mine.push_back(id);
    else if (theirs < 0)
      theirs = id;
  }
  auto push = [&](std::vector<int64_t> ids, v1::DType dtype, float value) {
    v1::SparsePushRequest r;
    r.set_job_id(kShardFuzzJobId);
    r.set_worker_rank(0);
    r.set_incarnation(1);
    r.set_step(0);
    r.set_table(kShardFuzzTable);
    r.set_dtype(dtype);
    r.set_generation(kShardFuzzGeneration);
    for (int64_t id : ids) r.add_ids(id);
    const size_t n = ids.size() * kShardFuzzTableDim;
    std::string bytes(n * DTypeSize(*DTypeFromWire(dtype, true, "seed")), '\0');
    const std::vector<float> values(n, value);
    ConvertElements(values.data(), DType::kF32, bytes.data(), *DTypeFromWire(dtype, true, "seed"),
                    n);
    r.set_gradients(bytes);
    return r;
  };
  auto write = [&](const std::string& name, const v1::SparsePushRequest& r) {
    out.Write(t, name, r.SerializeAsString());
  };
  write("valid_f32_two_rows", push({mine[0], mine[1]}, v1::DTYPE_F32, 0.5f));
  write("valid_bf16_three_rows", push(mine, v1::DTYPE_BF16, -0.25f));
  write("valid_no_rows", push({}, v1::DTYPE_F32, 0));
  {
    // The ids unpacked: one varint field 6 each, as protobuf also reads.
    v1::SparsePushRequest r = push({mine[0], mine[2]}, v1::DTYPE_F32, 1.0f);
    const std::vector<int64_t> ids(r.ids().begin(), r.ids().end());
    r.clear_ids();
    std::string bytes = r.SerializeAsString();
    for (int64_t id : ids) {
      bytes.push_back(static_cast<char>(6 << 3));
      for (uint64_t v = static_cast<uint64_t>(id);; v >>= 7) {
        bytes.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
        if (v < 0x80) break;
      }
    }
    out.Write(t, "valid_unpacked_ids", bytes);
  }
  write("bad_id_twice", push({mine[0], mine[0]}, v1::DTYPE_F32, 0.5f));
  write("bad_id_of_shard_1", push({mine[0], theirs}, v1::DTYPE_F32, 0.5f));
  write("bad_id_out_of_range",
        push({static_cast<int64_t>(kShardFuzzTableRows)}, v1::DTYPE_F32, 0.5f));
  write("bad_negative_id", push({-2}, v1::DTYPE_F32, 0.5f));
  write("bad_nan", push({mine[1]}, v1::DTYPE_F32, std::numeric_limits<float>::quiet_NaN()));
  write("bad_dtype_unspecified", push({mine[1]}, v1::DTYPE_UNSPECIFIED, 0.5f));
  {
    v1::SparsePushRequest r = push({mine[0], mine[1]}, v1::DTYPE_F32, 0.5f);
    r.mutable_gradients()->resize(r.gradients().size() - 4);
    write("bad_short_gradients", r);
  }
  {
    v1::SparsePushRequest r = push({mine[0]}, v1::DTYPE_F32, 0.5f);
    r.set_table("other");
    write("bad_unknown_table", r);
  }
  {
    std::string bytes = push(mine, v1::DTYPE_F32, 0.5f).SerializeAsString();
    bytes.resize(bytes.size() - 3);
    out.Write(t, "bad_truncated", bytes);
  }
}

// ---- optimizer_state --------------------------------------------------------

// f32 values as little-endian bytes (this machine's order).
std::string F32(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

void WriteOptimizerStates(CorpusWriter& out) {
  const std::string t = "optimizer_state";
  // A valid state of shard 0's chunks for each mode's optimizer (the
  // fixture's: sync momentum, async Adam, ssp nesterov).
  auto state = [](v1::OptimizerKind kind, uint32_t slots, float value) {
    v1::LoadOptimizerStateRequest r;
    r.set_job_id(kShardFuzzJobId);
    r.set_worker_rank(0);
    r.set_incarnation(1);
    r.set_generation(kShardFuzzGeneration);
    r.set_kind(kind);
    for (uint32_t id : {0u, 2u}) {
      v1::ChunkOptimizerState* c = r.add_chunks();
      c->set_chunk_id(id);
      c->set_steps(20);
      for (uint32_t k = 0; k < slots; ++k)
        c->add_slots(F32(std::vector<float>(kShardFuzzChunkElements, value)));
    }
    return r;
  };
  auto write = [&](const std::string& name, const v1::LoadOptimizerStateRequest& r) {
    out.Write(t, name, r.SerializeAsString());
  };
  write("valid_momentum", state(v1::OPTIMIZER_MOMENTUM, 1, 0.5f));
  write("valid_adam", state(v1::OPTIMIZER_ADAM, 2, 0.25f));
  write("valid_nesterov", state(v1::OPTIMIZER_NESTEROV, 1, -0.5f));
  v1::LoadOptimizerStateRequest r = state(v1::OPTIMIZER_ADAM, 2, 0.25f);
  r.mutable_chunks()->RemoveLast();
  write("valid_adam_chunk0_only", r);
  r = state(v1::OPTIMIZER_ADAM, 2, 0.25f);
  r.mutable_chunks(1)->set_slots(1, F32(std::vector<float>(kShardFuzzChunkElements, -1.0f)));
  write("bad_adam_negative_second_moment", r);
  r = state(v1::OPTIMIZER_ADAM, 2, 1e-30f);
  r.mutable_chunks(0)->set_slots(0, F32(std::vector<float>(kShardFuzzChunkElements, 1e15f)));
  write("valid_adam_largest_moment", r);
  r = state(v1::OPTIMIZER_MOMENTUM, 1, std::numeric_limits<float>::quiet_NaN());
  write("bad_momentum_nan", r);
  r = state(v1::OPTIMIZER_MOMENTUM, 1, 0.5f);
  r.mutable_chunks(1)->set_chunk_id(1);
  write("bad_chunk_of_shard_1", r);
  r = state(v1::OPTIMIZER_MOMENTUM, 1, 0.5f);
  r.mutable_chunks(1)->set_chunk_id(0);
  write("bad_chunk_twice", r);
  r = state(v1::OPTIMIZER_MOMENTUM, 1, 0.5f);
  r.mutable_chunks(0)->mutable_slots(0)->resize(7);
  write("bad_slot_length", r);
  r = state(v1::OPTIMIZER_MOMENTUM, 1, 0.5f);
  r.mutable_chunks(0)->set_steps(~uint64_t{0});
  write("bad_steps", r);
  write("bad_kind", state(v1::OPTIMIZER_ADAGRAD, 1, 0.5f));
}

// ---- pull_request -----------------------------------------------------------

void WritePulls(CorpusWriter& out) {
  const std::string t = "pull_request";
  v1::PullRequest base;
  base.set_job_id(kShardFuzzJobId);
  base.set_worker_rank(0);
  base.set_generation(kShardFuzzGeneration);
  auto write = [&](const std::string& name, const v1::PullRequest& p) {
    out.Write(t, name, p.SerializeAsString());
  };
  write("valid_every_chunk", base);
  v1::PullRequest p = base;
  p.add_chunk_ids(0);
  p.set_dtype(v1::DTYPE_F16);
  write("valid_chunk0_f16", p);
  p = base;
  p.add_chunk_ids(2);
  p.add_chunk_ids(0);
  p.set_dtype(v1::DTYPE_BF16);
  write("valid_chunks_2_0_bf16", p);
  p = base;
  p.set_min_version(1);
  p.set_timeout_ms(1);
  write("valid_min_version1", p);
  p = base;
  p.set_clock(1);
  p.set_timeout_ms(1);
  write("valid_clock1", p);
  p = base;
  p.set_clock(5);
  write("valid_clock5", p);
  p = base;
  p.set_min_version(100);
  write("bad_min_version100_no_wait", p);
  p.set_timeout_ms(60000);
  write("waits_min_version100_until_shutdown", p);
  p = base;
  p.set_min_version(100);
  p.set_timeout_ms(1);
  write("waits_min_version100_times_out", p);
  p = base;
  p.set_generation(kShardFuzzGeneration + 1);
  write("bad_newer_generation", p);
  p = base;
  p.add_chunk_ids(1);
  write("bad_chunk1_held_by_shard1", p);
  p = base;
  p.add_chunk_ids(9);
  write("bad_chunk9_unknown", p);
  p = base;
  p.add_chunk_ids(0);
  p.add_chunk_ids(0);
  write("bad_duplicate_chunk", p);
  p = base;
  p.set_job_id("other-job");
  write("bad_job_id", p);
  p = base;
  p.set_worker_rank(kShardFuzzWorkers);
  write("bad_rank", p);
  p = base;
  p.set_dtype(static_cast<v1::DType>(7));
  write("bad_dtype", p);
  out.Write(t, "bad_not_a_message", std::string("\x0a\xff\xff\x01", 4));
}

// ---- coordinator ------------------------------------------------------------

class Script {
 public:
  explicit Script(uint8_t job_bits) : job_bits_(job_bits) {}
  Script& Add(CoordinatorAction action, const std::string& payload = "") {
    AppendCoordinatorRecord(&bytes_, action, payload, bytes_.empty() ? job_bits_ : 0);
    return *this;
  }
  template <typename Message>
  Script& Add(CoordinatorAction action, const Message& m) {
    return Add(action, m.SerializeAsString());
  }
  Script& AdvanceMs(uint32_t ms) {
    std::string payload(4, '\0');
    std::memcpy(payload.data(), &ms, 4);
    return Add(CoordinatorAction::kAdvanceClock, payload);
  }
  const std::string& bytes() const { return bytes_; }

 private:
  const uint8_t job_bits_;
  std::string bytes_;
};

std::string ServerAddress(uint32_t shard) { return absl::StrCat("127.0.0.1:", 7000 + shard); }

// A registration for `shard` (-1: any) from the address of `from`.
v1::RegisterServerRequest RegisterServer(int shard, uint32_t from) {
  v1::RegisterServerRequest r;
  r.set_job_id(kCoordinatorFuzzJobId);
  r.set_address(ServerAddress(from));
  r.set_requested_shard(shard);
  return r;
}

v1::RegisterWorkerRequest RegisterWorker() {
  v1::RegisterWorkerRequest r;
  r.set_job_id(kCoordinatorFuzzJobId);
  r.set_host("worker-host");
  r.set_backend("cpu");
  return r;
}

// Registrations at the fuzz clock's start get incarnations 1, 2, 3, ... in
// order: shards 0 and 1 are 1 and 2, ranks 0 and 1 are 3 and 4.
constexpr uint64_t kServerIncarnation[] = {1, 2};
constexpr uint64_t kWorkerIncarnation[] = {3, 4};

v1::HeartbeatRequest ServerHeartbeat(uint32_t shard, uint64_t version, uint64_t generation = 1) {
  v1::HeartbeatRequest r;
  r.set_job_id(kCoordinatorFuzzJobId);
  r.set_server_shard(shard);
  r.set_incarnation(kServerIncarnation[shard]);
  r.set_generation(generation);
  r.mutable_shard()->set_shard(shard);
  r.mutable_shard()->set_address(ServerAddress(shard));
  r.mutable_shard()->set_incarnation(kServerIncarnation[shard]);
  r.mutable_shard()->set_generation(generation);
  r.mutable_shard()->set_version(version);
  r.mutable_shard()->set_num_chunks(1);
  return r;
}

v1::HeartbeatRequest WorkerHeartbeat(uint32_t rank, uint64_t step, uint64_t generation = 1) {
  v1::HeartbeatRequest r;
  r.set_job_id(kCoordinatorFuzzJobId);
  r.set_worker_rank(rank);
  r.set_incarnation(kWorkerIncarnation[rank]);
  r.set_generation(generation);
  r.mutable_progress()->set_step(step);
  r.mutable_progress()->set_total_steps(10);
  r.mutable_progress()->set_loss(0.5f);
  r.mutable_progress()->set_test_accuracy(-1);
  return r;
}

v1::WorkerDoneRequest WorkerDone(uint32_t rank, bool final_eval) {
  v1::WorkerDoneRequest r;
  r.set_job_id(kCoordinatorFuzzJobId);
  r.set_worker_rank(rank);
  r.set_incarnation(kWorkerIncarnation[rank]);
  r.set_generation(1);
  r.mutable_progress()->set_step(10);
  r.mutable_progress()->set_total_steps(10);
  if (final_eval) {
    r.set_has_final_eval(true);
    r.set_final_test_accuracy(0.8f);
    r.set_final_test_loss(0.5f);
  }
  return r;
}

Script& RegisterAll(Script& s) {
  s.Add(CoordinatorAction::kRegisterServer, RegisterServer(-1, 0))
      .Add(CoordinatorAction::kRegisterServer, RegisterServer(-1, 1))
      .Add(CoordinatorAction::kRegisterWorker, RegisterWorker())
      .Add(CoordinatorAction::kRegisterWorker, RegisterWorker());
  return s;
}

// Registration, training, the final evaluation, the end.
std::string Lifecycle(uint8_t job_bits) {
  Script s(job_bits);
  RegisterAll(s);
  for (uint64_t step : {5, 10}) {
    s.AdvanceMs(100)
        .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(0, step))
        .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(1, step))
        .Add(CoordinatorAction::kHeartbeat, WorkerHeartbeat(0, step))
        .Add(CoordinatorAction::kHeartbeat, WorkerHeartbeat(1, step));
  }
  s.Add(CoordinatorAction::kWorkerDone, WorkerDone(0, false))
      .Add(CoordinatorAction::kWorkerDone, WorkerDone(1, false))
      .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(0, 10))
      .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(1, 10))
      .Add(CoordinatorAction::kHeartbeat, WorkerHeartbeat(0, 10))
      .Add(CoordinatorAction::kWorkerDone, WorkerDone(0, true))
      .Add(CoordinatorAction::kGetJobStatus);
  v1::HeartbeatRequest last = ServerHeartbeat(0, 10);
  last.set_final_report(true);
  s.Add(CoordinatorAction::kHeartbeat, last);
  return s.bytes();
}

void WriteCoordinatorEdgeScripts(CorpusWriter& out);
void WriteCoordinatorWorkerTokenScripts(CorpusWriter& out);

// A job's life in each mode, checkpoints, roll-backs, deaths and rejoins.
void WriteCoordinatorScripts(CorpusWriter& out) {
  const std::string t = "coordinator";
  out.Write(t, "lifecycle_sync", Lifecycle(0));
  out.Write(t, "lifecycle_async", Lifecycle(kJobAsync));
  out.Write(t, "lifecycle_ssp", Lifecycle(kJobSsp));
  out.Write(t, "lifecycle_sync_backup_checkpoints", Lifecycle(kJobSyncBackup | kJobCheckpoints));
  {
    // A checkpoint asked for by an operator and reported by both shards.
    Script s(kJobCheckpoints);
    RegisterAll(s);
    v1::CheckpointJobRequest ask;
    s.Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(0, 2))
        .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(1, 2))
        .Add(CoordinatorAction::kCheckpointJob, ask);
    for (uint32_t shard : {0u, 1u}) {
      v1::HeartbeatRequest hb = ServerHeartbeat(shard, 4);
      v1::ShardCheckpoint* c = hb.mutable_shard()->mutable_checkpoint();
      c->set_id(1);
      c->set_shard(shard);
      c->set_state(v1::CHECKPOINT_STATE_WRITTEN);
      c->set_file(absl::StrCat("shard-0000", shard, ".ckpt"));
      c->set_bytes(100);
      c->set_min_version(4);
      c->set_max_version(4);
      c->set_num_chunks(1);
      s.Add(CoordinatorAction::kHeartbeat, hb);
    }
    ask.set_wait(true);
    s.Add(CoordinatorAction::kCheckpointJob, ask).Add(CoordinatorAction::kGetJobStatus);
    out.Write(t, "checkpoint_reported", s.bytes());
  }
  {
    // A server registers again for its shard while the job runs: roll-back;
    // then members of the old generation heartbeat.
    Script s(kJobCheckpoints);
    RegisterAll(s);
    s.Add(CoordinatorAction::kHeartbeat, WorkerHeartbeat(0, 3))
        .Add(CoordinatorAction::kRegisterServer, RegisterServer(0, 0))
        .Add(CoordinatorAction::kHeartbeat, WorkerHeartbeat(0, 4))
        .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(1, 4))
        .Add(CoordinatorAction::kWorkerDone, WorkerDone(1, false));
    out.Write(t, "server_restart_rolls_back", s.bytes());
  }
  {
    // Workers go silent: dead, then the job fails past the recovery timeout.
    Script s(0);
    RegisterAll(s);
    s.AdvanceMs(1500).AdvanceMs(4000).Add(CoordinatorAction::kGetJobStatus);
    out.Write(t, "workers_die_job_fails", s.bytes());
  }
  {
    // A worker dies and comes back with a new registration.
    Script s(kJobSsp);
    RegisterAll(s);
    s.AdvanceMs(600)
        .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(0, 1))
        .Add(CoordinatorAction::kHeartbeat, ServerHeartbeat(1, 1))
        .Add(CoordinatorAction::kHeartbeat, WorkerHeartbeat(0, 1))
        .AdvanceMs(600)
        .Add(CoordinatorAction::kRegisterWorker, RegisterWorker())
        .Add(CoordinatorAction::kGetJobStatus);
    out.Write(t, "worker_dies_and_rejoins", s.bytes());
  }
  WriteCoordinatorEdgeScripts(out);
  WriteCoordinatorWorkerTokenScripts(out);
}

v1::DefineModelRequest DefineModel(const std::vector<std::vector<int64_t>>& shapes) {
  v1::DefineModelRequest r;
  r.set_job_id(kCoordinatorFuzzJobId);
  for (size_t i = 0; i < shapes.size(); ++i) {
    v1::TensorSpec* t = r.add_tensors();
    t->set_name(absl::StrCat("t", i));
    for (int64_t d : shapes[i]) t->add_shape(d);
    t->set_initializer("given");
  }
  return r;
}

// The joiner of an elastic job: rank 2, registered after ranks 0 and 1.
constexpr uint64_t kJoinerIncarnation = 5;

v1::LeaseExamplesRequest LeaseExamples(uint32_t rank, uint64_t incarnation,
                                       uint64_t train_examples, uint32_t want) {
  v1::LeaseExamplesRequest r;
  r.set_job_id(kCoordinatorFuzzJobId);
  r.set_worker_rank(rank);
  r.set_incarnation(incarnation);
  r.set_train_examples(train_examples);
  r.set_want(want);
  return r;
}

// What issue 39's outside client sent with the worker token: shapes whose
// element count wraps, lease requests out of range, and a lease loop that
// never reports.
void WriteCoordinatorWorkerTokenScripts(CorpusWriter& out) {
  const std::string t = "coordinator";
  const int64_t k2To32 = int64_t{1} << 32;
  {
    Script s(kJobUserModel);
    v1::DefineModelRequest twice = DefineModel({{4}, {4}});
    twice.mutable_tensors(1)->set_name("t0");
    s.Add(CoordinatorAction::kDefineModel, DefineModel({{k2To32, k2To32}}))
        .Add(CoordinatorAction::kDefineModel, DefineModel({{int64_t{1} << 40, 1 << 24}}))
        .Add(CoordinatorAction::kDefineModel,
             DefineModel({{k2To32 + 1, k2To32 - 1, k2To32 + 1, k2To32 - 1}}))
        .Add(CoordinatorAction::kDefineModel, DefineModel({{int64_t{1} << 33}}))
        .Add(CoordinatorAction::kDefineModel, twice)
        .Add(CoordinatorAction::kRegisterServer, RegisterServer(-1, 0))
        .Add(CoordinatorAction::kGetJobStatus)
        .Add(CoordinatorAction::kDefineModel, DefineModel({{4, 3}, {3}}))
        .Add(CoordinatorAction::kDefineModel, DefineModel({{4, 3}, {3}}))
        .Add(CoordinatorAction::kDefineModel, DefineModel({{4, 3}, {4}}));
    RegisterAll(s);
    s.Add(CoordinatorAction::kDefineModel, DefineModel({{k2To32, k2To32}}))
        .Add(CoordinatorAction::kGetShardMap);
    out.Write(t, "define_model_hostile", s.bytes());
  }
  {
    Script s(0);
    s.Add(CoordinatorAction::kDefineModel, DefineModel({{4, 3}, {3}}));
    out.Write(t, "define_model_builtin_job", s.bytes());
  }
  {
    // Refused first leases, from a member and from the joiner: none may
    // size the ledger or make the joiner ready.
    Script s(kJobElastic);
    RegisterAll(s);
    s.Add(CoordinatorAction::kRegisterWorker, [] {
      v1::RegisterWorkerRequest r = RegisterWorker();
      r.set_requested_rank(2);
      return r;
    }());
    v1::LeaseExamplesRequest far = LeaseExamples(0, kWorkerIncarnation[0], 2100, 1);
    far.add_trained()->set_block(~uint64_t{0});
    v1::LeaseExamplesRequest joiner_far = far;
    joiner_far.set_worker_rank(2);
    joiner_far.set_incarnation(kJoinerIncarnation);
    v1::LeaseExamplesRequest held = LeaseExamples(2, kJoinerIncarnation, 2000, 1);
    held.add_held(62);  // 2,000 examples: 31 blocks an epoch, 62 in all
    s.Add(CoordinatorAction::kLeaseExamples, far)
        .Add(CoordinatorAction::kLeaseExamples, joiner_far)
        .Add(CoordinatorAction::kLeaseExamples,
             LeaseExamples(0, kWorkerIncarnation[0], ~uint64_t{0}, 64))
        .Add(CoordinatorAction::kLeaseExamples, LeaseExamples(0, kWorkerIncarnation[0], 0, 1))
        .Add(CoordinatorAction::kLeaseExamples, LeaseExamples(2, kJoinerIncarnation, 2000, 65))
        .Add(CoordinatorAction::kLeaseExamples, held)
        .Add(CoordinatorAction::kGetJobStatus)
        .Add(CoordinatorAction::kLeaseExamples, LeaseExamples(0, kWorkerIncarnation[0], 2000, 8))
        .Add(CoordinatorAction::kLeaseExamples, LeaseExamples(2, kJoinerIncarnation, 2000, 8))
        .Add(CoordinatorAction::kLeaseExamples, LeaseExamples(1, kWorkerIncarnation[1], 2100, 8))
        .Add(CoordinatorAction::kGetJobStatus);
    out.Write(t, "lease_refused_first", s.bytes());
  }
  {
    // A rank that leases 64 at a time and never reports, then reports some;
    // checkpoints on, so the ledger goes into the state file.
    Script s(kJobElastic | kJobCheckpoints);
    RegisterAll(s);
    for (int i = 0; i < 6; ++i)
      s.Add(CoordinatorAction::kLeaseExamples,
            LeaseExamples(0, kWorkerIncarnation[0], 64 * 1000, 64));
    v1::LeaseExamplesRequest report = LeaseExamples(0, kWorkerIncarnation[0], 64 * 1000, 64);
    for (uint64_t block = 0; block < 8; ++block) {
      v1::TrainedBlock* b = report.add_trained();
      b->set_block(block);
      b->set_step(block);
    }
    s.Add(CoordinatorAction::kLeaseExamples, report)
        .Add(CoordinatorAction::kLeaseExamples,
             LeaseExamples(1, kWorkerIncarnation[1], 64 * 1000, 64))
        .Add(CoordinatorAction::kGetJobStatus);
    out.Write(t, "lease_loop_never_reports", s.bytes());
  }
}

// A stopped job, members it never registered, requests before the job runs
// and malformed ones.
void WriteCoordinatorEdgeScripts(CorpusWriter& out) {
  const std::string t = "coordinator";
  {
    v1::StopJobRequest stop;
    stop.set_reason("stopped by the fuzz corpus");
    Script s(0);
    RegisterAll(s);
    s.Add(CoordinatorAction::kStopJob, stop)
        .Add(CoordinatorAction::kHeartbeat, WorkerHeartbeat(0, 1))
        .Add(CoordinatorAction::kRegisterServer, RegisterServer(-1, 2))
        .Add(CoordinatorAction::kStopJob, stop);
    out.Write(t, "stopped_job", s.bytes());
  }
  {
    // Members this coordinator never registered (it restarted without its
    // state file): adopted from their heartbeats, one from a newer
    // generation.
    v1::HeartbeatRequest server = ServerHeartbeat(1, 7, 3);
    server.set_incarnation(77);
    v1::HeartbeatRequest worker = WorkerHeartbeat(0, 7, 3);
    worker.set_incarnation(78);
    Script s(kJobCheckpoints);
    s.Add(CoordinatorAction::kHeartbeat, server).Add(CoordinatorAction::kHeartbeat, worker);
    out.Write(t, "adopts_unknown_members", s.bytes());
  }
  {
    Script s(0);
    s.Add(CoordinatorAction::kRegisterWorker, RegisterWorker())
        .Add(CoordinatorAction::kGetShardMap)
        .Add(CoordinatorAction::kGetJobStatus)
        .Add(CoordinatorAction::kCheckpointJob);
    out.Write(t, "waiting_job_requests", s.bytes());
  }
  {
    v1::RegisterServerRequest bad = RegisterServer(5, 5);
    v1::RegisterWorkerRequest other = RegisterWorker();
    other.set_job_id("other-job");
    v1::WorkerDoneRequest eval = WorkerDone(0, true);
    eval.set_final_test_accuracy(2);
    Script s(0);
    s.Add(CoordinatorAction::kRegisterServer, bad)
        .Add(CoordinatorAction::kRegisterWorker, other)
        .Add(CoordinatorAction::kHeartbeat, std::string())
        .Add(CoordinatorAction::kWorkerDone, eval)
        .Add(CoordinatorAction::kStopJob, v1::StopJobRequest())
        .Add(CoordinatorAction::kHeartbeat, std::string("\x0a\xff", 2));
    out.Write(t, "bad_requests", s.bytes());
  }
}

// ---- idx_reader -------------------------------------------------------------

std::string IdxHeader(uint32_t magic, const std::vector<uint32_t>& dims) {
  std::string out;
  for (uint32_t v : [&] {
         std::vector<uint32_t> words{magic};
         words.insert(words.end(), dims.begin(), dims.end());
         return words;
       }()) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
  }
  return out;
}

std::string Bytes(size_t n, uint8_t first = 0) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(first + i);
  return out;
}

void WriteIdxFiles(CorpusWriter& out) {
  const std::string t = "idx_reader";
  const std::string images = IdxHeader(0x00000803, {3, 2, 2}) + Bytes(12);
  const std::string labels = IdxHeader(0x00000801, {5}) + Bytes(5);
  out.Write(t, "valid_images_3x2x2", images);
  out.Write(t, "valid_images_3x2x2.gz", Gzip(images));
  out.Write(t, "valid_labels_5", labels);
  out.Write(t, "valid_labels_5.gz", Gzip(labels));
  out.Write(t, "valid_array_4d", IdxHeader(0x00000804, {2, 1, 2, 2}) + Bytes(8));
  out.Write(t, "valid_empty_labels", IdxHeader(0x00000801, {0}));
  out.Write(t, "bad_truncated_payload", images.substr(0, images.size() - 3));
  out.Write(t, "bad_trailing_byte", labels + "x");
  out.Write(t, "bad_dtype_int32", IdxHeader(0x00000c01, {2}) + Bytes(8));
  out.Write(t, "bad_magic", IdxHeader(0x01000801, {2}) + Bytes(2));
  out.Write(t, "bad_no_dimensions", IdxHeader(0x00000800, {}));
  out.Write(t, "bad_zero_rows", IdxHeader(0x00000803, {1, 0, 2}));
  out.Write(t, "bad_huge_header", IdxHeader(0x00000803, {65536, 65536, 16}) + Bytes(16));
  out.Write(t, "bad_truncated_header", IdxHeader(0x00000803, {3, 2, 2}).substr(0, 10));
  {
    const std::string gz = Gzip(images);
    out.Write(t, "bad_gzip_cut_short", gz.substr(0, gz.size() - 6));
    std::string corrupt = gz;
    corrupt[corrupt.size() / 2] = static_cast<char>(corrupt[corrupt.size() / 2] ^ 0x55);
    out.Write(t, "bad_gzip_corrupt", corrupt);
  }
  out.Write(t, "bad_gzip_magic_only", std::string("\x1f\x8b\x08\x00", 4));
  out.Write(t, "bad_empty", "");
}

// ---- job_flags --------------------------------------------------------------

void WriteJobFlags(CorpusWriter& out) {
  const std::string t = "job_flags";
  out.Write(t, "valid_defaults", "");
  out.Write(t, "valid_ssp", "--mode=ssp\n--staleness=2\n");
  out.Write(t, "valid_softmax", "model=softmax\nhidden=\n");
  out.Write(t, "valid_big_mlp", "hidden=256,128,64\nchunk_kb=64\nservers=4\nworkers=8\n");
  out.Write(t, "valid_adam_bf16_topk", "optimizer=adam\nlr=0.001\nwire_dtype=bf16\ntopk=0.01\n");
  out.Write(t, "valid_async",
            "mode=async\nmax_staleness=4\nstaleness_aware_lr=true\nwarmup_steps=100\n");
  out.Write(t, "valid_sync_backup_drop", "workers=3\nbackup_workers=1\nlate_gradients=drop\n");
  out.Write(t, "valid_checkpoints",
            "checkpoint_dir=/tmp/ckpt\ncheckpoint_every_steps=10\ncheckpoint_every_s=30\n"
            "recovery_timeout_ms=10000\n");
  out.Write(t, "valid_steps_seed", "steps=1000\nepochs=0\nseed=7\nbatch=1\ntrain_limit=100\n");
  out.Write(t, "bad_mode", "mode=bsp\n");
  out.Write(t, "bad_chunk_kb_zero", "chunk_kb=0\n");
  out.Write(t, "bad_hidden_zero", "hidden=0,10\n");
  out.Write(t, "bad_lr_nan", "lr=nan\n");
  out.Write(t, "bad_backup_workers", "workers=2\nbackup_workers=2\n");
  out.Write(t, "bad_decay_rate", "decay_rate=1.5\n");
  out.Write(t, "bad_servers", "servers=300\n");
  out.Write(t, "bad_topk", "topk=-0.5\n");
  out.Write(t, "bad_dtype", "wire_dtype=f64\n");
  out.Write(t, "huge_model", "hidden=65536,65536\nchunk_kb=1\n");
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (e.g. fuzz/corpus)\n", argv[0]);
    return 2;
  }
  grps::CorpusWriter out(argv[1]);
  grps::WritePushes(out);
  grps::WritePulls(out);
  grps::WriteSparsePushes(out);
  grps::WriteOptimizerStates(out);
  grps::WriteCoordinatorScripts(out);
  grps::WriteIdxFiles(out);
  grps::WriteJobFlags(out);
  std::printf("grps-fuzz-corpus: %d files under %s\n", out.written(), argv[1]);
  return 0;
}
