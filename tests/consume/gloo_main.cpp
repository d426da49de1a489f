// The installed ckpt::gloo: a one-rank GlooComm through a file store.
#include <fault/gloo_comm.hpp>

#include <stdlib.h>

#include <cstdio>
#include <string>
#include <vector>

int main() {
    std::string dir = "/tmp/ckpt-consume-gloo-XXXXXX";
    if (!::mkdtemp(dir.data())) return 1;
    auto store = fault::open_store("file://" + dir);
    fault::GlooComm comm(*store, 0, 1);
    std::vector<float> v{1, 2, 3};
    comm.allreduce(v, fault::ReduceOp::mean);
    comm.barrier();
    std::system(("rm -rf '" + dir + "'").c_str());
    std::printf("gloo consumer: %g %g %g\n", v[0], v[1], v[2]);
    return v == std::vector<float>{1, 2, 3} ? 0 : 1;
}
