"""Pure binary formats: bytes/memoryview in, frozen dataclasses out. No file or network I/O."""
