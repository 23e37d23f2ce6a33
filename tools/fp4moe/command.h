// Command registration for the fp4moe CLI. Each command lives in its own file tools/fp4moe/cmd_<name>.cpp
// and registers itself with FP4MOE_COMMAND; main.cpp builds the CLI11 app from the registered list.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace fp4moe::cli {

// Exit codes (documented in README.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,        // a runtime failure (CUDA error, I/O error, internal error)
  kExitUsage = 2,        // bad command line
  kExitBadInput = 3,     // a file, tensor, shape or config the user gave is wrong (the message says which)
  kExitUnsupported = 4,  // the requested backend/device cannot do this (e.g. --backend cuda without a GPU)
  kExitNoTactic = 5,     // no kernel tactic can run this problem on this device (the message lists why, per tactic)
  kExitCheckFailed = 6,  // a requested correctness check (--check) exceeded its tolerance
};

struct Command {
  std::string name;
  std::string help;
  // Adds the command's options to `sub` and returns the action to run when the command is chosen.
  // The action returns an ExitCode; it may throw fp4moe::Error (main maps the StatusCode to an exit code
  // and prints one line: "fp4moe <command>: error: <message>").
  std::function<std::function<int()>(CLI::App& sub)> setup;
};

// Registration happens at static-initialisation time (the cmd_*.cpp files are linked into the
// executable, not a library, so nothing is dropped).
bool register_command(Command cmd);
const std::vector<Command>& registered_commands();

}  // namespace fp4moe::cli

#define FP4MOE_CLI_CONCAT_(a, b) a##b
#define FP4MOE_CLI_CONCAT(a, b) FP4MOE_CLI_CONCAT_(a, b)
// FP4MOE_COMMAND("name", "one-line help", setup_function)
#define FP4MOE_COMMAND(name, help, setup) \
  static const bool FP4MOE_CLI_CONCAT(fp4moe_cmd_registered_, __LINE__) = ::fp4moe::cli::register_command({name, help, setup})
