// Sparse tables (JobConfig.sparse_tables): which shard holds a row, what a
// new row holds, and what a valid table spec is. Shared by the worker (which
// splits a batch's ids by shard) and the server (which checks that every id
// it is sent is its own). Knows no network.
#ifndef GRPS_JOB_SPARSE_TABLES_H_
#define GRPS_JOB_SPARSE_TABLES_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/grps.pb.h"

namespace grps {

// The shard that holds row `id` of every table: a SplitMix64 hash of the id
// modulo num_servers, so consecutive ids spread evenly and every worker and
// server agree. Requires num_servers >= 1.
uint32_t SparseShardOf(int64_t id, uint32_t num_servers);

// The half-width of a table's initial values: spec.init_scale, or
// 0.5 / sqrt(dim) when it is 0.
float SparseInitScale(const v1::SparseTableSpec& spec);

// Writes the initial values of row `id` (spec.dim floats): uniform in
// [-scale, scale], from (seed, table name, id, element) only, so a row is
// the same whichever shard creates it and whenever.
void InitializeSparseRow(const v1::SparseTableSpec& spec, uint64_t seed,
                         int64_t id, float* out);

// Whether `id` is a valid row id of the table (in [0, rows) when rows > 0).
bool SparseIdInRange(const v1::SparseTableSpec& spec, int64_t id);

// Checks the job's tables (name syntax and uniqueness, dim, init_scale);
// InvalidArgument names the table and the field.
absl::Status ValidateSparseTables(const v1::JobConfig& config);

// Floats of each optimizer state slot a row of the table keeps: 1 with
// rowwise_adagrad, else dim.
uint32_t SparseStateWidth(const v1::SparseTableSpec& spec);
// The same, as a checkpoint's rows of a table say (state_width; 0: dim).
uint32_t TableStateWidth(const v1::TableState& state);

// Checks that a checkpoint's rows of a table (TableState) are whole rows of
// `dim` floats: as many values as ids times dim, `slots` optimizer state
// slots of ids times its state width (1 or dim) each, and no update count
// or one per row. The rows'
// ids are not looked at. INVALID_ARGUMENT says what does not fit (the
// caller names the table and the file).
absl::Status CheckTableState(const v1::TableState& state, uint32_t dim, int slots);

// Whether the table manages its own rows: eviction, admit_after or
// evict_after_updates set (server/sparse_rows.h).
bool IsManagedTable(const v1::SparseTableSpec& spec);

// The table of that name, or null.
const v1::SparseTableSpec* FindSparseTable(const v1::JobConfig& config,
                                           std::string_view name);

// "NAME:ROWS:DIM[:INIT_SCALE][:KEY=VALUE...],...": the tables of a user
// model (--sparse_tables), each option as SetTableOption takes it.
// INVALID_ARGUMENT for an entry that does not parse; the values are checked
// by ValidateSparseTables.
absl::StatusOr<std::vector<v1::SparseTableSpec>> ParseSparseTables(absl::string_view text);

// One option of a table (SparseTableSpec): max_rows=N (max_rows_per_shard),
// eviction=none|lru|lfu, admit_after=K, evict_after=N (evict_after_updates).
// INVALID_ARGUMENT for another key or a value that does not parse.
absl::Status SetTableOption(absl::string_view key, absl::string_view value,
                            v1::SparseTableSpec* t);

}  // namespace grps

#endif  // GRPS_JOB_SPARSE_TABLES_H_
