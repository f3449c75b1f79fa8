// grps._grps: the grps Python package's bridge to the C++ worker core
// (worker/user_worker.h). Thin on purpose: arrays cross as buffers (numpy
// views of the user's torch tensors, never copied here), a Status becomes an
// exception, and every call that waits releases the GIL. No torch header:
// the package works with whatever PyTorch the user has.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <Python.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "client/job_client.h"
#include "client/lookup_client.h"
#include "data/criteo.h"
#include "daemon/daemon.h"
#include "daemon/security.h"
#include "google/protobuf/util/json_util.h"
#include "job/job_config.h"
#include "job/user_model.h"
#include "proto/grps.grpc.pb.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "tensor/dtype.h"
#include "wire/chunk_codec.h"
#include "worker/curve_file.h"
#include "worker/straggler.h"
#include "worker/user_worker.h"

namespace py = pybind11;

namespace grps {
namespace {

// Python exceptions of the grps package (grps.Error and its kinds).
PyObject* error_base = nullptr;
PyObject* job_ended_error = nullptr;
PyObject* model_mismatch_error = nullptr;

// A failed Status as the exception a Python user expects: ValueError for
// bad input, grps.ModelMismatch, grps.JobEnded, KeyboardInterrupt for a
// signal, grps.Error otherwise (with the status code's name).
[[noreturn]] void Raise(const absl::Status& s) {
  const std::string message(s.message());
  if (absl::IsInvalidArgument(s)) throw py::value_error(message);
  if (IsJobEnded(s)) {
    PyErr_SetString(job_ended_error, message.c_str());
    throw py::error_already_set();
  }
  if (IsModelMismatch(s)) {
    PyErr_SetString(model_mismatch_error, message.c_str());
    throw py::error_already_set();
  }
  if (absl::IsCancelled(s) && PyErr_Occurred() != nullptr) throw py::error_already_set();
  PyErr_SetString(error_base,
                  absl::StrCat(absl::StatusCodeToString(s.code()), ": ", message).c_str());
  throw py::error_already_set();
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

// A writable (or read-only) C-contiguous float32 buffer of exactly `n`
// elements; ValueError otherwise.
float* FloatBuffer(const py::buffer& b, int64_t n, bool writable, const char* what) {
  py::buffer_info info = b.request(writable);
  if (info.itemsize != 4 || info.format != py::format_descriptor<float>::format())
    throw py::value_error(absl::StrCat(what, " must be float32 (got format '", info.format,
                                       "')"));
  if (info.size != n)
    throw py::value_error(absl::StrCat(what, " has ", info.size, " elements, the model ", n));
  int64_t expected = 4;
  for (int d = static_cast<int>(info.ndim) - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected)
      throw py::value_error(absl::StrCat(what, " must be contiguous"));
    expected *= info.shape[d];
  }
  return static_cast<float*>(info.ptr);
}

// Polled by waits (on the waiting thread, without the GIL): a Ctrl-C in
// the Python process ends them. The GIL is taken only to ask.
// Only the main thread runs Python's signal handlers; other threads (gRPC's,
// the heartbeat's) never take the GIL here.
std::thread::id main_thread;

bool PythonSignalPending() {
  if (std::this_thread::get_id() != main_thread) return false;
  py::gil_scoped_acquire gil;
  return PyErr_CheckSignals() != 0;
}

void SetFlag(const char* name, const std::string& value) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  std::string error;
  if (flag == nullptr || !flag->ParseFrom(value, &error))
    throw py::value_error(absl::StrCat("--", name, "=", value, ": ", error));
}

// The process's security from GRPS_* variables, then from the arguments
// given (non-empty ones win). Once per process is enough; again replaces it.
void Configure(const std::map<std::string, std::string>& overrides) {
  static std::atomic<bool> logging{false};
  if (!logging.exchange(true) && spdlog::get("grps") == nullptr) {
    auto logger = spdlog::stderr_color_mt("grps");
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [grps] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
  }
  Check(SetFlagsFromEnvironment());
  for (const auto& [name, value] : overrides)
    if (!value.empty()) SetFlag(name.c_str(), value);
  Check(InitProcessSecurity(Role::kWorker, /*serves=*/false));
}

TensorSpecs ModelOf(const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string>>&
                        tensors) {
  TensorSpecs specs;
  for (const auto& [name, shape, dtype] : tensors) {
    v1::TensorSpec* t = specs.Add();
    t->set_name(name);
    for (int64_t d : shape) t->add_shape(d);
    t->set_initializer("given");
    if (dtype == "float32") t->set_dtype(v1::DTYPE_F32);
    else if (dtype == "float16") t->set_dtype(v1::DTYPE_F16);
    else if (dtype == "bfloat16") t->set_dtype(v1::DTYPE_BF16);
    else
      throw py::value_error(absl::StrCat("parameter '", name, "' is ", dtype,
                                         ": the shards take float32, float16 and bfloat16"));
  }
  return specs;
}

// The job's status as JSON (proto field names), for grps.JobClient.
// A message as JSON with the proto's field names and every field printed.
std::string AsJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok())
    Raise(absl::InternalError(absl::StrCat("a ", message.GetTypeName(),
                                           " that does not print as JSON")));
  return json;
}

// The job's status through grpsctl's client (JobClient), as JSON.
std::string JobStatusJson(const std::string& address, double timeout_s) {
  absl::StatusOr<v1::JobStatus> status;
  {
    py::gil_scoped_release nogil;
    status = JobClient(address, absl::Seconds(timeout_s)).GetStatus();
  }
  if (!status.ok()) Raise(status.status());
  return AsJson(*status);
}

// The dense tensors of a checkpoint (a ckpt-<id> folder, or a
// checkpoint_dir's newest), as (name, shape, float32 bytes).
std::vector<std::tuple<std::string, std::vector<int64_t>, py::bytes>> ReadCheckpoint(
    const std::string& path) {
  absl::StatusOr<std::vector<NamedTensor>> tensors;
  {
    py::gil_scoped_release nogil;
    tensors = ReadCheckpointTensors(Env::Default(), path);
  }
  if (!tensors.ok()) Raise(tensors.status());
  std::vector<std::tuple<std::string, std::vector<int64_t>, py::bytes>> out;
  for (const NamedTensor& t : *tensors)
    out.emplace_back(t.name, t.shape,
                     py::bytes(reinterpret_cast<const char*>(t.values.data()),
                               t.values.size() * sizeof(float)));
  return out;
}

class PyWorker {
 public:
  PyWorker(const std::string& coordinator,
           const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string>>& model,
           int rank, double register_timeout_s, const std::string& job_id,
           const std::string& optimizer) {
    UserWorker::Options options;
    if (!optimizer.empty()) {
      absl::StatusOr<v1::OptimizerKind> kind = ParseOptimizer(optimizer);
      if (!kind.ok()) Raise(kind.status());
      options.optimizer = *kind;
    }
    options.coordinator = coordinator;
    options.job_id = job_id;
    options.rank = rank;
    options.register_timeout = absl::Seconds(register_timeout_s);
    options.interrupted = &PythonSignalPending;
    const TensorSpecs specs = ModelOf(model);
    absl::StatusOr<std::unique_ptr<UserWorker>> joined;
    {
      py::gil_scoped_release nogil;
      joined = UserWorker::Join(options, specs);
    }
    if (!joined.ok()) Raise(joined.status());
    worker_ = std::move(*joined);
  }

  void Begin(const py::buffer& params, bool give_initial) {
    float* p = Params(params);
    Check(Released([&] { return worker_->Begin(p, give_initial ? p : nullptr); }));
  }

  py::dict Step(const py::buffer& grads, const py::buffer& params, uint32_t samples) {
    const float* g = FloatBuffer(grads, worker_->num_parameters(), false, "the gradient");
    float* p = Params(params);
    absl::StatusOr<UserWorker::StepOutcome> outcome;
    {
      py::gil_scoped_release nogil;
      outcome = worker_->Step(g, samples, p);
    }
    if (!outcome.ok()) Raise(outcome.status());
    py::dict d;
    d["rolled_back"] = outcome->rolled_back;
    d["late"] = outcome->late;
    d["too_stale"] = outcome->too_stale;
    return d;
  }

  // Tensor `t`'s gradient in `grads` is final for this step: its parts go
  // now (overlap; UserWorker::TensorReady).
  void TensorReady(uint32_t t, const py::buffer& grads, const py::buffer& params) {
    const float* g = FloatBuffer(grads, worker_->num_parameters(), false, "the gradient");
    float* p = Params(params);
    Check(Released([&] { return worker_->TensorReady(t, g, p); }));
  }

  // The index of the first element of `grads` that is not finite, or -1.
  int64_t FirstNonFinite(const py::buffer& grads) {
    const float* g = FloatBuffer(grads, worker_->num_parameters(), false, "the gradient");
    py::gil_scoped_release nogil;
    return grps::FirstNonFinite(g, worker_->num_parameters());
  }

  void AbandonStep() {
    py::gil_scoped_release nogil;
    worker_->AbandonStep();
  }

  // The program's optimizer (UserWorker::SetOptimizers): one dict per param
  // group ("kind": "sgd", "momentum", "nesterov", "adam" or "adagrad";
  // "lr", "momentum", "beta1", "beta2", "epsilon", "weight_decay" as floats;
  // "decoupled_weight_decay" for AdamW) and, by tensor, the 1-based group
  // its update runs (0: the job's optimizer).
  void SetOptimizers(const py::list& groups, std::vector<uint32_t> by_tensor) {
    std::vector<v1::OptimizerConfig> optimizers;
    for (const py::handle& item : groups) {
      const py::dict g = py::cast<py::dict>(item);
      v1::OptimizerConfig& o = optimizers.emplace_back();
      absl::StatusOr<v1::OptimizerKind> kind = ParseOptimizer(py::cast<std::string>(g["kind"]));
      if (!kind.ok()) Raise(kind.status());
      o.set_kind(*kind);
      auto number = [&g](const char* key) {
        return g.contains(key) ? py::cast<float>(g[key]) : 0.0f;
      };
      o.set_learning_rate(number("lr"));
      o.set_momentum(number("momentum"));
      o.set_beta1(number("beta1"));
      o.set_beta2(number("beta2"));
      o.set_epsilon(number("epsilon"));
      o.set_weight_decay(number("weight_decay"));
      o.set_decoupled_weight_decay(g.contains("decoupled_weight_decay") &&
                                   py::cast<bool>(g["decoupled_weight_decay"]));
    }
    Check(worker_->SetOptimizers(std::move(optimizers), std::move(by_tensor)));
  }

  // The job's optimizer state (UserWorker::ReadOptimizerState): a dict of
  // "kind" (the job's optimizer kind's name), "slots" (a list of float32
  // arrays over the flat parameters, ChunkOptimizerState's order) and
  // "steps" (by tensor).
  py::dict OptimizerState() {
    absl::StatusOr<ParameterClient::OptimizerState> state;
    {
      py::gil_scoped_release nogil;
      state = worker_->ReadOptimizerState();
    }
    if (!state.ok()) Raise(state.status());
    py::list slots;
    for (std::vector<float>& slot : state->slots) {
      py::array_t<float> array(static_cast<py::ssize_t>(slot.size()));
      std::copy(slot.begin(), slot.end(), array.mutable_data());
      slots.append(std::move(array));
    }
    py::dict d;
    d["kind"] = OptimizerName(state->kind);
    d["slots"] = slots;
    d["steps"] = state->steps;
    return d;
  }

  // A program's saved optimizer state (UserWorker::LoadOptimizerState), in
  // OptimizerState's form: `slots` each num_parameters float32 values.
  void LoadOptimizerState(const std::string& kind, const py::list& slots,
                          std::vector<uint64_t> steps) {
    ParameterClient::OptimizerState state;
    absl::StatusOr<v1::OptimizerKind> parsed = ParseOptimizer(kind);
    if (!parsed.ok()) Raise(parsed.status());
    state.kind = *parsed;
    for (const py::handle& slot : slots) {
      const float* values = FloatBuffer(py::cast<py::buffer>(slot), worker_->num_parameters(),
                                        false, "an optimizer state slot");
      state.slots.emplace_back(values, values + worker_->num_parameters());
    }
    state.steps = std::move(steps);
    Check(Released([&] { return worker_->LoadOptimizerState(std::move(state)); }));
  }

  bool LeaveRequested() const { return worker_->LeaveRequested(); }
  void Leave() { Check(Released([&] { return worker_->Leave(); })); }

  // `declined`: asked for the final evaluation, the program has none.
  void Done(std::optional<float> accuracy, std::optional<float> loss, std::optional<float> auc,
            bool declined) {
    std::optional<UserWorker::Evaluation> eval;
    if (accuracy.has_value())
      eval = UserWorker::Evaluation{*accuracy, loss.value_or(-1), auc.value_or(-1)};
    Check(Released([&] { return worker_->Done(eval, declined); }));
  }

  // A collective among the live workers (UserWorker::Collective): a list of
  // (rank, payload), in rank order.
  py::list Collective(const std::string& name, std::string payload, double timeout_s) {
    absl::StatusOr<std::vector<std::pair<uint32_t, std::string>>> all;
    {
      py::gil_scoped_release nogil;
      all = worker_->Collective(name, std::move(payload), absl::Seconds(timeout_s));
    }
    if (!all.ok()) Raise(all.status());
    py::list out;
    for (const auto& [rank, bytes] : *all) out.append(py::make_tuple(rank, py::bytes(bytes)));
    return out;
  }

  bool AwaitEnd() {
    absl::StatusOr<bool> asked;
    {
      py::gil_scoped_release nogil;
      asked = worker_->AwaitEnd();
    }
    if (!asked.ok()) Raise(asked.status());
    return *asked;
  }

  void PullFinal(const py::buffer& params) {
    float* p = Params(params);
    Check(Released([&] { return worker_->PullFinal(p); }));
  }

  // Rows `ids` (int64, any order, repeats allowed) of `table` into `out`
  // (len(ids) x dim float32), as of this worker's step.
  void PullRows(const std::string& table, const py::buffer& ids, const py::buffer& out) {
    const absl::Span<const int64_t> id_span = Ids(ids);
    float* o = FloatBuffer(out, static_cast<int64_t>(id_span.size()) * TableDim(table), true,
                           "the rows");
    Check(Released([&] { return worker_->PullRows(table, id_span, o); }));
  }

  // Gradients of distinct `ids` of `table` for this worker's step.
  void PushRows(const std::string& table, const py::buffer& ids, const py::buffer& grads) {
    const absl::Span<const int64_t> id_span = Ids(ids);
    const float* g = FloatBuffer(grads, static_cast<int64_t>(id_span.size()) * TableDim(table),
                                 false, "the row gradients");
    Check(Released([&] { return worker_->PushRows(table, id_span, g); }));
  }

  // An elastic job's block for `step` (UserWorker::LeaseBlock): its example
  // indices (int64 array) and epoch, or None once the ledger has no block
  // left.
  py::object LeaseBlock(uint64_t train_examples, uint64_t step) {
    absl::StatusOr<UserWorker::Block> block;
    Check(Released([&] {
      block = worker_->LeaseBlock(train_examples, step);
      return absl::IsOutOfRange(block.status()) ? absl::OkStatus() : block.status();
    }));
    if (!block.ok()) return py::none();
    py::array_t<int64_t> examples(static_cast<py::ssize_t>(block->examples.size()));
    std::copy(block->examples.begin(), block->examples.end(), examples.mutable_data());
    return py::make_tuple(examples, block->epoch);
  }

  // The program's count of steps; returns the job's (UserWorker::SetTotalSteps).
  uint64_t SetTotalSteps(uint64_t steps) {
    absl::StatusOr<uint64_t> total = worker_->SetTotalSteps(steps);
    if (!total.ok()) Raise(total.status());
    return *total;
  }

  void ReportLoss(float loss) { worker_->ReportLoss(loss); }
  uint32_t rank() const { return worker_->rank(); }
  uint32_t size() const { return worker_->num_workers(); }
  uint64_t step() const { return worker_->step(); }
  uint64_t total_steps() const { return worker_->total_steps(); }
  bool elastic() const { return IsElastic(worker_->config()); }
  uint64_t step_examples() const { return StepExamples(worker_->config()); }
  int64_t num_parameters() const { return worker_->num_parameters(); }
  bool can_overlap() const { return worker_->CanOverlap(); }
  bool defined_model() const { return worker_->defined_model(); }
  std::string mode() const { return ModeName(worker_->config().mode()); }
  std::string job_id() const { return worker_->config().job_id(); }
  std::string config_json() const { return AsJson(worker_->config()); }
  std::vector<std::tuple<std::string, uint64_t, uint32_t>> tables() const {
    std::vector<std::tuple<std::string, uint64_t, uint32_t>> out;
    for (const v1::SparseTableSpec& t : worker_->config().sparse_tables())
      out.emplace_back(t.name(), t.rows(), t.dim());
    return out;
  }

 private:
  template <typename F>
  absl::Status Released(F f) {
    py::gil_scoped_release nogil;
    return f();
  }
  float* Params(const py::buffer& b) {
    return FloatBuffer(b, worker_->num_parameters(), true, "the parameters");
  }
  uint32_t TableDim(const std::string& table) const {
    absl::StatusOr<uint32_t> dim = worker_->TableDim(table);
    if (!dim.ok()) Raise(dim.status());
    return *dim;
  }
  static absl::Span<const int64_t> Ids(const py::buffer& ids) {
    py::buffer_info info = ids.request();
    if (info.itemsize != 8 || (info.format != "l" && info.format != "q") || info.ndim != 1 ||
        (info.size > 1 && info.strides[0] != 8))
      throw py::value_error("ids must be a contiguous 1-d int64 array");
    return absl::MakeConstSpan(static_cast<const int64_t*>(info.ptr),
                               static_cast<size_t>(info.size));
  }

  std::unique_ptr<UserWorker> worker_;
};

}  // namespace
}  // namespace grps

namespace grps {
namespace {

void BindStraggler(py::module_& m) {
  // grps-worker's injected slowness (worker/straggler.h), for grps.torch's
  // straggler rank: after_step(seconds) is the sleep that follows a step.
  py::class_<grps::Straggler>(m, "Straggler")
      .def(py::init([](double factor, double delay_s) {
             absl::StatusOr<grps::Straggler> s =
                 grps::Straggler::Create(factor, absl::Seconds(delay_s));
             if (!s.ok()) grps::Raise(s.status());
             return *s;
           }),
           py::arg("factor"), py::arg("delay_s"))
      .def("after_step", [](grps::Straggler& s, double step_s) {
        return absl::ToDoubleSeconds(s.AfterStep(absl::Seconds(step_s)));
      });
}

void BindCurveFile(py::module_& m) {
  // grps-worker's training curve (worker/curve_file.h), for grps.torch's
  // GRPS_CURVE_CSV: CurveFile(path, start_unix_s) writes the header, and
  // write(...) a row written now.
  py::class_<grps::CurveFile>(m, "CurveFile")
      .def(py::init([](const std::string& path, double start_unix_s) {
             absl::StatusOr<std::unique_ptr<grps::CurveFile>> curve = grps::CurveFile::Create(
                 path, absl::UnixEpoch() + absl::Seconds(start_unix_s));
             if (!curve.ok()) grps::Raise(curve.status());
             return std::move(*curve);
           }),
           py::arg("path"), py::arg("start_unix_s"))
      .def(
          "write",
          [](grps::CurveFile& curve, uint64_t step, uint32_t epoch, double loss,
             double samples_per_sec, double test_accuracy, double test_loss, bool evaluated,
             double test_auc) {
            grps::CurveRow row;
            row.step = step;
            row.epoch = epoch;
            row.loss = loss;
            row.samples_per_sec = samples_per_sec;
            row.test_accuracy = test_accuracy;
            row.test_loss = test_loss;
            row.evaluated = evaluated;
            row.test_auc = test_auc;
            curve.Write(row, absl::Now());
          },
          py::arg("step"), py::arg("epoch"), py::arg("loss"), py::arg("samples_per_sec"),
          py::arg("test_accuracy"), py::arg("test_loss"), py::arg("evaluated"),
          py::arg("test_auc") = -1.0);
}

void BindCriteoReader(py::module_& m) {
  // data/criteo.h's streaming reader, for grps.criteo: next(max) is the next
  // (labels, dense, ids) of this rank's share as numpy arrays (float32 n,
  // float32 n x 13, int64 n x 26), or None at the end of the file.
  py::class_<grps::CriteoReader>(m, "CriteoReader")
      .def(py::init([](const std::string& path, uint32_t rank, uint32_t world) {
             absl::StatusOr<grps::CriteoReader> reader =
                 grps::CriteoReader::Open(path, rank, world);
             if (!reader.ok()) grps::Raise(reader.status());
             return std::move(*reader);
           }),
           py::arg("path"), py::arg("rank"), py::arg("world"))
      .def(
          "next",
          [](grps::CriteoReader& reader, int64_t max) -> py::object {
            if (max < 1) throw py::value_error("max must be at least 1");
            grps::CriteoBatch batch;
            absl::StatusOr<int64_t> n;
            {
              py::gil_scoped_release nogil;
              n = reader.Next(max, &batch);
            }
            if (!n.ok()) grps::Raise(n.status());
            if (*n == 0) return py::none();
            auto copy = [](const auto& v, std::vector<py::ssize_t> shape) {
              using T = typename std::decay_t<decltype(v)>::value_type;
              py::array_t<T> out(shape);
              std::copy(v.begin(), v.end(), out.mutable_data());
              return out;
            };
            return py::make_tuple(copy(batch.labels, {*n}),
                                  copy(batch.dense, {*n, grps::kCriteoDense}),
                                  copy(batch.ids, {*n, grps::kCriteoTables}));
          },
          py::arg("max"))
      .def_property_readonly("lines", &grps::CriteoReader::lines);
}

void BindLookupClient(py::module_& m) {
  // client/lookup_client.h, for grps.LookupClient: lookup(table, ids) is
  // (rows float32 n x dim, missing uint32 positions, checkpoint_id, step).
  py::class_<grps::LookupClient>(m, "LookupClient")
      .def(py::init([](const std::string& address, double timeout_s) {
             return std::make_unique<grps::LookupClient>(address, absl::Seconds(timeout_s));
           }),
           py::arg("address"), py::arg("timeout_s") = 10.0)
      .def(
          "lookup",
          [](const grps::LookupClient& client, const std::string& table,
             const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& ids) {
            if (ids.ndim() != 1) throw py::value_error("ids must be a 1-d array of int64");
            const auto n = static_cast<size_t>(ids.size());
            absl::StatusOr<grps::LookedUpRows> rows;
            {
              py::gil_scoped_release nogil;
              rows = client.Lookup(table, absl::MakeConstSpan(ids.data(), n));
            }
            if (!rows.ok()) grps::Raise(rows.status());
            py::array_t<float> values(
                {static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(rows->dim)});
            std::copy(rows->values.begin(), rows->values.end(), values.mutable_data());
            py::array_t<uint32_t> missing(static_cast<py::ssize_t>(rows->missing.size()));
            std::copy(rows->missing.begin(), rows->missing.end(), missing.mutable_data());
            return py::make_tuple(values, missing, rows->checkpoint_id, rows->step);
          },
          py::arg("table"), py::arg("ids"))
      .def("status_json", [](const grps::LookupClient& client) {
        absl::StatusOr<grps::v1::LookupStatusResponse> status;
        {
          py::gil_scoped_release nogil;
          status = client.Status();
        }
        if (!status.ok()) grps::Raise(status.status());
        return grps::AsJson(*status);
      });
}

void BindWorker(py::module_& m) {
  py::class_<PyWorker>(m, "Worker")
      .def(py::init<const std::string&,
                    const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string>>&,
                    int, double, const std::string&, const std::string&>(),
           py::arg("coordinator"), py::arg("model"), py::arg("rank") = -1,
           py::arg("register_timeout_s") = absl::ToDoubleSeconds(grps::kRegisterTimeout),
           py::arg("job_id") = "",
           py::arg("optimizer") = "")
      .def("begin", &PyWorker::Begin, py::arg("params"), py::arg("give_initial"))
      .def("step", &PyWorker::Step, py::arg("grads"), py::arg("params"), py::arg("samples"))
      .def("tensor_ready", &PyWorker::TensorReady, py::arg("tensor"), py::arg("grads"),
           py::arg("params"))
      .def("abandon_step", &PyWorker::AbandonStep)
      .def("set_optimizers", &PyWorker::SetOptimizers, py::arg("groups"), py::arg("by_tensor"))
      .def("optimizer_state", &PyWorker::OptimizerState)
      .def("load_optimizer_state", &PyWorker::LoadOptimizerState, py::arg("kind"),
           py::arg("slots"), py::arg("steps"))
      .def("leave_requested", &PyWorker::LeaveRequested)
      .def("leave", &PyWorker::Leave)
      .def("first_non_finite", &PyWorker::FirstNonFinite, py::arg("grads"))
      .def("done", &PyWorker::Done, py::arg("accuracy") = py::none(),
           py::arg("loss") = py::none(), py::arg("auc") = py::none(),
           py::arg("declined") = false)
      .def("collective", &PyWorker::Collective, py::arg("name"), py::arg("payload"),
           py::arg("timeout_s"))
      .def("await_end", &PyWorker::AwaitEnd)
      .def("pull_final", &PyWorker::PullFinal, py::arg("params"))
      .def("pull_rows", &PyWorker::PullRows)
      .def("push_rows", &PyWorker::PushRows)
      .def("report_loss", &PyWorker::ReportLoss)
      .def("set_total_steps", &PyWorker::SetTotalSteps, py::arg("steps"))
      .def("lease_block", &PyWorker::LeaseBlock, py::arg("train_examples"), py::arg("step"))
      .def_property_readonly("elastic", &PyWorker::elastic)
      .def_property_readonly("step_examples", &PyWorker::step_examples)
      .def_property_readonly("rank", &PyWorker::rank)
      .def_property_readonly("size", &PyWorker::size)
      .def_property_readonly("step_count", &PyWorker::step)
      .def_property_readonly("total_steps", &PyWorker::total_steps)
      .def_property_readonly("num_parameters", &PyWorker::num_parameters)
      .def_property_readonly("defined_model", &PyWorker::defined_model)
      .def_property_readonly("can_overlap", &PyWorker::can_overlap)
      .def_property_readonly("mode", &PyWorker::mode)
      .def_property_readonly("job_id", &PyWorker::job_id)
      .def_property_readonly("config_json", &PyWorker::config_json)
      .def_property_readonly("tables", &PyWorker::tables);
}

}  // namespace
}  // namespace grps

PYBIND11_MODULE(_grps, m) {
  m.doc() = "grps's C++ worker core (use grps.torch)";
  grps::main_thread = std::this_thread::get_id();
  static py::exception<std::runtime_error> base(m, "Error");
  grps::error_base = base.ptr();
  static py::exception<std::runtime_error> ended(m, "JobEnded", base.ptr());
  grps::job_ended_error = ended.ptr();
  static py::exception<std::runtime_error> mismatch(m, "ModelMismatch", base.ptr());
  grps::model_mismatch_error = mismatch.ptr();
  m.def("configure", &grps::Configure, py::arg("overrides"),
        "Sets the process's security from GRPS_* variables and the given flags.");
  m.def("read_checkpoint", &grps::ReadCheckpoint, py::arg("path"));
  m.def("leave_on_sigterm", &grps::InstallLeaveOnSigterm,
        "SIGTERM asks this worker to leave the job after its step (Python's own "
        "SIGTERM handling is replaced)");
  m.def("job_status_json", &grps::JobStatusJson, py::arg("address"),
        py::arg("timeout_s") = 10.0);
  m.attr("PULL_SLICE_S") = absl::ToDoubleSeconds(grps::kPullSlice);
  // The binaries' --register_timeout_s default, the package's too.
  m.attr("REGISTER_TIMEOUT_S") = absl::ToDoubleSeconds(grps::kRegisterTimeout);
  grps::BindStraggler(m);
  grps::BindCurveFile(m);
  grps::BindWorker(m);
  grps::BindCriteoReader(m);
  grps::BindLookupClient(m);
}
