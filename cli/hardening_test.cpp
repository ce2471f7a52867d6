// Regressions of issue 29 in the layers around the case-file reader: what verify, replay and
// merge do with bad inputs (each one an ERROR verdict or a refusal naming the file, never a
// crash, never a wrong PASS), the budget rule of case files, and well-formed JSON and JUnit
// whatever bytes a path or message holds. The command-line side: cli_test.sh.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "cli/campaign.hpp"
#include "cli/judge_file.hpp"
#include "cli/output.hpp"
#include "oracle/case_file.hpp"

using namespace gdn;
using namespace gdn::cli;

namespace {

const std::string kRepro = GDN_REPRO_DIR;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

std::string temp_dir() {
  char pattern[] = "/tmp/gdn_cli_hardening.XXXXXX";
  const char* made = mkdtemp(pattern);
  REQUIRE(made != nullptr);
  return made;
}

oracle::BudgetOptions budget(const std::string& text) {
  oracle::BudgetOptions b;
  std::string error;
  REQUIRE(oracle::parse_budget(text, &b, &error));
  return b;
}

const EntryLookup kNoEntries = [](const std::string&) -> const oracle::RegistryEntry* { return nullptr; };

}  // namespace

TEST_CASE("merge rejects a shard lacking failures by name before reading past it", "[cli][merge]") {
  const std::vector<nlohmann::json> shards = {read_json(kRepro + "/shard0.json"),
                                              read_json(kRepro + "/shard1_no_failures.json")};
  CHECK_THROWS_WITH(merge_results(shards, {"shard0.json", "shard1_no_failures.json"}),
                    Catch::Contains("shard1_no_failures.json: lacks 'failures'"));
}

TEST_CASE("merge refuses shard indices outside 0..count-1 and mistyped fields", "[cli][merge]") {
  const nlohmann::json good = read_json(kRepro + "/shard0.json");
  CHECK_THROWS_WITH(merge_results({good, read_json(kRepro + "/shard5of2.json")}, {"a", "shard5of2.json"}),
                    Catch::Contains("shard5of2.json: shard index 5 is outside [0, 2)"));
  nlohmann::json bad = good;
  bad["shard"]["count"] = -3;
  CHECK_THROWS_WITH(merge_results({bad}, {"neg.json"}), Catch::Contains("neg.json: 'shard.count'"));
  bad = good;
  bad["tallies"]["fault.dropped_decay"]["pass"] = "85";
  CHECK_THROWS_WITH(merge_results({bad}, {"t.json"}), Catch::Contains("'tallies.fault.dropped_decay.pass'"));
  bad = good;
  bad["budget"] = "fixed";
  CHECK_THROWS_WITH(merge_results({good, bad}), Catch::Contains("another budget"));
  bad = good;
  bad = nlohmann::json::array();
  CHECK_THROWS_WITH(merge_results({bad}, {"array.json"}), Catch::Contains("array.json: is not a JSON object"));
}

TEST_CASE("invalid UTF-8 is replaced and valid UTF-8 kept", "[cli][output]") {
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(valid_utf8("plain/path.safetensors") == "plain/path.safetensors");
  CHECK(valid_utf8("\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80") == "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  CHECK(valid_utf8("a\xFF" "b") == "a" + fffd + "b");
  CHECK(valid_utf8("\xC0\x80") == fffd + fffd);          // overlong NUL
  CHECK(valid_utf8("\xED\xA0\x80") == fffd + fffd + fffd);  // a surrogate
  CHECK(valid_utf8("\xE2\x82") == fffd);                   // truncated
  CHECK(valid_utf8("\xF4\x90\x80\x80").find("\xF4") == std::string::npos);  // above U+10FFFF
}

TEST_CASE("JSON and JUnit outputs stay well-formed with invalid UTF-8 in paths and messages", "[cli][output]") {
  oracle::Verdict v;
  v.case_name = "cases/bad-\xFF\xFE-name.safetensors";
  v.implementation = "ext.\xC0";
  v.status = oracle::Status::error;
  v.message = std::string("cases/bad-\xFF\xFE-name.safetensors: broken \x01 <&> \"'\n") + "\xED\xA0\x80";
  const std::vector<oracle::Verdict> verdicts = {v};
  std::string json;
  REQUIRE_NOTHROW(json = dump_json(verdicts_json("gdn-testbed verify \xFF", verdicts)));
  const nlohmann::json back = nlohmann::json::parse(json);  // throws on invalid UTF-8
  CHECK(back["verdicts"][0]["status"] == "ERROR");
  const std::string xml = junit_xml("gdn-testbed verify", verdicts);
  CHECK(valid_utf8(xml) == xml);
  CHECK(xml.find('\x01') == std::string::npos);
  CHECK(xml.find("<&>") == std::string::npos);
  CHECK(xml.find("&lt;&amp;&gt;") != std::string::npos);
}

TEST_CASE("a case file's gdn.budget may tighten the judgment but never loosen it", "[cli][budget]") {
  CHECK(budget_no_looser(budget("calibrated(factor=1)"), budget("calibrated")));
  CHECK_FALSE(budget_no_looser(budget("calibrated(factor=3)"), budget("calibrated")));
  CHECK_FALSE(budget_no_looser(budget("calibrated(baseline=operands_single)"), budget("calibrated")));
  CHECK(budget_no_looser(budget("bitwise"), budget("calibrated")));
  CHECK_FALSE(budget_no_looser(budget("fixed(rel_rms=1e-9)"), budget("calibrated")));
  CHECK(budget_no_looser(budget("fixed(rel_rms=1e-13)"), budget("fixed(rel_rms=1e-12)")));
  CHECK_FALSE(budget_no_looser(budget("fixed(rel_rms=1e-3)"), budget("fixed(rel_rms=1e-12)")));
  oracle::BudgetOptions nan_factor;
  nan_factor.factor = std::nan("");
  CHECK_FALSE(budget_no_looser(nan_factor, budget("calibrated")));

  // Outputs all zero: wrong. A file naming a loose budget of its own must still FAIL, judged by
  // the default, and say so; a tighter budget of its own is used.
  oracle::CaseFile c = oracle::read_case_file(kRepro + "/good.safetensors");
  REQUIRE(c.outputs);
  for (double& x : c.outputs->o.storage()) x = 0;
  for (double& x : c.outputs->hT.storage()) x = 0;
  c.metadata["gdn.budget"] = "fixed(rel_rms=10)";
  const oracle::Verdict loose = judge_case(c, "zero.safetensors", std::nullopt, kNoEntries);
  CHECK(loose.status == oracle::Status::fail);
  CHECK(loose.budget == oracle::BudgetOptions{}.describe());
  CHECK_THAT(loose.message, Catch::Contains("judged with the default"));
  // --budget says otherwise: that is the user's explicit choice.
  CHECK(judge_case(c, "zero.safetensors", budget("fixed(rel_rms=10)"), kNoEntries).status == oracle::Status::pass);

  oracle::CaseFile good = oracle::read_case_file(kRepro + "/good.safetensors");
  good.metadata["gdn.budget"] = "calibrated(factor=1.5)";
  const oracle::Verdict tight = judge_case(good, "good.safetensors", std::nullopt, kNoEntries);
  CHECK(tight.budget == budget("calibrated(factor=1.5)").describe());
  CHECK(tight.message.find("judged with the default") == std::string::npos);
}

TEST_CASE("malformed judge settings are an ERROR and not a silent default", "[cli][budget]") {
  oracle::CaseFile c = oracle::read_case_file(kRepro + "/good.safetensors");
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"gdn.budget", "fixed(rel_rms=abc)"}, {"gdn.formulation", "chunkd"}, {"gdn.chunk_size", "64x"},
           {"gdn.chunk_size", "0"}}) {
    oracle::CaseFile bad = c;
    bad.metadata[key] = value;
    const oracle::Verdict v = judge_case(bad, "bad.safetensors", std::nullopt, kNoEntries);
    CHECK(v.status == oracle::Status::error);
    CHECK_THAT(v.message, Catch::Contains(key) && Catch::Contains("bad.safetensors"));
  }
}

TEST_CASE("a folder or a FIFO named like a case file is one ERROR verdict without blocking", "[cli][verify]") {
  const std::string dir = temp_dir();
  const std::string folder = dir + "/x.safetensors", fifo = dir + "/f.safetensors";
  REQUIRE(::mkdir(folder.c_str(), 0755) == 0);
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const oracle::Verdict a = judge_case_file(folder, std::nullopt, kNoEntries);
  CHECK(a.status == oracle::Status::error);
  CHECK_THAT(a.message, Catch::Contains(folder) && Catch::Contains("folder"));
  const oracle::Verdict b = judge_case_file(fifo, std::nullopt, kNoEntries);
  CHECK(b.status == oracle::Status::error);
  CHECK_THAT(b.message, Catch::Contains("FIFO"));
  const oracle::Verdict c = judge_case_file(dir + "/missing.safetensors", std::nullopt, kNoEntries);
  CHECK(c.status == oracle::Status::error);
  ::unlink(fifo.c_str());
  ::rmdir(folder.c_str());
  ::rmdir(dir.c_str());
}
