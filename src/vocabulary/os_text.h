// The text of an errno value, for messages that say why a file operation failed. Internal.
#pragma once

#include <string>
#include <system_error>

namespace autobatch {

// The C library's message for `error` (an errno value), e.g. "No such file or directory".
inline std::string errnoText(int error) { return std::generic_category().message(error); }

}  // namespace autobatch
