"""Build fleetgate's tiny test model from code: no weights or data are downloaded.

Runs inside the model venv (~/.cache/fleetgate/venv-model: torch, transformers, tokenizers, safetensors),
not the project venv, so that the project stays light. Steps, all seeded and deterministic:

1. generate a synthetic text corpus (pseudo-words, numbers, punctuation, chat-shaped dialogues);
2. train a byte-level BPE tokenizer on it with `tokenizers` (ChatML special tokens, ChatML chat template);
3. create a random-weight `LlamaForCausalLM` of the requested (tiny) size;
4. `save_pretrained` both into OUT/hf (the directory vLLM serves);
5. convert OUT/hf to OUT/tiny-llama-f32.gguf with llama.cpp's own converter (see convert_gguf.py).

Usage: python build.py --out DIR --converter DIR_WITH_convert_hf_to_gguf.py [--hidden 256 --layers 4 ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = namespace(v='') -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}"
    "{%- set text.v = text.v + part['text'] -%}{%- endif -%}{%- endfor -%}"
    "{%- set text = text.v -%}{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + text + '<|im_end|>' + '\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z"]
_ONSETS += ["st", "tr"]
_NUCLEI = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "ng", "ck"]
_COMMON_TEXT = (
    "the of and to in is it that for you was with on as are be this have from or one had by but not what "
    "all were when we there can an your which their said if do will each about how up out them then she "
    "many some so these would other into has more her two like him see time could no make than first been "
    "its who now people my made over did down only way find use may water long little very after words "
    "called just where most know get through back much before go good new write our used me man too any "
    "day same right look think also around another came come work three word must because does part even "
    "place well such here take why things help put years different away again off went old number great "
    "tell men say small every found still between name should home big give air line set own under read "
    "last never us left end along while might next sound below saw something thought both few those "
    "always looked show large often together asked house world going want school important until form "
    "food keep children feet land side without boy once animals life enough took sometimes four head "
    "above kind began almost live page got earth need far hand high year mother light parts country "
    "father let night following picture being study second eyes request model token server replica "
    "latency queue cache prefix batch stream health metrics gateway tenant"
)
_COMMON = _COMMON_TEXT.split()
_ROLES = ["user", "assistant", "system"]


def _word(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(_COMMON)
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS) for _ in range(rng.randint(1, 3))
    )


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(3, 18))]
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 10 ** rng.randint(1, 5))))
    words[0] = words[0].capitalize()
    text = " ".join(words)
    if rng.random() < 0.15:
        cut = rng.randrange(1, len(words))
        text = " ".join(words[:cut]) + ", " + " ".join(words[cut:])
    return text + rng.choice([".", ".", ".", "?", "!", ":", ";"])


def corpus(seed: int, n_docs: int) -> Iterator[str]:
    """Deterministic synthetic documents: prose paragraphs and ChatML-shaped dialogues."""
    rng = random.Random(seed)
    for _ in range(n_docs):
        if rng.random() < 0.3:
            turns = []
            for _ in range(rng.randint(1, 4)):
                role = rng.choice(_ROLES)
                body = " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))
                turns.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
            yield "".join(turns)
        else:
            yield "\n".join(
                " ".join(_sentence(rng) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))
            )


def train_tokenizer(seed: int, vocab_size: int, n_docs: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    # use_regex=True is GPT-2's split regex: llama.cpp's "gpt-2" pre-tokenizer implements exactly this one.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed, n_docs), trainer=trainer)
    return tok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--converter", type=Path, help="folder with llama.cpp's convert_hf_to_gguf.py")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=3072)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=688)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--max-positions", type=int, default=8192)
    ap.add_argument("--docs", type=int, default=20000, help="synthetic corpus documents for BPE training")
    ap.add_argument("--name", default="tiny-llama")
    args = ap.parse_args()

    params = {k: v for k, v in vars(args).items() if k not in ("out", "converter")}
    out: Path = args.out
    hf_dir = out / "hf"
    gguf_path = out / f"{args.name}-f32.gguf"
    stamp = out / "build.json"
    here = Path(__file__).resolve().parent
    # The key covers the parameters and this builder's code, so a changed recipe rebuilds the cache.
    recipe = json.dumps(params, sort_keys=True).encode()
    recipe += (here / "build.py").read_bytes() + (here / "convert_gguf.py").read_bytes()
    key = hashlib.sha256(recipe).hexdigest()[:16]
    if stamp.exists() and gguf_path.exists() and json.loads(stamp.read_text()).get("key") == key:
        print(f"tiny model up to date: {gguf_path}")
        return 0
    hf_dir.mkdir(parents=True, exist_ok=True)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = train_tokenizer(args.seed, args.vocab, args.docs)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_max_length=args.max_positions,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(hf_dir)

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.max_positions,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.eval()
    model.save_pretrained(hf_dir, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"saved {args.name}: {n_params / 1e6:.2f} M parameters, vocab {config.vocab_size} -> {hf_dir}")

    if args.converter is not None:
        # Write aside and rename: a llama-server that has the old file mmapped keeps a valid mapping.
        tmp_gguf = gguf_path.with_name(gguf_path.name + ".tmp")
        subprocess.run(
            [
                sys.executable,
                str(here / "convert_gguf.py"),
                "--converter",
                str(args.converter),
                str(hf_dir),
                "--outfile",
                str(tmp_gguf),
                "--outtype",
                "f32",
            ],
            check=True,
        )
        tmp_gguf.replace(gguf_path)
        print(f"wrote {gguf_path}")
    stamp.write_text(
        json.dumps({"key": key, "params": params, "n_params": n_params, "special_token_ids": ids}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
