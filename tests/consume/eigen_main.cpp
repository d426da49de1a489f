// Built against the installed package: an Eigen matrix through ckpt::eigen.
#include <ckpt/types/eigen.hpp>

#include <cstdio>

int main() {
    const auto dir = boost::filesystem::temp_directory_path() / boost::filesystem::unique_path();
    boost::filesystem::create_directories(dir);
    Eigen::MatrixXd m(2, 3);
    m << 1, 2, 3, 4, 5, 6;
    ckpt::save_checkpoint({{"m", ckpt::view_of(m)}}, dir / "m.ckpt");
    Eigen::MatrixXd back;
    ckpt::EigenState state;
    state.add("m", back);
    ckpt::load_checkpoint_into(dir / "m.ckpt", state, /*strict=*/true);
    boost::filesystem::remove_all(dir);
    const bool same = back == m;
    std::puts(same ? "eigen consumer: ok" : "eigen consumer: values differ");
    return same ? 0 : 1;
}
