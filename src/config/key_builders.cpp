#include "config/key_builders.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace config::schema {
namespace {

const std::string& scalar(const YAML::Node& node, const char* expected) {
  if (!node.IsScalar()) {
    throw ValueError(fmt::format("expected {}, got {}", expected, kind_of(node)));
  }
  return node.Scalar();
}

template <class T>
T& field(Access<T> access, const Config& c) {
  return access(const_cast<Config&>(c));
}

std::string yaml_string(const std::string& value) {
  YAML::Emitter out;
  out << YAML::DoubleQuoted << value;
  return out.c_str();
}

}  // namespace

int64_t parse_int(const YAML::Node& node) {
  const std::string& s = scalar(node, "an integer");
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) {
    throw ValueError(fmt::format("'{}' is out of range", s));
  }
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw ValueError(fmt::format("expected an integer, got '{}'", s));
  }
  return v;
}

double parse_real(const YAML::Node& node) {
  const std::string& s = scalar(node, "a number");
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
    throw ValueError(fmt::format("expected a number, got '{}'", s));
  }
  return v;
}

std::string kind_of(const YAML::Node& node) {
  if (node.IsMap()) return "a mapping";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "no value";
  return fmt::format("'{}'", node.Scalar());
}

size_t choice_index(const YAML::Node& node, const std::vector<std::string>& options) {
  const std::string& v = scalar(node, "one of the choices");
  const auto it = std::find(options.begin(), options.end(), v);
  if (it == options.end()) {
    throw ValueError(fmt::format("'{}' is not one of: {}", v, fmt::join(options, ", ")));
  }
  return static_cast<size_t>(it - options.begin());
}

KeyDef for_models(KeyDef k, std::vector<std::pair<std::string, std::string>> defaults) {
  k.model_defaults = std::move(defaults);
  return k;
}

KeyDef integer(std::string path, Access<int64_t> access, std::string def, int64_t lo, int64_t hi,
               std::string description) {
  const bool required = def.empty();
  const bool open_ended = hi == kMax;
  return {std::move(path),
          "integer",
          std::move(def),
          open_ended ? fmt::format(">= {}", lo) : fmt::format("{} .. {}", lo, hi),
          std::move(description),
          required,
          [=](Config& c, const YAML::Node& n) {
            const int64_t v = parse_int(n);
            if (v < lo || v > hi) {
              throw ValueError(
                  open_ended ? fmt::format("{} is out of range: must be >= {}", v, lo)
                             : fmt::format("{} is out of range: must be in {} .. {}", v, lo, hi));
            }
            access(c) = v;
          },
          [=](const Config& c) { return std::to_string(field(access, c)); }};
}

KeyDef seed(std::string path, Access<uint64_t> access, std::string def, std::string description) {
  return {std::move(path),
          "integer",
          std::move(def),
          "0 .. 2^63-1",
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            const int64_t v = parse_int(n);
            if (v < 0) throw ValueError(fmt::format("{} is out of range: must be >= 0", v));
            access(c) = static_cast<uint64_t>(v);
          },
          [=](const Config& c) { return std::to_string(field(access, c)); }};
}

KeyDef real(std::string path, Access<double> access, std::string def, double lo, double hi,
            bool lo_open, bool hi_open, std::string description) {
  const std::string range = fmt::format("{}{}, {}{}", lo_open ? "(" : "[", lo,
                                        std::isinf(hi) ? "inf" : fmt::format("{}", hi),
                                        hi_open || std::isinf(hi) ? ")" : "]");
  return {std::move(path),
          "number",
          std::move(def),
          range,
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            const double v = parse_real(n);
            const bool below = lo_open ? v <= lo : v < lo;
            const bool above = hi_open ? v >= hi : v > hi;
            if (below || above) {
              throw ValueError(fmt::format("{} is out of range: must be in {}", v, range));
            }
            access(c) = v;
          },
          [=](const Config& c) { return fmt::format("{}", field(access, c)); }};
}

KeyDef boolean(std::string path, Access<bool> access, std::string def, std::string description) {
  return {std::move(path),
          "boolean",
          std::move(def),
          "true | false",
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            const std::string& v = scalar(n, "true or false");
            if (v == "true" || v == "True" || v == "yes") {
              access(c) = true;
            } else if (v == "false" || v == "False" || v == "no") {
              access(c) = false;
            } else {
              throw ValueError(fmt::format("expected true or false, got '{}'", v));
            }
          },
          [=](const Config& c) { return std::string(field(access, c) ? "true" : "false"); }};
}

KeyDef text(std::string path, Access<std::string> access, std::string def,
            std::string description) {
  return {std::move(path),
          "string",
          def.empty() ? "\"\"" : std::move(def),
          "",
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            access(c) = n.IsNull() ? std::string() : scalar(n, "a string");
          },
          [=](const Config& c) { return yaml_string(field(access, c)); }};
}

KeyDef checked_text(std::string path, Access<std::string> access, std::string description,
                    std::function<void(const std::string&)> validate) {
  const std::string key_path = path;
  KeyDef key = text(std::move(path), access, "", std::move(description));
  auto set = key.set;
  key.set = [=](Config& c, const YAML::Node& n) {
    set(c, n);
    try {
      validate(access(c));
    } catch (const std::invalid_argument& e) {
      // The validator may name the key itself; the loader adds it anyway.
      std::string why = e.what();
      const std::string prefix = key_path + ": ";
      if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
      throw ValueError(why);
    }
  };
  return key;
}

KeyDef text_list(std::string path, Access<std::vector<std::string>> access, std::string def,
                 std::string description) {
  return {std::move(path),
          "list",
          std::move(def),
          "of strings",
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            if (!n.IsSequence()) {
              throw ValueError(fmt::format("expected a list like [a, b], got {}", kind_of(n)));
            }
            std::vector<std::string> values;
            for (const auto& item : n) values.push_back(scalar(item, "a string"));
            access(c) = std::move(values);
          },
          [=](const Config& c) {
            std::vector<std::string> quoted;
            for (const auto& v : field(access, c)) quoted.push_back(yaml_string(v));
            return fmt::format("[{}]", fmt::join(quoted, ", "));
          }};
}

KeyDef integer_or_auto(std::string path, Access<int64_t> access, std::string def,
                       std::string description) {
  return {std::move(path),
          "integer | auto",
          std::move(def),
          ">= 1 or auto",
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            if (n.IsScalar() && n.Scalar() == "auto") {
              access(c) = 0;
              return;
            }
            int64_t v = 0;
            try {
              v = parse_int(n);
            } catch (const ValueError&) {
              throw ValueError(
                  fmt::format("expected a positive integer or 'auto', got {}", kind_of(n)));
            }
            if (v < 1) {
              throw ValueError(fmt::format("{} is out of range: must be >= 1 or 'auto'", v));
            }
            access(c) = v;
          },
          [=](const Config& c) {
            return field(access, c) == 0 ? std::string("auto") : std::to_string(field(access, c));
          }};
}

KeyDef real_or_auto(std::string path, Access<double> access, std::string def, double lo, double hi,
                    std::string description) {
  const std::string range =
      fmt::format("[{}, {}] or auto", lo, std::isinf(hi) ? "inf" : fmt::format("{}", hi));
  return {std::move(path),
          "number | auto",
          std::move(def),
          range,
          std::move(description),
          false,
          [=](Config& c, const YAML::Node& n) {
            if (n.IsScalar() && n.Scalar() == "auto") {
              access(c) = -1;
              return;
            }
            double v = 0;
            try {
              v = parse_real(n);
            } catch (const ValueError&) {
              throw ValueError(fmt::format("expected a number or 'auto', got {}", kind_of(n)));
            }
            if (v < lo || v > hi) {
              throw ValueError(fmt::format("{} is out of range: must be in {}", v, range));
            }
            access(c) = v;
          },
          [=](const Config& c) {
            return field(access, c) < 0 ? std::string("auto") : fmt::format("{}", field(access, c));
          }};
}

KeyDef choice(std::string path, Access<std::string> access, std::string def,
              std::vector<std::string> options, std::string description) {
  const bool required = def.empty();
  return {std::move(path),
          "choice",
          std::move(def),
          fmt::format("{}", fmt::join(options, " | ")),
          std::move(description),
          required,
          [=](Config& c, const YAML::Node& n) { access(c) = options[choice_index(n, options)]; },
          [=](const Config& c) { return field(access, c); }};
}

}  // namespace config::schema
