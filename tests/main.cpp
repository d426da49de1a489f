#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

// The allocation watch of alloc_tracker.hpp: global operator new and mmap for this binary.
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <new>

#include "alloc_tracker.hpp"

// ThreadSanitizer: g++ says so with __SANITIZE_THREAD__, clang with __has_feature.
#if defined(__SANITIZE_THREAD__)
#define CKPT_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CKPT_TEST_TSAN 1
#endif
#endif

namespace test::alloc_state {
std::atomic<bool> watching{false};
std::atomic<std::size_t> largest_new{0};
std::atomic<std::size_t> largest_mapping{0};
std::atomic<std::size_t> refuse_above{SIZE_MAX};
}  // namespace test::alloc_state

// None of it under ThreadSanitizer: its runtime maps memory before dlsym can work, clang's
// defines operator new and delete itself, and the TSan pass does not run the allocation
// checks (allocations and mappings then go unseen and pass).
#ifndef CKPT_TEST_TSAN
namespace {

void note(std::atomic<std::size_t>& largest, std::size_t n) {
    std::size_t seen = largest.load(std::memory_order_relaxed);
    while (n > seen && !largest.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
}

// Whether a request may go ahead; records it while a watch is on.
bool admit(std::atomic<std::size_t>& largest, std::size_t n) {
    if (!test::alloc_state::watching.load(std::memory_order_relaxed)) return true;
    note(largest, n);
    return n <= test::alloc_state::refuse_above.load(std::memory_order_relaxed);
}

void* allocate(std::size_t n, std::size_t align, bool nothrow) {
    if (!admit(test::alloc_state::largest_new, n)) {
        if (nothrow) return nullptr;
        throw std::bad_alloc();
    }
    for (;;) {
        void* p = nullptr;
        if (align <= __STDCPP_DEFAULT_NEW_ALIGNMENT__) p = std::malloc(n ? n : 1);
        else if (::posix_memalign(&p, align, n ? n : 1) != 0) p = nullptr;
        if (p) return p;
        std::new_handler handler = std::get_new_handler();
        if (!handler) {
            if (nothrow) return nullptr;
            throw std::bad_alloc();
        }
        handler();
    }
}

std::size_t alignment(std::align_val_t a) { return static_cast<std::size_t>(a); }

}  // namespace

void* operator new(std::size_t n) { return allocate(n, 0, false); }
void* operator new[](std::size_t n) { return allocate(n, 0, false); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, alignment(a), false); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate(n, alignment(a), false); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0, true); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0, true); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate(n, alignment(a), true);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate(n, alignment(a), true);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

// Large tensors and bodies are mapped, not allocated (ckpt::detail::allocate_huge). Calls
// go on to the next mmap in line, a sanitizer's when there is one, else the C library's.
extern "C" void* mmap(void* addr, std::size_t len, int prot, int flags, int fd, off_t offset) noexcept {
    if ((flags & MAP_ANONYMOUS) && !admit(test::alloc_state::largest_mapping, len)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    using Mmap = void* (*)(void*, std::size_t, int, int, int, off_t);
    static const auto next = reinterpret_cast<Mmap>(::dlsym(RTLD_NEXT, "mmap"));
    if (next) return next(addr, len, prot, flags, fd, offset);
    return reinterpret_cast<void*>(::syscall(SYS_mmap, addr, len, prot, flags, fd, offset));
}
#endif
