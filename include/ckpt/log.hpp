#pragma once
// Where ckpt reports what it did on its own: skipped corrupt files, removed temporaries,
// retention deletions. The default sink writes warnings to stderr; replace it to route
// the messages into the program's own logging, or to silence them.

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace ckpt {

enum class LogLevel { info, warning };

using LogSink = std::function<void(LogLevel, std::string_view)>;

namespace detail {
inline LogSink& log_sink() {
    static LogSink sink = [](LogLevel level, std::string_view msg) {
        if (level == LogLevel::warning)
            std::fprintf(stderr, "[ckpt] warning: %.*s\n", static_cast<int>(msg.size()), msg.data());
    };
    return sink;
}
inline void log(LogLevel level, const std::string& msg) {
    if (auto& sink = log_sink()) sink(level, msg);
}
}  // namespace detail

/// Replaces the sink; an empty function silences ckpt. Not synchronised with concurrent logging.
inline void set_log_sink(LogSink sink) { detail::log_sink() = std::move(sink); }

}  // namespace ckpt
