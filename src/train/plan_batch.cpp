// --plan-batch: many plans in one process. Each line of FILE is a command line of its own,
// parsed by the programs' parse_options (so every check and every one-line error is the
// program's own) and planned by plan_memory; its schedule object is schedule_json's, the
// same as --schedule-json writes. A bad line is reported on its own line and never stops the
// batch.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "shardbench/core/check.h"
#include "shardbench/run/environment.h"
#include "shardbench/strategy/config.h"
#include "shardbench/train/plan.h"
#include "shardbench/train/plan_batch.h"

namespace sb {
namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The schedule object on one line: its newlines and the indentation after them dropped (no
// string in it holds a newline).
void append_one_line(std::string& out, const std::string& json) {
  out.reserve(out.size() + json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] != '\n') {
      out += json[i];
      continue;
    }
    while (i + 1 < json.size() && json[i + 1] == ' ') ++i;
  }
}

// The whole of FILE ("-": stdin). Whatever cannot be read (missing, a folder, a read error)
// is one line naming it and the cause: an ifstream opens a folder and reads it as empty.
std::string read_batch(const std::string& file) {
  const bool in = file == "-";
  const std::string name = in ? "- (stdin)" : "'" + file + "'";
  const int fd = in ? 0 : open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UsageError("--plan-batch " + name + " cannot be read: " + std::strerror(errno));
  std::string text;
  char chunk[1 << 16];
  ssize_t n = 0;
  while ((n = read(fd, chunk, sizeof chunk)) != 0) {
    if (n > 0) {
      text.append(chunk, size_t(n));
    } else if (errno != EINTR) {
      const int err = errno;
      if (!in) close(fd);
      throw UsageError("--plan-batch " + name + " cannot be read: " + std::strerror(err));
    }
  }
  if (!in) close(fd);
  return text;
}

// The byte offset of the first byte of `s` that is not valid UTF-8 (RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF), or npos: a line's words reach its JSON
// record (an error names the value), which must stay JSON.
size_t invalid_utf8_at(const std::string& s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0, n = s.size(); i < n;) {
    const unsigned c = b[i];
    const size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0 || i + len > n) return i;
    for (size_t k = 1; k < len; ++k)
      if ((b[i + k] & 0xc0) != 0x80) return i;
    const unsigned c1 = len > 1 ? b[i + 1] : 0;
    if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) || (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 > 0x8f))
      return i;
    i += len;
  }
  return std::string::npos;
}

// Flags a line may not give: the batch writes nothing but its lines on stdout.
const char* refused_in_line(const std::string& word) {
  const std::string name = word.substr(0, word.rfind("--", 0) == 0 ? word.find('=') : std::string::npos);
  static const char* const refused[][2] = {
      {"--out", "the batch writes no result file"},
      {"--schedule-json", "each line's schedule is its output line"},
      {"--plan-batch", "a batch has no batches inside"},
      {"--plan-batch-ops", "it belongs on the command line"},
      {"--help", "see the program's --help"},
      {"-h", "see the program's --help"},
      {"--list-models", "see the program's --list-models"},
  };
  for (const auto& r : refused)
    if (name == r[0]) return r[1];
  return nullptr;
}

}  // namespace

int run_plan_batch(const RunConfig& cmd, StrategyKind kind, int rank) {
  // The defaults of --mem-limit-gib and --host-mem-limit-gib, as a --plan run has them (no
  // device: the host's share); collective, so every rank asks once.
  const int64_t default_limit = default_memory_limit(-1);
  const int64_t default_host_limit = default_host_memory_limit();
  if (rank != 0) return kExitOk;
  const std::string text = read_batch(cmd.plan_batch);
  static char buffer[1 << 20];
  std::setvbuf(stdout, buffer, _IOFBF, sizeof buffer);
  std::istringstream lines(text);
  std::string line, out;
  UnitCache units;  // the models' units, built once per model and partition for every line's plans
  for (int number = 1; std::getline(lines, line); ++number) {
    std::istringstream split(line);
    std::vector<std::string> words;
    for (std::string w; split >> w;) words.push_back(w);
    if (words.empty() || words[0][0] == '#') continue;
    out = "{\"line\": " + std::to_string(number);
    try {
      const size_t bad = invalid_utf8_at(line);
      if (bad != std::string::npos) {
        char byte[8];
        std::snprintf(byte, sizeof byte, "0x%02x", unsigned(static_cast<unsigned char>(line[bad])));
        throw UsageError("line " + std::to_string(number) + " is not valid UTF-8 (byte " + byte + " at column " +
                         std::to_string(bad + 1) + "): a --plan-batch line is UTF-8 text");
      }
      for (const std::string& w : words)
        if (const char* why = refused_in_line(w))
          throw UsageError(w.substr(0, w.find('=')) + " is not allowed in a --plan-batch line (" + why + ")");
      std::vector<std::string> args = {cmd.program, "--plan"};
      args.insert(args.end(), words.begin(), words.end());
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(&a[0]);
      argv.push_back(nullptr);
      RunConfig cfg;
      parse_options(int(args.size()), argv.data(), kind, cfg);  // no --help: refused above
      if (cfg.plan_world == 0) throw UsageError("a --plan-batch line must give --world-size (the world to plan for)");
      Setup setup = Setup::make(cfg.strategy, cfg.model, cfg.shape, cfg.plan_world);
      setup.strategy.unit_cache = &units;
      MemoryPlan plan = plan_memory(setup, cmd.plan_batch_ops);
      set_plan_limits(plan, cfg, default_limit, default_host_limit);
      out += plan.fits() ? ", \"exit\": 0, \"schedule\": " : ", \"exit\": 3, \"schedule\": ";
      append_one_line(out, schedule_json(cfg, setup, plan, cmd.plan_batch_ops));
      out += "}\n";
    } catch (const UsageError& e) {
      out = "{\"line\": " + std::to_string(number) + ", \"exit\": 2, \"error\": " + json_string(e.what()) + "}\n";
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace sb
