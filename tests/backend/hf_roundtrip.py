"""`oom eval` and `oom train` against transformers, end to end (a CTest test after hf_reference.py).

1. For every fixture architecture: `oom eval --weights DIR --data tokens.bin --seq S --json` gives
   per-sequence losses equal to transformers' causal-LM loss (labels = input_ids) on the same
   consecutive sequences, within 1e-5 relative (transformers in FP64, oom in FP32).
2. The tiny Qwen3.6-style (qwen3_5_moe), Gemma 4 and DeepSeek-V3 checkpoints train 20 steps under
   `oom train --weights DIR --data tokens.bin --save-weights OUT` with a falling loss; transformers
   loads OUT, and its per-sequence losses equal `oom eval --weights OUT` again.
3. A checkpoint that save_pretrained splits into several shards (model.safetensors.index.json)
   evaluates like its single-file original and trains under `oom train --weights`.

Usage: hf_roundtrip.py OOM_BINARY FIXTURES_DIR WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import torch
import transformers

SEQ = 16


def write_tokens(path, ids):
    header = [20240520, 1 if max(ids) < 65536 else 2, len(ids)] + [0] * 253
    width = "H" if header[1] == 1 else "I"
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(ids)}{width}", *ids))


def oom(binary, *args):
    out = subprocess.run([binary, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"oom {' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout


def reference_losses(folder, ids, seq):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager",
                                                              experts_implementation="eager")
    model.eval()
    n = len(ids) // seq
    batch = torch.tensor(ids[: n * seq]).view(n, seq)
    with torch.no_grad():
        logits = model(input_ids=batch).logits
    per_token = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                  batch[:, 1:].reshape(-1), reduction="none").view(n, seq - 1)
    return per_token.mean(1).tolist()


def check_eval(binary, folder, tokens, ids, what):
    got = json.loads(oom(binary, "eval", "--weights", folder, "--data", tokens, "--seq", str(SEQ), "--json",
                         "--device", "cpu"))
    want = reference_losses(folder, ids, SEQ)
    assert len(got["per_sequence"]) == len(want), (what, len(got["per_sequence"]), len(want))
    worst = max(abs(a - b) / abs(b) for a, b in zip(got["per_sequence"], want))
    print(f"{what}: {len(want)} sequences, oom eval vs transformers worst relative difference {worst:.2e}")
    assert worst <= 1e-5, f"{what}: oom eval differs from transformers by {worst:.3e} relative"


def main():
    binary, fixtures, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    g = torch.Generator().manual_seed(7)
    for arch in sorted(os.listdir(fixtures)):
        folder = os.path.join(fixtures, arch)
        if not os.path.exists(os.path.join(folder, "reference.safetensors")):
            continue
        vocab = json.load(open(os.path.join(folder, "config.json")))["vocab_size"]
        ids = torch.randint(0, vocab, (5 * SEQ + 3,), generator=g).tolist()  # 5 sequences and a tail
        tokens = os.path.join(work, f"{arch}.bin")
        write_tokens(tokens, ids)
        check_eval(binary, folder, tokens, ids, arch)

    # Train the Qwen3.6-style, the Gemma 4 and the DeepSeek-V3 checkpoints on a repetitive token
    # stream (learnable), save, load back.
    for arch in ("qwen3_5_moe", "gemma4", "deepseek_v3"):
        folder = os.path.join(fixtures, arch)
        vocab = json.load(open(os.path.join(folder, "config.json")))["vocab_size"]
        pattern = torch.randint(0, vocab, (24,), generator=g).tolist()
        ids = (pattern * 200)[:4000]
        tokens = os.path.join(work, f"train-{arch}.bin")
        write_tokens(tokens, ids)
        out = os.path.join(work, f"trained-{arch}")
        result = json.loads(oom(binary, "train", "--weights", folder, "--data", tokens, "--steps", "20", "--seq", "32",
                                "--batch", "4", "--lr", "3e-3", "--save-weights", out, "--json", "--device", "cpu"))
        losses = result["losses"]
        print(f"{arch} training: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
        assert len(losses) == 20 and losses[-1] < 0.5 * losses[0], losses
        held = os.path.join(work, f"eval-{arch}.bin")
        write_tokens(held, ids[: 6 * SEQ])
        check_eval(binary, out, held, ids[: 6 * SEQ], f"trained {arch}, saved and loaded back")

    # A sharded checkpoint: the same weights in several files behind an index.
    folder = os.path.join(fixtures, "qwen3_5_moe")
    sharded = os.path.join(work, "sharded")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.save_pretrained(sharded, max_shard_size="100KB")
    shards = [f for f in os.listdir(sharded) if f.endswith(".safetensors")]
    assert len(shards) > 1 and os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), shards
    vocab = json.load(open(os.path.join(folder, "config.json")))["vocab_size"]
    ids = torch.randint(0, vocab, (4 * SEQ,), generator=g).tolist()
    tokens = os.path.join(work, "sharded.bin")
    write_tokens(tokens, ids)
    check_eval(binary, sharded, tokens, ids, f"qwen3_5_moe in {len(shards)} shards")
    result = json.loads(oom(binary, "train", "--weights", sharded, "--data", tokens, "--steps", "2", "--seq", str(SEQ),
                            "--batch", "2", "--json", "--device", "cpu"))
    assert len(result["losses"]) == 2 and all(l == l and l > 0 for l in result["losses"]), result["losses"]
    print(f"sharded training: losses {result['losses']}")


if __name__ == "__main__":
    main()
