#!/usr/bin/env python3
"""tiktoken's GPT-2 encoding and a corpus that exercises it, the reference the tokenizer tests
compare with (tests/unit/tokenize_text_test.py, tests/unit/gpt2_tokenizer_test.cpp).

    gpt2_reference.py OUT.json [RANKS]
        writes {"docs": [...], "ids": [[...], ...], "whole": [...]}: tiktoken's ids of each
        document of CORPUS, and of all of them joined by a newline

The encoding is built from tiktoken_ext/openai_public.py's own gpt2() definition (pattern, special
tokens, vocabulary size), with only the ranks read from the local tiktoken-format file instead of
downloaded."""
import json
import os
import sys
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from tokenize_text import default_ranks_path  # noqa: E402  (where the bootstrap put the ranks)

CORPUS = [
    # English, contractions (lower and upper case), numbers, punctuation
    "It's a test: we'll see, they've gone, I'm here, you'd know, she's THERE'S WE'LL 'tis.\n"
    "Numbers 12345 3.14159 1,000,000 0x1F 2024-05-20 -42 +7e-3 and 100% (really!)...",
    # accents, precomposed and combining
    "Café naïve résumé Ångström façade São Paulo Kraków Ærøskøbing coöperate\n"
    "decomposed: e\u0301 n\u0303 A\u030a o\u0308\u0304 "
    "Z\u0351\u0334\u0336a\u0352\u0315l\u0316g\u0317o\u0300",
    # CJK, Korean, other scripts, digits of other scripts
    "日本語のテキスト、中文文本。한국어 텍스트입니다. Ελληνικά κείμενο Русский текст\n"
    "עברית ‏العربية ١٢٣ ٣٤٥ हिन्दी पाठ ไทยภาษา ² ³ Ⅻ ½ ᠑᠒",
    # emoji: skin tones, ZWJ families, flags, variation selectors, keycaps
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ☺︎ 1️⃣ 🏳️‍🌈 😀😃😄 🤖!",
    # code, with tabs, indentation, trailing spaces and CRLF line ends
    "def f(x):\n\tif x  >  0:   \n\t\treturn x**2  # square\n    else:\t\n        return -x\r\n\r\n"
    "int main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n"
    "  for (auto& e : v) e += 1;  \n"
    "  return v.size() == 3 ? 0 : 1;\n}\n",
    # whitespace runs of every kind, and whitespace at the end of the text
    "a  b   c    d\t\te \t \tf\n\ng\n\n\n h \n \n i   \n\t\n  j" + " " * 100 + "k\n"
    + "\t" * 20 + "end   \n\n  ",
    # Unicode spaces and separators that are (or are not) whitespace to tiktoken
    "nbsp\u00a0here ideographic\u3000space line\u2028sep para\u2029sep nel\u0085x "
    "mongolian\u180evowel \u180eafter-a-space zero\u200bwidth bom\ufeffmark "
    "thin\u2009space \u3000\u3000lead",
    # special-token text is ordinary text; control characters; apostrophes
    "<|endoftext|> is text here <|endoftext|><|endoftext|>\x00\x01\x1b[31mred\x1b[0m\x7f "
    "'s' ''s 'S 'll'LL rock'n'roll O'Brien's '' ' '",
    # long runs: a long word, a long number, a long punctuation run
    "x" * 300 + " " + "9" * 200 + " " + "=-" * 150 + " " + "ab" * 120 + " "
    + "Supercalifragilistic" * 30,
]


def reference_encoding(ranks_path):
    """tiktoken's "gpt2" encoding as tiktoken_ext.openai_public defines it, ranks from
    `ranks_path`."""
    import tiktoken
    import tiktoken.load
    from tiktoken_ext import openai_public

    ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
    with mock.patch.object(openai_public, "data_gym_to_mergeable_bpe_ranks", lambda **_: ranks):
        return tiktoken.Encoding(**openai_public.gpt2())


def main():
    ranks = sys.argv[2] if len(sys.argv) > 2 else default_ranks_path()
    enc = reference_encoding(ranks)
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump({"docs": CORPUS, "ids": [enc.encode_ordinary(d) for d in CORPUS],
                   "whole": enc.encode_ordinary("\n".join(CORPUS))}, f)


if __name__ == "__main__":
    main()
