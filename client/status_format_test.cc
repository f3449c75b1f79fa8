#include "client/status_format.h"

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "job/job_config.h"
#include "job/shard_map.h"

namespace grps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// FormatShardsTable's traffic table ([0]) and consistency table ([1]), as
// lines.
std::vector<std::vector<std::string>> ShardTables(const std::string& text) {
  std::vector<std::vector<std::string>> tables(1);
  for (const std::string& line : Lines(text)) {
    if (line.empty()) {
      tables.emplace_back();
      continue;
    }
    tables.back().push_back(line);
  }
  return tables;
}

// The line of `text` that starts with `prefix` (after leading spaces).
std::string LineStartingWith(const std::string& text, const std::string& prefix) {
  for (const std::string& line : Lines(text)) {
    size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, prefix.size(), prefix) == 0)
      return line;
  }
  return "";
}

v1::JobStatus RunningJob() {
  v1::JobStatus s;
  s.set_job_id("sync-20240101-120000");
  s.set_state(v1::JOB_STATE_RUNNING);
  s.set_mode(v1::MODE_SYNC);
  *s.mutable_config() = DefaultJobConfig();
  s.set_global_step(120);
  s.set_total_steps(400);
  s.set_samples_per_sec(2345.6f);
  s.set_loss(0.4321f);
  s.set_test_accuracy(0.8123f);
  s.set_test_loss(0.5f);
  s.set_elapsed_seconds(83);
  s.set_membership_epoch(4);

  v1::WorkerStatus* w0 = s.add_workers();
  w0->set_rank(0);
  w0->set_incarnation(1);
  w0->set_host("node-a");
  w0->set_backend("cpu");
  w0->set_state(v1::MEMBER_STATE_ALIVE);
  w0->set_last_heartbeat_ms_ago(400);
  v1::WorkerProgress* p0 = w0->mutable_progress();
  p0->set_step(121);
  p0->set_total_steps(400);
  p0->set_epoch(1);
  p0->set_loss(0.43f);
  p0->set_samples_per_sec(1200.5f);
  p0->set_test_accuracy(-1);
  p0->set_samples(7744);

  v1::WorkerStatus* w1 = s.add_workers();
  *w1 = *w0;
  w1->set_rank(1);
  w1->set_backend("cuda (NVIDIA H100)");
  w1->set_straggler(true);
  w1->set_last_heartbeat_ms_ago(2500);
  w1->mutable_progress()->set_step(97);

  v1::ShardStatus* sh = s.add_shards();
  sh->set_shard(0);
  sh->set_address("127.0.0.1:40001");
  sh->set_incarnation(1);
  sh->set_version(120);
  sh->set_num_chunks(5);
  sh->set_num_elements(1 << 20);  // 4 MiB of f32
  sh->set_bytes_in(3 * 1024 * 1024 + 512 * 1024);
  sh->set_bytes_out(1536);
  sh->set_updates_applied(600);
  sh->set_pushes(240);
  sh->set_pulls(242);
  sh->set_duplicate_pushes(2);
  sh->set_rejected_pushes(7);
  sh->set_staleness_mean(1.25);
  sh->set_staleness_max(6);
  sh->add_staleness_histogram(10);
  sh->add_staleness_histogram(3);
  return s;
}

TEST(HumanBytes, UsesBinaryUnitsWithOneDecimal) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(64ull << 20), "64.0 MiB");
  EXPECT_EQ(HumanBytes(5ull << 30), "5.0 GiB");
}

TEST(HumanDuration, ShowsSecondsThenMinutesThenHours) {
  EXPECT_EQ(HumanDuration(0.4), "0.4s");
  EXPECT_EQ(HumanDuration(42), "42.0s");
  EXPECT_EQ(HumanDuration(187), "3m07s");
  EXPECT_EQ(HumanDuration(3725), "1h02m05s");
  EXPECT_EQ(HumanDuration(-1), "0.0s");
}

TEST(JobHeader, ShowsIdStateModeStepOfTotalAndEvaluation) {
  std::string header = FormatJobHeader(RunningJob());
  EXPECT_THAT(LineStartingWith(header, "job"), HasSubstr("sync-20240101-120000"));
  EXPECT_THAT(LineStartingWith(header, "state"), HasSubstr("running"));
  EXPECT_THAT(LineStartingWith(header, "mode"), HasSubstr("sync"));
  EXPECT_THAT(LineStartingWith(header, "global step"), HasSubstr("120 / 400 (30.0%)"));
  EXPECT_THAT(LineStartingWith(header, "samples/s"), HasSubstr("2345.6"));
  EXPECT_THAT(LineStartingWith(header, "loss"), HasSubstr("0.4321"));
  EXPECT_THAT(LineStartingWith(header, "test accuracy"), HasSubstr("0.8123"));
  EXPECT_THAT(LineStartingWith(header, "elapsed"), HasSubstr("1m23s"));
  EXPECT_EQ(LineStartingWith(header, "final"), "");
  EXPECT_EQ(LineStartingWith(header, "message"), "");
}

TEST(JobHeader, ShowsDashBeforeTheFirstEvaluation) {
  v1::JobStatus s = RunningJob();
  s.set_test_accuracy(-1);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "test accuracy"),
              ::testing::EndsWith("-"));
}

TEST(JobHeader, ShowsFinalEvaluationStalenessBoundAndMessage) {
  v1::JobStatus s = RunningJob();
  s.set_state(v1::JOB_STATE_COMPLETED);
  s.set_mode(v1::MODE_SSP);
  s.mutable_config()->set_staleness_bound(3);
  s.set_has_final_eval(true);
  s.set_final_test_accuracy(0.8567f);
  s.set_final_test_loss(0.41f);
  s.set_message("all workers finished");
  std::string header = FormatJobHeader(s);
  EXPECT_THAT(LineStartingWith(header, "mode"), HasSubstr("ssp (s=3)"));
  EXPECT_THAT(LineStartingWith(header, "final"), HasSubstr("test accuracy 0.8567"));
  EXPECT_THAT(LineStartingWith(header, "final"), HasSubstr("test loss 0.4100"));
  EXPECT_THAT(LineStartingWith(header, "message"), HasSubstr("all workers finished"));
}

TEST(JobHeader, ShowsEachWarningOfACompletedJobOnALineOfItsOwn) {
  v1::JobStatus s = RunningJob();
  s.set_state(v1::JOB_STATE_COMPLETED);
  s.add_warnings("1 of the job's 2000 blocks of examples was never trained");
  s.add_warnings("2 blocks were reported trained by a rank that did not hold its lease");
  const std::string header = FormatJobHeader(s);
  std::vector<std::string> warnings;
  for (const std::string& l : Lines(header))
    if (l.rfind("warning ", 0) == 0) warnings.push_back(l);
  ASSERT_EQ(warnings.size(), 2u) << header;
  EXPECT_THAT(warnings[0], HasSubstr(" 1 of the job's 2000 blocks"));
  EXPECT_THAT(warnings[1], HasSubstr(" 2 blocks were reported"));
  const std::string line = FormatStatusLine(s);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_THAT(line, HasSubstr("2 warnings: 1 of the job's 2000 blocks"));
  EXPECT_THAT(FormatStatusLine(RunningJob()), Not(HasSubstr("warning")));
}

TEST(JobHeader, ShowsBackupWorkersAndTheLatePolicyInSyncMode) {
  v1::JobStatus s = RunningJob();
  s.mutable_config()->set_backup_workers(1);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "mode"),
              HasSubstr("sync, 1 backup worker, late gradients folded"));
  s.mutable_config()->set_backup_workers(2);
  s.mutable_config()->set_late_gradients(v1::LATE_GRADIENTS_DROP);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "mode"),
              HasSubstr("sync, 2 backup workers, late gradients dropped"));
  s.mutable_config()->set_backup_workers(0);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "mode"),
              Not(HasSubstr("backup")));
}

TEST(JobHeader, SaysWhereTheOptimizerRuns) {
  v1::JobStatus s = RunningJob();
  s.mutable_config()->mutable_optimizer()->set_kind(v1::OPTIMIZER_ADAM);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "optimizer"),
              HasSubstr("adam, on the servers"));
  s.mutable_config()->mutable_optimizer()->set_kind(v1::OPTIMIZER_WORKERS);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "optimizer"),
              HasSubstr("the program's, on the workers (the servers average the gradients)"));
  s.set_mode(v1::MODE_ASYNC);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "optimizer"),
              HasSubstr("on the workers (the servers add the weights' changes)"));
}

TEST(JobHeader, ShowsLateAndTooStaleGradientsOnlyWhenThereAreAny) {
  v1::JobStatus s = RunningJob();
  EXPECT_EQ(LineStartingWith(FormatJobHeader(s), "gradients"), "");
  s.set_late_gradients(12);
  s.set_too_stale(0);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "gradients"),
              HasSubstr("12 late, 0 too stale"));
}

TEST(WorkersTable, HasEveryColumnAndOneRowPerWorker) {
  std::vector<std::string> lines = Lines(FormatWorkersTable(RunningJob()));
  ASSERT_EQ(lines.size(), 3u);
  for (const char* column : {"rank", "state", "step", "epoch", "loss",
                             "samples/s", "heartbeat", "notes", "backend"})
    EXPECT_THAT(lines[0], HasSubstr(column));
  EXPECT_THAT(lines[0], Not(HasSubstr("late")));  // sync without backup workers
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
  EXPECT_THAT(lines[1], HasSubstr("alive"));
  EXPECT_THAT(lines[1], HasSubstr("121/400"));
  EXPECT_THAT(lines[1], HasSubstr("0.4300"));
  EXPECT_THAT(lines[1], HasSubstr("1200.5"));
  EXPECT_THAT(lines[1], HasSubstr("0.4s ago"));
  EXPECT_THAT(lines[2], HasSubstr("2.5s ago"));
  EXPECT_THAT(lines[2], HasSubstr("cuda (NVIDIA H100)"));
}

TEST(WorkersTable, NotesOnlyStragglersUnderTheNotesColumn) {
  std::vector<std::string> lines = Lines(FormatWorkersTable(RunningJob()));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[1], Not(HasSubstr("straggler")));
  const size_t notes = lines[0].find("notes");
  ASSERT_NE(notes, std::string::npos);
  EXPECT_EQ(lines[2].substr(notes, 9), "straggler");
}

TEST(WorkersTable, ShowsLateGradientsAndNotesTheEvaluator) {
  v1::JobStatus s = RunningJob();
  s.set_evaluator_rank(0);
  s.mutable_workers(1)->set_late_gradients(17);
  std::vector<std::string> lines = Lines(FormatWorkersTable(s));
  ASSERT_EQ(lines.size(), 3u);
  const size_t notes = lines[0].find("notes");
  ASSERT_NE(notes, std::string::npos);
  EXPECT_EQ(lines[1].substr(notes, 5), "eval ");
  EXPECT_EQ(lines[2].substr(notes, 9), "straggler");
  const size_t late_end = lines[0].find("late") + 4;
  EXPECT_EQ(lines[1].substr(late_end - 2, 2), " 0");
  EXPECT_EQ(lines[2].substr(late_end - 2, 2), "17");
  s.set_evaluator_rank(1);
  EXPECT_THAT(Lines(FormatWorkersTable(s))[2], HasSubstr("eval, straggler"));
}

TEST(WorkersTable, NotesHowOftenAClippingWorkerClippedAndItsGradientNorm) {
  v1::JobStatus s = RunningJob();
  s.mutable_workers(0)->mutable_progress()->set_clipped_steps(37);
  s.mutable_workers(0)->mutable_progress()->set_gradient_norm(2.345f);
  std::vector<std::string> lines = Lines(FormatWorkersTable(s));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[1], HasSubstr("clipped 37 (norm 2.35)"));
  EXPECT_THAT(lines[2], Not(HasSubstr("clipped")));  // this job does not clip
}

TEST(WorkersTable, NotesAnF16WorkersLossScaleAndItsOverflows) {
  v1::JobStatus s = RunningJob();
  s.mutable_workers(1)->mutable_progress()->set_loss_scale(16777216.0f);
  s.mutable_workers(1)->mutable_progress()->set_overflow_steps(3);
  std::vector<std::string> lines = Lines(FormatWorkersTable(s));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[2], HasSubstr("f16 scale 16777216, 3 overflows"));
  EXPECT_THAT(lines[1], Not(HasSubstr("f16")));
}

TEST(WorkersTable, ShowsTheLateColumnWithBackupWorkers) {
  v1::JobStatus s = RunningJob();
  s.mutable_config()->set_backup_workers(1);
  EXPECT_THAT(Lines(FormatWorkersTable(s))[0], HasSubstr("late"));
}

TEST(WorkersTable, NotesNoEvaluatorWhenThereIsNone) {
  for (const std::string& line : Lines(FormatWorkersTable(RunningJob())))
    EXPECT_THAT(line, Not(HasSubstr("eval")));
}

TEST(WorkersTable, AlignsColumnsAcrossRows) {
  std::vector<std::string> lines = Lines(FormatWorkersTable(RunningJob()));
  ASSERT_EQ(lines.size(), 3u);
  // Right-aligned numbers end under their titles.
  size_t title_end = lines[0].find("samples/s") + std::string("samples/s").size();
  EXPECT_EQ(lines[1].substr(title_end - 6, 6), "1200.5");
  EXPECT_EQ(lines[2].substr(title_end - 6, 6), "1200.5");
}

TEST(ShardsTable, ShowsTrafficThenConsistencyCountersEachUnder100Columns) {
  std::vector<std::vector<std::string>> tables =
      ShardTables(FormatShardsTable(RunningJob()));
  ASSERT_EQ(tables.size(), 2u);
  ASSERT_EQ(tables[0].size(), 2u);
  ASSERT_EQ(tables[1].size(), 2u);
  for (const char* column : {"shard", "address", "version", "chunks", "MiB", "in",
                             "out", "pushes", "pulls", "checkpoint"})
    EXPECT_THAT(tables[0][0], HasSubstr(column));
  const std::string& row = tables[0][1];
  EXPECT_THAT(row, HasSubstr("127.0.0.1:40001"));
  EXPECT_THAT(row, HasSubstr("4.00"));      // 2^20 f32 elements
  EXPECT_THAT(row, HasSubstr("3.5 MiB"));   // bytes in
  EXPECT_THAT(row, HasSubstr("1.5 KiB"));   // bytes out
  for (const char* column : {"shard", "updates", "dups", "rejected",
                             "staleness mean/max"})
    EXPECT_THAT(tables[1][0], HasSubstr(column));
  EXPECT_THAT(tables[1][1], HasSubstr("600"));
  EXPECT_THAT(tables[1][1], HasSubstr("1.25/6"));
  for (const auto& table : tables)
    for (const std::string& line : table) EXPECT_LE(line.size(), 100u) << line;
}

TEST(ShardsTable, ShowsThePushesRungAtLaneDoorbellsOnceThereAreAny) {
  v1::JobStatus job = RunningJob();
  std::vector<std::vector<std::string>> tables = ShardTables(FormatShardsTable(job));
  ASSERT_FALSE(tables.empty());
  EXPECT_THAT(tables[0][0], Not(HasSubstr("rung")));
  job.mutable_shards(0)->set_doorbell_pushes(4321);
  tables = ShardTables(FormatShardsTable(job));
  ASSERT_FALSE(tables.empty());
  EXPECT_THAT(tables[0][0], HasSubstr("rung"));
  EXPECT_THAT(tables[0][1], HasSubstr("4321"));
  for (const std::string& line : tables[0]) EXPECT_LE(line.size(), 100u) << line;
}

// The consistency table's lines.
std::vector<std::string> Consistency(const v1::JobStatus& s) {
  std::vector<std::vector<std::string>> tables = ShardTables(FormatShardsTable(s));
  EXPECT_EQ(tables.size(), 2u);
  return tables.size() == 2 ? tables[1] : std::vector<std::string>{};
}

TEST(ShardsTable, SyncWithoutBackupWorkersHasNoLateOrWaitingColumns) {
  std::vector<std::string> lines = Consistency(RunningJob());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], Not(HasSubstr("late")));
  EXPECT_THAT(lines[0], Not(HasSubstr("too stale")));
  EXPECT_THAT(lines[0], Not(HasSubstr("waiting")));
}

TEST(ShardsTable, SyncWithBackupWorkersShowsLateFoldedDroppedAndWaitingPulls) {
  v1::JobStatus s = RunningJob();
  s.mutable_config()->set_backup_workers(1);
  v1::ShardStatus* sh = s.mutable_shards(0);
  sh->set_late_gradients(12);
  sh->set_late_folded(10);
  sh->set_late_dropped(2);
  sh->set_waiting_pulls(3);
  std::vector<std::string> lines = Consistency(s);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("late fold/drop"));
  EXPECT_THAT(lines[0], HasSubstr("waiting pulls"));
  EXPECT_THAT(lines[0], Not(HasSubstr("too stale")));
  EXPECT_THAT(lines[1], HasSubstr("12 10/2"));
  const size_t waiting_end = lines[0].find("waiting pulls") + 13;
  EXPECT_EQ(lines[1].substr(waiting_end - 2, 2), " 3");
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
}

TEST(ShardsTable, SspShowsTooStaleWaitingAndHeldGradients) {
  v1::JobStatus s = RunningJob();
  s.set_mode(v1::MODE_SSP);
  s.mutable_config()->set_staleness_bound(3);
  s.mutable_config()->set_max_staleness(8);
  v1::ShardStatus* sh = s.mutable_shards(0);
  sh->set_too_stale(4);
  sh->set_waiting_pulls(1);
  sh->set_held_gradients(9);
  std::vector<std::string> lines = Consistency(s);
  ASSERT_EQ(lines.size(), 2u);
  for (const char* column : {"too stale", "waiting pulls", "held",
                             "staleness mean/max"})
    EXPECT_THAT(lines[0], HasSubstr(column));
  EXPECT_THAT(lines[0], Not(HasSubstr("late")));
  const size_t held_end = lines[0].find("held") + 4;
  EXPECT_EQ(lines[1].substr(held_end - 1, 1), "9");
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
}

TEST(ShardsTable, ShowsANonZeroCounterOutsideItsMode) {
  v1::JobStatus s = RunningJob();  // sync, no backup workers
  s.mutable_shards(0)->set_late_gradients(1);
  s.mutable_shards(0)->set_late_folded(1);
  s.mutable_shards(0)->set_too_stale(2);
  std::vector<std::string> lines = Consistency(s);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("late fold/drop"));
  EXPECT_THAT(lines[0], HasSubstr("too stale"));
  for (const std::string& line : lines) EXPECT_LE(line.size(), 100u) << line;
}

TEST(ShardsTable, ShowsEachSparseTablePerShardAndTheSkewOfItsRowTraffic) {
  v1::JobStatus s = RunningJob();
  EXPECT_EQ(FormatSparseTables(s), "");  // no tables: nothing
  ASSERT_EQ(s.shards_size(), 1);
  s.add_shards()->set_shard(1);
  const uint64_t traffic[2][2] = {{3000, 6000}, {1000, 2000}};  // pushed, pulled
  for (int shard = 0; shard < 2; ++shard) {
    v1::SparseTableStatus* t = s.mutable_shards(shard)->add_tables();
    t->set_name("embedding");
    t->set_dim(16);
    t->set_rows(shard == 0 ? 5000 : 4000);
    t->set_bytes(shard == 0 ? 850000 : 680000);
    t->set_bytes_per_row(170);
    t->set_version(120);
    t->set_rows_pushed(traffic[shard][0]);
    t->set_rows_pulled(traffic[shard][1]);
    t->set_hottest_share(0.125);
    t->set_rows_evicted(shard == 0 ? 777 : 0);
    t->set_rows_admitted(shard == 0 ? 888 : 0);
    t->set_rows_dropped(shard == 0 ? 999 : 0);
  }
  const std::string text = FormatShardsTable(s);
  const std::vector<std::vector<std::string>> tables = ShardTables(text);
  ASSERT_EQ(tables.size(), 3u) << text;
  ASSERT_GE(tables[2].size(), 4u) << text;
  EXPECT_NE(tables[2][0].find("hottest 1%"), std::string::npos) << text;
  const std::string shard0 = LineStartingWith(text, "embedding      0");
  EXPECT_NE(shard0.find("5000"), std::string::npos) << text;
  EXPECT_NE(shard0.find("0.81"), std::string::npos) << text;   // MiB
  EXPECT_NE(shard0.find("12.5%"), std::string::npos) << text;
  EXPECT_NE(tables[2][0].find("evicted"), std::string::npos) << text;
  EXPECT_NE(shard0.find("777"), std::string::npos) << text;  // evicted, admitted, dropped
  EXPECT_NE(shard0.find("888"), std::string::npos) << text;
  EXPECT_NE(shard0.find("999"), std::string::npos) << text;
  // 9000 and 3000 rows of traffic: the busiest shard has 1.5 x the mean.
  EXPECT_NE(text.find("table embedding: row traffic skew over 2 shards 1.50"),
            std::string::npos)
      << text;
  // grpsctl status shows them too.
  EXPECT_NE(FormatJobStatus(s, 0).find("row traffic skew"), std::string::npos);
}

TEST(JobStatusText, HasHeaderThenWorkersThenShards) {
  std::string text = FormatJobStatus(RunningJob());
  size_t header = text.find("sync-20240101-120000");
  size_t workers = text.find("workers (2)");
  size_t shards = text.find("shards (1)");
  ASSERT_NE(header, std::string::npos);
  ASSERT_NE(workers, std::string::npos);
  ASSERT_NE(shards, std::string::npos);
  EXPECT_LT(header, workers);
  EXPECT_LT(workers, shards);
}

TEST(StatusLine, IsOneLineWithStepLossAccuracyAndLiveWorkers) {
  v1::JobStatus s = RunningJob();
  s.mutable_workers(1)->set_state(v1::MEMBER_STATE_DEAD);
  std::string line = FormatStatusLine(s);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_THAT(line, HasSubstr("running"));
  EXPECT_THAT(line, HasSubstr("step 120/400"));
  EXPECT_THAT(line, HasSubstr("loss 0.4321"));
  EXPECT_THAT(line, HasSubstr("test acc 0.8123"));
  EXPECT_THAT(line, HasSubstr("workers 1/2 alive"));
}

TEST(ShardMapText, ListsPlacementPerTensorAndTotalsPerShard) {
  v1::JobConfig config = DefaultJobConfig();
  absl::StatusOr<v1::ShardMap> map =
      BuildShardMap(ModelTensors(config), 2, config.chunk_bytes());
  ASSERT_TRUE(map.ok()) << map.status();
  map->mutable_shards(0)->set_address("127.0.0.1:5000");
  std::string text = FormatShardMap(*map);

  // dense_0/weight is 784x256 f32 = 784 KiB: four chunks of 196 KiB, placed
  // alternately so that neither shard is a hotspot.
  std::string weight = LineStartingWith(text, "dense_0/weight");
  EXPECT_THAT(weight, HasSubstr("784x256"));
  EXPECT_THAT(weight, HasSubstr("200704"));
  std::vector<std::string> placement;
  for (const v1::ChunkSpec& c : map->chunks())
    if (c.tensor_index() == 0) placement.push_back(std::to_string(c.shard()));
  ASSERT_GT(placement.size(), 1u);
  EXPECT_THAT(weight, ::testing::EndsWith(absl::StrCat(
                          "  ", placement.size(), "  ", absl::StrJoin(placement, " "))));

  std::string shard0 = LineStartingWith(text, "0  127.0.0.1:5000");
  ASSERT_NE(shard0, "") << text;
  std::vector<uint64_t> bytes = BytesPerShard(*map);
  std::string total = LineStartingWith(text, "total");
  EXPECT_THAT(total, HasSubstr(std::to_string(map->chunks_size())));
  EXPECT_THAT(total, HasSubstr(std::to_string((bytes[0] + bytes[1]) / 4)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat(map->chunks_size(), " chunks on 2 shards")));
}

TEST(ShardMapText, CutsLongPlacementListsAndCountsTheRest) {
  v1::ShardMap map;
  v1::TensorSpec* t = map.add_tensors();
  t->set_name("big");
  t->add_shape(40);
  for (int i = 0; i < 20; ++i) {
    v1::ChunkSpec* c = map.add_chunks();
    c->set_chunk_id(i);
    c->set_offset(2 * i);
    c->set_num_elements(2);
    c->set_shard(i % 3);
  }
  EXPECT_THAT(LineStartingWith(FormatShardMap(map), "big"), HasSubstr("... (+4)"));
}

TEST(Json, UsesProtoFieldNamesAndPrintsDefaults) {
  v1::JobStatus s = RunningJob();
  absl::StatusOr<std::string> json = ToJson(s);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->find('\n'), std::string::npos);
  EXPECT_THAT(*json, HasSubstr("\"job_id\":\"sync-20240101-120000\""));
  EXPECT_THAT(*json, HasSubstr("\"state\":\"JOB_STATE_RUNNING\""));
  EXPECT_THAT(*json, HasSubstr("\"last_heartbeat_ms_ago\""));
  EXPECT_THAT(*json, HasSubstr("\"has_final_eval\":false"));  // a default
  EXPECT_EQ(json->find("jobId"), std::string::npos);
}

TEST(Json, ParsesBackToTheSameMessage) {
  v1::JobStatus original = RunningJob();
  absl::StatusOr<std::string> json = ToJson(original);
  ASSERT_TRUE(json.ok()) << json.status();
  v1::JobStatus parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(original, parsed))
      << parsed.DebugString();
}

}  // namespace
}  // namespace grps

namespace grps {
namespace {

TEST(StatusFormat, AsyncGlobalStepIsShownAsUpdatesNotAFractionOfTheSteps) {
  v1::JobStatus s = RunningJob();
  s.set_mode(v1::MODE_ASYNC);
  s.set_global_step(1003);
  s.set_total_steps(1000);
  const std::string line = LineStartingWith(FormatJobHeader(s), "global step");
  EXPECT_THAT(line, ::testing::HasSubstr("1003 updates per chunk (1000 steps per worker)"));
  EXPECT_THAT(line, ::testing::Not(::testing::HasSubstr("1003 / 1000")));
}

TEST(StatusFormat, StalledGlobalStepIsShownWhileRunning) {
  v1::JobStatus s = RunningJob();
  s.set_global_step_idle_seconds(2);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "global step"),
              ::testing::Not(::testing::HasSubstr("stalled")));
  s.set_global_step_idle_seconds(12);
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "global step"),
              ::testing::HasSubstr("stalled 12.0s"));
}

TEST(StatusFormat, HeaderShowsCheckpointsGenerationAndARestartedCoordinator) {
  v1::JobStatus s = RunningJob();
  EXPECT_EQ(LineStartingWith(FormatJobHeader(s), "checkpoints"), "");
  EXPECT_EQ(LineStartingWith(FormatJobHeader(s), "generation"), "");
  s.set_generation(1);  // every job's first: nothing resumed or rolled back
  EXPECT_EQ(LineStartingWith(FormatJobHeader(s), "generation"), "");
  s.set_checkpoints_completed(3);
  s.mutable_last_checkpoint()->set_id(3);
  s.mutable_last_checkpoint()->set_step(400);
  s.mutable_last_checkpoint()->set_state(v1::CHECKPOINT_STATE_COMPLETE);
  s.mutable_last_checkpoint()->set_unix_time_ms(1'700'000'000'000);
  s.mutable_pending_checkpoint()->set_id(4);
  s.mutable_pending_checkpoint()->set_step(500);
  s.mutable_pending_checkpoint()->set_state(v1::CHECKPOINT_STATE_PENDING);
  s.set_generation(2);
  s.set_coordinator_restarted(true);
  const std::string header = FormatJobHeader(s, 1'700'000'012'000);
  EXPECT_THAT(LineStartingWith(header, "checkpoints"),
              ::testing::HasSubstr("3 complete; last 3 at step 400, 12.0s ago; "
                                   "pending 4 at step 500"));
  EXPECT_THAT(LineStartingWith(header, "generation"), ::testing::HasSubstr("2"));
  EXPECT_THAT(LineStartingWith(header, "coordinator"), ::testing::HasSubstr("restarted"));
  for (const std::string& line : Lines(header)) EXPECT_LE(line.size(), 100u) << line;
  s.mutable_pending_checkpoint()->set_state(v1::CHECKPOINT_STATE_FAILED);
  s.mutable_pending_checkpoint()->set_error("shard 1: disk full");
  EXPECT_THAT(LineStartingWith(FormatJobHeader(s), "checkpoint "),
              ::testing::HasSubstr("4 failed: shard 1: disk full"));
}

TEST(StatusFormat, DeadWorkerShowsNoSamplesPerSecond) {
  v1::JobStatus s = RunningJob();
  ASSERT_GT(s.workers_size(), 0);
  s.mutable_workers(0)->set_state(v1::MEMBER_STATE_DEAD);
  s.mutable_workers(0)->mutable_progress()->set_samples_per_sec(1234.5f);
  EXPECT_THAT(FormatWorkersTable(s), ::testing::Not(::testing::HasSubstr("1234.5")));
}

}  // namespace
}  // namespace grps
