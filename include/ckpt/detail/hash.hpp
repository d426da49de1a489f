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

class Xxh3 {
public:
    Xxh3() : state_(XXH3_createState(), &XXH3_freeState) {
        if (!state_) throw std::bad_alloc();
        XXH3_64bits_reset(state_.get());
    }
    void update(const void* data, std::size_t n) {
        if (n) CKPT_XXH3_UPDATE(state_.get(), data, n);
    }
    std::uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

private:
    std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

inline std::uint64_t xxh3(const void* data, std::size_t n) { return CKPT_XXH3_ONESHOT(data, n); }

}  // namespace ckpt::detail
