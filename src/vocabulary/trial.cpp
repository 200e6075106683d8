#include "autobatch/vocabulary/trial.h"

namespace autobatch {

std::string_view toString(TrialOutcome outcome) {
  switch (outcome) {
    case TrialOutcome::kFits:
      return "fits";
    case TrialOutcome::kOutOfMemory:
      return "out-of-memory";
    case TrialOutcome::kSizeLimit:
      return "size-limit";
  }
  return "unknown";
}

}  // namespace autobatch
