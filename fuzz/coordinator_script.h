// The input format of the coordinator fuzz target (coordinator_fuzzer.cc),
// shared with the corpus generator (corpus_main.cc) that writes its seeds.
//
// An input is a script of records, each
//
//   [selector: 1 byte][length: 1 byte][payload: `length` bytes, or the rest]
//
// The selector's low nibble (mod kActionCount) is the action: one of the
// coordinator's request messages, parsed from the payload with protobuf and
// handed to that CoordinatorService handler, or kAdvanceClock. The first
// record's selector also picks the job, from its high nibble (see
// CoordinatorFuzzConfig), so the first byte of an input says both what the
// job is and which request comes first.
//
// The job is tiny (softmax 4 -> 3: one chunk per tensor, one per shard) with
// 2 shards and 2 workers, and its clock starts at the Unix epoch and moves
// only with kAdvanceClock, so registrations get incarnations 1, 2, 3, ... in
// order, which seeds can name. Two more kinds of job (kJobElastic,
// kJobUserModel) take the requests a worker-token holder may send beyond
// those: LeaseExamples and DefineModel.
#ifndef GRPS_FUZZ_COORDINATOR_SCRIPT_H_
#define GRPS_FUZZ_COORDINATOR_SCRIPT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/grps.pb.h"

namespace grps {

inline constexpr char kCoordinatorFuzzJobId[] = "fuzz-job";
// Where the job's checkpoints and the coordinator's state file go, in the
// target's MemoryEnv.
inline constexpr char kCoordinatorFuzzCheckpointDir[] = "/fuzz/ckpt";
inline constexpr char kCoordinatorFuzzStatePath[] = "/fuzz/coordinator.state";

enum class CoordinatorAction : uint8_t {
  kRegisterServer = 0,  // RegisterServerRequest
  kRegisterWorker = 1,  // RegisterWorkerRequest
  kHeartbeat = 2,       // HeartbeatRequest
  kWorkerDone = 3,      // WorkerDoneRequest
  kGetShardMap = 4,     // GetShardMapRequest
  kGetJobStatus = 5,    // GetJobStatusRequest
  kStopJob = 6,         // StopJobRequest
  kCheckpointJob = 7,   // CheckpointJobRequest
  // The fake clock moves on by the payload's first 4 bytes (little-endian
  // milliseconds, at most kMaxClockStepMs), then DetectFailures runs, as the
  // coordinator's main loop calls it.
  kAdvanceClock = 8,
  kDefineModel = 9,     // DefineModelRequest
  kLeaseExamples = 10,  // LeaseExamplesRequest
};
inline constexpr int kActionCount = 11;
inline constexpr uint32_t kMaxClockStepMs = 10 * 60 * 1000;

// Selector high-nibble bits that pick the job (the first record's only).
inline constexpr uint8_t kJobAsync = 0x10;     // mode: 0x00 sync, 0x10 async,
inline constexpr uint8_t kJobSsp = 0x20;       //   0x20 ssp (staleness 1),
inline constexpr uint8_t kJobSyncBackup = 0x30;  // 0x30 sync with 1 backup worker
inline constexpr uint8_t kJobCheckpoints = 0x40;  // checkpoint_dir set
// With the mode bits 0x00, 0x10 or 0x20: an elastic job of that mode
// (max_workers 3: rank 2 may join it once it runs; 2 epochs of the data,
// leased, whose size the first lease says);
// with 0x30: a sync job of the user's model (MODEL_USER: its servers
// register once a DefineModel defined it).
inline constexpr uint8_t kJobElastic = 0x80;
inline constexpr uint8_t kJobUserModel = 0xb0;

struct CoordinatorRecord {
  CoordinatorAction action;
  absl::string_view payload;  // points into the input
};

// The job of an input whose first byte is `first_byte`; valid
// (ValidateJobConfig).
v1::JobConfig CoordinatorFuzzConfig(uint8_t first_byte);

// The records of an input, in order (none for an empty one).
std::vector<CoordinatorRecord> ParseCoordinatorScript(const uint8_t* data, size_t size);

// Appends a record to `script` (for seeds): `payload` is cut at 255 bytes.
// `job_bits` (kJob*) go into the selector; they count for the first record.
void AppendCoordinatorRecord(std::string* script, CoordinatorAction action,
                             absl::string_view payload, uint8_t job_bits = 0);

}  // namespace grps

#endif  // GRPS_FUZZ_COORDINATOR_SCRIPT_H_
