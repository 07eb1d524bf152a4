"""The compiled core's build (docs/architecture.md, "The compiled core"); everything else
is in pyproject.toml. The extension is optional: where it cannot be built (no C++
compiler, no Cython), marconi installs and runs on its Python core, and says so once."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Builds the compiled core if it can; a failure is a warning, never a failed install
    (setuptools' own `optional` is not honoured by every build path, editable ones
    included)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as err:  # any build failure leaves the Python core
            self._skip(err)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as err:
            self._skip(err)

    @staticmethod
    def _skip(err: Exception) -> None:
        print(f"warning: marconi's compiled core was not built ({err}); marconi runs its "
              "Python core", file=sys.stderr)


try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: the Python core only
    extensions = []
else:
    extensions = cythonize(
        [Extension("marconi.core._native", ["src/marconi/core/_native.pyx"],
                   include_dirs=["src/marconi/core"], language="c++", optional=True,
                   depends=["src/marconi/core/native/tree_core.hpp",
                            "src/marconi/core/native/serving.hpp"],
                   extra_compile_args=["-std=c++17", "-O3", "-ffp-contract=off"])],
        compiler_directives={"language_level": "3"}, quiet=True)

setup(ext_modules=extensions, cmdclass={"build_ext": OptionalBuildExt})
