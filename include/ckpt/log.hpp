#pragma once
// Where ckpt reports what it did on its own: skipped corrupt files, removed temporaries,
// retention deletions. The default sink writes warnings and notices to stderr; replace it to route
// the messages into the program's own logging, or to silence them.
//
// The sink is called by one thread at a time (ckpt logs from background savers and from
// data-parallel ranks running as threads), so it need not be thread-safe itself.

#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace ckpt {

/// info: what ckpt did on its own (silent by default); notice: what the program should know
/// though nothing is wrong (which file a resume took, that a fresh start follows); warning:
/// something is wrong (a corrupt file skipped, a deletion that failed). Ordered by severity:
/// a sink may keep `level >= LogLevel::notice`.
enum class LogLevel { info, notice, warning };

/// Receives each message ckpt logs, with its level (set_log_sink()); called by one thread at a
/// time.
using LogSink = std::function<void(LogLevel, std::string_view)>;

namespace detail {

struct LogState {
    std::mutex mutex;
    LogSink sink = [](LogLevel level, std::string_view msg) {
        if (level != LogLevel::info)
            std::fprintf(stderr, "[ckpt] %s%.*s\n", level == LogLevel::warning ? "warning: " : "",
                         static_cast<int>(msg.size()), msg.data());
    };
};

inline LogState& log_state() {
    static LogState state;
    return state;
}

inline void log(LogLevel level, const std::string& msg) {
    auto& st = log_state();
    std::lock_guard lock(st.mutex);
    if (st.sink) st.sink(level, msg);
}

/// The message of the exception `e` holds, whatever its type.
inline std::string message_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

}  // namespace detail

/// Replaces the sink; an empty function silences ckpt. Waits for a message being logged.
inline void set_log_sink(LogSink sink) {
    auto& st = detail::log_state();
    std::lock_guard lock(st.mutex);
    st.sink = std::move(sink);
}

}  // namespace ckpt
