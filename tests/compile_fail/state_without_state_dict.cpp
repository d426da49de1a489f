// Must not compile: a manager is asked to save an object that is not a checkpoint state.
// Expected diagnostic: "a checkpoint state must be a ckpt::ParamDict, a callable returning one, ..."
#include <ckpt/ckpt.hpp>

struct NotAState {
    int weights[4];
};

int main() {
    ckpt::CheckpointManager<ckpt::EverySteps, ckpt::KeepAll> manager("checkpoints", "run", ckpt::EverySteps{1});
    NotAState state;
    manager.save(ckpt::Progress{}, state);
}
