// grps-checkpoint-diff: compares the model in two checkpoints, chunk by chunk.
//
//   grps-checkpoint-diff DIR_A DIR_B   exit 0 when both verify and every chunk
//                                      has bit-identical values, optimizer
//                                      state and version; 1 with the first
//                                      difference otherwise
//   grps-checkpoint-diff --step DIR    prints the checkpoint's step
//   grps-checkpoint-diff --newest ROOT prints the newest complete checkpoint
//                                      folder under ROOT (exit 1 if none)
//
// The checkpoints may come from jobs with different numbers of servers: the
// chunks are compared by id. For tests and drills (docs/durability.md).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "daemon/env.h"

namespace grps {
namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: grps-checkpoint-diff DIR_A DIR_B\n"
               "       grps-checkpoint-diff --step DIR\n"
               "       grps-checkpoint-diff --newest ROOT\n");
  return 2;
}

absl::StatusOr<std::vector<v1::ChunkState>> AllChunks(const std::string& dir,
                                                      v1::CheckpointManifest* manifest) {
  absl::StatusOr<v1::CheckpointManifest> m = VerifyCheckpoint(Env::Default(), dir, "");
  if (!m.ok()) return m.status();
  *manifest = *m;
  std::vector<uint32_t> ids;
  for (const v1::ChunkSpec& c : m->shard_map().chunks()) ids.push_back(c.chunk_id());
  return LoadChunks(Env::Default(), dir, *m, ids);
}

int Main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--step") == 0) {
    absl::StatusOr<v1::CheckpointManifest> m = VerifyCheckpoint(Env::Default(), argv[2], "");
    if (!m.ok()) {
      std::fprintf(stderr, "grps-checkpoint-diff: %s\n", std::string(m.status().message()).c_str());
      return 1;
    }
    std::printf("%llu\n", static_cast<unsigned long long>(m->step()));
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--newest") == 0) {
    absl::StatusOr<CheckpointChoice> choice = FindNewestCheckpoint(Env::Default(), argv[2], "");
    if (!choice.ok() || !choice->manifest.has_value()) {
      std::fprintf(stderr, "grps-checkpoint-diff: no complete checkpoint in %s\n", argv[2]);
      return 1;
    }
    std::printf("%s\n", choice->dir.c_str());
    return 0;
  }
  if (argc != 3 || argv[1][0] == '-') return Usage();
  v1::CheckpointManifest ma, mb;
  absl::StatusOr<std::vector<v1::ChunkState>> a = AllChunks(argv[1], &ma);
  absl::StatusOr<std::vector<v1::ChunkState>> b = AllChunks(argv[2], &mb);
  for (const auto* s : {&a, &b})
    if (!s->ok()) {
      std::fprintf(stderr, "grps-checkpoint-diff: %s\n", std::string(s->status().message()).c_str());
      return 1;
    }
  if (absl::Status s = CheckSameChunks(ma.shard_map(), mb.shard_map()); !s.ok()) {
    std::fprintf(stderr, "grps-checkpoint-diff: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    const v1::ChunkState& x = (*a)[i];
    const v1::ChunkState& y = (*b)[i];
    std::string what;
    if (x.version() != y.version()) what = "version";
    else if (x.values() != y.values()) what = "values";
    else if (x.optimizer_state_size() != y.optimizer_state_size()) what = "optimizer state";
    for (int k = 0; what.empty() && k < x.optimizer_state_size(); ++k)
      if (x.optimizer_state(k) != y.optimizer_state(k)) what = "optimizer state";
    if (!what.empty()) {
      std::printf("chunk %u differs in its %s (versions %llu and %llu)\n", x.chunk_id(),
                  what.c_str(), static_cast<unsigned long long>(x.version()),
                  static_cast<unsigned long long>(y.version()));
      return 1;
    }
    bytes += x.values().size();
  }
  std::printf("identical: %zu chunks, %llu bytes of values, steps %llu and %llu\n", a->size(),
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(ma.step()),
              static_cast<unsigned long long>(mb.step()));
  return 0;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) { return grps::Main(argc, argv); }
