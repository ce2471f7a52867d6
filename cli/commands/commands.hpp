#pragma once
// The subcommands of gdn-testbed, one file each (cli/commands/NAME.cpp). add_NAME registers the
// subcommand, its options and their help on the app; its callback runs the command and leaves
// the exit status in the Context. A usage error (a bad combination of options found after
// parsing) is thrown as UsageError (options.hpp): main prints it and exits 2, as CLI11's own
// parse errors do.
#include <string>

namespace CLI {
class App;
}

namespace gdn::cli {

struct Context {
  std::string command_line;  // the invocation, quoted for a shell: recorded in results files
  std::string binary;        // argv[0]: fuzz writes it into the replay commands it prints
  int exit_code = 0;
};

void add_conformance(CLI::App& app, Context& context);
void add_fuzz(CLI::App& app, Context& context);
void add_replay(CLI::App& app, Context& context);
void add_generate(CLI::App& app, Context& context);
void add_verify(CLI::App& app, Context& context);
void add_merge(CLI::App& app, Context& context);
void add_report(CLI::App& app, Context& context);
void add_list(CLI::App& app, Context& context);

}  // namespace gdn::cli
