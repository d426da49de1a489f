"""pytest setup of the Python package's tests: the package of this source tree, reproducible
hypothesis runs, and the C++ tool (from CKPT_TOOL, which ctest sets to the build's)."""
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

import support

# The package of this tree, whatever else is installed.
sys.path.insert(0, os.path.join(support.SOURCE, "python"))

# Generated cases: few enough for CI, derandomized so that every run tries the same ones, and
# no example database written anywhere.
settings.register_profile("ckpt", max_examples=40, deadline=None, derandomize=True, database=None,
                          print_blob=False, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("CKPT_HYPOTHESIS_PROFILE", "ckpt"))


@pytest.fixture(scope="session")
def tool():
    """The C++ `ckpt` tool. Tests that need it are skipped only when CKPT_TOOL is not set (ctest
    always sets it); set to a file that is not there, they fail."""
    path = os.environ.get("CKPT_TOOL")
    if not path:
        pytest.skip("CKPT_TOOL is not set: these tests compare with the C++ ckpt tool (ctest sets it)")
    assert os.access(path, os.X_OK), "CKPT_TOOL='%s' is not an executable" % path
    return support.Tool(path)


@pytest.fixture(scope="session")
def other_key_file(tmp_path_factory):
    """A key file of another key than the golden files'."""
    return support.write_key(tmp_path_factory.mktemp("keys") / "other.key", bytes(range(32)))
