"""lpes-harness: layer-specific RoPE position scaling (LPES) for transformers models.

This module is imported at interpreter start-up (through the ``.pth`` hook), so it
must stay cheap: no torch, no transformers, no lm-eval here.
"""

__version__ = "0.1.0"
