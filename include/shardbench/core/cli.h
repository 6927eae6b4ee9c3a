// Command-line parsing shared by the programs (CLI11), and the one layer every numeric flag
// goes through: the text is converted here, never by a narrowing cast, and a value out of
// its range (an integer that would wrap, inf, nan, a number that overflows what it feeds)
// is one UsageError line naming the flag and the allowed range.
#pragma once
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <limits>
#include <string>

#include "shardbench/core/check.h"

namespace sb {

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

// The page every program's --help points to for the whole flag reference.
constexpr const char* kFlagReference = "docs/usage.md";

// An empty value never stands for the default (an unset shell variable in `--out "$OUT"`
// would otherwise write somewhere else): refused for every option of every program, the
// first in the command line's order, named as typed (`--out ''` or `--out=`).
inline void refuse_empty_values(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    const size_t eq = name.find('=');
    const bool attached = name.rfind("--", 0) == 0 && eq != std::string::npos;
    if (attached) name.resize(eq);
    const CLI::Option* o = name.size() > 1 && name[0] == '-' ? app.get_option_no_throw(name) : nullptr;
    if (!o) continue;
    const bool takes_value = o->get_expected_min() > 0;
    if (!attached && !takes_value) continue;  // a flag: no value
    if (!attached && i + 1 >= argc) continue;  // CLI11 names the missing value
    const std::string value = attached ? std::string(argv[i]).substr(eq + 1) : argv[++i];
    if (value.empty() && takes_value)
      throw UsageError(name + (attached ? "=" : " ''") + " is not allowed (an empty value; give one, or drop " +
                       name + " for its default: see --help)");
    if (value.empty()) throw UsageError(name + "= is not allowed (an empty value; the flag alone: " + name + ")");
  }
}

// Parses argv; false when --help was printed. A bad flag or value becomes one UsageError
// line (CLI11's first line) pointing at --help.
inline bool parse_command_line(CLI::App& app, int argc, char** argv) {
  app.footer(std::string("Every flag in full: ") + kFlagReference);
  app.allow_extras();  // reported below in the order given (CLI11's own message reverses them)
  refuse_empty_values(app, argc, argv);  // before CLI11, which words `--out=` as a missing value
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return false;
  } catch (const CLI::ParseError& e) {
    const std::string msg = e.what();
    throw UsageError(msg.substr(0, msg.find('\n')) + " (see --help)");
  }
  const std::vector<std::string> extra = app.remaining();
  if (!extra.empty()) {
    std::string list;
    for (const std::string& a : extra) list += " " + (a.empty() ? std::string("''") : a);
    throw UsageError(std::string(extra.size() > 1 ? "The following arguments were not expected:"
                                                   : "The following argument was not expected:") +
                     list + " (see --help)");
  }
  return true;
}

// "an integer from 1 to 2147483647"
inline std::string integer_range(int64_t lo, int64_t hi) {
  return "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
}
// "a finite number > 0 and <= 1e+06"
inline std::string real_range(double lo, double hi, bool lo_open) {
  char text[96];
  std::snprintf(text, sizeof text, "a finite number %s %.10g and <= %.10g", lo_open ? ">" : ">=", lo, hi);
  return text;
}

// Integer in [lo, hi]: decimal digits with an optional leading '-', or an exact integer in
// exponent form (1e6); nothing else.
inline int64_t parse_integer(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  const std::string bad = flag + " " + text + " is not allowed (" + integer_range(lo, hi) + ")";
  const size_t sign = text.size() > 0 && text[0] == '-' ? 1 : 0;
  if (text.size() == sign || text.find_first_not_of("0123456789eE+", sign) != std::string::npos)
    throw UsageError(bad);
  errno = 0;
  char* end = nullptr;
  if (text.find_first_of("eE") == std::string::npos) {
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (*end || errno == ERANGE || v < lo || v > hi) throw UsageError(bad);
    return v;
  }
  const long double v = std::strtold(text.c_str(), &end);
  if (*end || !(v >= lo && v <= hi) || v != std::floor(v)) throw UsageError(bad);
  return int64_t(v);
}

// A size in bytes: "64", "1K", "16M", "2G" (powers of 1024; KB, KiB, MB, ... alike);
// throws UsageError naming the flag.
int64_t parse_size(const std::string& flag, const std::string& text);

// Finite number in (lo, hi] (lo_open) or [lo, hi]: inf, nan and overflow are refused.
inline double parse_real(const std::string& flag, const std::string& text, double lo, double hi, bool lo_open) {
  const std::string bad = flag + " " + text + " is not allowed (" + real_range(lo, hi, lo_open) + ")";
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) throw UsageError(bad);
  if (lo_open ? !(v > lo) : !(v >= lo)) throw UsageError(bad);
  if (!(v <= hi)) throw UsageError(bad);
  return v;
}

// The numeric flags of one program: added to its CLI11 app as text, converted and checked
// by apply() after parsing (only the flags given; defaults are the program's own).
class NumericFlags {
 public:
  explicit NumericFlags(CLI::App& app) : app_(app) {}

  template <class T>
  CLI::Option* integer(const std::string& names, T& target, int64_t lo, int64_t hi, const std::string& help) {
    static_assert(std::is_integral<T>::value, "integer flags only");
    Flag& f = add(names, "INT", std::to_string(target), help + " (" + integer_range(lo, hi) + ")");
    f.apply = [&target, lo, hi](const std::string& flag, const std::string& text) {
      target = T(parse_integer(flag, text, lo, hi));
    };
    return f.option;
  }

  CLI::Option* real(const std::string& names, double& target, double lo, double hi, bool lo_open,
                    const std::string& help) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", target);
    Flag& f = add(names, "FLOAT", text, help + " (" + real_range(lo, hi, lo_open) + ")");
    f.apply = [&target, lo, hi, lo_open](const std::string& flag, const std::string& text) {
      target = parse_real(flag, text, lo, hi, lo_open);
    };
    return f.option;
  }

  // Converts every flag given; throws UsageError naming the first bad one.
  void apply() const {
    for (const Flag& f : flags_)
      if (f.option->count()) f.apply(f.name, f.text);
  }

 private:
  struct Flag {
    std::string name, text;  // the first of the flag's names; the text given
    CLI::Option* option = nullptr;
    std::function<void(const std::string&, const std::string&)> apply;
  };
  // Read as text (so a bad value is refused by apply() in the programs' words), shown in
  // --help as the number it takes (INT, FLOAT), not CLI11's TEXT.
  Flag& add(const std::string& names, const char* type, const std::string& shown_default, const std::string& help) {
    flags_.emplace_back();
    Flag& f = flags_.back();
    f.name = names.substr(0, names.find(','));
    f.option = app_.add_option(names, f.text, help)->default_str(shown_default)->type_name(type);
    return f;
  }
  CLI::App& app_;
  std::deque<Flag> flags_;  // stable addresses: CLI11 writes into each Flag's text
};

}  // namespace sb
