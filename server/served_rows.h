// ServedRows: what a lookup service (grps-server --serve, lookup_service.h)
// answers with: the rows of every sparse table of a job's newest complete
// checkpoint in one checkpoint folder, kept current as the job writes new
// ones (docs/sparse.md, "Serving rows to inference").
//
// Refresh() looks for a checkpoint newer than the one served (its manifest
// only) and serves it, shard file by shard file: where the shard's chain
// (ShardCheckpoint.chain) extends the files already applied for that shard,
// only the new increments are read and applied (the rows they change and
// remove); otherwise (a full file, the first checkpoint, another shard count
// or other tables) the shard's state is read whole through its chain
// (checkpoint/checkpoint.h, ReadShardState). Every file is checked as a
// restore checks it; every change is read and checked before any is applied,
// and all are applied at once under the lock, so a lookup sees one
// checkpoint, never part of the next. A checkpoint that cannot be read is
// not served (the last error says why) and the one served stays.
//
// Rows are kept per shard of the checkpoint, as its files hold them, in flat
// arrays with an open-addressing index (row_index.h): 4 x dim + 8 bytes and
// the index's 5-10 a row. Only the tables' values: a lookup needs no
// optimizer state, and the dense chunks are not served.
//
// Thread safety: Lookup and Status from any thread; Refresh from one thread
// at a time.
#ifndef GRPS_SERVER_SERVED_ROWS_H_
#define GRPS_SERVER_SERVED_ROWS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/env.h"
#include "proto/grps.pb.h"
#include "proto/lookup.pb.h"
#include "server/row_index.h"

namespace grps {

// The largest reply Lookup gives (ids x dim x 4 bytes): half of what a
// message may hold.
inline constexpr uint64_t kMaxLookupReplyBytes = uint64_t{32} << 20;

class ServedRows {
 public:
  // Serves the checkpoints under `root` (a job's checkpoint_dir).
  ServedRows(Env* env, std::string root);

  // Serves the newest complete checkpoint under `root` if it is newer than
  // the one served. True when it did; false when there is none newer; the
  // error when the newest could not be read (the one served stays, and the
  // next call tries again).
  absl::StatusOr<bool> Refresh(absl::Time now = absl::Now()) ABSL_LOCKS_EXCLUDED(mu_);

  // The rows of `request.ids()` in `request.table()`, or the status the
  // service answers with (see proto/lookup.proto).
  absl::Status Lookup(const v1::LookupRequest& request, v1::LookupResponse* response) const
      ABSL_LOCKS_EXCLUDED(mu_);

  v1::LookupStatusResponse Status() const ABSL_LOCKS_EXCLUDED(mu_);

  // Lookups answered, ids asked for and ids missing, since the start.
  struct Counts {
    uint64_t lookups = 0;
    uint64_t ids = 0;
    uint64_t missing = 0;
  };
  Counts counts() const;

 private:
  // One table's rows on one shard.
  struct Table {
    std::vector<int64_t> ids;    // by slot; a free slot's is stale
    std::vector<float> values;   // slot x dim
    std::vector<uint32_t> free;  // slots of rows that left
    RowIndex index;
  };
  // One shard file's rows: every table of the job, in config order, and the
  // checkpoint ids of the files applied (the full one first).
  struct Shard {
    std::vector<uint64_t> applied;
    std::vector<Table> tables;
  };
  // What one shard of a new checkpoint needs: a state read whole, or the
  // increments to apply on top of the shard served.
  struct ShardUpdate {
    std::unique_ptr<Shard> whole;
    std::vector<v1::ShardCheckpointFile> increments;
    std::vector<uint64_t> applied;
  };

  absl::StatusOr<ShardUpdate> ReadShard(const v1::CheckpointManifest& manifest,
                                        const std::string& dir, uint32_t k,
                                        const std::vector<uint64_t>& applied);
  static absl::StatusOr<std::unique_ptr<Shard>> ShardOf(const v1::ShardCheckpointFile& file,
                                                        const v1::JobConfig& config);
  static void Apply(const v1::ShardCheckpointFile& increment, Shard* shard);
  static void Put(int64_t id, const float* values, uint32_t dim, Table* table);

  Env* const env_;
  const std::string root_;

  mutable absl::Mutex mu_;
  v1::CheckpointManifest served_ ABSL_GUARDED_BY(mu_);  // without config.sparse_tables: none
  std::vector<std::unique_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> table_of_ ABSL_GUARDED_BY(mu_);
  uint64_t served_unix_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checkpoints_served_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t increments_applied_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t full_reads_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  mutable std::atomic<uint64_t> lookups_{0};
  mutable std::atomic<uint64_t> ids_{0};
  mutable std::atomic<uint64_t> missing_{0};
};

}  // namespace grps

#endif  // GRPS_SERVER_SERVED_ROWS_H_
