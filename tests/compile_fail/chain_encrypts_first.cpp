// Must not compile: a codec chain that encrypts before it compresses.
// Expected diagnostic: the static_assert of ckpt::Chain, saying encryption must come last.
#include <ckpt/codecs/aes_gcm.hpp>
#include <ckpt/codecs/zstd.hpp>

int main() {
    ckpt::Chain<ckpt::AesGcm, ckpt::Zstd> chain;
    (void)chain;
}
