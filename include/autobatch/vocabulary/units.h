// autobatch/vocabulary/units.h — byte sizes as users write them, and as reports print them.
//
// LibTorch-free (fuzzed by tests/fuzz/). Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace autobatch {

/// Parses a byte size: a non-negative number, optionally with a fraction, then a unit.
/// Units (case-insensitive, optional space before): B; decimal KB MB GB TB (10^3 .. 10^12);
/// binary KiB MiB GiB TiB (2^10 .. 2^40). "24GiB" = 24 x 2^30, "24GB" = 24 x 10^9, "512MiB",
/// "1.5GiB" (rounded down to whole bytes), "1073741824B" (bytes). The unit may be left out only
/// for zero ("0"): a bare number is ambiguous (bytes? a percentage, as --margin also takes? a
/// forgotten GiB?), issue 27.
/// `what` names the value in errors (e.g. "--memory-limit").
/// Throws: autobatch::Error for an empty text, a sign, an exponent ("1e400"), an unknown unit
/// ("24XB": lists the valid ones), a number other than 0 without a unit ("5", "1073741824":
/// asks for the unit), a fraction of a byte ("0.5B": a forgotten unit; "2.0B" is 2 bytes), or a
/// value above 2^63 - 1 bytes.
std::int64_t parseBytes(std::string_view text, std::string_view what = "size");

/// Parses a whole number in [min, max] (decimal digits, an optional leading '-'), for count flags.
/// `what` names the flag in errors ("--target-batch").
/// Throws: autobatch::Error "--target-batch: expected a whole number in [1, 1099511627776], but got
/// 'x'" for non-numbers, trailing characters, and values out of range (overflow included).
std::int64_t parseInteger(std::string_view text, std::string_view what, std::int64_t min,
                          std::int64_t max);

/// Parses a finite decimal number in [min, max] (e.g. "0.05", "120", "1.5e2"), for rates and
/// seconds. Throws: autobatch::Error as parseInteger, also for nan and inf.
double parseDecimal(std::string_view text, std::string_view what, double min, double max);

/// A human figure with a binary unit and 2 decimals: "512 B", "1.50 KiB", "3.00 GiB".
std::string formatBytes(std::int64_t bytes);

}  // namespace autobatch
