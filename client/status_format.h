// Renderings of a job's status and shard map for people (grpsctl's tables)
// and for scripts (JSON). Pure functions: no I/O, no clock; the same message
// always gives the same text.
//
// Tables are plain text, columns separated by two spaces, numbers right
// aligned, one row per line, every line ending in '\n'.
#ifndef GRPS_CLIENT_STATUS_FORMAT_H_
#define GRPS_CLIENT_STATUS_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "proto/grps.pb.h"

namespace grps {

// Binary units with one decimal above 1 KiB: "512 B", "1.5 KiB", "64.0 MiB",
// "2.0 GiB".
std::string HumanBytes(uint64_t bytes);

// A duration for people: "0.4s", "42.0s", "3m07s", "1h02m05s".
std::string HumanDuration(double seconds);

// Header lines: job id, state, mode (with ssp's bound, and sync's backup
// workers and late-gradient policy when there are backup workers), global
// step / total, samples/s, loss, test accuracy, late and too-stale gradients
// (when there are any), final evaluation (when there is one), elapsed,
// message. Durability lines where they apply: the global step's stall
// ("stalled 12.0s" while running and idle >= 5 s), the generation (> 0), the
// checkpoints (complete count, the last complete one with its age when
// `now_unix_ms` > 0, the pending one, a failed one with its error), and
// "coordinator restarted". Async / ssp show the global step as updates per
// chunk beside the steps per worker, not as a fraction of them.
std::string FormatJobHeader(const v1::JobStatus& status, int64_t now_unix_ms = 0);

// One row per worker: rank, state, step, epoch, loss, samples/s ("-" unless
// alive: a dead worker's last figure is stale), late
// gradients (sync with backup workers, or when there are any), last heartbeat ("0.4s ago"), notes ("eval" for the worker that
// evaluates, "straggler" when flagged), backend, host.
std::string FormatWorkersTable(const v1::JobStatus& status);

// Two tables with one row per shard, separated by a blank line, each under
// 100 columns. Traffic: shard, address, version, chunks, MiB held (f32), bytes
// in/out, pushes, pulls, checkpoint state. Consistency: shard, updates,
// duplicate and rejected pushes, staleness mean/max, and where relevant (the
// mode's, or any shard's figure is not zero): late gradients as
// "late folded/dropped" (sync with backup workers), too stale (async / ssp
// with max_staleness), waiting pulls (sync with backup workers, ssp) and held
// gradients (ssp).
// A job with sparse tables gets a third table, one row per table per shard:
// rows, memory (MiB and bytes a row), version, rows pushed and pulled, the
// share of that traffic the shard's hottest 1% of rows took; and a line per
// table with the skew of its row traffic over the shards (the busiest
// shard's traffic over the mean; 1.00 is even).
std::string FormatShardsTable(const v1::JobStatus& status);

// That third table and the skew lines ("" for a job without tables).
std::string FormatSparseTables(const v1::JobStatus& status);

// Header, workers table and shards table, separated by blank lines: what
// `grpsctl status` prints.
std::string FormatJobStatus(const v1::JobStatus& status, int64_t now_unix_ms = 0);

// One line summing up a snapshot (state, step, loss, accuracy, throughput,
// live workers, elapsed), without a trailing newline: what `grpsctl watch`
// prints per snapshot when stdout is not a terminal.
std::string FormatStatusLine(const v1::JobStatus& status);

// Per tensor: name, shape, elements, number of chunks and the shard of each
// chunk in offset order; then per shard: address, chunks, elements, MiB; then
// totals. Requires nothing of the map (works on an invalid one too).
std::string FormatShardMap(const v1::ShardMap& map);

// `message` as one line of JSON with the .proto field names (job_id, not
// jobId) and every field present, defaults included. Enums are their names
// and 64-bit integers are strings, as in the proto3 JSON mapping, so
// google::protobuf::util::JsonStringToMessage reads it back unchanged.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);

}  // namespace grps

#endif  // GRPS_CLIENT_STATUS_FORMAT_H_
