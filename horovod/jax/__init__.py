"""Home of Horovod on JAX arrays.

The public API (`import horovod.jax as hvd`) arrives with the JAX issue; until then this package
holds only `_bridge`, the piece that moves JAX arrays to and from the host buffers the core
reduces, which `horovod.keras` already uses on Keras' jax backend.
"""
