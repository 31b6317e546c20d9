#!/usr/bin/env python3
"""Tokenizes text files into a token file for `oom train --data` (llm.c's layout).

    python scripts/tokenize.py --tokenizer DIR_OR_tokenizer.json --out tokens.bin [--append-eos] TEXTFILES...

The tokenizer is a model's own tokenizer.json (a checkpoint folder holding one, or the file), run
with the `tokenizers` library. Each input file is one document, except a .jsonl file, whose lines
are documents (their "text" field). Documents are separated by the tokenizer's EOS id when it has
one (from tokenizer_config.json's eos_token, config.json's eos_token_id, or a common EOS token such
as <|endoftext|> or </s>); with --append-eos every document, the last included, ends with it.

Output (backend/io/token_file.h): 256 little-endian int32 (magic 20240520, version, token count),
then the tokens: version 1 stores uint16 (vocabularies up to 65,536 entries), version 2 uint32. The
file is written atomically (a temporary file in the same folder, fsync, rename). Prints one line:
the token count, the version and the EOS id.
"""
import os
import sys

# This file's folder would shadow the standard library's `tokenize` module (imported by linecache,
# inspect and others): take it off the module path before importing anything else.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse  # noqa: E402
import array  # noqa: E402
import json  # noqa: E402
import struct  # noqa: E402
import tempfile  # noqa: E402

MAGIC = 20240520
HEADER_INTS = 256
UINT16_VOCAB = 65536
COMMON_EOS = ["<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "</s>", "<eos>", "<|eot_id|>"]


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def load_tokenizer(path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        fail("the `tokenizers` library is not installed (pip install tokenizers)")
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        fail(f"{file}: no tokenizer.json")
    try:
        return Tokenizer.from_file(file), folder
    except Exception as e:  # the library raises plain Exceptions for malformed files
        fail(f"{file}: not a tokenizer.json: {e}")


def eos_id(tokenizer, folder):
    """The EOS id: tokenizer_config.json's eos_token, config.json's eos_token_id, or a common token."""
    try:
        with open(os.path.join(folder, "tokenizer_config.json")) as f:
            token = json.load(f).get("eos_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
            return tokenizer.token_to_id(token)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(folder, "config.json")) as f:
            ids = json.load(f).get("eos_token_id")
        if isinstance(ids, list) and ids:
            ids = ids[0]
        if isinstance(ids, int) and ids >= 0:
            return ids
    except (OSError, ValueError):
        pass
    for token in COMMON_EOS:
        if tokenizer.token_to_id(token) is not None:
            return tokenizer.token_to_id(token)
    return None


def documents(path):
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError):
                    fail(f"{path}: line {n}: not a JSON object with a \"text\" field")
                yield text
    else:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()


def write_atomically(path, header, tokens):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tokens-", dir=folder)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the file is data like any other
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            if sys.byteorder != "little":
                tokens.byteswap()
            tokens.tofile(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", required=True, help="a folder holding tokenizer.json, or the file")
    parser.add_argument("--out", required=True, help="the token file to write")
    parser.add_argument("--append-eos", action="store_true", help="end every document with EOS, the last included")
    parser.add_argument("texts", nargs="+", help="text files (one document each) or .jsonl files (a document per line)")
    args = parser.parse_args(argv)

    tokenizer, folder = load_tokenizer(args.tokenizer)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    eos = eos_id(tokenizer, folder)
    if args.append_eos and eos is None:
        fail(f"{args.tokenizer}: --append-eos, but the tokenizer has no EOS token")
    version = 1 if vocab <= UINT16_VOCAB else 2
    ids = []
    first = True
    for path in args.texts:
        if not os.path.isfile(path):
            fail(f"{path}: no such text file")
        for text in documents(path):
            if not first and eos is not None and not args.append_eos:
                ids.append(eos)
            ids.extend(tokenizer.encode(text, add_special_tokens=False).ids)
            if args.append_eos:
                ids.append(eos)
            first = False
    if len(ids) >= 2**31:
        fail(f"{args.out}: {len(ids)} tokens, above the format's 2^31 - 1")
    if version == 1 and ids and max(ids) >= UINT16_VOCAB:
        version = 2  # an id beyond the declared vocabulary: keep it rather than truncate it
    tokens = array.array("H" if version == 1 else "I", ids)
    header = struct.pack(f"<{HEADER_INTS}i", MAGIC, version, len(ids), *([0] * (HEADER_INTS - 3)))
    write_atomically(args.out, header, tokens)
    print(f"{args.out}: {len(ids)} tokens, version {version} ({'uint16' if version == 1 else 'uint32'}), "
          f"vocabulary {vocab}, EOS {eos if eos is not None else 'none'}")


if __name__ == "__main__":
    main()
