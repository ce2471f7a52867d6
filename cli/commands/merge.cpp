// gdn-testbed merge: join the results of a fuzz campaign's shards into one file
// (gdn-fuzz-merged/1); exit 1 when the campaign found failures.
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"

namespace gdn::cli {

namespace {

struct MergeOptions {
  std::string out;
  std::vector<std::string> shards;
};

int merge(const MergeOptions& o) {
  if (o.out.empty() || o.shards.empty()) throw UsageError("merge needs --out FILE and shard result files");
  std::vector<nlohmann::json> shards;
  for (const std::string& path : o.shards) {
    if (const std::string why = not_a_regular_file(path); !why.empty()) throw UsageError("merge: " + path + ": " + why);
    std::ifstream in(path);
    if (!in) throw UsageError("merge: cannot read " + path);
    try {
      shards.push_back(nlohmann::json::parse(in));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError("merge: " + path + " is not JSON: " + e.what());
    }
  }
  // Every file is checked before anything is written: a rejected shard leaves no merged file.
  nlohmann::json merged;
  try {
    merged = merge_results(shards, o.shards);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  write_text_file(o.out, dump_json(merged));
  std::cout << "merged " << shards.size() << " shards: " << merged["cases"] << " cases, " << merged["failures_total"]
            << " failures";
  if (!merged["missing_shards"].empty()) std::cout << "; missing shards " << merged["missing_shards"].dump();
  std::cout << "\nwrote " << o.out << "\n";
  return merged["failures_total"].get<std::int64_t>() > 0 ? 1 : 0;
}

}  // namespace

void add_merge(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand(
      "merge",
      "join fuzz shard results (refuses shards of different campaigns and duplicates); exit 1 when failures "
      "were found");
  auto o = std::make_shared<MergeOptions>();
  sub->add_option("RESULTS", o->shards, "the shards' results files (fuzz --json)")->type_name("");
  sub->add_option("--out", o->out, "the merged results (required)")->type_name("FILE");
  sub->callback([o, &context] { context.exit_code = merge(*o); });
}

}  // namespace gdn::cli
