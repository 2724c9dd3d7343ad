"""A plain-PyTorch stand-in for ``sgl_kernel`` on CPU hosts where the real one cannot load.

- ``ops/``: the CPU ops SGLang's CPU path calls (attention, KV-cache locations, EAGLE tree
  building, verify and sampling), written in plain PyTorch and registered as
  ``torch.ops.sgl_kernel.*``.
- ``import_root/sgl_kernel/``: a package named ``sgl_kernel`` exposing them under the names
  SGLang imports; ``import_root`` is what goes on ``sys.path``/``PYTHONPATH``.
- ``shim.py``: decides whether that import root is needed, and activates it.

Kept light on purpose: importing this package imports no torch, so ``shim`` can decide
before anything else is loaded.
"""
