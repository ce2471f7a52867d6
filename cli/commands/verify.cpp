// gdn-testbed verify: judge the outputs an external implementation wrote into case files
// (files, or folders of .safetensors files); a verdict table, exit 1 on any FAIL or ERROR.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <iostream>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"

namespace gdn::cli {

namespace {

struct VerifyOptions {
  std::vector<std::string> paths;
  BudgetChoice budget;
  VerdictFiles files;
  bool verbose = false;
};

// Files as given; folders contribute their *.safetensors files, sorted by name.
std::vector<std::string> case_files_under(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) throw UsageError("no such file or folder: " + p);
    if (S_ISDIR(st.st_mode)) {
      std::vector<std::string> found;
      DIR* d = ::opendir(p.c_str());
      while (dirent* e = d ? ::readdir(d) : nullptr) {
        const std::string n = e->d_name;
        if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) found.push_back(p + "/" + n);
      }
      if (d) ::closedir(d);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(p);
    }
  }
  return files;
}

int verify(const VerifyOptions& o, const std::string& command) {
  if (o.paths.empty()) throw UsageError("verify needs case files or folders");
  const auto budget = o.budget.get();
  std::vector<oracle::Verdict> verdicts;
  for (const std::string& path : case_files_under(o.paths)) {
    oracle::Verdict v;
    try {
      const oracle::CaseFile c = oracle::read_case_file(path);
      const std::string name = c.meta("gdn.implementation", "(unnamed)");
      oracle::CaseContext context(c.meta("gdn.case_name", path), c.problem, c.inputs);
      if (!c.outputs) {
        v.case_name = context.name();
        v.implementation = name;
        v.status = oracle::Status::error;
        v.message = path + " holds no outputs (out.o): run the external implementation on it first";
      } else {
        v = oracle::evaluate_outputs(name, formulation_of(c), chunk_size_of(c), context, *c.outputs,
                                     budget ? *budget : file_budget(c, std::nullopt, nullptr));
        v.message = path;
      }
    } catch (const oracle::CaseFileError& e) {
      v.case_name = path;
      v.implementation = "(unreadable)";
      v.status = oracle::Status::error;
      v.message = e.what();
    }
    verdicts.push_back(std::move(v));
  }
  print_table(std::cout, verdicts, o.verbose);
  o.files.write("gdn-testbed verify", command, verdicts);
  return exit_code(verdicts);
}

}  // namespace

void add_verify(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand(
      "verify",
      "judge outputs an external implementation wrote into case files (files or folders); verdict table, "
      "exit 1 on any FAIL/ERROR.");
  auto o = std::make_shared<VerifyOptions>();
  sub->add_option("PATH", o->paths, "case files, or folders of *.safetensors files")->type_name("");
  add_budget(*sub, &o->budget, "each file's gdn.budget, else the oracle's calibrated budget");
  add_verdict_files(*sub, &o->files);
  sub->add_flag("--verbose", o->verbose, "every check and metric of failed verdicts below the table");
  sub->callback([o, &context] { context.exit_code = verify(*o, context.command_line); });
}

}  // namespace gdn::cli
