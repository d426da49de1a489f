#pragma once
// The data-parallel job the MPI tests run on MpiComm (tests/mpi_worker.cpp) and on ThreadComm
// (the reference, in tests/test_mpi.cpp): one definition, so that the two train alike.

#include "dp_support.hpp"

namespace test {

/// The optimizer state in 2 pieces: every step broadcasts the updated pieces as well as
/// averaging the gradients.
constexpr int mpi_shard_size = 2;
/// 2 epochs of 8 steps, a global batch of 32 (test::shard_of).
constexpr std::int64_t mpi_epochs = 2;

/// One rank's part of the job: its shard of the data, UceNet(7), Momentum in a sharded
/// DataParallelOptimizer, a trainer.
template <class Comm>
struct DpJob {
    explicit DpJob(Comm& comm)
        : data(shard_of(comm.size(), comm.rank())), stack(net, comm, mpi_shard_size), trainer(net, stack.opt(), {}, comm.rank()) {}
    DpOptOn<Comm>& opt() { return stack.opt(); }

    nn::MnistDataset data;
    nn::UceNet net{7};
    DpStack<Comm> stack;
    nn::Trainer<nn::UceNet, DpOptOn<Comm>> trainer;
};

}  // namespace test
