"""The pipeline's stages, one module each: values in, values out; no HTTP."""
