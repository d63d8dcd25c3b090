"""The one native piece, built at install: src/specserve/_kernels.c (top_k.py falls back to numpy without it)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("specserve._kernels", ["src/specserve/_kernels.c"], extra_compile_args=["-O3"],
                             optional=True)])
