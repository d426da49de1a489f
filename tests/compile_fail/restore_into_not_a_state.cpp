// Must not compile: a manager is asked to restore into an object that is not a checkpoint state.
// Expected diagnostic: "restore() loads into a ckpt::ParamDict of views or an object with ..."
#include <ckpt/ckpt.hpp>

struct NotAState {
    int weights[4];
};

int main() {
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll> manager("checkpoints", "run", ckpt::EverySteps{1});
    NotAState state;
    (void)manager.restore(state);
}
