// gdn-testbed generate: inputs-only case files (and manifest.json) for an implementation that
// gdn-testbed did not write; `verify` judges the outputs written into them. With --backward the
// files also hold the backward's inputs (in.dO, in.dhT; gdn-case/2) for a backward under test,
// whose gradients (out.dq ... out.dh0) verify judges the same way.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <cstdio>
#include <iostream>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "fuzz/backward_properties.hpp"
#include "fuzz/sample.hpp"
#include "cli/suite.hpp"

namespace gdn::cli {

namespace {

struct GenerateOptions {
  std::string out;
  long long cases = 20;
  long long first = 0;
  std::uint64_t seed = 1;
  std::string suite = "fuzz";
  bool force = false;
  bool backward = false;
  SpaceOptions space;
};

// The *.safetensors files (and manifest.json) already in `dir`: stale cases that verify would
// judge next to the new ones.
std::vector<std::string> existing_cases(const std::string& dir) {
  std::vector<std::string> found;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return found;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if ((n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) || n == "manifest.json")
      found.push_back(dir + "/" + n);
  }
  ::closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

int generate(const GenerateOptions& o, const std::string& command) {
  if (o.out.empty()) throw UsageError("generate needs --out DIR");
  if (::mkdir(o.out.c_str(), 0755) != 0 && errno != EEXIST)
    throw UsageError("--out: cannot create the folder " + o.out + ": " + std::strerror(errno));
  struct stat st {};
  if (::stat(o.out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw UsageError("--out: " + o.out + " is not a folder");
  // Old cases left beside the new ones would be judged by verify as if they were new.
  const std::vector<std::string> old = existing_cases(o.out);
  if (!old.empty() && !o.force)
    throw UsageError("--out: " + o.out + " already holds case files (" + std::to_string(old.size()) +
                     ", e.g. " + old.front() + "): choose an empty folder, or --force to remove them first");
  for (const std::string& f : old)
    if (::unlink(f.c_str()) != 0) throw UsageError("--force: cannot remove " + f + ": " + std::strerror(errno));
  std::vector<GeneratedCase> cases;
  // The seed of each case's cotangents (--backward): the case's own seed (for sampled cases the
  // cotangents the backward properties, fuzz --backward and gdn_testbed.fuzz_backward draw for
  // it; for built-in ones those of conformance --backward).
  std::vector<std::uint64_t> backward_seeds;
  std::size_t out_of_scope = 0;
  if (o.suite == "conformance" && o.backward) {
    // The backward's built-in cases with the cotangents `conformance --backward` judges (each
    // case's own seed; docs/backward.md, Scope, for the cases left out).
    for (BackwardCase& b : backward_conformance_cases(&out_of_scope)) {
      cases.push_back(std::move(b.generated));
      backward_seeds.push_back(b.seed);
    }
  } else if (o.suite == "conformance") {
    for (GeneratedCase& c : conformance_cases()) cases.push_back(std::move(c));
  } else {
    // --backward: the space restricted to what the backward covers (fuzz::backward_space).
    const fuzz::CaseSpace space = o.backward ? fuzz::backward_space(o.space.space()) : o.space.space();
    // --first I: the cases a fuzz campaign with the same --seed calls fuzz/I, fuzz/I+1, ...
    for (long long i = o.first; i < o.first + o.cases; ++i) {
      const std::uint64_t seed = case_seed(o.seed, std::uint64_t(i));
      GeneratedCase c = fuzz::sample_case(seed, space);
      c.name = "generate/" + std::to_string(o.seed) + "/" + std::to_string(i);
      cases.push_back(std::move(c));
      backward_seeds.push_back(seed);
    }
  }
  nlohmann::json manifest = {{"format", "gdn-case-manifest/1"}, {"command", command}, {"cases", nlohmann::json::array()}};
  int index = 0;
  for (const GeneratedCase& g : cases) {
    oracle::CaseFile c;
    c.problem = g.problem;
    c.inputs = g.inputs;
    c.metadata["gdn.case_name"] = g.name;
    c.metadata["gdn.generator"] = g.generator.dump();
    if (o.backward) {
      const std::uint64_t seed = backward_seeds[static_cast<std::size_t>(index)];
      c.backward = fuzz::make_backward_inputs(g.problem, seed);
      c.metadata["gdn.backward"] =
          nlohmann::json{{"seed", std::to_string(seed)}, {"generator", "fuzz::make_backward_inputs"}}.dump();
    }
    c.metadata["gdn.versions"] = build_versions().dump();
    c.metadata["gdn.command"] = command;
    char name[32];
    std::snprintf(name, sizeof name, "case-%05d.safetensors", index++);
    const std::string path = o.out + "/" + name;
    oracle::write_case_file(path, c);
    manifest["cases"].push_back(
        {{"file", name}, {"name", g.name}, {"problem", g.problem.describe()}, {"backward", o.backward}});
  }
  write_text_file(o.out + "/manifest.json", dump_json(manifest));
  std::cout << "wrote " << cases.size() << " case files to " << o.out << "/ (manifest.json lists them)";
  if (o.backward)
    std::cout << "; with the backward's inputs dO and, for three draws in four where the problem has hT, dhT "
              << "(verify judges the out.dq ... out.dh0 written into them)";
  if (out_of_scope > 0)
    std::cout << "; " << out_of_scope << " built-in cases left out (state caches, per-token states, reduced-precision "
              << "states or linear gates: not in the backward's scope)";
  std::cout << "\n";
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand("generate", "write inputs-only case files for an external implementation");
  auto o = std::make_shared<GenerateOptions>();
  sub->add_option("--out", o->out, "folder for the case files and manifest.json (required)")->type_name("DIR");
  add_integer(*sub, "--cases", &o->cases, 1, 99999, "how many cases (--suite fuzz)")->type_name("N");
  add_seed(*sub, "--seed", &o->seed, "the campaign's seed, as in fuzz --seed (--suite fuzz)")->type_name("S");
  sub->add_option("--suite", o->suite, "fuzz: sampled cases; conformance: the built-in cases")
      ->type_name("fuzz|conformance")
      ->check(CLI::IsMember({"fuzz", "conformance"}).description(""))
      ->capture_default_str();
  add_integer(*sub, "--first", &o->first, 0, 1LL << 62, "start at the campaign's case I: fuzz/I of fuzz --seed S")->type_name("I");
  sub->add_flag("--force", o->force,
                "remove the case files (*.safetensors) and manifest.json already in --out first (else refused)");
  sub->add_flag("--backward", o->backward,
                "also write the backward's inputs, dO and (when the problem has hT) dhT, drawn from each case's seed, "
                "for a backward under test (gdn-case/2; cases restricted to what the backward covers: no state "
                "cache, no per-token states)");
  add_space_options(*sub, &o->space);
  sub->callback([o, &context] { context.exit_code = generate(*o, context.command_line); });
}

}  // namespace gdn::cli
