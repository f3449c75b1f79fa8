// The main() of the <name>_fuzz_replay binaries: what a libFuzzer binary
// does when given files, for a build without libFuzzer (gcc). Feeds each
// file named on the command line, and every file under each folder named
// (sorted, so runs repeat), to the target's LLVMFuzzerTestOneInput, once.
// Arguments that start with '-' (libFuzzer options) are ignored.
//
// Exits 0 when every input ran (a bug aborts the process on the input that
// found it, after printing its name), 2 on a usage error or when no input
// was found: a regression test over an empty or missing corpus must fail.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

bool Collect(const fs::path& arg, std::vector<fs::path>* inputs) {
  std::error_code error;
  if (fs::is_directory(arg, error)) {
    std::vector<fs::path> found;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(arg, error))
      if (entry.is_regular_file()) found.push_back(entry.path());
    if (error) return false;
    std::sort(found.begin(), found.end());
    inputs->insert(inputs->end(), found.begin(), found.end());
    return true;
  }
  if (!fs::is_regular_file(arg, error)) return false;
  inputs->push_back(arg);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    if (!Collect(argv[i], &inputs)) {
      std::fprintf(stderr, "%s: %s is neither a file nor a folder\n", argv[0], argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_FOLDER... (no input found)\n", argv[0]);
    return 2;
  }
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], path.c_str());
      return 2;
    }
    std::fprintf(stderr, "%s: %s\n", argv[0], path.c_str());
    // Exactly the input's bytes on the heap, as libFuzzer hands them over,
    // so that a sanitizer sees a read past the end.
    std::unique_ptr<uint8_t[]> data(new uint8_t[bytes.size()]);
    std::copy(bytes.begin(), bytes.end(), data.get());
    LLVMFuzzerTestOneInput(data.get(), bytes.size());
  }
  std::printf("%s: %zu inputs replayed\n", argv[0], inputs.size());
  return 0;
}
