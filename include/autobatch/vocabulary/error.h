// autobatch/vocabulary/error.h — the exception autobatch throws for invalid input.
//
// Contract: `autobatch::Error` is thrown for input that autobatch itself detects as wrong (flags,
// specs, files, model signatures, impossible targets). Its message says what was expected, what
// was given, and how to fix it. It maps to exit code 2 in the CLI (see docs/errors.md).
// Out-of-memory is never an Error: it is a trial outcome (autobatch/vocabulary/trial.h). Errors
// raised by the model or the device are not wrapped: they propagate with their own type and
// message.
#pragma once

#include <stdexcept>
#include <string>

namespace autobatch {

/// Invalid input detected by autobatch (usage error, CLI exit code 2).
/// The message has the form "<what>: expected <X>, but got <Y>[; <how to fix>]".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace autobatch
