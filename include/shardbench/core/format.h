// Numbers as the programs print them: counts with thousands separators, sizes in binary units.
#pragma once
#include <cstdint>
#include <string>

namespace sb {

// "611,838,976"
std::string with_commas(int64_t v);
// "1.23 GiB"
std::string human_bytes(double bytes);

}  // namespace sb
