// classifyException: the LibTorch half of autobatch/vocabulary/failure.h (only c10's exception
// header).
#include <c10/util/Exception.h>

#include <new>

#include "autobatch/vocabulary/failure.h"

namespace autobatch {

RaisedError describeException(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::OutOfMemoryError& e) {
    return {ExceptionType::kOutOfMemoryError, e.what()};
  } catch (const std::bad_alloc& e) {
    return {ExceptionType::kBadAlloc, e.what()};
  } catch (const std::exception& e) {
    return {ExceptionType::kOther, e.what()};
  } catch (...) {  // described only; the caller rethrows the original object
    return {ExceptionType::kNonStd, "non-standard exception"};
  }
}

FailureClass classifyException(const std::exception_ptr& error, const FailureContext& context) {
  const RaisedError raised = describeException(error);
  return classifyFailure(raised.type, raised.message, context);
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
