// The fp4moe command-line tool: builds one CLI11 app from the commands registered by the cmd_*.cpp
// files, runs the chosen one, and turns every failure into one line on stderr plus an exit code
// (command.h lists them).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "command.h"
#include "fp4moe/status.h"
#include "fp4moe/tuner.h"

namespace fp4moe::cli {

namespace {
std::vector<Command>& command_list() {
  static std::vector<Command> commands;  // function-local: safe to use during static initialisation
  return commands;
}
}  // namespace

bool register_command(Command cmd) {
  command_list().push_back(std::move(cmd));
  return true;
}

const std::vector<Command>& registered_commands() { return command_list(); }

namespace {

int exit_code_for(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFormatError:
      return kExitBadInput;
    case StatusCode::kUnsupported:
      return kExitUnsupported;
    default:
      return kExitError;
  }
}

void print_error(const std::string& command, const std::string& message) {
  const std::string prefix = command.empty() ? "fp4moe" : "fp4moe " + command;
  std::fprintf(stderr, "%s: error: %s\n", prefix.c_str(), one_line(message).c_str());
  std::fflush(stderr);
}

int run_main(int argc, char** argv) {
  CLI::App app{"fp4moe: Mixture-of-Experts inference with NVFP4 weights (CPU reference and CUDA engine)",
               "fp4moe"};
#ifdef FP4MOE_HAVE_CUDA
  const char* backends = "CUDA and CPU backends";
#else
  const char* backends = "CPU backend only";
#endif
  app.set_version_flag("--version", std::string("fp4moe ") + FP4MOE_VERSION + " (" + backends + ")");
  app.require_subcommand(1);

  std::vector<Command> commands = registered_commands();
  std::sort(commands.begin(), commands.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  for (size_t i = 1; i < commands.size(); ++i) {
    if (commands[i].name == commands[i - 1].name) {
      print_error("", "internal: command '" + commands[i].name + "' is registered twice");
      return kExitError;
    }
  }

  std::vector<std::pair<CLI::App*, std::function<int()>>> actions;
  for (const Command& cmd : commands) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.help);
    actions.emplace_back(sub, cmd.setup(*sub));
  }

  auto chosen_name = [&]() -> std::string {
    for (const auto& [sub, action] : actions)
      if (sub->parsed()) return sub->get_name();
    return "";
  };

  // An unknown command word gets a clearer message than CLI11's "A subcommand is required".
  if (argc > 1 && argv[1][0] != '-') {
    const std::string word = argv[1];
    const bool known = std::any_of(commands.begin(), commands.end(), [&](const Command& c) { return c.name == word; });
    if (!known) {
      std::string names;
      for (const Command& c : commands) names += (names.empty() ? "" : ", ") + c.name;
      print_error("", "unknown command '" + word + "' (commands: " + names + "; see --help)");
      return kExitUsage;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version: printed to stdout
    print_error(chosen_name(), std::string(e.what()) + " (see --help)");
    return kExitUsage;
  }

  const std::string name = chosen_name();
  for (const auto& [sub, action] : actions) {
    if (!sub->parsed()) continue;
    try {
      return action();
    } catch (const Error& e) {
      print_error(name, e.what());
      return exit_code_for(e.code());
    } catch (const CLI::Error& e) {  // a command may validate option combinations with CLI11's errors
      print_error(name, e.what());
      return kExitUsage;
    } catch (const std::exception& e) {
      print_error(name, e.what());
      return kExitError;
    }
  }
  print_error("", "no command given (see --help)");
  return kExitUsage;
}

}  // namespace
}  // namespace fp4moe::cli

int main(int argc, char** argv) {
  try {
    // `fp4moe tune` profiles in child processes that re-run this binary with a worker flag: serve that
    // first, before any command-line parsing.
    int worker_exit = 0;
    if (fp4moe::tuner_worker_main_if_requested(argc, argv, &worker_exit)) return worker_exit;
    return fp4moe::cli::run_main(argc, argv);
  } catch (const std::exception& e) {  // e.g. out of memory while building the app
    std::fprintf(stderr, "fp4moe: error: %s\n", fp4moe::cli::one_line(e.what()).c_str());
    return fp4moe::cli::kExitError;
  }
}
