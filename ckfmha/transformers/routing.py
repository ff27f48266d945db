"""Whether a model's attention calls reach ckfmha_attention_forward, which decides whether
its masks may be skipped."""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

from transformers.utils.import_utils import is_tracing

# Configs of models whose attention calls have reached ckfmha_attention_forward, held weakly
# (by id, checked for identity), for models that do not declare it (see _attention_routed).
_ROUTED_CONFIGS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _declares_attention_interface(config_class: type) -> bool:
    """Whether the models of this config class say that their attention goes through
    transformers' AttentionInterface (``_supports_attention_backend``, which serving
    backends rely on to swap attention in). Asked while a model runs, so its modeling
    module is loaded."""
    modeling = config_class.__module__.replace(".configuration_", ".modeling_")
    module = sys.modules.get(modeling)
    return module is not None and _module_declares(module, config_class)


@functools.cache
def _module_declares(module: Any, config_class: type) -> bool:
    return any(
        isinstance(obj, type)
        and getattr(obj, "config_class", None) is config_class
        and getattr(obj, "_supports_attention_backend", False)
        for obj in vars(module).values()
    )


def _attention_routed(config: Any) -> bool:
    """Whether the model behind ``config`` sends its attention to ckfmha_attention_forward.
    transformers accepts any registered name for any model, but some (Bloom, for one) run
    their own attention code on the masks they are given: those must get eager's masks,
    never a skipped one. A model that does not declare the interface proves it with its
    first call; until then its masks are built (correct, slower)."""
    if config is None:
        return True
    return _declares_attention_interface(type(config)) or _ROUTED_CONFIGS.get(id(config)) is config


def _record_attention_reached(config: Any) -> None:
    """Remember, outside tracing, that the model behind ``config`` has called
    ckfmha_attention_forward (see _attention_routed)."""
    if config is not None and not is_tracing():
        _ROUTED_CONFIGS[id(config)] = config
