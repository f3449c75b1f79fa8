#include "worker/binary_auc.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace grps {

double BinaryAuc(absl::Span<const float> scores, absl::Span<const int32_t> labels) {
  if (scores.size() != labels.size()) return -1;
  std::vector<size_t> order;
  order.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i])) return -1;  // no order (a diverged model)
    if (labels[i] == 0 || labels[i] == 1) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // The sum of the ranks (1-based) of class 1's examples, each run of equal
  // scores at its mean rank.
  double positives = 0, rank_sum = 0;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin;
    uint64_t ones = 0;
    while (end < order.size() && scores[order[end]] == scores[order[begin]])
      ones += labels[order[end++]] == 1 ? 1 : 0;
    const double mean_rank = (static_cast<double>(begin + 1) + static_cast<double>(end)) / 2;
    rank_sum += mean_rank * static_cast<double>(ones);
    positives += static_cast<double>(ones);
    begin = end;
  }
  const double negatives = static_cast<double>(order.size()) - positives;
  if (positives == 0 || negatives == 0) return -1;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace grps
