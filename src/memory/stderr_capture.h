// stderr_capture.h (internal) — sends what the process writes to file descriptor 2 into a
// temporary file while it lives: a pt2 package's wrapper prints a failed call's text and c10 logs
// its exception there ("Exception in aoti_torch: ...", "Error: ... API call failed at ..."),
// which an out-of-memory trial, an expected outcome, must not put on the user's terminal. The
// CLI's own log writes to a copy of descriptor 2 taken at start, so its lines still reach the
// terminal. Thread safety: descriptor 2 is the process's; one capture at a time.
#pragma once

#include <cstdio>
#include <string>

namespace autobatch::detail {

class StderrCapture {
 public:
  /// Flushes std::cerr and stderr, then points descriptor 2 at a temporary file. When the file
  /// cannot be made or the descriptor moved, captures nothing (writes go where they went).
  StderrCapture();
  ~StderrCapture() { (void)finish(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  /// Restores descriptor 2; returns what was written meanwhile ("" after the first call).
  std::string finish();

 private:
  std::FILE* file_ = nullptr;
  int saved_ = -1;
};

}  // namespace autobatch::detail
