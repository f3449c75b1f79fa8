#include "launcher/curves_plot.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "launcher/child_specs.h"

namespace grps {

CurveFile ReadCurveFile(const std::string& path, const std::string& label) {
  CurveFile c;
  c.path = path;
  c.label = label;
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) return c;
  std::vector<std::string> names = absl::StrSplit(line, ',');
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string name(absl::StripAsciiWhitespace(names[i]));
    const int column = static_cast<int>(i) + 1;
    if (name == "step") c.step = column;
    if (name == "unix_time") c.unix_time = column;
    if (name == "loss") c.loss = column;
    if (name == "test_accuracy") c.test_accuracy = column;
    if (name == "evaluated") c.evaluated = column;
  }
  while (std::getline(f, line) && !(c.has_evaluated && c.has_training)) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    c.has_rows = true;
    std::vector<std::string> fields = absl::StrSplit(line, ',');
    const bool evaluation = c.evaluated > 0 &&
                            static_cast<size_t>(c.evaluated) <= fields.size() &&
                            absl::StripAsciiWhitespace(fields[c.evaluated - 1]) == "1";
    (evaluation ? c.has_evaluated : c.has_training) = true;
  }
  return c;
}

namespace {

// A gnuplot single-quoted string ('' stands for ').
std::string GnuplotString(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}}), "'");
}

// Draws nothing, but keeps the panel with its title and a "no data" note.
constexpr char kEmptyPanel[] =
    "set label 1 'no data' at graph 0.5, 0.5 center\n"
    "set xrange [0:1]\nset yrange [0:1]\nplot 2 notitle\n"
    "unset label 1\nset autoscale\n";

}  // namespace

std::string CurvesGnuplotScript(const std::vector<CurveFile>& curves, double started_unix,
                                const std::string& svg_path) {
  std::string gp = absl::StrCat(
      "# Written by grps-local: the workers' training curves from their CSVs.\n"
      "# Re-draw with: gnuplot curves.gp\n"
      "set terminal svg size 900,800 dynamic background rgb 'white'\n"
      "set output ",
      GnuplotString(svg_path),
      "\n"
      "set datafile separator ','\n"
      // Rows that are not evaluations are NaN in the accuracy panel, and a
      // line goes on across them.
      "set datafile missing NaN\n"
      "set key outside right top noenhanced\n"
      // The same plot area in both panels, whatever their keys' widths.
      "set lmargin at screen 0.08\nset rmargin at screen 0.7\n"
      "set grid\n"
      "set multiplot layout 2,1\n"
      "set title 'training loss'\nset xlabel 'step'\nset ylabel 'loss'\n");
  std::vector<std::string> series;
  for (const CurveFile& c : curves)
    if (c.has_training && c.step > 0 && c.loss > 0)
      // Evaluation rows are written when an evaluation ends, out of step
      // order: the loss line skips them.
      series.push_back(absl::StrCat(
          GnuplotString(c.path), " skip 1 using ", c.step, ":",
          c.evaluated > 0 ? absl::StrFormat("($%d == 1 ? NaN : $%d)", c.evaluated, c.loss)
                          : absl::StrCat(c.loss),
          " with lines title ", GnuplotString(c.label)));
  if (series.empty()) {
    gp += kEmptyPanel;
  } else {
    absl::StrAppend(&gp, "plot ", absl::StrJoin(series, ", \\\n     "), "\n");
  }
  absl::StrAppend(&gp,
                  "set title 'test accuracy (evaluations)'\n"
                  "set xlabel 'seconds since the launch'\nset ylabel 'accuracy'\n");
  series.clear();
  for (const CurveFile& c : curves)
    if (c.has_evaluated && c.unix_time > 0 && c.test_accuracy > 0)
      series.push_back(absl::StrFormat(
          "%s skip 1 using ($%d - %.3f):($%d == 1 ? $%d : NaN) with linespoints pt 7 "
          "ps 0.5 title %s",
          GnuplotString(c.path), c.unix_time, started_unix, c.evaluated, c.test_accuracy,
          GnuplotString(absl::StrCat("evaluated by ", c.label))));
  if (series.empty()) {
    gp += kEmptyPanel;
  } else {
    absl::StrAppend(&gp, "plot ", absl::StrJoin(series, ", \\\n     "), "\n");
  }
  return gp + "unset multiplot\n";
}

std::string FindInSearchPath(const std::string& program, const std::string& search_path) {
  for (absl::string_view dir : absl::StrSplit(search_path, ':', absl::SkipEmpty())) {
    const std::string path = InDir(std::string(dir), program);
    if (access(path.c_str(), X_OK) == 0 && !std::filesystem::is_directory(path)) return path;
  }
  return "";
}

}  // namespace grps
