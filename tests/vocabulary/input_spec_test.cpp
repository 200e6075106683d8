// The input-spec text syntax and the length placeholder of sweeps (src/vocabulary/input_spec.cpp;
// LibTorch-free).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "autobatch/vocabulary/error.h"
#include "autobatch/vocabulary/input_spec.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace input_spec_test {

std::string errorOf(const std::string& text) {
  try {
    parseInputSpec(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(InputSpecTest, ParsesShapeWithDefaultFloat32) {
  const InputSpec spec = parseInputSpec("3x224x224");
  EXPECT_EQ(spec.sample_shape, (std::vector<std::int64_t>{3, 224, 224}));
  EXPECT_EQ(spec.dtype, DType::kFloat32);
}

TEST(InputSpecTest, ParsesDTypeAndRange) {
  const InputSpec tokens = parseInputSpec("int64:512:<32000");
  EXPECT_EQ(tokens.sample_shape, (std::vector<std::int64_t>{512}));
  EXPECT_EQ(tokens.dtype, DType::kInt64);
  EXPECT_EQ(tokens.low, 0);
  EXPECT_EQ(tokens.high, 32000);
  const InputSpec ranged = parseInputSpec(" int32:16x16:-5..<5 ");
  EXPECT_EQ(ranged.low, -5);
  EXPECT_EQ(ranged.high, 5);
  EXPECT_EQ(parseInputSpec("bf16:3x8x8").dtype, DType::kBFloat16);
  const InputSpec labels = parseInputSpec("int64:scalar:<1000");
  EXPECT_TRUE(labels.sample_shape.empty());
  EXPECT_EQ(labels.high, 1000);
  EXPECT_EQ(parseInputSpec("int64:8").high, 2);  // default range [0, 2)
}

TEST(InputSpecTest, RoundTripsThroughToString) {
  for (const char* text :
       {"float32:3x224x224", "int64:512:<32000", "int32:scalar:-5..<5", "bfloat16:7", "bool:4x4"}) {
    EXPECT_EQ(toString(parseInputSpec(text)), text);
  }
}

TEST(InputSpecTest, ParsesCommaSeparatedList) {
  const auto specs = parseInputSpecs("3x32x32, int64:scalar:<10");
  ASSERT_EQ(specs.size(), 2U);
  EXPECT_EQ(specs[1].dtype, DType::kInt64);
  try {
    parseInputSpecs("3x32x32,3x0");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 2 of '3x32x32,3x0'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parseInputSpecs("  "), Error);
}

TEST(InputSpecTest, RejectsBadDimensionsWithExpectedAndGiven) {
  EXPECT_EQ(errorOf("3x0x5"),
            "input spec '3x0x5': expected every dimension >= 1, but got '0'; the batch "
            "dimension is added by autobatch; give the shape of one sample");
  EXPECT_NE(errorOf("3x-2").find("expected every dimension >= 1, but got '-2'"), std::string::npos);
  EXPECT_NE(errorOf("3xabc").find("positive integers joined by 'x', but got 'abc'"),
            std::string::npos);
  EXPECT_NE(errorOf("3x").find("but got ''"), std::string::npos);
  EXPECT_NE(errorOf("99999999999999999999")
                .find("expected every dimension at most "
                      "9223372036854775807 (INT64_MAX)"),
            std::string::npos);
}

TEST(InputSpecTest, RejectsElementCountOverflow) {
  EXPECT_NE(errorOf("4294967296x4294967296").find("at most INT64_MAX bytes"), std::string::npos);
  // 2^61 float32 elements are 2^63 bytes: one past INT64_MAX.
  EXPECT_NE(errorOf("2305843009213693952").find("INT64_MAX"), std::string::npos);
  EXPECT_NO_THROW(parseInputSpec("bool:2305843009213693952"));
}

TEST(InputSpecTest, RejectsUnknownDTypeListingValidNames) {
  EXPECT_EQ(errorOf("float8:3"),
            "input spec 'float8:3': unknown dtype 'float8': expected one of float32, float16, "
            "bfloat16, int64, int32, bool");
}

TEST(InputSpecTest, RejectsBadRanges) {
  EXPECT_NE(errorOf("3x4:<10").find("no value range for floating dtype float32"),
            std::string::npos);
  EXPECT_NE(errorOf("int64:4:<0").find("non-empty range"), std::string::npos);
  EXPECT_NE(errorOf("int64:4:10").find("a range '<HIGH' or 'LOW..<HIGH'"), std::string::npos);
  EXPECT_NE(errorOf("bool:4:<3").find("bool range inside [0, 2)"), std::string::npos);
  EXPECT_NE(errorOf("int32:4:<3000000000").find("int32 limits"), std::string::npos);
  EXPECT_NE(errorOf("int64:4:<1:extra").find("at most three"), std::string::npos);
  EXPECT_NE(errorOf("int64").find("a sample shape after the dtype"), std::string::npos);
  EXPECT_NE(errorOf("").find("expected an input spec"), std::string::npos);
}

// Issue 27, row 13: input sizes past 2^63 - 1 bytes.
// The bytes of an input at a micro-batch, counted without wrapping: an implementation that
// multiplies in int64 returns a negative or small figure for 2^40 samples of 3x1024x1024 floats,
// and the runner then asks ATen for it.
TEST(InputSpecTest, BatchBytesAreExactOrNoneWhenTheyPassInt64) {
  const InputSpec image = parseInputSpec("3x1024x1024");
  EXPECT_EQ(batchBytes(image, 1, 4), std::optional<std::int64_t>(12582912));
  EXPECT_EQ(batchBytes(image, 1, 2), std::optional<std::int64_t>(6291456));  // fed as fp16
  EXPECT_EQ(batchBytes(image, std::int64_t{1} << 40, 4), std::nullopt);
  const InputSpec one_bool = parseInputSpec("bool:9223372036854775807");
  EXPECT_EQ(batchBytes(one_bool, 1, 1),
            std::optional<std::int64_t>(std::numeric_limits<std::int64_t>::max()));
  EXPECT_EQ(batchBytes(one_bool, 2, 1), std::nullopt);
  EXPECT_EQ(batchBytes(parseInputSpec("int64:scalar"), 3, 8), std::optional<std::int64_t>(24));
  EXPECT_THROW(batchBytes(image, 0, 4), Error);
}

// A dimension past INT64_MAX is named as too large, not as "not a positive integer".
TEST(InputSpecTest, ADimensionPastInt64IsTooLargeNotMalformed) {
  EXPECT_EQ(errorOf("bool:9223372036854775808"),
            "input spec 'bool:9223372036854775808': expected every dimension at most "
            "9223372036854775807 (INT64_MAX), but got '9223372036854775808'; one sample of that "
            "size cannot even be counted, let alone allocated");
  EXPECT_NE(errorOf("4x9223372036854775807").find("a sample of at most INT64_MAX bytes"),
            std::string::npos);
}

}  // namespace input_spec_test
}  // namespace
}  // namespace autobatch

// Issue 18: "L" is the length placeholder of a sweep. Catches a substitution that also touches
// dtype aliases ("long") or ranges, and a range that misses an end or a power of two.
TEST(LengthSweepTest, PlaceholderIsAWholeDimension) {
  EXPECT_TRUE(autobatch::hasLengthPlaceholder("int64:L:<32000"));
  EXPECT_TRUE(autobatch::hasLengthPlaceholder("Lx64"));
  EXPECT_TRUE(autobatch::hasLengthPlaceholder("bool:L"));
  EXPECT_FALSE(autobatch::hasLengthPlaceholder("long:512:<32000"));
  EXPECT_FALSE(autobatch::hasLengthPlaceholder("3x224x224"));
  EXPECT_EQ(autobatch::withLength("int64:L:<32000", 512), "int64:512:<32000");
  EXPECT_EQ(autobatch::withLength("Lx64", 128), "128x64");
  EXPECT_EQ(autobatch::withLength("long:L:-5..<5", 7), "long:7:-5..<5");
  EXPECT_EQ(autobatch::withLength("3x224x224", 9), "3x224x224");
  EXPECT_EQ(autobatch::parseInputSpec(autobatch::withLength("int64:L:<8000", 256)).sample_shape,
            std::vector<std::int64_t>{256});
}

TEST(LengthSweepTest, LengthsFromAListOrARange) {
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(autobatch::parseLengths("128,512,1536"), (V{1536, 512, 128}));
  EXPECT_EQ(autobatch::parseLengths("512,128,512"), (V{512, 128}));
  EXPECT_EQ(autobatch::parseLengths("128..2048"), (V{2048, 1024, 512, 256, 128}));
  EXPECT_EQ(autobatch::parseLengths("100..1000"), (V{1000, 512, 256, 128, 100}));
  EXPECT_EQ(autobatch::parseLengths("64..64"), (V{64}));
  for (const char* bad : {"", "0", "128,,512", "2048..128", "12a", "1..2097152", "-5"}) {
    try {
      autobatch::parseLengths(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const autobatch::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--lengths"), std::string::npos) << e.what();
    }
  }
}

// Issue 27, rows 16 and 21: the length placeholder in several dimensions and outside the shape.

// Tokens of one sample are the elements of the first input whose shape names L. Catches counting
// one L per sample whatever the shape (2xL is 2L tokens, LxL is L*L), and counting a mask that
// follows the token ids.
TEST(LengthSweepTest, TokensPerSampleAreTheElementsOfTheFirstInputThatNamesL) {
  using autobatch::tokensPerSample;
  EXPECT_EQ(tokensPerSample({"int64:L:<32000"}, 512), 512);
  EXPECT_EQ(tokensPerSample({"int64:2xL:<1000"}, 64), 128);
  EXPECT_EQ(tokensPerSample({"int64:LxL:<1000"}, 64), 4096);
  EXPECT_EQ(tokensPerSample({"3x224x224", "int64:Lx3:<9,bool:LxL"}, 10), 30);
  EXPECT_EQ(tokensPerSample({"int64:L:<32000,bool:LxL"}, 128), 128);
  EXPECT_EQ(tokensPerSample({"3x224x224"}, 128), 0);
}

// The placeholder is a dimension of the sample shape only: in a range it is refused, naming the
// text as given (not "int64:1:<L", the text after the substitution), and an error elsewhere in a
// spec with L names the spec as given and the length. Catches a substitution that reaches the
// range or an error that echoes the substituted text.
TEST(LengthSweepTest, PlaceholderOutsideTheShapeIsRefusedNamingTheTextAsGiven) {
  const auto message = [](const std::string& text, std::int64_t length) {
    try {
      (void)autobatch::parseInputSpecsAtLength(text, length);
    } catch (const autobatch::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string range = message("int64:L:<L", 1);
  EXPECT_NE(range.find("input spec 'int64:L:<L': expected the length placeholder L only as a "
                       "dimension of the sample shape, but got it in '<L'"),
            std::string::npos)
      << range;
  EXPECT_EQ(range.find("int64:1:"), std::string::npos) << range;
  EXPECT_NE(message("int64:64:L..<9", 5).find("but got it in 'L..<9'"), std::string::npos);
  const std::string empty = message("3x8,int64:L:<0", 7);
  EXPECT_NE(empty.find("input 2 of '3x8,int64:L:<0' at length 7: input spec 'int64:L:<0': "
                       "expected a non-empty range"),
            std::string::npos)
      << empty;
  EXPECT_NE(message("int64:LxLxL", 1 << 20).find("a sample of at most INT64_MAX bytes"),
            std::string::npos);
  EXPECT_FALSE(autobatch::hasLengthPlaceholder("int64:64:<L"));
  EXPECT_EQ(autobatch::withLength("int64:L:<L", 9), "int64:9:<L");
  EXPECT_EQ(autobatch::withLength("Lx2,bool:L", 3), "3x2,bool:3");
  const auto specs = autobatch::parseInputSpecsAtLength("int64:2xL:<10, bool:LxL", 4);
  ASSERT_EQ(specs.size(), 2U);
  EXPECT_EQ(specs[0].sample_shape, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(specs[1].sample_shape, (std::vector<std::int64_t>{4, 4}));
}
