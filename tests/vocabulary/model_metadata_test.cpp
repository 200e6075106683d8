// The archive metadata parser and the resolution of inputs and loss
// (src/vocabulary/model_metadata.cpp, autobatch/vocabulary/model_metadata.h; LibTorch-free). Moved
// from tests/vocabulary/input_spec_test.cpp (issue 28).
#include "autobatch/vocabulary/model_metadata.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/input_spec.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace model_metadata_test {

TEST(ModelMetadataTest, ParsesStringAndObjectForms) {
  const ModelMetadata m = parseModelMetadata(
      R"({"version": 1, "inputs": ["3x32x32", {"shape": [16], "dtype": "int64", "high": 100}],
          "loss": "cross-entropy"})");
  ASSERT_EQ(m.inputs.size(), 2U);
  EXPECT_EQ(m.inputs[0].sample_shape, (std::vector<std::int64_t>{3, 32, 32}));
  EXPECT_EQ(m.inputs[1].dtype, DType::kInt64);
  EXPECT_EQ(m.inputs[1].high, 100);
  EXPECT_EQ(m.loss, LossKind::kCrossEntropy);
  EXPECT_EQ(parseModelMetadata(R"({"inputs": [{"shape": []}]})").inputs[0].sample_shape.size(), 0U);
}

TEST(ModelMetadataTest, RoundTripsThroughToJson) {
  ModelMetadata m;
  m.inputs = {parseInputSpec("bf16:3x8x8"), parseInputSpec("int64:12:-3..<40")};
  m.loss = LossKind::kMse;
  EXPECT_EQ(parseModelMetadata(toJson(m)), m);
}

TEST(ModelMetadataTest, RejectsBadDocumentsNamingTheProblem) {
  auto message = [](const std::string& json) {
    try {
      parseModelMetadata(json, "net.pt");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_NE(message("{").find("net.pt: autobatch/inputs.json: expected valid JSON"),
            std::string::npos);
  EXPECT_NE(message("[]").find("a JSON object"), std::string::npos);
  EXPECT_NE(message("{}").find("expected \"inputs\" as a non-empty list"), std::string::npos);
  EXPECT_NE(message(R"({"inputs": []})").find("non-empty list"), std::string::npos);
  EXPECT_NE(message(R"({"inputs": ["3x0"]})").find("inputs[0] to be a valid input spec"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": ["3"], "los": "mse"})").find("but got 'los'"), std::string::npos);
  EXPECT_NE(message(R"({"inputs": ["3"], "loss": "hinge"})").find("unknown loss 'hinge'"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": ["3"], "version": 2})").find("\"version\": 1"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": [{"shape": [3], "dtyp": "int64"}]})").find("'dtyp'"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": [{"shape": "3x3"}]})").find("inputs[0].shape"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": [{"shape": [3], "high": 5}]})").find("no value range"),
            std::string::npos);
  EXPECT_NE(message(R"({"inputs": [7]})").find("a spec string or an object"), std::string::npos);
}

// Found by tests/fuzz/parsers_fuzz.cpp: each of these once escaped as a non-autobatch exception
// (nlohmann's out_of_range), could recurse once per nesting level, or read a dtype as a shape.
TEST(ModelMetadataTest, FuzzFindingsAreErrorsWithTheirCause) {
  auto message = [](const std::string& json) {
    try {
      parseModelMetadata(json, "net.pt");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  // A number beyond a double was nlohmann::json::out_of_range, not an Error.
  EXPECT_NE(message("1e400").find("expected valid JSON, but got a parse error"), std::string::npos)
      << message("1e400");
  EXPECT_NE(message(R"({"inputs": [1e400]})").find("expected valid JSON"), std::string::npos);
  // Nested 100000 deep: summarised ("array of 1 element(s)"), never dumped recursively.
  const std::string deep =
      R"({"inputs": [)" + std::string(100000, '[') + std::string(100000, ']') + "]}";
  EXPECT_NE(message(deep).find("inputs[0] as a spec string or an object, but got array of 1 "
                               "element(s)"),
            std::string::npos);
  // A dtype holding a ':' was spliced into the spec text; it is checked on its own.
  EXPECT_NE(message(R"({"inputs": [{"shape": [3], "dtype": "int64:4"}]})")
                .find("inputs[0].dtype to be a known dtype, but got an error: unknown dtype "
                      "'int64:4'"),
            std::string::npos)
      << message(R"({"inputs": [{"shape": [3], "dtype": "int64:4"}]})");
  // A long string cut for the message is cut between UTF-8 characters, not inside one.
  const std::string cut = message(R"({"inputs": ")" + std::string(75, 'a') + "\u00e9\u00e9\"}");
  EXPECT_TRUE(cut.ends_with("string \"" + std::string(75, 'a') + "...")) << cut;
}

TEST(ModelMetadataTest, ExplicitSettingsOverrideTheArchive) {
  ModelMetadata archive;
  archive.inputs = {parseInputSpec("3x8x8")};
  archive.loss = LossKind::kCrossEntropy;
  const auto from_archive = resolveInputs({}, std::nullopt, archive, "net.pt");
  EXPECT_EQ(from_archive.first, archive.inputs);
  EXPECT_EQ(from_archive.second, LossKind::kCrossEntropy);
  const auto given = resolveInputs({parseInputSpec("5")}, LossKind::kMse, archive, "net.pt");
  EXPECT_EQ(given.first[0].sample_shape, (std::vector<std::int64_t>{5}));
  EXPECT_EQ(given.second, LossKind::kMse);
  EXPECT_EQ(resolveInputs({parseInputSpec("5")}, std::nullopt, std::nullopt, "n").second,
            LossKind::kMean);
}

TEST(ModelMetadataTest, NoInputsFromEitherSourceNamesBothWays) {
  try {
    resolveInputs({}, std::nullopt, std::nullopt, "net.pt");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("model 'net.pt': expected input specs, but got none"),
              std::string::npos);
    EXPECT_NE(message.find("--input"), std::string::npos);
    EXPECT_NE(message.find("_extra_files={\"autobatch/inputs.json\""), std::string::npos);
  }
}

}  // namespace model_metadata_test
}  // namespace
}  // namespace autobatch
