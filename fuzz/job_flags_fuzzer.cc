// Fuzz target: the job flags (coordinator/job_flags.h), what turns
// grps-coordinator's command line into the job's JobConfig. The input is
// flag settings, one per line, "name=value" (a leading "--" is allowed);
// each is parsed by Abseil as the command line would be, and only the flags
// job_flags.cc defines are set (others are ignored). Then JobConfigFromFlags
// builds and validates the config. Every input starts from the defaults:
// each job flag is set back to its default value first (absl::FlagSaver
// would do it too, but logs a line per flag restored).
//
// A config it accepts is one the coordinator goes on with: it must pass
// ValidateJobConfig again and its model must cut into a shard map
// (BuildShardMap) that passes ValidateShardMap, the check every server and
// worker applies to the map it receives, with every parameter placed once.
// Configs whose map would have more than kMaxChunks chunks are not mapped:
// the map's size is the operator's choice (--hidden, --chunk_kb), and the
// fuzzer must not spend its memory on it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "coordinator/job_flags.h"
#include "fuzz/fuzz_check.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

constexpr uint64_t kMaxChunks = 1 << 16;

bool IsJobFlag(const absl::CommandLineFlag& flag) {
  return absl::EndsWith(flag.Filename(), "coordinator/job_flags.cc");
}

// Every flag job_flags.cc defines, back to its default.
void ResetJobFlags() {
  static const std::vector<absl::CommandLineFlag*>* const flags = [] {
    auto* job_flags = new std::vector<absl::CommandLineFlag*>();
    for (const auto& [name, flag] : absl::GetAllFlags())
      if (IsJobFlag(*flag)) job_flags->push_back(flag);
    FUZZ_CHECK(!job_flags->empty(), "no flag of coordinator/job_flags.cc is linked in");
    return job_flags;
  }();
  for (absl::CommandLineFlag* flag : *flags) {
    std::string error;
    FUZZ_CHECK(flag->ParseFrom(flag->DefaultValue(), &error),
               absl::StrCat("--", flag->Name(), "'s default does not parse: ", error));
  }
}

// Sets one "name=value" line, if it names a job flag.
void SetFlag(absl::string_view line) {
  absl::ConsumePrefix(&line, "--");
  const size_t eq = line.find('=');
  if (eq == absl::string_view::npos) return;
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(line.substr(0, eq));
  if (flag == nullptr || !IsJobFlag(*flag)) return;
  std::string error;
  flag->ParseFrom(line.substr(eq + 1), &error);  // a bad value leaves the flag as it was
}

void CheckShardMap(const v1::JobConfig& config) {
  const std::vector<v1::TensorSpec> tensors = ModelTensors(config);
  const uint64_t chunk_elements = config.chunk_bytes() / sizeof(float);
  uint64_t chunks = 0, elements = 0;
  for (const v1::TensorSpec& t : tensors) {
    const uint64_t n = static_cast<uint64_t>(NumElements(t));
    chunks += (n + chunk_elements - 1) / chunk_elements;
    elements += n;
  }
  if (chunks > kMaxChunks) return;
  absl::StatusOr<v1::ShardMap> map =
      BuildShardMap(tensors, config.num_servers(), config.chunk_bytes());
  FUZZ_CHECK(map.ok(), absl::StrCat("a valid config has no shard map: ",
                                    map.status().message()));
  absl::Status valid = ValidateShardMap(*map);
  FUZZ_CHECK(valid.ok(), absl::StrCat("the coordinator's own shard map is refused: ",
                                      valid.message()));
  uint64_t placed = 0;
  for (uint64_t bytes : BytesPerShard(*map)) placed += bytes;
  FUZZ_CHECK(placed == elements * sizeof(float),
             absl::StrCat(placed, " bytes placed of ", elements * sizeof(float)));
}

}  // namespace
}  // namespace grps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace grps;
  ResetJobFlags();
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  for (absl::string_view line : absl::StrSplit(input, '\n')) SetFlag(line);
  absl::StatusOr<v1::JobConfig> config = JobConfigFromFlags();
  if (!config.ok()) return 0;
  absl::Status valid = ValidateJobConfig(*config);
  FUZZ_CHECK(valid.ok(), std::string(valid.message()));
  CheckShardMap(*config);
  return 0;
}
