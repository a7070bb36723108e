"""Preference pairs in TRL's format to token ids and completion masks, for
`scripts/tokenize_text.py --preference` (docs/reference.md, "Preference data").

    renderer = PairRenderer(chat_template.load_tokenizer("DIR/tokenizer.json"))
    pair = to_pair(record)                            # prompt, chosen, rejected: message lists
    prompt_len, sequences = renderer.render(pair)     # [(ids, mask) of chosen, of rejected]

A record is one of TRL's preference forms:
  conversational  'prompt', 'chosen' and 'rejected' lists of messages (the prompt ending with the
                  user's turn, the completions holding the assistant's);
  strings         'prompt', 'chosen' and 'rejected' strings: a user message and the assistant's
                  answers (as --chat reads a prompt and a completion), rendered with the template;
  implicit        'chosen' and 'rejected' whole conversations: the prompt is the messages they
                  share from the start (TRL's extract_prompt; a 'prompt' that is not a list of
                  messages is ignored then, as TRL's maybe_extract_prompt ignores it).

The tokens are counted as TRL's DPOTrainer counts them: the prompt rendered with the generation
prompt is `prompt_ids`; each sequence is the prompt and one completion rendered as one
conversation (apply_chat_template(prompt + chosen)); its completion is every token after
`prompt_ids`: the assistant's text, its end-of-turn token, and whatever the template writes after
that (ChatML's newline). The mask is 0 on the prompt's tokens and 1 on the completion's (TRL's
`completion_mask`). Where TRL warns that `prompt_ids` is not a prefix of the sequence, this is an
error. Too long (--max-tokens N): TRL's `max_length` with truncation_mode "keep_start" cuts each
sequence to its first N tokens and drops the pairs whose prompt alone holds N or more.

Nothing here reads files or writes shards: the caller names the file and row of a PairError."""
import collections
from typing import NamedTuple

import chat_template
import numpy as np
from input_records import InputError, unit_records

FORMS = ("conversational", "strings", "implicit")
TOO_LONG = ("truncate", "drop", "error")


class PairError(Exception):
    """A record that is not a preference pair, or one the template cannot render as one; the
    message names what is wrong, the caller adds the file and row."""


class Pair(NamedTuple):
    prompt: list
    chosen: list
    rejected: list
    form: str  # one of FORMS


def _messages(value, key):
    """A list of messages, each checked as --chat checks them."""
    try:
        return [chat_template.message(m, f"{key}[{i}]") for i, m in enumerate(value)]
    except chat_template.ChatError as e:
        raise PairError(str(e)) from e


def _empty(value):
    if isinstance(value, str):
        return not value.strip()
    return not any(m["content"].strip() for m in value)


def _implicit(chosen, rejected):
    """TRL's extract_prompt on whole conversations: the prompt is their longest common start."""
    shared = 0
    while (shared < min(len(chosen), len(rejected))
           and chosen[shared] == rejected[shared]):
        shared += 1
    if shared == 0:
        raise PairError("'chosen' and 'rejected' are whole conversations (no 'prompt' list) that "
                        "share no first message: there is no prompt to take from them")
    return Pair(chosen[:shared], chosen[shared:], rejected[shared:], "implicit")


def to_pair(record):
    """The Pair of one record (see the module's docstring); raises PairError."""
    if not isinstance(record, dict):
        raise PairError(f"a JSON {type(record).__name__}, not an object with 'chosen' and "
                        "'rejected'")
    for key in ("chosen", "rejected"):
        if record.get(key) is None:
            keys = ", ".join(map(str, record)) or "none"
            raise PairError(f"no '{key}' (a preference pair has 'chosen' and 'rejected', and a "
                            f"'prompt' unless both are whole conversations; the record's keys: "
                            f"{keys})")
    chosen, rejected, prompt = record["chosen"], record["rejected"], record.get("prompt")
    kinds = (type(chosen).__name__, type(rejected).__name__)
    if kinds == ("list", "list"):
        chosen, rejected = _messages(chosen, "chosen"), _messages(rejected, "rejected")
        if isinstance(prompt, list):
            pair = Pair(_messages(prompt, "prompt"), chosen, rejected, "conversational")
            if not pair.prompt:
                raise PairError("'prompt' is an empty list of messages")
        else:
            pair = _implicit(chosen, rejected)
    elif kinds == ("str", "str"):
        if prompt is None:
            raise PairError("no 'prompt': 'chosen' and 'rejected' are strings (the implicit-prompt "
                            "form takes whole conversations, lists of messages)")
        if not isinstance(prompt, str):
            raise PairError(f"'prompt' is a {type(prompt).__name__} but 'chosen' and 'rejected' "
                            "are strings: give all three as strings or as lists of messages")
        pair = Pair([{"role": "user", "content": prompt}],
                    [{"role": "assistant", "content": chosen}],
                    [{"role": "assistant", "content": rejected}], "strings")
    else:
        raise PairError(f"'chosen' is a {kinds[0]} and 'rejected' a {kinds[1]}: both must be "
                        "strings or both lists of messages")
    for key in ("chosen", "rejected"):
        if _empty(getattr(pair, key)):
            raise PairError(f"an empty completion: '{key}' holds no text"
                            + (" after the messages it shares with the other"
                               if pair.form == "implicit" else ""))
    return pair


class PairRenderer:
    """Renders pairs with `tokenizer`'s chat template (transformers' apply_chat_template)."""

    def __init__(self, tokenizer):
        self.chat = chat_template.Renderer(tokenizer, "all")

    def _ids(self, messages, add_generation_prompt=False):
        try:
            return self.chat.ids(messages, add_generation_prompt)
        except chat_template.ChatError as e:
            raise PairError(str(e)) from e

    def render(self, pair):
        """(the prompt's tokens, [(ids, mask) of chosen, (ids, mask) of rejected]): int64 ids and
        uint8 masks, 0 on the prompt and 1 on the completion. Raises PairError."""
        prompt = self._ids(pair.prompt, add_generation_prompt=True)
        if not prompt:
            raise PairError("the chat template renders the prompt as no tokens")
        n, sequences = len(prompt), []
        for key in ("chosen", "rejected"):
            ids = self._ids(pair.prompt + getattr(pair, key))
            if ids[:n] != prompt:
                pairs = enumerate(zip(ids, prompt, strict=False))
                at = next((i for i, (a, b) in pairs if a != b), min(len(ids), n))
                raise PairError(
                    f"the prompt is not a prefix of the rendered conversation: the prompt with "
                    f"the generation prompt ({n} tokens) and the prompt with '{key}' ({len(ids)} "
                    f"tokens) differ from token {at} on, so the completion's tokens cannot be "
                    f"told from the prompt's ({pair.form} form)")
            if len(ids) == n:
                raise PairError(f"an empty completion: '{key}' renders as no tokens after the "
                                "prompt")
            mask = np.zeros(len(ids), np.uint8)
            mask[n:] = 1
            sequences.append((np.array(ids, np.int64), mask))
        return n, sequences


def fit(prompt_len, sequences, max_tokens, too_long):
    """(sequences, truncated) of a pair under --max-tokens: as they are when each holds at most
    `max_tokens` tokens (or there is no limit); else cut to their first `max_tokens` tokens
    ("truncate", unless the prompt alone holds that many), None (dropped), or a PairError
    ("error")."""
    lengths = [len(ids) for ids, _ in sequences]
    if not max_tokens or max(lengths) <= max_tokens:
        return sequences, False
    if too_long == "error":
        raise PairError(f"a pair longer than --max-tokens {max_tokens}: its chosen and rejected "
                        f"sequences hold {lengths[0]} and {lengths[1]} tokens (--too-long error; "
                        "truncate or drop cut or skip such pairs)")
    if too_long == "drop" or prompt_len >= max_tokens:
        return None, False
    return [(ids[:max_tokens], mask[:max_tokens]) for ids, mask in sequences], True


# --- The workers of tokenize_text.py --preference ----------------------------------------------
_renderer = None  # this process's PairRenderer
_limit = (None, "truncate")  # --max-tokens, --too-long


def init_worker(tokenizer_path, template_path, max_tokens, too_long):
    global _renderer, _limit
    _renderer = PairRenderer(chat_template.load_tokenizer(tokenizer_path, template_path))
    _limit = (max_tokens, too_long)


def pair_unit(unit):
    """(ids, mask, sequence lengths, counts) of the pairs of a records unit: each kept pair's
    chosen sequence, then its rejected one."""
    ids, masks, counts = [], [], collections.Counter()
    for where, record in unit_records(unit):
        try:
            pair = to_pair(record)
            prompt_len, sequences = _renderer.render(pair)
            sequences, truncated = fit(prompt_len, sequences, *_limit)
        except PairError as e:
            raise InputError(f"{where}: {e}") from e
        if sequences is None:
            counts["dropped"] += 1
            continue
        counts.update({"pairs": 1, pair.form: 1, "truncated": int(truncated)})
        for key, (seq, mask) in zip(("chosen", "rejected"), sequences, strict=True):
            ids.append(seq)
            masks.append(mask)
            counts["tokens"] += len(seq)
            counts[f"{key} targets"] += int(mask.sum())
    lengths = [len(i) for i in ids]
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.uint8), lengths, counts
    return np.concatenate(ids), np.concatenate(masks), lengths, counts


def summary(name, counts, max_tokens, too_long):
    """The line tokenize_text.py prints after --preference."""
    targets = counts["chosen targets"] + counts["rejected targets"]
    share = 100 * targets / max(1, counts["tokens"])
    limit = f" (--max-tokens {max_tokens}, --too-long {too_long})" if max_tokens else ""
    return (f"{name}: {counts['pairs']} pairs ({counts['conversational']} conversational, "
            f"{counts['strings']} of strings, {counts['implicit']} with an implicit prompt), "
            f"{counts['tokens']} tokens in {2 * counts['pairs']} sequences of which {targets} "
            f"completion tokens ({share:.1f}%: chosen {counts['chosen targets']}, rejected "
            f"{counts['rejected targets']}); {counts['truncated']} truncated, "
            f"{counts['dropped']} dropped{limit}")
