#include "job/user_model.h"

#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "job/shard_map.h"

namespace grps {
namespace {

bool NameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
}

// What a name may hold is printed only once it passed the check.
std::string Describe(int index, const v1::TensorSpec& t) {
  bool printable = t.name().size() <= kMaxTensorNameBytes;
  for (char c : t.name()) printable = printable && NameCharacter(c);
  return printable ? absl::StrCat("tensor ", index, " '", t.name(), "'")
                   : absl::StrCat("tensor ", index);
}

std::string ShapeText(const v1::TensorSpec& t) {
  return absl::StrCat("[", absl::StrJoin(t.shape(), ", "), "]");
}

v1::DType EffectiveDType(const v1::TensorSpec& t) {
  return t.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : t.dtype();
}

std::string GiB(uint64_t bytes) { return absl::StrCat(bytes >> 30, " GiB"); }

absl::Status CheckTensor(int index, const v1::TensorSpec& t) {
  const std::string what = Describe(index, t);
  if (t.name().empty() || t.name().size() > kMaxTensorNameBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a name must have 1 to ", kMaxTensorNameBytes, " characters"));
  for (char c : t.name())
    if (!NameCharacter(c))
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a name may hold only [A-Za-z0-9_.:/-]"));
  if (t.shape_size() > kMaxTensorDims)
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", t.shape_size(), " dims (at most ", kMaxTensorDims, ")"));
  for (int64_t d : t.shape())
    if (d < 1 || d > (int64_t{1} << 40))
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has shape ", ShapeText(t), " (each dim in [1, 2^40])"));
  if (t.initializer() != "given")
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has initializer '", t.initializer().substr(0, 32),
        "' (a user model's values are given by worker rank 0)"));
  const v1::DType d = EffectiveDType(t);
  if (d != v1::DTYPE_F32 && d != v1::DTYPE_F16 && d != v1::DTYPE_BF16)
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has dtype ", static_cast<int>(t.dtype()),
                     " (the shards take float32, float16 and bfloat16 parameters)"));
  // Each dim is at most 2^40, but their product can pass 2^64 and wrap.
  const std::optional<uint64_t> elements = CheckedNumElements(t);
  if (!elements.has_value() || *elements > kMaxUserModelElements)
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has shape ", ShapeText(t), ": more than ", kMaxUserModelElements,
        " elements, ", GiB(kMaxUserModelBytes), " on the shards at 4 bytes an element"));
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateUserModel(const TensorSpecs& tensors) {
  if (tensors.empty())
    return absl::InvalidArgumentError("the model has no tensors (no parameter that trains)");
  if (tensors.size() > kMaxUserTensors)
    return absl::InvalidArgumentError(absl::StrCat(
        "the model has ", tensors.size(), " tensors (at most ", kMaxUserTensors, ")"));
  size_t spec_bytes = 0;
  for (const v1::TensorSpec& t : tensors) spec_bytes += t.ByteSizeLong();
  if (spec_bytes > kMaxUserModelSpecBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("the model's description takes ", spec_bytes, " bytes (at most ",
                     kMaxUserModelSpecBytes, ": it travels in every job status)"));
  absl::flat_hash_set<std::string> names;
  uint64_t elements = 0;
  for (int i = 0; i < tensors.size(); ++i) {
    if (absl::Status s = CheckTensor(i, tensors[i]); !s.ok()) return s;
    if (!names.insert(tensors[i].name()).second)
      return absl::InvalidArgumentError(
          absl::StrCat(Describe(i, tensors[i]), ": the name appears twice"));
    // Each term is at most kMaxUserModelElements (CheckTensor): no wrap.
    elements += static_cast<uint64_t>(NumElements(tensors[i]));
    if (elements > kMaxUserModelElements)
      return absl::InvalidArgumentError(absl::StrCat(
          "the model has more than ", kMaxUserModelElements, " elements, ",
          GiB(kMaxUserModelBytes), " on the shards at 4 bytes an element (at ",
          Describe(i, tensors[i]), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckUserModelChunks(const TensorSpecs& tensors, uint64_t chunk_bytes) {
  uint64_t chunks = 0;
  for (const v1::TensorSpec& t : tensors)
    chunks += ChunksOfTensor(static_cast<uint64_t>(NumElements(t)), chunk_bytes);
  if (chunks > kMaxUserModelChunks)
    return absl::InvalidArgumentError(absl::StrCat(
        "the model cuts into ", chunks, " chunks of ", chunk_bytes, " bytes (at most ",
        kMaxUserModelChunks, ", which every shard map carries); a job with a larger "
        "--chunk_bytes cuts it into fewer"));
  return absl::OkStatus();
}

std::string FirstModelDifference(const TensorSpecs& defined, const TensorSpecs& offered) {
  for (int i = 0; i < std::min(defined.size(), offered.size()); ++i) {
    const v1::TensorSpec& d = defined[i];
    const v1::TensorSpec& o = offered[i];
    const std::string what = Describe(i, o);
    if (d.name() != o.name())
      return absl::StrCat(what, " is '", d.name(), "' in the job's model");
    if (std::vector<int64_t>(d.shape().begin(), d.shape().end()) !=
        std::vector<int64_t>(o.shape().begin(), o.shape().end()))
      return absl::StrCat(what, " has shape ", ShapeText(o), ", the job's ", ShapeText(d));
    if (EffectiveDType(d) != EffectiveDType(o))
      return absl::StrCat(what, " has dtype ", v1::DType_Name(EffectiveDType(o)), ", the job's ",
                          v1::DType_Name(EffectiveDType(d)));
    if (d.initializer() != o.initializer())
      return absl::StrCat(what, " has initializer '", o.initializer(), "', the job's '",
                          d.initializer(), "'");
  }
  if (offered.size() < defined.size())
    return absl::StrCat("the model lacks ", Describe(offered.size(), defined[offered.size()]),
                        " of the job's model (", defined.size(), " tensors, this one ",
                        offered.size(), ")");
  if (offered.size() > defined.size())
    return absl::StrCat(Describe(defined.size(), offered[defined.size()]),
                        " is not in the job's model (", defined.size(), " tensors)");
  return "";
}

namespace {
constexpr char kMismatch[] = "this worker's model is not job ";
}  // namespace

absl::Status ModelMismatchError(const std::string& job_id, const std::string& difference) {
  return absl::FailedPreconditionError(absl::StrCat(kMismatch, job_id, "'s: ", difference));
}

bool IsModelMismatch(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) &&
         absl::StrContains(status.message(), kMismatch);
}

}  // namespace grps
