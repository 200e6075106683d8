#include "autobatch/vocabulary/units.h"

#include <gtest/gtest.h>

#include <string>

#include "autobatch/vocabulary/error.h"

namespace autobatch {
namespace {
// Named after the file: the test executables compile several files as one unit (UNITY_BUILD).
namespace units_test {

TEST(UnitsTest, BothUnitFamiliesAreExact) {
  EXPECT_EQ(parseBytes("24GiB"), 24LL << 30);
  EXPECT_EQ(parseBytes("24GB"), 24'000'000'000LL);
  EXPECT_EQ(parseBytes("512MiB"), 512LL << 20);
  EXPECT_EQ(parseBytes("3 kib"), 3072);
  EXPECT_EQ(parseBytes("2TB"), 2'000'000'000'000LL);
  EXPECT_EQ(parseBytes("1TiB"), 1LL << 40);
  EXPECT_EQ(parseBytes("1073741824B"), 1LL << 30);
  EXPECT_EQ(parseBytes("17B"), 17);
  EXPECT_EQ(parseBytes("0"), 0);
}

TEST(UnitsTest, FractionsRoundDownToWholeBytes) {
  EXPECT_EQ(parseBytes("1.5GiB"), 3LL << 29);
  EXPECT_EQ(parseBytes("0.5KB"), 500);
  EXPECT_EQ(parseBytes("1.0001KiB"), 1024);  // 1024.1024 bytes
  // Exact decimal arithmetic: binary floating point would give 299 and 1 099 999 999.
  EXPECT_EQ(parseBytes("0.3KB"), 300);
  EXPECT_EQ(parseBytes("1.1GB"), 1'100'000'000);
  EXPECT_EQ(parseBytes("0.999999999999999999TiB"), (1LL << 40) - 1);
}

TEST(UnitsTest, LargestValueAndOneMore) {
  EXPECT_EQ(parseBytes("9223372036854775807B"), 9223372036854775807LL);
  EXPECT_THROW(parseBytes("9223372036854775808B"), Error);
  EXPECT_EQ(parseBytes("8388607TiB"), 8388607LL << 40);
  EXPECT_THROW(parseBytes("8388608TiB"), Error);  // 2^63 bytes
}

void expectError(const std::string& text, const std::string& part) {
  try {
    parseBytes(text, "--memory-limit");
    FAIL() << "expected an Error for '" << text << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("--memory-limit: expected a byte size such as 24GiB", 0), 0U)
        << message;
    EXPECT_NE(message.find("'" + text + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST(UnitsTest, MalformedSizesSayWhatIsWrong) {
  expectError("24XB", "unknown unit 'xb': valid units are B, KB, MB, GB, TB, KiB, MiB, GiB, TiB");
  expectError("-1GiB", "a size has no sign");
  expectError("+1GiB", "a size has no sign");
  expectError("1e400", "exponents are not accepted");
  expectError("", "empty");
  expectError("GiB", "no number");
  expectError("1.GiB", "no digit after the decimal point");
  expectError("1 2GiB", "unknown unit");
  expectError("1.0000000000000000001GiB", "more than 18 digits after the decimal point");
  expectError("99999999999999999999", "larger than 2^63 - 1 bytes");
  // Catches "--memory-limit 1.5" taken as 1 byte.
  expectError("1.5", "a number without a unit is ambiguous: add the unit, such as 1.5MiB)");
  expectError("0.5B", "a fraction of a byte: add the unit, such as 0.5GiB");
  expectError("0.5 b", "such as 0.5GiB");
}

TEST(UnitsTest, WholeBytesWithAFractionOfZeroAreBytes) {
  EXPECT_EQ(parseBytes("2.0B"), 2);
  EXPECT_EQ(parseBytes("2.000B"), 2);
  EXPECT_EQ(parseBytes("0.5KiB"), 512);
}

TEST(UnitsTest, FormatsWithBinaryUnits) {
  EXPECT_EQ(formatBytes(512), "512 B");
  EXPECT_EQ(formatBytes(1536), "1.50 KiB");
  EXPECT_EQ(formatBytes(3LL << 30), "3.00 GiB");
  EXPECT_EQ(formatBytes(-(1LL << 20)), "-1.00 MiB");
  // Issue 27, row 13: 2^63 - 1 bytes read "8388608.00 TiB" when TiB was the largest unit.
  EXPECT_EQ(formatBytes(1LL << 50), "1.00 PiB");
  EXPECT_EQ(formatBytes(9223372036854775807LL), "8.00 EiB");
}

TEST(UnitsTest, IntegersInRange) {
  EXPECT_EQ(parseInteger("512", "--target-batch", 1, 1LL << 40), 512);
  EXPECT_EQ(parseInteger("1099511627776", "--target-batch", 1, 1LL << 40), 1LL << 40);
  for (const char* bad :
       {"0", "-3", "abc", "12x", "", "1099511627777", "99999999999999999999", "1.5", " 5"}) {
    try {
      parseInteger(bad, "--target-batch", 1, 1LL << 40);
      FAIL() << "expected an Error for '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--target-batch: expected a whole number in [1, 1099511627776], but "
                            "got '") +
                    bad + "'");
    }
  }
}

TEST(UnitsTest, DecimalsInRange) {
  EXPECT_DOUBLE_EQ(parseDecimal("0.25", "--tolerance", 0.0, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(parseDecimal("1.5e2", "--time-limit", 0.0, 1e9), 150.0);
  for (const char* bad : {"nan", "inf", "-1", "2", "x", ""}) {
    EXPECT_THROW(parseDecimal(bad, "--tolerance", 0.0, 1.0), Error) << bad;
  }
  try {
    parseDecimal("abc", "--time-limit", 0.0, 86400.0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--time-limit: expected a number in [0, 86400], but got 'abc'");
  }
}

// Issue 27, row 18: sizes need their unit.
// "--margin 5" was 5 bytes and "--memory-limit 1000000" a million bytes: a number without a unit
// is bytes to one reader, a percentage or a forgotten GiB to another. Only zero, the same in
// every reading, goes without a unit. Catches a parser that still defaults a bare number to bytes
// (any of these returning a value instead of throwing).
TEST(UnitsTest, ANumberWithoutAUnitIsRefusedExceptZero) {
  for (const char* bare : {"5", "1", "1073741824", "2.0", "9223372036854775807", "05"}) {
    expectError(bare, std::string("a number without a unit is ambiguous: add the unit, such as ") +
                          bare + "MiB, or " + bare + "B for bytes");
  }
  EXPECT_EQ(parseBytes("0"), 0);
  EXPECT_EQ(parseBytes("0.0"), 0);
  EXPECT_EQ(parseBytes("000"), 0);
  EXPECT_EQ(parseBytes("5B"), 5);
  EXPECT_EQ(parseBytes("5 b"), 5);
  EXPECT_EQ(parseBytes("5MiB"), 5LL << 20);
}

}  // namespace units_test
}  // namespace
}  // namespace autobatch
