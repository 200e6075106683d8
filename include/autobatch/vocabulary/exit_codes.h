// autobatch/vocabulary/exit_codes.h — the `autobatch` command's exit statuses, the one table the
// command, its --help text and the Python package's exceptions (autobatch._core.EXIT_CODES,
// src/python/autobatch/_errors.py) read. docs/errors.md documents each status.
// Thread safety: constants.
#pragma once

namespace autobatch {

/// Exit statuses of the `autobatch` command (docs/errors.md, "Exit codes").
struct ExitCodes {
  int ok;             ///< found / fits
  int runtime_error;  ///< the model's own error, a fatal device error, or a report not written
  int usage;          ///< bad input detected before any trial (flags, specs, files, signature)
  int does_not_fit;   ///< nothing fits at the minimum batch, or --check-batch failed
  int ranks;          ///< ranks could not agree, or run different jobs
  int interrupted;    ///< SIGINT: 128 + 2, the shell's convention for a signal's death
  int terminated;     ///< SIGTERM: 128 + 15
};

inline constexpr ExitCodes kExitCodes{0, 1, 2, 3, 4, 130, 143};

}  // namespace autobatch
