// What the launcher shows while a job runs: a progress bar redrawn in place
// on a terminal, a plain line every few seconds otherwise. Pure formatting
// plus a rate estimate; the launcher decides when to print.
#ifndef GRPS_LAUNCHER_PROGRESS_LINE_H_
#define GRPS_LAUNCHER_PROGRESS_LINE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "proto/grps.pb.h"

namespace grps {

// The figures a progress line shows, taken from one JobStatus.
struct JobProgress {
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  // Steps done per worker (the mean over workers, so that async workers
  // running at different paces count fairly) out of the steps each worker
  // runs; total is 0 while unknown.
  double step = 0;
  uint64_t total = 0;
  float loss = 0;
  float test_accuracy = -1;  // -1: no evaluation yet
  float samples_per_sec = 0;
  double elapsed_seconds = 0;
  // Registered members against the job's counts, for the waiting phase.
  int servers_up = 0;
  int servers_wanted = 0;
  int workers_up = 0;
  int workers_wanted = 0;
};

JobProgress ProgressOf(const v1::JobStatus& status);

// Estimates the time left from the step rate seen so far. The first
// observation is the baseline, so start-up time (loading data, registering)
// does not dilute the rate.
class EtaEstimator {
 public:
  // `step` steps were done at `now`; observations come in time order.
  void Observe(absl::Time now, double step);
  // Seconds until `total` steps at the rate since the baseline; nullopt
  // until at least one second and some progress separate two observations.
  std::optional<double> SecondsLeft(uint64_t total) const;

 private:
  std::optional<std::pair<absl::Time, double>> first_;
  std::optional<std::pair<absl::Time, double>> last_;
};

// "0:42", "12:05", "1:02:03"; "?" when unknown.
std::string FormatEta(std::optional<double> seconds);

// The terminal line, at most `width` characters, e.g.
//   [########------------] 120/400  30%  loss 0.4321  acc 0.8123  2345 samples/s  ETA 0:42
// While members register: "waiting for members: servers 1/2, workers 0/2".
std::string ProgressBar(const JobProgress& progress, std::optional<double> eta,
                        int width);

// The periodic line for a log (no bar, no width limit), e.g.
//   [12.3s] step 120/400 (30%)  loss 0.4321  test acc 0.8123  2345 samples/s  ETA 0:42
std::string ProgressLine(const JobProgress& progress, std::optional<double> eta);

}  // namespace grps

#endif  // GRPS_LAUNCHER_PROGRESS_LINE_H_
