// The workers' training curves drawn by gnuplot: what a curve CSV holds and
// the script that plots them (LocalLauncher runs it when gnuplot is there).
#ifndef GRPS_LAUNCHER_CURVES_PLOT_H_
#define GRPS_LAUNCHER_CURVES_PLOT_H_

#include <string>
#include <vector>

namespace grps {

// What the plot needs to know of one worker's curve CSV.
struct CurveFile {
  std::string path;
  std::string label;  // e.g. "worker-0"
  // 1-based columns by name from the header line; 0: absent.
  int step = 0, unix_time = 0, loss = 0, test_accuracy = 0, evaluated = 0;
  bool has_rows = false;       // any line after the header
  bool has_evaluated = false;  // any row with evaluated=1
  bool has_training = false;   // any row that is not an evaluation (a loss to draw)
};

// Reads the header and scans the rows of the CSV at `path`.
CurveFile ReadCurveFile(const std::string& path, const std::string& label);

// A gnuplot script that draws `svg_path`, two panels: training loss against
// step (one line per file with rows and the columns), above test accuracy
// of the evaluated rows against seconds since `started_unix` (one line per
// file that has any). A panel with nothing to draw says "no data".
std::string CurvesGnuplotScript(const std::vector<CurveFile>& curves, double started_unix,
                                const std::string& svg_path);

// The first executable file named `program` in the directories of
// `search_path` (a PATH-style list), or "" if none.
std::string FindInSearchPath(const std::string& program, const std::string& search_path);

}  // namespace grps

#endif  // GRPS_LAUNCHER_CURVES_PLOT_H_
