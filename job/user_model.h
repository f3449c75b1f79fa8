// The user's own model (MODEL_USER, docs/pytorch.md): its dense tensors are
// described by the job's first worker (Coordinator.DefineModel) rather than
// built in. These are the rules an offer must keep, checked once at the
// coordinator (and by the worker before it offers), and the comparison that
// tells a worker whose model differs which tensor differs.
#ifndef GRPS_JOB_USER_MODEL_H_
#define GRPS_JOB_USER_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/repeated_field.h"
#include "proto/grps.pb.h"

namespace grps {

using TensorSpecs = google::protobuf::RepeatedPtrField<v1::TensorSpec>;

// Bounds of a model a job takes. The model travels in every JobStatus and
// registration reply (JobConfig.model_tensors), and its chunks in every
// shard map, so both its description and its chunk count are bounded, well
// below gRPC's 64 MiB message; a large LLM has a few thousand tensors.
inline constexpr int kMaxUserTensors = 16384;
inline constexpr size_t kMaxUserModelSpecBytes = size_t{1} << 20;  // serialized specs
inline constexpr size_t kMaxTensorNameBytes = 256;
inline constexpr int kMaxTensorDims = 16;
// What the shards hold of the model, each tensor and all of them together:
// 4 bytes an element, whatever the tensor's dtype (the shards keep float32
// weights), at most 16 GiB.
inline constexpr uint64_t kMaxUserModelBytes = uint64_t{16} << 30;
inline constexpr uint64_t kMaxUserModelElements = kMaxUserModelBytes / sizeof(float);
// Chunks of the model's shard map (CheckUserModelChunks).
inline constexpr uint64_t kMaxUserModelChunks = uint64_t{1} << 18;

// INVALID_ARGUMENT naming the first tensor that breaks a rule: at least one
// tensor and at most kMaxUserTensors, kMaxUserModelSpecBytes serialized;
// names unique, 1..kMaxTensorNameBytes of [A-Za-z0-9_.:/-]; at most
// kMaxTensorDims dims, each in [1, 2^40] (no dims: a scalar, one element);
// initializer "given"; dtype f32, f16 or bf16 (UNSPECIFIED: f32); at most
// kMaxUserModelBytes on the shards, for each tensor (its element count
// computed without overflow) and for the whole model.
absl::Status ValidateUserModel(const TensorSpecs& tensors);

// INVALID_ARGUMENT when a model that passed ValidateUserModel cuts into more
// than kMaxUserModelChunks chunks of `chunk_bytes` (BuildShardMap's cut).
absl::Status CheckUserModelChunks(const TensorSpecs& tensors, uint64_t chunk_bytes);

// Empty when `offered` is the model `defined`; otherwise what differs,
// naming the first tensor (by position) that does: "tensor 3 'fc.weight'
// has shape [10, 64], the job's [10, 32]", a missing or an extra tensor.
std::string FirstModelDifference(const TensorSpecs& defined, const TensorSpecs& offered);

// FAILED_PRECONDITION: a worker's model is not job `job_id`'s, because of
// `difference` (FirstModelDifference). IsModelMismatch recognises it, also
// after it crossed gRPC (by code and message).
absl::Status ModelMismatchError(const std::string& job_id, const std::string& difference);
bool IsModelMismatch(const absl::Status& status);

}  // namespace grps

#endif  // GRPS_JOB_USER_MODEL_H_
