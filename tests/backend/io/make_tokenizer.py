"""Test helper: writes a tiny WordLevel tokenizer (tokenizers library) into a folder and the ids it
gives each document, for tests/io/tokenize_test.cc.

    python make_tokenizer.py FOLDER VOCAB_SIZE TEXT...

FOLDER gets tokenizer.json (whitespace pre-tokenizer, words w0 … w{VOCAB_SIZE-2} and <|endoftext|>
as the last id) and expected.json: {"eos": id, "docs": [[ids of TEXT 1], ...]} computed by the
library itself. Exits 3 when `tokenizers` is missing (the test decides whether that fails)."""
import json
import os
import sys

try:
    from tokenizers import Tokenizer, models, pre_tokenizers
except ImportError:
    sys.exit(3)

folder, vocab_size, texts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
vocab = {f"w{i}": i for i in range(vocab_size - 2)}
vocab["<unk>"] = vocab_size - 2
vocab["<|endoftext|>"] = vocab_size - 1
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.add_special_tokens(["<|endoftext|>"])
os.makedirs(folder, exist_ok=True)
tok.save(os.path.join(folder, "tokenizer.json"))
docs = []
for t in texts:
    with open(t) as f:
        docs.append(tok.encode(f.read(), add_special_tokens=False).ids)
with open(os.path.join(folder, "expected.json"), "w") as f:
    json.dump({"eos": tok.token_to_id("<|endoftext|>"), "docs": docs}, f)
