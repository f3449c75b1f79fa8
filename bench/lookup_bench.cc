// grps_lookup_bench: a lookup service (grps-server --serve) measured from a
// client's side (issue 43, docs/sparse.md "Serving rows to inference").
//
// Load: --lookups batched lookups of --batch ids each (uniform over
// [0, --id_range), or Zipf-like with --skew > 0), from --threads clients at
// once, each waiting for its reply before the next: the latency of each
// (p50, p90, p99, max) and the rows per second of all.
//
// Freshness (--watch_s > 0, first): for that long, the service's status
// every --poll_ms and a lookup of the first --probe ids: for each checkpoint
// it begins to serve, how long after the job asked for it, and how long
// after the one before was asked for (a row that training changed after
// that ask is in this checkpoint or an earlier one: so this is the longest a
// change waited to be read), and whether the probed rows changed.
//
//   grps_lookup_bench --address=127.0.0.1:7075 --table=emb --id_range=10000
//   grps_lookup_bench --address=... --watch_s=30 --lookups=0
//
// --json prints the figures as one line of JSON last.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/lookup_client.h"
#include "daemon/daemon.h"
#include "daemon/security.h"

ABSL_FLAG(std::string, address, "", "host:port of the lookup service (required)");
ABSL_FLAG(std::string, table, "", "table to look up (default: the first the service has)");
ABSL_FLAG(uint64_t, lookups, 10000, "lookups of the load run, over every client (0: none)");
ABSL_FLAG(uint32_t, batch, 1000, "ids a lookup");
ABSL_FLAG(uint64_t, id_range, 10000, "ids are drawn from [0, id_range)");
ABSL_FLAG(double, skew, 0, "0: uniform ids; s > 0: id k drawn with weight 1 / (k + 1)^s");
ABSL_FLAG(uint32_t, threads, 1, "clients looking up at once");
ABSL_FLAG(double, watch_s, 0, "first watch the service this long for new checkpoints");
ABSL_FLAG(uint32_t, poll_ms, 20, "how often the watch asks");
ABSL_FLAG(uint32_t, probe, 100, "ids the watch looks up each time (the first ones)");
ABSL_FLAG(double, wait_s, 60, "how long to wait for the service to serve a first checkpoint");
ABSL_FLAG(bool, json, false, "also print the figures as one line of JSON");

namespace grps {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

double Quantile(std::vector<double> sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()));
  return sorted[i];
}

struct Watched {
  int checkpoints = 0;             // new checkpoints served while watching
  double longest_wait_s = 0;       // max over them of served - the previous one's ask
  double longest_after_ask_s = 0;  // max of served - own ask
  int probes_changed = 0;          // checkpoints whose probed rows differed from the one before
};

Watched Watch(const LookupClient& client, const std::string& table, double seconds) {
  Watched w;
  const uint32_t probe = absl::GetFlag(FLAGS_probe);
  std::vector<int64_t> ids(probe);
  for (uint32_t i = 0; i < probe; ++i) ids[i] = i;
  uint64_t seen = 0, previous_ask_ms = 0;
  std::vector<float> previous_rows;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while (absl::Now() < end) {
    absl::StatusOr<v1::LookupStatusResponse> status = client.Status();
    if (status.ok() && status->checkpoint_id() != seen) {
      absl::StatusOr<LookedUpRows> rows = client.Lookup(table, ids);
      const double after_ask = (static_cast<double>(status->served_unix_time_ms()) -
                                static_cast<double>(status->asked_unix_time_ms())) /
                               1000;
      std::string line =
          absl::StrFormat("checkpoint %d (step %d): served %.3f s after it was asked for",
                          status->checkpoint_id(), status->step(), after_ask);
      if (seen != 0) {
        const double wait = (static_cast<double>(status->served_unix_time_ms()) -
                             static_cast<double>(previous_ask_ms)) /
                            1000;
        ++w.checkpoints;
        w.longest_wait_s = std::max(w.longest_wait_s, wait);
        w.longest_after_ask_s = std::max(w.longest_after_ask_s, after_ask);
        const bool changed = rows.ok() && rows->values != previous_rows;
        if (changed) ++w.probes_changed;
        absl::StrAppendFormat(&line, ", %.3f s after the one before was; probed rows %s", wait,
                              changed ? "changed" : "unchanged");
      }
      std::printf("%s\n", line.c_str());
      seen = status->checkpoint_id();
      previous_ask_ms = status->asked_unix_time_ms();
      if (rows.ok()) previous_rows = rows->values;
    }
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_poll_ms)));
  }
  return w;
}

int Run() {
  const std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) {
    std::fprintf(stderr, "--address is required\n");
    return 2;
  }
  LookupClient client(address);
  absl::StatusOr<v1::LookupStatusResponse> status = client.Status();
  const absl::Time patience = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_s));
  // Waits while the service is not up yet or serves nothing yet; a refusal
  // (a token, TLS) is final.
  while (((!status.ok() && status.status().code() == absl::StatusCode::kUnavailable) ||
          (status.ok() && status->checkpoint_id() == 0)) &&
         absl::Now() < patience) {
    absl::SleepFor(absl::Milliseconds(100));
    status = client.Status();
  }
  if (!status.ok() || status->checkpoint_id() == 0 || status->tables_size() == 0) {
    // What a lookup answers then.
    const int64_t id = 0;
    absl::StatusOr<LookedUpRows> rows = client.Lookup(absl::GetFlag(FLAGS_table), {&id, 1});
    std::fprintf(
        stderr, "no rows served at %s: %s; a lookup: %s\n", address.c_str(),
        status.ok() ? "no checkpoint with sparse tables" : status.status().ToString().c_str(),
        rows.ok() ? "answered" : rows.status().ToString().c_str());
    return 1;
  }
  std::string table = absl::GetFlag(FLAGS_table);
  if (table.empty()) table = status->tables(0).name();

  Watched watched;
  if (const double s = absl::GetFlag(FLAGS_watch_s); s > 0) {
    watched = Watch(client, table, s);
    std::printf(
        "freshness: %d new checkpoints served in %.0f s; a change waited at most %.3f s "
        "to be read (served - the previous checkpoint's ask), served at most %.3f s "
        "after its own ask; probed rows changed in %d of them\n",
        watched.checkpoints, s, watched.longest_wait_s, watched.longest_after_ask_s,
        watched.probes_changed);
  }

  const uint64_t lookups = absl::GetFlag(FLAGS_lookups);
  const uint32_t batch = absl::GetFlag(FLAGS_batch);
  const uint32_t threads = std::max(1u, absl::GetFlag(FLAGS_threads));
  const uint64_t range = std::max<uint64_t>(1, absl::GetFlag(FLAGS_id_range));
  const double skew = absl::GetFlag(FLAGS_skew);
  std::vector<std::vector<double>> latencies(threads);
  std::atomic<uint64_t> next{0}, missing{0}, failed{0};
  std::atomic<uint32_t> dim{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> clients;
  for (uint32_t c = 0; c < threads; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 rng(1234 + c);
      std::uniform_real_distribution<double> unit(0, 1);
      std::vector<int64_t> ids(batch);
      while (next.fetch_add(1) < lookups) {
        for (int64_t& id : ids) {
          // Zipf-like by inversion of the continuous density (k + 1)^-s.
          const double u = unit(rng);
          id = skew > 0 && skew != 1
                   ? static_cast<int64_t>(
                         std::pow(1 + u * (std::pow(static_cast<double>(range) + 1, 1 - skew) - 1),
                                  1 / (1 - skew))) -
                         1
                   : static_cast<int64_t>(u * static_cast<double>(range));
          id = std::clamp<int64_t>(id, 0, static_cast<int64_t>(range) - 1);
        }
        const absl::Time t0 = absl::Now();
        absl::StatusOr<LookedUpRows> rows = client.Lookup(table, ids);
        latencies[c].push_back(Ms(absl::Now() - t0));
        if (!rows.ok()) {
          if (failed.fetch_add(1) == 0)
            std::fprintf(stderr, "%s\n", rows.status().ToString().c_str());
          continue;
        }
        dim = rows->dim;
        missing += rows->missing.size();
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  const double rows_per_s = seconds > 0 ? static_cast<double>(all.size()) * batch / seconds : 0;
  const double p50 = Quantile(all, 0.5), p90 = Quantile(all, 0.9), p99 = Quantile(all, 0.99);
  const double max = all.empty() ? 0 : all.back();
  const double missing_share =
      all.empty() ? 0 : static_cast<double>(missing) / (static_cast<double>(all.size()) * batch);
  if (lookups > 0)
    std::printf(
        "load: %zu lookups of %u ids of table '%s' (dim %u) from %u client(s) in %.2f s: "
        "p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms; %.0f rows/s; %.1f%% of the "
        "ids missing; %llu failed\n",
        all.size(), batch, table.c_str(), dim.load(), threads, seconds, p50, p90, p99, max,
        rows_per_s, 100 * missing_share, static_cast<unsigned long long>(failed.load()));
  if (absl::GetFlag(FLAGS_json))
    std::printf(
        "{\"lookups\": %zu, \"batch\": %u, \"threads\": %u, \"seconds\": %.3f, "
        "\"p50_ms\": %.3f, \"p90_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f, "
        "\"rows_per_s\": %.0f, \"missing_share\": %.4f, \"failed\": %llu, "
        "\"checkpoints_watched\": %d, \"longest_wait_s\": %.3f, "
        "\"longest_after_ask_s\": %.3f, \"probes_changed\": %d}\n",
        all.size(), batch, threads, seconds, p50, p90, p99, max, rows_per_s, missing_share,
        static_cast<unsigned long long>(failed.load()), watched.checkpoints, watched.longest_wait_s,
        watched.longest_after_ask_s, watched.probes_changed);
  return failed.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace grps

int main(int argc, char** argv) {
  grps::ParseFlagsWithEnvironment(
      argc, argv,
      "grps_lookup_bench --address=HOST:PORT [--table=T] [--lookups=N] [--batch=N] "
      "[--watch_s=S]\n  A lookup service measured from a client's side.");
  if (absl::Status s = grps::InitProcessSecurity(grps::Role::kWorker, /*serves=*/false); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  return grps::Run();
}
