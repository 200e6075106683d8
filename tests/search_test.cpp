#include "autobatch/search.h"
#include <gtest/gtest.h>
namespace autobatch { namespace { TEST(SearchTest, Placeholder) {} } }
