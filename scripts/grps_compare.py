"""grps-compare: runs the same job under each consistency mode and reports.

One command runs the default Fashion-MNIST job with grps-local under sync,
sync with a backup worker, async, async with a staleness-aware learning rate,
ssp(1) and ssp(4), each without and with an injected straggler (rank 2 at
five times its step time): 12 runs, one after the other. It writes, into the
report directory:

  report.md              the table (one row per run) and the configuration
  summary.json           the same figures, for a program
  accuracy_vs_time.png   test accuracy against seconds since each launch
  accuracy_vs_steps.png  test accuracy against step
  throughput.png         samples/s per run
  staleness.png          staleness histograms of the async and ssp runs
  runs/<name>/           each run's grps-local run dir (logs, curves, result)
  runs/<name>.out        each run's grps-local output

The pure parts (reading curves, time to target, p99 from a histogram, the
table) are functions here, tested by grps_compare_test.py; main() is the
command. A run that fails is reported as failed and the next one runs. The
whole comparison is bounded by --budget_s: runs that would start after it are
skipped with a note. Each run is bounded by grps-local's own --timeout_s.

Process hygiene: each grps-local runs in its own session, so a Ctrl-C reaches
only this script, which then sends SIGTERM to that grps-local (by its pid),
waits for it to stop its daemons, and reports what finished. This script
never signals anything else.
"""

import argparse
import csv
import datetime
import glob
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time

# name, grps-local flags. Every run also gets COMMON_FLAGS.
CONFIGS = [
    ("sync", ["--mode=sync"]),
    ("sync-backup1", ["--mode=sync", "--backup_workers=1"]),
    ("async", ["--mode=async"]),
    ("async-salr", ["--mode=async", "--staleness_aware_lr=true"]),
    ("ssp1", ["--mode=ssp", "--staleness=1"]),
    ("ssp4", ["--mode=ssp", "--staleness=4"]),
]
COMMON_FLAGS = ["--workers=3", "--eval_every=50"]
STRAGGLER_SUFFIX = "+straggler"
STRAGGLER_FLAGS = ["--straggler_rank=2", "--straggle_factor=5"]
QUICK_FLAGS = ["--train_limit=2000", "--test_limit=500", "--steps=30",
               "--eval_every=10"]
# grps-worker's: the program of --entry reads its own data and evaluates
# when it will, so these are not passed with it.
WORKER_ONLY_FLAGS = ("--eval_every=", "--train_limit=", "--test_limit=")
# Between SIGTERM to grps-local and SIGKILL: it gives each daemon 5 s.
STOP_GRACE_S = 30
# A run is not started with less of the budget left than this.
MIN_RUN_S = 10


class Run:
    """One planned run: its name, whether it has a straggler, its flags."""

    def __init__(self, name, base, straggler, flags):
        self.name = name
        self.base = base
        self.straggler = straggler
        self.flags = flags


def plan_runs(selection=None):
    """The runs in order; `selection` (a list of names) keeps only those.

    A base name ("sync") selects both of its runs, a full name
    ("sync+straggler") just that one. Unknown names raise ValueError.
    """
    runs = []
    for base, flags in CONFIGS:
        runs.append(Run(base, base, False, flags))
        runs.append(Run(base + STRAGGLER_SUFFIX, base, True, flags + STRAGGLER_FLAGS))
    if not selection:
        return runs
    known = {r.name for r in runs} | {base for base, _ in CONFIGS}
    unknown = [s for s in selection if s not in known]
    if unknown:
        raise ValueError("unknown run(s): %s (known: %s)" % (
            ", ".join(unknown), ", ".join(sorted(known))))
    return [r for r in runs if r.name in selection or r.base in selection]


# ---- Reading a run's results ------------------------------------------------

def _number(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def read_curve(path, started_unix=None):
    """The rows of one worker's curve CSV, as dicts of floats (None if empty).

    A file from before the unix_time and evaluated columns existed is read
    too: a row is an evaluation if it has a test accuracy (not empty, not
    negative: -1 meant none), and its time is started_unix + elapsed_s (the
    worker's own clock, which starts a little after the launch).
    """
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        for raw in reader:
            row = {k.strip(): _number(v) for k, v in raw.items() if k is not None}
            if row.get("step") is None:
                continue
            if "evaluated" not in raw:
                accuracy = row.get("test_accuracy")
                row["evaluated"] = 1.0 if accuracy is not None and accuracy >= 0 else 0.0
            if row.get("unix_time") is None and started_unix is not None and \
                    row.get("elapsed_s") is not None:
                row["unix_time"] = started_unix + row["elapsed_s"]
            rows.append(row)
    return rows


def evaluations(curves):
    """Evaluated rows merged over workers: (unix_time, step, accuracy), by time.

    `curves` is a list of row lists (read_curve). The same evaluation seen
    twice (same step and accuracy) is kept once.
    """
    seen = set()
    points = []
    for rows in curves:
        for row in rows:
            accuracy = row.get("test_accuracy")
            if row.get("evaluated") != 1.0 or accuracy is None or accuracy < 0:
                continue
            key = (row["step"], row["test_accuracy"])
            if key in seen:
                continue
            seen.add(key)
            points.append((row.get("unix_time"), row["step"], row["test_accuracy"]))
    points.sort(key=lambda p: (p[0] is None, p[0] if p[0] is not None else 0, p[1]))
    return points


def time_to_target(points, started_unix, target):
    """Seconds from the launch to the first evaluation >= target, or None."""
    for unix_time, _, accuracy in points:
        if unix_time is not None and accuracy >= target:
            return unix_time - started_unix
    return None


def histogram_percentile(histogram, fraction):
    """The staleness below which `fraction` of the updates lie.

    histogram[i] counts updates of staleness i, the last bucket those at or
    above its index. Returns (value, open_ended): open_ended when the
    percentile falls in the last bucket (meaning ">= value"); (None, False)
    for an empty histogram.
    """
    total = sum(histogram)
    if total == 0:
        return None, False
    needed = fraction * total
    cumulative = 0
    for i, count in enumerate(histogram):
        cumulative += count
        if cumulative >= needed:
            return i, i == len(histogram) - 1
    return len(histogram) - 1, True


def summarize(run, result, curves, target, error=None):
    """One report row (a dict) from a run's result JSON and curves.

    `result` is the parsed result JSON or None; `error` says why the run
    failed, if it did (a result with exit != "ok" is a failure too).
    """
    result = result or {}
    started = result.get("started_unix")
    points = evaluations(curves)
    histogram = result.get("staleness_histogram") or []
    p99, p99_open = histogram_percentile(histogram, 0.99)
    exit_kind = result.get("exit")
    if error is None and exit_kind not in (None, "ok"):
        error = "%s: %s" % (exit_kind, result.get("error", ""))
    if error is None and not result:
        error = "no result JSON"
    return {
        "name": run.name,
        "base": run.base,
        "straggler": run.straggler,
        "ok": error is None,
        "error": error,
        "time_to_target_s": time_to_target(points, started, target)
        if started is not None else None,
        "final_test_accuracy": result.get("final_test_accuracy"),
        # A failed run's zero is not a measurement.
        "samples_per_sec": result.get("samples_per_sec")
        if error is None or result.get("samples_per_sec") else None,
        "staleness_mean": result.get("staleness_mean") if sum(histogram) else None,
        "staleness_p99": p99,
        "staleness_p99_open": p99_open,
        "staleness_max": result.get("staleness_max") if sum(histogram) else None,
        "staleness_histogram": histogram,
        "late_gradients": result.get("late_gradients"),
        "too_stale": result.get("too_stale"),
        "workers_died": result.get("workers_died"),
        "wall_seconds": result.get("wall_seconds"),
        "started_unix": started,
        "evaluations": points,
    }


# ---- The table --------------------------------------------------------------

def _fmt(value, spec="%.1f", missing="–"):
    return missing if value is None else spec % value


def format_staleness(row):
    """"mean / p99 / max", p99 as ">= 15" when in the open last bucket."""
    if row["staleness_mean"] is None:
        return "–"
    p99 = row["staleness_p99"]
    p99_text = ("≥ %d" if row["staleness_p99_open"] else "%d") % p99
    return "%.2f / %s / %d" % (row["staleness_mean"], p99_text, row["staleness_max"])


TABLE_HEADER = ["run", "straggler", "time to target (s)", "final accuracy",
                "samples/s", "staleness mean / p99 / max",
                "late / too stale", "workers died", "wall (s)"]


def render_table(rows, target):
    """The Markdown table, one line per row (rows from summarize)."""
    header = list(TABLE_HEADER)
    header[2] = "time to %.2f (s)" % target
    lines = ["| " + " | ".join(header) + " |",
             "|---|---|" + "|".join(["---:"] * (len(header) - 2)) + "|"]
    for row in rows:
        if row["ok"]:
            ttt = _fmt(row["time_to_target_s"], missing="not reached")
        else:
            ttt = "**failed**"
        late = row["late_gradients"]
        stale = row["too_stale"]
        cells = [
            row["name"],
            "yes" if row["straggler"] else "no",
            ttt,
            _fmt(row["final_test_accuracy"], "%.4f"),
            _fmt(row["samples_per_sec"], "%.0f"),
            format_staleness(row),
            "–" if late is None and stale is None else "%s / %s" % (
                _fmt(late, "%d", "0"), _fmt(stale, "%d", "0")),
            _fmt(row["workers_died"], "%d"),
            _fmt(row["wall_seconds"], "%.1f"),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def render_report(rows, skipped, notes, target, plots):
    """report.md: title, configuration notes, table, failures, plots."""
    out = ["# grps consistency comparison", ""]
    out += ["- " + n for n in notes]
    out += ["", render_table(rows, target)]
    out += ["Time to target: seconds from the launch to the first test evaluation "
            "at or above %.2f (\"not reached\": never, within the run). Staleness "
            "p99 comes from the merged histogram; \"≥ N\" means the last, open "
            "bucket. Late gradients: sync steps that completed without them "
            "(backup workers); too stale: refused as staler than max_staleness."
            % target, ""]
    failed = [r for r in rows if not r["ok"]]
    if failed:
        out += ["## Failed runs", ""]
        out += ["- **%s**: %s (see runs/%s.out and runs/%s/)" % (
            r["name"], (r["error"] or "").strip().replace("\n", " "), r["name"],
            r["name"]) for r in failed]
        out.append("")
    if skipped:
        out += ["## Skipped runs", ""]
        out += ["- %s: %s" % (name, why) for name, why in skipped]
        out.append("")
    if plots:
        out += ["## Plots", ""]
        for title, path in plots:
            out += ["### " + title, "", "![%s](%s)" % (title, path), ""]
    return "\n".join(out)


# ---- Plots --------------------------------------------------------------------

def write_plots(rows, out_dir, target):
    """Writes the PNGs; returns [(title, file name)] of those written.

    Raises ImportError without matplotlib.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bases = []
    for row in rows:
        if row["base"] not in bases:
            bases.append(row["base"])
    colors = {b: "C%d" % i for i, b in enumerate(bases)}
    written = []

    for kind, title, xlabel in (
            ("time", "Test accuracy against time", "seconds since launch"),
            ("steps", "Test accuracy against steps", "step")):
        fig, ax = plt.subplots(figsize=(9, 5.5))
        drawn = False
        for row in rows:
            points = row["evaluations"]
            if kind == "time":
                if row["started_unix"] is None:
                    continue
                xy = [(t - row["started_unix"], a) for t, _, a in points if t is not None]
            else:
                xy = sorted((s, a) for _, s, a in points)
            if not xy:
                continue
            ax.plot([p[0] for p in xy], [p[1] for p in xy], marker=".",
                    linestyle="--" if row["straggler"] else "-",
                    color=colors[row["base"]], label=row["name"])
            drawn = True
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.set_title(title + " (dashed: with a straggler)")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small", ncol=2)
        else:
            ax.text(0.5, 0.5, "no evaluations", transform=ax.transAxes, ha="center")
        name = "accuracy_vs_%s.png" % kind
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=100)
        plt.close(fig)
        written.append((title, name))

    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [r["name"] for r in rows]
    values = [r["samples_per_sec"] or 0 for r in rows]
    bars = ax.bar(range(len(rows)), values, color=[colors[r["base"]] for r in rows])
    for bar, row in zip(bars, rows):
        if row["straggler"]:
            bar.set_hatch("//")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize="small")
    ax.set_ylabel("samples/s (all workers)")
    ax.set_title("Throughput (hatched: with a straggler)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "throughput.png"), dpi=100)
    plt.close(fig)
    written.append(("Throughput", "throughput.png"))

    stale_rows = [r for r in rows if r["base"].startswith(("async", "ssp"))]
    if stale_rows:
        cols = 2
        nrows = (len(stale_rows) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(9, 2.4 * nrows), squeeze=False)
        for ax, row in zip(axes.flat, stale_rows):
            h = row["staleness_histogram"]
            if sum(h):
                ax.bar(range(len(h)), h, color=colors[row["base"]])
                ax.set_xticks(range(0, len(h), max(1, len(h) // 8)))
            else:
                ax.text(0.5, 0.5, "no updates measured", transform=ax.transAxes,
                        ha="center")
            ax.set_title(row["name"], fontsize="small")
            ax.set_xlabel("staleness (last bucket: ≥)", fontsize="small")
        for ax in list(axes.flat)[len(stale_rows):]:
            ax.axis("off")
        fig.suptitle("Staleness of applied updates (all shards)")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "staleness.png"), dpi=100)
        plt.close(fig)
        written.append(("Staleness", "staleness.png"))
    return written


# ---- Running ------------------------------------------------------------------

class Interrupted(Exception):
    pass


def _raise_interrupted(signum, frame):
    raise Interrupted()


def job_flags(quick, epochs, entry):
    """grps-local's flags for every run (before its own): COMMON_FLAGS, the
    quick ones, --epochs, and --entry without grps-worker's own flags."""
    flags = COMMON_FLAGS + (QUICK_FLAGS if quick else [])
    if epochs is not None:
        flags = flags + ["--epochs=%d" % epochs]
    if entry:
        flags = [f for f in flags if not f.startswith(WORKER_ONLY_FLAGS)] + ["--entry=" + entry]
    return flags


def run_one(run, grps_local, job, out_dir, timeout_s):
    """Runs grps-local once with the flags `job` (job_flags) and the run's;
    returns (result dict or None, curves, error)."""
    run_dir = os.path.join(out_dir, "runs", run.name)
    result_path = os.path.join(out_dir, "runs", run.name + ".json")
    out_path = os.path.join(out_dir, "runs", run.name + ".out")
    argv = [grps_local] + job + run.flags + [
        "--run_dir=" + run_dir, "--result_json=" + result_path,
        "--timeout_s=%d" % max(1, int(timeout_s))]
    error = None
    with open(out_path, "w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            return None, [], "cannot start grps-local: %s" % e
        try:
            # grps-local's --timeout_s ends the job; this is the backstop.
            code = proc.wait(timeout=timeout_s + STOP_GRACE_S + 30)
        except subprocess.TimeoutExpired:
            stop(proc)
            code = proc.returncode
            error = "grps-local did not end within its timeout"
        except Interrupted:
            stop(proc)
            raise
    if error is None and code != 0:
        error = "grps-local exited with status %s" % code
    result = None
    try:
        with open(result_path) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        if error is None:
            error = "no result JSON: %s" % e
    if result is not None and result.get("exit") not in (None, "ok"):
        error = "%s: %s" % (result["exit"], result.get("error", ""))
    curves = []
    started = result.get("started_unix") if result else None
    for path in sorted(glob.glob(os.path.join(run_dir, "curve-worker-*.csv"))):
        try:
            curves.append(read_curve(path, started))
        except (OSError, csv.Error):
            pass
    return result, curves, error


def run_timeout(fixed_s, left_s, runs_left):
    """A run's time limit: `fixed_s` if set (> 0), else twice an even share
    of the budget left (at least 30 s); never more than `left_s`."""
    limit = fixed_s if fixed_s > 0 else max(30.0, 2.0 * left_s / max(1, runs_left))
    return min(limit, left_s)


def stop(proc):
    """SIGTERM to our grps-local (it stops its daemons), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while proc.poll() is None:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except Interrupted:  # a second Ctrl-C: keep waiting, it is stopping
            pass


def machine_notes():
    notes = ["machine: %s, %d CPUs (nproc), Python %s" % (
        platform.node() or "?", os.cpu_count() or 0, platform.python_version())]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    notes.append("CPU: " + line.split(":", 1)[1].strip())
                    break
    except OSError:
        pass
    return notes


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="grps-compare",
        description="Run the same grps job under sync, sync+backup, async, "
                    "async+staleness-aware lr, ssp(1) and ssp(4), each without "
                    "and with a straggler, and write a report.")
    p.add_argument("--bin_dir", default="build/bin",
                   help="where grps-local and the daemons are (default build/bin)")
    p.add_argument("--out", default=None,
                   help="report directory (default reports/compare-<time>)")
    p.add_argument("--target", type=float, default=0.85,
                   help="test accuracy for time-to-target (default 0.85)")
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the data per run (default: grps-local's)")
    p.add_argument("--quick", action="store_true",
                   help="a small smoke configuration (%s)" % " ".join(QUICK_FLAGS))
    p.add_argument("--runs", default="",
                   help="comma-separated runs or configs to run, e.g. sync,async "
                        "or sync+straggler (default: all 12)")
    p.add_argument("--budget_s", type=float, default=900,
                   help="total time budget; runs not started by then are skipped "
                        "(default 900)")
    p.add_argument("--entry", default="",
                   help="the workers are your own program (grps-local --entry), e.g. "
                        "\"/usr/bin/python3 examples/torch/fashion_cnn.py --eval_every 100\": "
                        "its curve is what it reports (gt.report), its straggler is made "
                        "by grps.torch")
    p.add_argument("--run_timeout_s", type=float, default=0,
                   help="each run's grps-local --timeout_s (default: twice an even "
                        "share of what is left of the budget, at least 30 s); never "
                        "more than what is left")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        runs = plan_runs([s for s in args.runs.split(",") if s])
    except ValueError as e:
        print("grps-compare: %s" % e, file=sys.stderr)
        return 2
    grps_local = os.path.join(args.bin_dir, "grps-local")
    if not os.access(grps_local, os.X_OK):
        print("grps-compare: cannot find grps-local in %s (build it, or point "
              "--bin_dir at it)" % args.bin_dir, file=sys.stderr)
        return 2
    started = datetime.datetime.now()
    out_dir = args.out or os.path.join(
        "reports", "compare-" + started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.join(out_dir, "runs"), exist_ok=True)
    job = job_flags(args.quick, args.epochs, args.entry)

    notes = ["date: %s" % started.strftime("%Y-%m-%d %H:%M:%S %Z").strip()]
    notes += machine_notes()
    notes.append("job: %s with %s%s" % (
        "the workers' program: " + args.entry if args.entry
        else "grps-local defaults (Fashion-MNIST, 2 servers)",
        " ".join(f for f in job if not f.startswith("--entry=")),
        " (--quick)" if args.quick else ""))
    notes.append("straggler runs add: %s" % " ".join(STRAGGLER_FLAGS))
    notes.append("target accuracy %.2f; budget %ds; each run at most %s" % (
        args.target, args.budget_s,
        "%ds" % args.run_timeout_s if args.run_timeout_s > 0
        else "twice its share of the budget left"))

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, _raise_interrupted)
    deadline = time.monotonic() + args.budget_s
    rows, skipped = [], []
    print("grps-compare: %d runs into %s" % (len(runs), out_dir), flush=True)
    try:
        for i, run in enumerate(runs):
            left = deadline - time.monotonic()
            if left < MIN_RUN_S:
                skipped += [(r.name, "the %ds budget was spent" % args.budget_s)
                            for r in runs[i:]]
                print("grps-compare: budget spent; skipping %d runs" %
                      len(runs[i:]), flush=True)
                break
            timeout = run_timeout(args.run_timeout_s, left, len(runs) - i)
            print("grps-compare: [%d/%d] %s ..." % (i + 1, len(runs), run.name),
                  end=" ", flush=True)
            t0 = time.monotonic()
            result, curves, error = run_one(run, grps_local, job, out_dir, timeout)
            row = summarize(run, result, curves, args.target, error)
            rows.append(row)
            print("%s (%.0fs)" % ("ok" if row["ok"] else "FAILED: " + row["error"],
                                  time.monotonic() - t0), flush=True)
    except Interrupted:
        done = {r["name"] for r in rows}
        skipped += [(r.name, "interrupted") for r in runs if r.name not in done]
        print("\ngrps-compare: interrupted; writing the report so far", flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

    plots = []
    try:
        plots = write_plots(rows, out_dir, args.target)
    except ImportError:
        notes.append("no plots: matplotlib is missing (scripts/setup installs "
                     "python3-matplotlib)")
    except Exception as e:  # a plot never costs the report
        notes.append("no plots: %s" % e)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(render_report(rows, skipped, notes, args.target, plots))
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"notes": notes, "runs": rows, "skipped": skipped}, f, indent=1)
    print("grps-compare: report in %s" % os.path.join(out_dir, "report.md"))
    if any(why == "interrupted" for _, why in skipped):
        return 130
    failed = sum(1 for r in rows if not r["ok"])
    return 0 if failed == 0 and not skipped else 1
