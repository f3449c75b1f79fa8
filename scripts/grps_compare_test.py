#!/usr/bin/python3
"""Tests of grps-compare (scripts/grps_compare.py): its pure parts, and the
command end to end with a fake grps-local (no daemons, no dataset)."""

import json
import os
import shutil
import stat
import sys
import tempfile
import textwrap
import unittest

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import grps_compare as gc  # noqa: E402

HEADER = ("step,epoch,elapsed_s,unix_time,loss,samples_per_sec,test_accuracy,"
          "test_loss,evaluated\n")


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


class PlanRunsTest(unittest.TestCase):
    def test_all_twelve_runs_each_config_without_then_with_a_straggler(self):
        runs = gc.plan_runs()
        self.assertEqual(len(runs), 12)
        self.assertEqual([r.name for r in runs[:4]],
                         ["sync", "sync+straggler", "sync-backup1",
                          "sync-backup1+straggler"])
        straggler = runs[1]
        self.assertTrue(straggler.straggler)
        self.assertIn("--straggler_rank=2", straggler.flags)
        self.assertIn("--straggle_factor=5", straggler.flags)
        self.assertNotIn("--straggler_rank=2", runs[0].flags)
        by_name = {r.name: r.flags for r in runs}
        self.assertIn("--backup_workers=1", by_name["sync-backup1"])
        self.assertIn("--staleness_aware_lr=true", by_name["async-salr"])
        self.assertEqual(by_name["ssp4"], ["--mode=ssp", "--staleness=4"])

    def test_a_config_name_selects_both_its_runs_a_full_name_one(self):
        names = [r.name for r in gc.plan_runs(["sync", "async+straggler"])]
        self.assertEqual(names, ["sync", "sync+straggler", "async+straggler"])

    def test_an_unknown_name_is_refused_with_the_known_ones(self):
        with self.assertRaisesRegex(ValueError, "unknown run.*bsp.*known:.*ssp4"):
            gc.plan_runs(["bsp"])


class CurvesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def test_evaluations_are_the_evaluated_rows_merged_over_workers_by_time(self):
        a = gc.read_curve(write(os.path.join(self.dir, "a.csv"), HEADER +
                                "10,0,1,1001,2.0,50,,,0\n"
                                "20,0,2,1002,1.5,50,0.60,1.1,1\n"
                                "40,0,4,1004,1.0,50,0.80,0.7,1\n"))
        b = gc.read_curve(write(os.path.join(self.dir, "b.csv"), HEADER +
                                "30,0,3,1003,1.2,50,0.70,0.9,1\n"
                                "40,0,4,1004,1.0,50,0.80,0.7,1\n"))  # seen twice
        self.assertEqual(gc.evaluations([a, b]),
                         [(1002, 20, 0.60), (1003, 30, 0.70), (1004, 40, 0.80)])

    def test_an_older_curve_counts_rows_with_an_accuracy_timed_from_the_launch(self):
        rows = gc.read_curve(write(
            os.path.join(self.dir, "old.csv"),
            "step,epoch,elapsed_s,loss,samples_per_sec,test_accuracy,test_loss\n"
            "10,0,0.5,2.0,0,0.62,1.0\n30,2,0.9,1.4,0,-1.000000,-1.000000\n"),
            started_unix=1000)
        self.assertEqual(gc.evaluations([rows]), [(1000.5, 10, 0.62)])

    def test_time_to_target_is_the_first_evaluation_at_or_above_it(self):
        points = [(1002, 20, 0.60), (1005, 50, 0.85), (1007, 70, 0.90)]
        self.assertEqual(gc.time_to_target(points, 1000, 0.85), 5)
        self.assertEqual(gc.time_to_target(points, 1000, 0.70), 5)
        self.assertIsNone(gc.time_to_target(points, 1000, 0.95))
        self.assertIsNone(gc.time_to_target([], 1000, 0.5))


class PercentileTest(unittest.TestCase):
    def test_p99_is_the_bucket_where_99_percent_of_updates_are_counted(self):
        histogram = [90, 9, 1] + [0] * 13
        self.assertEqual(gc.histogram_percentile(histogram, 0.99), (1, False))
        self.assertEqual(gc.histogram_percentile(histogram, 0.5), (0, False))
        self.assertEqual(gc.histogram_percentile(histogram, 1.0), (2, False))

    def test_p99_in_the_last_bucket_is_open_ended(self):
        histogram = [50] + [0] * 14 + [50]
        self.assertEqual(gc.histogram_percentile(histogram, 0.99), (15, True))

    def test_an_empty_histogram_has_no_percentile(self):
        self.assertEqual(gc.histogram_percentile([], 0.99), (None, False))
        self.assertEqual(gc.histogram_percentile([0, 0], 0.99), (None, False))


def result_json(**overrides):
    r = {"mode": "async", "exit": "ok", "started_unix": 1000.0,
         "final_test_accuracy": 0.8612, "samples_per_sec": 1234.5,
         "staleness_mean": 1.25, "staleness_max": 15,
         # 99 of 100 updates at staleness <= 2: p99 is 2.
         "staleness_histogram": [10, 60, 29] + [0] * 12 + [1],
         "late_gradients": 3, "too_stale": 2, "workers_died": 1,
         "wall_seconds": 42.0}
    r.update(overrides)
    return r


class TableTest(unittest.TestCase):
    def row(self, name="async", straggler=False, result=None, error=None, curves=None):
        run = gc.Run(name, name.split("+")[0], straggler, [])
        return gc.summarize(run, result, curves or [], 0.85, error)

    def test_a_row_has_every_figure_of_the_run(self):
        curve = [{"step": 100.0, "unix_time": 1012.5, "test_accuracy": 0.86,
                  "evaluated": 1.0}]
        table = gc.render_table([self.row(result=result_json(), curves=[curve])], 0.85)
        lines = table.splitlines()
        self.assertEqual(len(lines), 3)
        self.assertIn("time to 0.85 (s)", lines[0])
        self.assertEqual(lines[0].count("|"), lines[1].count("|"))
        self.assertEqual(
            lines[2],
            "| async | no | 12.5 | 0.8612 | 1234 | 1.25 / 2 / 15 | 3 / 2 | 1 | 42.0 |")

    def test_target_not_reached_and_open_p99_read_as_such(self):
        r = result_json(staleness_histogram=[1] + [0] * 14 + [99])
        line = gc.render_table([self.row(result=r)], 0.85).splitlines()[2]
        self.assertIn("| not reached |", line)
        self.assertIn("1.25 / ≥ 15 / 15", line)

    def test_sync_without_staleness_shows_a_dash(self):
        r = result_json(mode="sync", staleness_histogram=[0] * 16, staleness_mean=0)
        line = gc.render_table([self.row(name="sync", result=r)], 0.85).splitlines()[2]
        self.assertIn("| – |", line)

    def test_a_failed_run_is_listed_as_failed_with_its_error(self):
        failed = self.row(name="ssp4+straggler", straggler=True,
                          result=result_json(exit="timeout", error="timed out after 1m",
                                             samples_per_sec=0))
        missing = self.row(name="ssp1", result=None,
                           error="grps-local exited with status 2")
        self.assertFalse(failed["ok"])
        self.assertEqual(failed["error"], "timeout: timed out after 1m")
        lines = gc.render_table([failed, missing], 0.85).splitlines()
        self.assertIn("| ssp4+straggler | yes | **failed** |", lines[2])
        self.assertIn("| ssp1 | no | **failed** | – | – |", lines[3])
        report = gc.render_report([failed, missing], [("sync", "interrupted")],
                                  ["date: today"], 0.85, [])
        self.assertIn("## Failed runs", report)
        self.assertIn("**ssp1**: grps-local exited with status 2", report)
        self.assertIn("- sync: interrupted", report)
        self.assertIn("- date: today", report)

    def test_run_timeout_is_a_share_of_the_budget_left_unless_fixed(self):
        self.assertEqual(gc.run_timeout(0, 600, 12), 100)
        self.assertEqual(gc.run_timeout(0, 100, 12), 30)   # at least 30 s
        self.assertEqual(gc.run_timeout(0, 20, 12), 20)    # never beyond the budget
        self.assertEqual(gc.run_timeout(45, 600, 12), 45)


# A fake grps-local: writes a result JSON and a curve into the run dir it is
# given, or fails for runs whose flags include --mode=ssp.
FAKE_GRPS_LOCAL = textwrap.dedent("""\
    #!/bin/sh
    for a in "$@"; do
      case "$a" in
        --run_dir=*) run_dir="${a#--run_dir=}";;
        --result_json=*) result="${a#--result_json=}";;
        --mode=ssp) echo "grps-local: ssp is broken here"; exit 1;;
      esac
    done
    mkdir -p "$run_dir"
    now=$(date +%s)
    printf '%s' "$HEADER" > "$run_dir/curve-worker-0.csv"
    echo "10,0,1,$((now + 1)),1.0,10,0.9,0.3,1" >> "$run_dir/curve-worker-0.csv"
    echo "{\\"exit\\":\\"ok\\",\\"started_unix\\":$now,\\"final_test_accuracy\\":0.9,\\
    \\"samples_per_sec\\":100,\\"staleness_histogram\\":[3,1],\\"staleness_mean\\":0.25,\\
    \\"staleness_max\\":1,\\"late_gradients\\":0,\\"too_stale\\":0,\\"workers_died\\":0,\\
    \\"wall_seconds\\":1}" > "$result"
    echo "final test accuracy: 0.9000"
    """)


class CommandTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin)
        path = write(os.path.join(self.bin, "grps-local"), FAKE_GRPS_LOCAL)
        os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        os.environ["HEADER"] = HEADER
        self.out = os.path.join(self.dir, "report")

    def main(self, *flags):
        return gc.main(["--bin_dir=" + self.bin, "--out=" + self.out, "--quick"] +
                       list(flags))

    def test_failed_runs_are_reported_and_do_not_stop_the_others(self):
        code = self.main("--runs=sync,ssp1", "--target=0.85")
        self.assertEqual(code, 1)
        with open(os.path.join(self.out, "report.md")) as f:
            report = f.read()
        self.assertIn("| sync | no |", report)
        self.assertIn("| ssp1 | no | **failed** |", report)
        self.assertIn("| ssp1+straggler | yes | **failed** |", report)
        self.assertIn("grps-local exited with status 1", report)
        self.assertIn("--train_limit=2000", report)  # the configuration note
        with open(os.path.join(self.out, "summary.json")) as f:
            summary = json.load(f)
        sync = summary["runs"][0]
        self.assertTrue(sync["ok"])
        self.assertAlmostEqual(sync["time_to_target_s"], 1.0)
        with open(os.path.join(self.out, "runs", "sync+straggler.out")) as f:
            self.assertIn("--straggler_rank=2", f.readline())

    def test_an_entry_runs_the_users_program_without_grps_workers_own_flags(self):
        code = self.main("--runs=sync", "--entry=/usr/bin/python3 train.py --eval_every 5")
        self.assertEqual(code, 0)
        with open(os.path.join(self.out, "runs", "sync+straggler.out")) as f:
            argv = f.readline()
        self.assertIn("--entry=/usr/bin/python3 train.py --eval_every 5", argv)
        self.assertIn("--straggler_rank=2", argv)
        self.assertIn("--steps=30", argv)
        for flag in ("--eval_every=", "--train_limit=", "--test_limit="):
            self.assertNotIn(" " + flag, argv)
        with open(os.path.join(self.out, "report.md")) as f:
            self.assertIn("job: the workers' program: /usr/bin/python3 train.py", f.read())

    def test_runs_past_the_budget_are_skipped_with_a_note(self):
        code = self.main("--runs=sync", "--budget_s=5")
        self.assertEqual(code, 1)
        with open(os.path.join(self.out, "report.md")) as f:
            report = f.read()
        self.assertIn("## Skipped runs", report)
        self.assertIn("- sync: the 5s budget was spent", report)
        self.assertIn("- sync+straggler: the 5s budget was spent", report)

    def test_a_missing_grps_local_is_a_usage_error(self):
        os.remove(os.path.join(self.bin, "grps-local"))
        self.assertEqual(self.main("--runs=sync"), 2)

    def test_plots_are_written_when_matplotlib_is_there(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("no matplotlib")
        self.assertEqual(self.main("--runs=async"), 0)
        for name in ("accuracy_vs_time.png", "accuracy_vs_steps.png",
                     "throughput.png", "staleness.png"):
            self.assertTrue(os.path.getsize(os.path.join(self.out, name)) > 0, name)


if __name__ == "__main__":
    unittest.main()
