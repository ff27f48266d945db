"""ckfmha kernel generator: arch_specs.json -> validated kernel configs -> instance sources.

Run as ``python -m generator`` from the repository root. The same directory is installed as
``ckfmha._generator`` so the runtime JIT can reuse it; every import inside it is therefore
relative.
"""
