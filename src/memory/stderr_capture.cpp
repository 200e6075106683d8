#include "memory/stderr_capture.h"

#include <unistd.h>

#include <array>
#include <iostream>

namespace autobatch::detail {

StderrCapture::StderrCapture() {
  std::cerr.flush();
  std::fflush(stderr);
  file_ = std::tmpfile();
  if (file_ == nullptr) return;
  saved_ = dup(2);
  if (saved_ < 0 || dup2(fileno(file_), 2) < 0) {
    if (saved_ >= 0) close(saved_);
    std::fclose(file_);
    file_ = nullptr;
  }
}

std::string StderrCapture::finish() {
  if (file_ == nullptr) return {};
  std::cerr.flush();
  std::fflush(stderr);
  dup2(saved_, 2);
  close(saved_);
  std::string text;
  std::rewind(file_);
  std::array<char, 4096> chunk{};
  std::size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), file_)) > 0) text.append(chunk.data(), n);
  std::fclose(file_);
  file_ = nullptr;
  return text;
}

}  // namespace autobatch::detail
