#pragma once
// Option parsing shared by the examples.

#include <cstdlib>
#include <string>

namespace examples {

/// The non-negative integer after option argv[i] (i moves past it); `usage(why)` is
/// called, and must not return, when it is missing or malformed.
template <class Usage>
long long count_after(int argc, char** argv, int& i, Usage&& usage) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    char* end = nullptr;
    const long long v = std::strtoll(argv[++i], &end, 10);
    if (*end || v < 0) usage(flag + " needs a non-negative integer, got '" + argv[i] + "'");
    return v;
}

}  // namespace examples
