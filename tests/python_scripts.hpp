#pragma once
// Runs the Python scripts under tests/python with Debian's python3 (its numpy, its torch), the
// way the interop suites cross into Python to write and read files.

#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "process.hpp"
#include "support.hpp"

namespace test {

/// Runs tests/python/SCRIPT DIR; fails the test, with the script's output, unless it exits 0.
/// A missing Python module is such a failure: the script says which, and scripts/deps.sh
/// installs it.
inline void run_python(const std::string& script, const fs::path& dir) {
    const std::string log = (dir / (script + ".log")).string();
    Process p({"/usr/bin/python3", std::string(CKPT_SOURCE_DIR) + "/tests/python/" + script, dir.string()}, log);
    const auto status = p.wait(std::chrono::seconds(120));
    INFO(p.output());
    REQUIRE(status.has_value());
    REQUIRE(*status == 0);
}

}  // namespace test
