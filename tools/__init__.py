"""The ``cachepipe`` command line, benchmark harnesses and the emulated cluster."""
