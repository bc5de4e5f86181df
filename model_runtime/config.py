"""The Dream / DiffuCoder ``config.json``, parsed once into a frozen dataclass with the HF key names.

Fields that define the architecture are required: a checkpoint that leaves them out is broken, and
silently falling back to ``configuration_dream.py``'s defaults (a 32-layer, 4096-wide model) would load
the wrong shapes. Keys we do not use (``architectures``, ``transformers_version``, ...) are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_runtime.errors import ConfigError

# Keys that must be present, with the Python type each must have.
_REQUIRED: dict[str, type] = {
    "hidden_size": int,
    "intermediate_size": int,
    "num_hidden_layers": int,
    "num_attention_heads": int,
    "num_key_value_heads": int,
    "vocab_size": int,
    "rms_norm_eps": float,
    "rope_theta": float,
    "max_position_embeddings": int,
    "mask_token_id": int,
    "pad_token_id": int,
    "eos_token_id": int,
}


# Upper bounds far above any published model (DiffuCoder-7B: 3584 hidden, 18944 MLP, 28 layers, 28 heads,
# 152064 tokens, 131072 positions) and far below sizes that would exhaust memory while the model is built.
SIZE_LIMITS = {
    "hidden_size": 65_536,
    "intermediate_size": 524_288,
    "num_hidden_layers": 1_024,
    "num_attention_heads": 1_024,
    "num_key_value_heads": 1_024,
    "vocab_size": 4_194_304,
    "max_position_embeddings": 4_194_304,
}


@dataclass(frozen=True)
class DreamConfig:
    """Architecture and special ids of a Dream-family checkpoint (HF ``config.json`` names)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    mask_token_id: int
    pad_token_id: int
    eos_token_id: int
    bos_token_id: int | None = None
    model_type: str = "Dream"
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    rope_scaling: None = None
    attention_dropout: float = 0.0
    torch_dtype: str = "bfloat16"

    @property
    def head_dim(self) -> int:
        # Not a config field: modeling_dream.py computes hidden_size // num_attention_heads.
        return self.hidden_size // self.num_attention_heads

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    def param_count(self) -> int:
        d, f, v, n = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_hidden_layers
        kv = self.num_key_value_heads * self.head_dim
        attn = d * d + d + 2 * (d * kv + kv) + d * d
        layer = attn + 3 * d * f + 2 * d
        heads = v * d * (1 if self.tie_word_embeddings else 2)
        return n * layer + heads + d

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DreamConfig:
        """Validate ``raw`` (a parsed config.json); every problem names its key."""
        if not isinstance(raw, dict):
            raise ConfigError("<root>", f"expected a JSON object, got {type(raw).__name__}")
        model_type = raw.get("model_type")
        if model_type is None:
            raise ConfigError("model_type", 'missing (a DiffuCoder/Dream checkpoint has "Dream")')
        if model_type != "Dream":
            raise ConfigError("model_type", f'expected "Dream", got {model_type!r}')
        values: dict[str, Any] = {"model_type": model_type}
        for key, kind in _REQUIRED.items():
            if key not in raw:
                raise ConfigError(key, "missing")
            values[key] = _typed(key, raw[key], kind)
        for key in ("bos_token_id",):
            if raw.get(key) is not None:
                values[key] = _typed(key, raw[key], int)
        if "hidden_act" in raw:
            if raw["hidden_act"] != "silu":
                raise ConfigError("hidden_act", f'only "silu" is supported, got {raw["hidden_act"]!r}')
        if "tie_word_embeddings" in raw:
            if not isinstance(raw["tie_word_embeddings"], bool):
                raise ConfigError(
                    "tie_word_embeddings", f"must be true or false, got {raw['tie_word_embeddings']!r}"
                )
            values["tie_word_embeddings"] = raw["tie_word_embeddings"]
        if raw.get("rope_scaling") is not None:
            raise ConfigError(
                "rope_scaling", f"only the default RoPE (null) is supported, got {raw['rope_scaling']!r}"
            )
        if raw.get("use_mrope"):
            raise ConfigError("use_mrope", "multimodal RoPE is not supported")
        if raw.get("use_sliding_window"):
            raise ConfigError(
                "use_sliding_window", "sliding-window attention is not supported by Dream models"
            )
        if "attention_dropout" in raw:
            values["attention_dropout"] = _typed("attention_dropout", raw["attention_dropout"], float)
        if isinstance(raw.get("torch_dtype"), str):
            values["torch_dtype"] = raw["torch_dtype"]
        cfg = cls(**values)
        cfg._check()
        return cfg

    def _check(self) -> None:
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "max_position_embeddings",
        ):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"must be >= 1, got {getattr(self, key)}")
            # Checked before anything is allocated or built per layer: a corrupt or hostile config.json
            # must not grow memory without bound.
            if getattr(self, key) > SIZE_LIMITS[key]:
                raise ConfigError(
                    key, f"{getattr(self, key)} is beyond any supported model (at most {SIZE_LIMITS[key]:,})"
                )
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                "num_attention_heads",
                f"{self.num_attention_heads} does not divide hidden_size {self.hidden_size}",
            )
        if self.head_dim % 2:
            raise ConfigError("num_attention_heads", f"head_dim {self.head_dim} must be even for RoPE")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                "num_key_value_heads",
                f"{self.num_key_value_heads} does not divide num_attention_heads {self.num_attention_heads}",
            )
        if not (self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps)):
            raise ConfigError("rms_norm_eps", f"must be > 0, got {self.rms_norm_eps}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ConfigError("rope_theta", f"must be > 0, got {self.rope_theta}")
        for key in ("mask_token_id", "pad_token_id", "eos_token_id", "bos_token_id"):
            value = getattr(self, key)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ConfigError(key, f"{value} is outside the vocabulary [0, {self.vocab_size})")


# The published apple/DiffuCoder-7B-Instruct config.json: the shapes behind the memory tables in
# docs/multi-host.md and docs/quantization.md and the 7B-shaped benchmarks (scripts/bench_7b_shapes.py).
DIFFUCODER_7B: dict[str, Any] = {
    "architectures": ["DreamModel"],
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "mask_token_id": 151666,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "Dream",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "pad_token_id": 151643,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.3",
    "use_cache": False,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}


def _typed(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        raise ConfigError(key, f"must be a number, got {value!r}")
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    raise ConfigError(key, f"must be a number, got {value!r}")


def load_config(model_dir: str | Path) -> DreamConfig:
    """Read and validate ``model_dir/config.json``."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError("<file>", f"no config.json in {model_dir}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("<file>", f"{path} is not valid JSON: {exc}") from None
    except RecursionError:  # nested deeper than the parser's stack: no config is shaped like that
        raise ConfigError("<file>", f"{path} is nested too deep to be a model config") from None
    return DreamConfig.from_dict(raw)
