"""A GGUF file's header, read field by field with the standard library: no numpy, no torch.

``gguf.GGUFReader`` maps the whole file and builds every metadata array (SmolLM2's ~3 MB of
vocabulary): seconds where a caller needs one key or the tensors' extent, which this reads in
milliseconds. :func:`~lpes_harness.core.scales_file.gguf_block_count` (the layer count) and
:func:`~lpes_harness.core.model_source.gguf_problem` (is a file whole) walk it through
:class:`GGUFHeader`.
"""

from __future__ import annotations

import os
import struct

# GGUF's value types: the fixed-size ones by their struct format, then the two of variable size.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
VERSIONS = (2, 3)


class CutShort(EOFError):
    """The file ends inside its header."""


class GGUFHeader:
    """Reads a header from an open binary file, past the magic ``GGUF``; ``errors``: how key and string
    bytes that are not UTF-8 decode (``"strict"`` raises UnicodeDecodeError)."""

    def __init__(self, handle, errors: str = "strict"):
        self.handle, self.errors = handle, errors

    def read(self, fmt: str):
        length = struct.calcsize(fmt)
        data = self.handle.read(length)
        if len(data) != length:
            raise CutShort
        return struct.unpack(fmt, data)[0]

    def read_string(self) -> str:
        length = self.read("<Q")
        data = self.handle.read(length)
        if len(data) != length:
            raise CutShort
        return data.decode("utf-8", errors=self.errors)

    def skip(self, count: int) -> None:
        # A seek past the end succeeds: the read after it, or the caller's size check, finds the cut.
        self.handle.seek(count, os.SEEK_CUR)

    def skip_value(self, value_type: int) -> None:
        if value_type == STRING:
            self.skip(self.read("<Q"))
        elif value_type == ARRAY:
            item_type, count = self.read("<I"), self.read("<Q")
            if item_type in SCALARS:
                self.skip(struct.calcsize(SCALARS[item_type]) * count)
            else:
                for _ in range(count):
                    self.skip_value(item_type)
        elif value_type in SCALARS:
            self.skip(struct.calcsize(SCALARS[value_type]))
        else:
            raise ValueError(f"unknown value type {value_type}")
