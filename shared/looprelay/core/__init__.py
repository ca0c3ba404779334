"""The pure core: values in, decisions out; no I/O, no clock, no randomness."""
