// grps_checkpoint_bench: what an incremental checkpoint costs beside a full
// one (issue 43, docs/durability.md). One shard holds a sparse table of
// --rows rows of --dim with row-wise AdaGrad and the default job's dense
// model; its ShardCheckpointer (grps-server's) takes a full checkpoint, then
// after each of --increments rounds that update --changed of the rows, an
// incremental one. Each checkpoint's time (from the request to the file
// written and synced: capture, encoding, CRC, write) and bytes are printed
// beside the full one's, and so is the time to read the shard's state back
// (ReadShardState: the full file alone, or the full file and every
// increment), checked against the state itself.
//
//   grps_checkpoint_bench                       # 2,000,000 rows, 1 % changed
//   grps_checkpoint_bench --rows=10000000 --changed=0.01 --increments=5
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint.h"
#include "daemon/env.h"
#include "job/job_config.h"
#include "job/shard_map.h"
#include "job/sparse_tables.h"
#include "server/shard_checkpointer.h"
#include "server/shard_store.h"

ABSL_FLAG(uint64_t, rows, 2000000, "rows of the table on the shard");
ABSL_FLAG(uint32_t, dim, 16, "values a row");
ABSL_FLAG(double, changed, 0.01, "share of the rows updated between two checkpoints");
ABSL_FLAG(uint32_t, increments, 3, "incremental checkpoints after the full one");
ABSL_FLAG(std::string, dir, "", "checkpoint folder (default: a new one under /tmp, removed after)");

namespace grps {
namespace {

constexpr uint64_t kBatch = 65536;

// Checkpoint `id` through `checkpointer`: the shard's report and the time
// from the request to the report.
std::pair<v1::ShardCheckpoint, double> Take(ShardStore& store, ShardCheckpointer& checkpointer,
                                            const std::string& root, uint64_t id) {
  v1::CheckpointRequest request;
  request.set_id(id);
  request.set_dir(CheckpointFolder(root, id));
  const absl::Time start = absl::Now();
  checkpointer.MaybeStart(request);
  v1::ShardCheckpoint report;
  while (true) {
    report = store.ShardStatus().checkpoint();
    if (report.id() == id && report.state() != v1::CHECKPOINT_STATE_PENDING) break;
    absl::SleepFor(absl::Microseconds(200));
  }
  return {report, absl::ToDoubleSeconds(absl::Now() - start)};
}

// The table's rows by id (values and state bytes, update count).
std::map<int64_t, std::string> RowsOf(const v1::TableState& t) {
  const size_t row = t.dim() * sizeof(float), state = TableStateWidth(t) * sizeof(float);
  std::map<int64_t, std::string> out;
  for (int i = 0; i < t.ids_size(); ++i) {
    std::string bytes = t.values().substr(i * row, row);
    for (const std::string& slot : t.optimizer_state()) bytes += slot.substr(i * state, state);
    bytes += absl::StrCat("/", t.updates(i));
    out[t.ids(i)] = std::move(bytes);
  }
  return out;
}

int Run() {
  const uint64_t rows = absl::GetFlag(FLAGS_rows);
  const uint32_t dim = absl::GetFlag(FLAGS_dim);
  const double changed = absl::GetFlag(FLAGS_changed);
  const uint32_t increments = absl::GetFlag(FLAGS_increments);
  if (rows == 0 || dim == 0 || changed <= 0 || changed > 1 || increments == 0) {
    std::fprintf(stderr, "--rows, --dim, --increments > 0 and 0 < --changed <= 1\n");
    return 2;
  }
  std::string root = absl::GetFlag(FLAGS_dir);
  const bool own_root = root.empty();
  if (own_root) {
    char tmpl[] = "/tmp/grps_checkpoint_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    root = tmpl;
  }
  v1::JobConfig config = DefaultJobConfig();
  config.set_job_id("checkpoint-bench");
  config.set_mode(v1::MODE_ASYNC);
  config.set_num_workers(1);
  config.set_num_servers(1);
  config.mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAGRAD);
  config.mutable_optimizer()->set_epsilon(1e-7f);
  config.set_checkpoint_dir(root);
  config.set_checkpoint_full_every(increments);
  v1::SparseTableSpec* table = config.add_sparse_tables();
  table->set_name("emb");
  table->set_dim(dim);
  table->set_rows(rows);
  table->set_rowwise_adagrad(true);
  if (absl::Status s = ValidateJobConfig(config); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<v1::ShardMap> map = BuildShardMap(ModelTensors(config), 1, config.chunk_bytes());
  if (!map.ok()) return 1;
  ShardStore::Options options;
  options.config = config;
  options.shard_map = *map;
  options.incarnation = 1;
  absl::StatusOr<std::unique_ptr<ShardStore>> created = ShardStore::Create(std::move(options));
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", std::string(created.status().message()).c_str());
    return 1;
  }
  ShardStore& store = **created;
  uint64_t step = 0;
  // Rows first..first + n * stride (mod rows), each updated once.
  auto update = [&](uint64_t first, uint64_t n, uint64_t stride) {
    for (uint64_t done = 0; done < n; done += kBatch) {
      std::vector<int64_t> ids;
      for (uint64_t i = done; i < std::min(n, done + kBatch); ++i)
        ids.push_back(static_cast<int64_t>((first + i * stride) % rows));
      const std::vector<float> values(ids.size() * dim, 0.125f);
      ShardStore::SparseGradientPush push;
      push.worker_rank = 0;
      push.incarnation = 1;
      push.step = step;
      push.base_version = step;
      ++step;
      push.table = "emb";
      push.ids = ids;
      push.values = values;
      if (absl::StatusOr<ShardStore::SparsePushResult> r = store.PushSparse(std::move(push));
          !r.ok()) {
        std::fprintf(stderr, "push: %s\n", std::string(r.status().message()).c_str());
        std::exit(1);
      }
    }
  };
  update(0, rows, 1);
  std::printf(
      "one shard: %llu rows of %u (row-wise AdaGrad) and the default dense model; "
      "%.1f%% of the rows updated between checkpoints\n",
      static_cast<unsigned long long>(rows), dim, 100 * changed);
  std::printf("%-22s %12s %9s %10s %9s\n", "checkpoint", "bytes", "share", "seconds", "share");
  int status = 0;
  {
    ShardCheckpointer checkpointer(&store, "");
    const auto [full, full_s] = Take(store, checkpointer, root, 1);
    if (full.state() != v1::CHECKPOINT_STATE_WRITTEN) {
      std::fprintf(stderr, "checkpoint 1: %s\n", full.error().c_str());
      return 1;
    }
    std::printf("%-22s %12llu %9s %10.3f %9s\n", "1 full",
                static_cast<unsigned long long>(full.bytes()), "", full_s, "");
    const uint64_t n = std::max<uint64_t>(1, static_cast<uint64_t>(changed * rows));
    v1::ShardCheckpoint last = full;
    for (uint32_t k = 1; k <= increments; ++k) {
      // A stride that visits n distinct rows (odd, and rows a power of two
      // or not, distinct as long as gcd(stride, rows) == 1).
      uint64_t stride = rows / n | 1;
      while (std::gcd(stride, rows) != 1) stride += 2;
      update(k * 7919, n, stride);
      const auto [inc, inc_s] = Take(store, checkpointer, root, 1 + k);
      if (inc.state() != v1::CHECKPOINT_STATE_WRITTEN || inc.chain_size() != static_cast<int>(k)) {
        std::fprintf(stderr, "checkpoint %u: not an increment on the one before (%s)\n", 1 + k,
                     inc.error().c_str());
        return 1;
      }
      std::printf("%-22s %12llu %8.2f%% %10.3f %8.2f%%\n",
                  absl::StrCat(1 + k, " incremental").c_str(),
                  static_cast<unsigned long long>(inc.bytes()), 100.0 * inc.bytes() / full.bytes(),
                  inc_s, 100.0 * inc_s / full_s);
      last = inc;
    }
    checkpointer.Join();
    // Read back: the full file alone, then the full file and every increment.
    const absl::Time t0 = absl::Now();
    absl::StatusOr<v1::ShardCheckpointFile> alone =
        ReadShardState(Env::Default(), CheckpointFolder(root, 1), full, config.job_id(), 1);
    const double alone_s = absl::ToDoubleSeconds(absl::Now() - t0);
    const absl::Time t1 = absl::Now();
    absl::StatusOr<v1::ShardCheckpointFile> chained = ReadShardState(
        Env::Default(), CheckpointFolder(root, last.id()), last, config.job_id(), last.id());
    const double chained_s = absl::ToDoubleSeconds(absl::Now() - t1);
    if (!alone.ok() || !chained.ok()) {
      std::fprintf(stderr, "read back: %s\n",
                   std::string((alone.ok() ? chained.status() : alone.status()).message()).c_str());
      return 1;
    }
    std::printf("read back: the full file %.3f s, the full file and %u increments %.3f s\n",
                alone_s, increments, chained_s);
    // The chain's state is the shard's now, row for row.
    v1::CheckpointRequest now;
    now.set_id(1000);
    absl::StatusOr<v1::ShardCheckpointFile> state =
        store.CaptureCheckpoint(now, absl::Now() + absl::Seconds(60));
    const bool same = state.ok() && RowsOf(state->tables(0)) == RowsOf(chained->tables(0));
    std::printf("the full file and its increments hold the shard's state: %s\n",
                same ? "yes, row for row" : "NO");
    if (!same) status = 1;
  }
  if (own_root) std::filesystem::remove_all(root);
  return status;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return grps::Run();
}
