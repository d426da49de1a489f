// The installed ckpt::mpi: a one-rank MpiComm, MPI started without mpirun (a singleton).
#include <fault/mpi_comm.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
    fault::MpiSession mpi(argc, argv);
    fault::MpiComm comm(mpi);
    std::vector<float> v{1, 2, 3};
    comm.allreduce(v, fault::ReduceOp::mean);
    comm.barrier();
    std::printf("mpi consumer: rank %d of %d: %g %g %g\n", comm.rank(), comm.size(), v[0], v[1], v[2]);
    return v == std::vector<float>{1, 2, 3} ? 0 : 1;
}
