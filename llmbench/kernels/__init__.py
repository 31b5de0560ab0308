"""Triton kernels, each beside a pure-torch reference of the same signature.

``<name>_ref`` is the reference (any device), ``<name>`` the Triton version (CUDA, or the CPU under
``TRITON_INTERPRET=1``). Layers pick one through ``triton_kernels``; tests compare the two.
"""
