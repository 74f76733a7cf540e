"""Build hook: compiles the cffi extensions native/_native and native/_tls at install time."""

from setuptools import setup

setup(cffi_modules=["native/_build.py:ffibuilder", "native/_tls_build.py:ffibuilder"])
