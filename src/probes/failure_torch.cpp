// classifyException: the LibTorch half of autobatch/vocabulary/failure.h (only c10's exception
// header).
#include <c10/util/Exception.h>

#include <new>

#include "autobatch/vocabulary/failure.h"

namespace autobatch {

FailureClass classifyException(const std::exception_ptr& error, const FailureContext& context) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::OutOfMemoryError& e) {
    return classifyFailure(ExceptionType::kOutOfMemoryError, e.what(), context);
  } catch (const std::bad_alloc& e) {
    return classifyFailure(ExceptionType::kBadAlloc, e.what(), context);
  } catch (const std::exception& e) {
    return classifyFailure(ExceptionType::kOther, e.what(), context);
  } catch (...) {  // classified only; the caller rethrows the original object
    return classifyFailure(ExceptionType::kNonStd, "non-standard exception", context);
  }
}

bool isFatalDeviceError(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return isFatalDeviceError(std::string_view(e.what()));
  } catch (...) {  // inspected only; the caller rethrows the original object
    return false;
  }
}

}  // namespace autobatch
