"""Built-in PyTorch decode engine: slot-based continuous batching over a static KV cache.

At most C = `concurrency` sequences are held at once. Each of the C slots owns a row of a
preallocated KV cache `(layers, C, kv_heads, max_len, head_dim)`; when a sequence finishes
(EOS or length) its slot is freed, and freed slots are refilled with pending prompts in
groups (`REFILL_DIVISOR`), so any training batch B runs at any decode concurrency C.

The forward pass is written here over the Hugging Face model's own modules and weights (no
copy): embeddings, per-layer q/k/v/o projections, RMSNorms, the gated MLP and the model's
rotary embedding. It covers decoder-only models of the Llama family layout (Llama, Mistral,
Qwen2 with q/k/v biases, Qwen3 with q/k norms; grouped-query attention). Other architectures
raise `NotImplementedError`; use `rollout.engine: hf` for them. Deviations from the HF
forward: no attention dropout (inference only) and no sliding-window attention.
Correctness oracle: `transformers` generate (tests compare greedy tokens and log-probs).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from rlbatch.core.timers import cuda_sync_or_none
from rlbatch.rollout.engine import (
    Rollouts,
    SamplingParams,
    keyed_uniforms,
    pack_rollouts,
    sample_next,
)

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
# Decode steps with fewer active sequences than this are counted apart (`decode_low_s`): the
# tail of a rollout, where a decode step's fixed cost is shared by few samples.
LOW_CONCURRENCY = 8
# Freed slots are refilled in groups of at least C // REFILL_DIVISOR (or with whatever prompts
# remain, or at once when nothing is decoding): a prefill is a full forward pass whose fixed
# cost is about a decode step's, and refilling each slot the moment it frees would add one
# such pass per retired sequence when B > C. A few slots idle for a few steps instead.
REFILL_DIVISOR = 8
# A decode step with at least this share of the C slots active computes all C rows (idle
# rows at position 0, their outputs dropped) instead of gathering the active rows' KV cache:
# the gather copies every active row's cache in every layer at every step, which cost more
# than the idle rows' arithmetic while most slots are busy (grouped refills leave a few
# slots idle for a few steps). Below it (the rollout's tail) the active rows are gathered.
PAD_MIN_SHARE = 0.5


def _linear(mod, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, mod.weight, mod.bias)


def _rms(norm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm with the module's weight and epsilon (Llama/Qwen `variance_epsilon`)."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    xf = x.float()
    return norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _mlp(mlp, x: torch.Tensor) -> torch.Tensor:
    """Gated MLP: down(act(gate(x)) * up(x))."""
    return _linear(mlp.down_proj, mlp.act_fn(_linear(mlp.gate_proj, x)) * _linear(mlp.up_proj, x))


class _Step:
    """Per-iteration decode bookkeeping shared by all layers."""

    __slots__ = ("bias", "full", "lockstep", "pos", "rows", "width")

    def __init__(self, rows, pos, width, bias, full, lockstep):
        self.rows, self.pos, self.width, self.bias = rows, pos, width, bias
        self.full, self.lockstep = full, lockstep


class BuiltinEngine:
    name = "builtin"

    def __init__(self, model, eos_ids: list[int], pad_id: int):
        cfg = model.config
        if cfg.model_type not in SUPPORTED:
            raise NotImplementedError(
                f"builtin engine supports {SUPPORTED}, not {cfg.model_type!r}; use engine: hf"
            )
        self.model = model
        self.core = model.model
        self.eos = {int(e) for e in eos_ids}
        self.pad_id = pad_id
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scale = self.head_dim ** -0.5

    # ---- forward over the HF modules (functional calls on their weights) ----
    def _qkv(self, a, x, cos, sin):
        """Projections + optional q/k norm + rotary. x (n, L, E) -> q (n,h,L,D), k/v (n,kv,L,D)."""
        n, L, _ = x.shape
        q = _linear(a.q_proj, x).view(n, L, self.n_heads, self.head_dim)
        k = _linear(a.k_proj, x).view(n, L, self.n_kv, self.head_dim)
        v = _linear(a.v_proj, x).view(n, L, self.n_kv, self.head_dim)
        if hasattr(a, "q_norm"):
            q, k = _rms(a.q_norm, q), _rms(a.k_norm, k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        c, s = cos[:, None], sin[:, None]  # (n, 1, L, D); s carries rotate_half's sign
        half = self.head_dim // 2
        return (q * c + q.roll(half, -1) * s, k * c + k.roll(half, -1) * s, v)

    def _attn_decode(self, a, x, cos, sin, k_cache, v_cache, st: _Step):
        """One new token per row. Manual attention over the first st.width cache positions;
        grouped-query heads are matched by reshaping q (no repeat of K/V)."""
        q, k, v = self._qkv(a, x, cos, sin)  # q (n, h, 1, D), k/v (n, kv, 1, D)
        n = q.shape[0]
        if st.lockstep is not None:  # all C slots at one position: plain slice writes
            k_cache[:, :, st.lockstep] = k[:, :, 0]
            v_cache[:, :, st.lockstep] = v[:, :, 0]
        else:
            k_cache[st.rows, :, st.pos] = k[:, :, 0]
            v_cache[st.rows, :, st.pos] = v[:, :, 0]
        keys = k_cache[:, :, : st.width] if st.full else k_cache[st.rows, :, : st.width]
        vals = v_cache[:, :, : st.width] if st.full else v_cache[st.rows, :, : st.width]
        rep = self.n_heads // self.n_kv
        qg = q.reshape(n, self.n_kv, rep, self.head_dim)  # head i -> kv head i // rep
        scores = torch.matmul(qg, keys.transpose(-1, -2)) * self.scale + st.bias  # (n,kv,rep,W)
        out = torch.matmul(torch.softmax(scores.float(), -1).to(vals.dtype), vals)
        return _linear(a.o_proj, out.reshape(n, 1, -1))

    def _attn_prefill(self, a, x, cos, sin, k_cache, v_cache, rows):
        """Right-padded prompts starting at position 0; causal masking suffices."""
        q, k, v = self._qkv(a, x, cos, sin)
        n, _, L, _ = q.shape
        k_cache[rows, :, :L] = k
        v_cache[rows, :, :L] = v
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return _linear(a.o_proj, out.transpose(1, 2).reshape(n, L, -1))

    def _forward(self, ids, cos, sin, caches, last, step=None, rows=None) -> torch.Tensor:
        """Logits (n, V) at position `last` (n,) of each row, filling the KV cache."""
        h = F.embedding(ids, self.core.embed_tokens.weight)  # (n, L, E)
        for i, layer in enumerate(self.core.layers):
            x = _rms(layer.input_layernorm, h)
            if step is not None:
                h = h + self._attn_decode(layer.self_attn, x, cos, sin, *caches[i], step)
            else:
                h = h + self._attn_prefill(layer.self_attn, x, cos, sin, *caches[i], rows)
            h = h + _mlp(layer.mlp, _rms(layer.post_attention_layernorm, h))
        if h.shape[1] > 1:
            h = h[torch.arange(h.shape[0], device=h.device), last]
        else:
            h = h[:, 0]
        return _linear(self.model.lm_head, _rms(self.core.norm, h))  # (n, V)

    # ---- scheduling ----
    @torch.inference_mode()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, concurrency: int,
                 generator: torch.Generator | None = None,
                 keys: list[int] | None = None) -> Rollouts:
        device = self.core.embed_tokens.weight.device
        # keyed sampling (engine.py): each sequence's uniforms, whatever its slot and batch
        uniforms = None if keys is None or params.greedy else \
            keyed_uniforms(keys, params.max_new_tokens)  # (N, max_new_tokens)
        sync = cuda_sync_or_none(str(device)) or (lambda: None)
        n_total = len(prompt_ids)
        C = max(1, min(concurrency, n_total))
        max_len = max(len(p) for p in prompt_ids) + params.max_new_tokens
        caches, pos_all, cos_tab, sin_tab, next_tok = self._decode_buffers(C, max_len)

        responses: list[list[int]] = [[] for _ in range(n_total)]
        logps: list[list[float]] = [[] for _ in range(n_total)]
        reasons = [""] * n_total
        slot_seq = [-1] * C  # which sequence each slot holds
        slot_pos = [0] * C  # next cache position each slot writes
        pending = 0
        prefill_s = decode_s = low_s = 0.0
        prefills = 0
        refill_group = max(1, C // REFILL_DIVISOR)
        while True:
            free = [s for s in range(C) if slot_seq[s] < 0]
            waiting = n_total - pending
            if waiting and free and (len(free) >= min(refill_group, waiting) or len(free) == C):
                sync()
                t0 = time.perf_counter()
                take = free[:waiting]
                seqs = list(range(pending, pending + len(take)))
                pending += len(take)
                toks = self._prefill(take, seqs, prompt_ids, caches, cos_tab, sin_tab, params,
                                     generator, responses, logps, device, uniforms)
                next_tok[torch.tensor(take, device=device)] = toks
                for s, q in zip(take, seqs):
                    slot_seq[s], slot_pos[s] = q, len(prompt_ids[q])
                self._retire(take, slot_seq, params, responses, reasons)
                sync()
                prefill_s += time.perf_counter() - t0
                prefills += 1
                continue
            active = [s for s in range(C) if slot_seq[s] >= 0]
            if not active:
                break
            sync()
            t0 = time.perf_counter()
            self._decode_step(active, C, slot_pos, next_tok, caches, cos_tab, sin_tab,
                              pos_all, params, generator, slot_seq, responses, logps, uniforms)
            for s in active:
                slot_pos[s] += 1
            self._retire(active, slot_seq, params, responses, reasons)
            sync()
            dt = time.perf_counter() - t0
            decode_s += dt
            if len(active) < LOW_CONCURRENCY:  # the rollout's tail: few sequences still decode
                low_s += dt
        timing = {"prefill_s": prefill_s, "decode_s": decode_s, "decode_low_s": low_s,
                  "prefills": prefills, "tokens": sum(len(r) for r in responses),
                  "concurrency": C}
        return pack_rollouts(prompt_ids, responses, logps, reasons, self.pad_id, timing)

    def _decode_buffers(self, C: int, max_len: int) -> tuple:
        """The KV cache of C slots x `max_len` positions per layer (a (K, V) pair of
        (C, kv_heads, max_len, D) tensors), the positions 0..max_len-1, the rotary cos and
        sin tables (max_len, D) with rotate_half's sign folded into sin, and the (C,) buffer
        of each slot's next input token."""
        device = self.core.embed_tokens.weight.device
        dtype = self.core.embed_tokens.weight.dtype
        caches = [tuple(torch.zeros(C, self.n_kv, max_len, self.head_dim, device=device,
                                    dtype=dtype) for _ in range(2))
                  for _ in self.core.layers]
        pos_all = torch.arange(max_len, device=device)
        cos_tab, sin_tab = self.core.rotary_emb(caches[0][0], pos_all[None])  # (1, Lmax, D)
        cos_tab, sin_tab = cos_tab[0], sin_tab[0].clone()
        # rotate_half(x) = roll(x, D/2) with the first half negated: fold the sign into sin.
        sin_tab[:, : self.head_dim // 2] *= -1
        next_tok = torch.zeros(C, dtype=torch.long, device=device)
        return caches, pos_all, cos_tab, sin_tab, next_tok

    def _decode_step(self, active, C, slot_pos, next_tok, caches, cos_tab, sin_tab, pos_all,
                     params, generator, slot_seq, responses, logps, uniforms) -> torch.Tensor:
        device = next_tok.device
        full = len(active) == C or len(active) >= PAD_MIN_SHARE * C
        padded = full and len(active) < C  # idle slots ride along at position 0
        positions = [slot_pos[s] if slot_seq[s] >= 0 else 0 for s in range(C)] if full \
            else [slot_pos[s] for s in active]
        width = max(positions) + 1
        rows = torch.tensor(active, device=device)
        pos = torch.tensor(positions, device=device)  # (n,): C rows when full
        lockstep = positions[0] if full and not padded and min(positions) == width - 1 \
            else None
        bias = torch.zeros(len(positions), 1, 1, width, device=device, dtype=cos_tab.dtype)
        bias.masked_fill_(pos_all[None, None, None, :width] > pos[:, None, None, None],
                          float("-inf"))  # (n, 1, 1, W) additive mask
        step = _Step(torch.arange(C, device=device) if full else rows, pos, width, bias, full,
                     lockstep)
        cur = next_tok if full else next_tok[rows]
        logits = self._forward(cur[:, None], cos_tab[pos][:, None], sin_tab[pos][:, None],
                               caches, None, step=step)
        if padded:
            logits = logits[rows]
        u = None if uniforms is None else uniforms[
            [slot_seq[s] for s in active], [len(responses[slot_seq[s]]) for s in active]]
        tok, lp = sample_next(logits, params, generator, u)
        if full and not padded:
            next_tok.copy_(tok)
        else:
            next_tok[rows] = tok
        for s, t, l in zip(active, tok.tolist(), lp.tolist()):
            responses[slot_seq[s]].append(t)
            logps[slot_seq[s]].append(l)
        return tok

    def _prefill(self, slots, seqs, prompt_ids, caches, cos_tab, sin_tab, params, generator,
                 responses, logps, device, uniforms) -> torch.Tensor:
        """Run new prompts (right-padded) into their slots; sample each one's first token."""
        lens = [len(prompt_ids[q]) for q in seqs]
        n, L = len(seqs), max(lens)
        ids = torch.full((n, L), self.pad_id, dtype=torch.long, device=device)
        for i, q in enumerate(seqs):
            ids[i, : lens[i]] = torch.tensor(prompt_ids[q], device=device)
        rows = torch.tensor(slots, device=device)
        last = torch.tensor(lens, device=device) - 1
        logits = self._forward(ids, cos_tab[None, :L].expand(n, L, -1),
                               sin_tab[None, :L].expand(n, L, -1), caches, last, rows=rows)
        tok, lp = sample_next(logits, params, generator,
                              None if uniforms is None else uniforms[seqs, 0])
        for q, t, l in zip(seqs, tok.tolist(), lp.tolist()):
            responses[q].append(t)
            logps[q].append(l)
        return tok

    def _retire(self, slots, slot_seq, params, responses, reasons) -> None:
        """Free slots whose sequence emitted EOS or reached max_new_tokens."""
        for s in slots:
            q = slot_seq[s]
            if q < 0:
                continue
            r = responses[q]
            if r and r[-1] in self.eos:
                reasons[q] = "eos"
            elif len(r) >= params.max_new_tokens:
                reasons[q] = "length"
            else:
                continue
            slot_seq[s] = -1
