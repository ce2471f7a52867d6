#pragma once
// Verdict tables for people, JUnit XML for CI systems, JSON for reports.
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "oracle/budget.hpp"

namespace gdn::cli {

struct Tally {
  int pass = 0, fail = 0, error = 0, skipped = 0;
  int total() const { return pass + fail + error + skipped; }
};
Tally tally(const std::vector<oracle::Verdict>& verdicts);

// One row per verdict: status, implementation, case, worst check, error, budget, margin.
// verbose adds every check and metric of failed verdicts below the table.
void print_table(std::ostream& out, const std::vector<oracle::Verdict>& verdicts, bool verbose);

// JUnit XML: one testsuite per implementation, one testcase per verdict; FAIL -> <failure>,
// ERROR -> <error>, SKIPPED -> <skipped> (never counted as passed).
std::string junit_xml(const std::string& suite, const std::vector<oracle::Verdict>& verdicts);

nlohmann::json verdicts_json(const std::string& command, const std::vector<oracle::Verdict>& verdicts);

// `text` with every byte sequence that is not well-formed UTF-8 (stray continuation bytes,
// overlong forms, surrogates, code points above U+10FFFF, truncated sequences) replaced by
// U+FFFD: what JSON and XML outputs need, whatever bytes a path or message holds.
std::string valid_utf8(const std::string& text);
// The XML 1.0 text of `text`: valid UTF-8, markup characters escaped, characters XML forbids
// (control characters but tab and newlines, U+FFFE, U+FFFF) replaced.
std::string xml_escape(const std::string& text);
// json.dump(indent) + "\n", with invalid UTF-8 in any string replaced by U+FFFD (nlohmann's
// default would throw): JSON outputs stay well-formed whatever a path or message holds.
std::string dump_json(const nlohmann::json& json, int indent = 2);

// Atomic (temp + rename).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace gdn::cli
