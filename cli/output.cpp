#include "cli/output.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <sstream>

#include "cli/campaign.hpp"
#include "oracle/case_file.hpp"

namespace gdn::cli {

Tally tally(const std::vector<oracle::Verdict>& verdicts) {
  Tally t;
  for (const oracle::Verdict& v : verdicts) {
    switch (v.status) {
      case oracle::Status::pass: ++t.pass; break;
      case oracle::Status::fail: ++t.fail; break;
      case oracle::Status::error: ++t.error; break;
      case oracle::Status::skipped: ++t.skipped; break;
    }
  }
  return t;
}

namespace {

std::string sci(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return "inf";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2e", x);
  return buffer;
}

std::string fit(std::string s, std::size_t width) {
  if (s.size() > width) s = s.substr(0, width - 1) + "~";
  return s + std::string(width - s.size(), ' ');
}

}  // namespace

void print_table(std::ostream& out, const std::vector<oracle::Verdict>& verdicts, bool verbose) {
  std::size_t impl_width = 14, case_width = 20;
  for (const oracle::Verdict& v : verdicts) {
    impl_width = std::max(impl_width, v.implementation.size());
    case_width = std::max(case_width, v.case_name.size());
  }
  impl_width = std::min<std::size_t>(impl_width, 34);
  case_width = std::min<std::size_t>(case_width, 56);
  out << fit("STATUS", 8) << fit("IMPLEMENTATION", impl_width + 2) << fit("CASE", case_width + 2)
      << fit("WORST CHECK", 20) << fit("ERROR", 10) << fit("BUDGET", 10) << "MARGIN\n";
  for (const oracle::Verdict& v : verdicts) {
    out << fit(oracle::status_name(v.status), 8) << fit(v.implementation, impl_width + 2) << fit(v.case_name, case_width + 2);
    if (const oracle::Check* c = v.worst_check()) {
      out << fit(std::string(oracle::output_tensor_name(c->tensor)) + "." + c->metric, 20) << fit(sci(c->error), 10)
          << fit(sci(c->budget), 10) << sci(c->margin);
    } else if (!v.message.empty()) {
      out << v.message;
    }
    out << "\n";
  }
  const Tally t = tally(verdicts);
  out << "\n" << t.total() << " verdicts: " << t.pass << " passed, " << t.fail << " failed, " << t.error << " errors, "
      << t.skipped << " skipped\n";
  // Skip reasons once per implementation (and once more for its backward's verdicts, whose case
  // names end in /backward), so a SKIPPED row is never mistaken for a pass.
  std::map<std::string, std::string> skip_reasons;
  const std::string backward_suffix = "/backward";
  for (const oracle::Verdict& v : verdicts) {
    const bool backward = v.case_name.size() >= backward_suffix.size() &&
                          v.case_name.compare(v.case_name.size() - backward_suffix.size(), backward_suffix.size(),
                                              backward_suffix) == 0;
    const std::string key = v.implementation + (backward ? " (backward)" : "");
    if (v.status == oracle::Status::skipped && !skip_reasons.count(key)) skip_reasons[key] = v.message;
  }
  for (const auto& [impl, why] : skip_reasons) out << "  SKIPPED " << impl << ": " << why << "\n";
  if (verbose)
    for (const oracle::Verdict& v : verdicts)
      if (v.failed()) out << "\n" << v.details();
}

std::string junit_xml(const std::string& suite, const std::vector<oracle::Verdict>& verdicts) {
  std::map<std::string, std::vector<const oracle::Verdict*>> by_impl;
  for (const oracle::Verdict& v : verdicts) by_impl[v.implementation].push_back(&v);
  const Tally all = tally(verdicts);
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"" << xml_escape(suite) << "\" tests=\""
    << all.total() << "\" failures=\"" << all.fail << "\" errors=\"" << all.error << "\" skipped=\"" << all.skipped << "\">\n";
  for (const auto& [impl, list] : by_impl) {
    Tally t;
    double seconds = 0;
    for (const oracle::Verdict* v : list) {
      seconds += v->seconds;
      switch (v->status) {
        case oracle::Status::pass: ++t.pass; break;
        case oracle::Status::fail: ++t.fail; break;
        case oracle::Status::error: ++t.error; break;
        case oracle::Status::skipped: ++t.skipped; break;
      }
    }
    x << "  <testsuite name=\"" << xml_escape(impl) << "\" tests=\"" << t.total() << "\" failures=\"" << t.fail
      << "\" errors=\"" << t.error << "\" skipped=\"" << t.skipped << "\" time=\"" << seconds << "\">\n";
    for (const oracle::Verdict* v : list) {
      x << "    <testcase classname=\"" << xml_escape(suite + "." + impl) << "\" name=\"" << xml_escape(v->case_name)
        << "\" time=\"" << v->seconds << "\">";
      switch (v->status) {
        case oracle::Status::pass: break;
        case oracle::Status::fail:
          x << "\n      <failure message=\"" << xml_escape(v->summary()) << "\">" << xml_escape(v->details()) << "</failure>\n    ";
          break;
        case oracle::Status::error:
          x << "\n      <error message=\"" << xml_escape(v->message) << "\">" << xml_escape(v->details()) << "</error>\n    ";
          break;
        case oracle::Status::skipped:
          x << "\n      <skipped message=\"" << xml_escape(v->message) << "\"/>\n    ";
          break;
      }
      x << "</testcase>\n";
    }
    x << "  </testsuite>\n";
  }
  x << "</testsuites>\n";
  return x.str();
}

nlohmann::json verdicts_json(const std::string& command, const std::vector<oracle::Verdict>& verdicts) {
  nlohmann::json j;
  j["format"] = "gdn-verdicts/1";
  j["command"] = command;
  j["versions"] = build_versions();
  const Tally t = tally(verdicts);
  j["summary"] = {{"total", t.total()}, {"pass", t.pass}, {"fail", t.fail}, {"error", t.error}, {"skipped", t.skipped}};
  j["verdicts"] = nlohmann::json::array();
  for (const oracle::Verdict& v : verdicts) j["verdicts"].push_back(oracle::to_json(v));
  return j;
}

std::string valid_utf8(const std::string& text) {
  static const std::string replacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Lengths and the allowed range of the second byte (RFC 3629, table 3-7 of Unicode).
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) length = 2;
    else if (c == 0xE0) length = 3, low = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) length = 3;
    else if (c == 0xED) length = 3, high = 0x9F;  // no surrogates
    else if (c >= 0xEE && c <= 0xEF) length = 3;
    else if (c == 0xF0) length = 4, low = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) length = 4;
    else if (c == 0xF4) length = 4, high = 0x8F;  // at most U+10FFFF
    std::size_t good = 0;
    if (length > 0 && i + 1 < n && p[i + 1] >= low && p[i + 1] <= high) {
      good = 2;
      while (good < length && i + good < n && p[i + good] >= 0x80 && p[i + good] <= 0xBF) ++good;
    }
    if (length > 0 && good == length) {
      out.append(text, i, length);
      i += length;
    } else {
      out += replacement;
      i += std::max<std::size_t>(1, good);
    }
  }
  return out;
}

std::string xml_escape(const std::string& text) {
  const std::string s = valid_utf8(text);
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': out += "&#10;"; break;  // kept through attribute-value normalisation
      case '\r': out += "&#13;"; break;
      case '\t': out += "&#9;"; break;
      default:
        // XML 1.0 forbids the other control characters, even escaped, and U+FFFE, U+FFFF.
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          out += ' ';
        } else if (s.compare(i, 3, "\xEF\xBF\xBE") == 0 || s.compare(i, 3, "\xEF\xBF\xBF") == 0) {
          out += "\xEF\xBF\xBD";
          i += 2;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string dump_json(const nlohmann::json& json, int indent) {
  return json.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void write_text_file(const std::string& path, const std::string& text) {
  oracle::write_file_atomic(path, std::vector<std::uint8_t>(text.begin(), text.end()));
}

}  // namespace gdn::cli
