#pragma once
// The examples' last line, final_params_xxh64=<16 hex digits>: xxh64 of every parameter's
// bytes in order, so that two runs can be compared bit for bit from their output.

#include <nn/core.hpp>
#include <xxhash.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace examples {

/// xxh64 of the byte ranges in order, as 16 hex digits.
inline std::string xxh64_hex(const std::vector<std::pair<const void*, std::size_t>>& ranges) {
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, 0);
    for (const auto& [data, size] : ranges) XXH64_update(st, data, size);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH64_digest(st)));
    XXH64_freeState(st);
    return hex;
}

inline std::string params_xxh64(const std::vector<nn::Parameter*>& params) {
    std::vector<std::pair<const void*, std::size_t>> ranges;
    for (const nn::Parameter* p : params) ranges.emplace_back(p->value.data(), p->value.size() * sizeof(float));
    return xxh64_hex(ranges);
}

}  // namespace examples
