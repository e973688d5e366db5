"""Runs pytest as on a machine where the named packages are not installed: their imports raise
ModuleNotFoundError (a meta-path finder ahead of every other), so each test module that needs
them must skip with a reason, never fail at collection.

    python tests/python/run_without.py torch diffusers -- -q -rs tests/python

(ctest's python_pytest_without_torch). The same check in a real environment without torch:
docs/testing.md, "Python tests without PyTorch"."""
import importlib.abc
import os
import sys


class _Absent(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named '{fullname}' (hidden by run_without.py)", name=fullname)
        return None


def main(argv):
    if "--" not in argv:
        sys.exit("usage: run_without.py PACKAGE... -- PYTEST_ARGS...")
    split = argv.index("--")
    hidden, pytest_args = argv[:split], argv[split + 1:]
    loaded = sorted(n for n in sys.modules if n.split(".")[0] in hidden)
    if loaded:
        sys.exit(f"run_without.py: {', '.join(loaded)} already imported")
    sys.meta_path.insert(0, _Absent(hidden))
    # Workers of pytest-xdist (PYTEST_ADDOPTS=-n N) would be new processes without the finder.
    os.environ.pop("PYTEST_ADDOPTS", None)
    import pytest
    return pytest.main(pytest_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
