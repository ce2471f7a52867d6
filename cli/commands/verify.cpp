// gdn-testbed verify: judge the outputs an external implementation wrote into case files
// (files, or folders of .safetensors files); a verdict table, exit 1 on any FAIL or ERROR.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "cli/registry_all.hpp"

namespace gdn::cli {

namespace {

struct VerifyOptions {
  std::vector<std::string> paths;
  BudgetChoice budget;
  VerdictFiles files;
  bool verbose = false;
  bool allow_empty = false;
  oracle::CaseLimits limits;
};

// Files as given; folders contribute every entry whose name ends in .safetensors, sorted by
// name, whatever its type: a folder or FIFO so named becomes an ERROR verdict (judge_case_file
// refuses it before opening it), so nothing named like a case is silently left out. Write
// temporaries (NAME.tmp.PID.N, oracle::write_file_atomic) do not end in .safetensors.
std::vector<std::string> case_files_under(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) throw UsageError("no such file or folder: " + p);
    if (S_ISDIR(st.st_mode)) {
      std::vector<std::string> found;
      DIR* d = ::opendir(p.c_str());
      if (d == nullptr) throw UsageError("cannot list the folder " + p + ": " + std::strerror(errno));
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) found.push_back(p + "/" + n);
      }
      ::closedir(d);
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
  const std::vector<std::string> files = case_files_under(o.paths);
  // Zero verdicts would read as "nothing failed": an error unless asked for.
  if (files.empty() && !o.allow_empty)
    throw UsageError("verify: no case files (*.safetensors) in the paths given; --allow-empty accepts that");
  std::vector<oracle::Verdict> verdicts;
  const EntryLookup lookup = [](const std::string& name) { return default_registry().find(name); };
  for (const std::string& path : files) verdicts.push_back(judge_case_file(path, budget, lookup, o.limits));
  print_table(std::cout, verdicts, o.verbose);
  o.files.write("gdn-testbed verify", command, verdicts);
  if (!verdicts.empty() && tally(verdicts).error == static_cast<int>(verdicts.size()))
    std::cerr << "gdn-testbed verify: no readable case among " << verdicts.size() << " files\n";
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
  add_budget(*sub, &o->budget,
             "each file's gdn.budget where it is no looser than the default (the named implementation's "
             "budget, else calibrated), else that default");
  add_verdict_files(*sub, &o->files);
  add_case_limits(*sub, &o->limits);
  sub->add_flag("--allow-empty", o->allow_empty, "exit 0 when no case file is found (else a usage error)");
  sub->add_flag("--verbose", o->verbose, "every check and metric of failed verdicts below the table");
  sub->callback([o, &context] { context.exit_code = verify(*o, context.command_line); });
}

}  // namespace gdn::cli
