"""Reference fixtures for the Hugging Face parity tests (tests/backend/hf_parity_test.cc).

For each architecture, creates a tiny random model with `transformers` (no hub access), saves it
with save_pretrained (safetensors, FP32), and computes on CPU, on a fixed token batch, in FP64 (the
exact values the FP32 backend is held against): logits, the mean next-token cross-entropy, the
router's load-balancing auxiliary loss, and the gradients of the loss and of the auxiliary loss
with respect to every parameter. The same gradients computed by transformers in FP32 give each
parameter's FP32 rounding error (reference.json "fp32_grad_error": |g32 - g64| / |g64|), so a
test can tell a mismatch from the rounding the reference itself shows. They go into
DIR/ARCH/reference.safetensors beside the checkpoint:

  tokens [B, S] int64, targets [B, S] int64, logits [B, S, V], loss [], aux_loss [],
  grad.<parameter name>, aux_grad.<parameter name> (transformers' in-memory parameter names:
  fused expert tensors, where the saved checkpoint has one tensor per expert)

Usage: hf_reference.py OUT_DIR [ARCH ...]   (default: every architecture)
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

B, S = 2, 24


def tiny_configs():
    common = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  output_router_logits=True, router_aux_loss_coef=0.01)
    deepseek = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=3,
                    q_lora_rank=32, kv_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                    n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=16,
                    n_shared_experts=2, intermediate_size=48, first_k_dense_replace=1, routed_scaling_factor=2.5,
                    norm_topk_prob=True, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    scoring_func="sigmoid", topk_method="noaux_tc",
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    gdn = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
               linear_conv_kernel_dim=4)
    return {
        # Qwen3.5 / Qwen3.6 MoE: Gated DeltaNet + gated attention, zero-centred RMSNorm, shared expert.
        "qwen3_5_moe": transformers.Qwen3_5MoeTextConfig(
            **common, **gdn, num_hidden_layers=4,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
        # Qwen3-Next: the same layers with the interleaved q/k/v/z and b/a projections.
        "qwen3_next": transformers.Qwen3NextConfig(
            **common, **gdn, num_hidden_layers=4, full_attention_interval=2,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
        # Qwen3-MoE: softmax attention with q/k norm, routed experts only (top-k not renormalised here).
        "qwen3_moe": transformers.Qwen3MoeConfig(
            **common, num_hidden_layers=3, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        # Mixtral: sliding-window attention in every layer, eight experts, YaRN-free RoPE.
        "mixtral": transformers.MixtralConfig(
            **common, num_hidden_layers=3, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=8, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        # Qwen3-MoE with YaRN RoPE scaling (factor 4 over 128 original positions).
        "qwen3_moe_yarn": transformers.Qwen3MoeConfig(
            **common, num_hidden_layers=2, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 128}),
        # Gemma 4 (the 26B-A4B layer structure): sliding and global layers with their own KV heads,
        # head dim, K = V and "proportional" RoPE; sandwich norms around attention, the dense MLP,
        # the experts and their sum; the scaled router with per-expert scales; tied embeddings
        # scaled by sqrt(h); final logit softcap (5, small enough to bend these logits).
        "gemma4": transformers.Gemma4TextConfig(
            vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True, num_hidden_layers=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            sliding_window=8, intermediate_size=48, enable_moe_block=True, num_experts=8, top_k_experts=2,
            moe_intermediate_size=32, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
            final_logit_softcapping=5.0, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0}}),
        # DeepSeek-V3 (the Kimi-K2 layer structure): latent attention with a query latent, a dense first
        # layer, sigmoid routing over 4 groups of 2 experts (the best 2 groups, 3 experts per token) with
        # the selection bias, renormalized and scaled top-k weights, an ungated shared expert of 2 experts'
        # width. scoring_func and topk_method are written into config.json as DeepSeek's own configs have them.
        "deepseek_v3": transformers.DeepseekV3Config(**deepseek),
        # The same without the query latent (q_proj, as DeepSeek-V2-Lite) and with YaRN RoPE, whose
        # mscale_all_dim scales the softmax and whose mscale / mscale_all_dim scales cos and sin.
        "deepseek_v3_yarn": transformers.DeepseekV3Config(**dict(
            deepseek, q_lora_rank=None, num_hidden_layers=2,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
                             "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0})),
    }


def randomize(model, seed):
    """Every parameter N(0, 0.05²) (norms and scales 1 ± N(0, 0.05²) where they multiply by w,
    N(0, 0.05²) where by 1 + w), so no weight sits at a special value that would hide a layout mistake;
    Gemma 4's layer_scalar buffers U(0.5, 1.5), DeepSeek's selection biases N(0, 0.1²)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.05
            if name.endswith("scale"):
                p.copy_(1 + noise)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 15 + 1))
            elif "norm" in name and p.dim() == 1 and float(p.abs().mean()) > 0.5:
                p.copy_(1 + noise)
            elif "norm" in name and p.dim() == 1:
                p.copy_(noise)
            else:
                p.copy_(noise * (2.0 if p.dim() == 1 else 1.0))


def make(arch, config, out_dir, seed):
    torch.manual_seed(seed)
    config.torch_dtype = torch.float32
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="eager",
                                                          experts_implementation="eager")
    randomize(model, seed)
    folder = os.path.join(out_dir, arch)
    model.save_pretrained(folder, safe_serialization=True)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, (B, S + 1), generator=g)
    tokens, targets = ids[:, :S].contiguous(), ids[:, 1:].contiguous()
    model.train()

    def run(m):
        out = m(input_ids=tokens, output_router_logits=True)
        logits = out.logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        aux = out.aux_loss if getattr(out, "aux_loss", None) is not None else torch.zeros((), dtype=logits.dtype)
        params = dict(m.named_parameters())
        result = {"logits": logits, "loss": loss, "aux_loss": aux}
        for key, value in (("grad.", loss), ("aux_grad.", aux)):
            grads = (torch.autograd.grad(value, list(params.values()), retain_graph=True, allow_unused=True)
                     if value.requires_grad else [None] * len(params))
            for (name, p), g in zip(params.items(), grads):
                result[key + name] = g if g is not None else torch.zeros_like(p)
            # Buffers the checkpoint holds and the backend keeps among its parameters: no gradient.
            for name, b in m.named_buffers():
                if name.endswith("layer_scalar") or name.endswith("e_score_correction_bias"):
                    result[key + name] = torch.zeros_like(b)
        return result

    r32 = run(model)
    r64 = run(model.double())
    tensors = {"tokens": tokens, "targets": targets}
    tensors.update({k: v.detach().float().contiguous() for k, v in r64.items()})
    saved = sorted(k[len("grad."):] for k in r64 if k.startswith("grad."))
    fp32_error = {}
    for k in r64:
        if k.startswith("grad.") or k.startswith("aux_grad."):
            ref = r64[k].detach()
            fp32_error[k] = float((r32[k].detach().double() - ref).norm() / max(float(ref.norm()), 1e-30))
    save_file(tensors, os.path.join(folder, "reference.safetensors"))
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"arch": arch, "transformers": transformers.__version__, "torch": torch.__version__,
                   "router_aux_loss_coef": getattr(config, "router_aux_loss_coef", 0.0), "parameters": saved,
                   "fp32_grad_error": fp32_error}, f, indent=1)


def main():
    out_dir = sys.argv[1]
    configs = tiny_configs()
    archs = sys.argv[2:] or list(configs)
    for i, arch in enumerate(archs):
        make(arch, configs[arch], out_dir, 1000 + i)
        print(f"{arch}: {os.path.join(out_dir, arch)}")


if __name__ == "__main__":
    main()
