"""Compiled parts of rlm, built by ``pip install -e .`` / ``make install`` (metadata: pyproject.toml).

Each extension is optional: where no C compiler is present rlm still installs and runs the
pure-Python code (a log line says which runs), while ``make test`` fails on a missing extension
(RLM_REQUIRE_NATIVE, docs/decoder.md, docs/scan.md).
"""

from setuptools import Extension, setup

_CFLAGS = ["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]

EXTENSIONS = [
    # Record batches -> Arrow column buffers (docs/decoder.md)
    Extension(
        "rlm.formats.records._columns",
        ["rlm/formats/records/_columns.c"],
        depends=["rlm/formats/records/_columns_wire.h", "rlm/formats/records/_columns_objects.h"],
        extra_compile_args=_CFLAGS,
        optional=True,
    ),
    # The v2 batch-header walk + CRC-32C behind iter_batches (docs/scan.md)
    Extension(
        "rlm.formats.records._scan",
        ["rlm/formats/records/_scan.c"],
        depends=["rlm/formats/records/_scan_crc.h"],
        extra_compile_args=[*_CFLAGS, "-Wno-missing-field-initializers", "-Wno-cast-function-type"],
        optional=True,
    ),
]

setup(ext_modules=EXTENSIONS)
