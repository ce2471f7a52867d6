// gdn-testbed report: make the accuracy and speed reports. They live in reports/ (Python and
// matplotlib): this runs reports/make_reports.py with the committed results and the reports
// folder as defaults and hands every other argument on.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"

#ifndef GDN_SOURCE_DIR
#define GDN_SOURCE_DIR "."
#endif

namespace gdn::cli {

namespace {

struct ReportOptions {
  std::string results = std::string(GDN_SOURCE_DIR) + "/reports/results";
  std::string out = std::string(GDN_SOURCE_DIR) + "/reports";
};

std::string shell_quoted(const std::string& a) {
  std::string quoted = "'";
  for (char ch : a) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

int report(const ReportOptions& o, std::vector<std::string> rest) {
  const std::string script = std::string(GDN_SOURCE_DIR) + "/reports/make_reports.py";
  if (::access(script.c_str(), R_OK) != 0) {
    std::cerr << "gdn-testbed report: " << script << " does not exist\n";
    return 2;
  }
  rest.insert(rest.end(), {"--results", o.results, "--out", o.out});
  std::string cmd = "python3 '" + script + "'";
  for (const std::string& a : rest) cmd += " " + shell_quoted(a);
  std::cout << "gdn-testbed report: " << cmd << "\n" << std::flush;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

}  // namespace

void add_report(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand(
      "report", "make the accuracy and speed reports (runs reports/make_reports.py; other arguments are passed on)");
  auto o = std::make_shared<ReportOptions>();
  sub->add_option("--results", o->results, "folder of results, searched recursively")
      ->type_name("DIR")
      ->capture_default_str();
  sub->add_option("--out", o->out, "folder for accuracy.md, speed.md and plots/")->type_name("DIR")->capture_default_str();
  sub->allow_extras();
  sub->footer("Other arguments go to reports/make_reports.py (python3 reports/make_reports.py --help).");
  sub->callback([o, sub, &context] { context.exit_code = report(*o, sub->remaining()); });
}

}  // namespace gdn::cli
