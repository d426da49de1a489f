#pragma once
// Option parsing shared by the examples: --help prints the usage and the options on stdout
// and exits 0; a usage error prints the reason and the usage on stderr and exits 2.
//
//   examples::Cli cli(argc, argv, "prog [--dir DIR] [--epochs N]", "  --dir DIR  where …\n");
//   while (const auto a = cli.next()) {
//       if (*a == "--dir") o.dir = cli.value();
//       else if (*a == "--epochs") o.epochs = cli.count();
//       else cli.unknown();
//   }
//   if (o.epochs < 1) cli.fail("--epochs must be at least 1");

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace examples {

class Cli {
public:
    /// `usage`: the synopsis, program name first; `options`: what --help adds below it.
    Cli(int argc, char** argv, std::string usage, std::string options)
        : argc_(argc), argv_(argv), usage_(std::move(usage)), options_(std::move(options)),
          program_(usage_.substr(0, usage_.find(' '))) {}

    /// The next option, or nothing after the last; --help and -h print the help and exit 0.
    std::optional<std::string> next() {
        if (++i_ >= argc_) return std::nullopt;
        current_ = argv_[i_];
        if (current_ == "--help" || current_ == "-h") {
            std::printf("usage: %s\n\n%s", usage_.c_str(), options_.c_str());
            std::exit(0);
        }
        return current_;
    }
    /// The argument after the current option.
    std::string value() {
        if (i_ + 1 >= argc_) fail(current_ + " needs a value");
        return argv_[++i_];
    }
    /// The argument after the current option, a non-negative integer.
    long long count() {
        const std::string v = value();
        char* end = nullptr;
        const long long n = std::strtoll(v.c_str(), &end, 10);
        if (v.empty() || *end || n < 0) fail(current_ + " needs a non-negative integer, got '" + v + "'");
        return n;
    }
    [[noreturn]] void unknown() const { fail("unknown option '" + current_ + "'"); }
    [[noreturn]] void fail(const std::string& why) const {
        std::fprintf(stderr, "%s: %s\nusage: %s\n(%s --help explains the options)\n", program_.c_str(), why.c_str(),
                     usage_.c_str(), program_.c_str());
        std::exit(2);
    }

private:
    int argc_;
    char** argv_;
    int i_ = 0;
    std::string usage_, options_, program_, current_;
};

}  // namespace examples
