#pragma once
// Streaming xxh3-64, the checksum of checkpoint bodies. On x86-64 the library's dispatcher
// picks the widest vector unit at run time.

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define CKPT_XXH3_UPDATE XXH3_64bits_update_dispatch
#define CKPT_XXH3_ONESHOT XXH3_64bits_dispatch
#else
#define CKPT_XXH3_UPDATE XXH3_64bits_update
#define CKPT_XXH3_ONESHOT XXH3_64bits
#endif

namespace ckpt::detail {

/// Leaves the calling thread's vector registers clean (VZEROUPPER) after a hash. The x86
/// dispatcher's AVX-512 kernel of Debian's libxxhash returns with the upper halves of the
/// vector registers in use, and until the next VZEROUPPER, code the thread runs in legacy SSE
/// encodings (Eigen, or any code built for baseline x86-64) runs about 3x slower on AMD Zen 4:
/// a 2-D stencil on the training thread took 61 ms per 50 steps instead of 21 ms for the rest
/// of the job after one 4 MiB hash. Costs a cycle; nothing on CPUs without AVX.
inline void clear_upper_vector_state() noexcept {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static const bool avx = __builtin_cpu_supports("avx");
    if (avx) asm volatile("vzeroupper");
#endif
}

class Xxh3 {
public:
    Xxh3() : state_(XXH3_createState(), &XXH3_freeState) {
        if (!state_) throw std::bad_alloc();
        XXH3_64bits_reset(state_.get());
    }
    void update(const void* data, std::size_t n) {
        if (!n) return;
        CKPT_XXH3_UPDATE(state_.get(), data, n);
        clear_upper_vector_state();
    }
    std::uint64_t digest() const {
        const auto h = XXH3_64bits_digest(state_.get());
        clear_upper_vector_state();
        return h;
    }

private:
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

inline std::uint64_t xxh3(const void* data, std::size_t n) {
    const auto h = CKPT_XXH3_ONESHOT(data, n);
    clear_upper_vector_state();
    return h;
}

}  // namespace ckpt::detail
