// The autobatch command line. The only user of cxxopts; the only catch-all (exit codes below and
// in docs/errors.md).
#include <spdlog/spdlog.h>
#include <cxxopts.hpp>

#include <exception>
#include <iostream>

#include "autobatch/error.h"
#include "autobatch/version.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitRuntimeError = 1;
constexpr int kExitUsage = 2;

constexpr const char* kExitCodes = R"(Exit codes:
  0    found / fits
  1    runtime error (raised inside the model's forward or backward, or a fatal device error)
  2    usage or bad input detected by autobatch (flags, specs, files, model signature)
  3    does not fit (nothing fits at the minimum batch, check failed)
  4    ranks could not agree (multi-rank timeout)
  130  interrupted by SIGINT, 143 by SIGTERM (the best verified result is still printed)
)";

int run(int argc, char** argv) {
  cxxopts::Options options("autobatch",
                           "Finds the largest micro-batch a TorchScript model can train with on "
                           "this device, by running real training steps.");
  options.add_options()("h,help", "Print this help and exit")(
      "version", "Print the version, the LibTorch build and the GPUs seen, and exit")(
      "v,verbose", "More log output (debug)")("q,quiet", "Only warnings and errors");
  const auto args = options.parse(argc, argv);

  if (args.count("help") != 0U) {
    std::cout << options.help() << "\n" << kExitCodes;
    return kExitOk;
  }
  if (args.count("quiet") != 0U) spdlog::set_level(spdlog::level::warn);
  if (args.count("verbose") != 0U) spdlog::set_level(spdlog::level::debug);
  if (args.count("version") != 0U) {
    std::cout << autobatch::versionText(autobatch::buildInfo());
    return kExitOk;
  }
  throw autobatch::Error("no job given: expected --version or --help (the search lands next)");
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  try {
    return run(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << "autobatch: " << e.what() << " (see autobatch --help)\n";
    return kExitUsage;
  } catch (const autobatch::Error& e) {
    std::cerr << "autobatch: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "autobatch: error: " << e.what() << "\n";
    return kExitRuntimeError;
  }
}
