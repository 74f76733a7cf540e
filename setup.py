"""Build hook: compiles the cffi extension native/_native at install time."""

from setuptools import setup

setup(cffi_modules=["native/_build.py:ffibuilder"])
