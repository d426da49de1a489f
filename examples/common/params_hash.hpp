#pragma once
// The examples' last line, final_params_xxh64=<16 hex digits>: xxh64 of every parameter's
// bytes in order, so that two runs can be compared bit for bit from their output.

#include <nn/core.hpp>
#include <xxhash.h>

#include <cstdio>
#include <string>
#include <vector>

namespace examples {

inline std::string params_xxh64(const std::vector<nn::Parameter*>& params) {
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, 0);
    for (const nn::Parameter* p : params) XXH64_update(st, p->value.data(), p->value.size() * sizeof(float));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH64_digest(st)));
    XXH64_freeState(st);
    return hex;
}

}  // namespace examples
