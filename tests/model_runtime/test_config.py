"""config.json parsing: HF key names, and errors that name the bad key."""

from __future__ import annotations

import pytest

from model_runtime.config import DIFFUCODER_7B, DreamConfig
from model_runtime.errors import ConfigError
from model_runtime.tiny import tiny_config


def test_published_7b_config_parses_with_derived_shapes():
    cfg = DreamConfig.from_dict(DIFFUCODER_7B)
    assert cfg.head_dim == 128 and cfg.num_groups == 7
    assert cfg.param_count() == 7_615_616_512  # the published parameter count
    with pytest.raises(AttributeError):
        cfg.hidden_size = 1  # frozen


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("model_type", "qwen2", 'model_type: expected "Dream"'),
        ("hidden_size", "big", "hidden_size: must be an integer"),
        ("num_key_value_heads", 3, "num_key_value_heads: 3 does not divide num_attention_heads 28"),
        ("num_attention_heads", 5, "num_attention_heads: 5 does not divide hidden_size"),
        ("mask_token_id", 152064, "mask_token_id: 152064 is outside the vocabulary"),
        ("rms_norm_eps", -1, "rms_norm_eps: must be > 0"),
        ("rope_scaling", {"type": "yarn"}, "rope_scaling: only the default RoPE"),
        ("hidden_act", "gelu", 'hidden_act: only "silu"'),
        ("num_hidden_layers", 0, "num_hidden_layers: must be >= 1"),
        ("tie_word_embeddings", "no", "tie_word_embeddings: must be true or false"),
    ],
)
def test_invalid_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        DreamConfig.from_dict({**DIFFUCODER_7B, key: value})
    assert info.value.key == key


@pytest.mark.parametrize(
    "key", ["hidden_size", "num_key_value_heads", "vocab_size", "rope_theta", "mask_token_id", "model_type"]
)
def test_missing_required_keys_are_named(key):
    raw = dict(DIFFUCODER_7B)
    del raw[key]
    with pytest.raises(ConfigError, match=f"{key}: missing"):
        DreamConfig.from_dict(raw)


def test_tiny_config_is_a_valid_dream_config():
    cfg = DreamConfig.from_dict(tiny_config(640, 600, 623))
    assert cfg.model_type == "Dream" and cfg.vocab_size == 640
