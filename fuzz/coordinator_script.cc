#include "fuzz/coordinator_script.h"

#include <cstdio>
#include <cstdlib>

#include "job/job_config.h"

namespace grps {

v1::JobConfig CoordinatorFuzzConfig(uint8_t first_byte) {
  v1::JobConfig c = DefaultJobConfig();
  c.set_job_id(kCoordinatorFuzzJobId);
  c.set_model(v1::MODEL_SOFTMAX);
  c.clear_hidden_units();
  c.set_input_features(4);
  c.set_num_classes(3);
  c.set_chunk_bytes(1024);
  c.set_num_servers(2);
  c.set_num_workers(2);
  c.set_steps(10);
  c.set_heartbeat_interval_ms(100);
  c.set_heartbeat_timeout_ms(1000);
  c.set_recovery_timeout_ms(3000);
  if ((first_byte & kJobUserModel) == kJobUserModel) {
    c.set_model(v1::MODEL_USER);
    c.set_mode(v1::MODE_SYNC);
    if (first_byte & kJobCheckpoints) {
      c.set_checkpoint_dir(kCoordinatorFuzzCheckpointDir);
      c.set_checkpoint_every_steps(2);
    }
    return c;
  }
  if (first_byte & kJobElastic) {
    // The ledger's size is the workers' to say (train_examples), as it is
    // in a job with epochs.
    c.set_max_workers(3);
    c.set_steps(0);
    c.set_epochs(2);
  }
  switch (first_byte & 0x30) {
    case kJobAsync:
      c.set_mode(v1::MODE_ASYNC);
      break;
    case kJobSsp:
      c.set_mode(v1::MODE_SSP);
      c.set_staleness_bound(1);
      break;
    case kJobSyncBackup:
      c.set_mode(v1::MODE_SYNC);
      c.set_backup_workers(1);
      break;
    default:
      c.set_mode(v1::MODE_SYNC);
  }
  if (first_byte & kJobCheckpoints) {
    c.set_checkpoint_dir(kCoordinatorFuzzCheckpointDir);
    c.set_checkpoint_every_steps(2);
  }
  return c;
}

std::vector<CoordinatorRecord> ParseCoordinatorScript(const uint8_t* data, size_t size) {
  std::vector<CoordinatorRecord> records;
  size_t at = 0;
  while (at < size) {
    const uint8_t selector = data[at++];
    size_t length = at < size ? data[at++] : 0;
    if (length > size - at) length = size - at;
    records.push_back({static_cast<CoordinatorAction>((selector & 0x0f) % kActionCount),
                       absl::string_view(reinterpret_cast<const char*>(data + at), length)});
    at += length;
  }
  return records;
}

void AppendCoordinatorRecord(std::string* script, CoordinatorAction action,
                             absl::string_view payload, uint8_t job_bits) {
  if (payload.size() > 255) {
    std::fprintf(stderr, "coordinator script: a payload of %zu bytes does not fit a record\n",
                 payload.size());
    std::abort();
  }
  script->push_back(static_cast<char>(static_cast<uint8_t>(action) | (job_bits & 0xf0)));
  script->push_back(static_cast<char>(payload.size()));
  script->append(payload.data(), payload.size());
}

}  // namespace grps
