"""Conversations to token ids and a loss mask, through transformers' own chat-template rendering
(`apply_chat_template`), for `scripts/tokenize_text.py --chat` (docs/reference.md, "Chat data").

    tokenizer = load_tokenizer("DIR/tokenizer.json", template_path=None)
    renderer = Renderer(tokenizer, train_on="assistant")
    ids, mask = renderer.render(to_messages(record))

The mask is 1 on the tokens the model is trained to write: the assistant's (each assistant turn's
tokens, through the end-of-turn token that ends it), the last assistant turn's, or every token
(`train_on`: assistant, last-assistant, all).

- A template with generation markers ({% generation %} ... {% endgeneration %}) marks the
  assistant's text itself: the mask is transformers' `return_assistant_tokens_mask`.
- Without markers, the prefix method finds each assistant turn k: the conversation up to turn k
  rendered with the generation prompt is the text before the turn, the conversation through turn
  k the text through it, and the full conversation must begin with both. The turn's text runs
  from the one's end to the other's, less whitespace after a special token that ends it (ChatML's
  newline after <|im_end|>: the model stops at <|im_end|> and never writes it). The turn must
  begin and end on token boundaries of the full conversation's ids. A template for which any of
  this fails is refused (ChatError), naming what failed.

Nothing here reads files of conversations or writes shards: the caller names the file and line of
a ChatError."""
import bisect
import os
import re

import numpy as np

# transformers' own test for a template with generation markers (render_jinja_template).
GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
TRAIN_ON = ("assistant", "last-assistant", "all")
# What --generate --chat's user message stands in for when the template is rendered once
# (chat_prompt): plain ASCII that no template trims, changes or finds special.
PLACEHOLDER = "TRAINERCHATPLACEHOLDER"


class ChatError(Exception):
    """A conversation (or a template) that cannot be tokenized; the message names what is wrong,
    the caller adds the file and line."""


def load_tokenizer(tokenizer_path, template_path=None):
    """transformers' fast tokenizer over `tokenizer_path` (a tokenizer.json), with the special
    tokens and chat template of the tokenizer_config.json or chat_template.jinja beside it, or the
    template of `template_path`. Raises ChatError when there is no template."""
    try:
        import transformers
    except ImportError:
        raise ChatError("--chat needs the transformers package (scripts/bootstrap.sh installs "
                        "it into the trainer's virtualenv)") from None
    folder = os.path.dirname(os.path.abspath(tokenizer_path))
    try:
        # The class itself, not AutoTokenizer: a tokenizer_config.json naming another class (say
        # LlamaTokenizer) must not rebuild the tokenizer the C++ side reads from the same file.
        tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(
            folder, tokenizer_file=os.path.abspath(tokenizer_path), local_files_only=True)
    except Exception as e:  # transformers raises OSError, ValueError, TypeError, ...
        raise ChatError(f"{tokenizer_path}: transformers cannot load this tokenizer "
                        f"({type(e).__name__}: {e})") from e
    if template_path is not None:
        try:
            with open(template_path, encoding="utf-8") as f:
                tokenizer.chat_template = f.read()
        except OSError as e:
            raise ChatError(f"--chat-template {template_path}: {e.strerror}") from e
    if not tokenizer.chat_template:
        raise ChatError(
            f"{tokenizer_path}: the tokenizer has no chat template (no chat_template in "
            f"{os.path.join(folder, 'tokenizer_config.json')}, no "
            f"{os.path.join(folder, 'chat_template.jinja')}): give one with --chat-template FILE")
    return tokenizer


def template_text(tokenizer):
    """The default template's text (a tokenizer may carry several, by name)."""
    try:
        return tokenizer.get_chat_template()
    except ValueError as e:
        raise ChatError(f"the tokenizer's chat template: {e}") from e


def has_generation_markers(tokenizer):
    return bool(GENERATION_TAG.search(template_text(tokenizer)))


def message(m, where):
    if not isinstance(m, dict):
        raise ChatError(f"{where} is {type(m).__name__}, not an object with a role and content")
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str):
        raise ChatError(f"{where} has no string 'role'")
    if not isinstance(content, str):
        kind = "no content" if content is None else f"content of type {type(content).__name__}"
        raise ChatError(f"{where} ({role}) has {kind}: a message's content must be a string")
    return m


def _messages(value, key):
    if not value:
        raise ChatError(f"'{key}' is an empty list of messages")
    return [message(m, f"{key}[{i}]") for i, m in enumerate(value)]


def to_messages(record):
    """The messages of one JSON Lines record: {"messages": [...]}, or {"prompt": ...,
    "completion": ...} with strings (a user and an assistant message) or lists of messages."""
    if not isinstance(record, dict):
        raise ChatError(f"a JSON {type(record).__name__}, not an object with 'messages' or "
                        "'prompt' and 'completion'")
    # A null field is an absent one: a Parquet file's rows have every column, null where a JSON
    # Lines record would lack the key.
    if record.get("messages") is not None:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise ChatError("'messages' is not a non-empty list")
        return [message(m, f"message {i}") for i, m in enumerate(messages)]
    if record.get("prompt") is not None and record.get("completion") is not None:
        prompt, completion = record["prompt"], record["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            return [{"role": "user", "content": prompt},
                    {"role": "assistant", "content": completion}]
        if not (isinstance(prompt, list) and isinstance(completion, list)):
            raise ChatError("'prompt' and 'completion' must both be strings or both be lists "
                            "of messages")
        return _messages(prompt, "prompt") + _messages(completion, "completion")
    keys = ", ".join(map(str, record)) or "none"
    raise ChatError(f"no 'messages', nor 'prompt' and 'completion' (the record's keys: {keys})")


def _special_tokens(tokenizer):
    """The contents of the tokenizer's special added tokens, longest first."""
    specials = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return sorted(specials | set(tokenizer.all_special_tokens), key=len, reverse=True)


class Renderer:
    """Renders conversations with `tokenizer`'s chat template into (ids, mask)."""

    def __init__(self, tokenizer, train_on="assistant"):
        if train_on not in TRAIN_ON:
            raise ValueError(f"train_on {train_on!r}, not one of {TRAIN_ON}")
        self.tokenizer, self.train_on = tokenizer, train_on
        self.markers = has_generation_markers(tokenizer)
        self.specials = _special_tokens(tokenizer)

    # --- Rendering through transformers ---------------------------------------------------
    def _apply(self, messages, **kwargs):
        try:
            return self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as e:  # jinja2's TemplateError (raise_exception), TypeError, ValueError
            raise ChatError(f"the chat template refuses this conversation "
                            f"({type(e).__name__}: {e})") from e

    def text(self, messages, add_generation_prompt=False):
        return self._apply(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def ids(self, messages, add_generation_prompt=False):
        return list(self._apply(messages, tokenize=True, return_dict=True,
                                add_generation_prompt=add_generation_prompt)["input_ids"])

    # --- The mask ---------------------------------------------------------------------------
    def render(self, messages):
        """(ids, mask) of the whole conversation: int64 and uint8 numpy arrays of one length."""
        assistants = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if self.train_on != "all" and not assistants:
            raise ChatError(f"no assistant message (--train-on {self.train_on} trains on the "
                            "assistant's turns; --train-on all on every token)")
        if self.train_on == "all":
            ids = self.ids(messages)
            mask = np.ones(len(ids), np.uint8)
        elif self.markers:
            ids, mask = self._marked(messages)
        else:
            ids, mask = self._prefix_method(messages, assistants)
        if not ids:
            raise ChatError("the chat template renders this conversation as no tokens")
        if not mask.any():
            raise ChatError("the chat template renders no token of the assistant's turns")
        return np.array(ids, np.int64), mask

    def _marked(self, messages):
        out = self._apply(messages, tokenize=True, return_dict=True,
                          return_assistant_tokens_mask=True)
        mask = np.array(out["assistant_masks"], np.uint8)
        if self.train_on == "last-assistant" and mask.any():
            # Turns are runs of ones (a header or another role's message lies between two).
            begins = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
            mask[:begins[-1]] = 0
        return list(out["input_ids"]), mask

    def turn_spans(self, messages, assistants):
        """The character span [begin, end) of each assistant turn (of `assistants`) in the
        rendered conversation, and that rendering; by the prefix method (see the module's
        docstring)."""
        full = self.text(messages)
        spans = []
        for k in assistants:
            if k == 0:
                raise ChatError("message 0 is the assistant's: the prefix method needs the "
                                "messages before an assistant turn (or a template with "
                                "{% generation %} markers, --chat-template)")
            before = self.text(messages[:k], add_generation_prompt=True)
            through = self.text(messages[:k + 1])
            if not (through.startswith(before) and full.startswith(through)):
                what = ("the conversation through it does not begin with the conversation "
                        "before it and the generation prompt" if not through.startswith(before)
                        else "the whole conversation does not begin with the conversation "
                        "through it")
                raise ChatError(
                    f"the chat template renders message {k} (the assistant's) inconsistently: "
                    f"{what}, so the prefix method cannot find its tokens; give a template with "
                    "{% generation %} markers (--chat-template FILE)")
            end = len(through)
            kept = through[len(before):].rstrip()
            if any(kept.endswith(s) for s in self.specials):
                end = len(before) + len(kept)
            spans.append((len(before), end))
        return spans, full

    def _prefix_method(self, messages, assistants):
        spans, full = self.turn_spans(messages, assistants)
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        starts = [a for a, _ in offsets]
        mask = np.zeros(len(ids), np.uint8)
        if self.train_on == "last-assistant":
            spans = spans[-1:]
        for (begin, end), k in zip(spans, assistants[-len(spans):], strict=True):
            first, last = _boundary(offsets, starts, begin), _boundary(offsets, starts, end)
            if first is None or last is None:
                raise ChatError(f"message {k} (the assistant's) does not begin and end on token "
                                "boundaries: a token spans the edge of the turn and the "
                                "template's text around it")
            mask[first:last] = 1
        return ids, mask

    # --- Truncation -------------------------------------------------------------------------
    def fit(self, messages, max_tokens):
        """(ids, mask, messages kept) of the longest prefix of whole messages, ending with an
        assistant's (any message under train_on all), whose rendering holds at most
        `max_tokens` tokens; None if there is none."""
        for k in range(len(messages) - 1, 0, -1):
            if self.train_on != "all" and messages[k - 1]["role"] != "assistant":
                continue
            ids, mask = self.render(messages[:k])
            if len(ids) <= max_tokens:
                return ids, mask, k
        return None

    # --- What --generate --chat needs -------------------------------------------------------
    def chat_prompt(self):
        """The template rendered once around a placeholder user message, with the generation
        prompt: the text and ids before and after the message, and the tokens that end an
        assistant turn (docs/reference.md, "Chat data")."""
        user = [{"role": "user", "content": PLACEHOLDER}]
        text = self.text(user, add_generation_prompt=True)
        if text.count(PLACEHOLDER) != 1:
            raise ChatError("the chat template does not write a user message's content once, as "
                            "it is: --generate --chat cannot use it")
        before, after = text.split(PLACEHOLDER)
        encode = self.tokenizer.backend_tokenizer.encode
        # The end of an assistant turn: the first special token the template writes after an
        # assistant's content, and the tokenizer's end-of-sequence token.
        reply = "TRAINERCHATREPLY"
        turn = self.text(user + [{"role": "assistant", "content": reply}])
        tail = turn[turn.rfind(reply) + len(reply):] if reply in turn else ""
        found = sorted((tail.index(s), -len(s), s) for s in self.specials if s in tail)
        stops = [found[0][2]] if found else []
        if self.tokenizer.eos_token and self.tokenizer.eos_token not in stops:
            stops.append(self.tokenizer.eos_token)
        vocab = self.tokenizer.get_vocab()
        return {
            "format": "trainer-chat-prompt",
            "version": 1,
            "before": before,
            "after": after,
            "before_ids": encode(before, add_special_tokens=False).ids if before else [],
            "after_ids": encode(after, add_special_tokens=False).ids if after else [],
            "stop": stops,
            "stop_ids": [vocab[s] for s in stops if s in vocab],
            "generation_markers": self.markers,
        }



def _boundary(offsets, starts, at):
    """The index of the token that begins at character `at` of the text `offsets` (each token's
    (begin, end) characters) cover, len(offsets) at its end; None when a token spans `at`."""
    i = bisect.bisect_left(starts, at)
    if i < len(starts) and starts[i] != at:
        return None
    if i > 0 and offsets[i - 1][1] > at:
        return None
    return i
