"""One decoder layer of a catalog model on random weights: its operators, a whole layer and a whole iteration, as
closures a backend (profiles.backends) runs and a timer (profiles.timing) times."""
from __future__ import annotations

from costmodels.profile_data import MIXED_MODES


class Layer:
    """The weights and the operator closures of one tensor-parallel shard of one decoder layer. With an engine
    backend the layer runs as an engine does: fused residual-add + RMSNorm, rotary in place on the QKV output, new K/V
    written into a packed cache, one attention call over the packed batch, fused SiLU-and-mul."""

    def __init__(self, model, tp, be, max_ctx, pool_tokens: int | None = None):
        model.check_tp(tp, "--tp")
        self.m, self.be, self.tp = model, be, tp
        self.heads, self.kv_heads, self.d = model.heads // tp, model.kv_heads_per_gpu(tp), model.head_dim
        h, q, kv = model.hidden, self.heads * self.d, self.kv_heads * self.d
        f = model.ffn // tp
        self.w_norm = be.randn(h) + 1
        self.w_qkv, self.w_o = be.randn(h, q + 2 * kv), be.randn(q, h)
        self.w_up, self.w_down = be.randn(h, (2 if model.gated_mlp else 1) * f), be.randn(f, h)
        self.emb = be.randn(model.vocab, h)
        self.w_lm = be.randn(h, model.vocab // tp)
        # A KV pool several contexts long (engine: long enough for the largest batch's requests side by side):
        # requests read different rows, so decode timings are not served from cache.
        self.pool = max(4 * max_ctx, pool_tokens or 0)
        self.kcache, self.vcache = be.randn(self.pool, self.kv_heads, self.d), be.randn(self.pool, self.kv_heads, self.d)
        self.q_w, self.kv_w, self.f = q, kv, f
        self.max_ctx = max_ctx
        if be.engine:
            torch = be.torch
            for impl in {id(a): a for a in [be.attn] + be.decode_candidates}.values():
                impl.heads = self.heads      # chosen on a small test batch; this layer's head count from here on
            self.cos, self.sin = be.randn(max_ctx, self.d // 2), be.randn(max_ctx, self.d // 2)
            self.gemm = {name: self._linear(w) for name, w in
                         (("qkv", self.w_qkv), ("o", self.w_o), ("up", self.w_up), ("down", self.w_down))}
            self.gemm["lm"] = lambda x, w=self.w_lm: x @ w    # FP8 checkpoints keep lm_head in 16 bits
            self._torch = torch
        else:
            mm = be.matmul
            self.gemm = {"qkv": lambda x: mm(x, self.w_qkv), "o": lambda x: mm(x, self.w_o),
                         "up": lambda x: mm(x, self.w_up), "down": lambda x: mm(x, self.w_down),
                         "lm": lambda x: mm(x, self.w_lm)}

    def _linear(self, w):
        if getattr(self.be, "fp8", False):
            return self.be.ops.Fp8Linear(self.be.torch, w)
        return lambda x: x @ w

    def inputs(self, n):
        be = self.be
        x = be.randn(n, self.m.hidden)
        t = dict(x=x, qkv=self.gemm["qkv"](x), attn=be.randn(n, self.q_w),
                 up=be.randn(n, self.w_up.shape[1]), act=be.randn(n, self.f),
                 cos=be.randn(n, 1, self.d), sin=be.randn(n, 1, self.d), ids=be.tokens(n))
        if be.engine:
            t["res"] = be.randn(n, self.m.hidden)
            t["pos"] = be.torch.arange(n, device=be.dev) % self.max_ctx
            t["slots"] = be.torch.arange(n, device=be.dev) % self.pool
        return t

    def dense_ops(self, n):
        """Closure per Vidur-named operator over n tokens."""
        be, t = self.be, self.inputs(n)
        if be.engine:
            el, F = be.el, be.F
            return {
                "input_layernorm": lambda: el.rmsnorm(t["x"], self.w_norm, t["res"]),
                "attn_pre_proj": lambda: self.gemm["qkv"](t["x"]),
                "attn_rope": lambda: self._rope_and_cache(t["qkv"], t["pos"], t["slots"]),
                "attn_post_proj": lambda: self.gemm["o"](t["attn"]),
                "post_attention_layernorm": lambda: el.rmsnorm(t["x"], self.w_norm, t["res"]),
                "mlp_up_proj": lambda: self.gemm["up"](t["x"]),
                "mlp_act": lambda: el.silu_mul(t["up"]) if self.m.gated_mlp else F.gelu(t["up"]),
                "mlp_down_proj": lambda: self.gemm["down"](t["act"]),
                "add": lambda: t["x"] + t["x"],
                "emb": lambda: F.embedding(t["ids"], self.emb),
            }
        q = t["qkv"][:, :self.q_w].reshape(n, self.heads, self.d)
        k = t["qkv"][:, self.q_w:self.q_w + self.kv_w].reshape(n, self.kv_heads, self.d)
        act = be.silu_mul if self.m.gated_mlp else be.gelu
        return {
            "input_layernorm": lambda: be.rmsnorm(t["x"], self.w_norm),
            "attn_pre_proj": lambda: be.matmul(t["x"], self.w_qkv),
            "attn_rope": lambda: be.rope(q, k, t["cos"], t["sin"]),
            "attn_post_proj": lambda: be.matmul(t["attn"], self.w_o),
            "post_attention_layernorm": lambda: be.rmsnorm(t["x"], self.w_norm),
            "mlp_up_proj": lambda: be.matmul(t["x"], self.w_up),
            "mlp_act": lambda: act(t["up"]),
            "mlp_down_proj": lambda: be.matmul(t["act"], self.w_down),
            "add": lambda: t["x"] + t["x"],
            "emb": lambda: be.embed(self.emb, t["ids"]),
        }

    def _rope_and_cache(self, qkv, pos, slots):
        """Rotary in place, then the new tokens' K and V written into the cache (vLLM's rotary_embedding and
        reshape_and_cache): the work between the QKV projection and attention, timed as one `attn_rope` row."""
        n = qkv.shape[0]
        q_w, kv_w = self.q_w, self.kv_w
        self.be.el.rope(qkv, q_w, kv_w, self.d, self.cos, self.sin, pos)
        self.kcache.index_copy_(0, slots, qkv[:, q_w:q_w + kv_w].view(n, self.kv_heads, self.d))
        self.vcache.index_copy_(0, slots, qkv[:, q_w + kv_w:].view(n, self.kv_heads, self.d))
        return qkv

    # -- attention ---------------------------------------------------------------------------------------------
    def kv_views(self, prefill, decode):
        """Each request's own K/V rows (context + chunk for prefill, m for decode), spread over the pool."""
        spans = [k + c for c, k in zip(*prefill)] + list(decode)
        out, off = [], 0
        for span in spans:
            off = off if off + span <= self.pool else 0
            out.append((self.kcache[off:off + span], self.vcache[off:off + span]))
            off += span
        return out

    def prepared(self, prefill, decode):
        return self.be.prepare(self.kv_views(prefill, decode), prefill, decode, self.heads, self.kv_heads)

    def packed(self, prefill, decode, mixed: str = "one-varlen"):
        """Engine layout: the batch's requests side by side at the start of the pool; (batch, run(q), new-token
        slots in the pool). A decode-only batch takes the fastest working attention for its shape (raced). A mixed
        batch runs as `mixed` says: 'one-varlen', one call of the general kernel over the whole batch (vLLM's
        FlashAttention backend), or 'split', the prefills through it and the decodes through the fastest decode
        kernel (FlashInfer-style backends)."""
        be = self.be
        b = be.ops.PackedBatch(be.torch, prefill, decode, be.dev)
        if b.total_k > self.pool:
            raise ValueError(f"batch needs {b.total_k} KV rows, the pool has {self.pool}")
        slots, off = [], 0
        for ql, kl in zip(b.q_lens, b.k_lens):
            slots += range(off + kl - ql, off + kl)
            off += kl
        if mixed not in MIXED_MODES:
            raise ValueError(f"mixed attention {mixed!r} is not one of {', '.join(MIXED_MODES)}")
        if not prefill[0] and len(be.decode_candidates) > 1:
            q = be.randn(b.total_q, self.heads, self.d)
            be.last_attn, run = be.ops.race(be.torch, be.decode_candidates, self.kcache, self.vcache, b, q)
        elif prefill[0] and decode and mixed == "split":
            qd = be.randn(len(decode), self.heads, self.d)
            be.last_attn, run = be.ops.split_mixed(be.torch, be.attn, be.decode_candidates, self.kcache, self.vcache,
                                                   prefill, decode, be.dev, qd)
        else:
            be.last_attn, run = be.attn.name, be.attn.prepare(self.kcache, self.vcache, b)
        return b, run, be.torch.tensor(slots, device=be.dev)

    def attention_op(self, prefill, decode, mixed: str = "one-varlen"):
        n = sum(prefill[0]) + len(decode)
        if self.be.engine:
            _, run, _ = self.packed(prefill, decode, mixed)
            qkv = self.be.randn(n, self.q_w + 2 * self.kv_w)
            q = qkv[:, :self.q_w].view(n, self.heads, self.d)
            return lambda: run(q)
        q = self.be.randn(n, self.heads, self.d)
        prep = self.prepared(prefill, decode)
        return lambda: self.be.attention(q, prep, prefill, decode)

    # -- whole layers and iterations ---------------------------------------------------------------------------
    def _engine_step(self, prefill, decode, mixed: str = "one-varlen"):
        """step(x, res) → the layer's output; res (the residual stream) is updated in place, as in vLLM."""
        be, n = self.be, sum(prefill[0]) + len(decode)
        el = be.el
        _, attn, slots = self.packed(prefill, decode, mixed)
        pos = be.torch.arange(n, device=be.dev) % self.max_ctx
        q_w = self.q_w
        act = el.silu_mul if self.m.gated_mlp else be.F.gelu

        def step(x, res):
            h = el.rmsnorm(x, self.w_norm, res)
            qkv = self._rope_and_cache(self.gemm["qkv"](h), pos, slots)
            a = attn(qkv[:, :q_w].view(n, self.heads, self.d))
            h = el.rmsnorm(self.gemm["o"](a.reshape(n, q_w)), self.w_norm, res)
            return self.gemm["down"](act(self.gemm["up"](h)))
        return step

    def forward(self, prefill, decode, mixed: str = "one-varlen"):
        """A whole layer on a mixed batch (no emb): norm, QKV, RoPE, attention, O, add, norm, MLP, add."""
        be, n = self.be, sum(prefill[0]) + len(decode)
        t = self.inputs(n)
        if be.engine:
            step = self._engine_step(prefill, decode, mixed)
            return lambda: step(t["x"], t["res"])
        act = be.silu_mul if self.m.gated_mlp else be.gelu
        prep = self.prepared(prefill, decode)

        def run():
            x = be.rmsnorm(t["x"], self.w_norm)
            qkv = be.matmul(x, self.w_qkv)
            q = qkv[:, :self.q_w].reshape(n, self.heads, self.d)
            k = qkv[:, self.q_w:self.q_w + self.kv_w].reshape(n, self.kv_heads, self.d)
            q, k = be.rope(q, k, t["cos"], t["sin"])
            a = be.attention(q, prep, prefill, decode)
            r = t["x"] + be.matmul(a.reshape(n, self.q_w), self.w_o)
            return r + be.matmul(act(be.matmul(be.rmsnorm(r, self.w_norm), self.w_up)), self.w_down)
        return run

    def iteration(self, prefill, decode, mixed: str = "one-varlen"):
        """A whole iteration on a mixed batch: embedding, every layer (this layer's weights, once per layer), the
        final norm, lm_head for the rows that sample (each prefill chunk's last token and every decode) and a
        greedy draw. One process: no all-reduce, so only tp 1 is recorded."""
        be, layers = self.be, self.m.layers
        n = sum(prefill[0]) + len(decode)
        ids = be.tokens(n)
        sample = len(prefill[0]) + len(decode)
        if be.engine:
            torch = be.torch
            step = self._engine_step(prefill, decode, mixed)
            res = be.randn(n, self.m.hidden)
            ends, off = [], 0
            for c in list(prefill[0]) + [1] * len(decode):
                off += c
                ends.append(off - 1)
            rows = torch.tensor(ends, device=be.dev)

            def run():
                x = be.F.embedding(ids, self.emb)
                for _ in range(layers):
                    x = step(x, res)
                h = be.el.rmsnorm(x, self.w_norm, res)
                return self.gemm["lm"](h.index_select(0, rows)).argmax(-1)
            return run
        step = self.forward(prefill, decode)

        def run():
            be.embed(self.emb, ids)
            for _ in range(layers):
                x = step()
            logits = be.matmul(be.rmsnorm(x[:sample], self.w_norm), self.w_lm)
            return logits.argmax(-1)
        return run
