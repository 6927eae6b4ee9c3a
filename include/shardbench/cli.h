// Command-line parsing shared by the programs (CLI11).
#pragma once
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "shardbench/check.h"

namespace sb {

// Parses argv; false when --help was printed. A bad flag or value becomes one UsageError
// line (CLI11's first line) pointing at --help.
inline bool parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return false;
  } catch (const CLI::ParseError& e) {
    const std::string msg = e.what();
    throw UsageError(msg.substr(0, msg.find('\n')) + " (see --help)");
  }
  return true;
}

}  // namespace sb
