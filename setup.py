"""The package build: setuptools as setup.cfg configures it, and the CPU kernels compiled
into the built package (``backends/kernel_build.py``), so that an installed package's
first circuits load them instead of compiling them (numba's cache: this machine's CPU,
the build's numba). ``scripts/setup_env.sh`` does the same for its editable install."""

import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            return
        script = Path(self.build_lib) / "pennylane_custatevec" / "backends" / "kernel_build.py"
        if subprocess.run([sys.executable, str(script)]).returncode != 0:
            self.warn(
                "the CPU kernels were not all compiled ahead; those missing compile at their "
                "first call (see the output above)"
            )


setup(cmdclass={"build_py": BuildPyWithKernels})
