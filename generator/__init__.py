"""ckfmha kernel generator: arch_specs.json -> validated kernel configs -> instance sources.

Run as ``python -m generator``. Installing ckfmha installs this package as ``generator`` too
(an editable install maps it to this directory), so setup.py, the command line and the
first-use compiler (``ckfmha.jit``) all import it as ``generator``.
"""
