#include "worker/embedding_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "data/sparse_dataset.h"
#include "gtest/gtest.h"
#include "worker/mlp_model.h"
#include "worker/sparse_batch.h"

namespace grps {
namespace {

// Owns the storage a SparseExamples views.
struct Csr {
  std::vector<int64_t> offsets = {0};
  std::vector<int64_t> features;
  std::vector<float> values;
  std::vector<int32_t> labels;

  void Add(std::vector<int64_t> f, std::vector<float> v, int32_t label) {
    features.insert(features.end(), f.begin(), f.end());
    values.insert(values.end(), v.begin(), v.end());
    offsets.push_back(static_cast<int64_t>(features.size()));
    labels.push_back(label);
  }
  SparseExamples view() const { return {offsets, features, values, labels}; }
};

SparseBatch Build(const Csr& csr, uint64_t table_rows = 0, int32_t fields = 1) {
  auto batch = SparseBatch::Create(csr.view(), table_rows, fields);
  EXPECT_TRUE(batch.ok()) << batch.status();
  return *std::move(batch);
}

std::vector<float> Normal(size_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Head parameters in MlpModel's layout, weights N(0, 0.7), with hidden
// biases of 1 so that few ReLUs are dead and every example passes gradient
// back to its bag.
std::vector<float> LiveHead(const std::vector<int64_t>& widths, uint32_t seed) {
  std::vector<float> p;
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, 0.7f);
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    for (int64_t i = 0; i < widths[l] * widths[l + 1]; ++i) p.push_back(g(rng));
    const bool hidden = l + 2 < widths.size();
    for (int64_t i = 0; i < widths[l + 1]; ++i) p.push_back(hidden ? 1.0f : g(rng));
  }
  return p;
}

const char* Name(EmbeddingCombiner c) {
  return c == EmbeddingCombiner::kSum ? "sum" : "mean";
}

// The model written out in double precision, independently of the Backend:
// the definition the gradients are checked against.
struct ReferenceModel {
  int64_t dim;
  std::vector<int64_t> widths;  // {fields x dim, hidden..., classes}
  EmbeddingCombiner combiner;
  int32_t fields = 1;

  // Mean loss over `batch`; rows: unique ids x dim; head in MlpModel's layout.
  double Loss(const SparseBatch& batch, const std::vector<double>& rows,
              const std::vector<double>& head, int64_t* correct = nullptr) const {
    double total = 0;
    int64_t hits = 0;
    for (int i = 0; i < batch.size(); ++i) {
      const int64_t begin = batch.offsets()[i], end = batch.offsets()[i + 1];
      // Field f's bag is h[f * dim, (f + 1) * dim); a mean divides by the
      // example's nonzeros of that field.
      std::vector<double> h(fields * dim, 0.0);
      for (int64_t j = begin; j < end; ++j) {
        const int32_t f = batch.fields()[j];
        double w = batch.values()[j];
        if (combiner == EmbeddingCombiner::kMean)
          w /= std::count(batch.fields().begin() + begin, batch.fields().begin() + end, f);
        for (int64_t d = 0; d < dim; ++d) h[f * dim + d] += w * rows[batch.rows()[j] * dim + d];
      }
      size_t offset = 0;
      for (size_t l = 0; l + 1 < widths.size(); ++l) {
        const int64_t in = widths[l], out = widths[l + 1];
        std::vector<double> z(out);
        for (int64_t o = 0; o < out; ++o) {
          z[o] = head[offset + in * out + o];  // bias
          for (int64_t k = 0; k < in; ++k) z[o] += h[k] * head[offset + k * out + o];
          if (l + 2 < widths.size()) z[o] = std::max(z[o], 0.0);
        }
        offset += in * out + out;
        h = z;
      }
      const int32_t label = batch.labels()[i];
      const double max = *std::max_element(h.begin(), h.end());
      double sum = 0;
      for (double z : h) sum += std::exp(z - max);
      total += std::log(sum) + max - h[label];
      if (std::max_element(h.begin(), h.end()) - h.begin() == label) ++hits;
    }
    if (correct != nullptr) *correct = hits;
    return total / batch.size();
  }
};

// Five examples over ids {1, 2, 4, 7, 9}: 7 twice within the first and
// again in the third, 2 in three examples, one example with no features.
Csr FiveExamples() {
  Csr csr;
  csr.Add({7, 2, 7}, {1.0f, -0.5f, 1.5f}, 0);
  csr.Add({2, 9}, {0.75f, 1.25f}, 2);
  csr.Add({}, {}, 1);
  csr.Add({4, 7, 2, 1}, {-1.0f, 0.5f, 1.0f, 2.0f}, 1);
  csr.Add({9}, {-1.5f}, 0);
  return csr;
}

// The same shapes over three fields: id 7 is in fields 0 and 1, 9 in 1
// and 2, 2 in 0 and 1 (rows of different tables); field 0 twice within the
// first and fourth examples, an example with no features, one with field 1
// only.
Csr FiveExamplesOfThreeFields() {
  auto f = [](int32_t field, int64_t id) { return FieldFeature(field, id); };
  Csr csr;
  csr.Add({f(0, 7), f(0, 2), f(1, 7), f(2, 3)}, {1.0f, -0.5f, 1.5f, 0.5f}, 0);
  csr.Add({f(1, 2), f(2, 9)}, {0.75f, 1.25f}, 2);
  csr.Add({}, {}, 1);
  csr.Add({f(0, 4), f(0, 7), f(1, 2), f(2, 1), f(2, 9)}, {-1.0f, 0.5f, 1.0f, 2.0f, -0.5f}, 1);
  csr.Add({f(1, 9)}, {-1.5f}, 0);
  return csr;
}

struct GradientCase {
  EmbeddingCombiner combiner;
  std::vector<int64_t> hidden;
  int32_t fields = 1;
};

class EmbeddingModelGradient : public testing::TestWithParam<GradientCase> {};

// Central differences of the double-precision reference (h = 1e-6, error
// ~1e-10) against the model's f32 gradients, within 2e-5 + 1e-4 |g|. The
// checks only count because most gradients are far above that tolerance,
// which the test asserts too.
TEST_P(EmbeddingModelGradient, MatchesFiniteDifferencesOfTheReference) {
  const GradientCase& c = GetParam();
  const int64_t dim = 3, classes = 3;
  auto backend = CreateCpuBackend();
  EmbeddingModel model(backend.get(), dim, c.hidden, classes, c.combiner, 8, c.fields);
  ASSERT_EQ(model.head_widths().front(), c.fields * dim);
  const SparseBatch batch =
      c.fields == 1 ? Build(FiveExamples()) : Build(FiveExamplesOfThreeFields(), 0, c.fields);
  ASSERT_EQ(batch.unique_ids(), c.fields == 1 ? (std::vector<int64_t>{1, 2, 4, 7, 9})
                                              : (std::vector<int64_t>{2, 4, 7, 2, 7, 9, 1, 3, 9}));
  const ReferenceModel ref{dim, model.head_widths(), c.combiner, c.fields};

  const std::vector<float> rows = Normal(batch.unique_ids().size() * dim, 1.0f, 1);
  const std::vector<float> head = LiveHead(model.head_widths(), 2);
  ASSERT_EQ(static_cast<int64_t>(head.size()), model.num_head_parameters());
  model.SetHeadParameters(head.data());
  const float loss = model.ForwardBackward(batch, rows.data(), nullptr);
  std::vector<float> head_grad(model.num_head_parameters());
  model.GetHeadGradients(head_grad.data());
  const absl::Span<const float> row_grad = model.row_gradients();
  ASSERT_EQ(row_grad.size(), rows.size());

  std::vector<double> r = ToDouble(rows), p = ToDouble(head);
  EXPECT_NEAR(loss, ref.Loss(batch, r, p), 1e-5);
  const double h = 1e-6;
  auto check = [&](std::vector<double>& x, absl::Span<const float> grad,
                   const std::string& what) {
    int large = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = ref.Loss(batch, r, p);
      x[i] = saved - h;
      const double down = ref.Loss(batch, r, p);
      x[i] = saved;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grad[i], fd, 2e-5 + 1e-4 * std::abs(fd)) << what << " " << i;
      if (std::abs(fd) > 2e-3) ++large;
    }
    return static_cast<double>(large) / x.size();
  };
  // Every row is read by some nonzero of nonzero value, so every row element
  // has a gradient; some head units may be dead (ReLU), so fewer there.
  EXPECT_GE(check(r, row_grad, "row element"), 0.9);
  EXPECT_GE(check(p, head_grad, "head parameter"), 0.5);
}

INSTANTIATE_TEST_SUITE_P(EmbeddingModel, EmbeddingModelGradient,
                         testing::Values(GradientCase{EmbeddingCombiner::kSum, {}},
                                         GradientCase{EmbeddingCombiner::kSum, {4}},
                                         GradientCase{EmbeddingCombiner::kMean, {}},
                                         GradientCase{EmbeddingCombiner::kMean, {4}},
                                         GradientCase{EmbeddingCombiner::kMean, {5, 4}},
                                         GradientCase{EmbeddingCombiner::kSum, {}, 3},
                                         GradientCase{EmbeddingCombiner::kSum, {4}, 3},
                                         GradientCase{EmbeddingCombiner::kMean, {5, 4}, 3}),
                         [](const testing::TestParamInfo<GradientCase>& info) {
                           return std::string(Name(info.param.combiner)) + "_" +
                                  std::to_string(info.param.hidden.size()) + "_hidden_" +
                                  std::to_string(info.param.fields) + "_fields";
                         });

class EmbeddingModelCombiner : public testing::TestWithParam<EmbeddingCombiner> {
};

// The same examples with every occurrence of id 7 given an id of its own (7,
// 8, 10), all three rows equal to 7's: the loss is the same, and the
// deduplicated gradient of 7 is the sum of the three separate ones.
TEST_P(EmbeddingModelCombiner, DuplicateIdsGetTheSumOfTheirOccurrencesGradients) {
  const int64_t dim = 4;
  auto backend = CreateCpuBackend();
  EmbeddingModel model(backend.get(), dim, {5}, 3, GetParam(), 4);
  Csr shared, split;
  shared.Add({7, 2, 7}, {1.0f, -0.5f, 1.5f}, 0);
  shared.Add({7, 3}, {-1.0f, 1.0f}, 2);
  split.Add({7, 2, 8}, {1.0f, -0.5f, 1.5f}, 0);
  split.Add({10, 3}, {-1.0f, 1.0f}, 2);
  const SparseBatch a = Build(shared), b = Build(split);
  ASSERT_EQ(a.unique_ids(), (std::vector<int64_t>{2, 3, 7}));
  ASSERT_EQ(b.unique_ids(), (std::vector<int64_t>{2, 3, 7, 8, 10}));
  const std::vector<float> rows_a = Normal(3 * dim, 1.0f, 3);
  std::vector<float> rows_b(rows_a);  // 2, 3, 7 as in a; 8 and 10 copy 7
  rows_b.insert(rows_b.end(), rows_a.begin() + 2 * dim, rows_a.end());
  rows_b.insert(rows_b.end(), rows_a.begin() + 2 * dim, rows_a.end());
  const std::vector<float> head = LiveHead(model.head_widths(), 4);
  model.SetHeadParameters(head.data());

  const float loss_b = model.ForwardBackward(b, rows_b.data(), nullptr);
  const std::vector<float> grad_b(model.row_gradients().begin(),
                                  model.row_gradients().end());
  const float loss_a = model.ForwardBackward(a, rows_a.data(), nullptr);
  const absl::Span<const float> grad_a = model.row_gradients();
  ASSERT_EQ(grad_a.size(), 3u * dim);
  EXPECT_FLOAT_EQ(loss_a, loss_b);
  for (int64_t d = 0; d < dim; ++d) {
    EXPECT_FLOAT_EQ(grad_a[0 * dim + d], grad_b[0 * dim + d]);  // id 2
    EXPECT_FLOAT_EQ(grad_a[1 * dim + d], grad_b[1 * dim + d]);  // id 3
    const float sum = grad_b[2 * dim + d] + grad_b[3 * dim + d] + grad_b[4 * dim + d];
    EXPECT_NEAR(grad_a[2 * dim + d], sum, 1e-6f + 1e-5f * std::abs(sum));
    // Not trivially so: each occurrence contributes something.
    EXPECT_NE(grad_b[3 * dim + d], 0.0f);
  }
}

// A softmax-regression head sees a zero bag, so the example's logits are the
// head's bias; it adds nothing to the rows' gradient, only to the batch
// size the mean loss divides by.
TEST_P(EmbeddingModelCombiner, AnExampleWithoutFeaturesGetsAZeroBag) {
  const int64_t dim = 2, classes = 3;
  auto backend = CreateCpuBackend();
  EmbeddingModel model(backend.get(), dim, {}, classes, GetParam(), 4);
  std::vector<float> head = Normal(model.num_head_parameters(), 1.0f, 5);
  const float* bias = head.data() + dim * classes;
  model.SetHeadParameters(head.data());

  Csr empty_only;
  empty_only.Add({}, {}, 1);
  const SparseBatch empty = Build(empty_only);
  ASSERT_TRUE(empty.unique_ids().empty());
  const float loss = model.ForwardBackward(empty, nullptr, nullptr);
  double sum = 0;
  for (int64_t k = 0; k < classes; ++k) sum += std::exp(double{bias[k]});
  EXPECT_NEAR(loss, std::log(sum) - bias[1], 1e-5);
  EXPECT_TRUE(model.row_gradients().empty());

  Csr one, with_empty;
  one.Add({3, 4}, {1.0f, 2.0f}, 0);
  with_empty.Add({3, 4}, {1.0f, 2.0f}, 0);
  with_empty.Add({}, {}, 2);
  const std::vector<float> rows = Normal(2 * dim, 1.0f, 6);
  model.ForwardBackward(Build(one), rows.data(), nullptr);
  const std::vector<float> grad_one(model.row_gradients().begin(),
                                    model.row_gradients().end());
  model.ForwardBackward(Build(with_empty), rows.data(), nullptr);
  const absl::Span<const float> grad_both = model.row_gradients();
  ASSERT_EQ(grad_both.size(), grad_one.size());
  for (size_t i = 0; i < grad_one.size(); ++i) {
    EXPECT_TRUE(std::isfinite(grad_both[i]));
    EXPECT_NE(grad_one[i], 0.0f);
    EXPECT_FLOAT_EQ(grad_both[i], grad_one[i] / 2) << i;
  }
}

TEST_P(EmbeddingModelCombiner, EvaluateMatchesTheReferenceAcrossBatches) {
  const int64_t dim = 3;
  auto backend = CreateCpuBackend();
  EmbeddingModel model(backend.get(), dim, {4}, 3, GetParam(), /*max_batch=*/2);
  const SparseBatch all = Build(FiveExamples());
  const std::vector<float> rows = Normal(all.unique_ids().size() * dim, 1.0f, 7);
  const std::vector<float> head = Normal(model.num_head_parameters(), 0.7f, 8);
  model.SetHeadParameters(head.data());
  const ReferenceModel ref{dim, model.head_widths(), GetParam()};

  const EvalResult r = model.Evaluate(all, rows.data());
  int64_t hits = 0;
  const double loss = ref.Loss(all, ToDouble(rows), ToDouble(head), &hits);
  EXPECT_EQ(r.examples, 5);
  EXPECT_NEAR(r.loss, loss, 1e-5);
  EXPECT_DOUBLE_EQ(r.accuracy, hits / 5.0);

  const EvalResult none = model.Evaluate(SparseBatch(), nullptr);
  EXPECT_EQ(none.examples, 0);
  EXPECT_EQ(none.loss, 0);
}

// A few hundred steps of SGD, the head updated in place and the rows in a
// host table standing in for the servers' sparse table (rows created on
// first pull, as the servers' initializer does): three classes, each with
// ten features of its own, every example three of its class's features and
// two of twenty shared noise features, hashed into 2^16 rows.
TEST_P(EmbeddingModelCombiner, SgdLearnsASeparableSparseProblem) {
  const int64_t dim = 8, classes = 3;
  const uint64_t table_rows = 1 << 16;
  const int examples = 240, batch_size = 24;
  std::mt19937 rng(9);
  Csr train;
  for (int i = 0; i < examples; ++i) {
    const int32_t label = i % classes;
    std::vector<int64_t> f;
    std::vector<float> v;
    for (int k = 0; k < 3; ++k) f.push_back(1000 * label + rng() % 10);
    for (int k = 0; k < 2; ++k) f.push_back(5000 + rng() % 20);
    for (size_t k = 0; k < f.size(); ++k) v.push_back(0.5f + (rng() % 100) / 100.0f);
    train.Add(f, v, label);
  }
  auto backend = CreateCpuBackend();
  EmbeddingModel model(backend.get(), dim, {8}, classes, GetParam(), batch_size);
  std::vector<float> head = Normal(model.num_head_parameters(), 0.3f, 10);
  model.SetHeadParameters(head.data());
  std::map<int64_t, std::vector<float>> table;
  std::normal_distribution<float> init(0, 0.1f);
  auto pull = [&](const SparseBatch& b) {
    std::vector<float> rows;
    for (int64_t id : b.unique_ids()) {
      auto [it, created] = table.try_emplace(id);
      if (created) {
        for (int64_t d = 0; d < dim; ++d) it->second.push_back(init(rng));
      }
      rows.insert(rows.end(), it->second.begin(), it->second.end());
    }
    return rows;
  };
  const SparseBatch all = Build(train, table_rows);
  const EvalResult before = model.Evaluate(all, pull(all).data());

  const float lr = 0.5f;
  SparseBatch batch;  // reused every step
  std::vector<float> head_grad(model.num_head_parameters());
  std::vector<int64_t> order(examples);
  for (int i = 0; i < examples; ++i) order[i] = i;
  for (int step = 0; step < 300; ++step) {
    if (step % (examples / batch_size) == 0) std::shuffle(order.begin(), order.end(), rng);
    Csr csr;
    for (int k = 0; k < batch_size; ++k) {
      const int64_t e = order[(step * batch_size + k) % examples];
      const int64_t begin = train.offsets[e], end = train.offsets[e + 1];
      csr.Add({train.features.begin() + begin, train.features.begin() + end},
              {train.values.begin() + begin, train.values.begin() + end},
              train.labels[e]);
    }
    ASSERT_TRUE(batch.Build(csr.view(), table_rows).ok());
    const std::vector<float> rows = pull(batch);
    model.ForwardBackward(batch, rows.data(), nullptr);
    model.GetHeadGradients(head_grad.data());
    for (size_t i = 0; i < head.size(); ++i) head[i] -= lr * head_grad[i];
    model.SetHeadParameters(head.data());
    const absl::Span<const float> g = model.row_gradients();
    for (size_t u = 0; u < batch.unique_ids().size(); ++u) {
      std::vector<float>& row = table[batch.unique_ids()[u]];
      for (int64_t d = 0; d < dim; ++d) row[d] -= lr * g[u * dim + d];
    }
  }
  const EvalResult after = model.Evaluate(all, pull(all).data());
  EXPECT_LT(after.loss, before.loss / 4) << Name(GetParam());
  EXPECT_GE(after.accuracy, 0.95) << Name(GetParam());
  EXPECT_EQ(table.size(), all.unique_ids().size());  // nothing else pulled
}

INSTANTIATE_TEST_SUITE_P(EmbeddingModel, EmbeddingModelCombiner,
                         testing::Values(EmbeddingCombiner::kSum,
                                         EmbeddingCombiner::kMean),
                         [](const testing::TestParamInfo<EmbeddingCombiner>& info) {
                           return std::string(Name(info.param));
                         });

// The head is an MlpModel over the bags, parameter for parameter: given the
// bags as dense input, MlpModel computes the same loss and head gradient.
// Gradient accumulation: 4 passes over 3 examples each give the gradients
// (head and rows), the loss and the hits of one batch of the 12 examples
// within float rounding; a model whose max_batch is 3 accepts the 12.
TEST_P(EmbeddingModelCombiner, FourPassesOfThreeExamplesEqualOneBatchOfTwelve) {
  const int64_t dim = 3;
  auto backend = CreateCpuBackend();
  EmbeddingModel small(backend.get(), dim, {5}, 3, GetParam(), 3);
  EmbeddingModel whole(backend.get(), dim, {5}, 3, GetParam(), 12);
  std::mt19937 rng(21);
  Csr csr;
  for (int i = 0; i < 12; ++i) {
    std::vector<int64_t> f;
    std::vector<float> v;
    for (int j = 0; j < 1 + i % 3; ++j) {
      f.push_back(static_cast<int64_t>(rng() % 6));  // ids shared across passes
      v.push_back(0.5f + static_cast<float>(rng() % 4));
    }
    csr.Add(f, v, static_cast<int32_t>(rng() % 3));
  }
  const SparseBatch batch = Build(csr);
  const std::vector<float> rows = Normal(batch.unique_ids().size() * dim, 1.0f, 22);
  const std::vector<float> head = LiveHead(small.head_widths(), 23);
  small.SetHeadParameters(head.data());
  whole.SetHeadParameters(head.data());
  int64_t hits_small = -1, hits_whole = -2;
  const float loss_small = small.ForwardBackward(batch, rows.data(), &hits_small, 4);
  const float loss_whole = whole.ForwardBackward(batch, rows.data(), &hits_whole);
  EXPECT_NEAR(loss_small, loss_whole, 1e-6 * std::abs(loss_whole));
  EXPECT_EQ(hits_small, hits_whole);
  auto close = [](absl::Span<const float> a, absl::Span<const float> b) {
    ASSERT_EQ(a.size(), b.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
      norm += double{b[i]} * b[i];
    }
    ASSERT_GT(norm, 0);
    EXPECT_LT(std::sqrt(diff / norm), 1e-6);
  };
  close(small.row_gradients(), whole.row_gradients());
  std::vector<float> g_small(small.num_head_parameters()), g_whole(g_small.size());
  small.GetHeadGradients(g_small.data());
  whole.GetHeadGradients(g_whole.data());
  close(g_small, g_whole);
}

TEST(EmbeddingModel, HeadIsAnMlpModelOverTheBags) {
  const int64_t dim = 2;
  auto backend = CreateCpuBackend();
  EmbeddingModel model(backend.get(), dim, {3}, 2, EmbeddingCombiner::kSum, 4);
  MlpModel mlp(backend.get(), model.head_widths(), 4);
  ASSERT_EQ(model.head_widths(), (std::vector<int64_t>{2, 3, 2}));
  ASSERT_EQ(model.num_head_parameters(), mlp.num_parameters());
  Csr csr;
  csr.Add({0, 1}, {1.0f, 2.0f}, 1);
  csr.Add({1}, {-1.0f}, 0);
  const std::vector<float> rows = {0.5f, -1.0f, 2.0f, 0.25f};  // ids 0, 1
  // bags: 1 * (0.5, -1) + 2 * (2, 0.25) = (4.5, -0.5);  -1 * (2, 0.25)
  const std::vector<float> bags = {4.5f, -0.5f, -2.0f, -0.25f};
  const std::vector<float> head = Normal(model.num_head_parameters(), 0.7f, 11);
  model.SetHeadParameters(head.data());
  mlp.SetParameters(head.data());
  int64_t hits_model = -1, hits_mlp = -2;
  EXPECT_FLOAT_EQ(model.ForwardBackward(Build(csr), rows.data(), &hits_model),
                  mlp.ForwardBackward(bags.data(), csr.labels.data(), 2, &hits_mlp));
  EXPECT_EQ(hits_model, hits_mlp);
  std::vector<float> g_model(mlp.num_parameters()), g_mlp(mlp.num_parameters());
  model.GetHeadGradients(g_model.data());
  mlp.GetGradients(g_mlp.data());
  EXPECT_EQ(g_model, g_mlp);
  std::vector<float> back(head.size());
  model.GetHeadParameters(back.data());
  EXPECT_EQ(back, head);
}

}  // namespace
}  // namespace grps
