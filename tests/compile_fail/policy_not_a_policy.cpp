// Must not compile: a retention policy where a save policy belongs.
// Expected diagnostic: the SavePolicy concept is not satisfied.
#include <ckpt/ckpt.hpp>

int main() {
    ckpt::CheckpointManager<ckpt::KeepLast, ckpt::KeepLast> manager("checkpoints", "run");
    (void)manager;
}
