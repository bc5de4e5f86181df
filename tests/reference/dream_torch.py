"""An eager float32 PyTorch re-statement of the published Dream model and ``diffusion_generate``.

Written from the published ``modeling_dream.py`` and ``generation_utils.py``, independently of the JAX code:
it reads the safetensors by their HF names into ``nn.Linear`` modules and runs the sampler loop the way
``generation_utils.py`` does, including the batch-averaged transfer count, ``torch.topk`` over full rows
and the inherited ``top_k=50`` default. Tests use it as the parity reference; the CPU benchmark uses it
as the baseline. Torch lives only here, never in the runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

INHERITED_TOP_K = 50  # transformers 4.x PretrainedConfig generation default, picked up by from_model_config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d, h, k = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        e = d // h
        self.h, self.k, self.e = h, k, e
        self.input_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d, c["rms_norm_eps"])
        self.q_proj = nn.Linear(d, h * e, bias=True)
        self.k_proj = nn.Linear(d, k * e, bias=True)
        self.v_proj = nn.Linear(d, k * e, bias=True)
        self.o_proj = nn.Linear(h * e, d, bias=False)
        self.gate_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(d, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, n, _ = x.shape
        r = self.input_layernorm(x)
        q = self.q_proj(r).view(b, n, self.h, self.e).transpose(1, 2)
        k = self.k_proj(r).view(b, n, self.k, self.e).transpose(1, 2)
        v = self.v_proj(r).view(b, n, self.k, self.e).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = self.h // self.k  # repeat_kv: each kv head repeated g times consecutively
        k = k[:, :, None].expand(b, self.k, g, n, self.e).reshape(b, self.h, n, self.e)
        v = v[:, :, None].expand(b, self.k, g, n, self.e).reshape(b, self.h, n, self.e)
        a = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask if isinstance(mask, torch.Tensor) else None,
            dropout_p=0.0,
            is_causal=False,
        )
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, n, self.h * self.e))
        r = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(r)) * self.up_proj(r))


class DreamReference(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> DreamReference:
        model_dir = Path(model_dir)
        c = json.loads((model_dir / "config.json").read_text())
        m = cls(c)
        sd = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            sd.update(load_file(str(f)))
        own = {}
        for name, w in sd.items():
            key = name.removeprefix("model.")
            key = key.replace("self_attn.", "").replace("mlp.", "")
            own[key] = w.float()
        m.load_state_dict(own, strict=True)
        return m.eval()

    def forward(self, input_ids, attention_mask="full", position_ids=None):
        """``attention_mask``: "full"/None or a bool [B, 1, L, L] (True = attend), as DreamModel takes it."""
        b, n = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(n)[None].expand(b, n)
        e = self.c["hidden_size"] // self.c["num_attention_heads"]
        inv_freq = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, e, 2, dtype=torch.int64).float() / e))
        freqs = (inv_freq[None, :, None] @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        x = self.embed_tokens(input_ids)
        cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]
        for layer in self.layers:
            x = layer(x, cos, sin, attention_mask)
        return self.lm_head(self.norm(x))


# -- the published sampler -----------------------------------------------------------------------------


def top_p_logits(logits, top_p):
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
    mask = torch.zeros_like(logits, dtype=torch.bool)
    mask = mask.scatter_(-1, sorted_indices, sorted_indices_to_remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_logits(logits, top_k):
    top_k = min(top_k, logits.size(-1))
    indices_to_remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(indices_to_remove, torch.finfo(logits.dtype).min)


def sample_tokens(
    logits, temperature=0.0, top_p=None, top_k=None, margin_confidence=False, neg_entropy=False
):
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_logits(logits, top_p)
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        try:
            x0 = torch.distributions.Categorical(probs=probs).sample()
            confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
        except Exception:
            confidence, x0 = probs.max(dim=-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if margin_confidence:
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = sorted_probs[:, 0] - sorted_probs[:, 1]
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


def prepare(input_ids, attention_mask, max_new_tokens, mask_id):
    """The canvas, 4-D mask and ``tok_idx`` exactly as ``_sample`` builds them (left padding)."""
    max_length = input_ids.shape[1] + max_new_tokens
    x = F.pad(input_ids, (0, max_length - input_ids.shape[1]), value=mask_id)
    if attention_mask is not None and torch.any(attention_mask == 0.0):
        attention_mask = F.pad(attention_mask, (0, max_length - attention_mask.shape[1]), value=1.0)
        tok_idx = attention_mask.long().cumsum(-1) - 1
        tok_idx.masked_fill_(attention_mask == 0, 1)
        attention_mask = torch.logical_and(
            attention_mask.unsqueeze(1).unsqueeze(-2), attention_mask.unsqueeze(1).unsqueeze(-1)
        )
    else:
        tok_idx, attention_mask = None, "full"
    return x, attention_mask, tok_idx


@torch.no_grad()
def step(
    model,
    x,
    attention_mask,
    tok_idx,
    i,
    *,
    steps,
    eps=1e-3,
    alg="entropy",
    temperature=0.0,
    top_p=None,
    top_k=INHERITED_TOP_K,
    alg_temp=None,
    mask_id,
):
    """One iteration of the published loop on canvas ``x``; returns (new x, full_confidence, count)."""
    x = x.clone().long()
    timesteps = torch.linspace(1, eps, steps + 1)
    mask_index = x == mask_id
    logits = model(x, attention_mask, tok_idx)
    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    mask_logits = logits[mask_index]
    t, s = timesteps[i], timesteps[i + 1]
    full_confidence, number_transfer_tokens = None, None
    if alg == "origin":
        p_transfer = 1 - s / t if i < steps - 1 else 1
        x0 = torch.zeros_like(x[mask_index], dtype=torch.long) + mask_id
        transfer_index_t_s = torch.rand(*x0.shape) < p_transfer
        _, x0[transfer_index_t_s] = sample_tokens(
            mask_logits[transfer_index_t_s], temperature=temperature, top_p=top_p, top_k=top_k
        )
        x[mask_index] = x0.clone()
    else:
        kw = {
            "maskgit_plus": {},
            "topk_margin": {"margin_confidence": True},
            "entropy": {"neg_entropy": True},
        }
        if alg not in kw:
            raise RuntimeError(f"Unknown alg: {alg}")
        confidence, x0 = sample_tokens(mask_logits, temperature, top_p=top_p, top_k=top_k, **kw[alg])
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        number_transfer_tokens = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full_confidence[mask_index] = confidence
        if number_transfer_tokens > 0:
            if alg_temp is None or alg_temp == 0:
                _, transfer_index = torch.topk(full_confidence, number_transfer_tokens)
            else:
                full_confidence = full_confidence / alg_temp
                full_confidence = F.softmax(full_confidence, dim=-1)
                transfer_index = torch.multinomial(full_confidence, num_samples=number_transfer_tokens)
            x_ = torch.zeros_like(x, dtype=torch.long) + mask_id
            x_[mask_index] = x0.clone()
            row_indices = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer_index)
            x[row_indices, transfer_index] = x_[row_indices, transfer_index]
    return x, full_confidence, number_transfer_tokens


def diffusion_generate(model, input_ids, attention_mask=None, *, max_new_tokens, steps, mask_id, **kw):
    """The whole loop; returns (sequences, history) with ``output_history=True`` semantics."""
    x, mask4, tok_idx = prepare(input_ids, attention_mask, max_new_tokens, mask_id)
    history = []
    for i in range(steps):
        x, _, _ = step(model, x, mask4, tok_idx, i, steps=steps, mask_id=mask_id, **kw)
        history.append(x.clone())
    return x, history


def transfer_counts(n_masks: int, steps: int, eps: float = 1e-3) -> list[int]:
    """The per-step counts the published formula gives for a batch whose rows hold ``n_masks`` masks."""
    timesteps = torch.linspace(1, eps, steps + 1)
    mask_count = torch.tensor(n_masks)
    counts = []
    for i in range(steps):
        t, s = timesteps[i], timesteps[i + 1]
        num_mask_token = mask_count * 1 / 1
        k = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        counts.append(k)
        mask_count = mask_count - k
    return counts
