#include "launcher/progress_line.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/status_format.h"

namespace grps {
namespace {

constexpr int kMinBar = 10;
constexpr int kMaxBar = 30;

bool Waiting(const JobProgress& p) {
  return p.state == v1::JOB_STATE_WAITING ||
         (p.state == v1::JOB_STATE_UNSPECIFIED && p.step == 0);
}

std::string WaitingText(const JobProgress& p) {
  return absl::StrCat("waiting for members: servers ", p.servers_up, "/",
                      p.servers_wanted, ", workers ", p.workers_up, "/",
                      p.workers_wanted);
}

double Fraction(const JobProgress& p) {
  if (p.total == 0) return 0;
  return std::clamp(p.step / p.total, 0.0, 1.0);
}

std::string StepOfTotal(const JobProgress& p) {
  uint64_t step = static_cast<uint64_t>(p.step);
  return p.total > 0 ? absl::StrCat(step, "/", p.total) : absl::StrCat(step);
}

std::string Accuracy(float a) { return a < 0 ? "-" : absl::StrFormat("%.4f", a); }

}  // namespace

JobProgress ProgressOf(const v1::JobStatus& status) {
  JobProgress p;
  p.state = status.state();
  p.loss = status.loss();
  p.test_accuracy = status.test_accuracy();
  p.samples_per_sec = status.samples_per_sec();
  p.elapsed_seconds = status.elapsed_seconds();
  p.servers_wanted = status.config().num_servers();
  p.workers_wanted = status.config().num_workers();
  for (const v1::ShardStatus& s : status.shards())
    if (!s.address().empty()) ++p.servers_up;

  double steps = 0;
  int counted = 0;
  uint64_t total = status.total_steps();
  for (const v1::WorkerStatus& w : status.workers()) {
    if (w.state() == v1::MEMBER_STATE_ALIVE || w.state() == v1::MEMBER_STATE_FINISHED)
      ++p.workers_up;
    const v1::WorkerProgress& wp = w.progress();
    if (wp.total_steps() == 0) continue;
    steps += std::min(wp.step(), wp.total_steps());
    total = std::max(total, wp.total_steps());
    ++counted;
  }
  p.total = total;
  p.step = counted > 0 ? steps / counted : static_cast<double>(status.global_step());
  return p;
}

void EtaEstimator::Observe(absl::Time now, double step) {
  if (!first_) first_ = {now, step};
  last_ = {now, step};
}

std::optional<double> EtaEstimator::SecondsLeft(uint64_t total) const {
  if (!first_ || !last_) return std::nullopt;
  double seconds = absl::ToDoubleSeconds(last_->first - first_->first);
  double done = last_->second - first_->second;
  if (seconds < 1.0 || done <= 0) return std::nullopt;
  return std::max(0.0, (total - last_->second) * seconds / done);
}

std::string FormatEta(std::optional<double> seconds) {
  if (!seconds || !std::isfinite(*seconds)) return "?";
  uint64_t s = static_cast<uint64_t>(std::llround(std::max(0.0, *seconds)));
  if (s < 3600) return absl::StrFormat("%d:%02d", s / 60, s % 60);
  return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
}

std::string ProgressBar(const JobProgress& progress, std::optional<double> eta,
                        int width) {
  std::string line;
  if (Waiting(progress)) {
    line = WaitingText(progress);
  } else {
    double fraction = Fraction(progress);
    std::string figures = absl::StrFormat(
        " %s %3.0f%%  loss %.4f  acc %s  %.0f samples/s  ETA %s",
        StepOfTotal(progress), 100 * fraction, progress.loss,
        Accuracy(progress.test_accuracy), progress.samples_per_sec,
        FormatEta(eta));
    int bar = std::clamp(width - 2 - static_cast<int>(figures.size()), kMinBar,
                         kMaxBar);
    int filled = static_cast<int>(fraction * bar);
    line = absl::StrCat("[", std::string(filled, '#'),
                        std::string(bar - filled, '-'), "]", figures);
  }
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(width);
  return line;
}

std::string ProgressLine(const JobProgress& progress, std::optional<double> eta) {
  std::string prefix = absl::StrCat("[", HumanDuration(progress.elapsed_seconds), "] ");
  if (Waiting(progress)) return prefix + WaitingText(progress);
  return absl::StrCat(
      prefix,
      absl::StrFormat("step %s (%.0f%%)  loss %.4f  test acc %s  %.0f samples/s  ETA %s",
                      StepOfTotal(progress), 100 * Fraction(progress),
                      progress.loss, Accuracy(progress.test_accuracy),
                      progress.samples_per_sec, FormatEta(eta)));
}

}  // namespace grps
