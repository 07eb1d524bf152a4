"""The compiled core's build (docs/architecture.md, "The compiled core"); everything else
is in pyproject.toml. The extension is optional: where it cannot be built (no C++
compiler), marconi installs and runs on its Python core, and says so once."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython in the build environment: the Python core only
    extensions = []
else:
    extensions = cythonize(
        [Extension("marconi.core._native", ["src/marconi/core/_native.pyx"],
                   include_dirs=["src/marconi/core"], language="c++", optional=True,
                   depends=["src/marconi/core/native/tree_core.hpp"],
                   extra_compile_args=["-std=c++17", "-O2", "-ffp-contract=off"])],
        compiler_directives={"language_level": "3"}, quiet=True)

setup(ext_modules=extensions)
