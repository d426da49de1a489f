#pragma once
// The largest single allocation a piece of code makes. The test binary replaces the global
// operator new (every overload, aligned ones included) and defines mmap, which the library's
// huge-page blocks use, in main.cpp; both report to the watch in scope and refuse requests
// above its limit, so that a reader fooled into a huge allocation fails fast instead of
// exhausting the machine.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace test {

namespace alloc_state {
extern std::atomic<bool> watching;
extern std::atomic<std::size_t> largest_new;      // bytes, largest operator new request
extern std::atomic<std::size_t> largest_mapping;  // bytes, largest anonymous mmap
extern std::atomic<std::size_t> refuse_above;     // requests above this fail (bad_alloc / ENOMEM)
}  // namespace alloc_state

/// Whether the watch sees and refuses allocations in this build: not under ThreadSanitizer,
/// whose runtime main.cpp leaves operator new and mmap to (see there).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool allocation_watch_works = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool allocation_watch_works = false;
#else
inline constexpr bool allocation_watch_works = true;
#endif
#else
inline constexpr bool allocation_watch_works = true;
#endif

/// Records allocations made by any thread while it lives. One at a time.
class AllocationWatch {
public:
    explicit AllocationWatch(std::size_t refuse_above = SIZE_MAX) {
        alloc_state::largest_new = 0;
        alloc_state::largest_mapping = 0;
        alloc_state::refuse_above = refuse_above;
        alloc_state::watching = true;
    }
    ~AllocationWatch() { stop(); }
    AllocationWatch(const AllocationWatch&) = delete;
    AllocationWatch& operator=(const AllocationWatch&) = delete;

    void stop() {
        alloc_state::watching = false;
        alloc_state::refuse_above = SIZE_MAX;
    }
    std::size_t largest_new() const { return alloc_state::largest_new; }
    std::size_t largest_mapping() const { return alloc_state::largest_mapping; }
};

}  // namespace test
