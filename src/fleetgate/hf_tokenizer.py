"""Load a Hugging Face ``tokenizer.json`` (the ``tokenizers`` package) as a ``core.tokenizer.Tokenizer``.

Outside the core on purpose: this reads a file and imports a compiled extension. ``deployments[].tokenizer``
names the file; the gateway then counts prompt tokens and hashes prefix blocks with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


class TokenizerFileError(ValueError):
    """The tokenizer file could not be loaded (missing, unreadable, not a tokenizer, package absent)."""


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` behind the small ``encode`` protocol (no BOS/EOS added: the chat template
    already carries the special tokens it needs, and they are recognised in the text)."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self._tokenizer = tokenizer
        self.source = source

    def encode(self, text: str) -> Sequence[int]:
        ids: Sequence[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def load_tokenizer(path: str | Path) -> HFTokenizer:
    """The tokenizer in ``path`` (a ``tokenizer.json``, or a model folder holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - the extra is part of the default install
        raise TokenizerFileError(
            "deployments[].tokenizer needs the `tokenizers` package (pip install 'fleetgate[tokenizer]')"
        ) from exc
    try:
        return HFTokenizer(Tokenizer.from_file(str(p)), str(p))
    except Exception as exc:  # tokenizers raises its own Exception subclass for bad files
        raise TokenizerFileError(f"cannot load tokenizer {p}: {exc}") from exc
